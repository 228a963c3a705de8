//! The limiting algorithms as pure functions of `(state, params, now, cost)`.
//!
//! Each algorithm is split in two steps so that one store call can check every rule of an
//! identity before taking from any of them: [`evaluate`] says what would happen and
//! [`take`] applies the cost. [`give_back`] returns leased units that were taken and never
//! spent. Both are deterministic integer arithmetic kept below 2^53, so the
//! Lua scripts in `lua/` reproduce them bit for bit on Redis (a differential test holds them
//! to it). Absent state means "fresh": a full bucket (for a shared one, this region's share of
//! it: [`Remote::fresh_share`]), an empty window.

mod calendar;
mod concurrency;
pub mod fair_share;
mod fixed_window;
mod gcra;
mod give_back;
mod leaky_queue;
mod rate;
mod sliding_log;
mod sliding_window;
mod state;
mod token_bucket;

pub use calendar::{Calendar, CalendarUnit};
pub use fair_share::{FairShare, Path, SHARE_SCALE, Shares};
pub use fixed_window::key_bounds;
pub use give_back::{GiveBackReq, give_back};
pub use leaky_queue::without_waiting;
pub use rate::{MAX_PERIOD, Rate, RateError, parse_rate};
pub use state::{DecodeError, State};

use crate::time::Micros;

/// Upper bound on limits, rates and bursts: keeps every product below 2^53 for Lua.
pub const MAX_LIMIT: u64 = 1_000_000_000;
/// Sliding logs keep one entry per admitted unit, so only small limits are allowed.
pub const MAX_LOG_LIMIT: u64 = 10_000;
/// Token bucket state of a rate per second is kept in micro-tokens (other rates in their
/// own [`Rate::scale`]): exact refill at microsecond resolution.
pub const TOKEN_SCALE: u64 = 1_000_000;
/// Ceiling of a bucket's cumulative `used` (2^53 − 1): Lua holds it exactly. A take adds at
/// most `burst` (≤ 10^9), so it is only reached after ~9·10^6 full-burst takes in one key
/// generation; from there the figure stops rising (other regions stop draining for it).
pub const MAX_USED: u64 = (1 << 53) - 1;

/// How a fixed window is aligned.
#[derive(Clone, Debug, PartialEq)]
pub enum Window {
    /// `[k·len, (k+1)·len)` in epoch microseconds: identical in every region.
    Epoch(Micros),
    /// Calendar periods (hour, day, week, month) in an IANA time zone.
    Calendar(Calendar),
    /// `window_start: first_request`: `[origin, origin + len)` from the key's own first
    /// request, so clients throttled together do not all come back at one instant. The origin
    /// lives in the key's state (`fixed_window::key_bounds`); region scope only, since
    /// regions add counts per epoch-aligned window.
    FirstRequest(Micros),
}

impl Window {
    /// `[start, end)` of the window holding `now`.
    pub fn bounds(&self, now: Micros) -> (Micros, Micros) {
        match self {
            Window::Epoch(len) => {
                let start = now - now % len;
                (start, start + len)
            }
            Window::Calendar(c) => c.bounds(now),
            // Without the key's state: the window a first request at `now` starts.
            Window::FirstRequest(len) => (now, now + len),
        }
    }

    /// Nominal length, for `RateLimit-Policy`'s `w` (a calendar month counts as 30 days).
    pub fn nominal(&self) -> Micros {
        match self {
            Window::Epoch(len) => *len,
            Window::Calendar(c) => c.nominal(),
            Window::FirstRequest(len) => *len,
        }
    }

    /// Whether each key's windows start at its own first request (not the epoch): such a
    /// window cannot be shared between regions, leased or synced, and its bounds depend on
    /// the key's state.
    pub fn per_key(&self) -> bool {
        matches!(self, Window::FirstRequest(_))
    }
}

