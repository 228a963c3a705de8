//! Canary by daemon: a rule's `enforce_on` says on which daemons it enforces; on the others
//! it runs exactly as `mode: shadow` does (counted, would-refusals recorded, never refused).
//!
//! Why: a changed rule that is wrong (a limit ten times too tight, a key that lumps every
//! caller together) refuses real traffic on every daemon the moment it is published. Enforced
//! on a share of the daemons first, its blast radius is that share, and the would-refusals of
//! the shadowed daemons tell the operator what enforcing everywhere will do before it does.
//!
//! Which daemons enforce is a pure function of the rule id, the daemon id and the share
//! ([`enforces`]): every daemon computes its own answer from the same published set, with no
//! coordination, and raising the share only adds daemons (a daemon's bucket does not depend
//! on the share). The daemon passes its own id in ([`RuleSet::for_daemon`]); nothing here
//! reads the environment.

use crate::hash::stable_hash;
use crate::rules::{Domain, Mode, RuleSet};
use std::sync::Arc;

/// A rule's `enforce_on`: the daemons that enforce it (the others shadow it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnforceOn {
    /// `{daemons: N%}`: the daemons whose bucket for the rule ([`daemon_bucket`]) is below N.
    /// Raised step by step from a small share to 100.
    Percent(u8),
    /// `{daemons: [eu-1, us-2]}`: exactly these daemon ids, for a canary an operator picks by
    /// hand (one region's daemons, the ones being watched).
    Daemons(Vec<Arc<str>>),
}

impl EnforceOn {
    /// Whether the daemon `daemon_id` enforces the rule `rule_id` under this setting.
    pub fn includes(&self, rule_id: &str, daemon_id: &str) -> bool {
        match self {
            EnforceOn::Percent(p) => enforces(rule_id, daemon_id, *p),
            EnforceOn::Daemons(ids) => ids.iter().any(|d| &**d == daemon_id),
        }
    }
}

/// The bucket (0..100) of a daemon for a rule: the project's stable hash
/// ([`crate::hash::stable_hash`]), so every daemon, release and restart agrees on it. Keyed
/// by the rule too, so the first daemons to enforce differ from rule to rule and one daemon
/// is not every rule's guinea pig.
pub fn daemon_bucket(rule_id: &str, daemon_id: &str) -> u8 {
    (stable_hash(&["enforce_on", rule_id, daemon_id]) % 100) as u8
}

/// Whether `daemon_id` enforces `rule_id` when the rule enforces on `pct` percent of the
/// daemons: its bucket is below `pct`. 0 enforces nowhere, 100 everywhere, and a daemon
/// enforcing at some share still enforces at every larger one (the bucket does not move).
pub fn enforces(rule_id: &str, daemon_id: &str, pct: u8) -> bool {
    daemon_bucket(rule_id, daemon_id) < pct
}

/// What one rule does on one daemon, for the daemon's status and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The rule's domain.
    pub domain: String,
    /// The rule.
    pub rule: Arc<str>,
    /// The mode it runs in here: `Shadow` for a rule shadowed by its `enforce_on`.
    pub mode: Mode,
    /// It has an `enforce_on` that leaves this daemon out (so it shadows here while it may
    /// enforce elsewhere).
    pub canary_shadowed: bool,
}

impl RuleSet {
    /// The set as `daemon_id` runs it: every enforcing rule whose `enforce_on` leaves this
    /// daemon out becomes `mode: shadow`, so every path that honours shadow mode (decisions,
    /// metrics, the decision log) treats it alike. `source` keeps the rule as written, and a
    /// rule written as shadow or off stays so. A set without `enforce_on` comes back as is.
    pub fn for_daemon(self, daemon_id: &str) -> RuleSet {
        let RuleSet { version, domains } = self;
        let domains = domains
            .into_iter()
            .map(|(name, d)| {
                let shadowed = |r: &crate::rules::Rule| {
                    r.mode == Mode::Enforce
                        && r.enforce_on
                            .as_ref()
                            .is_some_and(|e| !e.includes(&r.id, daemon_id))
                };
                if !d.rules.iter().any(shadowed) {
                    return (name, d);
                }
                let rules = d
                    .rules
                    .iter()
                    .map(|r| {
                        let mut r = r.clone();
                        if shadowed(&r) {
                            r.mode = Mode::Shadow;
                            r.canary_shadowed = true;
                        }
                        r
                    })
                    .collect();
                let d = Domain::new(d.name.clone(), rules, d.overrides.clone());
                (name, Arc::new(d))
            })
            .collect();
        RuleSet { version, domains }
    }

