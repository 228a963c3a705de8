//! The engine's clocks, given to it from outside so a test can drive the real engine in
//! virtual time.
//!
//! Two readings: the wall clock (epoch µs), which rules and stores count by because windows
//! must align across daemons and regions, and a monotonic clock, which everything that
//! measures an interval on this daemon alone uses (the circuit breaker's cool-off): a wall
//! clock stepped back by NTP or an operator must not stretch an outage.

use sluice_core::Micros;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where the engine reads time.
pub trait Clock: Send + Sync {
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
