//! The fair share's promises over random traffic of several tenants: the parent is never
//! exceeded, a busy parent holds every tenant to its share, a refusal's wait is never early,
//! and a lone tenant gets the whole parent's rate.

use super::*;
use crate::time::{MILLI, SECOND};
use proptest::prelude::*;

/// One tenant's request: (gap before it in µs, tenant, cost).
type Step = (u64, usize, u64);

fn numbers() -> impl Strategy<Value = (u64, u64, u64, Vec<u64>)> {
    (1u64..100, 2u64..60).prop_flat_map(|(rate, burst)| {
        (
            Just(rate),
            Just(burst),
            0..burst,
            prop::collection::vec(
                prop_oneof![
                    Just(SHARE_SCALE / 3),
                    Just(SHARE_SCALE / 2),
                    50_000u64..=SHARE_SCALE
                ],
                1..4,
            ),
        )
    })
}

fn steps(tenants: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 0u64..200 * MILLI, 0u64..3 * SECOND],
            0..tenants,
            0u64..4,
        ),
        1..250,
    )
}

fn tenant(rate: u64, burst: u64, borrow_above: u64, share: u64) -> FairShare {
    tests::fs(rate, burst, borrow_above, share)
}

/// Runs the steps over one parent and a child per tenant, as a store does: both halves read,
/// evaluated, and written back together. Returns (time, tenant, cost, path, outcome) per step.
fn run(fss: &[FairShare], steps: &[Step]) -> Vec<(Micros, usize, u64, Path, Outcome)> {
    let mut now = 1_800_000_000 * SECOND;
    let mut children: Vec<Option<Box<State>>> = vec![None; fss.len()];
    let mut parent: Option<Box<State>> = None;
    let mut out = Vec::new();
    for &(gap, t, cost) in steps {
        now += gap;
        let f = &fss[t];
        let st = State::FairShare {
            child: children[t].clone(),
            parent: parent.clone(),
        };
        let r = local(now, cost);
        let p = path(f, Some(&st), now, cost);
        let o = evaluate(f, Some(&st), &r);
        assert_eq!(o.allowed, p != Path::Refused);
        if o.allowed && cost > 0 {
            let (State::FairShare { child, parent: pa }, _) = take(f, Some(&st), &r) else {
                unreachable!("a fair share's take writes both halves")
            };
            children[t] = child;
            parent = pa;
        }
        out.push((now, t, cost, p, o));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Every admission is charged to the parent: over any stretch, the tenants together take
    /// at most the parent's burst plus its refill.
    #[test]
    fn the_parent_is_never_exceeded(
        (rate, burst, above, shares) in numbers(),
        steps in steps(3),
    ) {
        let fss: Vec<FairShare> = shares.iter().map(|&s| tenant(rate, burst, above, s)).collect();
        let steps: Vec<Step> = steps.into_iter().map(|(g, t, c)| (g, t % fss.len(), c)).collect();
        let log = run(&fss, &steps);
        let admitted: Vec<(Micros, u64)> =
            log.iter().filter(|e| e.4.allowed).map(|e| (e.0, e.2)).collect();
        let parent = fss[0].rate;
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let bound = burst + parent.tokens_in(admitted[j].0 - admitted[i].0);
                prop_assert!(sum <= bound, "{sum} > {bound} from step {i} to {j}");
            }
        }
    }

    /// While the parent is busy nobody borrows, and what a tenant takes within its share is
    /// bounded by its own bucket: its share's burst plus its share's refill.
    #[test]
    fn a_busy_parent_holds_each_tenant_to_its_share(
        (rate, burst, above, shares) in numbers(),
        steps in steps(3),
    ) {
        let fss: Vec<FairShare> = shares.iter().map(|&s| tenant(rate, burst, above, s)).collect();
        let steps: Vec<Step> = steps.into_iter().map(|(g, t, c)| (g, t % fss.len(), c)).collect();
        let log = run(&fss, &steps);
        for (t, f) in fss.iter().enumerate() {
            let own: Vec<(Micros, u64)> = log
                .iter()
                .filter(|e| e.1 == t && e.3 == Path::Guaranteed && e.2 > 0)
                .map(|e| (e.0, e.2))
                .collect();
            for i in 0..own.len() {
                let mut sum = 0;
                for j in i..own.len() {
                    sum += own[j].1;
                    let bound = f.child_burst + f.child_rate.tokens_in(own[j].0 - own[i].0);
                    prop_assert!(sum <= bound, "tenant {t}: {sum} > {bound}");
                }
            }
        }
        // A busy parent (below `borrow_above` + 1) never lends: replay and check each step.
        let mut now = 1_800_000_000 * SECOND;
        let mut children: Vec<Option<Box<State>>> = vec![None; fss.len()];
        let mut parent: Option<Box<State>> = None;
        for &(gap, t, cost) in &steps {
            now += gap;
            let st = State::FairShare { child: children[t].clone(), parent: parent.clone() };
            let p = path(&fss[t], Some(&st), now, cost);
            if busy(&fss[t], Some(&st), now) {
                prop_assert_ne!(p, Path::Borrowed);
            }
            if p != Path::Refused && cost > 0 {
                let (State::FairShare { child, parent: pa }, _) =
                    take(&fss[t], Some(&st), &local(now, cost)) else { unreachable!() };
                children[t] = child;
                parent = pa;
            }
        }
    }

    /// A refusal's wait is exact when nothing else happens: refused a µs before it, admitted
    /// at it (the deny cache repeats refusals until then).
    #[test]
    fn a_refusal_is_never_early(
        (rate, burst, above, shares) in numbers(),
        steps in steps(3),
        probe in 1u64..4,
    ) {
        let fss: Vec<FairShare> = shares.iter().map(|&s| tenant(rate, burst, above, s)).collect();
        let steps: Vec<Step> = steps.into_iter().map(|(g, t, c)| (g, t % fss.len(), c)).collect();
        let mut now = 1_800_000_000 * SECOND;
        let mut children: Vec<Option<Box<State>>> = vec![None; fss.len()];
        let mut parent: Option<Box<State>> = None;
        for &(gap, t, cost) in &steps {
            now += gap;
            let f = &fss[t];
            let st = State::FairShare { child: children[t].clone(), parent: parent.clone() };
            let o = evaluate(f, Some(&st), &local(now, probe));
            let fits = probe + f.borrow_above <= f.burst || probe <= f.child_burst;
            if !o.allowed && fits {
                prop_assert!(o.retry_after > 0);
                let before = evaluate(f, Some(&st), &local(now + o.retry_after - 1, probe));
                let at = evaluate(f, Some(&st), &local(now + o.retry_after, probe));
                prop_assert!(!before.allowed && at.allowed, "wait {}", o.retry_after);
            }
            if path(f, Some(&st), now, cost) != Path::Refused && cost > 0 {
                let (State::FairShare { child, parent: pa }, _) =
                    take(f, Some(&st), &local(now, cost)) else { unreachable!() };
                children[t] = child;
                parent = pa;
            }
        }
    }

    /// A lone tenant asking faster than the parent refills gets the parent's whole rate: all
    /// but at most `borrow_above` + 1 tokens of its burst and refill, whatever its share.
    #[test]
    fn a_lone_tenant_takes_the_whole_parent(
        (rate, burst, above, shares) in numbers(),
        n in 1usize..400,
    ) {
        // Room for a request's refill between the reserve and the cap (`borrow_above` at most
        // burst - 2): else a request arriving just under the reserve is refused and the
        // next one finds the refill spilled over the cap, whoever asks.
        let above = above % (burst - 1);
        let f = tenant(rate, burst, above, shares[0]);
        // Two requests per parent token: never more than one token's refill between them.
        let gap = SECOND / rate / 2;
        let steps: Vec<Step> = (0..n).map(|_| (gap, 0, 1)).collect();
        let log = run(std::slice::from_ref(&f), &steps);
        let admitted = log.iter().filter(|e| e.4.allowed).count() as u64;
        let elapsed = log[log.len() - 1].0 - log[0].0;
        // At a refusal the parent held under `borrow_above` + 1: all the rest went to it.
        let floor = (burst + f.rate.tokens_in(elapsed)).saturating_sub(above + 2);
        prop_assert!(admitted >= floor.min(n as u64), "{admitted} < {floor} of {n}");
    }
}
