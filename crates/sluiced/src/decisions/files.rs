//! The decision log on disk: JSON lines in `decisions-<start µs>.jsonl` files, one active and
//! the closed ones, rotated by size and by age and deleted oldest first past the totals.
//!
//! When to rotate and what to delete is decided by [`Rotation`] (pure: sizes, start times and
//! `now` in, answers out), so tests check it on a manual clock; [`Files`] does the I/O. A
//! file's name is its first record's time, so the end of a closed file is the start of the
//! next one and no file needs opening to know how old its records are.

use sluice_core::Micros;
use std::fs::{File, OpenOptions};
use std::io::{BufRead as _, BufReader, BufWriter, Write as _};
use std::path::{Path, PathBuf};

/// When the active file is closed and when closed files go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The active file is closed at this size...
    pub file_bytes: u64,
    /// ...or this long after its first record.
    pub file_age: Micros,
    /// All files together stay under this (the oldest go first).
    pub max_bytes: u64,
    /// A closed file whose newest record is older than this goes.
    pub max_age: Micros,
}

impl Rotation {
    /// Whether the active file (`size` bytes, first record at `start`) should be closed
    /// before the next record is written.
    pub fn rotate(&self, size: u64, start: Micros, now: Micros) -> bool {
        size >= self.file_bytes || now.saturating_sub(start) >= self.file_age
    }

    /// How many of the oldest `closed` files (`(end, size)`, oldest first; `end` bounds the
    /// time of its newest record) to delete at `now`, the active file holding
    /// `active_size` bytes.
    pub fn expired(&self, closed: &[(Micros, u64)], active_size: u64, now: Micros) -> usize {
        let mut total: u64 = closed.iter().map(|f| f.1).sum::<u64>() + active_size;
        let mut n = 0;
        for &(end, size) in closed {
            let old = end.saturating_add(self.max_age) <= now;
            if !(old || total > self.max_bytes) {
                break;
            }
            total -= size;
            n += 1;
        }
        n
    }
}

/// `decisions-<start µs, 20 digits>.jsonl`.
fn name(start: Micros) -> String {
    format!("decisions-{start:020}.jsonl")
}

