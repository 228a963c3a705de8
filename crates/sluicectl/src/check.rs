//! `check`: one check sent to a daemon's HTTP check API, its decision shown per policy.
//! It counts against the limits like any other request.

use crate::cli::Format;
use crate::client::Server;
use crate::ctx::Ctx;
use crate::output;
use anyhow::{Result, bail};
use serde_json::{Value, json};

/// Sends the check to `check_server` with the session's format and timeout.
pub fn run(
    ctx: Ctx,
    domain: String,
    descriptors: Vec<String>,
    cost: u64,
    check_server: String,
) -> Result<()> {
    let mut d = serde_json::Map::new();
    for p in &descriptors {
        let Some((k, v)) = p.split_once('=') else {
            bail!("descriptor {p:?}: expected name=value");
        };
        d.insert(k.to_string(), Value::String(v.to_string()));
    }
    let body = json!({"domain": domain, "descriptors": d, "cost": cost});
    let check = Ctx {
        server: Server::parse(&check_server)?,
        ..ctx
    };
    let v = check.call("POST", "/v1/limits:check", Some(&body))?;
    if check.format == Format::Json {
        check.print_json(&v);
        return Ok(());
    }
    println!(
        "{} {}  decided_by={}  retry_after_ms={}  rules_version={}",
        if v["allowed"].as_bool() == Some(true) {
            "ALLOWED"
        } else {
            "DENIED"
        },
        output::short(&v["code"]),
        v["decided_by"].as_str().unwrap_or("-"),
        output::short(&v["retry_after_ms"]),
        output::short(&v["rules_version"]),
    );
    let rows: Vec<Vec<String>> = v["policies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            ["id", "limit", "window_s", "remaining", "reset_s"]
                .iter()
                .map(|k| output::short(&p[*k]))
                .collect()
        })
        .collect();
    if !rows.is_empty() {
        print!(
            "{}",
            output::table(
                &["RULE", "LIMIT", "WINDOW_S", "REMAINING", "RESET_S"],
                &rows
            )
        );
    }
    if let Some(s) = v["shadow_denied"].as_array().filter(|s| !s.is_empty()) {
        let ids: Vec<String> = s.iter().map(output::short).collect();
        println!("shadow would deny: {}", ids.join(", "));
    }
    Ok(())
}
