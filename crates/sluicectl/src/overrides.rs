//! `override list | set | delete`: per-identity numbers and exemptions.

use crate::cli::{Format, OverrideCmd};
use crate::client::encode;
use crate::ctx::{Ctx, domain_query, identity_path};
use crate::output;
use anyhow::Result;
use serde_json::{Value, json};

/// Runs one `override` subcommand.
pub fn run(ctx: &Ctx, cmd: OverrideCmd) -> Result<()> {
    match cmd {
        OverrideCmd::List { domain } => {
            let v = ctx.call(
                "GET",
                &format!("/v1/overrides{}", domain_query(&domain)),
                None,
            )?;
            if ctx.format == Format::Json {
                ctx.print_json(&v);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = v["overrides"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| {
                    let b = &o["override"];
                    let what = if b["exempt"].as_bool() == Some(true) {
                        "exempt".to_string()
                    } else {
                        ["limit", "rate_per_s", "rate", "burst"]
                            .iter()
                            .filter_map(|k| b.get(*k).map(|x| format!("{k}={}", output::short(x))))
                            .collect::<Vec<_>>()
                            .join(" ")
                    };
                    vec![
                        output::short(&o["domain"]),
                        b.get("rule").map_or("*".into(), output::short),
                        output::matchers(&json!({"match": b["identity"]})),
                        what,
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(&["DOMAIN", "RULE", "IDENTITY", "NUMBERS"], &rows)
            );
        }
        OverrideCmd::Set {
            rule,
            identity,
            limit,
            rate_per_s,
            rate,
            burst,
            exempt,
            domain,
            force,
        } => {
            let mut body = serde_json::Map::new();
            if exempt {
                body.insert("exempt".into(), json!(true));
            }
            // The server validates it (`10/1m`), as it does every number.
            if let Some(r) = rate {
                body.insert("rate".into(), json!(r));
            }
            for (k, v) in [
                ("limit", limit),
                ("rate_per_s", rate_per_s),
                ("burst", burst),
            ] {
                if let Some(v) = v {
                    body.insert(k.into(), json!(v));
                }
            }
            let mut q = domain_query(&domain);
            if force {
                q.push_str(if q.is_empty() {
                    "?force=true"
                } else {
                    "&force=true"
                });
            }
            let path = format!(
                "/v1/overrides/{}/{}{q}",
                encode(&rule),
                identity_path(&identity)?
            );
            let v = ctx.call("PUT", &path, Some(&Value::Object(body)))?;
            ctx.print_write(&v);
        }
        OverrideCmd::Delete {
            rule,
            identity,
            domain,
        } => {
            let path = format!(
                "/v1/overrides/{}/{}{}",
                encode(&rule),
                identity_path(&identity)?,
                domain_query(&domain)
            );
            let v = ctx.call("DELETE", &path, None)?;
            ctx.print_write(&v);
        }
    }
    Ok(())
}
