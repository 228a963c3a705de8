//! The HTTP JSON API (`POST /v1/limits:check`, `POST /v1/limits:release`), `/healthz` and
//! `/metrics`. Bodies are parsed by hand from bytes so that every malformed body gets a 400
//! with a message that says what is wrong, never a 500.
//!
//! Bodies are bounded by `limits.max_message_bytes` (413) and `limits.body_timeout_ms` (408);
//! checks past `limits.max_in_flight` are shed with a 503 and `Retry-After: 1`
//! ([`crate::limits`]).

use crate::engine::{CheckError, Checked, Engine};
use crate::limits::{BodyLimits, Guard, Port};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sluice_core::decision::{PolicyStatus, QuotaUnit, headers};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A parsed `POST /v1/limits:check` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    /// The rules domain.
    pub domain: String,
    /// Descriptor name → value (strings only).
    #[serde(default)]
    pub descriptors: BTreeMap<String, String>,
    /// Units asked for; absent = 1.
    pub cost: Option<u64>,
}

/// Parses a check body; the error is the message the client gets with its 400.
pub fn parse_check(body: &[u8]) -> Result<CheckBody, String> {
    serde_json::from_slice(body).map_err(|e| format!("invalid check body: {e}"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    domain: String,
    #[serde(default)]
    descriptors: BTreeMap<String, String>,
    request_id: String,
}

fn bad_request(msg: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({ "error": msg.to_string() })),
    )
        .into_response()
}

/// The JSON form of a decision: the check API's answer (README, "The check API").
pub fn decision_json(c: &Checked) -> Value {
    let d = &c.decision;
    let hdrs: serde_json::Map<String, Value> = headers(d)
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::String(v)))
        .collect();
    json!({
        "allowed": d.allowed(),
        "code": d.code.as_str(),
        "decided_by": d.decided_by.as_deref(),
        "retry_after_ms": d.retry_after_ms,
        "policies": d.policies.iter().map(policy_json).collect::<Vec<_>>(),
        "rules_version": d.rules_version,
        "headers": hdrs,
        "shadow_denied": d.shadow_denied.iter().map(|s| &**s).collect::<Vec<_>>(),
        "request_id": c.request_id,
        "release": d.holds_slot,
        "delay_ms": d.delay_ms,
        "decided_at_us": c.decided_at,
    })
}

/// One policy of [`decision_json`]: its figures, or for a `retry_only` rule its id alone
/// (`"retry_only": true`): the wait is the decision's `retry_after_ms`. Its `title` when the
/// rule has one, and `quota_unit` when it is not `requests` (a concurrency rule's
/// `concurrent-requests`).
fn policy_json(p: &PolicyStatus) -> Value {
    let mut v = if p.figures_visible() {
        json!({
            "id": &*p.id, "limit": p.limit, "window_s": p.window_s,
            "remaining": p.remaining, "reset_s": p.reset_s,
        })
    } else {
        json!({ "id": &*p.id, "retry_only": true })
    };
    if let Some(t) = &p.title {
        v["title"] = Value::String(t.to_string());
    }
    if p.unit != QuotaUnit::Requests {
        v["quota_unit"] = Value::String(p.unit.as_str().into());
    }
    v
}

fn check_error(e: CheckError) -> Response {
    bad_request(e)
}

/// What an HTTP check and a release share: a place within `max_in_flight` (past it, the
/// shed answer), the body parsed as `B` (else a 400 naming `what`, counted in `bad` when
/// given), `run` on it while the place is held, and its answer as JSON.
async fn guarded<B, F, Fut>(
    guard: &Guard,
    body: &[u8],
    what: &str,
    bad: Option<&AtomicU64>,
    run: F,
) -> Response
where
    B: DeserializeOwned,
    F: FnOnce(B) -> Fut,
    Fut: Future<Output = Result<Value, CheckError>>,
{
    let Some(_in_flight) = guard.enter(Port::Http) else {
        return crate::limits::shed_response(guard);
    };
    let b: B = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => {
            if let Some(bad) = bad {
                bad.fetch_add(1, Ordering::Relaxed);
            }
            return bad_request(format!("invalid {what} body: {e}"));
        }
    };
    match run(b).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => check_error(e),
    }
}

async fn check(
    State(engine): State<Arc<Engine>>,
    Extension(guard): Extension<Arc<Guard>>,
    body: Bytes,
) -> Response {
    let engine = &*engine;
    let bad = Some(&engine.metrics.bad_requests);
    guarded(&guard, &body, "check", bad, |b: CheckBody| async move {
        let descriptors = b.descriptors.into_iter().collect();
        let c = engine
            .check(&b.domain, descriptors, b.cost.unwrap_or(1))
            .await?;
        Ok(decision_json(&c))
    })
    .await
}

