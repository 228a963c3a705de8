//! The stale bound on script calls and the ledger of replies nobody waited for.
//!
//! A caller gives up on a store call at its deadline and answers by the rule's failure mode,
//! but a call already on the wire still runs when Redis gets to it: after a pause, Redis runs
//! the whole backlog, and a fail-closed rule's client is refused *and* charged. Each call
//! therefore carries a bound in epoch microseconds (`now` + `stale_after`, see
//! [`super::ScriptCall::stale_after`]); `lua/check.lua` refuses to run it past that bound by
//! Redis's clock. The bound compares two clocks, so a call refused as stale while its caller
//! still waits is a sign of clock skew (or a slow daemon), not an outage: the store re-sends
//! it once without a bound, so skew costs a round trip, never an answer, and counts it.
//!
//! What became of the calls whose callers left is counted ([`LateReplies`]): `ran` are calls
//! Redis ran after their caller had given up (they may have taken units nobody was told of),
//! `stale` ones it refused by the bound, `lost` ones whose reply never came (a connection
//! dropped, a reply past [`super::standalone`]'s wait): their outcome is unknown. For a
//! fail-closed quota, the count Redis holds minus what the daemons admitted is at most
//! `ran + lost` over the daemons.

use crate::{LateReplies, StoreError};
use sluice_core::Micros;
use std::sync::atomic::{AtomicU64, Ordering};

/// The bound and the counters, shared by a store's calls.
#[derive(Debug, Default)]
pub(crate) struct Staleness {
    /// How long after a call's `now` Redis may still run it, in microseconds; 0: unbounded.
    after_us: u64,
    ran: AtomicU64,
    stale: AtomicU64,
    lost: AtomicU64,
    skewed: AtomicU64,
    /// Skewed calls when the last warning was logged: one warning per 1,000 such calls.
    warned: AtomicU64,
}

impl Staleness {
    /// A bound of `after_ms` after each call's `now`; 0 turns the bound off.
    pub(crate) fn new(after_ms: u64) -> Staleness {
        Staleness {
            after_us: after_ms.saturating_mul(1_000),
            ..Staleness::default()
        }
    }

    /// The bound for a call made at `now`; 0 (none) when the bound is off.
    pub(crate) fn bound(&self, now: Micros) -> Micros {
        if self.after_us == 0 {
            0
        } else {
            now.saturating_add(self.after_us)
        }
    }

    /// Records the result of a call whose caller had already given up.
    pub(crate) fn late<T>(&self, result: &Result<T, StoreError>) {
        let counter = match result {
            Ok(_) => &self.ran,
            Err(StoreError::Stale { .. }) => &self.stale,
            Err(e) if e.is_outage() => &self.lost,
            // The script answered an error: it changed nothing.
            Err(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a call refused as stale while its caller still waited (it is re-sent unbounded).
    pub(crate) fn skewed(&self, late_us: u64) {
        let n = self.skewed.fetch_add(1, Ordering::Relaxed) + 1;
        let last = self.warned.load(Ordering::Relaxed);
        if (n == 1 || n >= last + 1_000)
            && self
                .warned
                .compare_exchange(last, n, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                late_us,
                skewed_calls = n,
                "redis ran a call past its stale bound while the daemon still waited: this \
                 host's clock is behind Redis's (or the daemon is slow to send); re-sent \
                 without a bound. Check NTP, or raise store_stale_after_ms"
            );
        }
    }

    /// The counters so far.
    pub(crate) fn snapshot(&self) -> LateReplies {
        LateReplies {
            ran: self.ran.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            skewed: self.skewed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_now_plus_the_budget_or_none() {
        assert_eq!(Staleness::new(3).bound(1_000_000), 1_003_000);
        assert_eq!(Staleness::new(0).bound(1_000_000), 0);
        assert_eq!(Staleness::new(3).bound(u64::MAX), u64::MAX);
    }

    #[test]
    fn late_results_are_sorted_by_what_they_say_about_the_count() {
        let s = Staleness::new(3);
        s.late(&Ok(()));
        s.late::<()>(&Err(StoreError::Stale { late_us: 5 }));
        s.late::<()>(&Err(StoreError::Timeout(3)));
        s.late::<()>(&Err(StoreError::Unavailable("reset".into())));
        s.late::<()>(&Err(StoreError::Server("bad argument".into())));
        s.skewed(10);
        assert_eq!(
            s.snapshot(),
            LateReplies {
                ran: 1,
                stale: 1,
                lost: 2,
                skewed: 1
            }
        );
    }
}
