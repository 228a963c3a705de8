//! The quota journal: totals survive outages.
//!
//! A daily or monthly quota decided on local buckets while Redis is down would otherwise
//! forget every admission of the outage, and the client would get its quota twice. So each
//! admission that counted against a quota-sized fixed window (one hour or more) while its
//! store call failed is appended to a local file, one line each, written before the response
//! (a `write` to the OS survives a killed process; the file is fsynced every second). Once the
//! store answers again the journal is replayed into it: each entry becomes a charged check of
//! an unlimited copy of the window at the admission's own time, so it lands in the window it
//! belongs to and the store's own script does the counting. Windows that have ended are
//! dropped. A daemon restarted mid-outage replays what its predecessor wrote.
//!
//! Line format (version 1): `v1 <now_us> <cost> <window> <key>` where window is `e<len_us>`
//! or `c<h|d|w|mo>/<IANA zone>`; the key comes last as it may contain spaces.

use sluice_core::Micros;
use sluice_core::algo::{Calendar, CalendarUnit, MAX_LIMIT, Params, Window};
use sluice_core::batch::{Call, Item};
use sluice_store::Store;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Windows at least this long are quotas worth journaling (the core's guard selects them).
pub use sluice_core::guard::QUOTA_WINDOW;

/// One journaled admission.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// When it was admitted.
    pub now: Micros,
    /// Units admitted.
    pub cost: u64,
    /// The rule's window.
    pub window: Window,
    /// Store key of the rule and identity.
    pub key: String,
}

fn encode_window(w: &Window) -> String {
    match w {
        Window::Epoch(len) => format!("e{len}"),
        Window::FirstRequest(len) => format!("f{len}"),
        Window::Calendar(c) => {
            let unit = match c.unit {
                CalendarUnit::Hour => "h",
                CalendarUnit::Day => "d",
                CalendarUnit::Week => "w",
                CalendarUnit::Month => "mo",
            };
            format!("c{unit}/{}", c.tz_name)
        }
    }
}

fn decode_window(s: &str) -> Option<Window> {
    if let Some(len) = s.strip_prefix('e') {
        return len.parse().ok().filter(|l| *l > 0).map(Window::Epoch);
    }
    if let Some(len) = s.strip_prefix('f') {
        return len
            .parse()
            .ok()
            .filter(|l| *l > 0)
            .map(Window::FirstRequest);
    }
    let (unit, tz) = s.strip_prefix('c')?.split_once('/')?;
    let unit = match unit {
        "h" => CalendarUnit::Hour,
        "d" => CalendarUnit::Day,
        "w" => CalendarUnit::Week,
        "mo" => CalendarUnit::Month,
        _ => return None,
    };
    Calendar::new(unit, tz).map(Window::Calendar)
}

impl Entry {
    fn line(&self) -> String {
        format!(
            "v1 {} {} {} {}\n",
            self.now,
            self.cost,
            encode_window(&self.window),
            self.key
        )
    }

    fn parse(line: &str) -> Option<Entry> {
        let mut it = line.splitn(5, ' ');
        if it.next()? != "v1" {
            return None;
        }
        let now = it.next()?.parse().ok()?;
        let cost = it.next()?.parse().ok()?;
        let window = decode_window(it.next()?)?;
        let key = it.next()?.to_string();
        (!key.is_empty()).then_some(Entry {
            now,
            cost,
            window,
            key,
        })
    }
}

