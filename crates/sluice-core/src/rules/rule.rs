//! One rule of the rule format validated into a [`Rule`]: its fields, its algorithm's
//! numbers and its `hot_keys` block.

use super::algorithms::{ALGORITHM_FIELDS, ALGORITHMS, AlgorithmFields};
use super::cost::cost;
use super::matchers::{KeyField, key_field, match_value};
use super::{FailureMode, Fields, HeaderMode, Mode, Problem, Rule, Scope};
use crate::algo::{Calendar, CalendarUnit, Kind, MAX_LIMIT, MAX_LOG_LIMIT, Params, Rate, Window};
use crate::canary::EnforceOn;
use crate::time::{MILLI, SECOND, Span};
use serde_json::Value;
use std::sync::Arc;

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

fn valid_field(f: &str) -> bool {
    !f.is_empty()
        && f.len() <= 64
        && f.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

pub(super) fn rule(v: &Value, pos: usize, problems: &mut Vec<Problem>) -> Option<Rule> {
    let Some(obj) = v.as_object() else {
        problems.push(Problem {
            at: format!("rules[{pos}]"),
            field: "rule".into(),
            message: "expected a mapping".into(),
        });
        return None;
    };
    // Problems are reported under the rule id when it is a usable one, else its position.
    let id = match obj.get("id") {
        Some(Value::String(s)) if valid_id(s) => s.clone(),
        _ => format!("rules[{pos}]"),
    };
    let before = problems.len();
    let mut f = Fields::new(&id, obj, problems);
    let id_field = f.string("id", true);
    if let Some(i) = &id_field
        && !valid_id(i)
    {
        f.bad("id", "must be 1 to 64 characters of A-Z a-z 0-9 _ . : -");
    }
    let group = f.string("group", false);
    let title = f.string("title", false);
    if let Some(m) = title.as_deref().and_then(title_problem) {
        f.bad("title", m);
    }
    let mut matchers = Vec::new();
    match f.take("match") {
        Some(Value::Object(m)) => {
            for (k, v) in m {
                if !valid_field(k) {
                    f.bad("match", format!("{k:?} is not a descriptor name"));
                }
                if let Some(c) = match_value(&mut f, k, v) {
                    matchers.push((k.clone(), c));
                }
            }
        }
        None => {}
        Some(other) => f.bad(
            "match",
            format!("expected a mapping of descriptor to value, got {other}"),
        ),
    }
    let mut key: Vec<KeyField> = Vec::new();
    match f.take("key") {
        Some(Value::Array(items)) => {
            for it in items {
                // `[ip/24,64]` unquoted in a flow list reads as `ip/24` and `64`.
                if let Some(n) = it.as_u64()
                    && key.last().is_some_and(|k| k.mask.is_some())
                {
                    f.bad(
                        "key",
                        format!("{n} follows a prefix length: for IPv4 and IPv6 lengths quote the entry, \"ip/24,{n}\""),
                    );
                    continue;
                }
                let Some(s) = it.as_str() else {
                    f.bad("key", format!("{it} is not a descriptor name"));
                    continue;
                };
                match key_field(s, valid_field) {
                    Ok(k) => key.push(k),
                    Err(m) => f.bad("key", m),
                }
            }
        }
        Some(Value::String(s)) => match key_field(s, valid_field) {
            Ok(k) => key.push(k),
            Err(m) => f.bad("key", m),
        },
        None => f.bad(
            "key",
            "is required (a list of descriptor names; [] for one counter shared by all)",
        ),
        Some(other) => f.bad(
            "key",
            format!("expected a list of descriptor names, got {other}"),
        ),
    }
    let cost_v = f.take("cost");
    let cost = cost(&mut f, cost_v, valid_field);
    let algorithm = f.string("algorithm", true);
    let rate_per_s = f.count("rate_per_s", MAX_LIMIT);
    let rate = f.rate("rate");
    let burst = f.count("burst", MAX_LIMIT);
    let limit_max = if algorithm.as_deref() == Some(Kind::SlidingLog.name()) {
        MAX_LOG_LIMIT
    } else {
        MAX_LIMIT
    };
    let limit = f.count("limit", limit_max);
    let window = f.span("window");
    let timeout = f.span("timeout");
    let max_delay = f.span("max_delay");
    let tz = f.string("calendar_tz", false);
    let window_start = window_start(&mut f);
    let mode = f.choice(
        "mode",
        Mode::Enforce,
        &[
            ("enforce", Mode::Enforce),
            ("shadow", Mode::Shadow),
            ("off", Mode::Off),
        ],
    );
    let on_store_failure = f.choice(
        "on_store_failure",
        FailureMode::Open,
        &[
            ("open", FailureMode::Open),
            ("closed", FailureMode::Closed),
            ("local", FailureMode::Local),
        ],
    );
    let scope = f.choice(
        "scope",
        Scope::Region,
        &[("region", Scope::Region), ("global", Scope::Global)],
    );
    let rollout_pct = match f.take("rollout_pct") {
        None => 100,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(p) if p <= 100 => p as u8,
            _ => {
                f.bad(
                    "rollout_pct",
                    format!("must be a whole number from 0 to 100, got {n}"),
                );
                100
            }
        },
        Some(other) => {
            f.bad(
                "rollout_pct",
                format!("must be a whole number from 0 to 100, got {other}"),
            );
            100
        }
    };
    let enforce_on_v = f.take("enforce_on");
    let enforce_on = enforce_on_v.and_then(|v| enforce_on(&mut f, v));
    let headers = f.choice(
        "headers",
        HeaderMode::Full,
        &[
            ("full", HeaderMode::Full),
            ("retry_only", HeaderMode::RetryOnly),
        ],
    );
    let charge_rejected = f.boolean("charge_rejected").unwrap_or(false);
    let share_threshold_pct = match f.take("share_threshold") {
        None => 10,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if (0.0..=1.0).contains(&x) => (x * 100.0).round() as u8,
            _ => {
                f.bad(
                    "share_threshold",
                    format!("must be a fraction from 0 to 1, got {n}"),
                );
                10
            }
        },
        Some(other) => {
            f.bad(
                "share_threshold",
                format!("must be a fraction from 0 to 1, got {other}"),
            );
            10
        }
    };

    let hot_keys_v = f.take("hot_keys");
    let fair_share_v = f.take("fair_share");

    let numbers = Numbers {
        rate_per_s,
        rate,
        burst,
        limit,
        window,
        calendar_tz: tz,
        first_request: window_start,
        timeout,
        max_delay,
        fair_share: fair_share_v.is_some(),
    };
    let params = match algorithm.as_deref() {
        Some(name) => match AlgorithmFields::by_name(name) {
            Some(a) => {
                for &field in ALGORITHM_FIELDS {
                    if numbers.given(field) && !a.takes(field) {
                        f.bad(field, format!("does not apply to {name}"));
                    }
                }
                for &field in a.required {
                    f.need(field, numbers.given(field), name);
                }
                let given = a.either.iter().filter(|e| numbers.given(e)).count();
                f.need_one(a.either, given, name);
                params(&mut f, a.kind, numbers)
            }
            None => {
                let names: Vec<&str> = ALGORITHMS.iter().map(|a| a.name()).collect();
                f.bad(
                    "algorithm",
                    format!("unknown algorithm {name:?}; expected {}", names.join(" | ")),
                );
                None
            }
        },
        None => None,
    };
    // Only windows and buckets take other regions' figures (docs/regions.md).
    if scope == Scope::Global
        && let Some(kind @ (Kind::SlidingLog | Kind::Concurrency)) =
            params.as_ref().map(Params::kind)
    {
        f.bad(
            "scope",
            format!(
                "global is not possible for {}: its counts cannot be shared between regions (use sliding_window or a bucket for a global limit, or scope: region)",
                kind.name()
            ),
        );
    }
    if params.as_ref().map(Params::kind) == Some(Kind::LeakyQueue) {
        leaky_queue_limits(&mut f, scope, charge_rejected);
    }
    let params = match fair_share_v {
        Some(v) => super::fair_share::fair_share(&mut f, v, params, scope, valid_field),
        None => params,
    };
    let hot_keys =
        crate::hotkeys::config::block(&mut f, hot_keys_v, params.as_ref(), charge_rejected);
    if matches!(params, Some(Params::FairShare(_)))
        && let Some(what) = hot_keys
            .as_ref()
            .and_then(super::fair_share::hot_keys_refusal)
    {
        f.bad(
            "hot_keys",
            format!("{what} is not possible with fair_share: a tenant's bucket and the parent are checked together in one store call, and {what} would decide from one of them in the daemon (the deny cache and leasing stay on)"),
        );
    }
    if let (Some(Params::FairShare(fs)), Some(h)) = (params.as_ref(), hot_keys.as_ref())
        && let Some(m) = super::fair_share::lease_problem(h, fs)
    {
        f.bad("hot_keys.lease", m);
    }

    let store = f.string("store", false);
    if let Some(m) = store.as_deref().and_then(crate::stores::name_problem) {
        f.bad("store", m);
    }
    if store
        .as_deref()
        .is_some_and(|s| s != crate::stores::DEFAULT)
        && let Some(what) = hot_keys.as_ref().and_then(crate::stores::hot_keys_conflict)
    {
        f.bad("store", crate::stores::hot_keys_message(what));
    }
    first_request_limits(&mut f, params.as_ref(), scope, hot_keys.as_ref());
    f.finish();
    if problems.len() > before {
        return None;
    }
    Some(Rule {
        id: Arc::from(id_field?.as_str()),
        group,
        matchers,
        key,
        cost,
        params: params?,
        mode,
        on_store_failure,
        scope,
        rollout_pct,
        enforce_on,
        canary_shadowed: false,
        headers,
        title: title.map(|t| Arc::from(t.as_str())),
        charge_rejected,
        share_threshold_pct,
        hot_keys: hot_keys?,
        store: store.map(|s| Arc::from(s.as_str())),
        source: v.clone(),
    })
}