async fn release(
    State(engine): State<Arc<Engine>>,
    Extension(guard): Extension<Arc<Guard>>,
    body: Bytes,
) -> Response {
    guarded(
        &guard,
        &body,
        "release",
        None,
        |b: ReleaseBody| async move {
            let descriptors = b.descriptors.into_iter().collect();
            let n = engine
                .release(&b.domain, descriptors, &b.request_id)
                .await?;
            Ok(json!({ "released": n }))
        },
    )
    .await
}

async fn healthz(State(engine): State<Arc<Engine>>) -> Response {
    axum::Json(json!({ "status": "ok", "rules_version": engine.rules.version(), "store": engine.store.kind() }))
        .into_response()
}

async fn metrics(State(engine): State<Arc<Engine>>) -> Response {
    let rules = engine.rules.load();
    let mut text = engine.metrics.render(&[
        (
            "sluice_rules_version",
            "Version of the rules this daemon serves.",
            rules.version,
        ),
        (
            "sluice_rules_loaded",
            "Rules loaded over all domains.",
            rules.rule_count() as u64,
        ),
        (
            "sluice_local_keys",
            "Keys held in local fallback buckets.",
            engine.local.len() as u64,
        ),
    ]);
    text.push_str(&format!(
        "# HELP sluice_store_noscript_reloads_total Lua scripts reloaded after NOSCRIPT (restarted or failed-over Redis).\n# TYPE sluice_store_noscript_reloads_total counter\nsluice_store_noscript_reloads_total {}\n",
        engine.store.noscript_reloads()
    ));
    let (runs, batched) = engine.store.batch_stats();
    text.push_str(&format!(
        "# HELP sluice_store_script_runs_total Check script runs sent to the store (one per batch).\n# TYPE sluice_store_script_runs_total counter\nsluice_store_script_runs_total {runs}\n# HELP sluice_store_batched_calls_total Checks those runs carried: divided by the runs, the mean batch.\n# TYPE sluice_store_batched_calls_total counter\nsluice_store_batched_calls_total {batched}\n"
    ));
    let late = engine.store.late_replies();
    text.push_str("# HELP sluice_store_late_calls_total Store calls whose caller had given up (deadline passed), by what became of them: ran (may have taken units nobody was told of), stale (refused by the stale bound, nothing changed), lost (no reply: outcome unknown).\n# TYPE sluice_store_late_calls_total counter\n");
    for (result, n) in [
        ("ran", late.ran),
        ("stale", late.stale),
        ("lost", late.lost),
    ] {
        text.push_str(&format!(
            "sluice_store_late_calls_total{{result=\"{result}\"}} {n}\n"
        ));
    }
    text.push_str(&format!(
        "# HELP sluice_store_skewed_calls_total Calls refused as stale while still awaited (this host's clock behind the store's), re-sent unbounded.\n# TYPE sluice_store_skewed_calls_total counter\nsluice_store_skewed_calls_total {}\n",
        late.skewed
    ));
    if let Some(j) = &engine.journal {
        text.push_str(&format!(
            "# HELP sluice_journal_backlog Quota admissions waiting to be replayed.\n# TYPE sluice_journal_backlog gauge\nsluice_journal_backlog {}\n# HELP sluice_journal_replayed_total Quota admissions replayed into the store.\n# TYPE sluice_journal_replayed_total counter\nsluice_journal_replayed_total {}\n",
            j.backlog(),
            j.replayed()
        ));
    }
    crate::stores::render(&engine, &mut text);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": "no such endpoint" })),
    )
        .into_response()
}

