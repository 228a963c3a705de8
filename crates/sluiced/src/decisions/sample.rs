//! Which checks the decision log keeps: sans-IO (`now` is an argument, the seed is given), so
//! tests drive it on a manual clock and the daemon only calls it.
//!
//! Every identity has its own budget, so one client hammering the daemon spends its own
//! budget and nobody else's. Budgets are token buckets of the core's own algorithm
//! ([`sluice_core::algo`]) held in a fixed table of slots (memory does not grow with the
//! number of identities). An identity hashes (seeded) to two slots, is kept while either has
//! room, and charges both (a count-min sketch of budgets): alone on its slots it gets
//! exactly its budget, and a quiet identity sharing one slot with an abuser still has the
//! other.
//! Allowed checks are first thinned by `fraction`; refusals (enforced refusals and shadow
//! would-refusals) are never thinned, only capped, by budgets of their own, so a flood of
//! allowed checks cannot push refusals out. A total budget per kind bounds what reaches disk.
//!
//! A kept check carries a weight: the checks of its identity and kind (allowed, or refusal)
//! it stands for, itself and those not kept since the identity's last kept one, so a replay
//! of the log (what-if) counts what happened rather than what was written. Each slot counts
//! the checks not kept of the identities hashing to it; a kept check's weight is one more
//! than the smaller of its two slots' counts, which are then lowered by that much (a
//! count-min sketch with conservative update): exact for an identity that shares one of its
//! slots with no identity that has checks not yet accounted for, an over-estimate otherwise.

use sluice_core::Micros;
use sluice_core::algo::{Params, Rate, Remote, Request, State, evaluate, take};
use std::hash::{BuildHasher, Hasher};

/// One budget: `rate`, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Records a period.
    pub rate: Rate,
    /// Records at once.
    pub burst: u64,
}

impl Budget {
    fn params(&self) -> Params {
        Params::TokenBucket {
            rate: self.rate,
            burst: self.burst,
        }
    }
}

/// What the sampler may keep.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleConfig {
    /// Share of allowed checks considered at all, parts per million.
    pub fraction_ppm: u32,
    /// Allowed checks kept per identity.
    pub allowed: Budget,
    /// Refusals and would-refusals kept per identity.
    pub refused: Budget,
    /// Allowed checks kept in all.
    pub allowed_total: Budget,
    /// Refusals kept in all.
    pub refused_total: Budget,
    /// Slots of each per-identity table.
    pub slots: usize,
}

/// Why a check was or was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write it.
    Keep,
    /// Thinned out by `fraction` (allowed checks only).
    Thinned,
    /// Its identity's budget is spent.
    IdentityCapped,
    /// The total budget is spent.
    TotalCapped,
}

/// Budgets of one kind: a slot table and the total.
#[derive(Debug)]
struct Table {
    per_identity: Params,
    slots: Vec<Option<State>>,
    /// Checks not kept since their identity's last kept one, per slot.
    skipped: Vec<u64>,
    total_params: Params,
    total: Option<State>,
}

impl Table {
    fn new(per: Budget, total: Budget, slots: usize) -> Table {
        Table {
            per_identity: per.params(),
            slots: vec![None; slots.max(2)],
            skipped: vec![0; slots.max(2)],
            total_params: total.params(),
            total: None,
        }
    }

    /// The identity's two slots.
    fn slots_of(&self, h: u64) -> (usize, usize) {
        let n = self.slots.len() as u64;
        let a = ((h & 0xffff_ffff) % n) as usize;
        let mut b = ((h >> 32) % n) as usize;
        if b == a {
            b = (a + 1) % self.slots.len();
        }
        (a, b)
    }

    /// A check of the identity hashing to `h` that is not kept (thinned or capped).
    fn skip(&mut self, h: u64) {
        let (a, b) = self.slots_of(h);
        for slot in [a, b] {
            self.skipped[slot] = self.skipped[slot].saturating_add(1);
        }
    }

    /// Whether to keep a check, and if so the checks it stands for.
    fn spend(&mut self, h: u64, now: Micros) -> (Verdict, u64) {
        let v = self.budgets(h, now);
        if v != Verdict::Keep {
            self.skip(h);
            return (v, 0);
        }
        let (a, b) = self.slots_of(h);
        let before = self.skipped[a].min(self.skipped[b]);
        for slot in [a, b] {
            self.skipped[slot] -= before;
        }
        (v, before.saturating_add(1))
    }

    fn budgets(&mut self, h: u64, now: Micros) -> Verdict {
        let req = Request {
            now,
            cost: 1,
            request_id: "",
            remote: Remote::default(),
        };
        let (a, b) = self.slots_of(h);
        let fits = |s: &Option<State>| evaluate(&self.per_identity, s.as_ref(), &req).allowed;
        // Kept if either slot has room; both are charged, so an identity alone on its slots
        // gets exactly its budget, and one sharing a slot with an abuser still has the other.
        if !fits(&self.slots[a]) && !fits(&self.slots[b]) {
            return Verdict::IdentityCapped;
        }
        if !evaluate(&self.total_params, self.total.as_ref(), &req).allowed {
            return Verdict::TotalCapped;
        }
        self.total = Some(take(&self.total_params, self.total.as_ref(), &req).0);
        for slot in [a, b] {
            self.slots[slot] = Some(take(&self.per_identity, self.slots[slot].as_ref(), &req).0);
        }
        Verdict::Keep
    }
}

