//! A plan's buffers kept across rule sets: a [`Plan`] borrows the rules it was made from, so
//! a caller whose rule snapshot changes from one request to the next (the daemon loads the
//! live one per check) cannot keep the plan itself; it keeps the [`Spare`] instead.

use super::{Plan, PlannedCall};
use crate::matching::Applied;

/// What [`Plan::into_spare`] keeps of a plan: the vectors and strings, none of its borrows
/// of the rule set. [`Plan::from_spare`] turns it back into an empty plan for
/// [`super::plan_into`], which then allocates nothing for a request shaped like an earlier
/// one.
#[derive(Debug, Default)]
pub struct Spare {
    /// Always empty: only its buffer is kept.
    applied: Vec<Applied<'static>>,
    calls: Vec<PlannedCall>,
    strings: Vec<(String, String)>,
    scratch: crate::matching::Scratch,
}

impl<'a> Plan<'a> {
    /// The plan's buffers, for [`Plan::from_spare`] with any rule set.
    pub fn into_spare(self) -> Spare {
        let Plan {
            applied,
            calls,
            spare: mut strings,
            scratch,
        } = self;
        // Collected in place (the same layout): the buffer is kept, the borrows dropped.
        let applied = applied
            .into_iter()
            .filter_map(|a| {
                strings.push((a.identity, a.key));
                None
            })
            .collect();
        Spare {
            applied,
            calls,
            strings,
            scratch,
        }
    }

    /// A plan over `spare`'s buffers, to fill with [`super::plan_into`]: the same plan as
    /// [`super::plan`]'s once filled.
    pub fn from_spare(spare: Spare) -> Plan<'a> {
        Plan {
            applied: spare.applied,
            calls: spare.calls,
            spare: spare.strings,
            scratch: spare.scratch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{plan, plan_into};
    use super::*;
    use crate::Remote;
    use crate::matching::desc;
    use crate::rules::parse_yaml;

    #[test]
    fn a_plan_from_a_spare_is_the_plan_planned_afresh() {
        let set = parse_yaml(
            r#"
domain: d
rules:
  - { id: a, key: [u], algorithm: fixed_window, limit: 5, window: 1s }
  - { id: b, key: [u], algorithm: gcra, rate_per_s: 1, burst: 1 }
  - { id: c, key: [ip], algorithm: leaky_queue, rate_per_s: 10, max_delay: 20ms }
"#,
        )
        .expect("valid");
        let dom = set.domain("d").expect("domain");
        let big = desc(&[("u", "a-long-user-name"), ("ip", "10.0.0.1")]);
        let small = desc(&[("u", "x")]);
        let none = |_: &Applied<'_>| Remote::default();
        let mut spare = Spare::default();
        for d in [&big, &small, &big, &small] {
            let mut p = Plan::from_spare(spare);
            plan_into(&mut p, dom, d, 7, 3, "req", none);
            let want = plan(dom, d, 7, 3, "req", none);
            assert_eq!(p.applied, want.applied);
            assert_eq!(p.calls, want.calls);
            // What a caller may do to its calls (a check that does not wait) is overwritten.
            for pc in &mut p.calls {
                crate::algo::without_waiting(&mut pc.call);
            }
            spare = p.into_spare();
        }
        // The last plan's two rules' strings (the third rule's were dropped with its entry
        // when the smaller request left it out).
        assert_eq!(spare.strings.len(), 2, "every applied rule's strings kept");
        assert!(spare.applied.capacity() >= 3, "the rules' vector kept");
    }
}
