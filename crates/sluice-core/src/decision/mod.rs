//! From matched rules to store calls, and from store answers to a decision and its headers.
//!
//! [`plan`] groups the applicable rules by identity into one [`Call`] each (one atomic store
//! call per identity). The shell runs the calls however it likes (Redis, memory, simulated)
//! and hands the answers to [`Plan::decide`], which also applies each rule's failure mode to
//! calls that failed. Headers and the 429 body are rendered from the decision (`headers.rs`),
//! so every front end (HTTP, gRPC, Envoy) says the same thing.

use crate::algo::{Outcome, Params, Remote};
use crate::batch::{Call, CallResult, Item};
use crate::matching::{Applied, Descriptors};
use crate::rules::{Domain, FailureMode, HeaderMode, Mode};
use crate::time::{Micros, SECOND, ceil_millis, ceil_secs};
use std::sync::Arc;

/// The decision code front ends map to a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Allowed.
    Ok,
    /// Refused: the client is over a limit (HTTP 429).
    OverLimit,
    /// A fail-closed rule could not be decided (HTTP 503, `Retry-After: 1`).
    Unavailable,
}

impl Code {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
            Code::Unavailable => "UNAVAILABLE",
        }
    }
}

/// How a rule's verdict was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The shared store answered.
    Store,
    /// The store failed; a per-daemon local bucket answered.
    Local,
    /// The store failed; the rule fails open.
    FailedOpen,
    /// The store failed; the rule fails closed.
    FailedClosed,
}

/// What a policy's quota counts: the draft's quota unit (`qu` in `RateLimit-Policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuotaUnit {
    /// Requests (units of cost) per window or at a rate: the draft's default, `qu` left out.
    #[default]
    Requests,
    /// Requests in flight at once (a concurrency rule): a slot frees when a request ends, not
    /// at a time, so a refusal may end before its `Retry-After`.
    ConcurrentRequests,
}

impl QuotaUnit {
    /// The draft's name: `requests` or `concurrent-requests`.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaUnit::Requests => "requests",
            QuotaUnit::ConcurrentRequests => "concurrent-requests",
        }
    }

    /// The unit of a rule's numbers.
    pub fn of(params: &Params) -> QuotaUnit {
        match params {
            Params::Concurrency { .. } => QuotaUnit::ConcurrentRequests,
            _ => QuotaUnit::Requests,
        }
    }
}

/// One enforced policy's status, as reported and rendered into headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyStatus {
    /// Rule id.
    pub id: Arc<str>,
    /// Quota.
    pub limit: u64,
    /// Policy window in whole seconds (at least 1).
    pub window_s: u64,
    /// Units left.
    pub remaining: u64,
    /// Seconds until the quota is whole again.
    pub reset_s: u64,
    /// Whether this policy admitted the request.
    pub allowed: bool,
    /// Wait before a retry could pass this policy, ms.
    pub retry_after_ms: u64,
    /// What the client may see of it.
    pub headers: HeaderMode,
    /// How the verdict was reached.
    pub via: Via,
    /// What the quota counts.
    pub unit: QuotaUnit,
    /// The rule's `title`, a sentence for people.
    pub title: Option<Arc<str>>,
}

impl PolicyStatus {
    /// Whether the client may see this policy's figures (limit, window, remaining, reset):
    /// never for a `retry_only` rule, on any API, which tells only the wait of its refusal
    /// (the decision's `retry_after_ms`, `Retry-After`).
    pub fn figures_visible(&self) -> bool {
        self.headers == HeaderMode::Full
    }
}

/// The answer to one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// OK, OVER_LIMIT or UNAVAILABLE.
    pub code: Code,
    /// The refusing rule with the longest wait (None when allowed).
    pub decided_by: Option<Arc<str>>,
    /// How long to wait before retrying, ms (0 when allowed).
    pub retry_after_ms: u64,
    /// Allowed: how long the caller must wait before the request leaves, ms, rounded up so
    /// it never leaves early: the longest delay of the enforced `leaky_queue` rules that
    /// admitted it (0 without one, and for every refusal).
    pub delay_ms: u64,
    /// Enforced policies in rule order.
    pub policies: Vec<PolicyStatus>,
    /// Shadow rules that would have refused.
    pub shadow_denied: Vec<Arc<str>>,
    /// Rules version that decided.
    pub rules_version: u64,
    /// Whether the check took a concurrency slot (an enforced or shadow rule's, from the
    /// store or a local bucket) that only a release gives back before its timeout: a gateway
    /// sends a release exactly when this is set, not one per request.
    pub holds_slot: bool,
}

