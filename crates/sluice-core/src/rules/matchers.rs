//! What a rule selects requests by (`match`) and counts them under (`key`), beyond plain
//! descriptor names and values: a value's prefix, a descriptor's absence, and an address
//! descriptor counted by its network (`ip/64`).

use super::Fields;
use serde_json::Value;

/// One `match` entry's condition on a descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Match {
    /// `"*"`: the descriptor is present, with any value.
    Any,
    /// A value: the descriptor equals it.
    Equals(String),
    /// `{prefix: P}`: the descriptor is present and its value begins with `P`.
    Prefix(String),
    /// `{absent: true}`: the request does not carry the descriptor (anonymous traffic).
    Absent,
}

impl Match {
    /// Whether the condition holds for the descriptor's value (`None`: not carried): the
    /// definition [`crate::matching`]'s index is held to.
    pub fn holds(&self, value: Option<&str>) -> bool {
        match (self, value) {
            (Match::Absent, v) => v.is_none(),
            (_, None) => false,
            (Match::Any, Some(_)) => true,
            (Match::Equals(w), Some(v)) => v == w,
            (Match::Prefix(p), Some(v)) => v.starts_with(p.as_str()),
        }
    }
}

/// The longest `prefix` of a match, in bytes: a descriptor value is at most
/// [`crate::matching::MAX_VALUE_LEN`], so a longer prefix could never match.
const MAX_PREFIX: usize = crate::matching::MAX_VALUE_LEN;

/// The condition a `match` entry `k: v` writes, or `None` after recording why it is none.
pub(super) fn match_value(f: &mut Fields<'_>, k: &str, v: &Value) -> Option<Match> {
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    if let Some(s) = text(v) {
        return Some(if s == "*" {
            Match::Any
        } else {
            Match::Equals(s)
        });
    }
    let Value::Object(m) = v else {
        f.bad(
            "match",
            format!(
                "value of {k:?} must be a string, {{prefix: ...}} or {{absent: true}}, got {v}"
            ),
        );
        return None;
    };
    let entries: Vec<(&String, &Value)> = m.iter().collect();
    match entries.as_slice() {
        [(name, Value::String(p))] if name.as_str() == "prefix" => {
            if p.is_empty() {
                f.bad(
                    "match",
                    format!("prefix of {k:?} is empty: write \"*\" for any value"),
                );
                None
            } else if p.len() > MAX_PREFIX {
                f.bad(
                    "match",
                    format!(
                        "prefix of {k:?} is longer than a descriptor value ({MAX_PREFIX} bytes)"
                    ),
                );
                None
            } else {
                Some(Match::Prefix(p.clone()))
            }
        }
        [(name, Value::Bool(true))] if name.as_str() == "absent" => Some(Match::Absent),
        [(name, Value::Bool(false))] if name.as_str() == "absent" => {
            f.bad(
                "match",
                format!("{k:?}: absent: false matches nothing more than leaving it out; write \"*\" for present with any value"),
            );
            None
        }
        _ => {
            f.bad(
                "match",
                format!("value of {k:?} must be a string, {{prefix: \"...\"}} or {{absent: true}}, got {v}"),
            );
            None
        }
    }
}

/// A key field counted by its network rather than its address: `ip/24,64` keeps the first
/// 24 bits of an IPv4 address and the first 64 of an IPv6 one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpMask {
    /// Prefix length kept of an IPv4 address (1 to 32).
    pub v4: u8,
    /// Prefix length kept of an IPv6 address (1 to 128).
    pub v6: u8,
}

/// One field of a rule's `key`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyField {
    /// The descriptor counted.
    pub name: String,
    /// `Some` for `name/len`: the descriptor must be an IP address, counted by its network.
    pub mask: Option<IpMask>,
}

impl KeyField {
    /// A field counted by its value as given.
    pub fn whole(name: impl Into<String>) -> KeyField {
        KeyField {
            name: name.into(),
            mask: None,
        }
    }
}

