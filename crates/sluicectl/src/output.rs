//! Rendering for people: aligned tables, rule-format YAML in a readable key order, and the
//! diff `apply` shows before it applies. Scripts use `-o json` and never see any of this.

use serde_json::Value;

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut push = |cells: Vec<&str>| {
        let n = cells.len();
        for (i, c) in cells.into_iter().enumerate() {
            out.push_str(c);
            if i + 1 < n {
                let pad = widths[i].saturating_sub(c.chars().count()) + 2;
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
    };
    push(headers.to_vec());
    for r in rows {
        push(r.iter().map(String::as_str).collect());
    }
    out
}

/// The order people expect a rule's fields in (the rest follow alphabetically).
const RULE_ORDER: &[&str] = &[
    "domain",
    "id",
    "group",
    "match",
    "key",
    "algorithm",
    "rate_per_s",
    "rate",
    "burst",
    "limit",
    "window",
    "calendar_tz",
    "window_start",
    "timeout",
    "mode",
    "on_store_failure",
    "scope",
    "store",
    "rollout_pct",
    "enforce_on",
    "headers",
    "charge_rejected",
    "share_threshold",
    "rules",
    "identity",
    "rule",
    "exempt",
    "overrides",
];

/// A JSON value as a YAML value with rule fields in [`RULE_ORDER`].
fn ordered(v: &Value) -> serde_norway::Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by_key(|k| {
                (
                    RULE_ORDER
                        .iter()
                        .position(|o| o == k)
                        .unwrap_or(RULE_ORDER.len()),
                    (*k).clone(),
                )
            });
            let mut out = serde_norway::Mapping::new();
            for k in keys {
                out.insert(serde_norway::Value::String(k.clone()), ordered(&m[k]));
            }
            serde_norway::Value::Mapping(out)
        }
        Value::Array(a) => serde_norway::Value::Sequence(a.iter().map(ordered).collect()),
        other => serde_norway::to_value(other).unwrap_or(serde_norway::Value::Null),
    }
}

/// A value as YAML, rule fields in the usual order.
pub fn yaml(v: &Value) -> String {
    serde_norway::to_string(&ordered(v)).unwrap_or_else(|_| format!("{v:#}\n"))
}

/// Domains as a multi-document rules file that `apply -f` takes back.
pub fn yaml_docs(docs: &[Value]) -> String {
    docs.iter().map(yaml).collect::<Vec<_>>().join("---\n")
}

/// One value on one line: strings bare, the rest as compact JSON.
pub fn short(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A rule's numbers in a few characters: `20/s burst 40`, `10/1m burst 10`, `100/1m`,
/// `5 concurrent`.
pub fn numbers(rule: &Value) -> String {
    let g = |k: &str| rule.get(k).map(short);
    if let (Some(r), Some(b)) = (g("rate"), g("burst")) {
        return format!("{r} burst {b}");
    }
    match (g("rate_per_s"), g("burst"), g("limit"), g("window")) {
        (Some(r), Some(b), _, _) => format!("{r}/s burst {b}"),
        (_, _, Some(l), Some(w)) => format!("{l}/{w}"),
        (_, _, Some(l), None) => format!("{l} concurrent"),
        _ => "-".into(),
    }
}

/// A rule's `match` as `route=POST /v1/login tier=*`, or `*` for every request.
pub fn matchers(rule: &Value) -> String {
    match rule.get("match").and_then(Value::as_object) {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}={}", short(v)))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "*".into(),
    }
}

/// The diff lines of one change from the server's `changes` list.
pub fn change(c: &Value) -> String {
    let op = c["op"].as_str().unwrap_or("?");
    let sign = match op {
        "add" => "+",
        "delete" => "-",
        _ => "~",
    };
    let mut out = format!(
        "{sign} {} {}/{}",
        c["kind"].as_str().unwrap_or("?"),
        c["domain"].as_str().unwrap_or("?"),
        c["key"].as_str().unwrap_or("?")
    );
    if c["moved"].as_bool() == Some(true) {
        out.push_str("  (moved)");
    }
    out.push('\n');
    let (before, after) = (&c["before"], &c["after"]);
    match op {
        "add" => {
            for l in yaml(after).lines() {
                out.push_str(&format!("    {l}\n"));
            }
        }
        "delete" => {}
        _ => {
            let (Some(b), Some(a)) = (before.as_object(), after.as_object()) else {
                return out;
            };
            let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                match (b.get(k), a.get(k)) {
                    (Some(x), Some(y)) if x != y => {
                        out.push_str(&format!("    {k}: {} → {}\n", short(x), short(y)));
                    }
                    (Some(x), None) => out.push_str(&format!("    - {k}: {}\n", short(x))),
                    (None, Some(y)) => out.push_str(&format!("    + {k}: {}\n", short(y))),
                    _ => {}
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align() {
        let t = table(
            &["ID", "LIMIT"],
            &[
                vec!["login".into(), "10/1m".into()],
                vec!["x".into(), "1".into()],
            ],
        );
        assert_eq!(t, "ID     LIMIT\nlogin  10/1m\nx      1\n");
    }

    #[test]
    fn yaml_puts_id_first() {
        let y = yaml(
            &json!({"window": "1m", "limit": 5, "id": "a", "key": ["ip"], "algorithm": "sliding_window"}),
        );
        assert!(y.starts_with("id: a\nkey:"), "{y}");
    }

    #[test]
    fn changes_render_field_by_field() {
        let c = json!({"op": "change", "kind": "rule", "domain": "api", "key": "login",
                        "before": {"id": "login", "limit": 100}, "after": {"id": "login", "limit": 10, "mode": "shadow"}});
        assert_eq!(
            change(&c),
            "~ rule api/login\n    limit: 100 → 10\n    + mode: shadow\n"
        );
        let d = json!({"op": "delete", "kind": "override", "domain": "api", "key": "*/ip=1"});
        assert_eq!(change(&d), "- override api/*/ip=1\n");
    }

    #[test]
    fn numbers_summarise() {
        assert_eq!(
            numbers(&json!({"rate": "10/1m", "burst": 10})),
            "10/1m burst 10"
        );
        assert_eq!(
            numbers(&json!({"rate_per_s": 20, "burst": 40})),
            "20/s burst 40"
        );
        assert_eq!(numbers(&json!({"limit": 100, "window": "1m"})), "100/1m");
        assert_eq!(numbers(&json!({"limit": 3})), "3 concurrent");
    }
}