impl Decision {
    /// Whether the gateway should let the request through.
    pub fn allowed(&self) -> bool {
        self.code == Code::Ok
    }

    /// A decision for a request no rule applies to.
    pub fn unlimited(rules_version: u64) -> Decision {
        Decision {
            code: Code::Ok,
            decided_by: None,
            retry_after_ms: 0,
            delay_ms: 0,
            policies: Vec::new(),
            shadow_denied: Vec::new(),
            rules_version,
            holds_slot: false,
        }
    }
}

/// The decision when deciding itself failed (a bug: the shell caught a panic while matching,
/// planning or deciding). Every rule that applies takes its failure path as if its store had
/// failed, without local buckets (`local` rules fail open): the same answer a dead store
/// would get, never a dropped connection. If matching is what fails, see
/// [`undecidable`].
pub fn without_store(
    domain: &Domain,
    d: &Descriptors,
    now: Micros,
    cost: u64,
    rules_version: u64,
) -> Decision {
    let p = plan(domain, d, now, cost, "", |_| Remote::default());
    let failed = vec![Answer::Failed { local: None }; p.calls.len()];
    p.decide(rules_version, &failed)
}

/// The last resort when not even the rules that apply can be found: `UNAVAILABLE` if the
/// domain has an enforced fail-closed rule (it might have applied, and "closed" asks not to
/// run unlimited), allowed otherwise.
pub fn undecidable(domain: &Domain, rules_version: u64) -> Decision {
    let mut d = Decision::unlimited(rules_version);
    if domain
        .rules
        .iter()
        .any(|r| r.mode == Mode::Enforce && r.on_store_failure == FailureMode::Closed)
    {
        d.code = Code::Unavailable;
        d.retry_after_ms = 1000;
    }
    d
}

/// A store call for one identity and the applied rules it covers.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedCall {
    /// The call to send.
    pub call: Call,
    /// Index into [`Plan::applied`] of each item.
    pub rules: Vec<usize>,
}

/// What the shell got back for a planned call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The store answered.
    Done(CallResult),
    /// The store failed; `local` answers the call's `local` rules (see [`Plan::fallback`]).
    Failed {
        /// The local bucket's result for the fallback call, if there was one.
        local: Option<CallResult>,
    },
}

/// Matched rules grouped into store calls.
///
/// A plan kept across requests of one rule set and refilled by [`plan_into`] reuses its
/// buffers (the rules' identities and keys, the calls' items), so deciding allocates nothing
/// once a request's shape has been seen.
#[derive(Clone, Debug, Default)]
pub struct Plan<'a> {
    /// Every rule that applies.
    pub applied: Vec<Applied<'a>>,
    /// One call per identity, in order of first appearance.
    pub calls: Vec<PlannedCall>,
    /// Identity and key buffers of a recycled plan's rules ([`Spare`]), for the next rules
    /// that apply.
    spare: Vec<(String, String)>,
    /// Matching's working buffers.
    scratch: crate::matching::Scratch,
}

mod headers;
mod spare;
pub use headers::{HeaderSet, headers, headers_of, problem_detail, problem_json, retry_after_secs};
pub use spare::Spare;

/// Matches the request and groups the rules into one call per identity.
///
/// A rule with `hot_keys.split: N` counts under the sub-count `request_id` picks
/// ([`crate::hotkeys::split`]): its identity is the sub-count's, so it gets a call of its own
/// (shared only with split rules of the same identity that picked the same part), and
/// "check all, then take all" no longer spans it and the identity's other rules.
///
/// A rule with a `cost` asks for `cost` times its factor for the request
/// ([`crate::rules::scaled`], capped at [`crate::algo::MAX_LIMIT`] for a caller that did not
/// [`crate::matching::check`] it first). Rules of one identity that ask for different costs
/// get a call each: a store call takes one cost, so "check all, then take all" spans only
/// the rules asking the same.
///
/// `remote` supplies other regions' counts for global rules (the merge layer); region rules
/// get none.
pub fn plan<'a>(
    domain: &'a Domain,
    d: &Descriptors,
    now: Micros,
    cost: u64,
    request_id: &str,
    remote: impl FnMut(&Applied<'a>) -> Remote,
) -> Plan<'a> {
    let mut p = Plan::default();
    plan_into(&mut p, domain, d, now, cost, request_id, remote);
    p
}

