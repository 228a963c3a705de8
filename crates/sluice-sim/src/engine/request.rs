//! A request's path: planned at arrival on the daemon's view, queued for its region's store,
//! executed through the daemon's hot-key layer and guard, decided by the core, then measured
//! (ground truth) and observed (the daemon's shipper) through the observer thread.

use super::observer::{Obs, Rec};
use super::region::{Daemon, DaemonStore, Region, RegionStore, Write};
use super::store::{GuardCounts, guarded};
use super::{RULES_VERSION, Sim, ships, view};
use crate::metrics::{Counter, Measured};
use sluice_core::Micros;
use sluice_core::decision::{Answer, Code, Decision, Plan, Via, plan_into};
use sluice_core::hash::InlineKey;
use sluice_core::hotkeys::CallPolicy;
use sluice_core::rules::{Domain, Mode, Rule, Scope};
use sluice_core::ship::{BusyRule, observations};
use sluice_core::time::SECOND;
use smallvec::SmallVec;

pub(super) struct Pending<'a> {
    pub(super) region: usize,
    pub(super) daemon: usize,
    /// The generator and key it came from; `None` for a request given by [`Sim::decide`].
    pub(super) src: Option<(u32, u32)>,
    /// When it arrived, on the reference clock (its plan has its region's clock's time).
    pub(super) now: Micros,
    pub(super) cost: u64,
    /// Boxed: a plan is large, and it moves from the pool to the FIFO to execution.
    pub(super) plan: Box<Plan<'a>>,
}

/// A store call waiting to execute. A region's store serialises its calls (their times never
/// decrease), so they wait in a FIFO per region rather than in the event heap; the loop merges
/// the FIFO fronts with the heap by `(at, seq)`, which is the order the heap would give.
pub(super) struct Exec<'a> {
    pub(super) at: Micros,
    pub(super) seq: u64,
    pub(super) p: Pending<'a>,
}

impl<'a> Sim<'a> {
    pub(super) fn arrival(&mut self, g: usize) {
        let t = self.now;
        let sc = self.sc;
        let domain = self.domain;
        // Unique per request, as a daemon's are: a split rule picks its sub-count from it.
        // Written into a kept buffer: no allocation per request.
        let request_id = &mut self.request_id;
        request_id.clear();
        // itoa's digits: `write!` went through `core::fmt`, some 560 instructions a request.
        request_id.push_str(itoa::Buffer::new().format(self.seq + 1));
        let tg = &mut self.gens[g];
        let pick = tg
            .arrive(&self.up)
            .and_then(|(r, d, k)| Some((r, d.pick(&self.live[r])?, k)));
        match pick {
            None => self.metrics.no_region += 1,
            Some((r, d, k)) => {
                let cost = tg.cfg.cost;
                // The daemon decides on its region's clock; the run goes on the reference's.
                let lt = t.saturating_add_signed(sc.clock_offset[r]);
                let remote = &self.regions[r].daemons[view(sc, d)].remote;
                // Planned into a plan an earlier request left: its vectors and strings keep
                // their buffers.
                let mut p = self.plans.pop().unwrap_or_default();
                plan_into(
                    &mut p,
                    domain,
                    tg.descriptors(k),
                    lt,
                    cost,
                    request_id,
                    |a| remote.remote_for(&a.key, &a.params, lt, sc.regions.len()),
                );
                self.queue(r, d, Some((g as u32, k as u32)), t, cost, p);
            }
        }
        if let Some(next) = self.gens[g].next_at()
            && next < sc.duration
        {
            self.seq += 1;
            self.arrivals[g] = Some((next, self.seq));
        }
    }

    /// Queues a request planned at `t` on daemon `d` of region `r`: its store calls execute
    /// `latency` later, in arrival order per region. `None` when no rule applies: allowed
    /// without a store call.
    pub(super) fn queue(
        &mut self,
        r: usize,
        d: usize,
        src: Option<(u32, u32)>,
        t: Micros,
        cost: u64,
        p: Box<Plan<'a>>,
    ) -> Option<Micros> {
        if p.calls.is_empty() {
            self.metrics.requests += 1;
            self.metrics.admitted += 1;
            self.plans.push(p);
            return None;
        }
        // Each store the request's calls go to draws its latency and serialises its calls;
        // the request executes when the last of them would have run its call, in that
        // store's FIFO (whose times so never decrease). With the main store only, one draw.
        let sc = self.sc;
        let slots = sc.store_slots();
        let mut seen: SmallVec<[usize; 4]> = SmallVec::new();
        let (mut at, mut fifo) = (0, 0);
        for i in 0..p.calls.len() {
            let s = if slots == 1 {
                0
            } else {
                sc.slot_of(p.store_of(i))
            };
            if seen.contains(&s) {
                continue;
            }
            seen.push(s);
            let rs = &mut self.regions[r].stores[s];
            let lat = sc.store_cfg(s).latency.sample(&mut rs.latency_rng);
            let t_s = (t + lat).max(rs.last_exec);
            rs.last_exec = t_s;
            if seen.len() == 1 || t_s > at {
                (at, fifo) = (t_s, s);
            }
        }
        self.seq += 1;
        self.execs[r * slots + fifo].push_back(Exec {
            at,
            seq: self.seq,
            p: Pending {
                region: r,
                daemon: d,
                src,
                now: t,
                cost,
                plan: p,
            },
        });
        Some(at)
    }

