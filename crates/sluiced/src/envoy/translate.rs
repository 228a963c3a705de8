//! Envoy's descriptors in Sluice's terms: an entry list becomes Sluice descriptors (a
//! repeated key numbered `key.2`, …) plus [`KEYS_DESCRIPTOR`], and a `limit` override's unit
//! becomes a window.

use super::KEYS_DESCRIPTOR;

/// An Envoy descriptor's entries as Sluice descriptors (renamed keys, in order) followed by
/// [`KEYS_DESCRIPTOR`], and how many of them are entries.
pub fn descriptors(
    entries: Vec<
        sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry,
    >,
) -> (Vec<(String, String)>, usize) {
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(entries.len() + 1);
    let mut path = String::new();
    for (i, e) in entries.into_iter().enumerate() {
        if i > 0 {
            path.push('/');
        }
        path.push_str(&e.key);
        let seen = pairs.iter().filter(|(k, _)| {
            *k == e.key || k.strip_prefix(e.key.as_str()).is_some_and(is_repeat_suffix)
        });
        let n = seen.count();
        let key = if n == 0 {
            e.key
        } else {
            format!("{}.{}", e.key, n + 1)
        };
        pairs.push((key, e.value));
    }
    let n = pairs.len();
    pairs.push((KEYS_DESCRIPTOR.to_string(), path));
    (pairs, n)
}

fn is_repeat_suffix(s: &str) -> bool {
    s.strip_prefix('.')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The window of a `limit` override's unit: its name and length in seconds. Month and year
/// are 30 and 365 days, as in envoyproxy/ratelimit.
pub fn override_unit(unit: i32) -> Option<(&'static str, u64)> {
    use sluice_proto::envoy::r#type::v3::RateLimitUnit as U;
    match U::try_from(unit).ok()? {
        U::Unknown => None,
        U::Second => Some(("second", 1)),
        U::Minute => Some(("minute", 60)),
        U::Hour => Some(("hour", 3_600)),
        U::Day => Some(("day", 86_400)),
        U::Week => Some(("week", 7 * 86_400)),
        U::Month => Some(("month", 30 * 86_400)),
        U::Year => Some(("year", 365 * 86_400)),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    #[test]
    fn repeated_keys_are_numbered_and_the_path_is_named() {
        let entries = [
            ("generic_key", "a"),
            ("generic_key", "b"),
            ("user", "u"),
            ("generic_key", "c"),
        ]
        .iter()
        .map(|(k, v)| Entry {
            key: k.to_string(),
            value: v.to_string(),
        })
        .collect();
        let (pairs, n) = descriptors(entries);
        let keys: Vec<&str> = pairs[..n].iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            vec!["generic_key", "generic_key.2", "user", "generic_key.3"]
        );
        assert_eq!(
            pairs.last().map(|(k, v)| (k.as_str(), v.as_str())),
            Some((KEYS_DESCRIPTOR, "generic_key/generic_key/user/generic_key"))
        );
    }
}
