//! The check of a parsed file into a [`Scenario`]: every semantic rule, each refusal naming
//! the field by its dotted path; the rules go through sluice-core's own validator.

use super::check_stores::{BreakerFields, breaker, known_stores, named_stores};
use super::check_traffic::check_traffic;
use super::fields::{
    clock_offsets, dist, fraction, ms, non_negative, positive, region_index, secs, threshold_pct,
};
use super::{
    Event, EventFile, File, GossipCfg, Link, MAX_DAEMONS, MAX_DURATION_S, MAX_REGIONS, Scenario,
    ScenarioError, StoreCfg, invalid,
};
use sluice_core::Micros;
use sluice_core::algo::Kind;
use sluice_core::breaker::BreakerConfig;
use sluice_core::rules::from_values;
use sluice_core::ship::Budget;
use sluice_core::time::MILLI;

/// Checks a parsed file into a scenario.
pub fn check(f: File) -> Result<Scenario, ScenarioError> {
    if f.name.trim().is_empty() {
        return Err(invalid("name", "must not be empty"));
    }
    let duration_s = positive("duration_s", f.duration_s)?;
    if duration_s > MAX_DURATION_S {
        return Err(invalid(
            "duration_s",
            format!("must be at most {MAX_DURATION_S} (a week), got {duration_s}"),
        ));
    }
    let duration = secs(duration_s);
    if f.regions.is_empty() {
        return Err(invalid("regions", "at least one region is needed"));
    }
    if f.regions.len() > MAX_REGIONS {
        return Err(invalid("regions", format!("at most {MAX_REGIONS} regions")));
    }
    for (i, r) in f.regions.iter().enumerate() {
        if r.trim().is_empty() {
            return Err(invalid(format!("regions[{i}]"), "a region needs a name"));
        }
        if f.regions[..i].contains(r) {
            return Err(invalid(
                format!("regions[{i}]"),
                format!("{r:?} appears twice"),
            ));
        }
    }
    let daemons = f.daemons_per_region as usize;
    if daemons == 0 || daemons > MAX_DAEMONS {
        return Err(invalid(
            "daemons_per_region",
            format!(
                "must be from 1 to {MAX_DAEMONS}, got {}",
                f.daemons_per_region
            ),
        ));
    }
    let n = f.regions.len();

    // [store]
    let local_permille = match f.store.local_permille {
        None => (1000 / daemons as u64).max(1),
        Some(p) if (1..=1000).contains(&p) => p,
        Some(p) => {
            return Err(invalid(
                "store.local_permille",
                format!("must be from 1 to 1000, got {p}"),
            ));
        }
    };
    if f.store.max_keys == 0 {
        return Err(invalid("store.max_keys", "must be greater than zero"));
    }
    let breaker = breaker(
        "store",
        &BreakerFields {
            failure_pct: f.store.breaker_failure_pct,
            window_ms: f.store.breaker_window_ms,
            min_calls: f.store.breaker_min_calls,
            cool_off_ms: f.store.breaker_cool_off_ms,
        },
        &BreakerConfig::default(),
    )?;
    let store = StoreCfg {
        latency: dist("store.latency_ms", &f.store.latency_ms)?,
        local_permille,
        max_keys: f.store.max_keys as usize,
        breaker,
    };
    // [stores.NAME]
    let stores = named_stores(&f, &store)?;

    // [gossip]
    let g = &f.gossip;
    let interval = ms(positive("gossip.ship_interval_ms", g.ship_interval_ms)?);
    if interval < MILLI {
        return Err(invalid("gossip.ship_interval_ms", "must be at least 1 ms"));
    }
    let threshold = g
        .share_threshold
        .map(|t| threshold_pct("gossip.share_threshold", t))
        .transpose()?;
    if g.budget_bytes == 0 {
        return Err(invalid("gossip.budget_bytes", "must be greater than zero"));
    }
    if g.max_entries == Some(0) {
        return Err(invalid("gossip.max_entries", "must be greater than zero"));
    }
    if g.max_keys == 0 {
        return Err(invalid("gossip.max_keys", "must be greater than zero"));
    }
    let budget = Budget {
        max_bytes: g.budget_bytes as usize,
        max_entries: g.max_entries.map_or(usize::MAX, |e| e as usize),
        resend_after: ms(non_negative("gossip.resend_after_ms", g.resend_after_ms)?),
    };
    let default_link = Link {
        delay: dist("gossip.delay_ms", &g.delay_ms)?,
        loss: fraction("gossip.loss", g.loss)?,
    };
    let mut links = vec![vec![default_link; n]; n];
    for (i, l) in g.links.iter().enumerate() {
        let at = format!("gossip.links[{i}]");
        if l.between.len() != 2 {
            return Err(invalid(
                format!("{at}.between"),
                "must name exactly two regions",
            ));
        }
        let a = region_index(&f.regions, &format!("{at}.between"), &l.between[0])?;
        let b = region_index(&f.regions, &format!("{at}.between"), &l.between[1])?;
        if a == b {
            return Err(invalid(
                format!("{at}.between"),
                "must name two different regions",
            ));
        }
        let mut link = links[a][b];
        if let Some(d) = &l.delay_ms {
            link.delay = dist(&format!("{at}.delay_ms"), d)?;
        }
        if let Some(loss) = l.loss {
            link.loss = fraction(&format!("{at}.loss"), loss)?;
        }
        links[a][b] = link;
        links[b][a] = link;
    }
    let phases = match &g.phase_ms {
        None => None,
        Some(p) if p.len() != n => {
            return Err(invalid(
                "gossip.phase_ms",
                format!("needs one phase per region ({n}), got {}", p.len()),
            ));
        }
        Some(p) => Some(
            p.iter()
                .enumerate()
                .map(|(i, v)| Ok(ms(non_negative(&format!("gossip.phase_ms[{i}]"), *v)?)))
                .collect::<Result<Vec<_>, ScenarioError>>()?,
        ),
    };
    let gossip = GossipCfg {
        phases,
        interval,
        threshold_pct: threshold,
        budget,
        resend_on_rejoin: g.resend_on_rejoin,
        shippers: g.shippers,
        fanout: g.fanout as usize,
        forward_at_once: g.forward == crate::scenario::ForwardAt::AtOnce,
        busy_on: g.busy_on,
        delivery: g.delivery,
        links,
        max_keys: g.max_keys as usize,
    };

    // [measure]
    let warmup = secs(non_negative("measure.warmup_s", f.measure.warmup_s)?);
    if warmup >= duration {
        return Err(invalid(
            "measure.warmup_s",
            "must be shorter than duration_s",
        ));
    }
    let plot_keys = match f.measure.plot_keys {
        None => 1,
        Some(k) if (1..=100).contains(&k) => k as usize,
        Some(k) => {
            return Err(invalid(
                "measure.plot_keys",
                format!("must be from 1 to 100, got {k}"),
            ));
        }
    };

    // rules
    if f.rules.is_empty() {
        return Err(invalid("rules", "at least one rule is needed"));
    }
    let mut doc = serde_json::Map::new();
    doc.insert("domain".into(), serde_json::Value::String(f.domain.clone()));
    doc.insert("rules".into(), serde_json::Value::Array(f.rules.clone()));
    if !f.overrides.is_empty() {
        doc.insert(
            "overrides".into(),
            serde_json::Value::Array(f.overrides.clone()),
        );
    }
    let set = from_values(&[serde_json::Value::Object(doc)], 1).map_err(|e| {
        let first = e
            .problems
            .first()
            .map(|p| format!("rule {}: field `{}`: {}", p.at, p.field, p.message))
            .unwrap_or_default();
        let more = e.problems.len().saturating_sub(1);
        invalid(
            "rules",
            if more > 0 {
                format!("{first} (and {more} more: {e})")
            } else {
                first
            },
        )
    })?;
    let Some(domain) = set.domain(&f.domain).cloned() else {
        return Err(invalid("domain", "no rules for this domain"));
    };
    for r in &domain.rules {
        if r.params.kind() == Kind::Concurrency {
            return Err(invalid(
                "rules",
                format!(
                    "rule {}: concurrency rules are not simulated (requests have no duration here)",
                    r.id
                ),
            ));
        }
    }
    // A rule counting in a store the scenario lacks would be counted elsewhere.
    known_stores(&set, &stores)?;

    // traffic
    if f.traffic.is_empty() {
        return Err(invalid(
            "traffic",
            "at least one traffic generator is needed",
        ));
    }
    let mut traffic = Vec::with_capacity(f.traffic.len());
    for (i, t) in f.traffic.iter().enumerate() {
        traffic.push(check_traffic(
            &format!("traffic[{i}]"),
            i,
            t,
            &f.regions,
            duration,
            daemons,
        )?);
    }

    // events
    let mut events = Vec::with_capacity(f.events.len());
    let mut replica_lag = vec![vec![None; 1 + stores.len()]; n];
    for (i, e) in f.events.iter().enumerate() {
        let at = format!("events[{i}]");
        // An event after the end never happens (a run shortened with --set keeps its file's
        // events).
        let when = |v: f64| -> Result<Micros, ScenarioError> {
            Ok(secs(non_negative(&format!("{at}.at_s"), v)?))
        };
        let reg = |name: &str| region_index(&f.regions, &format!("{at}.region"), name);
        let ev = match e {
            EventFile::RegionDown { at_s, region } => {
                (when(*at_s)?, Event::RegionDown(reg(region)?))
            }
            EventFile::RegionUp {
                at_s,
                region,
                wipe_store,
            } => (when(*at_s)?, Event::RegionUp(reg(region)?, *wipe_store)),
            EventFile::Partition { at_s, groups } => {
                let mut group = vec![usize::MAX; n];
                for (gi, g) in groups.iter().enumerate() {
                    for name in g {
                        let r = region_index(&f.regions, &format!("{at}.groups"), name)?;
                        if group[r] != usize::MAX {
                            return Err(invalid(
                                format!("{at}.groups"),
                                format!("region {name:?} is in two groups"),
                            ));
                        }
                        group[r] = gi;
                    }
                }
                if let Some(r) = group.iter().position(|g| *g == usize::MAX) {
                    return Err(invalid(
                        format!("{at}.groups"),
                        format!(
                            "region {:?} is in no group; list every region once",
                            f.regions[r]
                        ),
                    ));
                }
                (when(*at_s)?, Event::Partition(group))
            }
            EventFile::Heal { at_s } => (when(*at_s)?, Event::Heal),
            EventFile::StoreFailover {
                at_s,
                region,
                store,
                lost_ms,
                outage_ms,
            } => {
                let r = reg(region)?;
                let slot = match store.as_deref() {
                    None | Some(sluice_core::stores::DEFAULT) => 0,
                    Some(name) => match stores.iter().position(|s| s.name == name) {
                        Some(i) => i + 1,
                        None => {
                            return Err(invalid(
                                format!("{at}.store"),
                                format!("no store {name:?}: declare it as [stores.{name}]"),
                            ));
                        }
                    },
                };
                if replica_lag[r][slot].is_some() {
                    let which = store
                        .as_deref()
                        .map_or(String::new(), |s| format!("'s {s:?}"));
                    return Err(invalid(
                        format!("{at}.region"),
                        format!(
                            "{region:?}{which} already fails over once; the simulator models one failover per store per region per run"
                        ),
                    ));
                }
                replica_lag[r][slot] = Some(ms(non_negative(&format!("{at}.lost_ms"), *lost_ms)?));
                let outage = ms(non_negative(&format!("{at}.outage_ms"), *outage_ms)?);
                (when(*at_s)?, Event::StoreFailover(r, slot, outage))
            }
            EventFile::DaemonDown {
                at_s,
                region,
                daemon,
                graceful,
            } => {
                let r = reg(region)?;
                if *daemon as usize >= daemons {
                    return Err(invalid(
                        format!("{at}.daemon"),
                        format!("must be below daemons_per_region ({daemons}), got {daemon}"),
                    ));
                }
                (
                    when(*at_s)?,
                    Event::DaemonDown(r, *daemon as usize, *graceful),
                )
            }
            EventFile::SetShip {
                at_s,
                ship_interval_ms,
                share_threshold,
            } => {
                if ship_interval_ms.is_none() && share_threshold.is_none() {
                    return Err(invalid(
                        at.as_str(),
                        "set_ship needs ship_interval_ms or share_threshold",
                    ));
                }
                let iv = ship_interval_ms
                    .map(|v| {
                        let v = ms(positive(&format!("{at}.ship_interval_ms"), v)?);
                        if v < MILLI {
                            return Err(invalid(
                                format!("{at}.ship_interval_ms"),
                                "must be at least 1 ms",
                            ));
                        }
                        Ok(v)
                    })
                    .transpose()?;
                let th = share_threshold
                    .map(|t| threshold_pct(&format!("{at}.share_threshold"), t))
                    .transpose()?;
                (when(*at_s)?, Event::SetShip(iv, th))
            }
        };
        events.push(ev);
    }
    // Stable: events at the same instant keep file order.
    events.sort_by_key(|(t, _)| *t);
    events.retain(|(t, _)| *t <= duration);

    Ok(Scenario {
        name: f.name.clone(),
        description: f.description.trim().to_string(),
        seed: f.seed,
        duration,
        regions: f.regions.clone(),
        daemons,
        store,
        stores,
        gossip,
        warmup,
        plot_keys,
        rules: domain,
        domain: f.domain.clone(),
        traffic,
        events,
        replica_lag,
        clock_offset: clock_offsets(&f.clock, n)?,
    })
}

