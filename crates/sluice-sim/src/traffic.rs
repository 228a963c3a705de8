//! Traffic generators: when requests arrive, which region they enter and which key they
//! carry.
//!
//! A generator's rate is piecewise constant (its steps, its spike windows, its start and
//! end), so arrivals are drawn exactly: a Poisson process consumes an exponential amount of
//! "rate × time" per arrival, a constant one consumes exactly 1, carried across the pieces.

use crate::rng::{Rng, Zipf, below_of};
use crate::scenario::{Arrivals, Keys, Traffic};
use sluice_core::Micros;
use sluice_core::matching::Descriptors;
use smallvec::SmallVec;
use std::collections::VecDeque;

const US: f64 = 1_000_000.0;

/// Arrivals drawn ahead at a time. Drawn together, their Zipf lookups and per-key reads
/// (cache misses over large key sets) overlap instead of stalling one request each.
const AHEAD: usize = 32;

/// One traffic generator's running state.
pub struct Generator {
    /// Its configuration.
    pub cfg: Traffic,
    rng: Rng,
    zipf: Option<Zipf>,
    /// Continuous position, µs (arrivals are its floor).
    pos: f64,
    rr: usize,
    /// What is kept per key, indexed by key.
    keys: Vec<KeyState>,
    /// Daemons per region, for the daemon draw made ahead.
    daemons: usize,
    /// Arrivals drawn ahead, oldest first, with their requests' draws.
    ahead: VecDeque<Ahead>,
    /// The stream ran out after the last arrival in `ahead`.
    ended: bool,
    /// Zipf draws of a batch being drawn, looked up after it (kept: no allocation per batch).
    zipf_coins: Vec<(u64, u64)>,
}

/// An arrival drawn ahead, with the draws its request makes, in the stream's order: the
/// arrival's time, then its region, daemon and key, then the next arrival's time.
#[derive(Clone, Debug)]
struct Ahead {
    at: Micros,
    /// The stream and position right after `at` was drawn: a request that finds every
    /// region down makes no draw, so the generator goes back there and draws again.
    rng: Rng,
    pos: f64,
    /// The bits of the region draw (Poisson arrivals), scaled once the count of regions up
    /// is known.
    region: u64,
    /// The bits of the daemon draw, scaled once the daemons up are known (0: none drawn).
    daemon: u64,
    key: u32,
}

/// An arrival's daemon, picked once the daemons up in its region are known: the draw scaled
/// to the daemons up (the same pick as [`Generator::pick_daemon`] when all are), or the
/// traffic's pinned daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DaemonDraw {
    bits: u64,
    pin: Option<usize>,
}

impl DaemonDraw {
    /// The daemon among `live` (one flag per daemon of the region), `None` when none is up.
    /// A pinned daemon that is down hands its requests to the first daemon up.
    pub fn pick(&self, live: &[bool]) -> Option<usize> {
        if let Some(p) = self.pin {
            return if live.get(p) == Some(&true) {
                Some(p)
            } else {
                live.iter().position(|u| *u)
            };
        }
        let up = live.iter().filter(|u| **u).count();
        if up == 0 {
            return None;
        }
        let i = below_of(self.bits, up);
        live.iter()
            .enumerate()
            .filter(|(_, u)| **u)
            .nth(i)
            .map(|(d, _)| d)
    }
}

/// What a run keeps per key of a traffic, side by side: a request reads both, and over
/// 100,000 keys each separate table cost a cache miss of its own.
#[derive(Clone, Debug, Default)]
struct KeyState {
    /// The key's descriptors, built on first use.
    descriptors: Option<Descriptors>,
    /// The ground truth's counters the key reached: `(tag, id)` pairs (the engine's
    /// `measure`).
    truth: SmallVec<[(u32, u32); 4]>,
}

impl Generator {
    /// A generator with its own random stream, for regions of `daemons` daemons.
    pub fn new(cfg: Traffic, rng: Rng, daemons: usize) -> Generator {
        let zipf = match &cfg.keys {
            Keys::Zipf(n, s, _) => Some(Zipf::new(*n, *s)),
            _ => None,
        };
        Generator {
            pos: cfg.start as f64,
            cfg,
            rng,
            zipf,
            rr: 0,
            keys: Vec::new(),
            daemons,
            ahead: VecDeque::with_capacity(AHEAD),
            ended: false,
            zipf_coins: Vec::with_capacity(AHEAD),
        }
    }

