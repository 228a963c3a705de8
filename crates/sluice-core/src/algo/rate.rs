//! The refill rate of the bucket algorithms: `tokens` per `per` microseconds, exact.
//!
//! A rate is kept as the two whole numbers it was written with (`10/1m` is 10 per 60·10^6
//! µs), never as a float, and the token bucket counts in sub-token units chosen per rate so
//! that its refill is a whole number of units every microsecond: `scale` units make a token
//! and `units` units arrive each microsecond, `units / scale = tokens / per` exactly. For a
//! rate per second the scale is 10^6 (micro-tokens) and `units` is the rate itself, so
//! `rate_per_s` rules keep the state and the arithmetic they always had. GCRA spaces
//! requests `interval` µs apart, `per / tokens` rounded up (exact when it divides).

use super::{MAX_LIMIT, MAX_USED, TOKEN_SCALE};
use crate::time::{Micros, SECOND, div_ceil};
use std::fmt;

/// The longest period a rate may be written over (a year, as for windows).
pub const MAX_PERIOD: Micros = 366 * 86_400 * SECOND;

/// Tokens per period, with the derived integers the algorithms count in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    tokens: u64,
    per: Micros,
    scale: u64,
    units: u64,
}

/// Why a rate (or a bucket's burst at that rate) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// No tokens, or none per period.
    #[error("a rate must be greater than zero")]
    Zero,
    /// More tokens per period than any limit.
    #[error("a rate may count at most {MAX_LIMIT} per period, got {0}")]
    TooMany(u64),
    /// A period beyond a year.
    #[error("a rate's period must be at most 366d")]
    TooLong,
    /// Not `<count>/<duration>`.
    #[error("expected a rate like 10/1m, 100/1s or 1/1h (a count, /, a duration), got {0:?}")]
    Syntax(String),
    /// A period in calendar months, which have no fixed length.
    #[error("a rate's period must be a fixed duration (ms, s, m, h, d, w), not months")]
    Months,
    /// The bucket's capacity in sub-token units passes 2^53 (the Lua scripts' exact range).
    #[error(
        "burst {burst} at {rate} needs {burst} × {scale} sub-token units, above 2^53: \
         use a smaller burst or a rate over a round period (1s, 1m, 1h)"
    )]
    BurstTooBig {
        /// The burst.
        burst: u64,
        /// The rate as written.
        rate: String,
        /// Units per token at that rate.
        scale: u64,
    },
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rate {
    /// `n` tokens a second (the `rate_per_s` of the rule format). Micro-tokens, `n` a µs.
    pub const fn per_second(n: u64) -> Rate {
        Rate {
            tokens: n,
            per: SECOND,
            scale: TOKEN_SCALE,
            units: n,
        }
    }

    /// `tokens` per `per` microseconds.
    pub fn new(tokens: u64, per: Micros) -> Result<Rate, RateError> {
        if tokens == 0 || per == 0 {
            return Err(RateError::Zero);
        }
        if tokens > MAX_LIMIT {
            return Err(RateError::TooMany(tokens));
        }
        if per > MAX_PERIOD {
            return Err(RateError::TooLong);
        }
        // The fewest units per token that make the refill whole: the reduced period, made a
        // multiple of 10^6 so a token is never coarser than micro-tokens.
        let (t, p) = (u128::from(tokens), u128::from(per));
        let g = gcd(t, p);
        let reduced = p / g;
        let scale = reduced * u128::from(TOKEN_SCALE) / gcd(reduced, u128::from(TOKEN_SCALE));
        let units = t / g * (scale / reduced);
        match (u64::try_from(scale), u64::try_from(units)) {
            (Ok(scale), Ok(units)) if scale <= MAX_USED && units <= MAX_USED => Ok(Rate {
                tokens,
                per,
                scale,
                units,
            }),
            _ => Err(RateError::BurstTooBig {
                burst: 1,
                rate: format!("{tokens}/{}", crate::time::Span::Fixed(per)),
                scale: u64::try_from(scale).unwrap_or(u64::MAX),
            }),
        }
    }

    /// Tokens per period, as written.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The period, in microseconds, as written.
    pub fn per(&self) -> Micros {
        self.per
    }

    /// Token bucket units per token (10^6 for rates per second).
    pub fn scale(&self) -> u64 {
        self.scale
    }

    /// Token bucket units refilled per microsecond.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// GCRA's emission interval: µs per request, rounded up so it never admits more.
    pub fn interval(&self) -> Micros {
        div_ceil(self.per, self.tokens)
    }

    /// How long the rate takes to refill `n` tokens (rounded up, saturating).
    pub fn time_for(&self, n: u64) -> Micros {
        let t = (u128::from(n) * u128::from(self.per)).div_ceil(u128::from(self.tokens));
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// Whole tokens refilled in `d` microseconds (rounded down, saturating).
    pub fn tokens_in(&self, d: Micros) -> u64 {
        let t = u128::from(d) * u128::from(self.tokens) / u128::from(self.per);
        u64::try_from(t).unwrap_or(u64::MAX)
    }

    /// The rate as `(q, w)`: `q` tokens every `w` whole seconds, exactly (`3/500ms` is 6 per
    /// 1 s; `10/1m` is 10 per 60 s), for headers that count in seconds. Saturates `q`.
    pub fn per_whole_seconds(&self) -> (u64, u64) {
        // Whole seconds already (every `rate_per_s`): the gcd is a second, so `(tokens, s)`.
        if self.per.is_multiple_of(SECOND) {
            return (self.tokens, self.per / SECOND);
        }
        let g = gcd(u128::from(self.per), u128::from(SECOND));
        let k = u128::from(SECOND) / g;
        let q = u128::from(self.tokens) * k;
        let w = u128::from(self.per) * k / u128::from(SECOND);
        (
            u64::try_from(q).unwrap_or(u64::MAX),
            u64::try_from(w).unwrap_or(u64::MAX),
        )
    }

    /// Tokens per second, for reports and estimates (not for decisions).
    pub fn per_second_f64(&self) -> f64 {
        self.tokens as f64 * SECOND as f64 / self.per as f64
    }

    /// The same period with `f(tokens)` tokens: how splits, shares and local buckets divide
    /// a rate. `None` when `f` leaves no token (or the rate cannot be counted exactly).
    pub fn with_tokens(&self, f: impl FnOnce(u64) -> u64) -> Option<Rate> {
        Rate::new(f(self.tokens), self.per).ok()
    }

    /// Checks a bucket of `burst` at this rate stays in the exact range: its capacity in
    /// units (token bucket) and its tolerance in µs (GCRA) below 2^53.
    pub fn fits(&self, burst: u64) -> Result<(), RateError> {
        let cap = u128::from(burst) * u128::from(self.scale);
        let tolerance = u128::from(burst) * u128::from(self.interval());
        if cap > u128::from(MAX_USED) || tolerance > u128::from(MAX_USED) {
            return Err(RateError::BurstTooBig {
                burst,
                rate: self.to_string(),
                scale: self.scale.max(self.interval()),
            });
        }
        Ok(())
    }
}

/// Parses the rule format's `rate`: a count, `/`, and a duration as windows write it
/// (`10/1m`, `100/1s`, `1/1h`, `3/500ms`); a duration of one unit may drop its 1 (`10/m`).
pub fn parse_rate(text: &str) -> Result<Rate, RateError> {
    let syntax = || RateError::Syntax(text.to_string());
    let (count, period) = text.split_once('/').ok_or_else(syntax)?;
    let (count, period) = (count.trim(), period.trim());
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(syntax());
    }
    let tokens: u64 = count.parse().map_err(|_| RateError::TooMany(u64::MAX))?;
    let spelled = if period.starts_with(|c: char| c.is_ascii_alphabetic()) {
        format!("1{period}")
    } else {
        period.to_string()
    };
    let per = match crate::time::parse_span(&spelled) {
        Ok(crate::time::Span::Fixed(us)) => us,
        Ok(crate::time::Span::Months(_)) => return Err(RateError::Months),
        Err(crate::time::SpanError::TooLong) => return Err(RateError::TooLong),
        Err(crate::time::SpanError::Zero) => return Err(RateError::Zero),
        Err(crate::time::SpanError::Syntax(_)) => return Err(syntax()),
    };
    Rate::new(tokens, per)
}

