//! The read-only views of versions: `status` (which version each daemon serves), `history`
//! (one rule's versions, or the change log) and `export` (every domain as a rules file).

use crate::cli::Format;
use crate::client::encode;
use crate::ctx::{Ctx, domain_query};
use crate::output;
use anyhow::Result;

/// `status`: the version each daemon serves, and how many are current.
pub fn status(ctx: &Ctx) -> Result<()> {
    let v = ctx.call("GET", "/v1/rules:status", None)?;
    if ctx.format == Format::Json {
        ctx.print_json(&v);
        return Ok(());
    }
    let version = v["version"].as_u64().unwrap_or(0);
    let daemons = v["daemons"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = daemons
        .iter()
        .map(|d| {
            vec![
                output::short(&d["daemon_id"]),
                output::short(&d["region"]),
                output::short(&d["version"]),
                output::short(&d["source"]),
                format!("{:.0}s ago", d["age_s"].as_f64().unwrap_or(0.0)),
                if d["current"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "NO"
                }
                .into(),
                shadowed_here(&d["rules"]),
                d["last_error"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(
            &[
                "DAEMON",
                "REGION",
                "VERSION",
                "SOURCE",
                "LAST SEEN",
                "CURRENT",
                "CANARY SHADOWS",
                "ERROR"
            ],
            &rows
        )
    );
    let current = daemons
        .iter()
        .filter(|d| d["current"].as_bool() == Some(true))
        .count();
    println!(
        "version {version}: {current} of {} daemons current",
        daemons.len()
    );
    let me = &v["this_daemon"];
    if me.is_object() {
        let shadows = shadowed_here(&me["rules"]);
        println!(
            "this daemon ({}): {}",
            output::short(&me["daemon_id"]),
            if shadows.is_empty() {
                "enforces every enforcing rule".to_string()
            } else {
                format!("shadows {shadows} (enforce_on leaves it out)")
            }
        );
    }
    Ok(())
}

/// The rules a daemon only shadows because their `enforce_on` leaves it out, comma
/// separated: where a canary has not reached yet.
fn shadowed_here(rules: &serde_json::Value) -> String {
    rules
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["canary_shadowed"].as_bool() == Some(true))
        .map(|r| output::short(&r["rule"]))
        .collect::<Vec<_>>()
        .join(",")
}

/// `history`: every version of one rule, or the latest changes of everything.
pub fn history(ctx: &Ctx, id: Option<String>, domain: Option<String>, limit: u32) -> Result<()> {
    match id {
        Some(id) => {
            let mut path = format!("/v1/rules/{}/history?limit={limit}", encode(&id));
            if let Some(d) = &domain {
                path.push_str(&format!("&domain={}", encode(d)));
            }
            let v = ctx.call("GET", &path, None)?;
            if ctx.format == Format::Json {
                ctx.print_json(&v);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = v["history"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| {
                    let b = &h["body"];
                    let what = if b.is_null() {
                        "(deleted)".to_string()
                    } else {
                        format!(
                            "{} {} {}",
                            b["mode"].as_str().unwrap_or("enforce"),
                            output::short(&b["algorithm"]),
                            output::numbers(b)
                        )
                    };
                    vec![
                        output::short(&h["version"]),
                        output::short(&h["at"]),
                        principals(h),
                        output::short(&h["actor"]),
                        output::short(&h["action"]),
                        what,
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &["VERSION", "AT", "PRINCIPAL", "ACTOR", "ACTION", "RULE"],
                    &rows
                )
            );
        }
        None => {
            let v = ctx.call("GET", &format!("/v1/rules:history?limit={limit}"), None)?;
            if ctx.format == Format::Json {
                ctx.print_json(&v);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = v["changes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let detail = match c["detail"].as_object() {
                        Some(m) if !m.is_empty() => c["detail"].to_string(),
                        _ => String::new(),
                    };
                    vec![
                        output::short(&c["version"]),
                        output::short(&c["at"]),
                        principals(c),
                        output::short(&c["actor"]),
                        output::short(&c["action"]),
                        output::short(&c["entries"]),
                        detail,
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &[
                        "VERSION",
                        "AT",
                        "PRINCIPAL",
                        "ACTOR",
                        "ACTION",
                        "ENTRIES",
                        "DETAIL"
                    ],
                    &rows
                )
            );
        }
    }
    Ok(())
}

/// Who made a version: the principal, and `+ approver` for a change that was held.
fn principals(v: &serde_json::Value) -> String {
    match v["approved_by"].as_str() {
        Some(by) => format!("{} + {by}", output::short(&v["principal"])),
        None => output::short(&v["principal"]),
    }
}

/// `export`: every domain as a rules file (or the server's JSON).
pub fn export(ctx: &Ctx, domain: Option<String>) -> Result<()> {
    let v = ctx.call(
        "GET",
        &format!("/v1/rules:export{}", domain_query(&domain)),
        None,
    )?;
    match ctx.format {
        Format::Json => ctx.print_json(&v),
        _ => {
            println!("# exported at version {}", output::short(&v["version"]));
            print!(
                "{}",
                output::yaml_docs(v["domains"].as_array().map_or(&[][..], Vec::as_slice))
            );
        }
    }
    Ok(())
}