    /// The time of the next arrival, or `None` when the generator is done.
    pub fn next_at(&mut self) -> Option<Micros> {
        if self.ahead.is_empty() && !self.ended {
            self.fill();
        }
        self.ahead.front().map(|a| a.at)
    }

    /// Takes the arrival [`Generator::next_at`] gave, given the regions up at its time:
    /// `(region, daemon, key)`, or `None` when every region is down. The same draws, in the
    /// same order, as [`Generator::next_arrival`], [`Generator::pick_region`],
    /// [`Generator::pick_daemon`] and [`Generator::pick_key`] one request at a time.
    pub fn arrive(&mut self, up: &[bool]) -> Option<(usize, DaemonDraw, usize)> {
        let a = self.ahead.pop_front()?;
        let drawn = a.region;
        let daemon = DaemonDraw {
            bits: a.daemon,
            pin: self.cfg.daemon,
        };
        match self.region_among(a.at, up, |_, n| below_of(drawn, n)) {
            Some(r) => Some((r, daemon, a.key as usize)),
            None => {
                // This request draws nothing: undo its draws and everything drawn after.
                self.rng = a.rng;
                self.pos = a.pos;
                self.ahead.clear();
                self.ended = false;
                None
            }
        }
    }

    /// Draws the next [`AHEAD`] arrivals and their requests' draws, assuming some region is
    /// up (undone by [`Generator::arrive`] otherwise), then reads their keys' state. The
    /// draws come first, in the stream's order; the Zipf table and key lookups follow in
    /// loops of independent reads, so their cache misses overlap.
    fn fill(&mut self) {
        for _ in 0..AHEAD {
            let Some(at) = self.next_arrival() else {
                self.ended = true;
                break;
            };
            let (rng, pos) = (self.rng.clone(), self.pos);
            let region = match self.cfg.arrivals {
                Arrivals::Poisson => self.rng.next_u64(),
                Arrivals::Constant => 0,
            };
            // `pick_daemon`'s draw, kept as bits (a pinned traffic draws none).
            let daemon = if self.daemons == 1 || self.cfg.daemon.is_some() {
                0
            } else {
                self.rng.next_u64()
            };
            let key = match (&self.cfg.keys, &self.zipf) {
                (_, Some(_)) => {
                    // The pick now, the coin in `zipf_coins`; looked up below.
                    let pick = self.rng.next_u64();
                    self.zipf_coins.push((pick, self.rng.next_u64()));
                    0
                }
                (Keys::Uniform(n, _), _) => self.rng.below(*n) as u32,
                _ => 0,
            };
            self.ahead.push_back(Ahead {
                at,
                rng,
                pos,
                region,
                daemon,
                key,
            });
        }
        if let Some(z) = &self.zipf {
            for (a, (pick, coin)) in self.ahead.iter_mut().zip(self.zipf_coins.drain(..)) {
                a.key = z.sample_of(pick, coin) as u32;
            }
        }
        // Touch what the requests will read, all at once.
        if let Some(max) = self.ahead.iter().map(|a| a.key).max() {
            self.grow(max as usize);
        }
        let mut sum = 0usize;
        for a in &self.ahead {
            let k = &self.keys[a.key as usize];
            sum = sum.wrapping_add(k.truth.len());
            if let Some(d) = &k.descriptors {
                for (n, v) in d.iter() {
                    sum = sum
                        .wrapping_add(usize::from(n.as_bytes().first().copied().unwrap_or(0)))
                        .wrapping_add(usize::from(v.as_bytes().first().copied().unwrap_or(0)));
                }
            }
        }
        std::hint::black_box(sum);
    }

    /// Requests per second at `t` (steps, spike, start and end applied).
    pub fn rate_at(&self, t: f64) -> f64 {
        if t < self.cfg.start as f64 || t >= self.cfg.end as f64 {
            return 0.0;
        }
        let mut r = self.cfg.rate;
        for (at, rate) in &self.cfg.steps {
            if (*at as f64) <= t {
                r = *rate;
            }
        }
        if let Some(s) = self.cfg.spike
            && (t % s.period as f64) < s.first as f64
        {
            r *= s.factor;
        }
        r
    }

    /// The next instant after `t` where the rate may change.
    fn next_change(&self, t: f64) -> f64 {
        let mut next = self.cfg.end as f64;
        if t < self.cfg.start as f64 {
            next = next.min(self.cfg.start as f64);
        }
        for (at, _) in &self.cfg.steps {
            let at = *at as f64;
            if at > t {
                next = next.min(at);
            }
        }
        if let Some(s) = self.cfg.spike {
            let period = s.period as f64;
            let base = t - t % period;
            let b = if t - base < s.first as f64 {
                base + s.first as f64
            } else {
                base + period
            };
            next = next.min(if b > t { b } else { t + 1.0 });
        }
        next
    }

