//! Which numbers each algorithm takes, declared once: rule validation reads this table for
//! what is required and what is refused, override validation for which numbers may be
//! replaced, and a test holds docs/rules.md to it.

use crate::algo::Kind;

/// The fields that belong to some algorithms only, in the order their problems are reported.
/// A rule giving one its algorithm does not take is refused (`does not apply to ...`).
pub const ALGORITHM_FIELDS: &[&str] = &[
    "rate_per_s",
    "rate",
    "burst",
    "limit",
    "window",
    "calendar_tz",
    "window_start",
    "timeout",
    "max_delay",
    "fair_share",
];

/// One algorithm's fields: what a rule of it must give and what it may give; every other
/// field of [`ALGORITHM_FIELDS`] is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgorithmFields {
    /// The algorithm.
    pub kind: Kind,
    /// Fields of which a rule must give exactly one (a bucket's `rate_per_s` or `rate`).
    pub either: &'static [&'static str],
    /// Fields a rule must give (`is required for ...`).
    pub required: &'static [&'static str],
    /// Fields a rule may give: `calendar_tz` aligns a fixed window to a calendar,
    /// `window_start` to each key's first request, a concurrency slot's `timeout` defaults
    /// to one minute.
    pub allowed: &'static [&'static str],
}

impl AlgorithmFields {
    /// The algorithm of that rule-format name.
    pub fn by_name(name: &str) -> Option<&'static AlgorithmFields> {
        ALGORITHMS.iter().find(|a| a.name() == name)
    }

    /// The fields of an algorithm.
    pub fn of(kind: Kind) -> &'static AlgorithmFields {
        match ALGORITHMS.iter().find(|a| a.kind == kind) {
            Some(a) => a,
            // The table lists every Kind; a test holds it to that.
            None => unreachable!("{kind:?} is missing from ALGORITHMS"),
        }
    }

    /// The rule-format name.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Whether a rule of this algorithm takes the field (either, required or allowed).
    pub fn takes(&self, field: &str) -> bool {
        self.either.contains(&field)
            || self.required.contains(&field)
            || self.allowed.contains(&field)
    }

    /// Every field it takes, in the table's order (either, required, allowed).
    pub fn fields(&self) -> impl Iterator<Item = &'static str> {
        self.either
            .iter()
            .chain(self.required)
            .chain(self.allowed)
            .copied()
    }
}

/// A bucket's rate: `rate_per_s: N` (a whole number a second, the original form) or
/// `rate: N/<duration>` (`10/1m`, any period).
const BUCKET_RATE: &[&str] = &["rate_per_s", "rate"];