/// A rule's `enforce_on`: `{daemons: N%}` (0% to 100%) or `{daemons: [id, ...]}` (non-empty
/// ids, none twice); anything else is refused under the field `enforce_on`.
fn enforce_on(f: &mut Fields<'_>, v: &Value) -> Option<EnforceOn> {
    const FIELD: &str = "enforce_on";
    let Some(obj) = v.as_object() else {
        f.bad(
            FIELD,
            format!(
                "expected a mapping like {{daemons: 10%}} or {{daemons: [eu-1, us-2]}}, got {v}"
            ),
        );
        return None;
    };
    for k in obj.keys().filter(|k| k.as_str() != "daemons") {
        f.bad(FIELD, format!("unknown key {k:?}; expected daemons"));
    }
    let share = "expected a share like 10% (0% to 100%) or a list of daemon ids";
    match obj.get("daemons") {
        None | Some(Value::Null) => {
            f.bad(
                FIELD,
                "daemons is required (a share like 10%, or a list of daemon ids)",
            );
            None
        }
        Some(Value::String(s)) => {
            let Some(n) = s
                .trim()
                .strip_suffix('%')
                .and_then(|n| n.trim().parse::<u64>().ok())
            else {
                f.bad(FIELD, format!("daemons: {share}, got {s:?}"));
                return None;
            };
            if n > 100 {
                f.bad(FIELD, format!("daemons: a share from 0% to 100%, got {n}%"));
                return None;
            }
            Some(EnforceOn::Percent(n as u8))
        }
        Some(Value::Array(items)) => {
            if items.is_empty() {
                f.bad(
                    FIELD,
                    "daemons: list at least one daemon id (0% enforces nowhere)",
                );
                return None;
            }
            let mut ids: Vec<Arc<str>> = Vec::with_capacity(items.len());
            let mut ok = true;
            for it in items {
                match it.as_str() {
                    Some(s) if s.trim().is_empty() => {
                        f.bad(FIELD, "daemons: a daemon id must not be empty");
                        ok = false;
                    }
                    Some(s) if ids.iter().any(|d| &**d == s) => {
                        f.bad(FIELD, format!("daemons: {s:?} appears twice"));
                        ok = false;
                    }
                    Some(s) => ids.push(Arc::from(s)),
                    None => {
                        f.bad(
                            FIELD,
                            format!("daemons: {it} is not a daemon id (a string)"),
                        );
                        ok = false;
                    }
                }
            }
            ok.then_some(EnforceOn::Daemons(ids))
        }
        Some(other) => {
            f.bad(FIELD, format!("daemons: {share}, got {other}"));
            None
        }
    }
}

