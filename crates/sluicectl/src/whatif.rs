//! `apply --what-if`: what a candidate rule set would have done to the last hour's traffic,
//! against the current set, from the daemons' decision logs (docs/control-plane.md,
//! "What-if").
//!
//! With `--decisions URL` (repeatable: one per daemon) the fleet's report: every daemon's
//! `GET /v1/decisions` window is read (paged back with `until`), the current set is the
//! server's export, the candidate is the export with the file's domains applied (the same
//! edit the server applies), and [`sluice_control::whatif::replay`] runs here. Without it,
//! the server's own `POST /v1/rules:what-if` answers from that daemon's log alone. Either
//! way the server validates the candidate first, so a bad file gets apply's error.

use crate::cli::Format;
use crate::client::Server;
use crate::ctx::Ctx;
use crate::output;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use sluice_control::edit::{Edit, apply};
use sluice_control::model::State;
use sluice_control::whatif::{LoggedCheck, Report, Window, replay};
use sluice_core::Micros;

/// The window and the daemons to read.
#[derive(Debug, Clone, Default)]
pub struct Args {
    /// Epoch µs or a duration back (default an hour).
    pub since: Option<String>,
    /// Epoch µs or a duration back (default now).
    pub until: Option<String>,
    /// Admin APIs whose decision logs to read; empty: the server's own log, replayed there.
    pub decisions: Vec<String>,
}

/// Records a `GET /v1/decisions` page holds at most.
const PAGE: usize = 1000;

fn now() -> Micros {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros)
}

/// Every record of `w` in one daemon's log, paging back from the window's end.
fn fetch(ctx: &Ctx, url: &str, w: Window) -> Result<Vec<Value>> {
    let daemon = Ctx {
        server: Server {
            ca_file: ctx.server.ca_file.clone(),
            ..Server::parse(url)?
        },
        format: ctx.format,
        timeout: ctx.timeout,
    };
    let since = w.since.unwrap_or(0);
    let mut until = w.until.unwrap_or_else(|| now() + 1);
    let mut out = Vec::new();
    loop {
        let page = daemon
            .call(
                "GET",
                &format!("/v1/decisions?since={since}&until={until}&limit={PAGE}"),
                None,
            )
            .with_context(|| format!("reading the decision log of {url}"))?;
        let mut records = page["decisions"].as_array().cloned().unwrap_or_default();
        if records.len() < PAGE {
            out.extend(records);
            return Ok(out);
        }
        // A full page: the oldest microsecond may go on in the next page, so it is read
        // again there whole.
        let oldest = records
            .iter()
            .filter_map(|r| r["ts"].as_u64())
            .min()
            .unwrap_or(since);
        if oldest <= since {
            bail!("{url}: more than {PAGE} decision records in one microsecond");
        }
        records.retain(|r| r["ts"].as_u64() != Some(oldest));
        out.extend(records);
        until = oldest + 1;
    }
}

/// The report for `docs` over the window, from the server's log or every `--decisions` one.
pub fn report(ctx: &Ctx, docs: &[Value], args: &Args) -> Result<Value> {
    let window = Window::parse(args.since.as_deref(), args.until.as_deref(), now())?;
    let bounds = json!({"since": window.since.map(|s| s.to_string()),
                        "until": window.until.map(|u| u.to_string())});
    if args.decisions.is_empty() {
        let mut body = bounds;
        body["domains"] = json!(docs);
        return ctx.call("POST", "/v1/rules:what-if", Some(&body));
    }
    // The server's validation, exactly apply's (forced: a big tightening is what a what-if
    // is for). A daemon serving a rules file has no apply: the candidate is then validated
    // below, by the same sluice-core validation the file source runs.
    if let Err(e) = ctx.call(
        "POST",
        "/v1/rules:apply",
        Some(&json!({"domains": docs, "dry_run": true, "force": true})),
    ) && !e.to_string().contains("READ_ONLY_SOURCE")
    {
        return Err(e);
    }
    let export = ctx.call("GET", "/v1/rules:export", None)?;
    let version = export["version"].as_u64().unwrap_or(0);
    let current_docs = export["domains"].as_array().cloned().unwrap_or_default();
    let state = State::from_docs(&current_docs).context("the server's current rules")?;
    let next = apply(
        &state,
        &Edit::Apply {
            docs: docs.to_vec(),
        },
        None,
    )?;
    let current = state.to_rule_set(version)?;
    let candidate = next.to_rule_set(version + 1)?;
    let mut records = Vec::new();
    for url in &args.decisions {
        for r in fetch(ctx, url, window)? {
            records.push(LoggedCheck::from_value(records.len(), r)?);
        }
    }
    let report = replay(&records, &current, &candidate, window)?;
    let mut v = serde_json::to_value(report)?;
    v["daemons"] = json!(args.decisions);
    Ok(v)
}