/// The sampler's state: two tables (allowed, refused) and the seed of its hashes.
#[derive(Debug)]
pub struct Sampler {
    fraction_ppm: u32,
    seed: foldhash::fast::FixedState,
    allowed: Table,
    refused: Table,
}

impl Sampler {
    /// A sampler with `seed` (the daemon draws one at start; tests fix it).
    pub fn new(cfg: &SampleConfig, seed: u64) -> Sampler {
        Sampler {
            fraction_ppm: cfg.fraction_ppm.min(1_000_000),
            seed: foldhash::fast::FixedState::with_seed(seed),
            allowed: Table::new(cfg.allowed, cfg.allowed_total, cfg.slots),
            refused: Table::new(cfg.refused, cfg.refused_total, cfg.slots),
        }
    }

    fn hash(&self, tag: u8, bytes: &[u8]) -> u64 {
        let mut h = self.seed.build_hasher();
        h.write_u8(tag);
        h.write(bytes);
        h.finish()
    }

    /// Whether to keep a check of `identity` at `now`. `refused` is an enforced refusal or a
    /// shadow would-refusal; `nonce` differs per check (the request sequence) and thins
    /// allowed checks evenly.
    pub fn decide(&mut self, identity: &str, refused: bool, nonce: u64, now: Micros) -> Verdict {
        self.sample(identity, refused, nonce, now).0
    }