/// The longest `title`, in characters: a sentence, not a paragraph.
pub const MAX_TITLE_CHARS: usize = 120;

/// What is wrong with a `title`, if anything: it is shown to clients in problem bodies, so
/// it is a bounded single line of text.
fn title_problem(t: &str) -> Option<String> {
    if t.trim().is_empty() {
        Some("must not be empty".into())
    } else if t.chars().count() > MAX_TITLE_CHARS {
        Some(format!("must be at most {MAX_TITLE_CHARS} characters"))
    } else if t.chars().any(char::is_control) {
        Some("must not hold control characters (newlines, tabs, ...)".into())
    } else {
        None
    }
}

/// A rule's algorithm fields as read, each `None` when absent or already refused.
struct Numbers {
    rate_per_s: Option<u64>,
    rate: Option<Rate>,
    burst: Option<u64>,
    limit: Option<u64>,
    window: Option<Span>,
    calendar_tz: Option<String>,
    /// `window_start`: `Some(true)` for `first_request`, `Some(false)` for `epoch`.
    first_request: Option<bool>,
    timeout: Option<Span>,
    max_delay: Option<Span>,
    /// `fair_share` was given (read on its own: [`super::fair_share`]).
    fair_share: bool,
}

impl Numbers {
    /// Whether the field of [`ALGORITHM_FIELDS`] was given (and read without a problem).
    fn given(&self, field: &str) -> bool {
        match field {
            "rate_per_s" => self.rate_per_s.is_some(),
            "rate" => self.rate.is_some(),
            "burst" => self.burst.is_some(),
            "limit" => self.limit.is_some(),
            "window" => self.window.is_some(),
            "calendar_tz" => self.calendar_tz.is_some(),
            "timeout" => self.timeout.is_some(),
            "window_start" => self.first_request.is_some(),
            "max_delay" => self.max_delay.is_some(),
            "fair_share" => self.fair_share,
            _ => false,
        }
    }
}