/// [`plan`] into `p`, overwriting it and reusing its buffers.
pub fn plan_into<'a>(
    p: &mut Plan<'a>,
    domain: &'a Domain,
    d: &Descriptors,
    now: Micros,
    cost: u64,
    request_id: &str,
    mut remote: impl FnMut(&Applied<'a>) -> Remote,
) {
    let Plan {
        applied,
        calls,
        spare,
        scratch,
    } = p;
    crate::matching::applicable_reusing(domain, d, applied, spare, scratch);
    for a in applied.iter_mut().filter(|a| a.rule.hot_keys.split > 1) {
        crate::hotkeys::split::apply(a, request_id);
    }
    // `calls[..used]` are this plan's; the rest are spares whose buffers get overwritten.
    let mut used = 0;
    for (i, a) in applied.iter().enumerate() {
        let fig = match a.rule.scope {
            crate::rules::Scope::Global => remote(a),
            crate::rules::Scope::Region => Remote::default(),
        };
        let a_cost = match a.factor {
            1 => cost,
            f => crate::rules::scaled(cost, f).unwrap_or(crate::algo::MAX_LIMIT),
        };
        // One call per identity, cost and store: a store call reaches one store.
        let c = match calls[..used].iter().position(|c| {
            let first = &applied[c.rules[0]];
            c.call.cost == a_cost
                && crate::matching::short_eq(first.identity.as_bytes(), a.identity.as_bytes())
                && first.store == a.store
                && fair_share(first) == fair_share(a)
        }) {
            Some(c) => c,
            None => {
                if used == calls.len() {
                    // Sized for the rules left, so adding a rule of the same identity (the
                    // usual case) never reallocates.
                    calls.push(PlannedCall {
                        call: Call {
                            now,
                            cost: a_cost,
                            request_id: String::new(),
                            items: Vec::with_capacity(applied.len() - i),
                        },
                        rules: Vec::with_capacity(applied.len() - i),
                    });
                }
                let pc = &mut calls[used];
                pc.call.now = now;
                pc.call.cost = a_cost;
                pc.call.request_id.clear();
                pc.call.request_id.push_str(request_id);
                pc.rules.clear();
                used += 1;
                used - 1
            }
        };
        let pc = &mut calls[c];
        let enforce = a.rule.mode == Mode::Enforce;
        let charge_rejected = a.rule.charge_rejected;
        match pc.call.items.get_mut(pc.rules.len()) {
            Some(item) => {
                item.key.clear();
                item.key.push_str(&a.key);
                // Mostly the numbers the item held for the last request: a comparison
                // costs less than the clone (60 instructions a decision on the bench).
                if item.params != *a.params {
                    item.params.clone_from(a.params.as_ref());
                }
                item.enforce = enforce;
                item.charge_rejected = charge_rejected;
                item.remote = fig;
            }
            None => pc.call.items.push(Item {
                key: a.key.clone(),
                params: a.params.as_ref().clone(),
                enforce,
                charge_rejected,
                remote: fig,
            }),
        }
        pc.rules.push(i);
    }
    calls.truncate(used);
    for pc in calls.iter_mut() {
        pc.call.items.truncate(pc.rules.len());
    }
}

/// Whether a rule counts as a fair share: its keys live on the domain's hash tag, not the
/// identity's, so it never shares a call with the identity's other rules.
fn fair_share(a: &Applied<'_>) -> bool {
    matches!(a.params.as_ref(), Params::FairShare(_))
}

