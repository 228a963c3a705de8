//! A circuit breaker per store shard, as a pure state machine with time as an argument.
//!
//! A struggling Redis must not be hammered by every request: once more than half of the
//! calls in a window fail, the breaker opens and calls fail fast (each rule's
//! `on_store_failure` answers); after a cool-off it lets a trickle of probes through and
//! closes when they succeed.
//!
//! It is not driven directly: [`crate::guard::StoreGuard`] holds one per store shard and adds
//! what a call's ending counts as and what the shell does on a transition. The daemon drives
//! the guards with a monotonic clock (a wall clock stepped back would stretch the cool-off),
//! the simulator on virtual time.
//!
//! A call let through holds a [`Permit`] until it reports with [`Breaker::finish`]; a call
//! that never reports (its caller cancelled it mid-await) gives the permit back with
//! [`Breaker::abandon`], or a half-open breaker would run out of probes and never call the
//! shard again.
//!
//! ```text
//! closed --(failures > ratio over window, calls >= min)--> open
//! open   --(cool_off elapsed)--> half-open (at most `probes` calls in flight)
//! half-open --(`probes` successes)--> closed ; --(any failure)--> open
//! ```

use crate::time::{Micros, SECOND};

/// Tuning of a breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Open when more than this percentage of calls in the window failed.
    pub failure_pct: u64,
    /// The sliding window over which calls are counted.
    pub window: Micros,
    /// Fewer calls than this in the window never open the breaker.
    pub min_calls: u64,
    /// Time open before probing.
    pub cool_off: Micros,
    /// Probes allowed in flight while half-open, and successes needed to close.
    pub probes: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_pct: 50,
            window: 5 * SECOND,
            min_calls: 20,
            cool_off: 10 * SECOND,
            probes: 3,
        }
    }
}

/// Where the breaker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls fail fast until `until`.
    Open {
        /// End of the cool-off.
        until: Micros,
    },
    /// A trickle of probes goes through.
    HalfOpen {
        /// Probes sent and not yet recorded.
        in_flight: u64,
        /// Probes that succeeded.
        successes: u64,
    },
}

impl BreakerState {
    /// 0 closed, 1 half-open, 2 open: the metric's value.
    pub fn gauge(&self) -> u64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen { .. } => 1,
            BreakerState::Open { .. } => 2,
        }
    }
}

const SLOTS: usize = 10;

/// One breaker.
#[derive(Clone, Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: BreakerState,
    /// Per slot of `window / SLOTS`: (slot index, calls, failures).
    slots: [(u64, u64, u64); SLOTS],
    opened: u64,
    /// Counts half-open episodes, so a permit knows whether its probe is still in flight.
    episode: u64,
    /// The slot index of the latest failure in `slots`: a success with none in the window
    /// cannot trip the breaker, so it skips summing the window (every call of a healthy
    /// store).
    last_failure: Option<u64>,
}

/// What [`Breaker::permit`] hands a call it lets through; give it back by
/// [`Breaker::finish`] or [`Breaker::abandon`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a permit must be finished or abandoned"]
pub struct Permit {
    /// The half-open episode whose probe this call is, if it is one.
    probe: Option<u64>,
}

