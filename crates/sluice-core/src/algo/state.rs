//! Algorithm state and its compact text encoding.
//!
//! The encoding is what the in-memory store snapshots and what tests round-trip; Redis keeps
//! the same fields in native types (see `lua/`). It is short on purpose: memory per key is a
//! target.

use super::Kind;
use crate::time::Micros;

/// The mutable part of one (rule, identity) counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Micro-tokens left at `ts`; `seen` is the remote consumption already drained, `used`
    /// this region's own cumulative consumption (kept only for shared rules).
    TokenBucket {
        /// Micro-tokens (tokens × 10^6).
        tokens: u64,
        /// When `tokens` was computed.
        ts: Micros,
        /// Cumulative remote units already drained.
        seen: u64,
        /// Units this region took since the key was created (its *generation*): the
        /// monotone figure other regions drain. 0, and not encoded, for unshared rules.
        used: u64,
        /// When this generation was born (the key's creation, epoch milliseconds): the label
        /// `used` ships under, so other regions tell a restarted key from the old one. 0,
        /// and not encoded, for unshared rules (and for a key written before labels).
        born: u64,
    },
    /// Theoretical arrival time.
    Gcra {
        /// TAT in epoch microseconds.
        tat: Micros,
        /// Cumulative remote units already applied.
        seen: u64,
        /// Units this region took in this generation of the key (see `TokenBucket::used`).
        used: u64,
        /// This generation's birth, epoch milliseconds (see `TokenBucket::born`).
        born: u64,
    },
    /// Count in the window starting at `start`.
    FixedWindow {
        /// Window start.
        start: Micros,
        /// Units admitted in it.
        count: u64,
    },
    /// Counts of the window starting at `start` and of the one before.
    SlidingWindow {
        /// Current window start.
        start: Micros,
        /// Units in the current window.
        cur: u64,
        /// Units in the previous window.
        prev: u64,
    },
    /// Admission times, ascending, one per unit.
    SlidingLog {
        /// Timestamps.
        entries: Vec<Micros>,
    },
    /// Held slots: (request id, expiry, units).
    Concurrency {
        /// Slots in acquisition order.
        slots: Vec<(String, Micros, u64)>,
    },
    /// A shaping queue's next free departure.
    LeakyQueue {
        /// Epoch microseconds; the queue is empty once `now` reaches it.
        tat: Micros,
    },
    /// A fair share's two token buckets, read from their two keys for one evaluation and
    /// written back to them (`algo::fair_share`); `None`: that key is absent (full).
    FairShare {
        /// The tenant's own bucket.
        child: Option<Box<State>>,
        /// The parent bucket, shared by every tenant of the rule.
        parent: Option<Box<State>>,
    },
}

/// Why bytes did not decode into a state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt {kind} state: {detail}")]
pub struct DecodeError {
    /// Which algorithm's state was expected.
    pub kind: &'static str,
    /// What was wrong.
    pub detail: String,
}

impl State {
    /// The algorithm this state belongs to.
    pub fn kind(&self) -> Kind {
        match self {
            State::TokenBucket { .. } => Kind::TokenBucket,
            State::Gcra { .. } => Kind::Gcra,
            State::FixedWindow { .. } => Kind::FixedWindow,
            State::SlidingWindow { .. } => Kind::SlidingWindow,
            State::SlidingLog { .. } => Kind::SlidingLog,
            State::Concurrency { .. } => Kind::Concurrency,
            State::LeakyQueue { .. } => Kind::LeakyQueue,
            State::FairShare { .. } => Kind::TokenBucket,
        }
    }

    /// Space-separated integers (ids of concurrency slots may not contain spaces).
    ///
    /// A bucket's `used` is written only when nonzero and its `born` only when labelled (both
    /// only a shared rule counts), so a region-scope bucket keeps today's size: "tokens ts
    /// seen" and "tat seen"; a labelled one is "tokens ts seen used born" and "tat seen used
    /// born". `lua/check.lua` writes the same fields, shortens a GCRA to "tat" when `seen`,
    /// `used` and `born` are 0, and a token bucket holding no tokens, nothing seen, used or
    /// labelled (the normalized form) to "ts": one integer, which Redis stores inside the
    /// key's object.
    pub fn encode(&self) -> String {
        let nums = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
        match self {
            State::TokenBucket {
                tokens: 0,
                ts,
                seen: 0,
                used: 0,
                born: 0,
            } => ts.to_string(),
            State::TokenBucket {
                tokens,
                ts,
                seen,
                used: 0,
                born: 0,
            } => nums(&[*tokens, *ts, *seen]),
            State::TokenBucket {
                tokens,
                ts,
                seen,
                used,
                born: 0,
            } => nums(&[*tokens, *ts, *seen, *used]),
            State::TokenBucket {
                tokens,
                ts,
                seen,
                used,
                born,
            } => nums(&[*tokens, *ts, *seen, *used, *born]),
            State::Gcra {
                tat,
                seen,
                used: 0,
                born: 0,
            } => nums(&[*tat, *seen]),
            State::Gcra {
                tat,
                seen,
                used,
                born: 0,
            } => nums(&[*tat, *seen, *used]),
            State::Gcra {
                tat,
                seen,
                used,
                born,
            } => nums(&[*tat, *seen, *used, *born]),
            State::FixedWindow { start, count } => nums(&[*start, *count]),
            State::SlidingWindow { start, cur, prev } => nums(&[*start, *cur, *prev]),
            State::SlidingLog { entries } => nums(entries),
            State::Concurrency { slots } => slots
                .iter()
                .map(|(id, exp, cost)| format!("{id} {exp} {cost}"))
                .collect::<Vec<_>>()
                .join(" "),
            State::LeakyQueue { tat } => tat.to_string(),
            // Never stored whole: each half is a token bucket under its own key. Written
            // "child / parent" for tests and logs, `-` for an absent half.
            State::FairShare { child, parent } => {
                let half = |h: &Option<Box<State>>| h.as_ref().map_or("-".into(), |s| s.encode());
                format!("{} / {}", half(child), half(parent))
            }
        }
    }

