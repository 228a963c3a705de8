//! The envoyproxy/ratelimit config tree, read as the reference service reads it
//! (src/config/config_impl.go): every key of its `validKeys` accepted at any level, the same
//! types, units and checks, and the same refusals (an unknown key, a list of non-mappings, a bad
//! unit, a duplicate composite key, `share_threshold` without a wildcard), so a config it would
//! not load is not converted either, and one it loads always is.

use super::Note;
use super::yaml_in::{Yaml, float_or_tag};
use anyhow::{anyhow, bail};
use std::collections::HashSet;

/// Every key the reference loader accepts, anywhere in the tree (its `validKeys`).
pub(super) const VALID_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// A config entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Val {
    /// No value: any value, counted per value.
    Any,
    /// A value with `*` in it (`"*"`, `"foo*"`, `"a*b"`): the service globs `key_value`.
    Wild(String),
    /// An exact value.
    Exact(String),
}

impl Val {
    /// Envoy's lookup order at one level: exact, then wildcard, then the bare key.
    pub(super) fn rank(&self) -> u8 {
        match self {
            Val::Exact(_) => 2,
            Val::Wild(_) => 1,
            Val::Any => 0,
        }
    }

    /// `value: "*"`: any value, which Sluice's `"*"` carries.
    pub(super) fn is_star(&self) -> bool {
        matches!(self, Val::Wild(w) if w == "*")
    }

    pub(super) fn shown(&self, key: &str) -> String {
        match self {
            Val::Any => key.to_string(),
            Val::Wild(v) | Val::Exact(v) => format!("{key}={v}"),
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

/// One descriptor entry of the config, with what the service reads of it.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) key: String,
    pub(super) value: Val,
    pub(super) limit: Option<Limit>,
    pub(super) shadow: bool,
    pub(super) quota_mode: bool,
    pub(super) detailed_metric: bool,
    pub(super) value_to_metric: bool,
    pub(super) share_threshold: bool,
    pub(super) metadata: bool,
    pub(super) children: Vec<Node>,
    /// The file it came from (domains merge across files).
    pub(super) file: String,
    /// `descriptors[0].descriptors[1]`.
    pub(super) at: String,
}

/// The service's unit names (`RateLimitResponse.RateLimit.Unit`, case-insensitive) as windows;
/// month and year as its `UnitToDivider` counts them.
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

/// The service's `validateYamlKeys`: string keys from `validKeys` at every level, lists of
/// mappings only, scalar leaves (string, integer, bool, null); `metadata` is not looked into.
/// `at` is the path so far (`""` at the root).
pub(super) fn validate_keys(v: &Yaml, at: &str) -> anyhow::Result<()> {
    let Yaml::Map(m) = v else { return Ok(()) };
    let at_or_root = if at.is_empty() { "root" } else { at };
    for (k, v) in m {
        let k = match k {
            Yaml::Str(k) => k,
            other => bail!(
                "{at_or_root}: config error, key is not of type string: {}",
                other.text()
            ),
        };
        if !VALID_KEYS.contains(&k.as_str()) {
            bail!(
                "{at_or_root}: config error, unknown key '{k}' (the ratelimit service refuses it too; it accepts {})",
                VALID_KEYS.join(", ")
            );
        }
        if k == "metadata" {
            continue;
        }
        let here = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        match v {
            Yaml::List(items) => {
                for (i, e) in items.iter().enumerate() {
                    if !matches!(e, Yaml::Map(_)) {
                        bail!(
                            "{here}[{i}]: config error, yaml file contains list of type other than map: {}",
                            e.text()
                        );
                    }
                    validate_keys(e, &format!("{here}[{i}]"))?;
                }
            }
            Yaml::Map(_) => validate_keys(v, &here)?,
            Yaml::Str(_) | Yaml::Int(_) | Yaml::Bool(_) | Yaml::Null => {}
            Yaml::Other(_) => bail!(
                "{here}: error checking config ({}: the service's loader takes strings, integers and booleans)",
                float_or_tag(v)
            ),
        }
    }
    Ok(())
}

/// The mapping at `at`, with the keys this level reads; the other valid keys are ignored by
/// the service here, and so noted.
fn level<'a>(
    v: &'a Yaml,
    at: &str,
    file: &str,
    reads: &[&str],
    notes: &mut Vec<Note>,
) -> anyhow::Result<&'a [(Yaml, Yaml)]> {
    let Yaml::Map(m) = v else {
        bail!("{at}: cannot unmarshal {} into a mapping", v.text());
    };
    for (k, _) in m {
        if let Yaml::Str(k) = k
            && !reads.contains(&k.as_str())
        {
            notes.push(Note::new(
                file,
                at,
                k,
                "ignored: the ratelimit service accepts this key here but does not read it either",
            ));
        }
    }
    Ok(m)
}

fn get<'a>(m: &'a [(Yaml, Yaml)], field: &str) -> Option<&'a Yaml> {
    m.iter()
        .rev()
        .find(|(k, _)| matches!(k, Yaml::Str(k) if k == field))
        .map(|(_, v)| v)
}