    /// Executes a request's store calls and decides it. Hands the decision out only for a
    /// request given by [`Sim::decide`] (`None` too when it was lost in flight).
    pub(super) fn exec(&mut self, p: Pending<'a>) -> Option<Decision> {
        let Pending {
            region: r,
            daemon: d,
            src,
            now,
            cost,
            plan,
        } = p;
        let sim_now = self.now;
        if !self.regions[r].up || !self.regions[r].daemons[d].up {
            self.metrics.failed_in_flight += 1;
            self.plans.push(plan);
            return None;
        }
        self.metrics.requests += 1;
        self.replicate(r, sim_now);
        // The daemon's guards run on its region's clock.
        let local_now = self.clock(r, sim_now);
        let permille = self.sc.store.local_permille;
        // A kept buffer: no allocation per request.
        let mut answers = std::mem::take(&mut self.answers);
        let domain = self.domain;
        let sc = self.sc;
        for (i, pc) in plan.calls.iter().enumerate() {
            // The call's store, as the daemon's engine picks it (`Plan::store_of`), with
            // that store's guard and local buckets of the daemon.
            let slot = sc.slot_of(plan.store_of(i));
            let Region {
                stores, daemons, ..
            } = &mut self.regions[r];
            let RegionStore {
                store,
                replica,
                down_until,
                ..
            } = &mut stores[slot];
            let store_ok = sim_now >= *down_until;
            let Daemon {
                hot,
                stores: dstores,
                ..
            } = &mut daemons[d];
            let DaemonStore { guard, local } = &mut dstores[slot];
            let before = hot.stats();
            let (mut calls, mut g) = (0, GuardCounts::default());
            // Through the hot-key layer, as the daemon does: it answers the call itself, or
            // sends it as planned or as a lease call, each one through the daemon's guard
            // of the call's store to that store here.
            let res = hot.call_sync(pc, CallPolicy::of(&plan, i), RULES_VERSION, |call| {
                let sent = guarded(guard, local, local_now, store_ok.then_some(&*store), call);
                calls += u64::from(g.count(&sent));
                let res = sent.res.flatten();
                if let (Some(rep), Some(_)) = (replica.as_mut(), &res) {
                    rep.queue
                        .push_back((sim_now + rep.lag, Write::Check(call.clone())));
                }
                res
            });
            let after = hot.stats();
            self.metrics.store_calls += calls;
            g.add_to(&mut self.metrics, slot);
            let sec = (now / SECOND) as usize;
            for &ai in &pc.rules {
                let ri = rule_index(domain, plan.applied[ai].rule);
                let per_s = &mut self.metrics.calls_per_s[ri];
                if per_s.len() <= sec {
                    per_s.resize(sec + 1, (0, 0));
                }
                per_s[sec].0 += 1;
                per_s[sec].1 += calls;
                let h = &mut self.metrics.hot[ri];
                h.requests += 1;
                h.store_calls += calls;
                h.deny_hits += after.deny_hits - before.deny_hits;
                h.lease_spent += after.lease_spent - before.lease_spent;
                h.lease_blocked += after.lease_blocked - before.lease_blocked;
                h.lease_calls += after.lease_calls - before.lease_calls;
                h.leased_units += after.leased_units - before.leased_units;
                h.samples += after.samples - before.samples;
                h.sample_skipped += after.sample_skipped - before.sample_skipped;
                h.sample_blocked += after.sample_blocked - before.sample_blocked;
                let gated = after.gate_admitted - before.gate_admitted;
                h.gate_admitted += gated;
                h.gate_admitted_units += gated * pc.call.cost;
                h.gate_refused += after.gate_refused - before.gate_refused;
                h.gate_to_store += after.gate_to_store - before.gate_to_store;
            }
            self.metrics.store_failures += u64::from(res.is_none());
            let per_store = &mut self.metrics.stores[slot];
            per_store.calls += calls;
            if res.is_none() {
                per_store.failures += 1;
                // Each rule of the failed call answered by its failure mode, counted as the
                // daemon counts them per store.
                per_store.answered(sluice_core::guard::failure_tally(&plan, i));
            }
            let local = &self.regions[r].daemons[d].stores[slot].local;
            answers.push(sluice_core::guard::answer(&plan, i, res, permille, |c| {
                local.check_sync(c).ok()
            }));
        }
        // Decided into a kept decision: its vectors keep their buffers.
        let mut decision = std::mem::replace(&mut self.decision, Decision::unlimited(0));
        plan.decide_into(RULES_VERSION, &answers, &mut decision);
        // The daemon journals these and replays them into the store once it answers again;
        // the simulator counts them.
        for (store, ..) in sluice_core::guard::journaled(&plan, &answers, &decision, cost) {
            // Into the journal of the store the key's call went to, in the daemon.
            self.metrics.journaled += 1;
            self.metrics.stores[sc.slot_of(store)].journaled += 1;
        }
        self.measure(r, src, now, cost, &plan, &decision);
        let planned_at = self.clock(r, now);
        self.observe(r, d, planned_at, &plan, &answers);
        answers.clear();
        self.answers = answers;
        self.plans.push(plan);
        // Only a request given by `Sim::decide` hands its decision out.
        let given = src.is_none().then(|| decision.clone());
        self.decision = decision;
        given
    }