#[cfg(test)]
mod tests {
    use crate::scenario::{MINIMAL, parse};
    use sluice_core::time::SECOND;

    fn err(text: &str) -> String {
        match parse(text, &[]) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_minimal_file_loads_with_defaults() {
        let s = parse(MINIMAL, &[]).expect("valid");
        assert_eq!(s.regions, ["us", "eu"]);
        assert_eq!(s.gossip.interval, SECOND);
        assert_eq!(s.traffic[0].regions, [0, 1]);
        assert_eq!(s.domain().rules.len(), 1);
    }

    #[test]
    fn bad_files_name_the_field() {
        let e = err(&MINIMAL.replace("regions = [\"us\", \"eu\"]", "regions = []"));
        assert!(e.contains("`regions`") && e.contains("at least one"), "{e}");
        let e = err(&format!(
            "{MINIMAL}[gossip]\ndelay_ms = {{ dist = \"uniform\", min = -5, max = 3 }}\n"
        ));
        assert!(
            e.contains("gossip.delay_ms.min") && e.contains("negative"),
            "{e}"
        );
        let e = err(&MINIMAL.replace("rate_per_s = 10", "rate_per_s = 10\nrat = 3"));
        assert!(e.contains("unknown field `rat`"), "{e}");
        let e = err(&MINIMAL.replace("limit = 100", "limit = 0"));
        assert!(e.contains("rule g") && e.contains("`limit`"), "{e}");
        let e = err(&MINIMAL.replace("duration_s = 60", "duration_s = \"long\""));
        assert!(e.contains("duration_s"), "{e}");
        let e = err(&format!(
            "{MINIMAL}[[events]]\nkind = \"region_down\"\nat_s = 5\nregion = \"mars\"\n"
        ));
        assert!(e.contains("events[0].region") && e.contains("mars"), "{e}");
        let e = err(&format!("{MINIMAL}[gossip]\nloss = 1.5\n"));
        assert!(e.contains("gossip.loss"), "{e}");
        let e = err(&format!(
            "{MINIMAL}[[events]]\nkind = \"partition\"\nat_s = 5\ngroups = [[\"us\"]]\n"
        ));
        assert!(
            e.contains("events[0].groups") && e.contains("\"eu\""),
            "{e}"
        );
        let e = err(&MINIMAL.replace("duration_s = 60", "duration_s = 0"));
        assert!(e.contains("`duration_s`"), "{e}");
        let e = err(&format!("{MINIMAL}[gossip]\nphase_ms = [0]\n"));
        assert!(
            e.contains("gossip.phase_ms") && e.contains("one phase per region"),
            "{e}"
        );
        let e = err(&format!("{MINIMAL}[gossip]\nphase_ms = [0, -1]\n"));
        assert!(e.contains("gossip.phase_ms[1]"), "{e}");
        let e = err(&format!("{MINIMAL}[clock]\nskew_ms = -5\n"));
        assert!(e.contains("clock.skew_ms"), "{e}");
        let e = err(&format!("{MINIMAL}[clock]\noffset_ms = [0]\n"));
        assert!(
            e.contains("clock.offset_ms") && e.contains("one offset"),
            "{e}"
        );
        let e = err(&format!(
            "{MINIMAL}[clock]\nskew_ms = 5\noffset_ms = [0, 1]\n"
        ));
        assert!(e.contains("not both"), "{e}");
    }

    #[test]
    fn clocks_are_on_time_unless_skewed() {
        let s = parse(MINIMAL, &[]).expect("valid");
        assert_eq!(s.clock_offset, [0, 0]);
        let three = MINIMAL.replace("[\"us\", \"eu\"]", "[\"us\", \"eu\", \"ap\"]");
        let p = [("clock_skew_ms".to_string(), "250".to_string())];
        let s = parse(&three, &p).expect("valid");
        assert_eq!(s.clock_offset, [-125_000, 0, 125_000], "spread over 250 ms");
        let s = parse(&format!("{MINIMAL}[clock]\noffset_ms = [-3, 1000]\n"), &[]).expect("valid");
        assert_eq!(s.clock_offset, [-3_000, 1_000_000]);
    }
}