/// Scales a rule's numbers for a per-daemon local bucket (`permille` of the original, at
/// least 1).
pub fn scale(params: &Params, permille: u64) -> Params {
    let s = |v: u64| (v.saturating_mul(permille) / 1000).max(1);
    let mut p = params.clone();
    match &mut p {
        Params::TokenBucket { rate, burst } | Params::Gcra { rate, burst } => {
            *rate = rate.with_tokens(s).unwrap_or(*rate);
            *burst = s(*burst);
        }
        Params::FixedWindow { limit, .. }
        | Params::SlidingWindow { limit, .. }
        | Params::SlidingLog { limit, .. }
        | Params::Concurrency { limit, .. } => *limit = s(*limit),
        // The same spacing: a daemon's own queue at its share of the rate.
        Params::LeakyQueue { rate, .. } => *rate = rate.with_tokens(s).unwrap_or(*rate),
        // The parent scaled, its reserve and the tenant's bucket with it.
        Params::FairShare(fs) => {
            fs.rate = fs.rate.with_tokens(s).unwrap_or(fs.rate);
            fs.burst = s(fs.burst);
            fs.borrow_above = s(fs.borrow_above).min(fs.burst - 1);
            if let Ok(scaled) = fs.with_share(fs.share) {
                *fs = scaled;
            }
        }
    }
    p
}

impl Plan<'_> {
    /// The named store call `i` goes to (`None`: the main one): every rule of a call counts
    /// in the same store, since [`plan`] groups by it.
    pub fn store_of(&self, i: usize) -> Option<&str> {
        self.calls
            .get(i)
            .and_then(|pc| pc.rules.first())
            .and_then(|&r| self.applied.get(r))
            .and_then(|a| a.store)
    }

    /// The call a daemon runs on its local buckets when call `i` failed: the items of its
    /// `on_store_failure: local` rules, numbers scaled to `local_permille`. `None` when the
    /// call has no such rule.
    pub fn fallback(&self, i: usize, local_permille: u64) -> Option<Call> {
        let pc = &self.calls[i];
        let items: Vec<Item> = pc
            .call
            .items
            .iter()
            .zip(&pc.rules)
            .filter(|(_, r)| self.applied[**r].rule.on_store_failure == FailureMode::Local)
            .map(|(it, _)| Item {
                params: scale(&it.params, local_permille),
                remote: Remote::default(),
                ..it.clone()
            })
            .collect();
        (!items.is_empty()).then(|| Call {
            items,
            ..pc.call.clone()
        })
    }

    /// Combines the answers (one per call, in order) into the decision.
    pub fn decide(&self, rules_version: u64, answers: &[Answer]) -> Decision {
        let mut d = Decision::unlimited(rules_version);
        self.decide_into(rules_version, answers, &mut d);
        d
    }

    /// [`Plan::decide`] into `d`, overwriting it and reusing its vectors.
    pub fn decide_into(&self, rules_version: u64, answers: &[Answer], d: &mut Decision) {
        d.code = Code::Ok;
        d.decided_by = None;
        d.retry_after_ms = 0;
        d.delay_ms = 0;
        // `d.policies[..n]` are this decision's; the rest are the last one's, overwritten in
        // place (a rule's id and title stay shared when the same rule is there again).
        let mut n = 0;
        // A fresh decision allocates its statuses once, at their number.
        d.policies
            .reserve(self.applied.len().saturating_sub(d.policies.len()));
        d.shadow_denied.clear();
        d.rules_version = rules_version;
        d.holds_slot = false;
        let mut unavailable = false;
        // The longest wait so far and the index of its policy.
        let mut longest: Option<(u64, usize)> = None;
        for (pc, ans) in self.calls.iter().zip(answers) {
            let mut local_i = 0;
            for (k, &ri) in pc.rules.iter().enumerate() {
                let a = &self.applied[ri];
                let rule = a.rule;
                let (outcome, via): (Option<&Outcome>, Via) = match ans {
                    Answer::Done(r) => (r.outcomes.get(k), Via::Store),
                    Answer::Failed { local } => match rule.on_store_failure {
                        FailureMode::Open => (None, Via::FailedOpen),
                        FailureMode::Closed => (None, Via::FailedClosed),
                        FailureMode::Local => {
                            let o = local.as_ref().and_then(|l| l.outcomes.get(local_i));
                            local_i += 1;
                            match o {
                                Some(o) => (Some(o), Via::Local),
                                None => (None, Via::FailedOpen),
                            }
                        }
                    },
                };
                d.holds_slot |= outcome.is_some_and(|o| {
                    took_slot(a, o, ans, pc.call.cost, rule.mode == Mode::Enforce)
                });
                if rule.mode == Mode::Shadow {
                    if outcome.is_some_and(|o| !o.allowed) {
                        d.shadow_denied.push(rule.id.clone());
                    }
                    continue;
                }
                match d.policies.get_mut(n) {
                    Some(p) => status_into(p, a, outcome, via),
                    None => d.policies.push(status(a, outcome, via)),
                }
                let status = &d.policies[n];
                if let Some(o) = outcome {
                    d.delay_ms = d.delay_ms.max(ceil_millis(o.delay()));
                }
                unavailable |= via == Via::FailedClosed;
                if !status.allowed
                    && status.via != Via::FailedClosed
                    && longest.is_none_or(|(ms, _)| status.retry_after_ms > ms)
                {
                    longest = Some((status.retry_after_ms, n));
                }
                n += 1;
            }
        }
        d.policies.truncate(n);
        if longest.is_some() || unavailable {
            // Refused requests do not leave, so nothing waits.
            d.delay_ms = 0;
        }
        if let Some((ms, i)) = longest {
            d.code = Code::OverLimit;
            d.retry_after_ms = ms;
            d.decided_by = Some(d.policies[i].id.clone());
        } else if unavailable {
            d.code = Code::Unavailable;
            d.retry_after_ms = 1000;
            d.decided_by = d
                .policies
                .iter()
                .find(|p| p.via == Via::FailedClosed)
                .map(|p| p.id.clone());
        }
    }
}