    /// Inverse of [`State::encode`] for a known algorithm.
    pub fn decode(kind: Kind, text: &str) -> Result<State, DecodeError> {
        let err = |detail: String| DecodeError {
            kind: kind.name(),
            detail,
        };
        let fields: Vec<&str> = text.split_ascii_whitespace().collect();
        let nums = |v: &[&str]| -> Result<Vec<u64>, DecodeError> {
            v.iter()
                .map(|f| {
                    f.parse::<u64>()
                        .map_err(|_| err(format!("{f:?} is not a count")))
                })
                .collect()
        };
        let between = |lo: usize, hi: usize| -> Result<Vec<u64>, DecodeError> {
            if fields.len() < lo || fields.len() > hi {
                return Err(err(format!(
                    "expected {lo} to {hi} fields, got {}",
                    fields.len()
                )));
            }
            nums(&fields)
        };
        let exact = |n: usize| between(n, n);
        // A missing trailing field is 0 (see `encode`).
        let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        Ok(match kind {
            Kind::TokenBucket => {
                let v = between(1, 5)?;
                match v.len() {
                    // "ts": no tokens at ts, nothing seen or used.
                    1 => State::TokenBucket {
                        tokens: 0,
                        ts: v[0],
                        seen: 0,
                        used: 0,
                        born: 0,
                    },
                    2 => {
                        return Err(err(
                            "expected \"ts\" or \"tokens ts seen [used [born]]\"".into()
                        ));
                    }
                    _ => State::TokenBucket {
                        tokens: v[0],
                        ts: v[1],
                        seen: v[2],
                        used: at(&v, 3),
                        born: at(&v, 4),
                    },
                }
            }
            Kind::Gcra => {
                let v = between(1, 4)?;
                State::Gcra {
                    tat: v[0],
                    seen: at(&v, 1),
                    used: at(&v, 2),
                    born: at(&v, 3),
                }
            }
            Kind::FixedWindow => {
                let v = exact(2)?;
                State::FixedWindow {
                    start: v[0],
                    count: v[1],
                }
            }
            Kind::SlidingWindow => {
                let v = exact(3)?;
                State::SlidingWindow {
                    start: v[0],
                    cur: v[1],
                    prev: v[2],
                }
            }
            Kind::SlidingLog => {
                let entries = nums(&fields)?;
                if entries.windows(2).any(|w| w[0] > w[1]) {
                    return Err(err("log entries out of order".into()));
                }
                State::SlidingLog { entries }
            }
            Kind::Concurrency => {
                if !fields.len().is_multiple_of(3) {
                    return Err(err("slots come in triples".into()));
                }
                let mut slots = Vec::with_capacity(fields.len() / 3);
                for c in fields.chunks(3) {
                    let v = nums(&c[1..])?;
                    slots.push((c[0].to_string(), v[0], v[1]));
                }
                State::Concurrency { slots }
            }
            Kind::LeakyQueue => State::LeakyQueue { tat: exact(1)?[0] },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_state_is_an_error_not_a_panic() {
        assert!(State::decode(Kind::TokenBucket, "1 2").is_err());
        assert!(State::decode(Kind::FixedWindow, "x 2").is_err());
        assert!(State::decode(Kind::SlidingLog, "5 3").is_err());
        assert!(State::decode(Kind::Concurrency, "a 1").is_err());
        assert!(State::decode(Kind::TokenBucket, "1 2 3 4 5 6").is_err());
        assert!(State::decode(Kind::Gcra, "1 2 3 4 5").is_err());
        assert_eq!(
            State::decode(Kind::Gcra, "10 0"),
            Ok(State::Gcra {
                tat: 10,
                seen: 0,
                used: 0,
                born: 0
            })
        );
        assert_eq!(
            State::decode(Kind::Gcra, "10"),
            Ok(State::Gcra {
                tat: 10,
                seen: 0,
                used: 0,
                born: 0
            })
        );
    }

    #[test]
    fn used_is_written_only_when_nonzero() {
        let regional = State::TokenBucket {
            tokens: 5,
            ts: 7,
            seen: 0,
            used: 0,
            born: 0,
        };
        assert_eq!(regional.encode(), "5 7 0");
        let shared = State::TokenBucket {
            tokens: 5,
            ts: 7,
            seen: 2,
            used: 9,
            born: 0,
        };
        assert_eq!(shared.encode(), "5 7 2 9");
        let gcra = State::Gcra {
            tat: 3,
            seen: 0,
            used: 4,
            born: 0,
        };
        assert_eq!(gcra.encode(), "3 0 4");
        // A labelled generation writes its birth last, even before anything was used.
        let labelled = State::TokenBucket {
            tokens: 5,
            ts: 7,
            seen: 2,
            used: 0,
            born: 1_800_000_000_000,
        };
        assert_eq!(labelled.encode(), "5 7 2 0 1800000000000");
        let labelled_gcra = State::Gcra {
            tat: 3,
            seen: 1,
            used: 0,
            born: 11,
        };
        assert_eq!(labelled_gcra.encode(), "3 1 0 11");
        for s in [regional, shared, gcra, labelled, labelled_gcra] {
            assert_eq!(State::decode(s.kind(), &s.encode()), Ok(s.clone()));
        }
    }
}