/// Where a sliding window's windows start (`window_start`): the epoch, the same windows for
/// every key and region, or each key's own first request (see `Window::FirstRequest`, the
/// fixed window's form).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WindowStart {
    /// `[k·len, (k + 1)·len)`.
    #[default]
    Epoch,
    /// From the key's first request; the start lives in the key's state.
    FirstRequest,
}

/// Validated numbers of one algorithm.
#[derive(Clone, Debug, PartialEq)]
pub enum Params {
    /// Refills at `rate` up to `burst`.
    TokenBucket {
        /// Tokens added per period.
        rate: Rate,
        /// Capacity.
        burst: u64,
    },
    /// Generic cell rate: the same shape as a token bucket with one timestamp of state.
    Gcra {
        /// Requests per period.
        rate: Rate,
        /// Requests that may arrive at once.
        burst: u64,
    },
    /// At most `limit` per window.
    FixedWindow {
        /// Admitted units per window.
        limit: u64,
        /// Alignment and length.
        window: Window,
    },
    /// Cloudflare's estimate: the previous window's count weighted by its overlap.
    SlidingWindow {
        /// Admitted units per window.
        limit: u64,
        /// Window length; a whole number of milliseconds.
        window: Micros,
        /// Where the key's windows start (`window_start`).
        start: WindowStart,
    },
    /// Exact: one timestamp per admitted unit.
    SlidingLog {
        /// Admitted units per window.
        limit: u64,
        /// Window length.
        window: Micros,
    },
    /// In-flight slots, each held until released or expired.
    Concurrency {
        /// Slots.
        limit: u64,
        /// How long an unreleased slot is held.
        timeout: Micros,
    },
    /// Shaping: admitted requests leave one interval apart, after a delay of at most
    /// `max_delay`; only a request that would wait longer is refused.
    LeakyQueue {
        /// Departures per period.
        rate: Rate,
        /// The longest wait a request is admitted with.
        max_delay: Micros,
    },
    /// A token bucket (the parent's numbers) with a child bucket per tenant inside it
    /// (`fair_share`): one backend's capacity shared by weight ([`fair_share`]).
    FairShare(FairShare),
}

/// Which algorithm, as named in the rule format and in store keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `token_bucket`
    TokenBucket,
    /// `gcra`
    Gcra,
    /// `fixed_window`
    FixedWindow,
    /// `sliding_window`
    SlidingWindow,
    /// `sliding_log`
    SlidingLog,
    /// `concurrency`
    Concurrency,
    /// `leaky_queue`
    LeakyQueue,
}

impl Kind {
    /// The rule-format name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::Gcra => "gcra",
            Kind::FixedWindow => "fixed_window",
            Kind::SlidingWindow => "sliding_window",
            Kind::SlidingLog => "sliding_log",
            Kind::Concurrency => "concurrency",
            Kind::LeakyQueue => "leaky_queue",
        }
    }
}

impl Params {
    /// The algorithm.
    pub fn kind(&self) -> Kind {
        match self {
            Params::TokenBucket { .. } => Kind::TokenBucket,
            Params::Gcra { .. } => Kind::Gcra,
            Params::FixedWindow { .. } => Kind::FixedWindow,
            Params::SlidingWindow { .. } => Kind::SlidingWindow,
            Params::SlidingLog { .. } => Kind::SlidingLog,
            Params::Concurrency { .. } => Kind::Concurrency,
            Params::LeakyQueue { .. } => Kind::LeakyQueue,
            // Its two buckets are token buckets, stored as such.
            Params::FairShare(_) => Kind::TokenBucket,
        }
    }

    /// Whether the rule's windows start at each key's first request (`window_start:
    /// first_request`): their bounds come from the key's state, so no one outside the store
    /// call (regions, leases, the sync gate) can count in them.
    pub fn per_key_window(&self) -> bool {
        match self {
            Params::FixedWindow { window, .. } => window.per_key(),
            Params::SlidingWindow { start, .. } => *start == WindowStart::FirstRequest,
            _ => false,
        }
    }

