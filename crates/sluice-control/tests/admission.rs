//! A daemon's admission check on published sets (`Published::admit_only`): the rules file
//! source refuses a valid set the daemon cannot serve (here: naming a store its config lacks)
//! exactly as it refuses an invalid one, and the last good set keeps serving.

use sluice_control::Published;
use sluice_control::file::{load, watch};
use std::time::Duration;

const V1: &str =
    "domain: a\nrules:\n  - { id: r, key: [k], algorithm: fixed_window, limit: 5, window: 1h }\n";

#[tokio::test]
async fn a_set_naming_a_store_the_daemon_lacks_is_refused_and_the_last_good_one_serves() {
    let dir = std::env::temp_dir().join(format!("sluice-admission-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, V1).expect("write");
    let published = Published::new(load(&path).expect("valid"));
    published.admit_only(Box::new(|set| {
        let missing = sluice_core::stores::unknown(set, |s| s == "bigcorp");
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        }
    }));
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(watch(
        path.clone(),
        published.clone(),
        Duration::from_millis(20),
        rx,
    ));
    let mut changes = published.subscribe();

    // A store the daemon has: published.
    let v2 = format!("{V1}overrides:\n  - {{ identity: {{ k: big }}, rule: r, store: bigcorp }}\n");
    std::fs::write(&path, &v2).expect("write");
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("reloaded")
        .expect("open");
    assert_eq!(published.version(), 1);
    let store = |p: &Published| {
        p.load().domain("a").expect("domain").overrides[0]
            .store
            .as_deref()
            .map(str::to_string)
    };
    assert_eq!(store(&published).as_deref(), Some("bigcorp"));

    // A store it lacks: refused whole, counted, the last good set kept.
    std::fs::write(&path, v2.replace("bigcorp", "smallcorp")).expect("write");
    tokio::time::timeout(Duration::from_secs(5), async {
        while published.refusals() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the set was read and refused");
    assert_eq!(published.version(), 1, "nothing was published");
    assert_eq!(store(&published).as_deref(), Some("bigcorp"));
    let err = published
        .admits(&load(&path).expect("valid rules"))
        .expect_err("names smallcorp");
    assert!(
        err.contains("overrides[0] (rule \"r\") names store \"smallcorp\""),
        "{err}"
    );

    let _ = stop.send(true);
    task.await.expect("watcher ends");
    let _ = std::fs::remove_dir_all(&dir);
}
