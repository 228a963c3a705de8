//! One config domain turned into one rules document: each node with a `rate_limit` becomes a
//! rule (its match, key, window and mode), alternatives for the same keys share a group in
//! Envoy's lookup order, and what cannot be carried over is left out with a note.

use super::ids::{renamed, sanitize_id, unique, valid_field, valid_id};
use super::parse::{Limit, Node, Val};
use super::walk::walk_notes;
use super::{KEYS_DESCRIPTOR, Note};
use anyhow::anyhow;
use serde_json::{Map, Value, json};
use std::collections::HashSet;

/// A config node with a limit, with the path that leads to it.
pub(super) struct Cand<'a> {
    pub(super) path: Vec<&'a Node>,
    /// Child indices from the domain root: identifies the node's subtree.
    pub(super) pos: Vec<usize>,
    pub(super) id: String,
    /// Keys as sluiced names them (a repeated key becomes `key.2`, …).
    keys: Vec<String>,
    pub(super) skip: bool,
    /// Made for an entry Envoy's walk takes and finds no limit under: `mode: off` there.
    pub(super) exempt: bool,
}

impl Cand<'_> {
    pub(super) fn node(&self) -> &Node {
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
    /// An id made from the path: `message_type_marketing.to_number`.
    fn derived(&self) -> String {
        self.path
            .iter()
            .map(|n| match &n.value {
                Val::Exact(v) => format!("{}_{v}", n.key),
                _ => n.key.clone(),
            })
            .collect::<Vec<_>>()
            .join(".")
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
                exempt: false,
            });
        }
        flatten(&n.children, path, pos, out);
        path.pop();
        pos.pop();
    }
}

/// Notes for flags on entries without a `rate_limit`, which the service reads only with one
/// (`value_to_metric` names the metrics of the limits below, which Sluice does not carry).
fn flag_notes(nodes: &[Node], notes: &mut Vec<Note>) {
    for n in nodes {
        if n.limit.is_none() {
            for (on, key) in [
                (n.shadow, "shadow_mode"),
                (n.quota_mode, "quota_mode"),
                (n.detailed_metric, "detailed_metric"),
                (n.metadata, "metadata"),
            ] {
                if on {
                    notes.push(Note::new(
                        &n.file,
                        &n.at,
                        key,
                        "no effect without a rate_limit on the same entry, in the service too",
                    ));
                }
            }
            if n.value_to_metric {
                notes.push(Note::new(
                    &n.file,
                    &n.at,
                    "value_to_metric",
                    "not carried over: it names the service's metrics; Sluice counts decisions per rule",
                ));
            }
        }
        flag_notes(&n.children, notes);
    }
}

/// What is noted of one limit's node that is carried over.
fn carried_notes(c: &Cand<'_>, lim: &Limit, names: &HashSet<&str>, notes: &mut Vec<Note>) {
    let node = c.node();
    let mut note = |key: &str, text: String| notes.push(Note::new(&node.file, &node.at, key, text));
    if !lim.replaces.is_empty() {
        note(
            "replaces",
            format!(
                "{:?} not carried over: in Sluice rule {} and the limits it replaced all apply",
                lim.replaces, c.id
            ),
        );
        for r in &lim.replaces {
            if !names.contains(r.as_str()) {
                note(
                    "replaces",
                    format!(
                        "{r:?} names no limit of this domain (it replaces nothing in the service either)"
                    ),
                );
            }
        }
    }
    if node.quota_mode {
        note(
            "quota_mode",
            format!(
                "not carried over: rule {} enforces; the service refuses for an over-limit quota descriptor only when all of the request's quota descriptors are over (the same when it is the only one)",
                c.id
            ),
        );
    }
    if node.detailed_metric {
        note(
            "detailed_metric",
            "not carried over: Sluice counts decisions per rule, not per value".into(),
        );
    }
    if node.value_to_metric {
        note(
            "value_to_metric",
            "not carried over: it names the service's metrics; Sluice counts decisions per rule"
                .into(),
        );
    }
    if node.metadata {
        note(
            "metadata",
            "not carried over: Sluice sends no dynamic metadata (the service sends it with RESPONSE_DYNAMIC_METADATA on)".into(),
        );
    }
}