    /// The quota a client sees (`q` in `RateLimit-Policy`).
    pub fn limit(&self) -> u64 {
        match *self {
            Params::TokenBucket { burst, .. } | Params::Gcra { burst, .. } => burst,
            Params::FixedWindow { limit, .. }
            | Params::SlidingWindow { limit, .. }
            | Params::SlidingLog { limit, .. }
            | Params::Concurrency { limit, .. } => limit,
            Params::LeakyQueue { rate, max_delay } => leaky_queue::capacity(rate, max_delay),
            Params::FairShare(ref fs) => fs.burst,
        }
    }

    /// The period the quota refers to (`w` in `RateLimit-Policy`).
    pub fn window(&self) -> Micros {
        match self {
            Params::TokenBucket { rate, burst } => token_bucket::full_period(*rate, *burst),
            Params::Gcra { rate, burst } => rate.interval() * burst,
            Params::FixedWindow { window, .. } => window.nominal(),
            Params::SlidingWindow { window, .. } | Params::SlidingLog { window, .. } => *window,
            Params::Concurrency { timeout, .. } => *timeout,
            Params::LeakyQueue { rate, .. } => rate.per(),
            Params::FairShare(fs) => token_bucket::full_period(fs.rate, fs.burst),
        }
    }
}

/// Counts other regions reported for a global rule, added by the merge layer.
///
/// For windows, `cur` and `prev` are remote counts of the current and previous window. For
/// token bucket and GCRA, `cur` is the cumulative units other regions consumed (monotone), and
/// the state remembers how much of it was already drained, so a repeated figure costs nothing.
///
/// Buckets have no previous window, so for them `prev` carries something else: 0 for a
/// region-scope rule, else the number of regions R sharing it (at least 1), which makes the
/// state count this region's cumulative `used` (and report it as `Outcome::usage`) and
/// starts a fresh key with this region's share of the burst, ceil(burst / R), rather than
/// a full bucket: a key new in every region at once then admits about one burst in all,
/// not R bursts ([`Remote::fresh_share`], [`Remote::fresh_seen`]). Both travel in the existing field so the store
/// call (`lua/check.lua`'s `remote.prev` argument) needs no new argument, and region-scope
/// buckets keep their smaller state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Remote {
    /// Current window count, or cumulative consumption for buckets.
    pub cur: u64,
    /// Previous window count (sliding window); for buckets, 0 = region scope, else the
    /// regions sharing the rule (see above).
    pub prev: u64,
}

/// Added to a shared bucket's `prev` (above any region count) to keep generation labels off:
/// the store then writes a shared bucket's state without its birth stamp, in the form a
/// release before labels reads ("tokens ts seen used", "tat seen used"), and drops a stamp it
/// finds. Why: the daemons of one region share its store, and an older daemon's script
/// refuses a labelled state as corrupt, so a region rolled onto this release runs with labels
/// off until every daemon has it (`gossip.bucket_generations: false`, docs/upgrading.md).
pub const UNLABELLED: u64 = 1 << 32;

impl Remote {
    /// A shared bucket's remote figure: other regions' cumulative consumption `cur`, the
    /// rule shared by `regions` regions (the daemon's count of regions with a live member;
    /// 0 is read as 1, which starts a fresh key full as a region-scope one).
    pub fn shared_bucket(cur: u64, regions: usize) -> Remote {
        Remote {
            cur,
            prev: (regions as u64).max(1),
        }
    }

    /// Whether a bucket keeps and reports its cumulative `used` (see the type's docs).
    pub fn shares_bucket(&self) -> bool {
        self.prev != 0
    }

    /// The same figure with generation labels off ([`UNLABELLED`]); unchanged for a
    /// region-scope rule or one already off.
    pub fn without_labels(self) -> Remote {
        if self.labels() {
            Remote {
                prev: self.prev + UNLABELLED,
                ..self
            }
        } else {
            self
        }
    }