/// A string field: yaml.v2 takes any scalar's text; null is empty.
pub(super) fn string(m: &[(Yaml, Yaml)], field: &str, at: &str) -> anyhow::Result<String> {
    match get(m, field) {
        None | Some(Yaml::Null) => Ok(String::new()),
        Some(Yaml::Str(s)) => Ok(s.clone()),
        Some(v @ (Yaml::Int(_) | Yaml::Bool(_))) => Ok(v.text()),
        Some(other) => bail!(
            "{at}.{field}: cannot unmarshal {} into a string",
            other.text()
        ),
    }
}

/// A bool field: YAML 1.1's words count, as they do for the service's yaml.v2.
fn boolean(m: &[(Yaml, Yaml)], field: &str, at: &str) -> anyhow::Result<bool> {
    match get(m, field) {
        None | Some(Yaml::Null) => Ok(false),
        Some(Yaml::Bool(b)) => Ok(*b),
        Some(Yaml::Str(s)) => match s.as_str() {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Ok(true),
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Ok(false),
            _ => bail!("{at}.{field}: must be true or false, got {s:?}"),
        },
        Some(other) => bail!("{at}.{field}: must be true or false, got {}", other.text()),
    }
}

fn list<'a>(m: &'a [(Yaml, Yaml)], field: &str, at: &str) -> anyhow::Result<&'a [Yaml]> {
    match get(m, field) {
        None | Some(Yaml::Null) => Ok(&[]),
        Some(Yaml::List(items)) => Ok(items),
        Some(other) => bail!(
            "{at}.{field}: cannot unmarshal {} into a list",
            other.text()
        ),
    }
}

fn limit(v: &Yaml, at: &str, file: &str, notes: &mut Vec<Note>) -> anyhow::Result<Limit> {
    let m = level(
        v,
        at,
        file,
        &["requests_per_unit", "unit", "unlimited", "name", "replaces"],
        notes,
    )?;
    let unlimited = boolean(m, "unlimited", at)?;
    let unit = string(m, "unit", at)?;
    let window = window(&unit);
    if unlimited && window.is_some() {
        bail!("{at}: should not specify rate limit unit when unlimited");
    }
    if !unlimited && window.is_none() {
        bail!(
            "{at}: invalid rate limit unit '{unit}' (second, minute, hour, day, week, month or year)"
        );
    }
    let requests_per_unit = match get(m, "requests_per_unit") {
        None | Some(Yaml::Null) => 0,
        Some(Yaml::Int(n)) => u64::try_from(*n)
            .ok()
            .filter(|v| *v <= u64::from(u32::MAX))
            .ok_or_else(|| {
                anyhow!("{at}.requests_per_unit: {n} is not a whole number from 0 to 2^32-1")
            })?,
        Some(other) => bail!(
            "{at}.requests_per_unit: cannot unmarshal {} into a number",
            other.text()
        ),
    };
    let name = string(m, "name", at)?;
    let mut replaces = Vec::new();
    for (i, r) in list(m, "replaces", at)?.iter().enumerate() {
        let here = format!("{at}.replaces[{i}]");
        let rm = level(r, &here, file, &["name"], notes)?;
        replaces.push(string(rm, "name", &here)?);
    }
    for r in &replaces {
        if r.is_empty() {
            bail!("{at}: should not have an empty replaces entry");
        }
        if *r == name {
            bail!("{at}: replaces should not contain name of same descriptor");
        }
    }
    Ok(Limit {
        window,
        requests_per_unit,
        unlimited,
        name: Some(name).filter(|n| !n.is_empty()),
        replaces,
    })
}

/// Where a level's entries are read: the composite keys already taken there (a domain's top
/// level is shared by every file merged into it) and the composite key of its parent.
pub(super) struct Level<'a> {
    pub(super) taken: &'a mut HashSet<String>,
    pub(super) parent_key: &'a str,
    pub(super) at: &'a str,
    pub(super) file: &'a str,
}