/// The report for people (or as JSON with `-o json`).
pub fn print(ctx: &Ctx, v: &Value) -> Result<()> {
    if ctx.format == Format::Json {
        ctx.print_json(v);
        return Ok(());
    }
    let r: Report = serde_json::from_value(v.clone()).context("the what-if report")?;
    print!("{}", render(&r));
    Ok(())
}

fn refused(f: &Option<sluice_control::whatif::Figures>) -> String {
    match f {
        None => "-".into(),
        Some(f) => format!("{} of {} ({})", f.refused, f.checks, f.mode),
    }
}

/// The report as text: the note, a table of rules, each rule's most refused identities
/// under the candidate, and the newly refused and newly admitted checks.
pub fn render(r: &Report) -> String {
    let mut s = format!("what-if: {}\n", r.note);
    if r.records == 0 {
        return s;
    }
    let stores: Vec<&str> = r
        .stores
        .iter()
        .map(|x| if x.is_empty() { "(one store)" } else { x })
        .collect();
    s.push_str(&format!(
        "  against version {}; stores replayed apart: {}\n",
        r.current_version,
        stores.join(", ")
    ));
    let rows: Vec<Vec<String>> = r
        .rules
        .iter()
        .map(|x| {
            vec![
                format!("{}/{}", x.domain, x.rule),
                x.change.clone(),
                refused(&x.current),
                refused(&x.candidate),
            ]
        })
        .collect();
    s.push_str(&output::table(
        &["RULE", "CHANGE", "REFUSED NOW", "REFUSED WITH CANDIDATE"],
        &rows,
    ));
    for x in &r.rules {
        let Some(next) = &x.candidate else { continue };
        if next.refused == 0 {
            continue;
        }
        s.push_str(&format!(
            "{}/{} would refuse {} identities:\n",
            x.domain, x.rule, next.identities
        ));
        for c in &next.refused_by {
            let was = x
                .current
                .as_ref()
                .and_then(|f| f.refused_by.iter().find(|o| o.identity == c.identity))
                .map_or(0, |o| o.refused);
            s.push_str(&format!(
                "  {}  refused {} of {} (now {})\n",
                c.identity, c.refused, c.checks, was
            ));
        }
    }
    for (name, d) in [
        ("newly refused", &r.newly_refused),
        ("newly admitted", &r.newly_admitted),
    ] {
        s.push_str(&format!(
            "{name}: {} checks of {} identities\n",
            d.checks, d.identities
        ));
        for c in &d.by_identity {
            s.push_str(&format!("  {}  {}\n", c.identity, c.refused));
        }
    }
    s
}

/// `pending --what-if`: the report of each held `apply`, over the window now.
pub fn pending(ctx: &Ctx, item: &Value, args: &Args) -> Result<Option<Value>> {
    if item["edit"]["edit"].as_str() != Some("apply") {
        return Ok(None);
    }
    let docs = item["edit"]["docs"].as_array().cloned().unwrap_or_default();
    report(ctx, &docs, args).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_control::whatif::{Delta, Figures, IdentityCount, RuleReport};

    #[test]
    fn the_table_names_who_would_be_refused() {
        let who = IdentityCount {
            identity: "api|user=heavy".into(),
            checks: 400,
            refused: 300,
        };
        let r = Report {
            window: Window::default(),
            records: 90,
            checks: 450,
            stores: vec!["eu".into()],
            current_version: 4,
            rules: vec![RuleReport {
                domain: "api".into(),
                rule: "per-user".into(),
                change: "changed".into(),
                current: Some(Figures {
                    mode: "enforce".into(),
                    checks: 450,
                    refused: 0,
                    identities: 0,
                    refused_by: vec![],
                }),
                candidate: Some(Figures {
                    mode: "enforce".into(),
                    checks: 450,
                    refused: 300,
                    identities: 1,
                    refused_by: vec![who.clone()],
                }),
            }],
            newly_refused: Delta {
                checks: 300,
                identities: 1,
                by_identity: vec![who],
            },
            newly_admitted: Delta::default(),
            note: "estimated from 90 records standing for 450 checks".into(),
            partial: None,
        };
        let s = render(&r);
        assert!(s.starts_with("what-if: estimated from 90 records standing for 450 checks"));
        assert!(s.contains("api/per-user"), "{s}");
        assert!(s.contains("300 of 450 (enforce)"), "{s}");
        assert!(
            s.contains("api|user=heavy  refused 300 of 400 (now 0)"),
            "{s}"
        );
        assert!(
            s.contains("newly refused: 300 checks of 1 identities"),
            "{s}"
        );
        let empty = Report {
            records: 0,
            note: "no decision log records in the window: nothing to replay".into(),
            ..r
        };
        assert_eq!(
            render(&empty),
            "what-if: no decision log records in the window: nothing to replay\n"
        );
    }
}