    /// Whether a shared bucket's key carries its generation's birth stamp.
    pub fn labels(&self) -> bool {
        self.prev != 0 && !self.unlabelled()
    }

    /// Whether the caller turned labels off for a shared rule (a stored stamp is dropped).
    /// Not for region scope or a give-back, which carry no figure and keep what is stored.
    pub fn unlabelled(&self) -> bool {
        self.prev >= UNLABELLED
    }

    /// The regions sharing the rule (0 for region scope).
    fn regions(&self) -> u64 {
        self.prev % UNLABELLED
    }

    /// Units a fresh bucket key holds at once: the whole `burst` for a region-scope rule or
    /// one region, else this region's share ceil(burst / R), at least 1 and at most the
    /// burst. Why: R regions that each see a new key start together with about one burst
    /// (at most burst + R − 1 from the rounding), the global burst the rule promises; each
    /// then refills to the full burst at the rate. `lua/check.lua` computes the same.
    pub fn fresh_share(&self, burst: u64) -> u64 {
        let regions = self.regions();
        if regions <= 1 {
            burst
        } else {
            burst.div_ceil(regions).max(1).min(burst)
        }
    }

    /// The remote figure a fresh bucket key takes as already drained: the figure it hears
    /// (it cannot tell how much of it is recent), plus the rest of the burst, `burst −`
    /// [`Remote::fresh_share`], which the other regions take from their own shares.
    ///
    /// Why: every region's bucket drains what all the others take, so each one is a replica
    /// of the global bucket. Started at a share without this, a replica would also drain the
    /// others' first shares: a key busy in every region would hold burst / R for good, not
    /// the burst (a 10/s bucket of burst 100 in 3 regions admitted 634 in a minute, not 700).
    /// With it, R regions that start together hold the burst between them and owe nothing
    /// for it (at most R − 1 units from the rounding), and any one region's bucket still
    /// bounds what all of them admit to the burst plus the refill. 0 extra for one region or
    /// a region-scope rule; capped at 2^53 − 1 (never below `cur`) so Lua computes the same.
    pub fn fresh_seen(&self, burst: u64) -> u64 {
        self.cur
            .saturating_add(burst - self.fresh_share(burst))
            .min(MAX_USED)
            .max(self.cur)
    }
}

/// The inputs of one evaluation besides state and params.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Now, in epoch microseconds.
    pub now: Micros,
    /// Units asked for; 0 is a peek that reports as if for 1 and takes nothing.
    pub cost: u64,
    /// Identifies a concurrency slot so the caller can release it.
    pub request_id: &'a str,
    /// Remote counts for global rules.
    pub remote: Remote,
}

/// What one algorithm says about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the request fits.
    pub allowed: bool,
    /// The quota (`q`).
    pub limit: u64,
    /// Units left after this request (if allowed) or now (if not).
    pub remaining: u64,
    /// Until the quota is whole again (bucket full, window over).
    pub reset: Micros,
    /// Until the same request would fit if nothing else happened; 0 when allowed, except
    /// for a `leaky_queue` rule, whose admitted request must first wait this long
    /// ([`Outcome::delay`]). Why one field: it is the time until the request may go either way,
    /// and the store reply (`lua/check.lua`) carries it unchanged.
    pub retry_after: Micros,
    /// The policy period (`w`).
    pub window: Micros,
    /// This region's own usage after the request: the figure the delta shipper shares. For
    /// windows, the region's count in the window; for a shared token bucket or GCRA
    /// ([`Remote::shares_bucket`]), its cumulative `used` after the request (a refusal adds
    /// nothing here even when charged: the charge shows in the next outcome); for an unshared
    /// bucket, how drained it is (burst − remaining).
    pub usage: u64,
    /// The label `usage` ships under: for a shared token bucket or GCRA, its generation's
    /// birth (the key's creation, epoch µs, a whole millisecond; 0 for a key written before
    /// labels), so other regions tell a restarted key's figure from the old one's
    /// (`merge::RemoteCounts`); 0 for every other rule (windows label by window start).
    pub generation: Micros,
}