    /// Per rule, the mode it runs in on this daemon (a set made by [`RuleSet::for_daemon`]).
    pub fn placements(&self) -> Vec<Placement> {
        self.domains
            .values()
            .flat_map(|d| {
                d.rules.iter().map(|r| Placement {
                    domain: d.name.clone(),
                    rule: r.id.clone(),
                    mode: r.mode,
                    canary_shadowed: r.canary_shadowed,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::parse_yaml;
    use proptest::prelude::*;

    fn set(enforce_on: &str, mode: &str) -> RuleSet {
        parse_yaml(&format!(
            "domain: d\nrules:\n  - {{ id: r, key: [k], algorithm: fixed_window, limit: 1, window: 1m, mode: {mode}, enforce_on: {enforce_on} }}\n  - {{ id: plain, key: [k], algorithm: fixed_window, limit: 1, window: 1m }}\n"
        ))
        .expect("valid")
    }

    fn mode(s: &RuleSet, rule: &str) -> Mode {
        s.domains["d"].rule(rule).expect("rule").mode
    }

    #[test]
    fn bucket_is_pinned() {
        // Pinned: changing the hash would move daemons in and out of running canaries.
        assert_eq!(daemon_bucket("r", "eu-1"), PINNED);
        assert_ne!(daemon_bucket("r", "eu-1"), daemon_bucket("r2", "eu-1"));
    }
    const PINNED: u8 = 56;

    #[test]
    fn a_list_enforces_on_those_daemons_and_shadows_elsewhere() {
        let s = set("{daemons: [eu-1, us-2]}", "enforce");
        for d in ["eu-1", "us-2"] {
            let here = s.clone_for(d);
            assert_eq!(mode(&here, "r"), Mode::Enforce, "{d}");
            assert!(here.placements().iter().all(|p| !p.canary_shadowed));
        }
        let there = s.clone_for("eu-2");
        assert_eq!(mode(&there, "r"), Mode::Shadow);
        assert_eq!(
            mode(&there, "plain"),
            Mode::Enforce,
            "no enforce_on: everywhere"
        );
        let p = there.placements();
        assert!(p.iter().any(|p| &*p.rule == "r" && p.canary_shadowed));
        assert!(p.iter().any(|p| &*p.rule == "plain" && !p.canary_shadowed));
        // The rule as written is kept for listing and diffs.
        assert_eq!(
            there.domains["d"].rule("r").expect("r").source["enforce_on"]["daemons"][0],
            "eu-1"
        );
    }

    #[test]
    fn shadow_and_off_stay_so_on_the_canary() {
        for m in [Mode::Shadow, Mode::Off] {
            let name = if m == Mode::Shadow { "shadow" } else { "off" };
            let s = set("{daemons: [eu-1]}", name).for_daemon("eu-1");
            assert_eq!(mode(&s, "r"), m);
            let s = set("{daemons: 100%}", name).for_daemon("eu-9");
            assert_eq!(mode(&s, "r"), m);
        }
    }

    #[test]
    fn zero_percent_shadows_everywhere_and_100_enforces_everywhere() {
        for i in 0..200 {
            let d = format!("d-{i}");
            assert_eq!(
                mode(&set("{daemons: 0%}", "enforce").for_daemon(&d), "r"),
                Mode::Shadow
            );
            assert_eq!(
                mode(&set("{daemons: 100%}", "enforce").for_daemon(&d), "r"),
                Mode::Enforce
            );
        }
    }

    #[test]
    fn a_share_picks_about_that_share_of_daemons() {
        let n = (0..10_000)
            .filter(|i| enforces("login", &format!("eu-{i}"), 10))
            .count();
        assert!((800..1200).contains(&n), "{n} of 10000 at 10%");
    }

    #[test]
    fn enforce_on_is_validated() {
        let doc = |e: &str| {
            format!(
                "domain: d\nrules:\n  - {{ id: r, key: [k], algorithm: fixed_window, limit: 1, window: 1m, enforce_on: {e} }}\n"
            )
        };
        let r = |e: &str| {
            parse_yaml(&doc(e)).expect(e).domains["d"].rules[0]
                .enforce_on
                .clone()
        };
        assert_eq!(r("{daemons: 10%}"), Some(EnforceOn::Percent(10)));
        assert_eq!(r("{daemons: \"0%\"}"), Some(EnforceOn::Percent(0)));
        assert_eq!(
            r("{daemons: [eu-1, us-2]}"),
            Some(EnforceOn::Daemons(vec![
                Arc::from("eu-1"),
                Arc::from("us-2")
            ]))
        );
        for (bad, why) in [
            ("{daemons: 101%}", "from 0% to 100%"),
            ("{daemons: 10}", "a share like 10%"),
            ("{daemons: ten%}", "a share like 10%"),
            ("{daemons: []}", "at least one daemon id"),
            ("{daemons: [eu-1, \"\"]}", "must not be empty"),
            ("{daemons: [eu-1, eu-1]}", "appears twice"),
            ("{daemons: [5]}", "not a daemon id"),
            ("{daemons: 10%, regions: [eu]}", "unknown key \"regions\""),
            ("{}", "daemons is required"),
            ("10%", "expected a mapping"),
        ] {
            let err = parse_yaml(&doc(bad)).expect_err(bad);
            assert!(
                err.problems
                    .iter()
                    .any(|p| p.at == "r" && p.field == "enforce_on" && p.message.contains(why)),
                "{bad}: {err}"
            );
        }
    }

    impl RuleSet {
        fn clone_for(&self, daemon: &str) -> RuleSet {
            RuleSet {
                version: self.version,
                domains: self.domains.clone(),
            }
            .for_daemon(daemon)
        }
    }

    proptest! {
        #[test]
        fn raising_the_share_only_adds_daemons(
            rule in "[a-z0-9-]{1,12}",
            daemon in "[a-z0-9.:-]{1,20}",
            a in 0u8..=100,
            b in 0u8..=100,
        ) {
            let (lo, hi) = (a.min(b), a.max(b));
            if enforces(&rule, &daemon, lo) {
                prop_assert!(enforces(&rule, &daemon, hi), "{daemon} left {rule} going {lo}% -> {hi}%");
            }
            prop_assert!(!enforces(&rule, &daemon, 0));
            prop_assert!(enforces(&rule, &daemon, 100));
        }

        #[test]
        fn a_list_enforces_exactly_on_its_ids(
            rule in "[a-z0-9-]{1,12}",
            ids in prop::collection::btree_set("[a-z]{1,3}-[0-9]", 1..5),
            daemon in "[a-z]{1,3}-[0-9]",
        ) {
            let e = EnforceOn::Daemons(ids.iter().map(|s| Arc::from(s.as_str())).collect());
            prop_assert_eq!(e.includes(&rule, &daemon), ids.contains(&daemon));
            for id in &ids {
                prop_assert!(e.includes(&rule, id));
            }
        }
    }
}
