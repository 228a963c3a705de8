//! A unique temporary directory removed on drop (no `tempfile` crate, to stay lean).
//!
//! The servers here keep their files in one, and tests use one for the config and rules
//! files they write before starting a daemon, so nothing is left behind in `/tmp`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A directory under [`std::env::temp_dir`] named from the process id, a process-wide counter
/// and a caller label (usually a port), removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates the directory; `label` makes its name readable in a listing (`limits-41234`).
    ///
    /// Errors when it cannot be created.
    pub fn new(label: &str) -> Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("sluice-testkit-{}-{n}-{label}", std::process::id()));
        // A leftover from a crashed run with the same pid would be stale: start clean.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .with_context(|| format!("creating temp dir {}", path.display()))?;
        Ok(Self { path })
    }

    /// Where it is, to join file names onto.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
