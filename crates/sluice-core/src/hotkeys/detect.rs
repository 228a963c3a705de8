//! The hot-key detector of `lease: auto`: a count-min sketch of requests per key over the
//! last second, in fixed memory however many keys a daemon sees.
//!
//! A count-min sketch never under-counts, so a hot key is never missed; it may over-count a
//! cold key that shares cells with hot ones, which only puts that key on the leasing path
//! (still exact in total: leased units leave the shared count before they are spent).
//! Conservative update (raise only the cells at the minimum) keeps that rare. Counts live in
//! two one-second epochs; the rate is the current epoch plus the previous one weighted by how
//! much of it still lies in the last second, the sliding-window estimate.

use crate::time::{Micros, SECOND};

const ROWS: usize = 4;
const WIDTH: usize = 1024;

/// Requests per key and second, approximately, in 2 × 16 KiB.
#[derive(Debug, Clone)]
pub struct Detector {
    cur: Box<[[u32; WIDTH]; ROWS]>,
    prev: Box<[[u32; WIDTH]; ROWS]>,
    epoch: Micros,
}

impl Default for Detector {
    fn default() -> Detector {
        Detector::new()
    }
}

fn cells(h: u64) -> [usize; ROWS] {
    // Double hashing: ROWS indices from two halves of one 64-bit hash.
    let a = h as u32 as usize;
    let b = ((h >> 32) as u32 as usize) | 1;
    let mut out = [0; ROWS];
    for (i, c) in out.iter_mut().enumerate() {
        *c = a.wrapping_add(i.wrapping_mul(b)) % WIDTH;
    }
    out
}

impl Detector {
    /// An empty sketch.
    pub fn new() -> Detector {
        Detector {
            cur: Box::new([[0; WIDTH]; ROWS]),
            prev: Box::new([[0; WIDTH]; ROWS]),
            epoch: 0,
        }
    }

    /// Starts a new epoch when `now` has left the current one.
    pub fn roll(&mut self, now: Micros) {
        if now < self.epoch + SECOND {
            return;
        }
        let fresh = now - now % SECOND;
        if fresh == self.epoch + SECOND {
            std::mem::swap(&mut self.cur, &mut self.prev);
        } else {
            *self.prev = [[0; WIDTH]; ROWS];
        }
        *self.cur = [[0; WIDTH]; ROWS];
        self.epoch = fresh;
    }

    /// Counts one request of the key hashed to `h` at `now`, and returns its estimated rate
    /// over the last second (requests per second, never below the true count).
    pub fn observe(&mut self, h: u64, now: Micros) -> u64 {
        self.roll(now);
        let cs = cells(h);
        let min = cs
            .iter()
            .enumerate()
            .map(|(r, &c)| self.cur[r][c])
            .min()
            .unwrap_or(0);
        for (r, &c) in cs.iter().enumerate() {
            if self.cur[r][c] == min {
                self.cur[r][c] = min.saturating_add(1);
            }
        }
        let cur = u64::from(min) + 1;
        let prev = cs
            .iter()
            .enumerate()
            .map(|(r, &c)| self.prev[r][c])
            .min()
            .unwrap_or(0);
        // An observation from before the epoch (read before a roll on another task) weighs
        // the previous epoch whole.
        let left = SECOND - now.saturating_sub(self.epoch).min(SECOND);
        cur + u64::from(prev) * left / SECOND
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_key_reads_its_rate() {
        let mut d = Detector::new();
        let mut last = 0;
        // 500 requests a second for three seconds.
        for i in 0..1_500u64 {
            last = d.observe(42, 10 * SECOND + i * 2_000);
        }
        assert!((450..=550).contains(&last), "{last}");
    }

    #[test]
    fn a_cold_key_beside_hot_ones_stays_cold() {
        let mut d = Detector::new();
        for i in 0..20_000u64 {
            d.observe(i % 10, SECOND + i * 50);
        }
        assert!(d.observe(0xdead_beef_0000_1234, SECOND + 20_000 * 50) < 50);
    }

    /// A request's `now` is read before it is routed; a sweep on another task can roll the
    /// epoch in between (the simulator executes a call after its arrival, the daemon routes
    /// it after reading its clock). Such a late observation still counts.
    #[test]
    fn an_observation_older_than_the_epoch_counts() {
        let mut d = Detector::new();
        for i in 0..600u64 {
            d.observe(9, SECOND + i * 1_000);
        }
        d.roll(2 * SECOND);
        let rate = d.observe(9, 2 * SECOND - 200);
        assert!(rate >= 601, "{rate}");
    }

    #[test]
    fn a_quiet_key_decays() {
        let mut d = Detector::new();
        for i in 0..1_000u64 {
            d.observe(7, SECOND + i * 1_000);
        }
        assert!(d.observe(7, 5 * SECOND) <= 1);
    }
}
