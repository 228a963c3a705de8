//! `sluicectl import-envoy FILE`: an envoyproxy/ratelimit config turned into Sluice rules, so
//! an Envoy fleet can move its limits along with its `rate_limit_service` address.
//!
//! The reference service matches a request descriptor by walking its config tree one entry at
//! a time (an exact `key`/`value` first, then a wildcard value, then the bare `key`) and applies
//! the limit found at exactly the request's depth, counted in a fixed window of one unit per
//! full descriptor. Each config node with a `rate_limit` becomes one rule:
//!
//! - `match`: `envoy.keys` (the entry keys in order, joined by `/`, which sluiced adds to every
//!   Envoy descriptor, see crates/sluiced/src/envoy.rs) pins the depth and order; each entry's
//!   value, or `"*"` for a bare key or a `*` value.
//! - `key`: every entry key, so the count is per full descriptor, as in Envoy.
//! - `fixed_window`, `limit: requests_per_unit`, `window` one unit (month = 30 d and year =
//!   365 d, as the reference service counts them).
//! - `shadow_mode` → `mode: shadow`; `unlimited` → `mode: off`, which still wins its group and
//!   so exempts the descriptor from a less specific limit, as in Envoy.
//! - Alternatives for the same keys (`key` vs `key`+`value`) share a `group`, listed most
//!   specific first, so exactly one applies, as in Envoy.
//!
//! What cannot be carried over is left out or kept with a note, never silently changed:
//! prefix wildcards (`value: "foo*"`), `requests_per_unit: 0`, `replaces`, `detailed_metric`,
//! keys that are not Sluice descriptor names, and the cases where the tree walk and Sluice's
//! "most specific rule of the group" pick different limits.

use anyhow::{Context as _, anyhow, bail};
use serde::Deserialize as _;
use serde_json::{Map, Value, json};
use std::collections::{BTreeSet, HashSet};

/// The synthetic descriptor sluiced adds to each Envoy descriptor (crates/sluiced/src/envoy.rs).
pub const KEYS_DESCRIPTOR: &str = "envoy.keys";

/// The converted rules and what could not be carried over.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    /// One rules document per domain, in the rule format.
    pub domains: Vec<Value>,
    /// Everything that was dropped or changes meaning, each naming the config path.
    pub notes: Vec<String>,
}

impl Import {
    /// The rules file: one YAML document per domain, fields in the rule format's order.
    pub fn to_yaml(&self, source: &str) -> anyhow::Result<String> {
        let mut out = format!(
            "# Imported from {source} by `sluicectl import-envoy`.\n\
             # Rules match on envoy.keys, which sluiced adds to every Envoy descriptor.\n"
        );
        for (i, d) in self.domains.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            out.push_str(&format!("domain: {}\nrules:\n", q(&d["domain"])?));
            let rules = d["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
            if rules.is_empty() {
                out.push_str("  []\n");
            }
            for r in rules {
                let mut first = true;
                for field in [
                    "id",
                    "group",
                    "match",
                    "key",
                    "algorithm",
                    "limit",
                    "window",
                    "mode",
                ] {
                    let v = &r[field];
                    if v.is_null() {
                        continue;
                    }
                    out.push_str(if first { "  - " } else { "    " });
                    first = false;
                    let text = match v {
                        Value::Object(m) => {
                            let items: Vec<String> = m
                                .iter()
                                .map(|(k, v)| Ok(format!("{}: {}", q(&json!(k))?, q(v)?)))
                                .collect::<anyhow::Result<_>>()?;
                            format!("{{ {} }}", items.join(", "))
                        }
                        Value::Array(a) => {
                            let items: Vec<String> =
                                a.iter().map(q).collect::<anyhow::Result<_>>()?;
                            format!("[{}]", items.join(", "))
                        }
                        v => q(v)?,
                    };
                    out.push_str(&format!("{field}: {text}\n"));
                }
            }
        }
        Ok(out)
    }
}