/// Whether a concurrency rule's outcome `o` left a slot taken, by [`crate::batch::takes`]
/// applied to its call (the store's, or the local one that answered).
fn took_slot(a: &Applied<'_>, o: &Outcome, ans: &Answer, cost: u64, enforce: bool) -> bool {
    let call_allowed = match ans {
        Answer::Done(r) => r.allowed,
        Answer::Failed { local: Some(l) } => l.allowed,
        Answer::Failed { local: None } => return false,
    };
    matches!(a.params.as_ref(), Params::Concurrency { .. })
        && crate::batch::takes(
            cost,
            call_allowed,
            o.allowed,
            enforce,
            a.rule.charge_rejected,
        )
}

/// The client-facing status of an applied rule: its advertised quota ([`advertised`]), what
/// is left of it now and when that changes ([`reset_secs`]). `outcome` is `None` when the
/// store failed and no local bucket answered (`via` says how the rule went then).
fn status(a: &Applied<'_>, outcome: Option<&Outcome>, via: Via) -> PolicyStatus {
    let mut p = PolicyStatus {
        id: a.rule.id.clone(),
        limit: 0,
        window_s: 0,
        remaining: 0,
        reset_s: 0,
        allowed: false,
        retry_after_ms: 0,
        headers: a.rule.headers,
        via,
        unit: QuotaUnit::Requests,
        title: a.rule.title.clone(),
    };
    status_into(&mut p, a, outcome, via);
    p
}

/// [`status`] into `p`, overwriting it: the rule's id and title are cloned only when `p`
/// holds another rule's.
fn status_into(p: &mut PolicyStatus, a: &Applied<'_>, outcome: Option<&Outcome>, via: Via) {
    let rule = a.rule;
    if !Arc::ptr_eq(&p.id, &rule.id) {
        p.id = rule.id.clone();
    }
    let same_title = match (&p.title, &rule.title) {
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        (None, None) => true,
        _ => false,
    };
    if !same_title {
        p.title = rule.title.clone();
    }
    p.headers = rule.headers;
    p.via = via;
    // A split rule's client sees the whole rule, not the sub-count it counted under.
    let adv = &a.advertised;
    p.limit = adv.limit;
    p.window_s = adv.window_s;
    p.unit = adv.unit;
    let Some(o) = outcome else {
        let closed = via == Via::FailedClosed;
        let whole = a.split.as_ref().map_or(a.params.as_ref(), |sp| &sp.whole);
        p.remaining = if closed { 0 } else { whole.limit() };
        p.reset_s = 1;
        p.allowed = !closed;
        p.retry_after_ms = if closed { 1000 } else { 0 };
        return;
    };
    p.retry_after_ms = if o.allowed {
        0
    } else {
        ceil_millis(o.retry_after)
    };
    p.remaining = match &a.split {
        Some(sp) => sp.remaining(o.remaining, o.limit),
        None => o.remaining,
    };
    // The sub-count's own rate for a split rule: its bucket is the one that refills.
    let bucket = match &a.split {
        Some(_) => bucket_rate(&a.params),
        None => adv.bucket,
    };
    p.reset_s = reset_secs(bucket, o, p.retry_after_ms);
    p.allowed = o.allowed;
}