/// A `key` entry: `name`, `name/N` (one length: 1 to 32 is IPv4's and keeps an IPv6
/// address whole, 33 to 128 is IPv6's and keeps an IPv4 address whole) or `name/N4,N6`.
pub(super) fn key_field(s: &str, valid_name: impl Fn(&str) -> bool) -> Result<KeyField, String> {
    let Some((name, lens)) = s.split_once('/') else {
        return if valid_name(s) {
            Ok(KeyField::whole(s))
        } else {
            Err(format!("{s:?} is not a descriptor name"))
        };
    };
    if !valid_name(name) {
        return Err(format!("{name:?} (in {s:?}) is not a descriptor name"));
    }
    let len = |t: &str, max: u8, family: &str| -> Result<u8, String> {
        match t.parse::<u8>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(format!(
                "{s:?}: the {family} prefix length must be 1 to {max}, got {t:?} (write {name}/24, {name}/64 or {name}/24,64)"
            )),
        }
    };
    let mask = match lens.split_once(',') {
        Some((v4, v6)) => IpMask {
            v4: len(v4, 32, "IPv4")?,
            v6: len(v6, 128, "IPv6")?,
        },
        None => {
            let n = len(lens, 128, "")?;
            if n <= 32 {
                IpMask { v4: n, v6: 128 }
            } else {
                IpMask { v4: 32, v6: n }
            }
        }
    };
    Ok(KeyField {
        name: name.to_string(),
        mask: Some(mask),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::parse_yaml;

    fn rule_with(fields: &str) -> Result<crate::rules::Rule, String> {
        parse_yaml(&format!(
            "domain: d\nrules:\n  - {{ id: r, {fields}, algorithm: fixed_window, limit: 5, window: 1m }}\n"
        ))
        .map(|s| s.domain("d").expect("domain").rules[0].clone())
        .map_err(|e| e.to_string())
    }

    #[test]
    fn match_values_read_as_their_conditions() {
        let r = rule_with(
            r#"match: { api_key: { absent: true }, route: { prefix: "GET /v1/admin/" }, tier: "*", plan: gold }, key: [ip]"#,
        )
        .expect("valid");
        let m: Vec<(&str, &Match)> = r.matchers.iter().map(|(k, m)| (k.as_str(), m)).collect();
        assert!(m.contains(&("api_key", &Match::Absent)));
        assert!(m.contains(&("route", &Match::Prefix("GET /v1/admin/".into()))));
        assert!(m.contains(&("tier", &Match::Any)));
        assert!(m.contains(&("plan", &Match::Equals("gold".into()))));
        assert_eq!(
            r.specificity(),
            3,
            "prefix, absent and a value narrow; * does not"
        );
    }

    #[test]
    fn bad_match_values_are_named() {
        for (bad, why) in [
            (r#"{ prefix: "" }"#, "is empty"),
            ("{ absent: false }", "absent: false"),
            ("{ absent: yes, prefix: a }", "must be a string"),
            ("{ suffix: a }", "must be a string"),
            ("{ prefix: 5 }", "must be a string"),
            ("[a]", "must be a string"),
        ] {
            let err = rule_with(&format!("match: {{ route: {bad} }}, key: [ip]")).expect_err(bad);
            assert!(
                err.contains("r: match: ") && err.contains(why),
                "{bad}: {err}"
            );
        }
        let long = format!(
            "match: {{ route: {{ prefix: \"{}\" }} }}, key: [ip]",
            "x".repeat(257)
        );
        assert!(rule_with(&long).expect_err("long").contains("longer than"));
    }

    #[test]
    fn conditions_hold_as_defined() {
        assert!(Match::Absent.holds(None) && !Match::Absent.holds(Some("")));
        assert!(Match::Any.holds(Some("")) && !Match::Any.holds(None));
        assert!(Match::Prefix("/a/".into()).holds(Some("/a/b")));
        assert!(Match::Prefix("/a/".into()).holds(Some("/a/")));
        assert!(!Match::Prefix("/a/".into()).holds(Some("/a")));
        assert!(!Match::Prefix("/a/".into()).holds(None));
        assert!(Match::Equals("x".into()).holds(Some("x")));
        assert!(!Match::Equals("x".into()).holds(Some("xy")));
    }

    #[test]
    fn key_fields_take_prefix_lengths() {
        let valid = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric());
        let mask = |s: &str| key_field(s, valid).map(|k| k.mask);
        assert_eq!(key_field("ip", valid), Ok(KeyField::whole("ip")));
        assert_eq!(mask("ip/64"), Ok(Some(IpMask { v4: 32, v6: 64 })));
        assert_eq!(mask("ip/24"), Ok(Some(IpMask { v4: 24, v6: 128 })));
        assert_eq!(mask("ip/32"), Ok(Some(IpMask { v4: 32, v6: 128 })));
        assert_eq!(mask("ip/33"), Ok(Some(IpMask { v4: 32, v6: 33 })));
        assert_eq!(mask("ip/24,64"), Ok(Some(IpMask { v4: 24, v6: 64 })));
        assert_eq!(mask("ip/32,128"), Ok(Some(IpMask { v4: 32, v6: 128 })));
        for bad in [
            "ip/", "ip/0", "ip/129", "ip/33,64", "ip/24,0", "ip/24,", "ip/x", "/24", "i p/24",
            "ip/24/64", "ip/-1",
        ] {
            assert!(key_field(bad, valid).is_err(), "{bad}");
        }
        let r = rule_with("key: [api_key, \"ip/24,64\"]").expect("valid");
        assert_eq!(r.key[1].name, "ip");
        assert_eq!(r.key[1].mask, Some(IpMask { v4: 24, v6: 64 }));
        // Unquoted in a flow list the comma splits the entry: refused, not read as a
        // descriptor named 64.
        let err = rule_with("key: [api_key, ip/24,64]").expect_err("split");
        assert!(err.contains("quote"), "{err}");
        let err = rule_with("key: [ip/0]").expect_err("zero");
        assert!(err.contains("r: key: ") && err.contains("1 to"), "{err}");
    }
}