impl Permit {
    /// Whether the call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Breaker {
        Breaker {
            cfg,
            state: BreakerState::Closed,
            slots: [(u64::MAX, 0, 0); SLOTS],
            opened: 0,
            episode: 0,
            last_failure: None,
        }
    }

    /// The current state (an `Open` past its cool-off is reported as such until the next
    /// [`Breaker::allow`]).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// How many times it has opened.
    pub fn times_opened(&self) -> u64 {
        self.opened
    }

    fn slot_len(&self) -> Micros {
        (self.cfg.window / SLOTS as u64).max(1)
    }

    /// Whether a call may go to the store now. A `true` while half-open is a probe and must
    /// be followed by [`Breaker::record`].
    pub fn allow(&mut self, now: Micros) -> bool {
        match self.state {
            BreakerState::Closed => true,
            BreakerState::Open { until } if now >= until => {
                self.state = BreakerState::HalfOpen {
                    in_flight: 1,
                    successes: 0,
                };
                self.episode += 1;
                true
            }
            BreakerState::Open { .. } => false,
            BreakerState::HalfOpen {
                in_flight,
                successes,
            } => {
                if in_flight < self.cfg.probes {
                    self.state = BreakerState::HalfOpen {
                        in_flight: in_flight + 1,
                        successes,
                    };
                    true
                } else {
                    false
                }
            }
        }
    }

    /// [`Breaker::allow`], as a permit that says whether the call is a probe.
    pub fn permit(&mut self, now: Micros) -> Option<Permit> {
        if !self.allow(now) {
            return None;
        }
        let probe = matches!(self.state, BreakerState::HalfOpen { .. }).then_some(self.episode);
        Some(Permit { probe })
    }

    /// Records the result of a permitted call.
    ///
    /// While half-open, only this episode's probes move it towards closed: a slow call let
    /// through earlier says nothing about the shard now when it succeeds, and its failure
    /// re-opens the breaker like a probe's.
    pub fn finish(&mut self, now: Micros, permit: Permit, ok: bool) {
        if matches!(self.state, BreakerState::HalfOpen { .. }) && permit.probe != Some(self.episode)
        {
            if !ok {
                self.trip(now);
            }
            return;
        }
        self.record(now, ok);
    }

    /// Gives back the permit of a call that will never report (cancelled while in flight):
    /// a probe of the current half-open episode frees its place for another probe, and
    /// counts neither as a success nor as a failure. Anything else is a no-op.
    pub fn abandon(&mut self, permit: Permit) {
        if let BreakerState::HalfOpen {
            in_flight,
            successes,
        } = self.state
            && permit.probe == Some(self.episode)
        {
            self.state = BreakerState::HalfOpen {
                in_flight: in_flight.saturating_sub(1),
                successes,
            };
        }
    }

    /// Records the result of a call that [`Breaker::allow`] let through.
    pub fn record(&mut self, now: Micros, ok: bool) {
        match self.state {
            BreakerState::HalfOpen {
                in_flight,
                successes,
            } => {
                if !ok {
                    self.trip(now);
                } else if successes + 1 >= self.cfg.probes {
                    self.state = BreakerState::Closed;
                    self.slots = [(u64::MAX, 0, 0); SLOTS];
                    self.last_failure = None;
                } else {
                    self.state = BreakerState::HalfOpen {
                        in_flight: in_flight.saturating_sub(1),
                        successes: successes + 1,
                    };
                }
            }
            BreakerState::Open { .. } => {}
            BreakerState::Closed => {
                let idx = now / self.slot_len();
                let s = &mut self.slots[(idx % SLOTS as u64) as usize];
                if s.0 != idx {
                    *s = (idx, 0, 0);
                }
                s.1 += 1;
                let oldest = idx.saturating_sub(SLOTS as u64 - 1);
                if !ok {
                    s.2 += 1;
                    self.last_failure = Some(idx);
                } else if self.last_failure.is_none_or(|f| f < oldest) {
                    // No failure in the window: `over_threshold` would find none.
                    return;
                }
                if self.over_threshold(idx) {
                    self.trip(now);
                }
            }
        }
    }

    /// Whether the window ending at slot `idx` has enough calls and too many failures.
    fn over_threshold(&self, idx: u64) -> bool {
        let oldest = idx.saturating_sub(SLOTS as u64 - 1);
        let (calls, failures) = self
            .slots
            .iter()
            .filter(|(i, _, _)| *i != u64::MAX && *i >= oldest && *i <= idx)
            .fold((0, 0), |(c, f), (_, sc, sf)| (c + sc, f + sf));
        calls >= self.cfg.min_calls && failures * 100 > self.cfg.failure_pct * calls
    }

    fn trip(&mut self, now: Micros) {
        self.state = BreakerState::Open {
            until: now + self.cfg.cool_off,
        };
        self.opened += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MILLI;

    #[test]
    fn opens_on_failures_probes_and_closes() {
        let mut b = Breaker::new(BreakerConfig::default());
        let mut now = 1_000 * SECOND;
        // 19 failures: below min_calls, stays closed.
        for _ in 0..19 {
            assert!(b.allow(now));
            b.record(now, false);
            now += MILLI;
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow(now));
        b.record(now, false);
        assert!(matches!(b.state(), BreakerState::Open { .. }));
        assert!(!b.allow(now + SECOND));
        // After the cool-off: three probes, no fourth until they report.
        now += 10 * SECOND;
        assert!(b.allow(now) && b.allow(now) && b.allow(now));
        assert!(!b.allow(now));
        b.record(now, true);
        b.record(now, true);
        b.record(now, true);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.times_opened(), 1);
    }

    #[test]
    fn abandoned_probes_free_their_place_and_stale_permits_do_nothing() {
        let cfg = BreakerConfig {
            probes: 1,
            min_calls: 1,
            ..BreakerConfig::default()
        };
        let mut b = Breaker::new(cfg);
        let p = b.permit(0).expect("closed");
        assert!(!p.is_probe());
        b.finish(0, p, false);
        let now = 10 * SECOND;
        let probe = b.permit(now).expect("half-open: one probe");
        assert!(probe.is_probe());
        assert_eq!(b.permit(now), None, "one probe at a time");
        b.abandon(probe);
        let probe = b.permit(now).expect("the abandoned probe's place is free");
        // A probe of an earlier episode, abandoned late, frees nothing of this one.
        b.finish(now, probe, false);
        let later = now + 10 * SECOND;
        let stale = Permit { probe: Some(1) };
        let probe = b.permit(later).expect("the second episode's probe");
        b.abandon(stale);
        assert_eq!(b.permit(later), None);
        b.finish(later, probe, true);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    proptest::proptest! {
        // Many cases: a success that trips the breaker from a failure in the window's oldest
        // slot is rare, and it is the boundary of the skip.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// A success skips summing the window when no failure is in it; the breaker still
        /// opens exactly when the window is over the threshold after a call, over random
        /// calls, gaps (some past the window, some backwards) and outcomes.
        #[test]
        fn it_opens_exactly_when_the_window_is_over_the_threshold(
            calls in proptest::collection::vec(
                (0u64..1_500_000, proptest::bool::weighted(0.5), proptest::bool::weighted(0.05)),
                1..300,
            ),
            min_calls in 1u64..30,
            failure_pct in 1u64..99,
        ) {
            let cfg = BreakerConfig { min_calls, failure_pct, ..BreakerConfig::default() };
            let mut b = Breaker::new(cfg);
            let mut now = 100 * SECOND;
            for (gap, ok, back) in calls {
                now = if back { now.saturating_sub(gap) } else { now + gap };
                if !b.allow(now) {
                    continue;
                }
                let closed = b.state() == BreakerState::Closed;
                b.record(now, ok);
                if closed {
                    let open = matches!(b.state(), BreakerState::Open { .. });
                    proptest::prop_assert_eq!(open, b.over_threshold(now / b.slot_len()));
                }
            }
        }
    }

    #[test]
    fn a_failed_probe_reopens_and_old_failures_age_out() {
        let mut b = Breaker::new(BreakerConfig::default());
        let mut now = 0;
        for _ in 0..30 {
            b.allow(now);
            b.record(now, false);
        }
        now += 10 * SECOND;
        assert!(b.allow(now));
        b.record(now, false);
        assert!(matches!(b.state(), BreakerState::Open { until } if until == now + 10 * SECOND));
        // Closed breaker: failures older than the window do not count.
        let mut b = Breaker::new(BreakerConfig::default());
        for _ in 0..15 {
            b.record(0, false);
        }
        for _ in 0..15 {
            b.record(6 * SECOND, false);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        // Half the calls failing is not more than half.
        let mut b = Breaker::new(BreakerConfig::default());
        for i in 0..40 {
            b.record(0, i % 2 == 0);
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
