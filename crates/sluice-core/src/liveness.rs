//! Who may be elected a region's sender: a liveness much faster than the membership's
//! failure detector, for the one decision where a wrong guess costs only duplicates.
//!
//! The membership (chitchat's phi-accrual detector) is tuned not to drop a slow peer: it
//! takes several gossip rounds of silence (3–4 s with 500 ms rounds) to call a node dead, and
//! until then the dead sender stays elected, its region's figures stop crossing, and the
//! other regions keep relaying to it. Electing wrongly is cheap by contrast: two daemons that
//! both believe they send both ship, and receivers keep the max ([`crate::relay`]). So the
//! election watches signs of life it can see directly:
//!
//! - **In the region**, the sender sends something to every daemon of its region at least
//!   every [`beacon_every`] (a packet it passes on, or an empty one). A daemon that has heard
//!   nothing from the sender it counts on for [`stale_after`] passes it over until it is
//!   heard again: the next lowest id takes over, at once rather than at its next shipment.
//!   Only a silence it listened through counts: a daemon that was itself stalled (its
//!   election ran late) gives the sender a fresh grace period, since the beacons sent
//!   meanwhile may still be unread.
//! - **The membership's drops are checked too.** Its detector drops a live daemon when this
//!   one stalled or its gossip lagged, at times this region's lower ids before the other
//!   regions' daemons; a daemon that then elected itself would ship beside a sender it still
//!   hears. So the sender a daemon counts on stays electable, listed or not, until this
//!   watch passes it over ([`SenderWatch::kept`]).
//! - **Across regions**, a sender ships to every other region's receiver each interval (an
//!   empty packet when it has nothing to ship). A region whose figures lately came from a
//!   daemon other than the one the membership elects is sent to through that daemon: the
//!   one that took over is alive, the one it replaced may not be.
//!
//! [`SenderWatch`] keeps those observations; `now` is an argument, so the daemon drives it
//! with its clock and a test with a manual one. Every `now` it is given must come from a
//! monotonic clock: a silence is an interval on one daemon, and a wall clock stepped forward
//! would pass every live sender over at once, stepped back would keep a dead one elected.

use crate::Micros;
use crate::relay::{self, Member};
use std::collections::HashMap;

/// How often a sender makes itself heard in its region when it has nothing else to send:
/// a quarter of the ship interval.
pub fn beacon_every(ship_interval: Micros) -> Micros {
    ship_interval / 4
}

/// How long the sender may stay silent before its region passes it over: three quarters of
/// the ship interval (three beacons missed), so a dead sender is replaced within one
/// interval.
pub fn stale_after(ship_interval: Micros) -> Micros {
    ship_interval * 3 / 4
}

/// How long a region keeps being reached through the daemon that last relayed its figures:
/// two and a half intervals (two shipments may be lost).
pub fn relayer_kept(ship_interval: Micros) -> Micros {
    ship_interval * 5 / 2
}

/// A sender the election stopped counting on: silent for longer than the bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassedOver {
    /// The daemon passed over.
    pub node_id: String,
    /// How long nothing had been heard from it (or, counted on only lately, since then).
    pub silent_for: Micros,
}

/// Signs of life the sender election takes into account, as one daemon saw them.
#[derive(Debug, Default)]
pub struct SenderWatch {
    /// Daemons of this region: when a packet from each last arrived.
    heard: HashMap<String, Micros>,
    /// The sender this daemon counts on, and since when.
    counting_on: Option<(String, Micros)>,
    /// Passed over, and when: until heard from after that.
    passed_over: HashMap<String, Micros>,
    /// Other regions: the daemon that last relayed their figures here, and when.
    relayers: HashMap<String, (String, Micros)>,
    /// When [`SenderWatch::electable`] last ran: a call long after it means this daemon was
    /// not listening in between.
    looked_at: Option<Micros>,
}

impl SenderWatch {
    /// A packet from `node_id`, a daemon of this region, arrived at `now`.
    pub fn heard(&mut self, node_id: &str, now: Micros) {
        match self.heard.get_mut(node_id) {
            Some(t) => *t = (*t).max(now),
            None => {
                self.heard.insert(node_id.to_string(), now);
            }
        }
    }

