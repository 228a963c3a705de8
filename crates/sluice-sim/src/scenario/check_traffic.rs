//! The check of one `[[traffic]]` generator.

use super::fields::{non_negative, positive, region_index, secs};
use super::{Keys, KeysFile, MAX_KEYS, ScenarioError, Spike, Traffic, TrafficFile, invalid};
use sluice_core::Micros;
use sluice_core::matching::Descriptors;

pub(super) fn check_traffic(
    at: &str,
    i: usize,
    t: &TrafficFile,
    regions: &[String],
    duration: Micros,
    daemons: usize,
) -> Result<Traffic, ScenarioError> {
    let names = |field: &str, list: &[String]| -> Result<Vec<usize>, ScenarioError> {
        if list.is_empty() {
            return Err(invalid(field, "must name at least one region"));
        }
        list.iter()
            .map(|r| region_index(regions, field, r))
            .collect()
    };
    let regs = match &t.regions {
        None => (0..regions.len()).collect(),
        Some(list) => names(&format!("{at}.regions"), list)?,
    };
    let rate = non_negative(&format!("{at}.rate_per_s"), t.rate_per_s)?;
    let keys = match &t.keys {
        KeysFile::One { name } => Keys::One(name.clone()),
        KeysFile::Uniform { n, prefix } | KeysFile::Zipf { n, prefix, .. } => {
            if *n == 0 || *n > MAX_KEYS {
                return Err(invalid(
                    format!("{at}.keys.n"),
                    format!("must be from 1 to {MAX_KEYS}, got {n}"),
                ));
            }
            match &t.keys {
                KeysFile::Zipf { s, .. } => Keys::Zipf(
                    *n as usize,
                    non_negative(&format!("{at}.keys.s"), *s)?,
                    prefix.clone(),
                ),
                _ => Keys::Uniform(*n as usize, prefix.clone()),
            }
        }
    };
    if t.descriptors.contains_key(&t.key_field) {
        return Err(invalid(
            format!("{at}.descriptors"),
            format!(
                "{:?} is the key_field; it cannot also be fixed",
                t.key_field
            ),
        ));
    }
    let descriptors: Vec<(String, String)> = t
        .descriptors
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut sample = descriptors.clone();
    sample.push((t.key_field.clone(), keys.value(keys.len() - 1)));
    Descriptors::new(sample).map_err(|e| invalid(format!("{at}.descriptors"), e.to_string()))?;
    if t.cost == 0 {
        return Err(invalid(format!("{at}.cost"), "must be at least 1"));
    }
    let start = secs(non_negative(&format!("{at}.start_s"), t.start_s)?);
    let end = match t.end_s {
        None => duration,
        Some(e) => secs(non_negative(&format!("{at}.end_s"), e)?).min(duration),
    };
    if end < start {
        return Err(invalid(format!("{at}.end_s"), "must not be before start_s"));
    }
    let spike = match &t.spike {
        None => None,
        Some(s) => {
            let factor = non_negative(&format!("{at}.spike.factor"), s.factor)?;
            let first = secs(positive(&format!("{at}.spike.first_s"), s.first_s)?);
            let period = secs(positive(&format!("{at}.spike.period_s"), s.period_s)?);
            if first > period {
                return Err(invalid(
                    format!("{at}.spike.first_s"),
                    "must not be longer than period_s",
                ));
            }
            Some(Spike {
                factor,
                first,
                period,
            })
        }
    };
    let mut steps = Vec::new();
    for (j, s) in t.steps.iter().enumerate() {
        let f = format!("{at}.steps[{j}]");
        steps.push((
            secs(non_negative(&format!("{f}.at_s"), s.at_s)?),
            non_negative(&format!("{f}.rate_per_s"), s.rate_per_s)?,
        ));
    }
    steps.sort_by_key(|s| s.0);
    let mut moves = Vec::new();
    for (j, m) in t.moves.iter().enumerate() {
        let f = format!("{at}.moves[{j}]");
        moves.push((
            secs(non_negative(&format!("{f}.at_s"), m.at_s)?),
            names(&format!("{f}.regions"), &m.regions)?,
        ));
    }
    moves.sort_by_key(|m| m.0);
    let daemon = match t.daemon {
        Some(d) if d as usize >= daemons => {
            return Err(invalid(
                format!("{at}.daemon"),
                format!("must be below daemons_per_region ({daemons}), got {d}"),
            ));
        }
        d => d.map(|d| d as usize),
    };
    Ok(Traffic {
        name: t.name.clone().unwrap_or_else(|| format!("traffic[{i}]")),
        regions: regs,
        rate,
        arrivals: t.arrivals,
        keys,
        key_field: t.key_field.clone(),
        descriptors,
        cost: t.cost,
        start,
        end,
        spike,
        steps,
        moves,
        daemon,
    })
}
