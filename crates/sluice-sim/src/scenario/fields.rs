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