    /// The next arrival time, or `None` when the generator is done.
    pub fn next_arrival(&mut self) -> Option<Micros> {
        let mut need = match self.cfg.arrivals {
            Arrivals::Poisson => self.rng.exp1(),
            Arrivals::Constant => 1.0,
        };
        let end = self.cfg.end as f64;
        let mut t = self.pos;
        loop {
            if t >= end {
                self.pos = end;
                return None;
            }
            let r = self.rate_at(t);
            let seg_end = self.next_change(t).min(end);
            if r > 0.0 {
                let dt = need / r * US;
                if t + dt < seg_end {
                    self.pos = t + dt;
                    return Some(self.pos as Micros);
                }
                need -= r * (seg_end - t) / US;
            }
            t = seg_end;
        }
    }

    /// The regions the traffic enters at `t` (its moves applied).
    pub fn regions_at(&self, t: Micros) -> &[usize] {
        let mut regs = &self.cfg.regions;
        for (at, r) in &self.cfg.moves {
            if *at <= t {
                regs = r;
            }
        }
        regs
    }

    /// Picks the region of an arrival at `t` among those up: the generator's own regions,
    /// or when all of them are down, any region that is up (its traffic moves to the
    /// survivors). `None` when every region is down.
    pub fn pick_region(&mut self, t: Micros, up: &[bool]) -> Option<usize> {
        self.region_among(t, up, |rng, n| rng.below(n))
    }

    /// [`Generator::pick_region`], a Poisson arrival's choice among `n` regions up made by
    /// `draw` (only called when some region is up).
    fn region_among(
        &mut self,
        t: Micros,
        up: &[bool],
        draw: impl FnOnce(&mut Rng, usize) -> usize,
    ) -> Option<usize> {
        // Counted, then indexed, rather than collected: one arrival allocates nothing.
        let own = self.regions_at(t).iter().filter(|r| up[**r]).count();
        let n = if own > 0 {
            own
        } else {
            up.iter().filter(|u| **u).count()
        };
        if n == 0 {
            return None;
        }
        let i = match self.cfg.arrivals {
            Arrivals::Poisson => draw(&mut self.rng, n),
            Arrivals::Constant => {
                self.rr = self.rr.wrapping_add(1);
                self.rr % n
            }
        };
        if own > 0 {
            self.regions_at(t).iter().copied().filter(|r| up[*r]).nth(i)
        } else {
            (0..up.len()).filter(|r| up[*r]).nth(i)
        }
    }

    /// Picks a daemon of a region with `n` daemons.
    pub fn pick_daemon(&mut self, n: usize) -> usize {
        if n == 1 { 0 } else { self.rng.below(n) }
    }

    /// Picks a key index.
    pub fn pick_key(&mut self) -> usize {
        match (&self.cfg.keys, &self.zipf) {
            (_, Some(z)) => z.sample(&mut self.rng),
            (Keys::Uniform(n, _), _) => self.rng.below(*n),
            _ => 0,
        }
    }

    /// Makes room for key `i`.
    fn grow(&mut self, i: usize) {
        if i >= self.keys.len() {
            self.keys
                .resize(self.cfg.keys.len().max(i + 1), KeyState::default());
        }
    }

    /// The descriptors of key `i` (built once per key).
    pub fn descriptors(&mut self, i: usize) -> &Descriptors {
        self.grow(i);
        let cfg = &self.cfg;
        self.keys[i].descriptors.get_or_insert_with(|| {
            let mut d = cfg.descriptors.clone();
            d.push((cfg.key_field.clone(), cfg.keys.value(i)));
            // Checked at load with the longest key value: valid.
            Descriptors::new(d).unwrap_or_default()
        })
    }