/// `10/1m`, `5/1s`, the rule format's `rate`.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tokens, crate::time::Span::Fixed(self.per))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MILLI;

    #[test]
    fn rates_per_second_count_in_micro_tokens() {
        for n in [1, 3, 7, 1_000, 999_983, 1_000_000_000] {
            assert_eq!(Rate::new(n, SECOND), Ok(Rate::per_second(n)), "{n}");
        }
    }

    #[test]
    fn the_refill_is_whole_units_a_microsecond() {
        for (tokens, per) in [
            (10, 60 * SECOND),
            (1, 3_600 * SECOND),
            (7, 60 * SECOND),
            (3, 7 * SECOND),
            (1, 86_400 * SECOND),
            (10, 1_500 * MILLI),
            (1_000_000_000, 366 * 86_400 * SECOND),
        ] {
            let r = Rate::new(tokens, per).expect("valid");
            // units / scale == tokens / per, exactly.
            assert_eq!(
                u128::from(r.units()) * u128::from(per),
                u128::from(tokens) * u128::from(r.scale()),
                "{r}"
            );
            assert!(r.scale().is_multiple_of(TOKEN_SCALE), "{r}");
        }
        let r = Rate::new(10, 60 * SECOND).expect("valid");
        assert_eq!(
            (r.scale(), r.units(), r.interval()),
            (6_000_000, 1, 6 * SECOND)
        );
        assert_eq!(r.time_for(1), 6 * SECOND);
        assert_eq!(r.tokens_in(6 * SECOND - 1), 0);
        assert_eq!(r.to_string(), "10/1m");
        assert_eq!(r.per_whole_seconds(), (10, 60));
        assert_eq!(
            Rate::new(3, 500 * MILLI).map(|r| r.per_whole_seconds()),
            Ok((6, 1))
        );
        assert_eq!(Rate::per_second(7).per_whole_seconds(), (7, 1));
        assert_eq!(
            Rate::new(5, 120 * SECOND).map(|r| r.per_whole_seconds()),
            Ok((5, 120))
        );
    }

    use proptest::prelude::Strategy as _;

    proptest::proptest! {
        /// The whole-seconds shortcut gives what the gcd gives: `q / w == tokens / per`, in
        /// lowest terms as far as seconds go.
        #[test]
        fn whole_seconds_are_the_gcds(
            tokens in 1u64..=MAX_LIMIT,
            per_ms in proptest::prop_oneof![
                1u64..=86_400_000,
                (1u64..=86_400).prop_map(|s| s * 1000),
            ],
        ) {
            let Ok(r) = Rate::new(tokens, per_ms * MILLI) else { return Ok(()) };
            let g = gcd(u128::from(r.per), u128::from(SECOND));
            let k = u128::from(SECOND) / g;
            let want = (
                u64::try_from(u128::from(r.tokens) * k).unwrap_or(u64::MAX),
                u64::try_from(u128::from(r.per) * k / u128::from(SECOND)).unwrap_or(u64::MAX),
            );
            proptest::prop_assert_eq!(r.per_whole_seconds(), want);
        }
    }

    #[test]
    fn rates_parse_as_windows_are_written() {
        let r = |t| parse_rate(t);
        assert_eq!(r("10/1m"), Rate::new(10, 60 * SECOND));
        assert_eq!(r("10 / m"), Rate::new(10, 60 * SECOND));
        assert_eq!(r("1/1h"), Rate::new(1, 3_600 * SECOND));
        assert_eq!(r("100/1s"), Ok(Rate::per_second(100)));
        assert_eq!(r("3/500ms"), Rate::new(3, 500 * MILLI));
        assert_eq!(r("2/1d").map(|r| r.to_string()), Ok("2/1d".to_string()));
        for bad in [
            "10", "10/", "/1m", "ten/1m", "-1/1m", "10/1x", "1.5/1s", "10/1m/2",
        ] {
            assert!(matches!(r(bad), Err(RateError::Syntax(_))), "{bad}");
        }
        assert_eq!(r("0/1m"), Err(RateError::Zero));
        assert_eq!(r("1/0s"), Err(RateError::Zero));
        assert_eq!(r("1/1mo"), Err(RateError::Months));
        assert_eq!(r("1/400d"), Err(RateError::TooLong));
        assert!(matches!(
            r("99999999999999999999/1s"),
            Err(RateError::TooMany(_))
        ));
    }

    #[test]
    fn bad_rates_and_bursts_are_refused() {
        assert_eq!(Rate::new(0, SECOND), Err(RateError::Zero));
        assert_eq!(
            Rate::new(MAX_LIMIT + 1, SECOND),
            Err(RateError::TooMany(MAX_LIMIT + 1))
        );
        assert_eq!(Rate::new(1, MAX_PERIOD + 1), Err(RateError::TooLong));
        let day = Rate::new(1, 86_400 * SECOND).expect("valid");
        assert!(day.fits(100_000).is_ok());
        assert!(matches!(
            day.fits(200_000),
            Err(RateError::BurstTooBig { .. })
        ));
        assert!(Rate::per_second(1).fits(MAX_LIMIT).is_ok());
    }
}
