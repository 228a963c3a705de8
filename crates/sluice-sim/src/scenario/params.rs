//! `--set` and `--param` overrides: a value written into the parsed TOML document, by alias
//! or dotted path, before the file is checked.

use super::ScenarioError;

/// Short names `--param` accepts, and the field each stands for.
pub const PARAM_ALIASES: &[(&str, &str)] = &[
    ("ship_interval_ms", "gossip.ship_interval_ms"),
    ("share_threshold", "gossip.share_threshold"),
    ("budget_bytes", "gossip.budget_bytes"),
    ("loss", "gossip.loss"),
    ("shippers", "gossip.shippers"),
    ("fanout", "gossip.fanout"),
    ("forward", "gossip.forward"),
    ("busy_on", "gossip.busy_on"),
    ("delivery", "gossip.delivery"),
    ("resend_on_rejoin", "gossip.resend_on_rejoin"),
    ("daemons", "daemons_per_region"),
    ("clock_skew_ms", "clock.skew_ms"),
];

/// Sets one field of the document: `name` is an alias from [`PARAM_ALIASES`] or a dotted
/// path (`gossip.delay_ms.max`, `traffic.0.rate_per_s`, `rules.hot.hot_keys.deny_cache`: a
/// list item by index, or by its `id`); `value` is a TOML value (`250`,
/// `0.05`, `"one_per_region"`; a bare word is taken as a string).
pub fn set_param(doc: &mut toml::Table, name: &str, value: &str) -> Result<(), ScenarioError> {
    let path = PARAM_ALIASES
        .iter()
        .find(|(a, _)| *a == name)
        .map_or(name, |(_, p)| *p);
    let parsed: toml::Value = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(value.into())),
        Err(_) => toml::Value::String(value.to_string()),
    };
    let parts: Vec<&str> = path.split('.').collect();
    let mut root = toml::Value::Table(std::mem::take(doc));
    let result = set_path(&mut root, &parts, parsed, name);
    if let toml::Value::Table(t) = root {
        *doc = t;
    }
    result
}

/// Sets `path` below `v`: table segments by name, list segments by index.
fn set_path(
    v: &mut toml::Value,
    path: &[&str],
    value: toml::Value,
    name: &str,
) -> Result<(), ScenarioError> {
    let Some((first, rest)) = path.split_first() else {
        *v = value;
        return Ok(());
    };
    let child = match v {
        toml::Value::Table(t) => {
            if rest.is_empty() {
                t.insert(first.to_string(), value);
                return Ok(());
            }
            t.entry(first.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        }
        toml::Value::Array(a) => {
            let n = a.len();
            match first.parse::<usize>() {
                Ok(i) => a.get_mut(i).ok_or_else(|| {
                    ScenarioError::Param(format!("{name}: index {i} is past the {n} items"))
                })?,
                // A list of tables with ids (the rules) is also addressed by id:
                // `rules.hot.hot_keys.deny_cache`.
                Err(_) => a
                    .iter_mut()
                    .find(|item| item.get("id").and_then(toml::Value::as_str) == Some(*first))
                    .ok_or_else(|| {
                        ScenarioError::Param(format!(
                            "{name}: {first:?} is neither an index into the list nor the id of one of its items"
                        ))
                    })?,
            }
        }
        _ => {
            return Err(ScenarioError::Param(format!(
                "{name}: cannot go into {first:?}: its parent is a plain value"
            )));
        }
    };
    set_path(child, rest, value, name)
}

#[cfg(test)]
mod tests {
    use crate::scenario::{MINIMAL, Shippers, parse};
    use sluice_core::time::MILLI;

    #[test]
    fn params_override_fields_by_alias_or_path() {
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        let s = parse(
            MINIMAL,
            &[
                p("ship_interval_ms", "250"),
                p("traffic.0.rate_per_s", "7.5"),
                p("shippers", "one_per_region"),
            ],
        )
        .expect("valid");
        assert_eq!(s.gossip.interval, 250 * MILLI);
        assert_eq!(s.traffic[0].rate, 7.5);
        assert_eq!(s.gossip.shippers, Shippers::OnePerRegion);
        let s = parse(
            MINIMAL,
            &[
                p("rules.g.hot_keys.deny_cache", "false"),
                p("rules.0.hot_keys.lease", "auto"),
            ],
        )
        .expect("valid");
        let hk = &s.domain().rules[0].hot_keys;
        assert!(!hk.deny_cache, "set by the rule's id");
        assert_eq!(
            hk.lease,
            sluice_core::hotkeys::LeaseMode::Auto,
            "by its index"
        );
        let e = parse(MINIMAL, &[p("rules.nope.limit", "1")]).expect_err("no such rule");
        assert!(e.to_string().contains("\"nope\""), "{e}");
        let e = parse(MINIMAL, &[p("traffic.3.rate_per_s", "1")]).expect_err("no such item");
        assert!(e.to_string().contains("index 3"), "{e}");
        let e = parse(MINIMAL, &[p("ship_interval_ms", "-1")]).expect_err("negative");
        assert!(e.to_string().contains("gossip.ship_interval_ms"), "{e}");
    }
}
