//! Which key each request carries: one hot key, N keys drawn uniformly, or N keys drawn from
//! a Zipf(s) distribution (rank 1 the hottest), from the workspace's seeded generator so two
//! runs, against Sluice and against a peer, offer the same sequence.

use anyhow::{Context as _, bail};
use std::sync::Arc;

pub use sluice_rng::Rng;
use sluice_rng::Zipf;

/// Most keys a distribution may have (the Zipf alias table holds 16 bytes per key).
pub const MAX_KEYS: u64 = 10_000_000;

/// A key distribution, shared by every worker.
#[derive(Clone, Debug)]
pub enum Dist {
    /// Every request carries key 0.
    Hot,
    /// Keys `0..n`, equally likely.
    Uniform(u64),
    /// Keys `0..n`, key `k` with probability proportional to `1 / (k + 1)^s`.
    Zipf {
        /// The alias table, one draw per key.
        table: Arc<Zipf>,
        /// How many keys, for reports.
        keys: u64,
        /// The exponent, for reports.
        s: f64,
    },
}

impl Dist {
    /// Builds a distribution from its name (`hot`, `uniform`, `zipf`).
    pub fn new(name: &str, keys: u64, s: f64) -> anyhow::Result<Dist> {
        if keys == 0 || keys > MAX_KEYS {
            bail!("--keys must be 1 to {MAX_KEYS}, got {keys}");
        }
        match name {
            "hot" => Ok(Dist::Hot),
            "uniform" => Ok(Dist::Uniform(keys)),
            "zipf" => {
                if !(s.is_finite() && s > 0.0) {
                    bail!("--zipf-s must be a positive number, got {s}");
                }
                let n = usize::try_from(keys).context("--keys does not fit in memory")?;
                Ok(Dist::Zipf {
                    table: Arc::new(Zipf::new(n, s)),
                    keys,
                    s,
                })
            }
            other => bail!("unknown distribution {other:?}: expected hot | uniform | zipf"),
        }
    }

    /// Draws a key index.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            Dist::Hot => 0,
            Dist::Uniform(n) => rng.range(0, n - 1),
            Dist::Zipf { table, .. } => table.sample(rng) as u64,
        }
    }

    /// The name, for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Dist::Hot => "hot",
            Dist::Uniform(_) => "uniform",
            Dist::Zipf { .. } => "zipf",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(d: &Dist, n: usize, draws: usize) -> Vec<usize> {
        let mut rng = Rng::stream(7, 1);
        let mut h = vec![0; n];
        for _ in 0..draws {
            h[d.sample(&mut rng) as usize] += 1;
        }
        h
    }

    #[test]
    fn hot_is_one_key_and_uniform_is_flat() {
        assert_eq!(
            histogram(&Dist::new("hot", 10, 1.0).expect("hot"), 10, 1000)[0],
            1000
        );
        let h = histogram(
            &Dist::new("uniform", 10, 1.0).expect("uniform"),
            10,
            100_000,
        );
        assert!(h.iter().all(|c| (9_000..11_000).contains(c)), "{h:?}");
    }

    #[test]
    fn zipf_follows_its_law() {
        // s = 1 over 100 keys: P(rank 1) = 1 / H(100) = 0.1928, P(rank 2) half of that.
        let h = histogram(&Dist::new("zipf", 100, 1.0).expect("zipf"), 100, 200_000);
        let p1 = h[0] as f64 / 200_000.0;
        let p2 = h[1] as f64 / 200_000.0;
        assert!((p1 - 0.1928).abs() < 0.005, "{p1}");
        assert!((p1 / p2 - 2.0).abs() < 0.1, "{p1} {p2}");
        assert!(h[99] > 0, "the tail is reachable");
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(Dist::new("pareto", 10, 1.0).is_err());
        assert!(Dist::new("uniform", 0, 1.0).is_err());
        assert!(Dist::new("zipf", 10, 0.0).is_err());
        assert!(Dist::new("zipf", MAX_KEYS + 1, 1.0).is_err());
    }

    #[test]
    fn same_seed_same_sequence() {
        let d = Dist::new("uniform", 1000, 1.0).expect("uniform");
        let a: Vec<u64> = (0..5)
            .scan(Rng::stream(1, 2), |r, _| Some(d.sample(r)))
            .collect();
        let b: Vec<u64> = (0..5)
            .scan(Rng::stream(1, 2), |r, _| Some(d.sample(r)))
            .collect();
        assert_eq!(a, b);
    }
}
