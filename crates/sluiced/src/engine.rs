//! The hot path, as a thin async shell around the core: load the rule snapshot, plan with the
//! core, run one store call per identity (concurrently, each under its deadline), fall back to
//! local buckets where a call failed, and let the core decide.
//!
//! Nothing a check does can take the daemon's answer away: a store call goes through its
//! shard's guard ([`sluice_core::guard`]: the breaker, what the call's ending counts as, when
//! local buckets are dropped, what is journaled) with a ticket that is given back however the
//! call ends (a cancelled check leaks no probe), and a panic anywhere in deciding takes the
//! rules' failure path ([`sluice_core::decision::without_store`]).

use crate::clock::{Clock, SystemClock};
use crate::metrics::Metrics;
use futures_util::FutureExt as _;
use sluice_control::Published;
use sluice_core::algo::{Kind, MAX_LIMIT};
use sluice_core::breaker::{BreakerConfig, BreakerState};
use sluice_core::decision::{Answer, Code, Decision, Plan, Spare, plan_into};
use sluice_core::guard::{Admit, Ended, StoreGuard, Transition};
use sluice_core::matching::{Descriptors, InputError, applicable};
use sluice_core::{Micros, Remote};
use sluice_store::{MemoryStore, Store, StoreError};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod held;
use held::{HeldTicket, LeaseInFlight, Target};

/// Why a check was refused as input (HTTP 400 / gRPC `INVALID_ARGUMENT`).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// No rules for that domain.
    #[error("unknown domain {0:?}")]
    UnknownDomain(String),
    /// Descriptors out of bounds.
    #[error(transparent)]
    Input(#[from] InputError),
    /// Cost out of range.
    #[error("cost {0} is out of range (0 to {MAX_LIMIT})")]
    Cost(u64),
    /// Missing domain.
    #[error("domain is required")]
    NoDomain,
}

/// A decision and the id that releases its concurrency slots.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The decision.
    pub decision: Decision,
    /// Pass to release.
    pub request_id: String,
    /// When the engine decided (epoch µs, its clock): a shaped request leaves at this plus
    /// its `delay_ms`, however long the answer took to reach the caller.
    pub decided_at: Micros,
}

/// Supplies other regions' counts for global rules (the merge layer).
pub trait RemoteSource: Send + Sync {
    /// Remote counts for a store key at `now`.
    fn remote(&self, key: &str, params: &sluice_core::Params, now: Micros) -> Remote;
}

/// Told, after each decision, what the store answered: the delta shipper's input
/// (crate::regions records each global rule's region figure for the next shipment).
pub trait UsageSink: Send + Sync {
    /// Called once per decided check with its plan and the answers of its store calls.
    fn observe(&self, plan: &sluice_core::decision::Plan<'_>, answers: &[Answer], now: Micros);
}

/// Everything a check needs.
pub struct Engine {
    /// Live rules.
    pub rules: Arc<Published>,
    /// The shared counter store.
    pub store: Arc<dyn Store>,
    /// Per-daemon buckets for `on_store_failure: local`.
    pub local: MemoryStore,
    /// Exported counters.
    pub metrics: Arc<Metrics>,
    /// Local bucket size, per mille of the rule's numbers.
    pub(crate) local_permille: u64,
    /// Deadline of one store call.
    pub(crate) store_timeout: Duration,
    /// Remote counts for global rules, when regions are configured.
    pub remote: Option<Arc<dyn RemoteSource>>,
    /// Receives each decision's global figures, when regions are configured.
    pub usage: Option<Arc<dyn UsageSink>>,
    /// Admissions to quotas decided while the store failed, replayed once it is back.
    pub journal: Option<Arc<crate::journal::Journal>>,
    /// The hot-key layer: cached refusals and leases (none: every call asks the store).
    pub hot: Option<Arc<crate::hot::HotKeys>>,
    /// The decision log: a sampled record of checks on local disk (none: off).
    pub decisions: Option<Arc<crate::decisions::DecisionLog>>,
    /// One guard per store shard (shard index modulo [`BREAKERS`]); without a breaker for a
    /// store without outages.
    guards: Vec<Mutex<StoreGuard>>,
    /// The main store's failure-mode answers (named stores count their own).
    failures: crate::stores::FailureAnswers,
    /// The named stores (`stores:`), each with its own guards, fallback and journal.
    named: Vec<crate::stores::Backend>,
    /// Wall time for rules and stores, monotonic time for the breakers.
    clock: Arc<dyn Clock>,
    daemon_tag: String,
    seq: AtomicU64,
}

/// Breakers kept: a Redis Cluster's node index picks one (modulo this).
pub const BREAKERS: usize = 64;

impl Engine {
    /// An engine over a store and a rule publication.
    pub fn new(
        rules: Arc<Published>,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        local_permille: u64,
        store_timeout: Duration,
        daemon_tag: String,
        breaker: BreakerConfig,
    ) -> Engine {
        // A store without outages (in memory) has nothing to guard: no lock per call.
        Engine {
            guards: crate::stores::guards(store.as_ref(), breaker),
            failures: crate::stores::FailureAnswers::default(),
            named: Vec::new(),
            clock: Arc::new(SystemClock::new()),
            rules,
            store,
            local: MemoryStore::new(100_000),
            metrics,
            local_permille,
            store_timeout,
            remote: None,
            usage: None,
            journal: None,
            hot: None,
            decisions: None,
            daemon_tag,
            seq: AtomicU64::new(0),
        }
    }

