//! Headless Chromium through chromedriver's W3C WebDriver HTTP API, on the workspace's own
//! HTTP/1.1 client: start the driver, open a session with a fresh profile, navigate, type,
//! click, run a script, take a screenshot. No browser-automation crate.

use base64::Engine as _;
use serde_json::{Value, json};
use sluice_testkit::http::http_request_timeout;
use sluice_testkit::{Daemon, TempDir, free_port};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Debian's packages (`apt-get install -y chromium chromium-driver`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// chromedriver from `chromium-driver`.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// A WebDriver call's bound (a session's start is the slowest).
const CALL: Duration = Duration::from_secs(60);
/// The W3C name of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Fails, saying what to install, when the browser or its driver is missing.
pub fn require_browser() {
    for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: install the browser the console test drives with \
             `apt-get install -y chromium chromium-driver` ({package})"
        );
    }
}

/// chromedriver and one browser session; both end on drop.
pub struct Browser {
    driver: Daemon,
    addr: SocketAddr,
    session: String,
    _profile: TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium in a fresh profile, its window
    /// `width` × `height`.
    pub fn start(width: u32, height: u32) -> Browser {
        require_browser();
        let port = free_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut driver = Daemon::spawn(CHROMEDRIVER, &[&format!("--port={port}")], &[])
            .expect("spawn chromedriver");
        let deadline = Instant::now() + CALL;
        loop {
            let ready = http_request_timeout(addr, "GET", "/status", &[], b"", CALL)
                .ok()
                .and_then(|r| serde_json::from_slice::<Value>(&r.body).ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                break;
            }
            if let Ok(Some(status)) = driver.try_wait() {
                panic!("chromedriver exited ({status}): {}", driver.logs());
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver not ready: {}",
                driver.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = TempDir::new("chromium-profile").expect("profile dir");
        let args = [
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let v = call(addr, "POST", "/session", Some(&caps));
        let session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id: {v}"))
            .to_string();
        let b = Browser {
            driver,
            addr,
            session,
            _profile: profile,
        };
        b.cmd(
            "POST",
            "/window/rect",
            Some(&json!({"width": width, "height": height})),
        );
        b
    }

    fn cmd(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        call(
            self.addr,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )
    }

    /// Opens `url`.
    pub fn go(&self, url: &str) {
        self.cmd("POST", "/url", Some(&json!({"url": url})));
    }

    /// The first element `css` selects (it must exist).
    pub fn find(&self, css: &str) -> String {
        let v = self.cmd(
            "POST",
            "/element",
            Some(&json!({"using": "css selector", "value": css})),
        );
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    /// Types `text` into the element `css` selects.
    pub fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(&json!({"text": text})),
        );
    }

    /// Clicks the element `css` selects.
    pub fn click(&self, css: &str) {
        let e = self.find(css);
        self.cmd("POST", &format!("/element/{e}/click"), Some(&json!({})));
    }

    /// Accepts the open `confirm()` dialog.
    pub fn accept_dialog(&self) {
        self.cmd("POST", "/alert/accept", Some(&json!({})));
    }

    /// Runs `script` (a function body; `return` its answer) in the page.
    pub fn eval(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
    }

    /// Runs `script`, which calls `done(value)` when finished (e.g. after a `fetch`).
    pub fn eval_async(&self, script: &str) -> Value {
        let script = format!("const done = arguments[arguments.length - 1]; {script}");
        self.cmd(
            "POST",
            "/execute/async",
            Some(&json!({"script": script, "args": []})),
        )
    }

    /// Polls `script` until it returns `true`, up to `within`; the last answer of
    /// `describe` is in the failure.
    pub fn wait_for(&self, what: &str, script: &str, describe: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.eval(script) == Value::Bool(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not seen within {within:?}; the page shows: {}",
                self.eval(describe)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Drops every cookie of the current page's site.
    pub fn clear_cookies(&self) {
        self.cmd("DELETE", "/cookie", None);
    }

    /// The cookies of the current page's site, as WebDriver reports them.
    pub fn cookies(&self) -> Value {
        self.cmd("GET", "/cookie", None)
    }

    /// A PNG of the window.
    pub fn screenshot(&self) -> Vec<u8> {
        let v = self.cmd("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("a base64 screenshot")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http_request_timeout(
            self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            &[],
            b"",
            CALL,
        );
        let _ = self.driver.kill();
    }
}

/// One WebDriver call: its `value`, or a failure naming the error.
fn call(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> Value {
    let body = body.map(Value::to_string).unwrap_or_default();
    let headers: &[(&str, &str)] = if body.is_empty() {
        &[]
    } else {
        &[("content-type", "application/json")]
    };
    let r = http_request_timeout(addr, method, path, headers, body.as_bytes(), CALL)
        .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e:#}"));
    let v: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}: {}", r.text()));
    assert_eq!(r.status, 200, "WebDriver {method} {path}: {v}");
    v["value"].clone()
}
