//! The sans-IO heart of Sluice.
//!
//! Everything that decides lives here and nothing here performs I/O, reads a clock or draws
//! a random number: `now` is always an argument. The daemon drives this code with the wall
//! clock and real stores; the simulator drives the very same code with a virtual clock, which
//! is what makes the simulator's numbers worth anything.
//!
//! # Layout
//!
//! - [`time`]: microsecond time and durations of the rule format.
//! - [`algo`]: the seven algorithms (the shaping queue the seventh) as `evaluate` / `take`
//!   pairs over explicit state.
//! - [`batch`]: one identity's rules checked together, taken together (the store contract).
//! - [`breaker`]: the per-shard circuit breaker state machine.
//! - [`guard`]: around each store call: send or not, what its ending counts as, when local
//!   buckets are dropped, what a failed call answers and what goes to the quota journal.
//! - [`rules`]: the rule format, validation, and the in-memory rule set.
//! - [`canary`]: which daemons enforce a rule (`enforce_on`) and which only shadow it.
//! - [`matching`]: descriptors to the rules that apply, with overrides and rollout.
//! - [`decision`]: outcomes to a decision; HTTP headers and the 429 body.
//! - [`merge`]: other regions' counts for global rules (max per region and window) and the
//!   remote figure a decision adds.
//! - [`ship`]: which busy global keys the delta shipper sends each interval, within a budget.
//! - [`relay`]: one sender per region: who ships a region's figures across, who takes them
//!   in and passes them on (an election over the live membership).
//! - [`forward`]: dozens of regions: each region's sender ships to a few peer regions, and
//!   receivers pass the other origins' figures on (peers, what is forwarded, the hop bound).
//! - [`liveness`]: who may be elected: a sender heard from lately, a region's relayer.
//! - [`hotkeys`]: what a daemon answers itself for hot keys (deny cache, token leasing).
//! - [`hash`]: the stable hash behind rollout and key splitting.
//! - [`keys`]: store keys, made and parsed in one place.
//! - [`pick`]: a number picked by a descriptor's value (a rule's cost, a fair share's table).
//! - [`stores`]: which named counter store an applied rule counts in (`store:`).

pub mod algo;
pub mod batch;
pub mod breaker;
pub mod canary;
pub mod decision;
pub mod edge;
pub mod forward;
pub mod guard;
pub mod hash;
pub mod hotkeys;
pub mod keys;
pub mod liveness;
pub mod matching;
pub mod merge;
pub mod pick;
pub mod relay;
pub mod rules;
pub mod ship;
pub mod stores;
pub mod time;

pub use algo::{Outcome, Params, Rate, Remote, Request, State};
pub use time::Micros;