    /// [`Sampler::decide`] with the kept check's weight: the checks of its identity and kind
    /// it stands for (itself and those not kept since the last kept one); 0 when not kept.
    pub fn sample(
        &mut self,
        identity: &str,
        refused: bool,
        nonce: u64,
        now: Micros,
    ) -> (Verdict, u64) {
        let h = self.hash(0, identity.as_bytes());
        if refused {
            return self.refused.spend(h, now);
        }
        if self.fraction_ppm < 1_000_000
            && self.hash(1, &nonce.to_le_bytes()) % 1_000_000 >= u64::from(self.fraction_ppm)
        {
            self.allowed.skip(h);
            return (Verdict::Thinned, 0);
        }
        self.allowed.spend(h, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::algo::parse_rate;

    const S: Micros = 1_000_000;

    fn budget(rate: &str, burst: u64) -> Budget {
        Budget {
            rate: parse_rate(rate).expect("rate"),
            burst,
        }
    }

    fn cfg() -> SampleConfig {
        SampleConfig {
            fraction_ppm: 1_000_000,
            allowed: budget("1/1s", 5),
            refused: budget("10/1s", 20),
            allowed_total: budget("500/1s", 500),
            refused_total: budget("1000/1s", 1000),
            slots: 4096,
        }
    }

    /// One abuser at 1,000 checks a second and a quiet identity at one a second, on a
    /// manual clock for 60 s: every quiet check is kept, the abuser's keep at its budget.
    #[test]
    fn an_abuser_at_1000x_cannot_push_out_a_quiet_identity() {
        for seed in 0..20 {
            let mut s = Sampler::new(&cfg(), seed);
            let (mut quiet, mut abuser) = (0, 0);
            let t0 = 1_700_000_000 * S;
            for ms in 0..60_000u64 {
                let now = t0 + ms * 1000;
                if s.decide("api|key=abuser", false, ms, now) == Verdict::Keep {
                    abuser += 1;
                }
                if ms % 1000 == 0 && s.decide("api|key=quiet", false, ms, now) == Verdict::Keep {
                    quiet += 1;
                }
            }
            assert_eq!(quiet, 60, "seed {seed}: every quiet check kept");
            // Its burst, then one a second: 60,000 checks leave about 65 records.
            assert!(
                (60..=70).contains(&abuser),
                "seed {seed}: abuser kept {abuser}"
            );
        }
    }

    fn slots(s: &Sampler, identity: &str, n: u64) -> (u64, u64) {
        let h = s.hash(0, identity.as_bytes());
        let a = (h & 0xffff_ffff) % n;
        let b = (h >> 32) % n;
        (a, if b == a { (a + 1) % n } else { b })
    }

    /// The collision the two slots are for: a quiet identity sharing one of its slots with
    /// the abuser still keeps every check.
    #[test]
    fn a_quiet_identity_sharing_a_slot_with_the_abuser_keeps_its_checks() {
        let mut c = cfg();
        c.slots = 64;
        let mut s = Sampler::new(&c, 11);
        let abuser = slots(&s, "api|key=abuser", 64);
        let shares = |q: (u64, u64)| {
            let shared = [q.0, q.1]
                .iter()
                .filter(|x| **x == abuser.0 || **x == abuser.1)
                .count();
            shared == 1
        };
        let quiet = (0..10_000)
            .map(|i| format!("api|key=quiet{i}"))
            .find(|q| shares(slots(&s, q, 64)))
            .expect("an identity sharing one slot");
        let t0 = 1_700_000_000 * S;
        let mut kept = 0;
        for ms in 0..30_000u64 {
            let now = t0 + ms * 1000;
            s.decide("api|key=abuser", false, ms, now);
            if ms % 1000 == 0 && s.decide(&quiet, false, ms, now) == Verdict::Keep {
                kept += 1;
            }
        }
        assert_eq!(kept, 30, "{quiet} shares a slot with the abuser");
    }

    /// Refusals are kept however many allowed checks there are, up to their own cap.
    #[test]
    fn refusals_are_always_kept_up_to_the_cap() {
        let mut c = cfg();
        c.fraction_ppm = 1_000; // one allowed check in 1,000
        let mut s = Sampler::new(&c, 7);
        let now = 1_700_000_000 * S;
        // Allowed checks of many identities spend the allowed budgets only.
        for i in 0..10_000u64 {
            s.decide(&format!("api|key=k{i}"), false, i, now);
        }
        let kept = (0..20)
            .filter(|&i| s.decide("api|key=bad", true, i, now) == Verdict::Keep)
            .count();
        assert_eq!(kept, 20, "every refusal within the burst is kept");
        assert_eq!(
            s.decide("api|key=bad", true, 21, now),
            Verdict::IdentityCapped,
            "then the identity's cap"
        );
        // A second later ten more fit (10/1s).
        let later = (0..15)
            .filter(|&i| s.decide("api|key=bad", true, 100 + i, now + S) == Verdict::Keep)
            .count();
        assert_eq!(later, 10);
        // Another identity's refusals are not affected by the first one's.
        assert_eq!(s.decide("api|key=other", true, 0, now + S), Verdict::Keep);
    }

    /// The weights of an identity's kept checks add up to every check it made but those
    /// after its last kept one, exactly, for an abuser (allowed checks and refusals, each
    /// kind on its own) and a quiet identity side by side; with fraction thinning too.
    #[test]
    fn weights_add_up_to_the_checks_they_stand_for() {
        for fraction_ppm in [1_000_000, 300_000] {
            let mut c = cfg();
            c.fraction_ppm = fraction_ppm;
            let mut s = Sampler::new(&c, 5);
            let t0 = 1_700_000_000 * S;
            // Per stream: (weights summed, checks made, checks since its last kept one, kept).
            let mut tally = [(0u64, 0u64, 0u64, 0u64); 3];
            let mut nonce = 0;
            for ms in 0..20_000u64 {
                let now = t0 + ms * 1000;
                let mut offer = |i: usize, identity: &str, refused: bool| {
                    nonce += 1;
                    let (v, w) = s.sample(identity, refused, nonce, now);
                    let t = &mut tally[i];
                    t.0 += w;
                    t.1 += 1;
                    t.2 = if v == Verdict::Keep { 0 } else { t.2 + 1 };
                    t.3 += u64::from(v == Verdict::Keep);
                };
                offer(0, "api|key=abuser", false);
                offer(1, "api|key=abuser", true);
                if ms % 100 == 0 {
                    offer(2, "api|key=quiet", false);
                }
            }
            for (i, (weights, made, tail, kept)) in tally.into_iter().enumerate() {
                assert_eq!(weights, made - tail, "{fraction_ppm}: stream {i}");
                assert!(
                    kept < made / 4,
                    "{fraction_ppm}: stream {i} kept {kept} of {made}"
                );
            }
        }
    }

    #[test]
    fn the_total_caps_many_identities() {
        let mut c = cfg();
        c.allowed_total = budget("10/1s", 10);
        let mut s = Sampler::new(&c, 1);
        let now = 1_700_000_000 * S;
        let kept = (0..100u64)
            .filter(|&i| s.decide(&format!("api|key=k{i}"), false, i, now) == Verdict::Keep)
            .count();
        assert_eq!(kept, 10);
        assert_eq!(
            s.decide("api|key=new", false, 999, now),
            Verdict::TotalCapped
        );
        // Refusals have their own total.
        assert_eq!(s.decide("api|key=new", true, 999, now), Verdict::Keep);
    }

    #[test]
    fn fraction_thins_allowed_checks_evenly() {
        let mut c = cfg();
        c.fraction_ppm = 100_000; // 10 %
        c.allowed = budget("1000000/1s", 1_000_000);
        c.allowed_total = budget("1000000/1s", 1_000_000);
        let mut s = Sampler::new(&c, 3);
        let now = 1_700_000_000 * S;
        let kept = (0..10_000u64)
            .filter(|&i| s.decide("api|key=a", false, i, now) == Verdict::Keep)
            .count();
        assert!(
            (800..=1200).contains(&kept),
            "kept {kept} of 10,000 at 10 %"
        );
    }
}