/// The algorithm's params from its numbers, once the table's checks are done: what is
/// left is each algorithm's own constraints (calendar windows, whole milliseconds, the
/// sliding window's 2^51, the concurrency timeout's default).
fn params(f: &mut Fields<'_>, kind: Kind, n: Numbers) -> Option<Params> {
    match kind {
        Kind::TokenBucket | Kind::Gcra => {
            let rate = n.rate.or(n.rate_per_s.map(Rate::per_second))?;
            let burst = n.burst?;
            if let Err(e) = rate.fits(burst) {
                f.bad("burst", e.to_string());
                return None;
            }
            Some(if kind == Kind::Gcra {
                Params::Gcra { rate, burst }
            } else {
                Params::TokenBucket { rate, burst }
            })
        }
        Kind::FixedWindow => {
            let window = match (n.window, n.calendar_tz) {
                (Some(_), Some(_)) if n.first_request == Some(true) => {
                    f.bad(
                        "window_start",
                        "first_request is not possible with calendar_tz: a calendar window starts at the zone's hour, day, week or month (leave out one of the two)",
                    );
                    None
                }
                (Some(sp), Some(tz)) => calendar(f, sp, &tz).map(Window::Calendar),
                (sp, None) if n.first_request == Some(true) => {
                    fixed(f, "window", sp).map(Window::FirstRequest)
                }
                (sp, None) => fixed(f, "window", sp).map(Window::Epoch),
                (None, Some(_)) => None,
            };
            Some(Params::FixedWindow {
                limit: n.limit?,
                window: window?,
            })
        }
        Kind::SlidingWindow | Kind::SlidingLog => {
            let window = fixed(f, "window", n.window);
            if let Some(w) = window {
                if w % MILLI != 0 {
                    f.bad("window", "must be a whole number of milliseconds");
                }
                if let Some(l) = n.limit
                    && kind == Kind::SlidingWindow
                    && l.saturating_mul(w / MILLI) > (1 << 51)
                {
                    f.bad("limit", "limit × window in ms must stay below 2^51; use a fixed_window for large quotas");
                }
            }
            let (limit, window) = (n.limit?, window?);
            let start = if n.first_request == Some(true) {
                crate::algo::WindowStart::FirstRequest
            } else {
                crate::algo::WindowStart::Epoch
            };
            Some(if kind == Kind::SlidingLog {
                Params::SlidingLog { limit, window }
            } else {
                Params::SlidingWindow {
                    limit,
                    window,
                    start,
                }
            })
        }
        Kind::Concurrency => {
            let timeout = match n.timeout {
                Some(t) => fixed(f, "timeout", Some(t))?,
                None => 60 * SECOND,
            };
            Some(Params::Concurrency {
                limit: n.limit?,
                timeout,
            })
        }
        Kind::LeakyQueue => {
            let rate = n.rate.or(n.rate_per_s.map(Rate::per_second))?;
            let max_delay = fixed(f, "max_delay", n.max_delay)?;
            if max_delay > MAX_DELAY {
                f.bad(
                    "max_delay",
                    "must be at most 1h: a request held longer is a job for a queue, not a wait",
                );
                return None;
            }
            Some(Params::LeakyQueue { rate, max_delay })
        }
    }
}