/// Every algorithm, in the order the rule format lists them.
pub const ALGORITHMS: &[AlgorithmFields] = &[
    AlgorithmFields {
        kind: Kind::TokenBucket,
        either: BUCKET_RATE,
        required: &["burst"],
        allowed: &["fair_share"],
    },
    AlgorithmFields {
        kind: Kind::Gcra,
        either: BUCKET_RATE,
        required: &["burst"],
        allowed: &[],
    },
    AlgorithmFields {
        kind: Kind::FixedWindow,
        either: &[],
        required: &["limit", "window"],
        allowed: &["calendar_tz", "window_start"],
    },
    AlgorithmFields {
        kind: Kind::SlidingWindow,
        either: &[],
        required: &["limit", "window"],
        allowed: &["window_start"],
    },
    AlgorithmFields {
        kind: Kind::SlidingLog,
        either: &[],
        required: &["limit", "window"],
        allowed: &[],
    },
    AlgorithmFields {
        kind: Kind::Concurrency,
        either: &[],
        required: &["limit"],
        allowed: &["timeout"],
    },
    AlgorithmFields {
        kind: Kind::LeakyQueue,
        either: BUCKET_RATE,
        required: &["max_delay"],
        allowed: &[],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Problem, parse_rule};
    use serde_json::{Map, Value, json};

    /// A value each algorithm field accepts, whatever the algorithm.
    fn sample(field: &str) -> Value {
        match field {
            "rate_per_s" | "burst" | "limit" => json!(5),
            "rate" => json!("5/1m"),
            "window" => json!("1h"),
            "calendar_tz" => json!("UTC"),
            // `epoch`, the default: it goes with every other field (first_request does not
            // go with calendar_tz).
            "window_start" => json!("epoch"),
            "fair_share" => json!(0.5),
            "timeout" | "max_delay" => json!("1s"),
            other => panic!("no sample for {other}"),
        }
    }

    fn rule_with(a: &AlgorithmFields, fields: &[&str]) -> Value {
        let mut m = Map::new();
        m.insert("id".into(), json!("r"));
        m.insert("key".into(), json!(["k"]));
        m.insert("algorithm".into(), json!(a.name()));
        for f in fields {
            m.insert((*f).into(), sample(f));
        }
        Value::Object(m)
    }

    fn problems(v: &Value) -> Vec<Problem> {
        parse_rule(v).err().map(|e| e.problems).unwrap_or_default()
    }

    fn has(problems: &[Problem], field: &str, message: &str) -> bool {
        problems
            .iter()
            .any(|p| p.at == "r" && p.field == field && p.message == message)
    }

    #[test]
    fn every_algorithm_is_in_the_table_once() {
        let all = [
            Kind::TokenBucket,
            Kind::Gcra,
            Kind::FixedWindow,
            Kind::SlidingWindow,
            Kind::SlidingLog,
            Kind::Concurrency,
            Kind::LeakyQueue,
        ];
        assert_eq!(ALGORITHMS.iter().map(|a| a.kind).collect::<Vec<_>>(), all);
        for kind in all {
            assert_eq!(AlgorithmFields::of(kind).kind, kind);
            let named = AlgorithmFields::by_name(kind.name());
            assert_eq!(named, Some(AlgorithmFields::of(kind)));
        }
        for a in ALGORITHMS {
            for f in a.fields() {
                assert!(ALGORITHM_FIELDS.contains(&f), "{}: {f}", a.name());
            }
        }
    }

    #[test]
    fn the_validator_follows_the_table() {
        for a in ALGORITHMS {
            // One of `either` (each in turn below), every required and allowed field.
            let mut all: Vec<&str> = a.either.iter().take(1).copied().collect();
            all.extend(a.required);
            all.extend(a.allowed);
            for one in a.either {
                let mut with: Vec<&str> = vec![one];
                with.extend(a.required);
                assert_eq!(
                    problems(&rule_with(a, &with)),
                    vec![],
                    "{}: {one}",
                    a.name()
                );
            }
            if let [first, second, ..] = a.either {
                let rest: Vec<&str> = a.required.to_vec();
                let got = problems(&rule_with(a, &rest));
                assert_eq!(got.len(), 1, "{}: neither: {got:?}", a.name());
                assert!(got[0].field == *second && got[0].message.starts_with("is required for"));
                let mut both = vec![*first, *second];
                both.extend(a.required);
                let got = problems(&rule_with(a, &both));
                let want = format!("give {second} or {first}, not both");
                assert!(has(&got, second, &want), "{}: both: {got:?}", a.name());
                assert_eq!(got.len(), 1, "{}: both: {got:?}", a.name());
            }
            let full = rule_with(a, &all);
            assert_eq!(
                problems(&full),
                vec![],
                "{}: every field it takes",
                a.name()
            );
            let minimal: Vec<&str> = a.either.iter().take(1).chain(a.required).copied().collect();
            assert_eq!(problems(&rule_with(a, &minimal)), vec![], "{}", a.name());
            for missing in a.required {
                let rest: Vec<&str> = all.iter().copied().filter(|f| f != missing).collect();
                let got = problems(&rule_with(a, &rest));
                let want = format!("is required for {}", a.name());
                assert!(
                    has(&got, missing, &want),
                    "{}: {missing}: {got:?}",
                    a.name()
                );
                assert_eq!(got.len(), 1, "{}: {missing}: {got:?}", a.name());
            }
            for refused in ALGORITHM_FIELDS.iter().filter(|f| !a.takes(f)) {
                let mut with = all.clone();
                with.push(refused);
                let got = problems(&rule_with(a, &with));
                let want = format!("does not apply to {}", a.name());
                assert!(
                    has(&got, refused, &want),
                    "{}: {refused}: {got:?}",
                    a.name()
                );
                assert_eq!(got.len(), 1, "{}: {refused}: {got:?}", a.name());
            }
            let mut with = rule_with(a, &all);
            with["period"] = json!("1m");
            let got = problems(&with);
            assert!(
                has(&got, "period", "unknown field"),
                "{}: {got:?}",
                a.name()
            );
        }
    }

    #[test]
    fn docs_list_the_fields_of_the_table() {
        let docs = include_str!("../../../../docs/rules.md");
        let rows: Vec<(&str, Vec<&str>)> = docs
            .split("## Algorithms and their numbers")
            .nth(1)
            .expect("docs/rules.md has the algorithms table")
            .lines()
            .skip_while(|l| !l.starts_with("| `"))
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').collect();
                let name = cells[1].trim().trim_matches('`');
                // Backticked words of the fields cell that are algorithm fields (not `1m`).
                let fields = cells[2]
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|f| ALGORITHM_FIELDS.contains(f))
                    .collect();
                (name, fields)
            })
            .collect();
        let want: Vec<(&str, Vec<&str>)> = ALGORITHMS
            .iter()
            .map(|a| (a.name(), a.fields().collect()))
            .collect();
        assert_eq!(rows, want);
    }
}
