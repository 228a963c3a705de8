//! Convergence after a heal: what each daemon must learn for the views to agree again with
//! the regions' counts, and when it has; and the resend of busy figures on a rejoin.

use super::observer::Rec;
use super::{Sim, view};
use sluice_core::Micros;
use sluice_core::ship::BusyRule;

/// What one daemon still has to learn after a heal.
pub(super) struct Need {
    pub(super) key: String,
    pub(super) rule: usize,
    pub(super) expected: u64,
    pub(super) expires: Micros,
}

/// Convergence after one heal.
pub struct HealTrack {
    /// When the partition healed.
    pub at: Micros,
    pub(super) needs: Vec<Vec<Need>>,
    /// Needs still open.
    pub left: usize,
    /// Needs that ended with their window before being met.
    pub moot: usize,
    /// Keys that had something to learn.
    pub keys: usize,
    /// When the last need was met.
    pub done: Option<Micros>,
}

impl<'a> Sim<'a> {
    pub(super) fn check_heals(&mut self, r: usize, d: usize) {
        let now = self.now;
        let gi = r * self.sc.daemons + d;
        let local = self.clock(r, now);
        let domain = self.domain;
        let remote = &self.regions[r].daemons[view(self.sc, d)].remote;
        let regions = self.sc.regions.len();
        for h in self.heals.iter_mut().filter(|h| h.done.is_none()) {
            let (mut met, mut moot) = (0, 0);
            h.needs[gi].retain(|n| {
                if now >= n.expires {
                    moot += 1;
                    return false;
                }
                let params = &domain.rules[n.rule].params;
                if remote.remote_for(&n.key, params, local, regions).cur >= n.expected {
                    met += 1;
                    return false;
                }
                true
            });
            h.left -= met + moot;
            h.moot += moot;
            if h.left == 0 {
                h.done = Some(now);
            }
        }
    }

    /// After a heal: what each daemon must learn for the views to agree again with the
    /// regions' counts at the heal (busy keys of global window rules).
    pub(super) fn track_heal(&mut self) {
        let now = self.now;
        let sc = self.sc;
        let n = sc.regions.len();
        let mut needs: Vec<Vec<Need>> = (0..n * sc.daemons).map(|_| Vec::new()).collect();
        // Each rule's threshold on a region's count, parts per million of the limit.
        let busy = BusyRule {
            on: sc.gossip.busy_on,
            regions: n,
        };
        let th: Vec<u64> = self
            .domain
            .rules
            .iter()
            .map(|rule| {
                let pct = self.threshold.unwrap_or(rule.share_threshold_pct);
                u64::from(busy.threshold(pct).ppm())
            })
            .collect();
        let mut keys = 0;
        for t in self.pipe.heal_counts(now, self.up.clone(), th) {
            let mut any = false;
            for q in (0..n).filter(|q| self.up[*q]) {
                let expected: u64 = (0..n).filter(|r| *r != q).map(|r| t.counts[r]).sum();
                if expected == 0 {
                    continue;
                }
                any = true;
                for d in 0..sc.daemons {
                    needs[q * sc.daemons + d].push(Need {
                        key: t.key.clone(),
                        rule: t.rule,
                        expected,
                        expires: t.end,
                    });
                }
            }
            keys += usize::from(any);
        }
        let left = needs.iter().map(Vec::len).sum();
        self.heals.push(HealTrack {
            at: now,
            needs,
            left,
            moot: 0,
            keys,
            done: (left == 0).then_some(now),
        });
        // Views may already agree (counts that crossed before the partition).
        for r in 0..n {
            if self.up[r] {
                for d in 0..sc.daemons {
                    self.check_heals(r, d);
                }
            }
        }
    }

    /// A peer region is back: every shipping daemon of the other regions that are up sends
    /// all its busy figures at its next shipment (when the scenario says so).
    pub(super) fn resend_all(&mut self, except: Option<usize>) {
        if !self.sc.gossip.resend_on_rejoin {
            return;
        }
        let regions: Vec<usize> = (0..self.regions.len())
            .filter(|i| self.regions[*i].up && Some(*i) != except)
            .collect();
        // And what their receivers forwarded (`fanout`): it may have been lost on the way.
        for &r in &regions {
            for d in &mut self.regions[r].daemons {
                d.forwarder.resend_all();
            }
        }
        self.pipe.send(Rec::ResendAll { regions });
    }
}
