//! The report rendered: an aligned table for people, CSV and JSON for tools. Pure functions
//! of a [`Report`], so the same run renders to the same bytes.

use super::*;

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Aligns a table: the first `left` columns left-aligned, the rest right-aligned (numbers).
pub fn pad(cells: &[Vec<String>], left: usize) -> String {
    let cols = cells.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            cells
                .iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in cells {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let w = widths[c];
            let sep = if c == 0 { "" } else { "  " };
            if c < left {
                let _ = write!(line, "{sep}{cell:<w$}");
            } else {
                let _ = write!(line, "{sep}{cell:>w$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn window_label(s: f64) -> String {
    if s >= 3600.0 && (s % 3600.0) == 0.0 {
        format!("{}h", s / 3600.0)
    } else if s >= 60.0 && (s % 60.0) == 0.0 {
        format!("{}m", s / 60.0)
    } else {
        format!("{}s", trim(s, 3))
    }
}

/// A number with at most `d` decimals, trailing zeros dropped.
pub fn trim(v: f64, d: usize) -> String {
    let s = format!("{v:.d$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn rule_rows(rules: &[RuleReport]) -> Vec<Vec<String>> {
    let mut rows = vec![
        [
            "rule",
            "scope",
            "algorithm",
            "allowed/window",
            "windows",
            "contested",
            "overshoot max",
            "p99",
            "mean",
            "excess",
            "over-admitted",
            "false rej",
            "admitted",
            "denied",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    for r in rules {
        rows.push(vec![
            r.id.clone(),
            r.scope.clone(),
            r.algorithm.clone(),
            format!(
                "{}/{}",
                thousands(r.allowed_per_window),
                window_label(r.window_s)
            ),
            r.windows.to_string(),
            r.contested_windows.to_string(),
            format!("{:.3}", r.overshoot_max),
            format!("{:.3}", r.overshoot_p99),
            format!("{:.3}", r.overshoot_mean),
            thousands(r.excess_units),
            thousands(r.over_admitted),
            format!(
                "{} ({:.2}%)",
                thousands(r.false_rejections),
                r.false_rejection_pct
            ),
            thousands(r.admitted),
            thousands(r.denied),
        ]);
    }
    rows
}

fn hot_rows(rules: &[RuleReport]) -> Vec<Vec<String>> {
    let mut rows = vec![
        [
            "rule",
            "requests",
            "store calls",
            "calls/req",
            "deny hits",
            "lease spent",
            "lease blocked",
            "lease calls",
            "leased",
            "returned",
            "samples",
            "sample skipped",
            "sample blocked",
            "gate admitted",
            "gate refused",
            "syncs",
            "sync failed",
            "synced",
            "admitted/s",
            "limit/s per key",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    for r in rules {
        rows.push(vec![
            r.id.clone(),
            thousands(r.requests),
            thousands(r.store_calls),
            format!("{:.4}", r.store_calls_per_request),
            thousands(r.deny_hits),
            thousands(r.lease_spent),
            thousands(r.lease_blocked),
            thousands(r.lease_calls),
            thousands(r.leased_units),
            thousands(r.returned_units),
            thousands(r.samples),
            thousands(r.sample_skipped),
            thousands(r.sample_blocked),
            thousands(r.gate_admitted),
            thousands(r.gate_refused),
            thousands(r.sync_calls),
            thousands(r.sync_failures),
            thousands(r.synced_units),
            thousands(r.admitted_per_s.round() as u64),
            trim(r.limit_per_s, 3),
        ]);
    }
    rows
}

/// The human table.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "sluice-sim: {}", r.scenario);
    for line in r.description.lines() {
        let _ = writeln!(out, "  {}", line.trim_end());
    }
    let _ = writeln!(
        out,
        "seed {} · {} regions × {} daemon{} · {} s simulated · {} requests · ship interval {} ms · threshold {}{}",
        r.seed,
        r.regions.len(),
        r.daemons_per_region,
        if r.daemons_per_region == 1 { "" } else { "s" },
        trim(r.duration_s, 3),
        thousands(r.requests),
        trim(r.ship_interval_ms, 3),
        r.share_threshold
            .map_or("per rule".to_string(), |t| format!(
                "{}%",
                trim(t * 100.0, 1)
            )),
        match r.delivery {
            Delivery::PerDaemon => "",
            Delivery::PerRegion => " · delivery per region",
        },
    );
    out.push('\n');
    out.push_str(&pad(&rule_rows(&r.rules), 1));
    out.push('\n');
    out.push_str(&pad(&hot_rows(&r.rules), 1));
    let h = &r.hot_keys;
    if h.gate_admitted + h.gate_to_store + h.sync_calls + h.sync_failures > 0 {
        let lost: u64 = r.rules.iter().map(|x| x.gate_lost_units).sum::<u64>() + h.gate_lost_units;
        let _ = writeln!(
            out,
            "gates (every daemon): {} admitted, {} refused, {} to the store · {} sync calls, {} failed · {} units synced, {} lost unsynced",
            thousands(h.gate_admitted),
            thousands(h.gate_refused),
            thousands(h.gate_to_store),
            thousands(h.sync_calls),
            thousands(h.sync_failures),
            thousands(h.synced_units),
            thousands(lost),
        );
    }
    let _ = writeln!(
        out,
        "hot keys (every daemon): {} deny hits · {} refusals cached ({} not: full) · {} lease calls · {} units leased, {} given back, {} expired · {} give-backs applied, {} moot, {} lost · {} samples, {} answered like one, {} blocked",
        thousands(h.deny_hits),
        thousands(h.deny_inserts),
        thousands(h.deny_full),
        thousands(h.lease_calls),
        thousands(h.leased_units),
        thousands(h.returned_units),
        thousands(h.expired_units),
        thousands(h.give_backs),
        thousands(h.give_backs_moot),
        thousands(h.give_backs_failed),
        thousands(h.samples),
        thousands(h.sample_skipped),
        thousands(h.sample_blocked),
    );
    out.push('\n');
    let g = &r.gossip;
    let by_region: Vec<String> = r
        .regions
        .iter()
        .zip(&g.bytes_per_s_by_region)
        .map(|(n, b)| format!("{n} {}", thousands(b.round() as u64)))
        .collect();
    let _ = writeln!(
        out,
        "gossip: {} B/s sent ({}) · {} messages · {} entries shipped · {} deferred · {} lost · {} cut by partitions · ≤ {} remote slots per daemon",
        thousands(g.bytes_per_s.round() as u64),
        by_region.join(", "),
        thousands(g.messages),
        thousands(g.entries),
        thousands(g.deferred),
        thousands(g.lost),
        thousands(g.cut),
        g.max_remote_slots,
    );
    if let Some(h) = &g.hops {
        let hop = |x: &HopReport| {
            format!(
                "{} B/s in {} messages",
                thousands(x.bytes_per_s.round() as u64),
                thousands(x.messages)
            )
        };
        let _ = writeln!(
            out,
            "hops (region_sender; the B/s above are the cross-region ones): collect {} · relay {} · fan out {} · direct {}{} · in-region {} B/s",
            hop(&h.collect),
            hop(&h.relay),
            hop(&h.fan_out),
            hop(&h.direct),
            h.forward
                .as_ref()
                .map(|f| format!(" · forward {}", hop(f)))
                .unwrap_or_default(),
            thousands(h.in_region_bytes_per_s.round() as u64),
        );
    }
    let _ = writeln!(
        out,
        "store: {:.2} calls/request · {} failed calls · {} calls refused by breakers (opened {} times) · {} local-bucket verdicts · {} admissions journaled · {} calls lost in failovers",
        r.store_calls_per_request,
        thousands(r.store_failures),
        thousands(r.breaker_refused),
        thousands(r.breaker_opened),
        thousands(r.local_answers),
        thousands(r.journaled),
        thousands(r.lost_writes),
    );
    crate::per_store::table(&r.stores, &mut out);
    let _ = writeln!(
        out,
        "requests: {} admitted · {} denied · {} unavailable · {} lost in flight",
        thousands(r.admitted),
        thousands(r.denied),
        thousands(r.unavailable),
        thousands(r.failed_in_flight),
    );
    for h in &r.heals {
        match h.converged_after_s {
            Some(_) if h.keys == 0 => {
                let _ = writeln!(
                    out,
                    "heal at {} s: nothing to converge (no key was busy at the heal)",
                    trim(h.at_s, 3)
                );
            }
            Some(s) => {
                let _ = writeln!(
                    out,
                    "heal at {} s: converged after {} s ({} busy keys{})",
                    trim(h.at_s, 3),
                    trim(s, 3),
                    h.keys,
                    if h.moot > 0 {
                        format!(", {} views overtaken by their window's end", h.moot)
                    } else {
                        String::new()
                    }
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "heal at {} s: not converged by the end of the run ({} busy keys)",
                    trim(h.at_s, 3),
                    h.keys
                );
            }
        }
    }
    out
}

/// Header of the per-rule CSV.
pub const RULES_CSV_HEADER: &str = "rule,scope,algorithm,allowed_per_window,window_s,counters,windows,contested_windows,overshoot_max,overshoot_p99,overshoot_mean,excess_units,demand,admitted,denied,false_rejections,false_rejection_pct,over_admitted,admitted_per_s,limit_per_s,requests,rule_store_calls,rule_store_calls_per_request,deny_hits,lease_spent,lease_blocked,lease_calls,leased_units,returned_units,samples,sample_skipped,sample_blocked,gate_admitted,gate_refused,sync_calls,sync_failures,synced_units,gate_lost_units";

/// One CSV row of a rule (no newline).
pub fn rule_csv(r: &RuleReport) -> String {
    format!(
        "{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{},{},{},{},{},{:.4},{},{:.3},{},{},{},{:.6},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        r.id,
        r.scope,
        r.algorithm,
        r.allowed_per_window,
        trim(r.window_s, 6),
        r.counters,
        r.windows,
        r.contested_windows,
        r.overshoot_max,
        r.overshoot_p99,
        r.overshoot_mean,
        r.excess_units,
        r.demand,
        r.admitted,
        r.denied,
        r.false_rejections,
        r.false_rejection_pct,
        r.over_admitted,
        r.admitted_per_s,
        trim(r.limit_per_s, 6),
        r.requests,
        r.store_calls,
        r.store_calls_per_request,
        r.deny_hits,
        r.lease_spent,
        r.lease_blocked,
        r.lease_calls,
        r.leased_units,
        r.returned_units,
        r.samples,
        r.sample_skipped,
        r.sample_blocked,
        r.gate_admitted,
        r.gate_refused,
        r.sync_calls,
        r.sync_failures,
        r.synced_units,
        r.gate_lost_units,
    )
}

/// The per-rule CSV, with run-level columns repeated on each row.
pub fn summary_csv(r: &Report) -> String {
    let mut out = format!(
        "scenario,seed,ship_interval_ms,{RULES_CSV_HEADER},gossip_bytes_per_s,gossip_deferred,store_calls_per_request,expired_units,give_backs_failed,converged_after_s\n"
    );
    let conv = r.converged_after_s();
    for rule in &r.rules {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.1},{},{:.4},{},{},{}",
            r.scenario,
            r.seed,
            trim(r.ship_interval_ms, 3),
            rule_csv(rule),
            r.gossip.bytes_per_s,
            r.gossip.deferred,
            r.store_calls_per_request,
            r.hot_keys.expired_units,
            r.hot_keys.give_backs_failed,
            conv.map_or(String::new(), |c| trim(c, 6)),
        );
    }
    out
}

/// Admitted per window of the busiest counters.
pub fn windows_csv(r: &Report) -> String {
    let mut out = String::from("rule,key,region,window_start_s,allowed,demand,admitted");
    for reg in &r.regions {
        let _ = write!(out, ",admitted_{reg}");
    }
    out.push('\n');
    for s in &r.series {
        for (start, admitted, demand, per) in &s.windows {
            let _ = write!(
                out,
                "{},\"{}\",{},{},{},{},{}",
                s.rule,
                s.key.replace('"', "\"\""),
                s.region.as_deref().unwrap_or(""),
                trim(*start, 6),
                s.allowed,
                demand,
                admitted
            );
            for p in per {
                let _ = write!(out, ",{p}");
            }
            out.push('\n');
        }
    }
    out
}

/// Store calls per request second by second, per rule.
pub fn calls_csv(r: &Report) -> String {
    let mut out = String::from("rule,second,requests,store_calls,store_calls_per_request\n");
    for c in &r.calls {
        for (t, n, calls) in &c.seconds {
            let _ = writeln!(
                out,
                "{},{t},{n},{calls},{:.6}",
                c.rule,
                *calls as f64 / (*n).max(1) as f64
            );
        }
    }
    out
}

/// The report as JSON (without the series, which windows.csv and calls.csv carry).
pub fn json(r: &Report) -> String {
    let mut v = serde_json::to_value(r).unwrap_or(serde_json::Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("series");
        o.remove("calls");
    }
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}