/// The longest `max_delay` a shaping rule may give.
const MAX_DELAY: u64 = 3_600 * SECOND;

/// What a `leaky_queue` rule cannot be: exact spacing needs every departure of a key decided
/// in the one store that holds its queue, and a refusal must leave the queue as it was.
fn leaky_queue_limits(f: &mut Fields<'_>, scope: Scope, charge_rejected: bool) {
    if scope == Scope::Global {
        f.bad(
            "scope",
            "global is not possible for leaky_queue: exact spacing needs the one store of a \
             region; other regions' figures arrive late and would let requests out together \
             (use scope: region)",
        );
    }
    if charge_rejected {
        f.bad(
            "charge_rejected",
            "not defined for leaky_queue: a refused request never leaves, so it takes no \
             departure from the queue",
        );
    }
}

/// `window_start: epoch | first_request` (`Some(true)` for `first_request`), `None` when
/// absent or refused.
fn window_start(f: &mut Fields<'_>) -> Option<bool> {
    let s = f.string("window_start", false)?;
    match s.as_str() {
        "epoch" => Some(false),
        "first_request" => Some(true),
        other => {
            f.bad(
                "window_start",
                format!("expected one of epoch | first_request, got {other:?}"),
            );
            None
        }
    }
}

/// What a `window_start: first_request` rule cannot be. Global: regions add their counts per
/// window, which only works when every region's window is the same epoch-aligned one. The
/// hot-key layer's leases, sync gate and local share count units in windows the daemon
/// computes without the key's state, so they would count in the wrong window.
fn first_request_limits(
    f: &mut Fields<'_>,
    params: Option<&Params>,
    scope: Scope,
    hot_keys: Option<&crate::hotkeys::HotKeys>,
) {
    if !params.is_some_and(Params::per_key_window) {
        return;
    }
    if scope == Scope::Global {
        f.bad(
            "window_start",
            "first_request is not possible with scope: global: regions add their counts per window, so every region's windows must be the same epoch-aligned ones (use window_start: epoch, or scope: region)",
        );
    }
    if let Some(hk) = hot_keys {
        let what = if hk.lease != crate::hotkeys::LeaseMode::Off {
            Some("hot_keys.lease")
        } else if hk.sync_interval.is_some() {
            Some("hot_keys.sync_interval")
        } else if hk.local_share {
            Some("hot_keys.local_share")
        } else {
            None
        };
        if let Some(what) = what {
            f.bad(
                "window_start",
                format!("first_request is not possible with {what}: the daemon would count its units in windows it cannot see (the key's own start is in the store)"),
            );
        }
    }
}

/// A fixed window aligned to a time zone's calendar: 1h, 1d, 1w or 1mo.
fn calendar(f: &mut Fields<'_>, window: Span, tz: &str) -> Option<Calendar> {
    let unit = match window {
        Span::Fixed(us) if us == 3_600 * SECOND => CalendarUnit::Hour,
        Span::Fixed(us) if us == 86_400 * SECOND => CalendarUnit::Day,
        Span::Fixed(us) if us == 7 * 86_400 * SECOND => CalendarUnit::Week,
        Span::Months(1) => CalendarUnit::Month,
        _ => {
            f.bad(
                "window",
                "with calendar_tz the window must be 1h, 1d, 1w or 1mo",
            );
            return None;
        }
    };
    let c = Calendar::new(unit, tz);
    if c.is_none() {
        f.bad("calendar_tz", format!("unknown IANA time zone {tz:?}"));
    }
    c
}