    /// The engine on another clock (tests drive it in virtual time).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Engine {
        self.clock = clock;
        self
    }

    /// The clocks the engine reads, for the parts of the daemon beside it (the gossip node).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// Wall-clock now as the engine reads it (epoch µs).
    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    /// Adds a named store (`stores:`): rules and overrides naming it count there.
    pub fn add_store(&mut self, b: crate::stores::Backend) {
        self.metrics
            .named_store_latency
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push((b.name.clone(), b.latency.clone()));
        self.named.push(b);
    }

    /// The named stores.
    pub fn named_stores(&self) -> &[crate::stores::Backend] {
        &self.named
    }

    /// What a call to `store` (`None`: the main one) goes through; `None` for a name the
    /// engine lacks (a published set never names one: the daemon refuses such sets).
    fn target(&self, store: Option<&str>) -> Option<Target<'_>> {
        match store {
            None => Some(Target {
                name: sluice_core::stores::DEFAULT,
                store: self.store.as_ref(),
                timeout: self.store_timeout,
                guards: &self.guards,
                local: &self.local,
                latency: &self.metrics.store_latency,
                failures: &self.failures,
                journal: self.journal.as_ref(),
            }),
            Some(name) => self
                .named
                .iter()
                .find(|b| &*b.name == name)
                .map(|b| Target {
                    name: &b.name,
                    store: b.store.as_ref(),
                    timeout: b.timeout,
                    guards: &b.guards,
                    local: &b.local,
                    latency: &b.latency,
                    failures: &b.failures,
                    journal: b.journal.as_ref(),
                }),
        }
    }

    /// Breaker state per shard of the main store, for `/metrics` (shard 0 and shards whose
    /// breaker ever opened; none for a store without outages).
    pub fn breaker_states(&self) -> Vec<(usize, BreakerState, u64)> {
        crate::stores::states(&self.guards)
    }

    /// Breaker state per store and shard: the main store (`default`) first, then each named
    /// store.
    pub fn store_breakers(&self) -> Vec<(&str, usize, BreakerState, u64)> {
        let main = self
            .breaker_states()
            .into_iter()
            .map(|(i, s, o)| (sluice_core::stores::DEFAULT, i, s, o));
        let named = self.named.iter().flat_map(|b| {
            crate::stores::states(&b.guards)
                .into_iter()
                .map(|(i, s, o)| (&*b.name, i, s, o))
        });
        main.chain(named).collect()
    }

    /// Failure-mode answers per store, the main one first.
    pub fn store_failures(&self) -> Vec<(&str, &crate::stores::FailureAnswers)> {
        std::iter::once((sluice_core::stores::DEFAULT, &self.failures))
            .chain(self.named.iter().map(|b| (&*b.name, &b.failures)))
            .collect()
    }

    /// A call to the main store ([`Engine::call_store_in`]).
    pub(crate) async fn call_store(
        &self,
        call: &sluice_core::batch::Call,
    ) -> Result<sluice_core::batch::CallResult, StoreError> {
        self.call_store_in(None, call).await
    }

    /// One store call to `store` (`None`: the main one): admitted by the shard's guard,
    /// under the store's deadline, with panics in the store path turned into failures (a bug
    /// takes the same path as an outage); the guard is told how it ended and says what to do
    /// about the shard.
    pub(crate) async fn call_store_in(
        &self,
        store: Option<&str>,
        call: &sluice_core::batch::Call,
    ) -> Result<sluice_core::batch::CallResult, StoreError> {
        let Some(tg) = self.target(store) else {
            self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(format!(
                "no store named {:?}",
                store.unwrap_or_default()
            )));
        };
        let key = call
            .items
            .first()
            .map(|i| i.key.as_str())
            .unwrap_or_default();
        let shard = tg.shard(key);
        // Held across the await: dropped with the check if it is cancelled, which gives the
        // ticket back (a half-open probe would otherwise never report).
        let admitted =
            crate::stores::lock(tg.guards, shard).map(|mut g| g.admit(self.clock.monotonic()));
        let held = match admitted {
            Some(Admit::Send(t)) => HeldTicket::new(tg.guards, shard, Some(t)),
            None => HeldTicket::new(tg.guards, shard, None),
            Some(Admit::Refused) => {
                return Err(StoreError::Unavailable("circuit breaker open".into()));
            }
        };
        let t = Instant::now();
        let fut =
            AssertUnwindSafe(tokio::time::timeout(tg.timeout, tg.store.check(call))).catch_unwind();
        let (r, ended) = match fut.await {
            Ok(Ok(Ok(r))) => (Ok(r), Ended::Answered),
            Ok(Ok(Err(e))) => {
                let outage = e.is_outage();
                (Err(e), Ended::Failed { outage })
            }
            Ok(Err(_)) => (
                Err(StoreError::Timeout(tg.timeout.as_millis() as u64)),
                Ended::DeadlineMissed,
            ),
            Err(_) => {
                tracing::error!("panic in the store path; treating it as a store failure");
                let e = StoreError::Server("internal error (panic) in the store path".into());
                let outage = e.is_outage();
                (Err(e), Ended::Failed { outage })
            }
        };
        tg.latency.observe(t.elapsed().as_secs_f64());
        let transition = held.done().and_then(|t| {
            crate::stores::lock(tg.guards, shard)
                .and_then(|mut g| g.finish(self.clock.monotonic(), t, ended))
        });
        match transition {
            Some(Transition::Opened) => {
                tracing::warn!(store = tg.name, shard, "store breaker opened")
            }
            Some(Transition::Closed) => {
                tracing::info!(
                    store = tg.name,
                    shard,
                    "store breaker closed; dropping its local buckets"
                );
                // Only this shard's: identities on shards still down keep theirs.
                tg.local.retain_keys(|k| tg.shard(k) != shard);
            }
            None => {}
        }
        if let Err(e) = &r {
            self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, retryable = e.retryable(), "store call failed");
        }
        r
    }

    /// Decides one request.
    pub async fn check(
        &self,
        domain: &str,
        descriptors: Vec<(String, String)>,
        cost: u64,
    ) -> Result<Checked, CheckError> {
        self.check_waiting(domain, descriptors, cost, true).await
    }

    /// [`Engine::check`] for a caller that cannot wait before sending a request on (Envoy's
    /// rate limit service): `wait: false` makes a `leaky_queue` rule refuse a request that
    /// would have to wait, rather than admit it with a delay (`algo::without_waiting`).
    pub async fn check_waiting(
        &self,
        domain: &str,
        descriptors: Vec<(String, String)>,
        cost: u64,
        wait: bool,
    ) -> Result<Checked, CheckError> {
        let started = Instant::now();
        let r = self.check_inner(domain, descriptors, cost, wait).await;
        match &r {
            Ok(c) => self.decided(started, &c.decision),
            Err(_) => {
                self.metrics
                    .check_latency
                    .observe(started.elapsed().as_secs_f64());
                self.metrics.bad_requests.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    /// Counts a decision begun at `started`: its latency and its code.
    pub(crate) fn decided(&self, started: Instant, d: &Decision) {
        self.metrics
            .check_latency
            .observe(started.elapsed().as_secs_f64());
        let counter = match d.code {
            Code::Ok => &self.metrics.checks_ok,
            Code::OverLimit => &self.metrics.checks_over_limit,
            Code::Unavailable => &self.metrics.checks_unavailable,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    async fn check_inner(
        &self,
        domain: &str,
        descriptors: Vec<(String, String)>,
        cost: u64,
        wait: bool,
    ) -> Result<Checked, CheckError> {
        if domain.is_empty() {
            return Err(CheckError::NoDomain);
        }
        if cost > MAX_LIMIT {
            return Err(CheckError::Cost(cost));
        }
        let d = Descriptors::new(descriptors)?;
        let rules = self.rules.load();
        let dom = rules
            .domain(domain)
            .ok_or_else(|| CheckError::UnknownDomain(domain.chars().take(128).collect()))?;
        sluice_core::matching::check(dom, &d, cost)?;
        let now = self.clock.now();
        let request_id = request_id(&self.daemon_tag, self.seq.fetch_add(1, Ordering::Relaxed));
        let decided =
            AssertUnwindSafe(self.decide(rules.version, dom, &d, now, cost, &request_id, wait))
                .catch_unwind()
                .await;
        let decision = match decided {
            Ok(decision) => decision,
            Err(_) => {
                self.metrics.panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    domain = %dom.name,
                    "panic while deciding a check; the rules' failure modes answer"
                );
                std::panic::catch_unwind(AssertUnwindSafe(|| {
                    sluice_core::decision::without_store(dom, &d, now, cost, rules.version)
                }))
                .unwrap_or_else(|_| sluice_core::decision::undecidable(dom, rules.version))
            }
        };
        Ok(Checked {
            decision,
            request_id,
            decided_at: now,
        })
    }

    /// Plans, asks the store, decides and tells the observers: everything of a check that a
    /// bug could make panic, so [`Engine::check`] can answer by the failure modes instead.
    // The check's inputs, each used once: a struct for them would only be unpacked here.
    #[allow(clippy::too_many_arguments)]
    async fn decide(
        &self,
        version: u64,
        dom: &sluice_core::rules::Domain,
        d: &Descriptors,
        now: Micros,
        cost: u64,
        request_id: &str,
        wait: bool,
    ) -> Decision {
        let remote = self.remote.as_deref();
        let mut p = Plan::from_spare(take_spare());
        plan_into(&mut p, dom, d, now, cost, request_id, |a| {
            remote
                .map(|r| r.remote(&a.key, &a.params, now))
                .unwrap_or_default()
        });
        if !wait {
            for pc in &mut p.calls {
                sluice_core::algo::without_waiting(&mut pc.call);
            }
        }
        let answers = self.answers(&p, version).await;
        let decision = p.decide(version, &answers);
        self.count(dom, &decision);
        if !decision.shadow_denied.is_empty() {
            log_shadow(&p, &answers);
        }
        if let Some(log) = &self.decisions {
            let c = crate::decisions::record::Check {
                descriptors: d,
                cost,
                request_id,
                now,
            };
            log.observe(&dom.name, &p, &decision, &c);
        }
        if let Some(u) = &self.usage {
            u.observe(&p, &answers, now);
        }
        if self.journal.is_some() {
            for (store, key, window, units) in
                sluice_core::guard::journaled(&p, &answers, &decision, cost)
            {
                // Into the journal of the store the key's call went to.
                let Some(j) = self.target(store).and_then(|t| t.journal) else {
                    continue;
                };
                j.record(&crate::journal::Entry {
                    now,
                    cost: units,
                    window: window.clone(),
                    key: key.to_string(),
                });
            }
        }
        put_spare(p.into_spare());
        decision
    }

    /// The answers to a plan's store calls, in order: each through the hot-key layer, its
    /// shard's breaker and the store deadline, with the local fallback when it fails. Every
    /// way a decision is made (rules, Envoy's `limit` overrides) goes through here.
    pub(crate) async fn answers(
        &self,
        p: &sluice_core::decision::Plan<'_>,
        version: u64,
    ) -> Vec<Answer> {
        if p.calls.len() == 1 {
            vec![self.answer(p, 0, version).await]
        } else {
            futures_util::future::join_all((0..p.calls.len()).map(|i| self.answer(p, i, version)))
                .await
        }
    }

    async fn answer(&self, p: &sluice_core::decision::Plan<'_>, i: usize, version: u64) -> Answer {
        let store = p.store_of(i);
        let r = match &self.hot {
            Some(hot) => self.through_hot_keys(hot, p, i, version).await,
            None => self.call_store_in(store, &p.calls[i].call).await,
        };
        let tg = self.target(store);
        let local = tg.as_ref().map_or(&self.local, |t| t.local);
        if r.is_err() {
            let failures = tg.as_ref().map_or(&self.failures, |t| t.failures);
            failures.add(sluice_core::guard::failure_tally(p, i));
        }
        sluice_core::guard::answer(p, i, r.ok(), self.local_permille, |c| {
            local.check_sync(c).ok()
        })
    }

    /// Call `i` through the hot-key layer: answered by the layer (a cached refusal, leased
    /// units), sent as planned, or sent as a lease call. The core decides each step; this
    /// only runs the store calls and waits where a lease call is in flight.
    async fn through_hot_keys(
        &self,
        hot: &crate::hot::HotKeys,
        p: &sluice_core::decision::Plan<'_>,
        i: usize,
        version: u64,
    ) -> Result<sluice_core::batch::CallResult, StoreError> {
        use sluice_core::hotkeys::{CallPolicy, Next, Route, Sent};
        let pc = &p.calls[i];
        let store = p.store_of(i);
        let policy = CallPolicy::of(p, i);
        if policy == CallPolicy::default() {
            return self.call_store_in(store, &pc.call).await;
        }
        let shard = hot.shard_of(&pc.call);
        let first = hot.lock(shard).route(pc, policy, version);
        let mut sent = match first {
            Route::Local(r) => return Ok(r),
            Route::Wait => {
                // Through as many lease calls as it takes (a batch spent before our turn means
                // wait for the next one, not a store call of our own), for at most the store
                // deadline in all: a lease call slower than that is as good as failed.
                let deadline = tokio::time::Instant::now() + self.store_timeout;
                loop {
                    // Registered, then routed again: a lease answered in between still wakes us.
                    let woken = hot.wake(shard).notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    let again = hot.lock(shard).route_after_wait(pc, policy, version);
                    match again {
                        Route::Local(r) => return Ok(r),
                        Route::Wait => {
                            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                                let last = hot.lock(shard).route_after_wait(pc, policy, version);
                                break match last {
                                    Route::Local(r) => return Ok(r),
                                    ref r => Option::<Sent>::from(r).unwrap_or(Sent::Plain),
                                };
                            }
                        }
                        ref r => break Option::<Sent>::from(r).unwrap_or(Sent::Plain),
                    }
                }
            }
            ref r => Option::<Sent>::from(r).unwrap_or(Sent::Plain),
        };
        loop {
            let lease = LeaseInFlight::new(hot, shard, pc, sent);
            let r = self.call_store_in(store, &sent.call(&pc.call)).await;
            let next = match r {
                Ok(r) if !sluice_core::hotkeys::Layer::wants(policy, sent, &r) => return Ok(r),
                Ok(r) => {
                    let next = hot.lock(shard).answered(pc, policy, sent, r);
                    lease.done();
                    next
                }
                Err(e) => {
                    drop(lease);
                    return Err(e);
                }
            };
            match next {
                Next::Answer(r) => return Ok(r),
                Next::Again { batch } => sent = Sent::Lease { batch },
            }
        }
    }

    /// Counts a decision's policies in the per-rule metrics of `domain`.
    pub(crate) fn count(&self, domain: &sluice_core::rules::Domain, d: &Decision) {
        self.metrics.count(&self.rules, domain, d);
    }

    /// Frees the concurrency slots `request_id` holds under the request's rules.
    pub async fn release(
        &self,
        domain: &str,
        descriptors: Vec<(String, String)>,
        request_id: &str,
    ) -> Result<u32, CheckError> {
        let d = Descriptors::new(descriptors)?;
        let rules = self.rules.load();
        let dom = rules
            .domain(domain)
            .ok_or_else(|| CheckError::UnknownDomain(domain.chars().take(128).collect()))?;
        sluice_core::matching::check(dom, &d, 0)?;
        let now = self.clock.now();
        let mut released = 0;
        for a in applicable(dom, &d)
            .iter()
            .filter(|a| a.params.kind() == Kind::Concurrency)
        {
            let Some(tg) = self.target(a.store) else {
                continue;
            };
            let r =
                tokio::time::timeout(tg.timeout, tg.store.release(&a.key, request_id, now)).await;
            let failed = match r {
                Ok(Ok(true)) => {
                    released += 1;
                    None
                }
                Ok(Ok(false)) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some("timed out".to_string()),
            };
            if let Some(error) = failed {
                // Counted always, logged the first time and every 1,000th: an outage fails
                // every release, and a log line each would flood the logs it is read from.
                let n = self
                    .metrics
                    .release_failures
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                if n % 1_000 == 1 {
                    tracing::warn!(%error, failures = n, "release failed; the slot expires on its own (sluice_release_failures_total)");
                }
            }
            tg.local.release_sync(&a.key, request_id, now);
        }
        Ok(released)
    }
}

/// Most plan buffers a thread keeps idle (past them a finished check's are dropped).
const SPARES_PER_THREAD: usize = 8;

thread_local! {
    /// Finished checks' plan buffers ([`Spare`]): taken before planning, given back once
    /// decided, so a request shaped like an earlier one plans without allocating. Per
    /// thread, so no lock; none is held across an await (a check that moved threads gives
    /// its buffers to the other thread's).
    static SPARES: std::cell::RefCell<Vec<Spare>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A finished check's plan buffers, or new ones.
fn take_spare() -> Spare {
    SPARES.with(|s| s.borrow_mut().pop()).unwrap_or_default()
}

/// Keeps a check's plan buffers for the next one on this thread.
fn put_spare(spare: Spare) {
    SPARES.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARES_PER_THREAD {
            s.push(spare);
        }
    });
}

/// The decision log of shadow rules: one structured line per would-be refusal (rule,
/// identity, the wait it would have imposed), for an operator deciding whether to enforce.
fn log_shadow(p: &sluice_core::decision::Plan<'_>, answers: &[Answer]) {
    for (pc, ans) in p.calls.iter().zip(answers) {
        let Answer::Done(r) = ans else { continue };
        for (k, &ri) in pc.rules.iter().enumerate() {
            let a = &p.applied[ri];
            if a.rule.mode != sluice_core::rules::Mode::Shadow {
                continue;
            }
            if let Some(o) = r.outcomes.get(k).filter(|o| !o.allowed) {
                tracing::info!(
                    target: "sluice::shadow",
                    rule = %a.rule.id,
                    identity = %a.identity,
                    would_retry_after_ms = sluice_core::time::ceil_millis(o.retry_after),
                    "shadow rule would have refused"
                );
            }
        }
    }
}

/// `<tag>-<seq>`, a check's request id, built with itoa's digits rather than `format!`: its
/// machinery cost 850 instructions a check, several times the string's own work.
fn request_id(tag: &str, seq: u64) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(seq);
    let mut id = String::with_capacity(tag.len() + 1 + digits.len());
    id.push_str(tag);
    id.push('-');
    id.push_str(digits);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_the_tag_and_the_sequence_in_decimal() {
        assert_eq!(request_id("eu-1", 0), "eu-1-0");
        assert_eq!(request_id("eu-1", 907), "eu-1-907");
        assert_eq!(request_id("", u64::MAX), "-18446744073709551615");
    }
}
