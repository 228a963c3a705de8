//! The admin API over a daemon whose rules come from a YAML file: reads answer from the
//! served set, writes say to edit the file.

use anyhow::Result;
use serde_json::Value;
use sluice_control::Published;
use sluice_control::admin::{AdminConfig, AdminState, serve_admin};
use sluice_core::rules::parse_yaml;
use sluice_testkit::http_request;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_work_and_writes_point_to_the_file() -> Result<()> {
    let mut set = parse_yaml(
        "domain: api\nrules:\n  - { id: r, key: [ip], algorithm: fixed_window, limit: 5, window: 1s }\n",
    )?;
    set.version = 7;
    let published = Published::new(set);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let state = AdminState::read_only(published, AdminConfig::default());
    let server = tokio::spawn(serve_admin(listener, state, async {
        let _ = rx.await;
    }));
    let call = |method: &'static str, path: &'static str| {
        tokio::task::spawn_blocking(move || http_request(addr, method, path, &[], b"{}"))
    };
    let r = call("GET", "/v1/rules").await??;
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["version"], 7);
    assert_eq!(v["rules"][0]["id"], "r");
    let r = call("GET", "/v1/rules/r").await??;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call("PUT", "/v1/rules/r").await??;
    assert_eq!(r.status, 501, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["error"]["code"], "READ_ONLY_SOURCE");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("--postgres")
    );
    let r = call("GET", "/v1/nope").await??;
    assert_eq!(r.status, 404);
    let _ = stop.send(());
    server.await??;
    Ok(())
}