/// A duration in microseconds; months are refused (they only mean something on a calendar).
fn fixed(f: &mut Fields<'_>, field: &str, s: Option<Span>) -> Option<u64> {
    match s? {
        Span::Fixed(us) => Some(us),
        Span::Months(_) => {
            f.bad(
                field,
                "months only make sense with calendar_tz on a fixed_window",
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::rules::{FailureMode, parse_yaml};

    #[test]
    fn a_rule_that_names_no_failure_mode_fails_open() {
        let set = parse_yaml(
            "domain: d\nrules:\n  - { id: r, key: [api_key], algorithm: gcra, rate_per_s: 1, burst: 1 }\n",
        )
        .expect("valid");
        let r = &set.domain("d").expect("domain").rules[0];
        assert_eq!(r.on_store_failure, FailureMode::Open);
    }

    #[test]
    fn every_problem_is_reported_with_rule_and_field() {
        let bad = r#"
domain: api
rules:
  - id: a
    key: [api_key]
    algorithm: token_bucket
    rate_per_s: 0
  - id: b
    key: [user]
    algorithm: fixed_window
    limit: 10
    window: 1x
    colour: red
  - id: c
    key: [user]
    algorithm: leaky
  - id: a
    key: [user]
    algorithm: sliding_log
    limit: 100000
    window: 1m
  - id: tz
    key: [user]
    algorithm: fixed_window
    limit: 5
    window: 1d
    calendar_tz: Mars/Olympus
"#;
        let err = parse_yaml(bad).expect_err("invalid");
        let got: Vec<(String, String)> = err
            .problems
            .iter()
            .map(|p| (p.at.clone(), p.field.clone()))
            .collect();
        for want in [
            ("a", "rate_per_s"),
            ("a", "burst"),
            ("b", "window"),
            ("b", "colour"),
            ("c", "algorithm"),
            ("a", "limit"),
            ("tz", "calendar_tz"),
        ] {
            assert!(
                got.contains(&(want.0.to_string(), want.1.to_string())),
                "missing {want:?} in {err}"
            );
        }
    }

    #[test]
    fn a_title_is_a_bounded_line_of_text() {
        let rules = |title: &str| {
            format!(
                "domain: d\nrules:\n  - {{ id: r, key: [u], algorithm: fixed_window, limit: 5, window: 1m, title: {title} }}\n"
            )
        };
        let set = parse_yaml(&rules("\"Login attempts per account\"")).expect("valid");
        let r = &set.domain("d").expect("domain").rules[0];
        assert_eq!(r.title.as_deref(), Some("Login attempts per account"));
        let long = format!("\"{}\"", "x".repeat(121));
        for (bad, why) in [
            ("\"\"", "must not be empty"),
            (long.as_str(), "at most 120"),
            ("\"two\\nlines\"", "control characters"),
            ("[a]", "expected a string"),
        ] {
            let err = parse_yaml(&rules(bad)).expect_err(bad);
            assert!(
                err.problems
                    .iter()
                    .any(|p| p.at == "r" && p.field == "title" && p.message.contains(why)),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_bucket_rate_is_a_count_over_a_duration() {
        let doc = |f: &str| {
            format!(
                "domain: d\nrules:\n  - {{ id: r, key: [u], algorithm: gcra, burst: 3, {f} }}\n"
            )
        };
        let set = parse_yaml(&doc("rate: 10/1m")).expect("valid");
        let p = &set.domain("d").expect("domain").rules[0].params;
        assert_eq!(p.window(), 18 * crate::time::SECOND, "3 at one per 6 s");
        for (bad, why) in [
            ("rate: 10", "expected a rate like 10/1m"),
            ("rate: 10/1mo", "not months"),
            ("rate: 0/1m", "greater than zero"),
            ("rate: \"10/fortnight\"", "expected a rate like 10/1m"),
        ] {
            let err = parse_yaml(&doc(bad)).expect_err(bad);
            assert!(
                err.problems
                    .iter()
                    .any(|p| p.at == "r" && p.field == "rate" && p.message.contains(why)),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_bad_id_is_reported_at_the_rule_position() {
        // Found by the fuzzer: an empty id used to yield a problem located at "".
        let err = parse_yaml("domain: a\nrules:\n  - { id: \"\" }\n").expect_err("invalid");
        assert!(err.problems.iter().all(|p| p.at == "rules[0]"), "{err}");
        assert!(err.problems.iter().any(|p| p.field == "id"), "{err}");
    }
}
