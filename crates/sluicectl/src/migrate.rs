//! `migrate`: creates or upgrades the PostgreSQL schema directly (no admin API involved),
//! through sluice-control's store, the code the daemons run on start.

use crate::cli::Format;
use crate::ctx::Ctx;
use anyhow::{Context, Result};
use serde_json::json;

/// Applies the pending migrations and prints what was applied.
pub fn run(ctx: &Ctx, postgres: String) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let done = rt.block_on(async {
        let store = sluice_control::store::Store::new(&postgres)?;
        store.migrate().await
    })?;
    if ctx.format == Format::Json {
        ctx.print_json(&json!({
            "applied": done.applied.iter().map(|(v, n)| json!({"version": v, "name": n})).collect::<Vec<_>>(),
            "schema_version": done.schema_version,
        }));
    } else if done.applied.is_empty() {
        println!("schema up to date (version {})", done.schema_version);
    } else {
        for (v, n) in &done.applied {
            println!("applied migration {v}: {n}");
        }
        println!("schema at version {}", done.schema_version);
    }
    Ok(())
}
