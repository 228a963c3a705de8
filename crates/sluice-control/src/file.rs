//! Rules from a YAML file, the embedded default. The file is polled (once a second by
//! default) rather than watched through inotify: it works on every filesystem, including
//! ConfigMap volumes whose files are replaced by symlink swaps, and costs one `stat` a second.

use crate::Published;
use crate::domains::parse_yaml;
use sluice_core::rules::{RuleSet, RulesError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Why a rules file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Unreadable (missing, permissions): retryable once fixed.
    #[error("cannot read rules file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Read but refused by validation: permanent until the file changes.
    #[error("rules file {path} refused: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        source: RulesError,
    },
}

/// Reads and validates a rules file.
pub fn load(path: &Path) -> Result<RuleSet, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_yaml(&text).map_err(|source| FileError::Invalid {
        path: path.to_path_buf(),
        source,
    })
}

/// What identifies a version of the file without reading it.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Polls `path` and publishes each valid change with a version one above the last; invalid
/// changes are logged and ignored, so the last good set keeps serving. Returns when
/// `shutdown` fires. The file's current contents are taken as the baseline when this is
/// called (not when the future first runs), so a change made right after is not missed.
pub fn watch(
    path: PathBuf,
    published: Arc<Published>,
    every: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send {
    let last = stamp(&path);
    let last_text = std::fs::read_to_string(&path).ok();
    poll(path, published, every, shutdown, last, last_text)
}

async fn poll(
    path: PathBuf,
    published: Arc<Published>,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    mut last: Option<(SystemTime, u64)>,
    mut last_text: Option<String>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        let now = stamp(&path);
        if now == last {
            continue;
        }
        last = now;
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "rules file unreadable; keeping the current rules");
                continue;
            }
        };
        if last_text.as_deref() == Some(text.as_str()) {
            continue;
        }
        let parsed = parse_yaml(&text)
            .map_err(|e| e.to_string())
            .and_then(|set| published.admits(&set).map(|()| set));
        match parsed {
            Ok(mut set) => {
                set.version = published.version() + 1;
                tracing::info!(path = %path.display(), version = set.version, rules = set.rule_count(), "rules reloaded");
                published.publish(set);
                last_text = Some(text);
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "rules file refused; keeping the current rules");
                published.refuse();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_valid_change_swaps_in_and_an_invalid_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("rules.yaml");
        let v1 = "domain: a\nrules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 1, window: 1s }\n";
        std::fs::write(&path, v1).expect("write");
        let published = Published::new(load(&path).expect("valid"));
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(watch(
            path.clone(),
            published.clone(),
            Duration::from_millis(20),
            rx,
        ));
        let mut changes = published.subscribe();

        std::fs::write(&path, v1.replace("limit: 1", "limit: 5")).expect("write");
        tokio::time::timeout(Duration::from_secs(5), changes.changed())
            .await
            .expect("reloaded")
            .expect("open");
        assert_eq!(published.version(), 1);
        let set = published.load();
        let rule = &set.domain("a").expect("domain").rules[0];
        assert_eq!(rule.params.limit(), 5);

        std::fs::write(&path, "domain: a\nrules:\n  - { id: r, algorithm: nope }\n")
            .expect("write");
        // Wait for the refusal itself, then see that nothing was published.
        tokio::time::timeout(Duration::from_secs(5), async {
            while published.refusals() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the invalid file was read and refused");
        assert_eq!(published.refusals(), 1);
        assert_eq!(published.version(), 1, "the invalid file was refused");
        assert_eq!(
            published.load().domain("a").expect("domain").rules[0]
                .params
                .limit(),
            5
        );
        let _ = stop.send(true);
        task.await.expect("watcher ends");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_file_losing_its_default_rule_is_refused_and_the_last_good_set_serves() {
        let dir = std::env::temp_dir().join(format!("sluice-default-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("rules.yaml");
        let good = "domain: a\nrequire_default: true\nrules:\n  - { id: login, match: { route: POST /login }, key: [k], algorithm: fixed_window, limit: 1, window: 1s }\n  - { id: all, key: [k], algorithm: fixed_window, limit: 100, window: 1s }\n";
        std::fs::write(&path, good).expect("write");
        let published = Published::new(load(&path).expect("valid"));
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(watch(
            path.clone(),
            published.clone(),
            Duration::from_millis(20),
            rx,
        ));
        // The catch-all now matches one route only: refused as a whole.
        let bad = good.replace("{ id: all, key", "{ id: all, match: { route: GET / }, key");
        std::fs::write(&path, &bad).expect("write");
        tokio::time::timeout(Duration::from_secs(5), async {
            while published.refusals() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the file was read and refused");
        let set = published.load();
        let d = set.domain("a").expect("domain");
        assert_eq!(d.rules.len(), 2, "the last good set serves");
        assert!(d.rule("all").expect("all").matchers.is_empty());
        match load(&path) {
            Err(FileError::Invalid { source, .. }) => {
                assert_eq!(source.problems[0].field, "require_default", "{source}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let _ = stop.send(true);
        task.await.expect("watcher ends");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
