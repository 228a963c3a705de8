//! Held changes: `pending` lists those waiting for a second principal (with the diff each
//! would apply), `approve ID` applies one as a new version, `reject ID` drops it.

use crate::cli::Format;
use crate::ctx::Ctx;
use crate::output;
use anyhow::Result;
use serde_json::Value;

/// `pending [--all] [--what-if]`: the held changes and what each would change (with
/// `--what-if`, each held apply's report over the window, computed now).
pub fn list(ctx: &Ctx, all: bool, what_if: Option<crate::whatif::Args>) -> Result<()> {
    let path = if all {
        "/v1/pending?all=true"
    } else {
        "/v1/pending"
    };
    let mut v = ctx.call("GET", path, None)?;
    if let Some(args) = &what_if {
        for p in v["pending"].as_array_mut().into_iter().flatten() {
            if let Some(r) = crate::whatif::pending(ctx, p, args)? {
                p["what_if"] = r;
            }
        }
    }
    if ctx.format == Format::Json {
        ctx.print_json(&v);
        return Ok(());
    }
    let items = v["pending"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|p| {
            vec![
                output::short(&p["id"]),
                output::short(&p["principal"]),
                output::short(&p["action"]),
                output::short(&p["state"]),
                output::short(&p["created"]),
                output::short(&p["expires"]),
                p["decided_by"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(
            &[
                "ID",
                "PRINCIPAL",
                "ACTION",
                "STATE",
                "CREATED",
                "EXPIRES",
                "DECIDED BY"
            ],
            &rows
        )
    );
    for p in &items {
        println!(
            "pending change {} (against version {}):",
            output::short(&p["id"]),
            output::short(&p["base_version"])
        );
        for c in p["changes"].as_array().into_iter().flatten() {
            print!("{}", output::change(c));
        }
        for r in p["reasons"].as_array().into_iter().flatten() {
            println!("  held: {}", r.as_str().unwrap_or(""));
        }
        if p.get("what_if").is_some() {
            crate::whatif::print(ctx, &p["what_if"])?;
        }
    }
    if items.is_empty() {
        println!("no pending changes");
    }
    Ok(())
}

/// `approve ID` / `reject ID`.
pub fn decide(ctx: &Ctx, id: u64, action: &str) -> Result<()> {
    let v = ctx.call("POST", &format!("/v1/pending/{id}:{action}"), None)?;
    if ctx.format == Format::Json {
        ctx.print_json(&v);
        return Ok(());
    }
    if action == "approve" {
        let p: &Value = &v["approved"];
        ctx.print_write(&v);
        println!(
            "approved pending change {id} of {} (approved by {})",
            output::short(&p["principal"]),
            output::short(&p["decided_by"])
        );
    } else {
        println!("rejected pending change {id}");
    }
    Ok(())
}
