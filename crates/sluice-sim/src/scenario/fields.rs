//! Checks of single fields: finite, non-negative, positive, fractions, distributions,
//! region names; and their conversion to the engine's units. Each error names its field.

use super::{Dist, DistFile, ScenarioError, invalid};
use sluice_core::Micros;
use sluice_core::time::{MILLI, SECOND};

pub(super) fn check_f(field: &str, v: f64) -> Result<f64, ScenarioError> {
    if !v.is_finite() {
        return Err(invalid(field, format!("must be a finite number, got {v}")));
    }
    Ok(v)
}

pub(super) fn non_negative(field: &str, v: f64) -> Result<f64, ScenarioError> {
    let v = check_f(field, v)?;
    if v < 0.0 {
        return Err(invalid(field, format!("must not be negative, got {v}")));
    }
    Ok(v)
}

pub(super) fn positive(field: &str, v: f64) -> Result<f64, ScenarioError> {
    let v = check_f(field, v)?;
    if v <= 0.0 {
        return Err(invalid(
            field,
            format!("must be greater than zero, got {v}"),
        ));
    }
    Ok(v)
}

pub(super) fn fraction(field: &str, v: f64) -> Result<f64, ScenarioError> {
    let v = check_f(field, v)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(field, format!("must be from 0 to 1, got {v}")));
    }
    Ok(v)
}

pub(super) fn ms(v: f64) -> Micros {
    (v * MILLI as f64).round() as Micros
}

pub(super) fn secs(v: f64) -> Micros {
    (v * SECOND as f64).round() as Micros
}

pub(super) fn dist(field: &str, d: &DistFile) -> Result<Dist, ScenarioError> {
    let us = MILLI as f64;
    Ok(match *d {
        DistFile::Fixed { value } => {
            Dist::Fixed(non_negative(&format!("{field}.value"), value)? * us)
        }
        DistFile::Uniform { min, max } => {
            let a = non_negative(&format!("{field}.min"), min)?;
            let b = non_negative(&format!("{field}.max"), max)?;
            if b < a {
                return Err(invalid(
                    format!("{field}.max"),
                    format!("must be at least min ({a}), got {b}"),
                ));
            }
            Dist::Uniform(a * us, b * us)
        }
        DistFile::Normal { mean, sd } => Dist::Normal(
            non_negative(&format!("{field}.mean"), mean)? * us,
            non_negative(&format!("{field}.sd"), sd)? * us,
        ),
        DistFile::Exponential { mean, min } => Dist::Exponential(
            non_negative(&format!("{field}.mean"), mean)? * us,
            non_negative(&format!("{field}.min"), min)? * us,
        ),
    })
}

pub(super) fn region_index(
    regions: &[String],
    field: &str,
    name: &str,
) -> Result<usize, ScenarioError> {
    regions.iter().position(|r| r == name).ok_or_else(|| {
        invalid(
            field,
            format!(
                "unknown region {name:?}; regions are {}",
                regions.join(", ")
            ),
        )
    })
}

pub(super) fn threshold_pct(field: &str, v: f64) -> Result<u8, ScenarioError> {
    Ok((fraction(field, v)? * 100.0).round() as u8)
}

/// The largest clock offset a scenario may give a region: an hour.
const MAX_OFFSET_MS: f64 = 3_600_000.0;

/// `[clock]`, checked: each region's clock offset in µs, the list's or the spread's (the
/// first region −skew/2, the last +skew/2, evenly between; all 0 by default).
pub(super) fn clock_offsets(c: &super::ClockFile, n: usize) -> Result<Vec<i64>, ScenarioError> {
    let to_us = |v: f64| (v * MILLI as f64).round() as i64;
    let bounded = |field: &str, v: f64| -> Result<f64, ScenarioError> {
        let v = check_f(field, v)?;
        if v.abs() > MAX_OFFSET_MS {
            return Err(invalid(
                field,
                format!("must be within ±{MAX_OFFSET_MS} ms (an hour), got {v}"),
            ));
        }
        Ok(v)
    };
    let skew = bounded("clock.skew_ms", non_negative("clock.skew_ms", c.skew_ms)?)?;
    match &c.offset_ms {
        Some(_) if skew > 0.0 => Err(invalid(
            "clock.offset_ms",
            "give either clock.skew_ms or clock.offset_ms, not both",
        )),
        Some(o) if o.len() != n => Err(invalid(
            "clock.offset_ms",
            format!("needs one offset per region ({n}), got {}", o.len()),
        )),
        Some(o) => o
            .iter()
            .enumerate()
            .map(|(i, v)| Ok(to_us(bounded(&format!("clock.offset_ms[{i}]"), *v)?)))
            .collect(),
        None if n < 2 => Ok(vec![0; n]),
        None => Ok((0..n)
            .map(|i| to_us(skew * (i as f64 / (n - 1) as f64 - 0.5)))
            .collect()),
    }
}
