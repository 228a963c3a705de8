//! The Lua scripts, the Redis keys an item touches, and the encoding of a [`Call`] into one
//! `EVALSHA` and of its reply back into a [`CallResult`].
//!
//! Kept apart from the connections so the standalone and Cluster stores share it, and so the
//! key layout (which tests and operators need) has one definition.

use crate::StoreError;
use sluice_core::algo::Kind;
use sluice_core::batch::{Call, CallResult, GiveBack, Item};
use sluice_core::{Micros, Outcome, Params, State};

/// `lua/check.lua`: `batch::apply` and every algorithm, one call per identity.
pub const CHECK_SCRIPT: &str = include_str!("../../../../lua/check.lua");
/// `lua/release.lua`: frees a concurrency slot.
pub const RELEASE_SCRIPT: &str = include_str!("../../../../lua/release.lua");
/// `lua/give_back.lua`: gives back units a lease did not spend (`algo::give_back`).
pub const GIVE_BACK_SCRIPT: &str = include_str!("../../../../lua/give_back.lua");

/// Outcome fields per item in the reply (the last, a shared bucket's birth in epoch ms).
const OUT: usize = 8;
/// The largest integer a Lua double holds exactly.
pub(crate) const MAX_EXACT: u64 = (1 << 53) - 1;

/// A script with its SHA1, computed once, for `EVALSHA` with `EVAL` as the fallback.
#[derive(Debug, Clone)]
pub(crate) struct Script {
    pub(crate) body: &'static str,
    pub(crate) sha: String,
}

impl Script {
    pub(crate) fn new(body: &'static str) -> Script {
        Script {
            body,
            sha: script_sha(body),
        }
    }
}

/// The SHA1 of a script body, as `EVALSHA` names it (`script_sha(CHECK_SCRIPT)`).
pub fn script_sha(body: &str) -> String {
    redis::Script::new(body).get_hash().to_string()
}

/// The algorithm's code in ARGV.
fn code(kind: Kind) -> u64 {
    match kind {
        Kind::TokenBucket => 1,
        Kind::Gcra => 2,
        Kind::FixedWindow => 3,
        Kind::SlidingWindow => 4,
        Kind::SlidingLog => 5,
        Kind::Concurrency => 6,
        Kind::LeakyQueue => 7,
    }
}

/// Start of the sliding window holding `now` (as `sliding_window.rs` computes it).
fn sliding_start(now: Micros, window: Micros) -> Micros {
    now - now % window
}

/// The Redis keys one item reads and writes at `now`, in the order the script expects.
///
/// A fixed window counts in `<key>:<window start µs>`; a sliding window reads the current
/// and the previous window's counters; a window of `window_start: first_request` and every
/// other algorithm live in `<key>` itself. All
/// keep the item key's `{identity}` hash tag, so one call stays in one Cluster slot.
pub fn item_keys(item: &Item, now: Micros) -> Vec<String> {
    let mut keys = Vec::with_capacity(2);
    push_item_keys(item, now, &mut keys);
    keys
}

/// [`item_keys`] appended to `keys`: one allocation per key, none for a vector per item.
fn push_item_keys(item: &Item, now: Micros, keys: &mut Vec<String>) {
    push_keys(&item.key, &item.params, now, keys);
}

/// The Redis keys of the rule key `key` with `params` at `now` (see [`item_keys`]).
fn push_keys(key: &str, params: &Params, now: Micros, keys: &mut Vec<String>) {
    // `<key>:<window start>`
    let suffixed = |n: i128| {
        let mut k = String::with_capacity(key.len() + 21);
        k.push_str(key);
        k.push(':');
        k.push_str(itoa::Buffer::new().format(n));
        k
    };
    match params {
        // `window_start: first_request`: the key's own window lives in the key itself.
        p if p.per_key_window() => keys.push(key.to_string()),
        Params::FixedWindow { window, .. } => {
            let (start, _) = window.bounds(now);
            keys.push(suffixed(i128::from(start)));
        }
        Params::SlidingWindow { window, .. } => {
            let start = sliding_start(now, *window);
            // Before the epoch's second window there is no previous one: a key never written.
            keys.push(suffixed(i128::from(start)));
            keys.push(suffixed(i128::from(start) - i128::from(*window)));
        }
        // The tenant's bucket, then the parent's: one hash tag (the domain), one slot.
        Params::FairShare(_) => {
            keys.push(key.to_string());
            keys.push(sluice_core::keys::fair_share_parent(key).to_string());
        }
        _ => keys.push(key.to_string()),
    }
}