/// The public HTTP router, within `guard`'s limits.
pub fn router(engine: Arc<Engine>, guard: Arc<Guard>) -> Router {
    let max = guard.limits().max_message_bytes;
    let bounds = BodyLimits {
        guard: guard.clone(),
        port: Port::Http,
        max_bytes: Some(max),
    };
    Router::new()
        .route("/v1/limits:check", post(check))
        .route("/v1/limits:release", post(release))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max))
        .layer(axum::middleware::from_fn_with_state(
            bounds,
            crate::limits::bounded_body,
        ))
        .layer(Extension(guard))
        .with_state(engine)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::Engine;
    use crate::metrics::Metrics;
    use proptest::prelude::*;
    use sluice_control::Published;
    use sluice_core::rules::parse_yaml;
    use sluice_store::MemoryStore;
    use std::time::Duration;

    fn engine() -> Engine {
        engine_of(
            "domain: d\nrules:\n  - { id: a, key: [k], algorithm: token_bucket, rate_per_s: 5, burst: 5 }\n",
        )
    }

    fn engine_of(yaml: &str) -> Engine {
        let rules = parse_yaml(yaml).expect("valid");
        Engine::new(
            Published::new(rules),
            Arc::new(MemoryStore::default()),
            Arc::new(Metrics::default()),
            500,
            Duration::from_millis(3),
            "t".into(),
            Default::default(),
        )
    }

    /// A refusal by a `retry_only` rule (`otp`) next to a visible one (`burst`), as the
    /// engine reports it: every figure present in the core.
    pub(crate) fn retry_only_refusal() -> Checked {
        use sluice_core::decision::{Code, Decision, QuotaUnit, Via};
        use sluice_core::rules::HeaderMode;
        let p = |id: &str, limit, window_s, remaining, reset_s, headers| PolicyStatus {
            id: Arc::from(id),
            limit,
            window_s,
            remaining,
            reset_s,
            allowed: remaining > 0,
            retry_after_ms: if remaining > 0 { 0 } else { 60_000 },
            headers,
            via: Via::Store,
            unit: QuotaUnit::Requests,
            title: None,
        };
        let mut d = Decision::unlimited(3);
        d.code = Code::OverLimit;
        d.decided_by = Some(Arc::from("otp"));
        d.retry_after_ms = 60_000;
        d.policies = vec![
            p("burst", 10, 1, 7, 1, HeaderMode::Full),
            p("otp", 5, 3600, 0, 60, HeaderMode::RetryOnly),
        ];
        Checked {
            decision: d,
            request_id: "r1".into(),
            decided_at: 0,
        }
    }

    #[test]
    fn a_retry_only_rule_shows_no_figures() {
        let v = decision_json(&retry_only_refusal());
        assert_eq!(v["decided_by"], "otp");
        assert_eq!(v["retry_after_ms"], 60_000);
        assert_eq!(v["policies"][1], json!({ "id": "otp", "retry_only": true }));
        assert_eq!(
            v["policies"][0],
            json!({ "id": "burst", "limit": 10, "window_s": 1, "remaining": 7, "reset_s": 1 })
        );
        assert_eq!(v["headers"]["Retry-After"], "60");
        let headers = v["headers"].to_string();
        assert!(!headers.contains("otp"), "{headers}");
    }

    #[test]
    fn the_answer_says_when_a_slot_needs_a_release() {
        let e = engine_of(
            "domain: d\nrules:\n  - { id: a, key: [k], algorithm: token_bucket, rate_per_s: 5, burst: 5 }\n  - { id: c, key: [c], algorithm: concurrency, limit: 1, mode: shadow }\n",
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let check = |k: &str| {
            let c = rt
                .block_on(e.check("d", vec![(k.to_string(), "x".to_string())], 1))
                .expect("decided");
            (
                decision_json(&c)["release"].clone(),
                crate::grpc::check_response(c).release,
            )
        };
        // No concurrency rule applies: nothing to release.
        assert_eq!(check("k"), (json!(false), false));
        // A shadow concurrency rule, not among the policies, took the slot...
        assert_eq!(check("c"), (json!(true), true));
        // ...and a check it would have refused took none.
        assert_eq!(check("c"), (json!(false), false));
    }

    fn json_ish() -> impl Strategy<Value = String> {
        let atom = prop_oneof![
            Just("\"domain\"".to_string()),
            Just("\"d\"".to_string()),
            Just("\"descriptors\"".to_string()),
            Just("\"cost\"".to_string()),
            Just("\"k\"".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just(":".to_string()),
            Just(",".to_string()),
            Just("[".to_string()),
            Just("null".to_string()),
            Just("-1".to_string()),
            Just("18446744073709551616".to_string()),
            (0u64..u64::MAX).prop_map(|n| n.to_string()),
            "\"[^\"\\\\]{0,8}\"",
        ];
        prop::collection::vec(atom, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// Every body is either a decision or a 400 with a message: never a panic.
        #[test]
        fn check_bodies_never_panic(body in prop_oneof![json_ish(), ".{0,64}".prop_map(String::from)]) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let e = engine();
            match parse_check(body.as_bytes()) {
                Ok(b) => {
                    let r = rt.block_on(e.check(&b.domain, b.descriptors.into_iter().collect(), b.cost.unwrap_or(1)));
                    if let Err(err) = r {
                        prop_assert!(!err.to_string().is_empty());
                    }
                }
                Err(msg) => prop_assert!(msg.starts_with("invalid check body")),
            }
        }
    }
}