fn start_of(file_name: &str) -> Option<Micros> {
    file_name
        .strip_prefix("decisions-")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

/// The log's files in `dir`, oldest first: `(start, path)`.
pub fn list(dir: &Path) -> std::io::Result<Vec<(Micros, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if let Some(start) = e.file_name().to_str().and_then(start_of) {
            out.push((start, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

struct Active {
    out: BufWriter<File>,
    start: Micros,
    size: u64,
}

/// A closed file: its first record's time, a bound on its newest one's, its size.
struct Closed {
    start: Micros,
    end: Micros,
    size: u64,
    path: PathBuf,
}

/// The writer's side: appends lines, rotates, deletes.
pub struct Files {
    dir: PathBuf,
    rotation: Rotation,
    active: Option<Active>,
    closed: Vec<Closed>,
    /// Files closed by rotation.
    pub rotations: u64,
    /// Files deleted by age or size.
    pub deleted: u64,
}

impl Files {
    /// Opens `dir` (created if missing) at `now`; files already there count as closed, each
    /// ending where the next starts (the newest at `now`).
    pub fn open(dir: &Path, rotation: Rotation, now: Micros) -> std::io::Result<Files> {
        std::fs::create_dir_all(dir)?;
        let found = list(dir)?;
        let mut closed = Vec::new();
        for (i, (start, path)) in found.iter().enumerate() {
            let size = std::fs::metadata(path).map_or(0, |m| m.len());
            let end = found.get(i + 1).map_or(now, |f| f.0);
            closed.push(Closed {
                start: *start,
                end,
                size,
                path: path.clone(),
            });
        }
        Ok(Files {
            dir: dir.to_path_buf(),
            rotation,
            active: None,
            closed,
            rotations: 0,
            deleted: 0,
        })
    }

    /// Appends one line (without its newline) at `now`, rotating first if due.
    pub fn append(&mut self, line: &[u8], now: Micros) -> std::io::Result<()> {
        if let Some(a) = &self.active
            && self.rotation.rotate(a.size, a.start, now)
        {
            self.close(now)?;
            self.rotations += 1;
        }
        if self.active.is_none() {
            // A later start than every file there, so names sort by time.
            let start = self
                .closed
                .last()
                .map_or(now, |f| now.max(f.start.saturating_add(1)));
            let path = self.dir.join(name(start));
            let f = OpenOptions::new().create(true).append(true).open(&path)?;
            self.active = Some(Active {
                out: BufWriter::with_capacity(64 * 1024, f),
                start,
                size: 0,
            });
        }
        if let Some(a) = &mut self.active {
            a.out.write_all(line)?;
            a.out.write_all(b"\n")?;
            a.size += line.len() as u64 + 1;
        }
        self.expire(now)
    }

    /// Writes what is buffered, so readers see it.
    pub fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.active {
            Some(a) => a.out.flush(),
            None => Ok(()),
        }
    }

    /// Rotates an active file past its age, and deletes what is due, with no record to
    /// write (a quiet daemon's old records still go).
    pub fn tick(&mut self, now: Micros) -> std::io::Result<()> {
        if let Some(a) = &self.active
            && now.saturating_sub(a.start) >= self.rotation.file_age
        {
            self.close(now)?;
            self.rotations += 1;
        }
        self.expire(now)
    }

    fn close(&mut self, now: Micros) -> std::io::Result<()> {
        if let Some(mut a) = self.active.take() {
            a.out.flush()?;
            self.closed.push(Closed {
                start: a.start,
                end: now,
                size: a.size,
                path: self.dir.join(name(a.start)),
            });
        }
        Ok(())
    }

    fn expire(&mut self, now: Micros) -> std::io::Result<()> {
        let ends: Vec<(Micros, u64)> = self.closed.iter().map(|f| (f.end, f.size)).collect();
        let size = self.active.as_ref().map_or(0, |a| a.size);
        let n = self.rotation.expired(&ends, size, now);
        for c in self.closed.drain(..n) {
            match std::fs::remove_file(&c.path) {
                Ok(()) => self.deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Bytes held on disk by the log.
    pub fn bytes(&self) -> u64 {
        self.closed.iter().map(|f| f.size).sum::<u64>() + self.active.as_ref().map_or(0, |a| a.size)
    }
}

/// Reads lines newest first (newest file first, each file from its end), whole files until
/// `max_scan` bytes are read, and hands each to `keep` until it says stop (`false`).
pub fn newest_first(
    dir: &Path,
    max_scan: u64,
    keep: impl FnMut(&str) -> bool,
) -> std::io::Result<()> {
    newest_first_in(dir, max_scan, None, None, keep).map(|_| ())
}

/// [`newest_first`] over the files that may hold records at or after `since` and before
/// `until` (epoch µs): a file starting at or after `until` is not read, and nothing older
/// than the first file starting before `since` is. `keep` still sees every line of a file
/// read (the caller filters by time), and `max_scan` counts only the files read, so a
/// window further back is reached however much is newer. Answers `true` when `max_scan`
/// stopped it with older files left that may hold records of the window.
pub fn newest_first_in(
    dir: &Path,
    max_scan: u64,
    since: Option<Micros>,
    until: Option<Micros>,
    mut keep: impl FnMut(&str) -> bool,
) -> std::io::Result<bool> {
    let mut scanned = 0u64;
    let files = list(dir)?;
    for (i, (start, path)) in files.iter().enumerate().rev() {
        let (start, path) = (*start, path);
        if until.is_some_and(|u| start >= u) {
            continue;
        }
        let f = match File::open(path) {
            Ok(f) => f,
            // Deleted by the writer meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut lines = Vec::new();
        for line in BufReader::new(f).lines() {
            let line = line?;
            scanned += line.len() as u64 + 1;
            lines.push(line);
        }
        for line in lines.iter().rev() {
            if !keep(line) {
                return Ok(false);
            }
        }
        if since.is_some_and(|s| start < s) {
            return Ok(false);
        }
        if scanned >= max_scan {
            return Ok(i > 0);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;
    const T0: Micros = 1_700_000_000 * S;

    fn rotation() -> Rotation {
        Rotation {
            file_bytes: 100,
            file_age: 60 * S,
            max_bytes: 250,
            max_age: 600 * S,
        }
    }

    #[test]
    fn rotates_by_size_and_by_age() {
        let r = rotation();
        assert!(!r.rotate(99, T0, T0 + 59 * S));
        assert!(r.rotate(100, T0, T0), "at its size");
        assert!(r.rotate(0, T0, T0 + 60 * S), "at its age");
    }

    #[test]
    fn deletes_the_oldest_past_the_total_or_the_age() {
        let r = rotation();
        let closed = [(T0, 100), (T0 + 60 * S, 100), (T0 + 120 * S, 100)];
        // 300 + 10 bytes > 250: the oldest goes (then 210 ≤ 250).
        assert_eq!(r.expired(&closed, 10, T0 + 121 * S), 1);
        assert_eq!(r.expired(&closed, 60, T0 + 121 * S), 2, "360: two go");
        let small = [(T0 + 60 * S, 10), (T0 + 120 * S, 10)];
        // The first file's newest record is before T0 + 60 s: gone 600 s later, not before.
        assert_eq!(r.expired(&small, 0, T0 + 659 * S), 0);
        assert_eq!(r.expired(&small, 0, T0 + 660 * S), 1);
        assert_eq!(r.expired(&small, 0, T0 + 720 * S), 2);
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("sluiced-decisions-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_files_rotate_and_go_on_disk() {
        let dir = tempdir("files");
        let mut f = Files::open(&dir, rotation(), T0).expect("open");
        let line = [b'x'; 49]; // 50 bytes with its newline
        for i in 0..4 {
            f.append(&line, T0 + i).expect("append");
        }
        // Two files of 100 bytes (the second rotation happens at the fifth line).
        assert_eq!(list(&dir).expect("list").len(), 2);
        f.append(&line, T0 + 5).expect("append");
        assert_eq!(f.rotations, 2);
        assert_eq!(list(&dir).expect("list").len(), 3);
        for i in 0..3 {
            f.append(&line, T0 + 10 + i).expect("append");
        }
        // 400 bytes written, at most 250 kept: the oldest files went.
        assert!(f.bytes() <= 250, "{} bytes", f.bytes());
        assert!(f.deleted >= 1);
        // Age: a minute later the active file is closed, ten minutes later every closed file
        // whose records are that old is gone.
        f.tick(T0 + 61 * S).expect("tick");
        f.tick(T0 + 700 * S).expect("tick");
        assert!(list(&dir).expect("list").is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_newest_first_within_the_scan_bound() {
        let dir = tempdir("read");
        let mut f = Files::open(&dir, rotation(), T0).expect("open");
        for i in 0..6u64 {
            f.append(format!("{i:09}").as_bytes(), T0 + i * 30 * S)
                .expect("append");
        }
        f.flush().expect("flush");
        let mut seen = Vec::new();
        newest_first(&dir, u64::MAX, |l| {
            seen.push(l.to_string());
            true
        })
        .expect("read");
        let want: Vec<String> = (0..6u64).rev().map(|i| format!("{i:09}")).collect();
        assert_eq!(seen, want);
        let mut n = 0;
        newest_first(&dir, 20, |_| {
            n += 1;
            true
        })
        .expect("read");
        assert_eq!(n, 2, "20 bytes scanned: two lines of 10");
        // Windows: lines 0-5 at 30 s apart, two to a file (files start at 0, 60 and 120 s).
        let read = |max: u64, since: Option<Micros>, until: Option<Micros>| {
            let mut seen = Vec::new();
            let cut = newest_first_in(&dir, max, since, until, |l| {
                seen.push(
                    l.parse::<u64>()
                        .map_or_else(|_| l.to_string(), |n| n.to_string()),
                );
                true
            })
            .expect("read");
            (seen.join(","), cut)
        };
        assert_eq!(read(20, None, None), ("5,4".into(), true), "cut short");
        assert_eq!(
            read(u64::MAX, Some(T0 + 70 * S), None),
            ("5,4,3,2".into(), false),
            "nothing older than the file holding since"
        );
        assert_eq!(
            read(u64::MAX, None, Some(T0 + 120 * S)),
            ("3,2,1,0".into(), false),
            "no file starting at until"
        );
        assert_eq!(
            read(20, Some(T0 + 130 * S), None),
            ("5,4".into(), false),
            "since reached within the bound"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