    /// The ground truth's counters key `i` reached, `(tag, id)` pairs, for the engine to look
    /// up and extend.
    pub fn truth(&mut self, i: usize) -> &mut SmallVec<[(u32, u32); 4]> {
        self.grow(i);
        &mut self.keys[i].truth
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Spike;
    use sluice_core::time::SECOND;

    fn cfg(rate: f64, arrivals: Arrivals) -> Traffic {
        Traffic {
            name: "t".into(),
            regions: vec![0, 1],
            rate,
            arrivals,
            keys: Keys::One("k".into()),
            key_field: "api_key".into(),
            descriptors: vec![],
            cost: 1,
            start: 0,
            end: 100 * SECOND,
            spike: None,
            steps: vec![],
            moves: vec![],
            daemon: None,
        }
    }

    fn count(g: &mut Generator, from: Micros, to: Micros) -> usize {
        let mut n = 0;
        while let Some(t) = g.next_arrival() {
            if t >= from && t < to {
                n += 1;
            }
        }
        n
    }

    #[test]
    fn constant_and_poisson_rates() {
        let mut g = Generator::new(cfg(10.0, Arrivals::Constant), Rng::stream(1, 1), 1);
        assert_eq!(count(&mut g, 0, 100 * SECOND), 999);
        let mut g = Generator::new(cfg(10.0, Arrivals::Poisson), Rng::stream(1, 1), 1);
        let n = count(&mut g, 0, 100 * SECOND) as f64;
        assert!((n - 1000.0).abs() < 100.0, "{n}");
    }

    #[test]
    fn spikes_and_steps_shape_the_rate() {
        let mut c = cfg(10.0, Arrivals::Constant);
        c.spike = Some(Spike {
            factor: 10.0,
            first: 10 * SECOND,
            period: 50 * SECOND,
        });
        c.steps = vec![(60 * SECOND, 0.0)];
        let mut g = Generator::new(c, Rng::stream(1, 1), 1);
        let mut spike = 0;
        let mut calm = 0;
        while let Some(t) = g.next_arrival() {
            match t / SECOND {
                0..10 => spike += 1,
                10..50 => calm += 1,
                50..60 => spike += 1,
                _ => panic!("traffic after the step to 0 at {t}"),
            }
        }
        // 2 × 10 s at 100/s, 40 s at 10/s.
        assert!((spike as i64 - 2000).abs() <= 2, "{spike}");
        assert!((calm as i64 - 400).abs() <= 2, "{calm}");
    }

    #[test]
    fn traffic_moves_and_fails_over() {
        let mut c = cfg(1.0, Arrivals::Constant);
        c.moves = vec![(10 * SECOND, vec![1])];
        let mut g = Generator::new(c, Rng::stream(1, 1), 1);
        assert_eq!(g.pick_region(20 * SECOND, &[true, true]), Some(1));
        // Its region is down: it moves to a survivor.
        assert_eq!(g.pick_region(20 * SECOND, &[true, false]), Some(0));
        assert_eq!(g.pick_region(20 * SECOND, &[false, false]), None);
    }

    #[test]
    fn a_daemon_down_hands_its_requests_to_the_others() {
        let draw = DaemonDraw {
            bits: 3 << 62,
            pin: None,
        };
        // All up: the draw's own pick (`below_of(bits, 4)`); daemon 3 down: among 0, 1, 2.
        assert_eq!(draw.pick(&[true; 4]), Some(3));
        assert_eq!(draw.pick(&[true, true, true, false]), Some(2));
        assert_eq!(draw.pick(&[false; 4]), None);
        let pinned = DaemonDraw {
            bits: 0,
            pin: Some(2),
        };
        assert_eq!(pinned.pick(&[true; 4]), Some(2));
        assert_eq!(pinned.pick(&[false, true, false, true]), Some(1));
    }

    #[test]
    fn drawing_ahead_gives_the_same_draws() {
        let mut c = cfg(1000.0, Arrivals::Poisson);
        c.keys = Keys::Zipf(500, 1.1, "k".into());
        let mut ahead = Generator::new(c.clone(), Rng::stream(3, 1), 4);
        let mut one = Generator::new(c, Rng::stream(3, 1), 4);
        let mut n = 0;
        while let Some(t) = ahead.next_at() {
            // Every region down now and then: that request draws nothing.
            let up = match n % 7 {
                0 => [false, false],
                3 => [false, true],
                _ => [true, true],
            };
            let want = one.next_arrival().map(|t| {
                let r = one.pick_region(t, &up);
                let rest = r.map(|r| (r, one.pick_daemon(4), one.pick_key()));
                (t, rest)
            });
            let got = ahead
                .arrive(&up)
                .map(|(r, d, k)| (r, d.pick(&[true; 4]).unwrap_or(usize::MAX), k));
            assert_eq!(Some((t, got)), want, "arrival {n}");
            n += 1;
        }
        assert_eq!(one.next_arrival(), None);
        assert!(n > 90_000, "{n}");
    }
}
