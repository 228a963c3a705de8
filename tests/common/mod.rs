//! What several end-to-end tests share: bounded waits, one measured load at a time, a start
//! clear of an hour boundary, a `sluiced` on a Redis ([`node`]), paced gRPC load
//! ([`load`]) and what the multi-region tests share ([`regions`]).

pub mod load;
pub mod node;
pub mod regions;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Turns a hang into a failure; never an assertion on how long something took.
pub const HANG: Duration = Duration::from_secs(60);

/// The lock [`serial`] hands out.
static SERIAL: Mutex<()> = Mutex::new(());

/// Held for a whole test: the loads are what is measured, and two at once would share the
/// machine's two cores. A test that panicked while holding it does not block the others.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Returns well inside an hour: counts in hourly windows compared within a test would start
/// afresh at a boundary. Waits at most once an hour, under a minute.
pub fn inside_an_hour() {
    let into_hour = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 3600);
    if into_hour > 3540 {
        std::thread::sleep(Duration::from_secs(3601 - into_hour));
    }
}
