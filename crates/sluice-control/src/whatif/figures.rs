//! The report's figures: per rule, how many checks each set counted and refused and whose,
//! and the checks whose fate the candidate changes. Rules are matched across the sets by
//! (domain, rule id): a new rule has no current figures, a removed one no candidate figures.

use super::{TOP, Verdict};
use serde::{Deserialize, Serialize};
use sluice_core::rules::{Mode, Rule, RuleSet};
use std::collections::{BTreeMap, HashMap};

/// One identity's share of a rule's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityCount {
    /// The identity the rule counted against (credentials hashed, as the log writes them).
    pub identity: String,
    /// Checks of it the rule saw.
    pub checks: u64,
    /// Of which refused (enforced) or would-refused (shadow).
    pub refused: u64,
}

/// What one set did with a rule over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// `enforce`, `shadow` or `off` in this set.
    pub mode: String,
    /// Checks the rule applied to.
    pub checks: u64,
    /// Checks it refused (or, in shadow, would have refused).
    pub refused: u64,
    /// Identities it refused at least once.
    pub identities: u64,
    /// The most refused of them (at most [`TOP`]), most refused first.
    pub refused_by: Vec<IdentityCount>,
}

/// One rule in the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleReport {
    /// Its domain.
    pub domain: String,
    /// Its id (what matches it across the sets).
    pub rule: String,
    /// `changed` (the rule or an override of it differs), `unchanged`, `new` (only in the
    /// candidate) or `removed`.
    pub change: String,
    /// The current set's figures; `None` for a new rule.
    pub current: Option<Figures>,
    /// The candidate's; `None` for a removed rule.
    pub candidate: Option<Figures>,
}

/// Checks whose fate the candidate changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    /// How many.
    pub checks: u64,
    /// Identities they belong to (the refusing rule's identity).
    pub identities: u64,
    /// The identities with the most (at most [`TOP`]); `refused` counts the checks.
    pub by_identity: Vec<IdentityCount>,
}

#[derive(Default)]
struct Counts {
    checks: u64,
    refused: u64,
    by_identity: HashMap<String, (u64, u64)>,
}

impl Counts {
    fn add(&mut self, identity: &str, refused: bool) {
        self.checks += 1;
        let e = self.by_identity.entry(identity.to_string()).or_default();
        e.0 += 1;
        if refused {
            self.refused += 1;
            e.1 += 1;
        }
    }

    fn top(self) -> (u64, Vec<IdentityCount>) {
        let mut v: Vec<IdentityCount> = self
            .by_identity
            .into_iter()
            .filter(|(_, (_, r))| *r > 0)
            .map(|(identity, (checks, refused))| IdentityCount {
                identity,
                checks,
                refused,
            })
            .collect();
        let n = v.len() as u64;
        v.sort_by(|a, b| {
            b.refused
                .cmp(&a.refused)
                .then_with(|| a.identity.cmp(&b.identity))
        });
        v.truncate(TOP);
        (n, v)
    }

    fn figures(self, mode: Mode) -> Figures {
        let (checks, refused) = (self.checks, self.refused);
        let (identities, refused_by) = self.top();
        Figures {
            mode: match mode {
                Mode::Enforce => "enforce",
                Mode::Shadow => "shadow",
                Mode::Off => "off",
            }
            .into(),
            checks,
            refused,
            identities,
            refused_by,
        }
    }
}

/// A rule of either set, the overrides that can apply to it in each, and what each set
/// counted for it.
struct Entry<'s> {
    current: Option<&'s Rule>,
    candidate: Option<&'s Rule>,
    overrides: [Vec<&'s serde_json::Value>; 2],
    counts: [Counts; 2],
}

/// Running totals over the replayed checks.
pub(super) struct Tally<'s> {
    rules: BTreeMap<(String, String), Entry<'s>>,
    newly_refused: Counts,
    newly_admitted: Counts,
}

impl<'s> Tally<'s> {
    /// Every rule of either set, by (domain, id).
    pub(super) fn new(current: &'s RuleSet, candidate: &'s RuleSet) -> Tally<'s> {
        let mut rules: BTreeMap<(String, String), Entry<'s>> = BTreeMap::new();
        for (side, set) in [current, candidate].into_iter().enumerate() {
            for (name, d) in &set.domains {
                for r in &d.rules {
                    let e = rules
                        .entry((name.clone(), r.id.to_string()))
                        .or_insert_with(|| Entry {
                            current: None,
                            candidate: None,
                            overrides: Default::default(),
                            counts: Default::default(),
                        });
                    e.overrides[side] = d
                        .overrides
                        .iter()
                        .filter(|o| o.rule.as_deref().is_none_or(|x| x == &*r.id))
                        .map(|o| &o.source)
                        .collect();
                    if side == 0 {
                        e.current = Some(r);
                    } else {
                        e.candidate = Some(r);
                    }
                }
            }
        }
        Tally {
            rules,
            newly_refused: Counts::default(),
            newly_admitted: Counts::default(),
        }
    }

    /// One check's verdicts under the current set and the candidate (`None`: no rule).
    pub(super) fn add(&mut self, domain: &str, before: Option<&Verdict>, after: Option<&Verdict>) {
        for (side, v) in [before, after].into_iter().enumerate() {
            for (id, identity, refused) in v.into_iter().flat_map(|v| &v.rules) {
                if let Some(e) = self.rules.get_mut(&(domain.to_string(), id.clone())) {
                    e.counts[side].add(identity, *refused);
                }
            }
        }
        let was = before.and_then(|v| v.refused_by.as_deref());
        let will = after.and_then(|v| v.refused_by.as_deref());
        match (was, will) {
            (None, Some(by)) => self.newly_refused.add(by, true),
            (Some(by), None) => self.newly_admitted.add(by, true),
            _ => {}
        }
    }

    /// The per-rule figures, newly refused and newly admitted.
    pub(super) fn finish(self) -> (Vec<RuleReport>, Delta, Delta) {
        let rules = self
            .rules
            .into_iter()
            .map(|((domain, rule), e)| {
                let change = match (e.current, e.candidate) {
                    (None, _) => "new",
                    (_, None) => "removed",
                    (Some(a), Some(b)) if a == b && e.overrides[0] == e.overrides[1] => "unchanged",
                    _ => "changed",
                };
                let [now, next] = e.counts;
                RuleReport {
                    domain,
                    rule,
                    change: change.into(),
                    current: e.current.map(|r| now.figures(r.mode)),
                    candidate: e.candidate.map(|r| next.figures(r.mode)),
                }
            })
            .collect();
        let delta = |c: Counts| {
            let checks = c.checks;
            let (identities, by_identity) = c.top();
            Delta {
                checks,
                identities,
                by_identity,
            }
        };
        (rules, delta(self.newly_refused), delta(self.newly_admitted))
    }
}