    /// `node_id` of `region` relayed that region's figures here at `now`.
    pub fn relayed(&mut self, region: &str, node_id: &str, now: Micros) {
        match self.relayers.get_mut(region) {
            Some((n, t)) if n == node_id => *t = (*t).max(now),
            Some(r) if r.1 > now => {}
            _ => {
                self.relayers
                    .insert(region.to_string(), (node_id.to_string(), now));
            }
        }
    }

    /// Marks the members the election must pass over as not relaying, in place: this
    /// region's sender when it has been silent past `stale` (and any passed over before and
    /// not heard from since), and in another region every relaying member but the one that
    /// relayed here within `kept`. `me` is this daemon, of `region`. Forgets daemons the
    /// membership no longer lists. Returns the sender this call passed over and how long it
    /// had been silent, so the shell can say so (a pass-over of a live sender costs a
    /// duplicate shipment, and an operator should see how often that happens).
    pub fn electable(
        &mut self,
        members: &mut [Member<'_>],
        me: &str,
        region: &str,
        now: Micros,
        stale: Micros,
        kept: Micros,
    ) -> Option<PassedOver> {
        let mut passed = None;
        self.forget(members);
        // This daemon's own stall (descheduled, paused, its loop late): a call more than
        // half the bound after the last one means it was not listening, and what its sender
        // sent meanwhile may sit unread in its socket. Silence is counted only while it
        // listens: the sender it counts on gets a grace period from now, as a new one does.
        let stalled = self
            .looked_at
            .is_some_and(|t| now.saturating_sub(t) > stale / 2);
        self.looked_at = Some(now);
        let heard = |h: &HashMap<String, Micros>, id: &str| h.get(id).copied().unwrap_or(0);
        for m in members.iter_mut() {
            if let Some(&at) = self.passed_over.get(m.node_id)
                && heard(&self.heard, m.node_id) <= at
                && m.node_id != me
            {
                m.relays = false;
            }
        }
        // This region's sender: heard lately, or counted on only lately (a grace period
        // from the moment this daemon starts counting on it). Each one passed over hands
        // the watch to the next, which starts its own grace period. One never heard from
        // is left to the membership: it may not know this daemon yet (a daemon that just
        // joined), and passing it over would make every newcomer a sender for a moment;
        // only a sender that went silent is passed over.
        if let Some(g) = relay::gateway(members, region).filter(|g| *g != me) {
            let since = match &self.counting_on {
                Some((n, t)) if n == g && !stalled => *t,
                _ => {
                    self.counting_on = Some((g.to_string(), now));
                    now
                }
            };
            let silent_for = self
                .heard
                .get(g)
                .map(|h| now.saturating_sub((*h).max(since)))
                .filter(|s| *s > stale);
            if let Some(silent_for) = silent_for {
                passed = Some(PassedOver {
                    node_id: g.to_string(),
                    silent_for,
                });
                self.passed_over.insert(g.to_string(), now);
                for m in members.iter_mut().filter(|m| m.node_id == g) {
                    m.relays = false;
                }
                self.counting_on = relay::gateway(members, region).map(|n| (n.to_string(), now));
            }
        }
        for (r, (relayer, at)) in &self.relayers {
            if r == region || now.saturating_sub(*at) > kept {
                continue;
            }
            let listed = members
                .iter()
                .any(|m| m.region == r && m.node_id == relayer);
            if !listed {
                continue;
            }
            for m in members
                .iter_mut()
                .filter(|m| m.region == r && m.node_id != relayer)
            {
                m.relays = false;
            }
        }
        passed
    }

    /// The sender this daemon counts on, when the membership (`members`) no longer lists it
    /// and this watch has not passed it over. The membership's detector drops a live daemon
    /// when this one stalled or its gossip lagged, and it may drop this region's lower ids
    /// before the other regions' daemons: electing itself then makes a second sender that no
    /// pass-over explains. The shell puts the daemon returned back among the members it
    /// elects from, so that its silence is judged here, as a listed sender's is: silent past
    /// the bound, it is passed over (and counted) and not kept again. One never heard from is
    /// kept only for the grace period a new sender gets (`stale` from when this daemon began
    /// counting on it, or from the end of a stall of its own): after that the membership
    /// decides, as it does for a listed one.
    pub fn kept(&self, members: &[Member<'_>], now: Micros, stale: Micros) -> Option<&str> {
        let (g, since) = self.counting_on.as_ref()?;
        if members.iter().any(|m| m.node_id == g) {
            return None;
        }
        let keep = match self.heard.get(g) {
            Some(&heard) => self.passed_over.get(g).is_none_or(|&at| heard > at),
            None => {
                let stalled = self
                    .looked_at
                    .is_some_and(|t| now.saturating_sub(t) > stale / 2);
                stalled || now.saturating_sub(*since) <= stale
            }
        };
        keep.then_some(g.as_str())
    }

    /// Whether this daemon has passed `node_id` over (tests, metrics).
    pub fn is_passed_over(&self, node_id: &str) -> bool {
        self.passed_over.contains_key(node_id)
    }

    fn forget(&mut self, members: &[Member<'_>]) {
        let listed = |id: &str| members.iter().any(|m| m.node_id == id);
        self.heard.retain(|id, _| listed(id));
        self.passed_over.retain(|id, _| listed(id));
        self.relayers.retain(|_, (id, _)| listed(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Micros = 1_000;
    const SHIP: Micros = 1_000 * MS;

    fn m<'a>(node_id: &'a str, region: &'a str) -> Member<'a> {
        Member {
            node_id,
            region,
            relays: true,
            forwards: false,
        }
    }

    fn fleet() -> Vec<Member<'static>> {
        vec![
            m("a-1", "a"),
            m("a-2", "a"),
            m("a-3", "a"),
            m("b-1", "b"),
            m("b-2", "b"),
        ]
    }

    /// The gateways `me` elects at `now` (a's, b's).
    fn elect(w: &mut SenderWatch, me: &str, now: Micros) -> (String, String) {
        elect_passing(w, me, now).0
    }

    /// [`elect`], with the sender that call passed over.
    fn elect_passing(
        w: &mut SenderWatch,
        me: &str,
        now: Micros,
    ) -> ((String, String), Option<PassedOver>) {
        let mut ms = fleet();
        let passed = w.electable(&mut ms, me, "a", now, stale_after(SHIP), relayer_kept(SHIP));
        let g = |r| relay::gateway(&ms, r).unwrap_or("none").to_string();
        ((g("a"), g("b")), passed)
    }

    /// [`elect`] at `to`, after the calls a daemon's ship loop makes every eighth of an
    /// interval since `from` (a daemon that looks only now and then was not listening).
    fn elect_after(w: &mut SenderWatch, me: &str, from: Micros, to: Micros) -> (String, String) {
        let mut t = from;
        while t + SHIP / 8 < to {
            t += SHIP / 8;
            elect(w, me, t);
        }
        elect(w, me, to)
    }

    #[test]
    fn a_silent_sender_is_passed_over_within_one_interval_and_back_once_heard() {
        let mut w = SenderWatch::default();
        // a-3 starts counting on a-1 at 0 and hears its beacons every 250 ms.
        for t in 0..8 {
            w.heard("a-1", t * beacon_every(SHIP));
            assert_eq!(elect(&mut w, "a-3", t * beacon_every(SHIP)).0, "a-1");
        }
        // a-1's last beacon came at 1,750 ms; silence up to the bound keeps it.
        let last = 7 * beacon_every(SHIP);
        assert_eq!(
            elect_after(&mut w, "a-3", last, last + stale_after(SHIP)).0,
            "a-1"
        );
        // Past it, a-2 is elected: within one interval of the last sign of life. The call
        // that passes a-1 over says so, with the silence it saw; the next ones do not.
        let t = last + stale_after(SHIP) + MS;
        let (gateways, passed) = elect_passing(&mut w, "a-3", t);
        assert_eq!(
            passed,
            Some(PassedOver {
                node_id: "a-1".into(),
                silent_for: stale_after(SHIP) + MS
            })
        );
        assert_eq!(gateways.0, "a-2");
        assert!(w.is_passed_over("a-1"));
        assert_eq!(elect_passing(&mut w, "a-3", t + MS).1, None);
        assert_eq!(elect(&mut w, "a-3", t).0, "a-2");
        // a-2 now has its own grace period: not passed over for a-1's silence.
        assert_eq!(elect(&mut w, "a-3", t + stale_after(SHIP)).0, "a-2");
        w.heard("a-2", t + stale_after(SHIP));
        assert_eq!(elect(&mut w, "a-3", t + 2 * stale_after(SHIP)).0, "a-2");
        // a-1 is heard again (it was only slow, or restarted): elected again at once.
        w.heard("a-1", t + 2 * stale_after(SHIP) + MS);
        assert_eq!(
            elect(&mut w, "a-3", t + 2 * stale_after(SHIP) + MS).0,
            "a-1"
        );
    }

    #[test]
    fn a_daemon_that_was_not_listening_does_not_take_its_stall_for_the_senders_silence() {
        // a-3 hears a-1's beacons every 250 ms and looks every 125 ms, up to 1 s.
        let listen = |w: &mut SenderWatch| {
            for t in 0..=8 {
                if t % 2 == 0 {
                    w.heard("a-1", t * SHIP / 8);
                }
                assert_eq!(elect(w, "a-3", t * SHIP / 8).0, "a-1");
            }
        };
        // Then a-3 stalls (descheduled, paused) until 2.5 s. Its next look finds a-1 silent
        // for 1.5 s, but a-3 was not listening and a-1's beacons may sit unread: not passed
        // over. They are read: a-1 stays.
        let back = SHIP + 3 * SHIP / 2;
        let mut w = SenderWatch::default();
        listen(&mut w);
        assert_eq!(elect(&mut w, "a-3", back).0, "a-1");
        assert!(!w.is_passed_over("a-1"));
        w.heard("a-1", back + MS);
        assert_eq!(
            elect_after(&mut w, "a-3", back, back + stale_after(SHIP)).0,
            "a-1"
        );
        // Had a-1 died meanwhile, nothing is heard after the stall: a-1 is passed over once
        // a-3 has listened for the bound.
        let mut w = SenderWatch::default();
        listen(&mut w);
        assert_eq!(elect(&mut w, "a-3", back).0, "a-1");
        assert_eq!(
            elect_after(&mut w, "a-3", back, back + stale_after(SHIP)).0,
            "a-1"
        );
        let passed = elect_passing(&mut w, "a-3", back + stale_after(SHIP) + MS).1;
        assert_eq!(passed.map(|p| p.node_id), Some("a-1".to_string()));
    }

    #[test]
    fn the_next_daemon_takes_over_for_itself_and_never_passes_itself_over() {
        let mut w = SenderWatch::default();
        assert_eq!(elect(&mut w, "a-2", 0).0, "a-1");
        // Never heard from (it may not know a-2 yet): left to the membership.
        assert_eq!(elect(&mut w, "a-2", 10 * SHIP).0, "a-1");
        // Heard, then silent: a-2 elects itself.
        w.heard("a-1", 10 * SHIP);
        assert_eq!(
            elect_after(&mut w, "a-2", 10 * SHIP, 10 * SHIP + stale_after(SHIP)).0,
            "a-1"
        );
        assert_eq!(
            elect(&mut w, "a-2", 10 * SHIP + stale_after(SHIP) + 1).0,
            "a-2"
        );
        // Silence of its own is not a thing: it stays elected.
        assert_eq!(elect(&mut w, "a-2", 20 * SHIP).0, "a-2");
        // The lowest id never watches anyone.
        let mut w = SenderWatch::default();
        assert_eq!(elect(&mut w, "a-1", 10 * SHIP).0, "a-1");
    }

    /// The gateways `me` elects at `now` when the membership lists only `listed`, with the
    /// sender the watch keeps put back, as the shell does.
    fn elect_listed(w: &mut SenderWatch, me: &str, listed: &[&str], now: Micros) -> String {
        let mut ms: Vec<Member<'_>> = fleet()
            .into_iter()
            .filter(|m| listed.contains(&m.node_id))
            .collect();
        let kept = w.kept(&ms, now, stale_after(SHIP)).map(str::to_string);
        if let Some(k) = &kept {
            let back = fleet().into_iter().find(|m| m.node_id == k.as_str());
            ms.extend(back);
        }
        w.electable(&mut ms, me, "a", now, stale_after(SHIP), relayer_kept(SHIP));
        relay::gateway(&ms, "a").unwrap_or("none").to_string()
    }

    #[test]
    fn a_sender_still_heard_is_kept_when_the_membership_drops_it() {
        // a-3 counts on a-1 and hears its beacons every 250 ms, up to 1 s.
        let all = ["a-1", "a-2", "a-3", "b-1", "b-2"];
        let mut w = SenderWatch::default();
        for t in 0..=4 {
            w.heard("a-1", t * beacon_every(SHIP));
            assert_eq!(
                elect_listed(&mut w, "a-3", &all, t * beacon_every(SHIP)),
                "a-1"
            );
        }
        // a-3's membership drops a-1 and a-2 but not b's daemons (its detector ran late after
        // a stall of its own): a-1's beacons still arrive, so a-1 stays the sender, not a-3.
        let dropped = ["a-3", "b-1", "b-2"];
        let mut t = SHIP;
        while t < 3 * SHIP {
            t += SHIP / 8;
            if t.is_multiple_of(beacon_every(SHIP)) {
                w.heard("a-1", t);
            }
            assert_eq!(elect_listed(&mut w, "a-3", &dropped, t), "a-1", "at {t}");
        }
        assert!(!w.is_passed_over("a-1"));
        // a-1 falls silent: passed over after the bound, as a listed sender would be, and not
        // kept again; the membership decides from then on.
        let last = t - t % beacon_every(SHIP);
        let mut passed = None;
        while passed.is_none() {
            t += SHIP / 8;
            let mut ms: Vec<Member<'_>> = fleet()
                .into_iter()
                .filter(|m| dropped.contains(&m.node_id))
                .collect();
            if w.kept(&ms, t, stale_after(SHIP)).is_some() {
                ms.extend(fleet().into_iter().filter(|m| m.node_id == "a-1"));
            }
            passed = w.electable(
                &mut ms,
                "a-3",
                "a",
                t,
                stale_after(SHIP),
                relayer_kept(SHIP),
            );
        }
        assert!(t - last > stale_after(SHIP) && t - last <= stale_after(SHIP) + SHIP / 8);
        assert_eq!(elect_listed(&mut w, "a-3", &dropped, t + SHIP / 8), "a-3");
        // After a stall of a-3's own, the sender it counts on is kept for a fresh grace
        // period, even though its last beacon is older than the bound.
        let mut w = SenderWatch::default();
        w.heard("a-1", 0);
        assert_eq!(elect_listed(&mut w, "a-3", &all, 0), "a-1");
        let back = 2 * SHIP;
        assert_eq!(elect_listed(&mut w, "a-3", &dropped, back), "a-1");
        w.heard("a-1", back + MS);
        assert_eq!(
            elect_listed(&mut w, "a-3", &dropped, back + SHIP / 8),
            "a-1"
        );
        // One never heard from (it may not know a-3 yet) is kept for the grace period only;
        // then the membership decides.
        let mut w = SenderWatch::default();
        assert_eq!(elect_listed(&mut w, "a-3", &all, 0), "a-1");
        let mut t = 0;
        while t + SHIP / 8 <= stale_after(SHIP) {
            t += SHIP / 8;
            assert_eq!(elect_listed(&mut w, "a-3", &dropped, t), "a-1", "at {t}");
        }
        assert_eq!(elect_listed(&mut w, "a-3", &dropped, t + SHIP / 8), "a-3");
    }

    #[test]
    fn another_region_is_reached_through_the_daemon_that_relayed_from_it_lately() {
        let mut w = SenderWatch::default();
        assert_eq!(elect(&mut w, "a-1", 0).1, "b-1");
        // b-2 took over b's sending: b is reached through it for as long as it relays.
        w.relayed("b", "b-2", SHIP);
        assert_eq!(elect(&mut w, "a-1", SHIP).1, "b-2");
        assert_eq!(elect(&mut w, "a-1", SHIP + relayer_kept(SHIP)).1, "b-2");
        // b-2 stopped relaying (b-1 is back and sends, or b-2 died): the membership again.
        assert_eq!(elect(&mut w, "a-1", SHIP + relayer_kept(SHIP) + 1).1, "b-1");
        // A relayer the membership no longer lists is forgotten.
        w.relayed("b", "b-9", 5 * SHIP);
        assert_eq!(elect(&mut w, "a-1", 5 * SHIP).1, "b-1");
        assert!(w.relayers.is_empty());
        // A late, older packet of another relayer does not replace a newer one.
        w.relayed("b", "b-2", 6 * SHIP);
        w.relayed("b", "b-1", 6 * SHIP - 1);
        assert_eq!(elect(&mut w, "a-1", 6 * SHIP).1, "b-2");
    }

    #[test]
    fn defaults_replace_a_dead_sender_within_one_interval() {
        let ship = 1_000 * MS;
        assert!(stale_after(ship) + beacon_every(ship) / 2 <= ship);
        assert!(
            beacon_every(ship) * 2 < stale_after(ship),
            "two missed beacons are no death"
        );
        assert!(relayer_kept(ship) > 2 * ship);
    }
}