/// Numbers in decimal, space-separated, the script's packed form. itoa's digits, not `write!`:
/// formatting through `core::fmt` was 7% of the daemon's instructions on a Redis check.
pub(crate) fn joined(nums: &[u64], capacity: usize) -> String {
    let mut s = String::with_capacity(capacity);
    let mut buf = itoa::Buffer::new();
    for (i, n) in nums.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(buf.format(*n));
    }
    s
}

/// Checks a number fits the script's exact arithmetic.
fn exact(what: &str, v: u64) -> Result<u64, StoreError> {
    if v > MAX_EXACT {
        return Err(StoreError::Server(format!(
            "{what} = {v} exceeds 2^53, the exact range of the Lua scripts"
        )));
    }
    Ok(v)
}

/// The KEYS and ARGV of one call's `EVALSHA` of `lua/check.lua`.
///
/// Public so tests, benchmarks (`redis-benchmark` running the same script) and operators can
/// run the script by hand with exactly the store's encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    /// The Redis keys, in the order the script reads them (see [`item_keys`]).
    pub keys: Vec<String>,
    /// `"now cost"` (or `"now cost stale"`, see [`ScriptCall::stale_after`]), the request
    /// id, then one argument per item:
    /// `"code p1 p2 flags rcur rprev wstart wend"`. Packed, because Redis copies and the
    /// script checks every argument: nine per item were over a third of what a fixed-window
    /// check cost Redis (docs/redis.md).
    pub args: Vec<String>,
}

impl ScriptCall {
    /// Bounds the call: Redis runs it only while its clock reads at most `at` (epoch
    /// microseconds) and otherwise answers [`StoreError::Stale`] without changing anything.
    /// A call whose caller has given up must not take units afterwards (a paused Redis runs
    /// its whole backlog on resume). `0` leaves the call unbounded.
    pub fn stale_after(mut self, at: Micros) -> ScriptCall {
        if at > 0
            && at <= MAX_EXACT
            && let Some(head) = self.args.first_mut()
        {
            head.push(' ');
            head.push_str(itoa::Buffer::new().format(at));
        }
        self
    }
}

/// Encodes a call for `lua/check.lua`. Refuses numbers the script cannot hold exactly
/// (above 2^53, or a cost above [`sluice_core::algo::MAX_LIMIT`]) rather than round them.
pub fn encode_check(call: &Call) -> Result<ScriptCall, StoreError> {
    // A cost above any limit never fits; bounding it keeps cost × 10^6 exact in Lua.
    if call.cost > sluice_core::algo::MAX_LIMIT {
        return Err(StoreError::Server(format!(
            "cost {} is above the largest limit {}",
            call.cost,
            sluice_core::algo::MAX_LIMIT
        )));
    }
    let now = exact("now", call.now)?;
    let mut keys = Vec::with_capacity(call.items.len() + 1);
    let mut args = Vec::with_capacity(2 + call.items.len());
    args.push(joined(&[now, call.cost], 24));
    args.push(call.request_id.clone());
    for item in &call.items {
        push_item_keys(item, now, &mut keys);
        if let Params::FairShare(fs) = &item.params {
            args.push(fair_share_arg(fs, item)?);
            continue;
        }
        let (p1, p2, wstart, wend) = match &item.params {
            // The rate as the core counts it: units a µs and units a token (check.lua's
            // argument format 2), the emission interval for GCRA.
            Params::TokenBucket { rate, burst } => (rate.units(), *burst, rate.scale(), 0),
            Params::Gcra { rate, burst } => (rate.interval(), *burst, 0, 0),
            // Bounds 0: the script reads the key's own window from its state.
            Params::FixedWindow { limit, window } if window.per_key() => {
                (*limit, window.nominal(), 0, 0)
            }
            Params::FixedWindow { limit, window } => {
                let (s, e) = window.bounds(now);
                (*limit, window.nominal(), s, e)
            }
            Params::SlidingWindow { limit, window, .. } if item.params.per_key_window() => {
                (*limit, *window, 0, 0)
            }
            Params::SlidingWindow { limit, window, .. } => {
                let s = sliding_start(now, *window);
                (*limit, *window, s, s + window)
            }
            Params::SlidingLog { limit, window } => (*limit, *window, 0, 0),
            Params::Concurrency { limit, timeout } => (*limit, *timeout, 0, 0),
            // The spacing as the core counts it (`Rate::interval`), the longest wait, and the
            // rate's period (the outcome's window).
            Params::LeakyQueue { rate, max_delay } => (rate.interval(), *max_delay, rate.per(), 0),
            // Encoded above (`fair_share_arg`).
            Params::FairShare(_) => continue,
        };
        let flags = u64::from(item.enforce) + 2 * u64::from(item.charge_rejected);
        args.push(joined(
            &[
                code(item.params.kind()),
                exact("parameter", p1)?,
                exact("parameter", p2)?,
                flags,
                exact("remote.cur", item.remote.cur)?,
                exact("remote.prev", item.remote.prev)?,
                exact("window start", wstart)?,
                exact("window end", wend)?,
            ],
            64,
        ));
    }
    Ok(ScriptCall { keys, args })
}