    /// The index of a rule of the domain (see [`rule_index`]).
    pub(super) fn rule_index(&self, rule: &Rule) -> usize {
        rule_index(self.domain, rule)
    }

    /// What one decided request did to the ground truth, for the observer: the counters it
    /// reached (numbered here, where the keys are), and whether each refused.
    pub(super) fn measure(
        &mut self,
        r: usize,
        src: Option<(u32, u32)>,
        now: Micros,
        cost: u64,
        plan: &Plan<'a>,
        decision: &Decision,
    ) {
        let mut m = Measured {
            region: r as u8,
            now,
            cost,
            code: decision.code,
            local: decision
                .policies
                .iter()
                .filter(|p| p.via == Via::Local)
                .count() as u32,
            decided_by: None,
            counters: SmallVec::new(),
        };
        for a in &plan.applied {
            if a.rule.mode != Mode::Enforce {
                continue;
            }
            let ri = self.rule_index(a.rule);
            let region = match a.rule.scope {
                Scope::Global => None,
                Scope::Region => Some(r),
            };
            // The counter a (traffic, key, rule, region) reaches never changes: look it up
            // by numbers instead of hashing the store key.
            let tag = (ri * 65 + region.map_or(0, |r| r + 1)) as u32;
            let mut uncached = SmallVec::new();
            let cached = match src {
                Some((traffic, key)) => self.gens[traffic as usize].truth(key as usize),
                None => &mut uncached,
            };
            let id = match cached.iter().find(|(t, _)| *t == tag) {
                Some(&(_, id)) => id,
                None => {
                    // A split rule's truth is the whole key's: its sub-counts add up to it.
                    let (id, new) = match &a.split {
                        Some(sp) => {
                            let (whole, _) = sluice_core::keys::split_identity(&a.identity);
                            let key =
                                sluice_core::keys::store_key(whole, &a.rule.id, sp.whole.kind());
                            self.index.id(ri, region, &key, &sp.whole)
                        }
                        None => self.index.id(ri, region, &a.key, &a.params),
                    };
                    if let Some(new) = new {
                        self.pipe.send(Rec::Truth(new));
                    }
                    cached.push((tag, id));
                    id
                }
            };
            let refusing = decision.code == Code::OverLimit
                && decision
                    .policies
                    .iter()
                    .any(|p| !p.allowed && p.via != Via::FailedClosed && p.id == a.rule.id);
            if decision.decided_by.as_deref() == Some(&*a.rule.id) {
                m.decided_by = Some(m.counters.len() as u32);
            }
            m.counters.push(Counter {
                id,
                rule: ri as u32,
                charge_rejected: a.rule.charge_rejected,
                refusing,
            });
        }
        self.pipe.send(Rec::Request(m));
    }

    /// Hands the observer what the store answered for global rules, for the daemon's
    /// shipper: the core's [`observations`], as the daemon records them.
    pub(super) fn observe(
        &mut self,
        r: usize,
        d: usize,
        now: Micros,
        plan: &Plan<'a>,
        answers: &[Answer],
    ) {
        if !ships(self.sc, d) {
            return;
        }
        let rule = BusyRule {
            on: self.sc.gossip.busy_on,
            regions: self.sc.regions.len(),
        };
        for (a, observed) in observations(plan, answers, rule, self.threshold) {
            let obs = Obs {
                key: InlineKey::from_slice(a.key.as_bytes()),
                params: a.params.as_ref().clone(),
                observed,
            };
            self.pipe.send(Rec::Observe {
                region: r,
                daemon: d,
                now,
                obs,
            });
        }
    }
}

/// The index of a rule of the domain, from its address (the plan borrows the domain's
/// rules), checked.
fn rule_index(domain: &Domain, rule: &Rule) -> usize {
    let rules = &domain.rules;

    let size = std::mem::size_of::<Rule>().max(1);
    let off = (rule as *const Rule as usize).wrapping_sub(rules.as_ptr() as usize) / size;
    match rules.get(off) {
        Some(r) if std::ptr::eq(r, rule) => off,
        _ => rules
            .iter()
            .position(|r| std::ptr::eq(r, rule))
            .unwrap_or(0),
    }
}