/// Why a limit cannot be carried over, as (config key, reason), if it cannot.
fn skip_reason(c: &Cand<'_>, lim: &Limit) -> Option<(&'static str, String)> {
    if let Some(bad) = c.path.iter().find(|n| n.key.contains('*')) {
        return Some((
            "key",
            format!(
                "not carried over: key {:?} has a '*', which the service globs over key_value; Sluice matches descriptor names exactly",
                bad.key
            ),
        ));
    }
    if let Some(bad) = c.path.iter().find(|n| !valid_field(&n.key)) {
        return Some((
            "key",
            format!(
                "not carried over: key {:?} is not a Sluice descriptor name (A-Z a-z 0-9 _ . -, at most 64)",
                bad.key
            ),
        ));
    }
    if let Some(n) = c
        .path
        .iter()
        .find(|n| matches!(n.value, Val::Wild(_)) && !n.value.is_star())
    {
        return Some((
            "value",
            format!(
                "not carried over: wildcard {} (Sluice matches exact values or \"*\"){}",
                n.value.shown(&n.key),
                if n.share_threshold {
                    ", nor its share_threshold"
                } else {
                    ""
                }
            ),
        ));
    }
    if !lim.unlimited && lim.requests_per_unit == 0 {
        return Some((
            "requests_per_unit",
            "not carried over: 0 refuses every request in Envoy; Sluice limits are at least 1 (block it at the gateway, or set 1)".into(),
        ));
    }
    None
}

/// One domain's tree, gathered over its files, as one rules document.
pub(super) fn domain(name: &str, tree: &[Node], notes: &mut Vec<Note>) -> anyhow::Result<Value> {
    let mut cands = Vec::new();
    flatten(tree, &mut Vec::new(), &mut Vec::new(), &mut cands);
    flag_notes(tree, notes);

    let mut taken = HashSet::new();
    let names: HashSet<&str> = cands
        .iter()
        .filter_map(|c| c.path[c.path.len() - 1].limit.as_ref()?.name.as_deref())
        .collect();
    for c in &mut cands {
        let node = c.path[c.path.len() - 1];
        let lim = node.limit.as_ref().ok_or_else(|| anyhow!("a limit"))?;
        if let Some((key, why)) = skip_reason(c, lim) {
            c.skip = true;
            notes.push(Note::new(&node.file, &node.at, key, why));
            continue;
        }
        // Only rules that are written take an id, so skipped ones free theirs.
        let derived = c.derived();
        c.id = match &lim.name {
            Some(nm) if valid_id(nm) => unique(nm.clone(), &mut taken),
            Some(nm) => {
                let id = unique(sanitize_id(nm), &mut taken);
                notes.push(Note::new(
                    &node.file,
                    &node.at,
                    "name",
                    format!("{nm:?} is not a valid rule id; the rule is {id}"),
                ));
                id
            }
            None => unique(sanitize_id(&derived), &mut taken),
        };
        carried_notes(c, lim, &names, notes);
    }
    // Where Envoy's walk takes an exact entry and finds no limit, an `off` rule there keeps
    // the less specific rule from applying, as in Envoy.
    let mut seen = HashSet::new();
    for (path, pos) in walk_notes(tree, &[], &cands, notes) {
        let mut c = Cand {
            keys: renamed(path.iter().map(|n| n.key.as_str())),
            path,
            pos,
            id: String::new(),
            skip: false,
            exempt: true,
        };
        if !seen.insert(c.shown()) {
            continue;
        }
        c.id = unique(sanitize_id(&format!("{}.off", c.derived())), &mut taken);
        cands.push(c);
    }

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
                    notes.push(Note::new(
                        &ca.node().file,
                        &ca.node().at,
                        "value",
                        format!(
                            "where both match, Envoy applies {} ({}) but Sluice the more specific {} ({})",
                            ca.id,
                            ca.shown(),
                            cb.id,
                            cb.shown()
                        ),
                    ));
                }
            }
        }
        for i in &group {
            let c = &cands[*i];
            let node = c.node();
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
            // A "*" entry with share_threshold: all its values share one count.
            let key: Vec<&String> = c
                .path
                .iter()
                .zip(&c.keys)
                .filter(|(n, _)| !(n.share_threshold && n.value.is_star()))
                .map(|(_, k)| k)
                .collect();
            r.insert("key".into(), json!(key));
            r.insert("algorithm".into(), json!("fixed_window"));
            let lim = node.limit.as_ref();
            if c.exempt || lim.is_some_and(|l| l.unlimited) {
                // Off still wins its group: the descriptor is exempt, as in Envoy.
                r.insert("limit".into(), json!(1_000_000_000u64));
                r.insert("window".into(), json!("1s"));
                r.insert("mode".into(), json!("off"));
            } else {
                let lim = lim.ok_or_else(|| anyhow!("a limit"))?;
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::import_envoy::{Import, convert};
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
        // One domain per file, as the service loads them.
        let files: Vec<(String, String)> = CONFIG
            .split("\n---\n")
            .enumerate()
            .map(|(i, t)| (format!("{i}.yaml"), t.to_string()))
            .collect();
        let import = convert(&files, false).expect("converts");
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
        let notes: Vec<String> = import.notes.iter().map(ToString::to_string).collect();
        let notes = notes.join("\n");
        for needle in [
            "0.yaml: descriptors[1] requests_per_unit: not carried over: 0",
            "2.yaml: descriptors[1] value: not carried over: wildcard path=/v1/search*",
            "descriptors[0].descriptors[2] replaces: [\"per_user\"]",
            "descriptors[2] detailed_metric: not carried over",
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
}
