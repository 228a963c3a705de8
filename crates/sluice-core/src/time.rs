//! Time as plain numbers. The core never reads a clock: every function takes `now` in
//! microseconds since the Unix epoch, so the daemon passes the wall clock and the simulator
//! passes its virtual one. Microseconds keep token buckets exact at high rates while staying
//! below 2^53, the integer range Lua's doubles represent exactly.

use std::fmt;

/// Microseconds since the Unix epoch (or a duration in microseconds).
pub type Micros = u64;

/// One second in [`Micros`].
pub const SECOND: Micros = 1_000_000;
/// One millisecond in [`Micros`].
pub const MILLI: Micros = 1_000;

/// Integer division rounding up; `b` must be non-zero.
#[inline]
pub fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Whole seconds, rounded up, for headers (`Retry-After: 1` for a 50 ms wait).
#[inline]
pub fn ceil_secs(us: Micros) -> u64 {
    div_ceil(us, SECOND)
}

/// Whole milliseconds, rounded up, so a wait is never reported shorter than it is.
#[inline]
pub fn ceil_millis(us: Micros) -> u64 {
    div_ceil(us, MILLI)
}

/// Whether a wall-clock reading `now` lies more than `slack` before `then`, an earlier
/// reading of the same clock: the clock was stepped back (NTP, an operator), and how long
/// has passed since `then` is unknown. A resend timer takes that as long enough, so a lost
/// datagram is repaired at once rather than when the clock catches up. `slack` absorbs two
/// tasks' readings that race (0 when one task reads).
#[inline]
pub fn stepped_back(now: Micros, then: Micros, slack: Micros) -> bool {
    now.saturating_add(slack) < then
}

/// A span parsed from the rule format (`250ms`, `1s`, `1m`, `1h`, `1d`, `1w`, `1mo`).
///
/// Months have no fixed length, so they only make sense for calendar-aligned windows; the
/// validator refuses `mo` anywhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Span {
    /// A fixed number of microseconds.
    Fixed(Micros),
    /// A number of calendar months.
    Months(u32),
}

impl Span {
    /// The fixed length, or `None` for months.
    pub fn fixed(self) -> Option<Micros> {
        match self {
            Span::Fixed(us) => Some(us),
            Span::Months(_) => None,
        }
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Span::Months(n) => write!(f, "{n}mo"),
            Span::Fixed(us) => {
                for (unit, len) in [
                    ("w", 7 * 86_400 * SECOND),
                    ("d", 86_400 * SECOND),
                    ("h", 3_600 * SECOND),
                    ("m", 60 * SECOND),
                    ("s", SECOND),
                    ("ms", MILLI),
                ] {
                    if us >= len && us % len == 0 {
                        return write!(f, "{}{unit}", us / len);
                    }
                }
                write!(f, "{us}us")
            }
        }
    }
}

/// Why a span did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpanError {
    /// Not `<digits><unit>`.
    #[error("expected a duration like 500ms, 1s, 1m, 1h, 1d, 1w or 1mo, got {0:?}")]
    Syntax(String),
    /// Zero length.
    #[error("a duration must be greater than zero")]
    Zero,
    /// Beyond what the arithmetic allows (a year).
    #[error("a duration must be at most 366d")]
    TooLong,
}

/// Parses a span of the rule format.
pub fn parse_span(text: &str) -> Result<Span, SpanError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| SpanError::Syntax(text.to_string()))?;
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| SpanError::Syntax(text.to_string()))?;
    if n == 0 {
        return Err(SpanError::Zero);
    }
    let per = match unit {
        "ms" => MILLI,
        "s" => SECOND,
        "m" => 60 * SECOND,
        "h" => 3_600 * SECOND,
        "d" => 86_400 * SECOND,
        "w" => 7 * 86_400 * SECOND,
        "mo" => {
            return if n <= 12 {
                Ok(Span::Months(n as u32))
            } else {
                Err(SpanError::TooLong)
            };
        }
        _ => return Err(SpanError::Syntax(text.to_string())),
    };
    let us = n.checked_mul(per).ok_or(SpanError::TooLong)?;
    if us > 366 * 86_400 * SECOND {
        return Err(SpanError::TooLong);
    }
    Ok(Span::Fixed(us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_parse_and_print() {
        assert_eq!(parse_span("1s"), Ok(Span::Fixed(SECOND)));
        assert_eq!(parse_span("250ms"), Ok(Span::Fixed(250 * MILLI)));
        assert_eq!(parse_span("1d"), Ok(Span::Fixed(86_400 * SECOND)));
        assert_eq!(parse_span("1mo"), Ok(Span::Months(1)));
        assert_eq!(parse_span("0s"), Err(SpanError::Zero));
        assert!(matches!(parse_span("1x"), Err(SpanError::Syntax(_))));
        assert!(matches!(parse_span("s"), Err(SpanError::Syntax(_))));
        assert!(matches!(parse_span("-1s"), Err(SpanError::Syntax(_))));
        assert_eq!(parse_span("400d"), Err(SpanError::TooLong));
        assert_eq!(Span::Fixed(60 * SECOND).to_string(), "1m");
        assert_eq!(Span::Fixed(90 * SECOND).to_string(), "90s");
    }

    #[test]
    fn rounding_is_up() {
        assert_eq!(ceil_secs(50 * MILLI), 1);
        assert_eq!(ceil_secs(SECOND), 1);
        assert_eq!(ceil_secs(SECOND + 1), 2);
        assert_eq!(ceil_millis(1), 1);
    }
}
