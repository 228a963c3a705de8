//! The envoyproxy/ratelimit config tree, read as the reference service reads it: the same
//! keys, units and checks, and the same refusals (an unknown key, a bad unit, a duplicate
//! entry), so a config it would not load is not converted either.

use anyhow::{anyhow, bail};
use serde_json::{Map, Value};

/// A config entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Val {
    /// No value: any value, counted per value.
    Any,
    /// `value: "foo*"` (`""` for a bare `*`).
    Prefix(String),
    /// An exact value.
    Exact(String),
}

impl Val {
    /// Envoy's lookup order at one level: exact, then wildcard, then the bare key.
    pub(super) fn rank(&self) -> u8 {
        match self {
            Val::Exact(_) => 2,
            Val::Prefix(_) => 1,
            Val::Any => 0,
        }
    }

    pub(super) fn shown(&self, key: &str) -> String {
        match self {
            Val::Any => key.to_string(),
            Val::Prefix(p) => format!("{key}={p}*"),
            Val::Exact(v) => format!("{key}={v}"),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Limit {
    pub(super) window: Option<&'static str>,
    pub(super) requests_per_unit: u64,
    pub(super) unlimited: bool,
    pub(super) name: Option<String>,
    pub(super) replaces: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) key: String,
    pub(super) value: Val,
    pub(super) limit: Option<Limit>,
    pub(super) shadow: bool,
    pub(super) detailed_metric: bool,
    pub(super) children: Vec<Node>,
    pub(super) at: String,
}

fn window(unit: &str) -> Option<&'static str> {
    Some(match unit.to_ascii_uppercase().as_str() {
        "SECOND" => "1s",
        "MINUTE" => "1m",
        "HOUR" => "1h",
        "DAY" => "1d",
        "WEEK" => "1w",
        "MONTH" => "30d",
        "YEAR" => "365d",
        _ => return None,
    })
}

pub(super) fn fields<'a>(
    v: &'a Value,
    at: &str,
    allowed: &[&str],
) -> anyhow::Result<&'a Map<String, Value>> {
    let m = v
        .as_object()
        .ok_or_else(|| anyhow!("{at}: expected a mapping"))?;
    for k in m.keys() {
        if !allowed.contains(&k.as_str()) {
            bail!(
                "{at}: unknown key {k:?} (the ratelimit service refuses it too; expected one of {})",
                allowed.join(", ")
            );
        }
    }
    Ok(m)
}

pub(super) fn string(
    m: &Map<String, Value>,
    field: &str,
    at: &str,
) -> anyhow::Result<Option<String>> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(other) => bail!("{at}: {field} must be a string, got {other}"),
    }
}

fn boolean(m: &Map<String, Value>, field: &str, at: &str) -> anyhow::Result<bool> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => bail!("{at}: {field} must be true or false, got {other}"),
    }
}

fn limit(v: &Value, at: &str) -> anyhow::Result<Limit> {
    let m = fields(
        v,
        at,
        &["requests_per_unit", "unit", "unlimited", "name", "replaces"],
    )?;
    let unlimited = boolean(m, "unlimited", at)?;
    let unit = string(m, "unit", at)?;
    let window = unit.as_deref().and_then(window);
    if unlimited && window.is_some() {
        bail!("{at}: should not specify a rate limit unit when unlimited");
    }
    if !unlimited && window.is_none() {
        bail!(
            "{at}: invalid rate limit unit {:?} (second, minute, hour, day, week, month or year)",
            unit.unwrap_or_default()
        );
    }
    let requests_per_unit = match m.get("requests_per_unit") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|v| *v <= u64::from(u32::MAX))
            .ok_or_else(|| {
                anyhow!("{at}: requests_per_unit must be a whole number up to 2^32-1")
            })?,
        Some(other) => bail!("{at}: requests_per_unit must be a number, got {other}"),
    };
    let name = string(m, "name", at)?.filter(|s| !s.is_empty());
    let mut replaces = Vec::new();
    match m.get("replaces") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, r) in items.iter().enumerate() {
                let rm = fields(r, &format!("{at}.replaces[{i}]"), &["name"])?;
                match string(rm, "name", at)? {
                    Some(n) if !n.is_empty() => {
                        if Some(&n) == name.as_ref() {
                            bail!(
                                "{at}: replaces should not contain the name of the same descriptor"
                            );
                        }
                        replaces.push(n)
                    }
                    _ => bail!("{at}.replaces[{i}]: should not be an empty replaces entry"),
                }
            }
        }
        Some(other) => bail!("{at}: replaces must be a list, got {other}"),
    }
    Ok(Limit {
        window,
        requests_per_unit,
        unlimited,
        name,
        replaces,
    })
}

pub(super) fn nodes(v: Option<&Value>, at: &str) -> anyhow::Result<Vec<Node>> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => bail!("{at}: descriptors must be a list, got {other}"),
    };
    let mut out: Vec<Node> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let here = format!("{at}[{i}]");
        let m = fields(
            item,
            &here,
            &[
                "key",
                "value",
                "rate_limit",
                "descriptors",
                "shadow_mode",
                "detailed_metric",
            ],
        )?;
        let key = string(m, "key", &here)?
            .filter(|k| !k.is_empty())
            .ok_or_else(|| anyhow!("{here}: descriptor has an empty key"))?;
        let value = match string(m, "value", &here)?.filter(|v| !v.is_empty()) {
            None => Val::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(p) => Val::Prefix(p.to_string()),
                None => Val::Exact(v),
            },
        };
        if out.iter().any(|n| n.key == key && n.value == value) {
            bail!("{here}: duplicate descriptor {}", value.shown(&key));
        }
        let limit = match m.get("rate_limit") {
            None | Some(Value::Null) => None,
            Some(l) => Some(limit(l, &format!("{here}.rate_limit"))?),
        };
        out.push(Node {
            children: nodes(m.get("descriptors"), &format!("{here}.descriptors"))?,
            shadow: boolean(m, "shadow_mode", &here)?,
            detailed_metric: boolean(m, "detailed_metric", &here)?,
            key,
            value,
            limit,
            at: here,
        });
    }
    Ok(out)
}
#[cfg(test)]
mod tests {
    use crate::import_envoy::convert;

    #[test]
    fn invalid_configs_are_refused_as_the_service_refuses_them() {
        for (bad, why) in [
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
                "invalid rate limit unit",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, unlimited: true }\n",
                "unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    ratelimit: {}\n",
                "unknown key \"ratelimit\"",
            ),
            ("domain: d\ndescriptors:\n  - value: x\n", "empty key"),
            (
                "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
                "duplicate descriptor a",
            ),
            ("descriptors: []\n", "empty domain"),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}] }\n",
                "same descriptor",
            ),
        ] {
            let e = convert(bad).expect_err(why);
            assert!(format!("{e:#}").contains(why), "{why}: {e:#}");
        }
    }
}