/// A fair share's item argument (check.lua's code 8): the parent's units a µs, burst and
/// units a token in p1, p2 and wstart, the child's in rcur, rprev and wend (a fair share is
/// region scope, so the remote fields are free), and `borrow_above` as a ninth number.
fn fair_share_arg(fs: &sluice_core::algo::FairShare, item: &Item) -> Result<String, StoreError> {
    let flags = u64::from(item.enforce) + 2 * u64::from(item.charge_rejected);
    let nums = [
        8,
        exact("parameter", fs.rate.units())?,
        exact("parameter", fs.burst)?,
        flags,
        exact("parameter", fs.child_rate.units())?,
        exact("parameter", fs.child_burst)?,
        exact("parameter", fs.rate.scale())?,
        exact("parameter", fs.child_rate.scale())?,
        exact("parameter", fs.borrow_above)?,
    ];
    Ok(joined(&nums, 72))
}

/// Encodes a give-back for `lua/give_back.lua`: KEYS is the one key holding the state at
/// `now` (a window's counter of the window holding `now`; a sliding window's previous counter
/// is never touched); ARGV is `"code p1 p2 wstart wend"` (check.lua's numbers and the bounds
/// of the window holding `now`) and `"units taken_at now tstart"` (`tstart`: the start of
/// the window holding `taken_at`; calendar maths is Rust's, as for a check).
///
/// Refuses an algorithm that cannot be leased, and numbers the script cannot hold exactly:
/// `units` above [`sluice_core::algo::MAX_LIMIT`] (as a cost), times above 2^53.
pub fn encode_give_back(g: &GiveBack) -> Result<ScriptCall, StoreError> {
    // A first-request window is never leased (rule validation refuses it).
    if !g.params.kind().leasable() || g.params.per_key_window() {
        return Err(crate::not_leasable(g));
    }
    if g.units > sluice_core::algo::MAX_LIMIT {
        return Err(StoreError::Server(format!(
            "give-back of {} units is above the largest limit {}",
            g.units,
            sluice_core::algo::MAX_LIMIT
        )));
    }
    let now = exact("now", g.now)?;
    let taken_at = exact("taken_at", g.taken_at)?;
    let (p1, p2, wstart, wend, tstart) = match &g.params {
        Params::TokenBucket { rate, burst } => (rate.units(), *burst, rate.scale(), 0, 0),
        Params::Gcra { rate, burst } => (rate.interval(), *burst, 0, 0, 0),
        Params::FixedWindow { limit, window } => {
            let (s, e) = window.bounds(now);
            (*limit, window.nominal(), s, e, window.bounds(taken_at).0)
        }
        Params::SlidingWindow { limit, window, .. } => {
            let s = sliding_start(now, *window);
            (
                *limit,
                *window,
                s,
                s + window,
                sliding_start(taken_at, *window),
            )
        }
        Params::SlidingLog { .. }
        | Params::Concurrency { .. }
        | Params::LeakyQueue { .. }
        | Params::FairShare(_) => {
            return Err(crate::not_leasable(g));
        }
    };
    let mut keys = Vec::with_capacity(2);
    push_keys(&g.key, &g.params, now, &mut keys);
    // Only the current window's counter: a count that became the previous window's weight
    // has nothing to give back to.
    keys.truncate(1);
    let args = vec![
        joined(
            &[
                code(g.params.kind()),
                exact("parameter", p1)?,
                exact("parameter", p2)?,
                exact("window start", wstart)?,
                exact("window end", wend)?,
            ],
            48,
        ),
        joined(
            &[g.units, taken_at, now, exact("window start", tstart)?],
            48,
        ),
    ];
    Ok(ScriptCall { keys, args })
}

