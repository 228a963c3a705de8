//! The rule commands: `apply` a rules file, `get` rules, `delete` one, set one's mode
//! (`shadow`, `enforce`, `off`), its daemon canary (`canary`), the `shadow-all` kill switch
//! and `rollback`.

use crate::cli::Format;
use crate::client::encode;
use crate::ctx::{Ctx, domain_query};
use crate::output;
use anyhow::{Context, Result, bail};
use serde::Deserialize as _;
use serde_json::{Value, json};
use std::io::Read as _;
use std::path::PathBuf;

fn read_docs(file: &PathBuf) -> Result<Vec<Value>> {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let mut docs = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(&text).enumerate() {
        let v = Value::deserialize(doc)
            .with_context(|| format!("{}: document {} is not valid YAML", file.display(), i + 1))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    if docs.is_empty() {
        bail!("{}: no rules document in the file", file.display());
    }
    Ok(docs)
}

/// `apply`: shows the diff, then applies the file's domains as one version. `what_if`:
/// applies nothing and reports what the file's rules would have refused over the window; a
/// change held for approval is shown with that report too.
pub fn apply(
    ctx: &Ctx,
    file: PathBuf,
    dry_run: bool,
    force: bool,
    what_if: bool,
    window: &crate::whatif::Args,
) -> Result<()> {
    let docs = read_docs(&file)?;
    if what_if {
        let report = crate::whatif::report(ctx, &docs, window)?;
        return crate::whatif::print(ctx, &report);
    }
    let preview = ctx.call(
        "POST",
        "/v1/rules:apply",
        Some(&json!({"domains": docs, "dry_run": true, "force": force})),
    )?;
    if dry_run || preview["changed"].as_bool() != Some(true) {
        ctx.print_write(&preview);
        return Ok(());
    }
    if ctx.format != Format::Json {
        for c in preview["changes"].as_array().into_iter().flatten() {
            print!("{}", output::change(c));
        }
    }
    let done = ctx.call(
        "POST",
        "/v1/rules:apply",
        Some(&json!({"domains": docs, "force": force,
                     "expect_version": preview["version"]})),
    )?;
    if ctx.format == Format::Json {
        ctx.print_json(&done);
    } else if let Some(id) = done["pending"]["id"].as_u64() {
        println!("{}", crate::ctx::held_line(id, &done["pending"]));
        // What the approver is asked to let through, on the last hour's traffic.
        match crate::whatif::report(ctx, &docs, window) {
            Ok(report) => crate::whatif::print(ctx, &report)?,
            Err(e) => println!("what-if: not available: {e:#}"),
        }
    } else {
        println!(
            "applied: version {} (was {})",
            done["version"].as_u64().unwrap_or(0),
            done["previous_version"].as_u64().unwrap_or(0)
        );
    }
    Ok(())
}

/// `get`: one rule as YAML, or the list.
pub fn get(
    ctx: &Ctx,
    id: Option<String>,
    domain: Option<String>,
    route: Option<String>,
) -> Result<()> {
    match id {
        Some(id) => {
            let v = ctx.call(
                "GET",
                &format!("/v1/rules/{}{}", encode(&id), domain_query(&domain)),
                None,
            )?;
            match ctx.format {
                Format::Json => ctx.print_json(&v),
                _ => {
                    println!(
                        "# domain {}, version {}",
                        output::short(&v["domain"]),
                        output::short(&v["version"])
                    );
                    print!("{}", output::yaml(&v["rule"]));
                }
            }
        }
        None => {
            let mut q: Vec<String> = Vec::new();
            if let Some(d) = &domain {
                q.push(format!("domain={}", encode(d)));
            }
            if let Some(r) = &route {
                q.push(format!("route={}", encode(r)));
            }
            let path = if q.is_empty() {
                "/v1/rules".to_string()
            } else {
                format!("/v1/rules?{}", q.join("&"))
            };
            let v = ctx.call("GET", &path, None)?;
            match ctx.format {
                Format::Json => ctx.print_json(&v),
                Format::Yaml => {
                    let rules: Vec<Value> = v["rules"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|r| r["rule"].clone())
                        .collect();
                    print!("{}", output::yaml(&Value::Array(rules)));
                }
                Format::Table => {
                    let rows: Vec<Vec<String>> = v["rules"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|r| {
                            let b = &r["rule"];
                            vec![
                                output::short(&r["domain"]),
                                output::short(&r["id"]),
                                b["mode"].as_str().unwrap_or("enforce").to_string(),
                                output::short(&b["algorithm"]),
                                output::numbers(b),
                                b.get("rollout_pct").map_or("100".into(), output::short),
                                output::matchers(b),
                            ]
                        })
                        .collect();
                    print!(
                        "{}",
                        output::table(
                            &[
                                "DOMAIN",
                                "ID",
                                "MODE",
                                "ALGORITHM",
                                "LIMIT",
                                "ROLLOUT%",
                                "MATCH"
                            ],
                            &rows
                        )
                    );
                    println!("version {}", output::short(&v["version"]));
                }
            }
        }
    }
    Ok(())
}

/// `delete`: removes a rule.
pub fn delete(ctx: &Ctx, id: String, domain: Option<String>) -> Result<()> {
    let v = ctx.call(
        "DELETE",
        &format!("/v1/rules/{}{}", encode(&id), domain_query(&domain)),
        None,
    )?;
    ctx.print_write(&v);
    Ok(())
}

/// `shadow`, `enforce`, `off`: sets one rule's mode.
pub fn mode(ctx: &Ctx, id: &str, domain: &Option<String>, action: &str) -> Result<()> {
    let v = ctx.call(
        "POST",
        &format!("/v1/rules/{}:{action}{}", encode(id), domain_query(domain)),
        None,
    )?;
    ctx.print_write(&v);
    Ok(())
}

/// `canary`: sets one rule's `enforce_on` to `{daemons: N%}` with an ordinary rule write
/// (`PUT /v1/rules/{id}`): the rule as the API has it, that one field changed, so the write
/// goes through validation, versions, history and approval like any other.
pub fn canary(ctx: &Ctx, id: &str, pct: u8, domain: Option<String>) -> Result<()> {
    let cur = ctx.call(
        "GET",
        &format!("/v1/rules/{}{}", encode(id), domain_query(&domain)),
        None,
    )?;
    let mut rule = cur["rule"].clone();
    let Some(obj) = rule.as_object_mut() else {
        bail!("the server answered no rule for {id:?}");
    };
    obj.insert("enforce_on".into(), json!({"daemons": format!("{pct}%")}));
    let domain = cur["domain"].as_str().map(str::to_string).or(domain);
    let v = ctx.call(
        "PUT",
        &format!("/v1/rules/{}{}", encode(id), domain_query(&domain)),
        Some(&rule),
    )?;
    ctx.print_write(&v);
    if ctx.format == Format::Table && v["changed"].as_bool() == Some(true) {
        println!(
            "{id} now enforces on {pct}% of the daemons and shadows on the others; see which with: sluicectl status"
        );
    }
    Ok(())
}

/// `shadow-all`: every enforcing rule to shadow.
pub fn shadow_all(ctx: &Ctx, domain: Option<String>) -> Result<()> {
    let v = ctx.call(
        "POST",
        &format!("/v1/rules:shadow-all{}", domain_query(&domain)),
        None,
    )?;
    ctx.print_write(&v);
    if ctx.format == Format::Table && v["changed"].as_bool() == Some(true) {
        println!(
            "every rule now only records; undo with: sluicectl rollback --to {}",
            v["previous_version"].as_u64().unwrap_or(0)
        );
    }
    Ok(())
}

/// `rollback`: restores an earlier version's rules as a new version.
pub fn rollback(ctx: &Ctx, to: u64, dry_run: bool, force: bool) -> Result<()> {
    let v = ctx.call(
        "POST",
        "/v1/rules:rollback",
        Some(&json!({"to_version": to, "dry_run": dry_run, "force": force})),
    )?;
    ctx.print_write(&v);
    Ok(())
}
