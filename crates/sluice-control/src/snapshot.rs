//! The daemon's disk copy of the last rules it loaded from PostgreSQL, so a daemon restarted
//! while PostgreSQL is unreachable still serves the last rules instead of none.
//!
//! Written after every change, atomically (a temp file in the same directory, fsynced, then
//! renamed over the old one), so a crash mid-write leaves the previous copy whole. The file is
//! JSON: the entries with their positions (the order matters and is kept exactly), the
//! version, and the database's instance id so a copy from another database is not mistaken
//! for this one's history.

use crate::model::{Record, State};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file format's version; bumped on an incompatible change.
const FORMAT: u32 = 1;

/// What is on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`FORMAT`].
    pub format: u32,
    /// The rules version.
    pub version: u64,
    /// The database instance it came from.
    pub instance: String,
    /// Every entry.
    pub entries: Vec<Record>,
}

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be read or written (missing, permissions, disk full).
    #[error("rules cache {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a snapshot this release understands.
    #[error("rules cache {path} is unreadable: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Snapshot {
    /// A snapshot of `state` at `version`.
    pub fn new(version: u64, instance: &str, state: &State) -> Snapshot {
        Snapshot {
            format: FORMAT,
            version,
            instance: instance.to_string(),
            entries: state.records(),
        }
    }

    /// The entries as a state.
    pub fn state(&self) -> State {
        let mut s = State::default();
        for r in &self.entries {
            s.apply_record(r.clone());
        }
        s
    }

    /// Reads a snapshot file.
    pub fn read(path: &Path) -> Result<Snapshot, SnapshotError> {
        let bytes = std::fs::read(path).map_err(|source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let snap: Snapshot =
            serde_json::from_slice(&bytes).map_err(|e| SnapshotError::Corrupt {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        if snap.format != FORMAT {
            return Err(SnapshotError::Corrupt {
                path: path.to_path_buf(),
                message: format!("format {} (this release reads {FORMAT})", snap.format),
            });
        }
        Ok(snap)
    }

    /// Writes the snapshot atomically: temp file, fsync, rename, fsync of the directory.
    pub fn write(&self, path: &Path) -> Result<(), SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        };
        let bytes = serde_json::to_vec(self).map_err(|e| SnapshotError::Corrupt {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        write_atomic(path, &bytes).map_err(io)
    }
}

/// Replaces `path` with `bytes` so that readers see the old contents or the new, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "rules-cache".into());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable; not all filesystems allow opening a directory.
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let dir = std::env::temp_dir().join(format!("sluice-snap-{}", std::process::id()));
        let path = dir.join("nested").join("cache.json");
        let state = State::from_docs(&[json!({"domain": "a", "rules": [
            {"id": "r", "key": [], "algorithm": "concurrency", "limit": 3}
        ]})])
        .expect("valid");
        let snap = Snapshot::new(9, "inst", &state);
        snap.write(&path).expect("write");
        let back = Snapshot::read(&path).expect("read");
        assert_eq!(back, snap);
        assert_eq!(back.state(), state);
        std::fs::write(&path, b"{\"format\": 1, \"vers").expect("write garbage");
        let err = Snapshot::read(&path).expect_err("corrupt");
        assert!(err.to_string().contains("unreadable"), "{err}");
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