/// Decodes `lua/give_back.lua`'s reply: whether it wrote.
pub fn decode_give_back(reply: &redis::Value) -> Result<bool, StoreError> {
    match int(reply) {
        Some(n @ (0 | 1)) => Ok(n == 1),
        _ => Err(StoreError::Server(format!(
            "unexpected reply from give_back.lua: {reply:?}"
        ))),
    }
}

fn int(v: &redis::Value) -> Option<u64> {
    match v {
        redis::Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// Decodes `lua/check.lua`'s reply (`allowed`, then seven outcome fields per item) for the
/// call it answers. A call of one fixed window is answered by the count its window held
/// before the call: the outcome follows from it and the call, and the core computes it
/// ([`sluice_core::batch::answer`]), which spares Redis building and the daemon parsing
/// eight numbers on the most common call.
pub fn decode_check(call: &Call, reply: &redis::Value) -> Result<CallResult, StoreError> {
    let bad = |why: &str| StoreError::Server(format!("unexpected reply from check.lua: {why}"));
    if let redis::Value::Int(n) = reply {
        let [item] = call.items.as_slice() else {
            return Err(bad("a count for a call of several items"));
        };
        let Params::FixedWindow { window, .. } = &item.params else {
            return Err(bad("a count for a call that is not a fixed window"));
        };
        if window.per_key() {
            return Err(bad("a count for a first-request window"));
        }
        let count = u64::try_from(*n).map_err(|_| bad("a negative count"))?;
        let (start, _) = window.bounds(call.now);
        let state = State::FixedWindow { start, count };
        return Ok(sluice_core::batch::answer(call, &[Some(state)]));
    }
    let redis::Value::Array(vals) = reply else {
        return Err(bad("not an array"));
    };
    if vals.len() != 1 + OUT * call.items.len() {
        return Err(bad(&format!(
            "{} values for {} items",
            vals.len(),
            call.items.len()
        )));
    }
    let nums: Vec<u64> = vals
        .iter()
        .map(int)
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| bad("a value is not a non-negative integer"))?;
    let outcomes = nums[1..]
        .chunks_exact(OUT)
        .map(|o| Outcome {
            allowed: o[0] == 1,
            limit: o[1],
            remaining: o[2],
            reset: o[3],
            retry_after: o[4],
            window: o[5],
            usage: o[6],
            // The label in µs, as the core's `Outcome::generation` (a whole millisecond).
            generation: o[7].saturating_mul(1000).min(MAX_EXACT),
        })
        .collect();
    Ok(CallResult {
        allowed: nums[0] == 1,
        outcomes,
    })
}

/// Decodes `lua/release.lua`'s reply.
pub(crate) fn decode_release(reply: &redis::Value) -> Result<bool, StoreError> {
    match int(reply) {
        Some(n) => Ok(n == 1),
        None => Err(StoreError::Server(format!(
            "unexpected reply from release.lua: {reply:?}"
        ))),
    }
}

/// Maps a Redis error to a classified [`StoreError`]. `keys` are the call's keys, so a
/// `SLUICE_CORRUPT <index>` reply names the key.
pub(crate) fn classify(err: &redis::RedisError, keys: &[String], timeout_ms: u64) -> StoreError {
    if err.is_timeout() {
        return StoreError::Timeout(timeout_ms);
    }
    if err.kind() == redis::ErrorKind::AuthenticationFailed {
        // Wrong credentials do not heal by retrying: an operator must fix the URL.
        return StoreError::Server(format!("redis: authentication failed: {err}"));
    }
    if err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error() && err.code().is_none()
    {
        return StoreError::Unavailable(err.to_string());
    }
    match err.code() {
        Some(code) => by_code(
            code,
            err.detail().unwrap_or_default(),
            &err.to_string(),
            keys,
        ),
        None => StoreError::Server(err.to_string()),
    }
}

/// Classifies the error text of one call of a batch ("CODE detail", as the script or Redis
/// wrote it), the way [`classify`] classifies a whole reply.
pub(crate) fn classify_text(text: &str, keys: &[String]) -> StoreError {
    let (code, detail) = text.split_once(' ').unwrap_or((text, ""));
    by_code(code, detail, text, keys)
}

fn by_code(code: &str, detail: &str, text: &str, keys: &[String]) -> StoreError {
    match code {
        "SLUICE_CORRUPT" => {
            let (idx, rest) = detail.split_once(' ').unwrap_or((detail, ""));
            let key = idx
                .parse::<usize>()
                .ok()
                .and_then(|i| keys.get(i.wrapping_sub(1)))
                .cloned()
                .unwrap_or_else(|| format!("KEYS[{idx}]"));
            StoreError::Corrupt {
                key,
                detail: rest.to_string(),
            }
        }
        "WRONGTYPE" => StoreError::Corrupt {
            key: keys.join(" "),
            detail: text.to_string(),
        },
        "OOM" => StoreError::Full(text.to_string()),
        "SLUICE_STALE" => StoreError::Stale {
            late_us: detail.trim().parse().unwrap_or(0),
        },
        "BUSY" | "LOADING" | "READONLY" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "MOVED"
        | "ASK" => StoreError::Unavailable(text.to_string()),
        _ => StoreError::Server(text.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::algo::Window;
    use sluice_core::time::SECOND;
    use sluice_core::{Rate, Remote};

    fn item(params: Params) -> Item {
        Item {
            key: "sl:{d|k=v}:r".into(),
            params,
            enforce: true,
            charge_rejected: false,
            remote: Remote::default(),
        }
    }

    #[test]
    fn keys_carry_the_hash_tag_and_window_starts() {
        let now = 1_700_000_061 * SECOND;
        let fw = item(Params::FixedWindow {
            limit: 1,
            window: Window::Epoch(60 * SECOND),
        });
        assert_eq!(
            item_keys(&fw, now),
            vec![format!("sl:{{d|k=v}}:r:{}", 1_700_000_040 * SECOND)]
        );
        let sw = item(Params::SlidingWindow {
            limit: 1,
            window: 60 * SECOND,
            start: Default::default(),
        });
        let k = item_keys(&sw, now);
        assert_eq!(k.len(), 2);
        assert!(k[1].ends_with(&(1_699_999_980 * SECOND).to_string()));
        let tb = item(Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 1,
        });
        assert_eq!(item_keys(&tb, now), vec!["sl:{d|k=v}:r".to_string()]);
    }

    #[test]
    fn a_give_back_names_the_window_of_now_and_the_window_of_taken_at() {
        let now = 1_700_000_061 * SECOND;
        let g = |params: Params, taken_at: Micros| GiveBack {
            key: "sl:{d|k=v}:r".into(),
            params,
            units: 7,
            taken_at,
            now,
        };
        let fw = g(
            Params::FixedWindow {
                limit: 100,
                window: Window::Epoch(60 * SECOND),
            },
            now - 30 * SECOND,
        );
        let enc = encode_give_back(&fw).expect("encodable");
        let start = 1_700_000_040 * SECOND;
        assert_eq!(enc.keys, vec![format!("sl:{{d|k=v}}:r:{start}")]);
        assert_eq!(
            enc.args,
            vec![
                format!("3 100 {} {start} {}", 60 * SECOND, start + 60 * SECOND),
                format!("7 {} {now} {}", now - 30 * SECOND, 1_699_999_980 * SECOND),
            ]
        );
        // A sliding window: the current window's counter only.
        let sw = g(
            Params::SlidingWindow {
                limit: 10,
                window: 60 * SECOND,
                start: Default::default(),
            },
            now,
        );
        assert_eq!(encode_give_back(&sw).expect("encodable").keys.len(), 1);
        let tb = g(
            Params::TokenBucket {
                rate: Rate::per_second(5),
                burst: 9,
            },
            now,
        );
        let enc = encode_give_back(&tb).expect("encodable");
        assert_eq!(enc.keys, vec!["sl:{d|k=v}:r".to_string()]);
        // Units a µs, burst, units a token (format 2): 5/s is 5 micro-tokens a µs.
        assert_eq!(enc.args[0], "1 5 9 1000000 0");
        // Refused, not sent: a log, too many units, a time Lua cannot hold.
        let log = g(
            Params::SlidingLog {
                limit: 5,
                window: SECOND,
            },
            now,
        );
        assert!(matches!(encode_give_back(&log), Err(StoreError::Server(_))));
        let many = GiveBack {
            units: sluice_core::algo::MAX_LIMIT + 1,
            ..tb.clone()
        };
        assert!(encode_give_back(&many).is_err());
        let late = GiveBack { now: 1 << 53, ..tb };
        assert!(encode_give_back(&late).is_err());
        assert_eq!(decode_give_back(&redis::Value::Int(1)), Ok(true));
        assert_eq!(decode_give_back(&redis::Value::Int(0)), Ok(false));
        assert!(decode_give_back(&redis::Value::Int(2)).is_err());
    }

    #[test]
    fn numbers_beyond_lua_are_refused_not_rounded() {
        let mut it = item(Params::TokenBucket {
            rate: Rate::per_second(1),
            burst: 1,
        });
        it.remote.cur = 1 << 60;
        let call = Call {
            now: 0,
            cost: 1,
            request_id: "r".into(),
            items: vec![it],
        };
        assert!(matches!(encode_check(&call), Err(StoreError::Server(_))));
    }

    #[test]
    fn short_or_odd_replies_are_errors() {
        let call = Call {
            now: 0,
            cost: 1,
            request_id: "r".into(),
            items: vec![item(Params::Gcra {
                rate: Rate::per_second(1),
                burst: 1,
            })],
        };
        assert!(decode_check(&call, &redis::Value::Array(vec![redis::Value::Int(1)])).is_err());
        assert!(decode_check(&call, &redis::Value::Nil).is_err());
        let mut ok = vec![redis::Value::Int(1); 9];
        assert!(decode_check(&call, &redis::Value::Array(ok.clone())).is_ok());
        ok[3] = redis::Value::Int(-1);
        assert!(decode_check(&call, &redis::Value::Array(ok)).is_err());
        // A bare count answers only a call of one fixed window.
        assert!(decode_check(&call, &redis::Value::Int(0)).is_err());
    }

    #[test]
    fn a_fixed_window_count_decodes_to_the_cores_outcome() {
        let now = 1_700_000_061 * SECOND;
        let mut it = item(Params::FixedWindow {
            limit: 3,
            window: Window::Epoch(60 * SECOND),
        });
        it.remote.cur = 1;
        let call = Call {
            now,
            cost: 1,
            request_id: "r".into(),
            items: vec![it],
        };
        let start = 1_700_000_040 * SECOND;
        for count in 0..4 {
            let state = State::FixedWindow { start, count };
            let want = sluice_core::batch::apply(&call, &[Some(state)]).0;
            let got = decode_check(&call, &redis::Value::Int(count as i64)).expect("a count");
            assert_eq!(got, want, "count {count}");
            assert_eq!(
                got.allowed,
                count < 2,
                "count {count} + remote 1 of limit 3"
            );
            assert_eq!(got.outcomes[0].reset, 39 * SECOND);
        }
        assert!(decode_check(&call, &redis::Value::Int(-1)).is_err());
        let mut two = call.clone();
        two.items.push(two.items[0].clone());
        assert!(decode_check(&two, &redis::Value::Int(0)).is_err());
    }
}
