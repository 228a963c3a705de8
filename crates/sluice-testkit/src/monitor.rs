//! Sluice's script calls as Redis sees them, read from `MONITOR`: per store key, the check
//! calls (batched or not) and the give-backs, with the daemon's `now` of the first and last.
//!
//! A test that asks "did every request of this key reach Redis exactly once" cannot read it
//! from the daemon (that is what is under test) nor from `INFO commandstats` (one count for
//! all keys); `MONITOR` shows each call with its keys.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The store calls Redis saw for one key, read from `MONITOR`.
#[derive(Debug, Default, Clone)]
pub struct KeyCalls {
    /// Check script calls carrying the key (one per store call, batched or not).
    pub checks: u64,
    /// Give-back script calls.
    pub give_backs: u64,
    /// The daemon's `now` of the first check (epoch µs).
    pub first_now: Option<u64>,
    /// The daemon's `now` of the last check (epoch µs).
    pub last_now: Option<u64>,
    /// The largest cost of one check: a sync call's is the units it adds (`hot_keys`'
    /// `sync_interval`), an ordinary check's the request's.
    pub max_cost: u64,
}

/// The quoted arguments of one `MONITOR` line.
fn monitor_args(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        arg.push(n);
                    }
                }
                '"' => break,
                c => arg.push(c),
            }
        }
        out.push(arg);
    }
    out
}

/// Files one script call's keys and arguments: a check's first argument is
/// `"now cost [stale]"` (now: epoch µs), a give-back's the rule's numbers.
fn file_call(seen: &mut HashMap<String, KeyCalls>, keys: &[String], argv: &[String]) {
    let head = |i: usize| -> u64 {
        argv.first()
            .and_then(|a| a.split(' ').nth(i))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let (first, cost) = (head(0), head(1));
    let check = first >= 1_000_000_000_000;
    for k in keys {
        if let Some(c) = seen.get_mut(k) {
            if check {
                c.checks += 1;
                c.max_cost = c.max_cost.max(cost);
                c.first_now = Some(c.first_now.map_or(first, |f| f.min(first)));
                c.last_now = Some(c.last_now.map_or(first, |l| l.max(first)));
            } else {
                c.give_backs += 1;
            }
        }
    }
}

/// One `EVALSHA` line: a call, or a batch of them (`"B" n`, then per call `"keys args"` and
/// its arguments, its keys in order in KEYS).
fn file_line(seen: &mut HashMap<String, KeyCalls>, line: &str) -> bool {
    let a = monitor_args(line);
    if a.len() < 3 || !a[0].eq_ignore_ascii_case("evalsha") {
        return false;
    }
    let Ok(nkeys) = a[2].parse::<usize>() else {
        return false;
    };
    let keys = &a[3..(3 + nkeys).min(a.len())];
    let argv = &a[(3 + nkeys).min(a.len())..];
    if argv.first().map(String::as_str) != Some("B") {
        file_call(seen, keys, argv);
        return true;
    }
    let calls: usize = argv.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
    let (mut at, mut key_at) = (2, 0);
    for _ in 0..calls {
        let Some((k, n)) = argv.get(at).and_then(|h| h.split_once(' ')) else {
            break;
        };
        let (k, n): (usize, usize) = (k.parse().unwrap_or(0), n.parse().unwrap_or(0));
        let ks = &keys[key_at.min(keys.len())..(key_at + k).min(keys.len())];
        let args = &argv[(at + 1).min(argv.len())..(at + 1 + n).min(argv.len())];
        file_call(seen, ks, args);
        key_at += k;
        at += 1 + n;
    }
    true
}

/// `MONITOR` on a Redis, in a thread: the store calls of each watched key, and the script
/// calls in all. (A script's own commands show too, as `[0 lua]` lines: they are skipped.)
pub struct Monitor {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(HashMap<String, KeyCalls>, u64)>,
}

impl Monitor {
    /// Starts reading `MONITOR` of the Redis at `addr`, filing calls of `keys`.
    pub fn start(addr: SocketAddr, keys: Vec<String>) -> Monitor {
        let mut s = TcpStream::connect(addr).expect("connect for MONITOR");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        s.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut r = BufReader::new(s);
        let mut ok = String::new();
        r.read_line(&mut ok).expect("MONITOR answers");
        assert_eq!(ok.trim_end(), "+OK");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen: HashMap<String, KeyCalls> =
                keys.into_iter().map(|k| (k, KeyCalls::default())).collect();
            let mut scripts = 0u64;
            let mut line = String::new();
            loop {
                match r.read_line(&mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        scripts += u64::from(file_line(&mut seen, &line));
                        line.clear();
                    }
                    // A read timeout keeps the partial line it read: the rest follows.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        if flag.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                    Err(e) => panic!("MONITOR stream: {e}"),
                }
            }
            (seen, scripts)
        });
        Monitor { stop, thread }
    }

    /// Stops reading once the stream is quiet: the calls per key and the script calls.
    pub fn finish(self) -> (HashMap<String, KeyCalls>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("monitor thread")
    }
}