/// A YAML scalar: JSON's double-quoted strings are YAML's too; plain when that is unambiguous.
fn q(v: &Value) -> anyhow::Result<String> {
    Ok(match v {
        Value::String(s)
            if !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-/".contains(&b))
                && s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
                && !["true", "false", "null", "yes", "no", "on", "off", "y", "n"]
                    .contains(&s.to_ascii_lowercase().as_str()) =>
        {
            s.clone()
        }
        v => serde_json::to_string(v)?,
    })
}

/// A config entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Val {
    /// No value: any value, counted per value.
    Any,
    /// `value: "foo*"` (`""` for a bare `*`).
    Prefix(String),
    /// An exact value.
    Exact(String),
}

impl Val {
    /// Envoy's lookup order at one level: exact, then wildcard, then the bare key.
    fn rank(&self) -> u8 {
        match self {
            Val::Exact(_) => 2,
            Val::Prefix(_) => 1,
            Val::Any => 0,
        }
    }

    fn shown(&self, key: &str) -> String {
        match self {
            Val::Any => key.to_string(),
            Val::Prefix(p) => format!("{key}={p}*"),
            Val::Exact(v) => format!("{key}={v}"),
        }
    }
}

#[derive(Debug, Clone)]
struct Limit {
    window: Option<&'static str>,
    requests_per_unit: u64,
    unlimited: bool,
    name: Option<String>,
    replaces: Vec<String>,
}

#[derive(Debug, Clone)]
struct Node {
    key: String,
    value: Val,
    limit: Option<Limit>,
    shadow: bool,
    detailed_metric: bool,
    children: Vec<Node>,
    at: String,
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

fn fields<'a>(v: &'a Value, at: &str, allowed: &[&str]) -> anyhow::Result<&'a Map<String, Value>> {
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

fn string(m: &Map<String, Value>, field: &str, at: &str) -> anyhow::Result<Option<String>> {
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

fn nodes(v: Option<&Value>, at: &str) -> anyhow::Result<Vec<Node>> {
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

/// A config node with a limit, with the path that leads to it.
struct Cand<'a> {
    path: Vec<&'a Node>,
    /// Child indices from the domain root: identifies the node's subtree.
    pos: Vec<usize>,
    id: String,
    /// Keys as sluiced names them (a repeated key becomes `key.2`, …).
    keys: Vec<String>,
    skip: bool,
}

impl Cand<'_> {
    fn node(&self) -> &Node {
        self.path[self.path.len() - 1]
    }
    fn keys_path(&self) -> String {
        self.path
            .iter()
            .map(|n| n.key.as_str())
            .collect::<Vec<_>>()
            .join("/")
    }
    fn ranks(&self) -> Vec<u8> {
        self.path.iter().map(|n| n.value.rank()).collect()
    }
    fn specificity(&self) -> usize {
        self.path
            .iter()
            .filter(|n| matches!(n.value, Val::Exact(_)))
            .count()
    }
    fn shown(&self) -> String {
        self.path
            .iter()
            .map(|n| n.value.shown(&n.key))
            .collect::<Vec<_>>()
            .join(" > ")
    }
}

fn flatten<'a>(
    nodes: &'a [Node],
    path: &mut Vec<&'a Node>,
    pos: &mut Vec<usize>,
    out: &mut Vec<Cand<'a>>,
) {
    for (i, n) in nodes.iter().enumerate() {
        path.push(n);
        pos.push(i);
        if n.limit.is_some() {
            out.push(Cand {
                path: path.clone(),
                pos: pos.clone(),
                id: String::new(),
                keys: renamed(path.iter().map(|n| n.key.as_str())),
                skip: false,
            });
        }
        flatten(&n.children, path, pos, out);
        path.pop();
        pos.pop();
    }
}

/// A repeated key becomes `key.2`, `key.3`, … as sluiced names it.
fn renamed<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for k in keys {
        let n = seen.iter().filter(|s| **s == k).count();
        seen.push(k);
        out.push(if n == 0 {
            k.to_string()
        } else {
            format!("{k}.{}", n + 1)
        });
    }
    out
}

