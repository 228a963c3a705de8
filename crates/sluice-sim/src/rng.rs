//! The simulator's randomness: the workspace's seeded generator, whose sequence for a seed is
//! pinned in `sluice-rng` (simulation outputs are compared byte for byte).

pub use sluice_rng::{Rng, Zipf, below_of, unit_of};