/// A token bucket's or GCRA's sustained rate as `(q, w)`: `q` tokens every `w` seconds. The
/// one place the header code reads a bucket's rate; `None` for the other algorithms.
fn bucket_rate(params: &Params) -> Option<(u64, u64)> {
    match params {
        Params::TokenBucket { rate, .. } | Params::Gcra { rate, .. } => {
            Some(rate.per_whole_seconds())
        }
        // The parent's: the rule's numbers as written.
        Params::FairShare(fs) => Some(fs.rate.per_whole_seconds()),
        _ => None,
    }
}

/// `RateLimit-Policy`'s `q` and `w` for a rule's numbers. A bucket advertises its sustained
/// rate ([`bucket_rate`]: `q / w` is the refill rate), not its burst: the burst is what
/// `RateLimit`'s `r` shows when the bucket is full. A window advertises its limit per window
/// (a calendar month as 30 days), a concurrency rule its slots (its `w`, the slot timeout, is
/// not rendered: see [`headers_of`]).
fn advertised(params: &Params) -> (u64, u64) {
    // A shaping queue advertises the rate it lets requests out at.
    if let Params::LeakyQueue { rate, .. } = params {
        return rate.per_whole_seconds();
    }
    bucket_rate(params).unwrap_or_else(|| (params.limit(), ceil_secs(params.window()).max(1)))
}

/// What a rule's numbers tell a client: [`advertised`]'s quota and window, the unit, and the
/// [`bucket_rate`] a reset is counted by. Worked out once per rule when its rule set is
/// indexed (and per request only for numbers an override or a fair share's share changed):
/// each is a division or two, which a decision would otherwise pay per policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advertised {
    /// `RateLimit-Policy`'s `q`.
    pub limit: u64,
    /// `RateLimit-Policy`'s `w`, whole seconds (at least 1).
    pub window_s: u64,
    /// What the quota counts.
    pub unit: QuotaUnit,
    /// A bucket's sustained rate as `(q, w)`; `None` for the other algorithms.
    pub bucket: Option<(u64, u64)>,
}

impl Advertised {
    /// The figures of `params`.
    pub fn of(params: &Params) -> Advertised {
        let (limit, window_s) = advertised(params);
        Advertised {
            limit,
            window_s,
            unit: QuotaUnit::of(params),
            bucket: bucket_rate(params),
        }
    }
}

/// `RateLimit`'s `t`, whole seconds rounded up; `bucket` is the counting rule's
/// [`bucket_rate`]. Refused: the policy's own wait, as
/// `Retry-After` says it (the deciding policy's `t` is the header's value). Allowed with
/// nothing left: until a unit is back (a bucket's next token; a window's end). Else until
/// the quota is whole again (a full bucket, the window's end).
fn reset_secs(bucket: Option<(u64, u64)>, o: &Outcome, retry_after_ms: u64) -> u64 {
    if !o.allowed {
        return retry_after_secs(retry_after_ms);
    }
    match bucket {
        Some((q, w)) if o.remaining == 0 => {
            // To full is `limit` tokens away; the next token is `limit - 1` tokens sooner.
            let per_token = u128::from(w) * u128::from(SECOND) / u128::from(q.max(1));
            let sooner = per_token * u128::from(o.limit.saturating_sub(1));
            ceil_secs(
                o.reset
                    .saturating_sub(u64::try_from(sooner).unwrap_or(u64::MAX)),
            )
        }
        _ => ceil_secs(o.reset),
    }
}

#[cfg(test)]
mod tests;