fn valid_field(f: &str) -> bool {
    !f.is_empty()
        && f.len() <= 64
        && f.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

fn sanitize_id(raw: &str) -> String {
    let mut s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.len() > 64 {
        // FNV-1a keeps long ids distinct after truncation.
        let h = raw.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        s.truncate(55);
        s = format!("{s}-{:08x}", h as u32);
    }
    if s.is_empty() { "rule".into() } else { s }
}

fn unique(id: String, taken: &mut HashSet<String>) -> String {
    if taken.insert(id.clone()) {
        return id;
    }
    for n in 2.. {
        let mut base = id.clone();
        let suffix = format!("-{n}");
        base.truncate(64 - suffix.len());
        let c = format!("{base}{suffix}");
        if taken.insert(c.clone()) {
            return c;
        }
    }
    unreachable!("some suffix is free")
}

/// Relative keys paths of the limits in the subtree at `pos` (`""` for the node itself).
fn subtree_paths(cands: &[Cand<'_>], pos: &[usize]) -> BTreeSet<String> {
    cands
        .iter()
        .filter(|c| c.pos.starts_with(pos))
        .map(|c| rel_path(c, pos.len()))
        .collect()
}

/// Where Envoy's walk takes a more specific sibling and never comes back: a limit below a
/// catch-all entry that the sibling's subtree has no counterpart of applies in Sluice only.
fn walk_notes(nodes: &[Node], parent: &[usize], cands: &[Cand<'_>], notes: &mut Vec<String>) {
    let at = |i: usize| parent.iter().copied().chain([i]).collect::<Vec<usize>>();
    for (i, c) in nodes.iter().enumerate() {
        let cpos = at(i);
        if matches!(&c.value, Val::Any) || c.value == Val::Prefix(String::new()) {
            let mine = subtree_paths(cands, &cpos);
            for (j, s) in nodes.iter().enumerate() {
                if j == i || s.key != c.key || s.value.rank() <= c.value.rank() {
                    continue;
                }
                let theirs = subtree_paths(cands, &at(j));
                for rel in mine.difference(&theirs) {
                    for cand in cands.iter().filter(|k| {
                        !k.skip && k.pos.starts_with(&cpos) && rel_path(k, cpos.len()) == *rel
                    }) {
                        notes.push(format!(
                            "{}: for {} Envoy follows the more specific entry ({}) and applies no limit at this depth; Sluice applies rule {} to those requests too",
                            cand.node().at,
                            s.value.shown(&s.key),
                            s.at,
                            cand.id
                        ));
                    }
                }
            }
        }
        walk_notes(&c.children, &cpos, cands, notes);
    }
}

fn rel_path(c: &Cand<'_>, from: usize) -> String {
    c.path[from..]
        .iter()
        .map(|n| n.key.as_str())
        .collect::<Vec<_>>()
        .join("/")
}

fn domain(doc: &Value, n: usize, notes: &mut Vec<String>) -> anyhow::Result<Value> {
    let at = format!("document {n}");
    let m = fields(doc, &at, &["domain", "descriptors"])?;
    let name = string(m, "domain", &at)?
        .filter(|d| !d.is_empty())
        .ok_or_else(|| anyhow!("{at}: config file cannot have an empty domain"))?;
    let tree = nodes(m.get("descriptors"), "descriptors")?;
    let mut cands = Vec::new();
    flatten(&tree, &mut Vec::new(), &mut Vec::new(), &mut cands);

    let mut taken = HashSet::new();
    let names: HashSet<&str> = cands
        .iter()
        .filter_map(|c| c.path[c.path.len() - 1].limit.as_ref()?.name.as_deref())
        .collect();
    for c in &mut cands {
        let node = c.path[c.path.len() - 1];
        let lim = node.limit.as_ref().ok_or_else(|| anyhow!("a limit"))?;
        if let Some(bad) = c.path.iter().find(|n| !valid_field(&n.key)) {
            c.skip = true;
            notes.push(format!(
                "{}: not carried over: key {:?} is not a Sluice descriptor name (A-Z a-z 0-9 _ . -, at most 64)",
                node.at, bad.key
            ));
            continue;
        }
        if let Some(p) = c.path.iter().find_map(|n| match &n.value {
            Val::Prefix(p) if !p.is_empty() => Some((n.key.clone(), p.clone())),
            _ => None,
        }) {
            c.skip = true;
            notes.push(format!(
                "{}: not carried over: prefix wildcard {}={}* (Sluice matches exact values or \"*\")",
                node.at, p.0, p.1
            ));
            continue;
        }
        if !lim.unlimited && lim.requests_per_unit == 0 {
            c.skip = true;
            notes.push(format!(
                "{}: not carried over: requests_per_unit 0 refuses every request in Envoy; Sluice limits are at least 1 (block it at the gateway, or set 1)",
                node.at
            ));
            continue;
        }
        // Only rules that are written take an id, so skipped ones free theirs.
        let derived = c
            .path
            .iter()
            .map(|n| match &n.value {
                Val::Exact(v) => format!("{}_{v}", n.key),
                _ => n.key.clone(),
            })
            .collect::<Vec<_>>()
            .join(".");
        c.id = match &lim.name {
            Some(nm) if valid_id(nm) => unique(nm.clone(), &mut taken),
            Some(nm) => {
                let id = unique(sanitize_id(nm), &mut taken);
                notes.push(format!(
                    "{}: name {nm:?} is not a valid rule id; the rule is {id}",
                    node.at
                ));
                id
            }
            None => unique(sanitize_id(&derived), &mut taken),
        };
        if !lim.replaces.is_empty() {
            notes.push(format!(
                "{}: replaces {:?} not carried over: in Sluice rule {} and the limits it replaced all apply",
                node.at, lim.replaces, c.id
            ));
        }
        if node.detailed_metric {
            notes.push(format!(
                "{}: detailed_metric not carried over: Sluice counts decisions per rule, not per value",
                node.at
            ));
        }
        for r in &lim.replaces {
            if !names.contains(r.as_str()) {
                notes.push(format!(
                    "{}: replaces {r:?}, which no limit in this domain is named",
                    node.at
                ));
            }
        }
    }
    walk_notes(&tree, &[], &cands, notes);

    // Group alternatives for the same keys; most specific first (Envoy's lookup order).
    let mut order: Vec<usize> = (0..cands.len()).filter(|i| !cands[*i].skip).collect();
    order.sort_by(|a, b| {
        let (ca, cb) = (&cands[*a], &cands[*b]);
        ca.keys_path()
            .cmp(&cb.keys_path())
            .then(cb.ranks().cmp(&ca.ranks()))
    });
    // Keep first-appearance order of the key paths, so the output follows the file.
    let mut paths: Vec<String> = Vec::new();
    for c in cands.iter().filter(|c| !c.skip) {
        let p = c.keys_path();
        if !paths.contains(&p) {
            paths.push(p);
        }
    }
    let mut rules = Vec::new();
    for p in &paths {
        let group: Vec<usize> = order
            .iter()
            .copied()
            .filter(|i| cands[*i].keys_path() == *p)
            .collect();
        // Sluice keeps the group's rule with the most exact values; Envoy the first in its
        // lookup order. They agree unless a later one has more exact values and can match
        // the same requests.
        for (x, a) in group.iter().enumerate() {
            for b in &group[x + 1..] {
                let (ca, cb) = (&cands[*a], &cands[*b]);
                let overlap =
                    ca.path
                        .iter()
                        .zip(&cb.path)
                        .all(|(na, nb)| match (&na.value, &nb.value) {
                            (Val::Exact(x), Val::Exact(y)) => x == y,
                            _ => true,
                        });
                if overlap && cb.specificity() > ca.specificity() {
                    notes.push(format!(
                        "{}: where both match, Envoy applies {} ({}) but Sluice the more specific {} ({})",
                        ca.node().at,
                        ca.id,
                        ca.shown(),
                        cb.id,
                        cb.shown()
                    ));
                }
            }
        }
        for i in &group {
            let c = &cands[*i];
            let node = c.node();
            let lim = node.limit.as_ref().ok_or_else(|| anyhow!("a limit"))?;
            let mut matchers = Map::new();
            matchers.insert(KEYS_DESCRIPTOR.into(), Value::String(p.clone()));
            for (n, k) in c.path.iter().zip(&c.keys) {
                let v = match &n.value {
                    Val::Exact(v) => v.clone(),
                    _ => "*".into(),
                };
                matchers.insert(k.clone(), Value::String(v));
            }
            let mut r = Map::new();
            r.insert("id".into(), json!(c.id));
            if group.len() > 1 {
                r.insert("group".into(), json!(format!("envoy:{p}")));
            }
            r.insert("match".into(), Value::Object(matchers));
            r.insert("key".into(), json!(c.keys));
            r.insert("algorithm".into(), json!("fixed_window"));
            if lim.unlimited {
                // Off still wins its group: the descriptor is exempt, as in Envoy.
                r.insert("limit".into(), json!(1_000_000_000u64));
                r.insert("window".into(), json!("1s"));
                r.insert("mode".into(), json!("off"));
            } else {
                r.insert("limit".into(), json!(lim.requests_per_unit));
                r.insert("window".into(), json!(lim.window.unwrap_or("1s")));
                if node.shadow {
                    r.insert("mode".into(), json!("shadow"));
                }
            }
            rules.push(Value::Object(r));
        }
    }
    Ok(json!({ "domain": name, "rules": rules }))
}

/// Converts the text of an envoyproxy/ratelimit config (one domain per YAML document).
pub fn convert(text: &str) -> anyhow::Result<Import> {
    let mut notes = Vec::new();
    let mut domains = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(doc).with_context(|| format!("document {}: not YAML", i + 1))?;
        if v.is_null() {
            continue;
        }
        domains.push(domain(&v, i + 1, &mut notes)?);
    }
    if domains.is_empty() {
        bail!("no ratelimit config in the file");
    }
    Ok(Import { domains, notes })
}

/// Reads FILE, prints the rules on stdout and the notes on stderr.
pub fn run(path: &std::path::Path) -> anyhow::Result<()> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    let import = convert(&text)?;
    let yaml = import.to_yaml(&path.display().to_string())?;
    // What we print must be a rule set sluiced accepts.
    sluice_core::rules::parse_yaml(&yaml)
        .map_err(|e| anyhow!("the converted rules do not validate (a bug in import-envoy): {e}"))?;
    print!("{yaml}");
    std::io::Write::flush(&mut std::io::stdout()).context("writing the rules")?;
    let rules: usize = import
        .domains
        .iter()
        .map(|d| d["rules"].as_array().map_or(0, Vec::len))
        .sum();
    if import.notes.is_empty() {
        eprintln!("import-envoy: {rules} rules; everything was carried over");
    } else {
        eprintln!(
            "import-envoy: {rules} rules; {} thing(s) not carried over as they were:",
            import.notes.len()
        );
        for n in &import.notes {
            eprintln!("  - {n}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::algo::{Params, Window};
    use sluice_core::matching::{Descriptors, applicable};
    use sluice_core::rules::{Mode, RuleSet, parse_yaml};
    use sluice_core::time::SECOND;

    /// The reference service's README examples, plus the features it documents since.
    const CONFIG: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  # Block this one outright.
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
---
domain: messaging
descriptors:
  # Only 5 marketing messages a day per number...
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # ...and 100 of any kind.
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
---
domain: api
descriptors:
  - key: generic_key
    value: tenant
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 60, name: per_user }
      - key: user
        value: admin
        rate_limit: { unlimited: true }
      - key: user
        value: bot
        shadow_mode: true
        rate_limit: { unit: hour, requests_per_unit: 100, name: bots, replaces: [{ name: per_user }] }
  - key: path
    value: "/v1/search*"
    rate_limit: { unit: second, requests_per_unit: 5 }
  - key: path
    value: "*"
    detailed_metric: true
    rate_limit: { unit: month, requests_per_unit: 1000000 }
  - key: "x-api-key"
    rate_limit: { unit: year, requests_per_unit: 12 }
  - key: "header:x/b"
    rate_limit: { unit: week, requests_per_unit: 7 }
"#;

    fn sets() -> (Import, RuleSet) {
        let import = convert(CONFIG).expect("converts");
        let yaml = import.to_yaml("config.yaml").expect("yaml");
        let set = parse_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        (import, set)
    }

    /// What sluiced checks for one Envoy descriptor (entries plus envoy.keys).
    fn applied(
        set: &RuleSet,
        domain: &str,
        entries: &[(&str, &str)],
    ) -> Vec<(String, Params, Mode)> {
        let mut pairs: Vec<(String, String)> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let path = entries
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
            .join("/");
        pairs.push((KEYS_DESCRIPTOR.into(), path));
        let d = Descriptors::new(pairs).expect("descriptors");
        let dom = set.domain(domain).expect("domain");
        applicable(dom, &d)
            .into_iter()
            .map(|a| (a.rule.id.to_string(), a.params.into_owned(), a.rule.mode))
            .collect()
    }

    fn fixed(limit: u64, secs: u64) -> Params {
        Params::FixedWindow {
            limit,
            window: Window::Epoch(secs * SECOND),
        }
    }

    #[test]
    fn the_same_limit_applies_as_in_envoy() {
        let (_, set) = sets();
        let per_ip = applied(&set, "edge_proxy_per_ip", &[("remote_address", "10.0.0.1")]);
        assert_eq!(
            per_ip,
            vec![("remote_address".into(), fixed(10, 1), Mode::Enforce)]
        );

        // Marketing: the nested 5 a day; a plain number: 100 a day; depth and order matter.
        let mkt = applied(
            &set,
            "messaging",
            &[("message_type", "marketing"), ("to_number", "+1555")],
        );
        assert_eq!(
            mkt,
            vec![(
                "message_type_marketing.to_number".into(),
                fixed(5, 86_400),
                Mode::Enforce
            )]
        );
        let any = applied(&set, "messaging", &[("to_number", "+1555")]);
        assert_eq!(
            any,
            vec![("to_number".into(), fixed(100, 86_400), Mode::Enforce)]
        );
        assert!(
            applied(
                &set,
                "messaging",
                &[("message_type", "other"), ("to_number", "+1")]
            )
            .is_empty()
        );
        assert!(
            applied(
                &set,
                "messaging",
                &[("to_number", "+1"), ("message_type", "marketing")]
            )
            .is_empty()
        );

        // A named limit; an unlimited exact value exempts from it; shadow mode carried.
        let user = applied(&set, "api", &[("generic_key", "tenant"), ("user", "u1")]);
        assert_eq!(
            user,
            vec![("per_user".into(), fixed(60, 60), Mode::Enforce)]
        );
        assert!(applied(&set, "api", &[("generic_key", "tenant"), ("user", "admin")]).is_empty());
        let bot = applied(&set, "api", &[("generic_key", "tenant"), ("user", "bot")]);
        assert_eq!(bot, vec![("bots".into(), fixed(100, 3_600), Mode::Shadow)]);

        // `*` is any value; month and year are 30 and 365 days; week a week.
        let p = applied(&set, "api", &[("path", "/anything")]);
        assert_eq!(
            p,
            vec![("path".into(), fixed(1_000_000, 30 * 86_400), Mode::Enforce)]
        );
        let y = applied(&set, "api", &[("x-api-key", "k")]);
        assert_eq!(
            y,
            vec![("x-api-key".into(), fixed(12, 365 * 86_400), Mode::Enforce)]
        );
    }

    #[test]
    fn what_cannot_be_carried_over_is_said() {
        let (import, set) = sets();
        let notes = import.notes.join("\n");
        for needle in [
            "requests_per_unit 0",
            "prefix wildcard path=/v1/search*",
            "replaces [\"per_user\"]",
            "detailed_metric",
            "key \"header:x/b\" is not a Sluice descriptor name",
        ] {
            assert!(notes.contains(needle), "missing {needle:?} in:\n{notes}");
        }
        assert_eq!(import.notes.len(), 5, "{notes}");
        // The skipped entries are absent, not approximated.
        let api = set.domain("api").expect("api");
        assert!(
            api.rules
                .iter()
                .all(|r| !r.id.contains("search") && !r.id.contains("header"))
        );
        assert_eq!(
            set.domain("edge_proxy_per_ip").expect("edge").rules.len(),
            1
        );
    }

    #[test]
    fn alternatives_share_a_group_most_specific_first() {
        let (import, _) = sets();
        let api = &import.domains[2]["rules"];
        let users: Vec<(&str, &str)> = api
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["match"]["envoy.keys"] == "generic_key/user")
            .map(|r| {
                (
                    r["id"].as_str().unwrap_or(""),
                    r["group"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            users,
            vec![
                ("generic_key_tenant.user_admin", "envoy:generic_key/user"),
                ("bots", "envoy:generic_key/user"),
                ("per_user", "envoy:generic_key/user"),
            ]
        );
    }

    #[test]
    fn envoy_walk_differences_are_noted() {
        // Envoy takes a=x and never returns to the bare `a`, so a > b has no limit for a=x.
        let text = r#"
domain: d
descriptors:
  - key: a
    value: x
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: a
    descriptors:
      - key: b
        rate_limit: { unit: second, requests_per_unit: 2 }
  - key: c
    descriptors:
      - key: e
        value: "1"
        descriptors:
          - key: f
            value: "2"
            rate_limit: { unit: second, requests_per_unit: 3 }
  - key: c
    value: "9"
    descriptors:
      - key: e
        descriptors:
          - key: f
            rate_limit: { unit: second, requests_per_unit: 4 }
"#;
        let import = convert(text).expect("converts");
        let notes = import.notes.join("\n");
        assert!(
            notes.contains("for a=x Envoy follows the more specific entry"),
            "{notes}"
        );
        // c > e=1 > f=2 has more exact values than c=9 > e > f, but for c=9, e=1, f=2 Envoy
        // takes c=9 at the first level.
        assert!(notes.contains("Envoy applies c_9.e.f"), "{notes}");
        assert_eq!(import.notes.len(), 2, "{notes}");
    }

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

    #[test]
    fn long_and_clashing_ids_stay_valid_and_unique() {
        let long = "k".repeat(80);
        let text = format!(
            "domain: d\ndescriptors:\n  - key: {long}x\n    rate_limit: {{ unit: second, requests_per_unit: 1, name: same }}\n  - key: b\n    rate_limit: {{ unit: second, requests_per_unit: 1, name: same }}\n  - key: c\n    rate_limit: {{ unit: second, requests_per_unit: 1, name: \"bad name\" }}\n"
        );
        let import = convert(&text).expect("converts");
        let ids: Vec<&str> = import.domains[0]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["id"].as_str())
            .collect();
        assert_eq!(
            ids,
            vec!["same", "bad_name"],
            "the 81-byte key is no descriptor name, so its rule and name are gone"
        );
        assert!(
            import
                .notes
                .iter()
                .any(|n| n.contains("\"bad name\" is not a valid rule id"))
        );
        // A derived id over 64 characters is cut and made distinct with a hash.
        let (key, a, b) = ("k".repeat(60), "a".repeat(12), "b".repeat(12));
        let text = format!(
            "domain: d\ndescriptors:\n  - key: {key}\n    value: {a}\n    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n  - key: {key}\n    value: {b}\n    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n"
        );
        let import = convert(&text).expect("converts");
        let ids: Vec<&str> = import.domains[0]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["id"].as_str())
            .collect();
        assert!(
            ids.iter().all(|i| i.len() == 64) && ids[0] != ids[1],
            "{ids:?}"
        );
        let yaml = import.to_yaml("t").expect("yaml");
        parse_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
        let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, name: same }\n  - key: b\n    rate_limit: { unit: second, requests_per_unit: 1, name: same }\n";
        let import = convert(text).expect("converts");
        let ids: Vec<&str> = import.domains[0]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["id"].as_str())
            .collect();
        assert_eq!(ids, vec!["same", "same-2"]);
        assert_eq!(sanitize_id(&"x".repeat(100)).len(), 64);
        assert_eq!(
            renamed(["a", "b", "a", "a"].into_iter()),
            vec!["a", "b", "a.2", "a.3"]
        );
    }
}
