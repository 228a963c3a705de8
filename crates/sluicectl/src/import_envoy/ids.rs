//! Names as Sluice accepts them: descriptor keys as sluiced numbers repeats, and rule ids
//! that are valid, at most 64 bytes, and unique within a domain.

use std::collections::HashSet;

/// A repeated key becomes `key.2`, `key.3`, … as sluiced names it.
pub(super) fn renamed<'a>(keys: impl Iterator<Item = &'a str>) -> Vec<String> {
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

pub(super) fn valid_field(f: &str) -> bool {
    !f.is_empty()
        && f.len() <= 64
        && f.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

pub(super) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

pub(super) fn sanitize_id(raw: &str) -> String {
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

pub(super) fn unique(id: String, taken: &mut HashSet<String>) -> String {
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::import_envoy::convert_one as convert;
    use sluice_core::rules::parse_yaml;

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
                .any(|n| n.text.contains("\"bad name\" is not a valid rule id"))
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
