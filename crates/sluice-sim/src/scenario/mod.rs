//! Scenario files: the TOML format (documented field by field in simulations/README.md), its
//! validation, and `--param` overrides.
//!
//! A file is first read into [`File`] (serde refuses unknown fields and wrong types, naming
//! them), then checked into a [`Scenario`] whose values are in the units the engine uses
//! (microseconds, region indices). Every semantic check names the field by its dotted path
//! (`gossip.delay_ms.min`, `traffic[1].rate_per_s`), and nonsense (a negative delay, zero
//! regions, a loss above 1) is refused rather than simulated. The rules go through
//! sluice-core's own validator, so a scenario holds exactly the rules a daemon would accept.
//!
//! # Layout
//!
//! - `file`: the file as written (serde types, defaults);
//! - `params`: `--set`/`--param` overrides on the parsed document;
//! - `fields`, `check`, `check_stores`, `check_traffic`: the checks, from the file into
//! - `model`: the checked [`Scenario`], in the engine's units.

mod check;
mod check_stores;
mod check_traffic;
mod fields;
mod file;
mod model;
mod params;

pub use check::check;
pub use check_stores::MAX_NAMED_STORES;
pub use file::*;
pub use model::*;
pub use params::{PARAM_ALIASES, set_param};

use serde::Deserialize;

/// Why a scenario was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error (in the message, so not also a `source`).
        reason: std::io::Error,
    },
    /// Not valid TOML, an unknown field, a missing field or a wrong type (the message names
    /// the field and shows the line).
    #[error("{0}")]
    Syntax(String),
    /// A value that parses but makes no sense.
    #[error("scenario field `{field}`: {message}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A `--param` that cannot be applied.
    #[error("--param {0}")]
    Param(String),
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// Most regions and daemons a scenario may have (region indices are small integers).
pub const MAX_REGIONS: usize = 64;
/// Most daemons per region.
pub const MAX_DAEMONS: usize = 1_000;
/// Longest simulated run: a week.
pub const MAX_DURATION_S: f64 = 7.0 * 86_400.0;
/// Most keys one generator may draw from.
pub const MAX_KEYS: u64 = 10_000_000;

/// Reads, overrides and checks a scenario file.
pub fn load(path: &str, params: &[(String, String)]) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|reason| ScenarioError::Read {
        path: path.to_string(),
        reason,
    })?;
    parse(&text, params)
}

/// Parses, overrides and checks scenario text.
pub fn parse(text: &str, params: &[(String, String)]) -> Result<Scenario, ScenarioError> {
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| syntax(&e))?;
    for (k, v) in params {
        set_param(&mut doc, k, v)?;
    }
    let file: File = File::deserialize(doc).map_err(|e| syntax(&e))?;
    check(file)
}

fn syntax(e: &toml::de::Error) -> ScenarioError {
    ScenarioError::Syntax(format!("scenario: {}", e.to_string().trim_end()))
}

/// A valid scenario for the unit tests to vary.
#[cfg(test)]
const MINIMAL: &str = r#"
name = "t"
duration_s = 60
regions = ["us", "eu"]
[[rules]]
id = "g"
key = ["api_key"]
algorithm = "fixed_window"
limit = 100
window = "1m"
scope = "global"
[[traffic]]
rate_per_s = 10
"#;