/// A `descriptors` list as the service's `loadDescriptors` reads it.
pub(super) fn nodes(
    items: &[Yaml],
    lv: Level<'_>,
    notes: &mut Vec<Note>,
) -> anyhow::Result<Vec<Node>> {
    let mut out: Vec<Node> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let here = format!("{}[{i}]", lv.at);
        let m = level(
            item,
            &here,
            lv.file,
            &[
                "key",
                "value",
                "rate_limit",
                "descriptors",
                "shadow_mode",
                "quota_mode",
                "detailed_metric",
                "value_to_metric",
                "share_threshold",
                "metadata",
            ],
            notes,
        )?;
        let key = string(m, "key", &here)?;
        if key.is_empty() {
            bail!("{here}: descriptor has empty key");
        }
        let raw = string(m, "value", &here)?;
        let final_key = if raw.is_empty() {
            key.clone()
        } else {
            format!("{key}_{raw}")
        };
        let composite = format!("{}{final_key}", lv.parent_key);
        if !lv.taken.insert(final_key.clone()) {
            bail!("{here}: duplicate descriptor composite key '{composite}'");
        }
        let value = if raw.is_empty() {
            Val::Any
        } else if raw.contains('*') {
            Val::Wild(raw)
        } else {
            Val::Exact(raw)
        };
        let limit = match get(m, "rate_limit") {
            None | Some(Yaml::Null) => None,
            Some(l) => Some(limit(l, &format!("{here}.rate_limit"), lv.file, notes)?),
        };
        let share_threshold = boolean(m, "share_threshold", &here)?;
        if share_threshold && !final_key.contains('*') {
            bail!(
                "{here}: share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
            );
        }
        let metadata = match get(m, "metadata") {
            None | Some(Yaml::Null) => false,
            Some(Yaml::Map(md)) => !md.is_empty(),
            Some(other) => bail!(
                "{here}.metadata: cannot unmarshal {} into a mapping",
                other.text()
            ),
        };
        let children = nodes(
            list(m, "descriptors", &here)?,
            Level {
                taken: &mut HashSet::new(),
                parent_key: &format!("{composite}."),
                at: &format!("{here}.descriptors"),
                file: lv.file,
            },
            notes,
        )?;
        out.push(Node {
            children,
            shadow: boolean(m, "shadow_mode", &here)?,
            quota_mode: boolean(m, "quota_mode", &here)?,
            detailed_metric: boolean(m, "detailed_metric", &here)?,
            value_to_metric: boolean(m, "value_to_metric", &here)?,
            share_threshold,
            metadata,
            key,
            value,
            limit,
            file: lv.file.to_string(),
            at: here,
        });
    }
    Ok(out)
}

/// One file's root (`YamlRoot`): its domain name and its descriptors.
pub(super) struct Root<'a> {
    pub(super) domain: String,
    pub(super) descriptors: &'a [Yaml],
}

/// Reads a file's root mapping, checking its keys first, as the service does.
pub(super) fn root<'a>(
    doc: &'a Yaml,
    file: &str,
    notes: &mut Vec<Note>,
) -> anyhow::Result<Root<'a>> {
    if matches!(doc, Yaml::Null) {
        bail!("config file cannot have empty domain");
    }
    validate_keys(doc, "")?;
    let m = level(doc, "root", file, &["domain", "descriptors"], notes)?;
    let domain = string(m, "domain", "root")?;
    if domain.is_empty() {
        bail!("config file cannot have empty domain");
    }
    Ok(Root {
        domain,
        descriptors: list(m, "descriptors", "root")?,
    })
}

#[cfg(test)]
mod tests {
    use crate::import_envoy::convert_one as convert;

    #[test]
    fn invalid_configs_are_refused_as_the_service_refuses_them() {
        for (bad, why) in [
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, unlimited: true }\n",
                "should not specify rate limit unit when unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    ratelimit: {}\n",
                "unknown key 'ratelimit'",
            ),
            ("domain: d\ndescriptors:\n  - value: x\n", "empty key"),
            (
                "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
                "duplicate descriptor composite key 'd.a'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n  - key: a_b\n    value: c\n",
                "duplicate descriptor composite key 'd.a_b_c'",
            ),
            ("descriptors: []\n", "empty domain"),
            ("", "empty domain"),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}] }\n",
                "replaces should not contain name of same descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, replaces: [{name: }] }\n",
                "should not have an empty replaces entry",
            ),
            (
                "domain: d\ndescriptors: [a, b]\n",
                "list of type other than map: a",
            ),
            ("0.25: d\n", "key is not of type string: 0.25"),
            (
                "domain: d\ndescriptors:\n  - key: a\n    value: 1.5\n",
                "error checking config",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n",
                "share_threshold can only be used with wildcard values",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: -1 }\n",
                "requests_per_unit",
            ),
            ("'''\n", "not YAML"),
        ] {
            let e = convert(bad).expect_err(why);
            assert!(format!("{e:#}").contains(why), "{why}: {e:#}");
        }
    }

    #[test]
    fn what_the_service_accepts_is_accepted() {
        // Valid keys where the service does not read them, YAML 1.1 booleans, scalars as
        // strings, metadata of any shape, an unlimited limit with a unit it does not know.
        let ok = r#"
domain: d
unit: second
descriptors:
  - key: 7
    value: true
    domain: ignored
    shadow_mode: yes
    metadata: { a: [1, 2.5, { 3: x }] }
    rate_limit: { unlimited: true, unit: fortnight, replaces: [{ name: x, unit: y }] }
  - key: a
    value: "*"
    share_threshold: on
    rate_limit: { unit: Minute, requests_per_unit: 3 }
"#;
        let import = convert(ok).expect("the service loads this");
        let notes: Vec<String> = import.notes.iter().map(ToString::to_string).collect();
        let notes = notes.join("\n");
        for needle in [
            "root unit: ignored",
            "descriptors[0] domain: ignored",
            "replaces[0] unit: ignored",
            "metadata: not carried over",
        ] {
            assert!(notes.contains(needle), "missing {needle:?} in:\n{notes}");
        }
    }
}
