//! Calendar-aligned windows: "10,000 a day, resetting at midnight Asia/Kolkata".
//!
//! The boundaries are a pure function of `now` and the zone (jiff with its bundled tz
//! database, so no file is read). The daemon and the Lua scripts never compute them apart: the
//! window start is part of the store key, computed here.

use crate::time::{Micros, SECOND};
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// The calendar period of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CalendarUnit {
    /// Local hour (Asia/Kolkata's hours start at :30 UTC).
    Hour,
    /// Local day, midnight to midnight (23 or 25 hours across DST changes).
    Day,
    /// ISO week from Monday 00:00.
    Week,
    /// Calendar month from the 1st, 00:00.
    Month,
}

/// A calendar window in a time zone.
#[derive(Clone, Debug)]
pub struct Calendar {
    /// The period.
    pub unit: CalendarUnit,
    /// The IANA name, for display and equality.
    pub tz_name: String,
    tz: TimeZone,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && self.tz_name == other.tz_name
    }
}

impl Calendar {
    /// A calendar in the named zone; `None` if the zone is unknown.
    pub fn new(unit: CalendarUnit, tz_name: &str) -> Option<Calendar> {
        let tz = TimeZone::get(tz_name).ok()?;
        Some(Calendar {
            unit,
            tz_name: tz_name.to_string(),
            tz,
        })
    }

    /// Nominal length, for headers.
    pub fn nominal(&self) -> Micros {
        match self.unit {
            CalendarUnit::Hour => 3_600 * SECOND,
            CalendarUnit::Day => 86_400 * SECOND,
            CalendarUnit::Week => 7 * 86_400 * SECOND,
            CalendarUnit::Month => 30 * 86_400 * SECOND,
        }
    }

    /// `[start, end)` holding `now`. Falls back to epoch alignment of the nominal length for
    /// instants jiff cannot represent (far outside any real clock).
    pub fn bounds(&self, now: Micros) -> (Micros, Micros) {
        self.civil_bounds(now).unwrap_or_else(|| {
            let len = self.nominal();
            let start = now - now % len;
            (start, start + len)
        })
    }

    fn civil_bounds(&self, now: Micros) -> Option<(Micros, Micros)> {
        let ts = Timestamp::from_microsecond(i64::try_from(now).ok()?).ok()?;
        let local = ts.to_zoned_datetime(self.tz.clone()).datetime();
        let (start, next): (DateTime, DateTime) = match self.unit {
            CalendarUnit::Hour => {
                let s = local
                    .with()
                    .minute(0)
                    .second(0)
                    .subsec_nanosecond(0)
                    .build()
                    .ok()?;
                (s, s.checked_add(1.hour()).ok()?)
            }
            CalendarUnit::Day => {
                let s = local.start_of_day();
                (s, s.checked_add(1.day()).ok()?)
            }
            CalendarUnit::Week => {
                let back = i64::from(local.date().weekday().to_monday_zero_offset());
                let s = local.start_of_day().checked_sub(back.days()).ok()?;
                (s, s.checked_add(1.week()).ok()?)
            }
            CalendarUnit::Month => {
                let s = local.first_of_month().start_of_day();
                (s, s.checked_add(1.month()).ok()?)
            }
        };
        let micros = |dt: DateTime| -> Option<Micros> {
            let z = dt.to_zoned_datetime(self.tz.clone()).ok()?;
            u64::try_from(z.timestamp().as_microsecond()).ok()
        };
        let (s, e) = (micros(start)?, micros(next)?);
        // A DST gap at the boundary can make the civil start land after `now`.
        (s <= now && now < e).then_some((s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(rfc3339: &str) -> Micros {
        let ts: Timestamp = rfc3339.parse().expect("valid timestamp in test");
        ts.as_microsecond() as Micros
    }

    #[test]
    fn kolkata_day_resets_at_local_midnight() {
        let c = Calendar::new(CalendarUnit::Day, "Asia/Kolkata").expect("zone exists");
        let (s, e) = c.bounds(us("2026-03-10T20:00:00Z"));
        assert_eq!(s, us("2026-03-10T18:30:00Z"));
        assert_eq!(e, us("2026-03-11T18:30:00Z"));
        let (s, _) = c.bounds(us("2026-03-10T18:29:59Z"));
        assert_eq!(s, us("2026-03-09T18:30:00Z"));
    }

    #[test]
    fn dst_day_is_23_hours_and_months_vary() {
        let c = Calendar::new(CalendarUnit::Day, "America/New_York").expect("zone exists");
        let (s, e) = c.bounds(us("2026-03-08T12:00:00Z"));
        assert_eq!(e - s, 23 * 3_600 * SECOND);
        let m = Calendar::new(CalendarUnit::Month, "UTC").expect("zone exists");
        let (s, e) = m.bounds(us("2026-02-14T00:00:00Z"));
        assert_eq!(
            (s, e),
            (us("2026-02-01T00:00:00Z"), us("2026-03-01T00:00:00Z"))
        );
        let w = Calendar::new(CalendarUnit::Week, "UTC").expect("zone exists");
        let (s, _) = w.bounds(us("2026-11-29T10:00:00Z"));
        assert_eq!(s, us("2026-11-23T00:00:00Z"));
        let h = Calendar::new(CalendarUnit::Hour, "Asia/Kolkata").expect("zone exists");
        assert_eq!(
            h.bounds(us("2026-11-29T10:00:00Z")).0,
            us("2026-11-29T09:30:00Z")
        );
        assert!(Calendar::new(CalendarUnit::Day, "Mars/Olympus").is_none());
    }
}