impl Outcome {
    /// How long an admitted request must wait before it leaves (a `leaky_queue` rule's
    /// shaping); 0 for a refusal and for every other algorithm.
    pub fn delay(&self) -> Micros {
        if self.allowed { self.retry_after } else { 0 }
    }
}

/// The effective cost: a peek reports as if for one unit.
#[inline]
pub(crate) fn probe_cost(cost: u64) -> u64 {
    cost.max(1)
}

/// Says whether `req` fits, without changing anything.
pub fn evaluate(params: &Params, state: Option<&State>, req: &Request<'_>) -> Outcome {
    match params {
        Params::TokenBucket { rate, burst } => token_bucket::evaluate(*rate, *burst, state, req),
        Params::Gcra { rate, burst } => gcra::evaluate(*rate, *burst, state, req),
        Params::FixedWindow { limit, window } => fixed_window::evaluate(*limit, window, state, req),
        Params::SlidingWindow {
            limit,
            window,
            start,
        } => sliding_window::evaluate(*limit, *window, *start, state, req),
        Params::SlidingLog { limit, window } => sliding_log::evaluate(*limit, *window, state, req),
        Params::Concurrency { limit, timeout } => {
            concurrency::evaluate(*limit, *timeout, state, req)
        }
        Params::LeakyQueue { rate, max_delay } => {
            leaky_queue::evaluate(*rate, *max_delay, state, req)
        }
        Params::FairShare(fs) => fair_share::evaluate(fs, state, req),
    }
}

/// The state after charging `req.cost`, and how long it stays meaningful (its store TTL).
///
/// Called for admitted requests, and for refused ones of `charge_rejected` rules: a bucket
/// then drains to zero at most, a window counts past its limit. A cost of 0 returns the
/// state unchanged (normalised).
pub fn take(params: &Params, state: Option<&State>, req: &Request<'_>) -> (State, Micros) {
    match params {
        Params::TokenBucket { rate, burst } => token_bucket::take(*rate, *burst, state, req),
        Params::Gcra { rate, burst } => gcra::take(*rate, *burst, state, req),
        Params::FixedWindow { limit: _, window } => fixed_window::take(window, state, req),
        Params::SlidingWindow {
            limit: _,
            window,
            start,
        } => sliding_window::take(*window, *start, state, req),
        Params::SlidingLog { limit, window } => sliding_log::take(*limit, *window, state, req),
        Params::Concurrency { limit: _, timeout } => concurrency::take(*timeout, state, req),
        Params::LeakyQueue { rate, max_delay } => leaky_queue::take(*rate, *max_delay, state, req),
        Params::FairShare(fs) => fair_share::take(fs, state, req),
    }
}

/// Whether a shared bucket's stored state lags the remote figure (`remote.cur` above the
/// state's `seen`): a call that takes nothing then still writes the drained state (a take of
/// 0), so the drain outlives the key's own refill schedule. Only for an existing state: a
/// fresh key starts from the figure it hears (see `token_bucket`), so it has no news.
pub fn remote_news(state: Option<&State>, req: &Request<'_>) -> bool {
    req.remote.shares_bucket()
        && match state {
            Some(State::TokenBucket { seen, .. } | State::Gcra { seen, .. }) => {
                req.remote.cur > *seen
            }
            _ => false,
        }
}

/// Frees a concurrency slot. Returns the new state (None when no slot is left) and whether
/// the id held one. Other algorithms have nothing to release.
pub fn release(state: Option<&State>, request_id: &str, now: Micros) -> (Option<State>, bool) {
    concurrency::release(state, request_id, now)
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod window_start_proptests;
