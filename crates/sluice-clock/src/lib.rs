//! The daemon's clocks, given to the engine and the gossip node from outside so a test can
//! drive them in virtual time, or step one and not the other.
//!
//! Two readings: the wall clock (epoch µs), which rules and stores count by because windows
//! must align across daemons and regions, and a monotonic clock, which everything that
//! measures an interval on this daemon alone uses (the circuit breaker's cool-off, how long
//! the region's gossip sender has been silent): a wall clock stepped by NTP or an operator
//! must neither stretch an outage nor fake one.
//!
//! # Layout
//!
//! - [`Clock`]: the two readings.
//! - [`SystemClock`]: the machine's clocks.
//! - [`ManualClock`]: both set by hand (a test in virtual time).
//! - [`SteppedClock`]: the machine's clocks with the wall one stepped by hand (a test of
//!   tasks that run on real timers, as the gossip node's do).

use sluice_core::Micros;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where the engine and the gossip node read time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Wall-clock now, epoch microseconds.
    fn now(&self) -> Micros;
    /// Microseconds on a clock that never goes backwards, from an arbitrary origin.
    fn monotonic(&self) -> Micros;
}

/// The system's clocks.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// The system clocks, the monotonic one counted from now.
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
    }

    fn monotonic(&self) -> Micros {
        self.origin.elapsed().as_micros() as Micros
    }
}

/// A clock a test sets by hand: the wall clock may be stepped either way, the monotonic one
/// only forward.
#[derive(Debug, Default)]
pub struct ManualClock {
    wall: AtomicU64,
    mono: AtomicU64,
}

impl ManualClock {
    /// A clock at wall time `wall` and monotonic 0.
    pub fn new(wall: Micros) -> ManualClock {
        ManualClock {
            wall: AtomicU64::new(wall),
            mono: AtomicU64::new(0),
        }
    }

    /// Moves both clocks forward by `d`.
    pub fn advance(&self, d: Micros) {
        self.wall.fetch_add(d, Ordering::SeqCst);
        self.mono.fetch_add(d, Ordering::SeqCst);
    }

    /// Sets the wall clock alone (a step, as NTP or an operator makes one).
    pub fn set_wall(&self, wall: Micros) {
        self.wall.store(wall, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.wall.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Micros {
        self.mono.load(Ordering::SeqCst)
    }
}

/// The machine's clocks, with the wall reading moved by a step a test sets: time flows as it
/// does for the tokio timers beside it, and the wall clock jumps as NTP would make it.
#[derive(Debug, Default)]
pub struct SteppedClock {
    system: SystemClock,
    step: AtomicI64,
}

impl SteppedClock {
    /// The machine's clocks, not stepped yet.
    pub fn new() -> SteppedClock {
        SteppedClock::default()
    }

    /// Steps the wall clock by `by` microseconds (negative: back), on top of earlier steps.
    pub fn step_wall(&self, by: i64) {
        self.step.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for SteppedClock {
    fn now(&self) -> Micros {
        self.system
            .now()
            .saturating_add_signed(self.step.load(Ordering::SeqCst))
    }

    fn monotonic(&self) -> Micros {
        self.system.monotonic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stepped_wall_moves_and_the_monotonic_reading_does_not() {
        let c = SteppedClock::new();
        let (wall, mono) = (c.now(), c.monotonic());
        c.step_wall(-3_600_000_000);
        assert!(c.now() < wall, "stepped back an hour");
        assert!(c.now() + 3_600_000_000 >= wall);
        assert!(c.monotonic() >= mono, "the monotonic clock never goes back");
        c.step_wall(7_200_000_000);
        assert!(c.now() >= wall + 3_600_000_000, "then forward two");
    }

    #[test]
    fn a_manual_wall_steps_alone() {
        let c = ManualClock::new(1_000);
        c.advance(10);
        c.set_wall(5);
        assert_eq!((c.now(), c.monotonic()), (5, 10));
    }
}