/// The journal file and its append handle.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Mutex<File>,
    backlog: AtomicU64,
    replayed: AtomicU64,
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Journal {
    /// Opens (creating) the journal at `path`.
    pub fn open(path: PathBuf) -> std::io::Result<Journal> {
        let file = open_append(&path)?;
        let j = Journal {
            path,
            file: Mutex::new(file),
            backlog: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
        };
        let n = j.read(&j.path).len() as u64;
        j.backlog.store(n, Ordering::Relaxed);
        Ok(j)
    }

    /// Entries waiting to be replayed (a metric).
    pub fn backlog(&self) -> u64 {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Entries replayed into the store so far (a metric).
    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// Appends one admission. Errors are logged, not returned: failing to journal must not
    /// fail the request.
    pub fn record(&self, e: &Entry) {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        match f.write_all(e.line().as_bytes()) {
            Ok(()) => {
                self.backlog.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => {
                tracing::error!(error = %err, path = %self.path.display(), "quota journal write failed")
            }
        }
    }

    /// Flushes to disk (called every second).
    pub fn sync(&self) {
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = f.sync_data() {
            tracing::warn!(error = %err, "quota journal fsync failed");
        }
    }

    fn read(&self, path: &Path) -> Vec<Entry> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(_) => return Vec::new(),
        };
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            match Entry::parse(line) {
                Some(e) => out.push(e),
                None if line.trim().is_empty() => {}
                None => {
                    tracing::warn!(line = i + 1, path = %path.display(), "skipping a corrupt quota journal line")
                }
            }
        }
        out
    }

    /// Replays every entry whose window is still open into `store`. Entries the store could
    /// not take stay in the journal for the next attempt. Returns (replayed, kept).
    pub async fn replay(
        &self,
        store: &dyn Store,
        now: Micros,
        timeout: Duration,
    ) -> (usize, usize) {
        if self.backlog() == 0 {
            return (0, 0);
        }
        // Rotate: new admissions go to a fresh file while the old one is replayed.
        let rotated = self.path.with_extension("replaying");
        {
            let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
            if !rotated.exists()
                && let Err(err) = std::fs::rename(&self.path, &rotated)
            {
                tracing::warn!(error = %err, "cannot rotate the quota journal");
                return (0, self.backlog() as usize);
            }
            match open_append(&self.path) {
                Ok(nf) => *f = nf,
                Err(err) => {
                    tracing::error!(error = %err, "cannot reopen the quota journal");
                    return (0, self.backlog() as usize);
                }
            }
        }
        let entries = self.read(&rotated);
        let (mut done, mut keep) = (0, Vec::new());
        for e in entries {
            if e.window.bounds(e.now).1 <= now {
                continue; // the window is over: nothing to add to
            }
            let call = Call {
                now: e.now,
                cost: e.cost,
                request_id: String::new(),
                items: vec![Item {
                    key: e.key.clone(),
                    params: Params::FixedWindow {
                        limit: MAX_LIMIT,
                        window: e.window.clone(),
                    },
                    enforce: true,
                    charge_rejected: false,
                    remote: Default::default(),
                }],
            };
            match tokio::time::timeout(timeout, store.check(&call)).await {
                Ok(Ok(_)) => done += 1,
                _ => keep.push(e),
            }
        }
        let kept = keep.len();
        for e in &keep {
            self.record(e);
        }
        let _ = std::fs::remove_file(&rotated);
        self.replayed.fetch_add(done as u64, Ordering::Relaxed);
        self.backlog
            .store(self.read(&self.path).len() as u64, Ordering::Relaxed);
        if done > 0 {
            tracing::info!(
                replayed = done,
                kept,
                "quota journal replayed into the store"
            );
        }
        (done, kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_store::MemoryStore;

    #[tokio::test]
    async fn entries_round_trip_and_replay_into_their_window() {
        let dir = std::env::temp_dir().join(format!("sluice-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("quota.journal");
        let _ = std::fs::remove_file(&path);
        let day = Window::Calendar(Calendar::new(CalendarUnit::Day, "Asia/Kolkata").expect("zone"));
        let hour = Window::Epoch(QUOTA_WINDOW);
        let now = 1_800_000_000_000_000;
        {
            let j = Journal::open(path.clone()).expect("open");
            j.record(&Entry {
                now,
                cost: 3,
                window: day.clone(),
                key: "sl:{d|k=a b}:daily".into(),
            });
            j.record(&Entry {
                now: now - 2 * QUOTA_WINDOW,
                cost: 1,
                window: hour.clone(),
                key: "sl:{x}:h".into(),
            });
            j.sync();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open")
            .write_all(b"garbage line\n")
            .expect("w");
        // A restarted daemon finds both entries (and skips the garbage).
        let j = Journal::open(path.clone()).expect("reopen");
        assert_eq!(j.backlog(), 2);
        let store = MemoryStore::default();
        let (done, kept) = j.replay(&store, now + 1, Duration::from_secs(1)).await;
        assert_eq!((done, kept), (1, 0), "the expired hour is dropped");
        let st = store.get("sl:{d|k=a b}:daily", now + 1).expect("counted");
        assert!(matches!(
            st,
            sluice_core::State::FixedWindow { count: 3, .. }
        ));
        assert_eq!(j.backlog(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
