//! `sluicectl import-envoy FILE`: an envoyproxy/ratelimit config turned into Sluice rules, so
//! an Envoy fleet can move its limits along with its `rate_limit_service` address.
//!
//! The reference service matches a request descriptor by walking its config tree one entry at
//! a time (an exact `key`/`value` first, then a wildcard value, then the bare `key`) and applies
//! the limit found at exactly the request's depth, counted in a fixed window of one unit per
//! full descriptor. Each config node with a `rate_limit` becomes one rule:
//!
//! - `match`: `envoy.keys` (the entry keys in order, joined by `/`, which sluiced adds to every
//!   Envoy descriptor, see crates/sluiced/src/envoy/translate.rs) pins the depth and order;
//!   each entry's value, or `"*"` for a bare key or a `*` value.
//! - `key`: every entry key, so the count is per full descriptor, as in Envoy.
//! - `fixed_window`, `limit: requests_per_unit`, `window` one unit (month = 30 d and year =
//!   365 d, as the reference service counts them).
//! - `shadow_mode` → `mode: shadow`; `unlimited` → `mode: off`, which still wins its group and
//!   so exempts the descriptor from a less specific limit, as in Envoy.
//! - Alternatives for the same keys (`key` vs `key`+`value`) share a `group`, listed most
//!   specific first, so exactly one applies, as in Envoy.
//!
//! What cannot be carried over is left out or kept with a note, never silently changed:
//! prefix wildcards (`value: "foo*"`), `requests_per_unit: 0`, `replaces`, `detailed_metric`,
//! keys that are not Sluice descriptor names, and the cases where the tree walk and Sluice's
//! "most specific rule of the group" pick different limits.
//!
//! `parse` reads the config tree as the reference service does (and refuses what it refuses),
//! `translate` turns its limits into rules, `ids` names them, `walk` notes where Envoy's tree
//! walk and Sluice's groups part ways, and `yaml` writes the rules file.

mod ids;
mod parse;
mod translate;
mod walk;
mod yaml;

use anyhow::{Context as _, anyhow, bail};
use serde::Deserialize as _;
use serde_json::Value;

/// The synthetic descriptor sluiced adds to each Envoy descriptor
/// (crates/sluiced/src/envoy/translate.rs).
pub const KEYS_DESCRIPTOR: &str = "envoy.keys";

/// The converted rules and what could not be carried over.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    /// One rules document per domain, in the rule format.
    pub domains: Vec<Value>,
    /// Everything that was dropped or changes meaning, each naming the config path.
    pub notes: Vec<String>,
}

/// Converts the text of an envoyproxy/ratelimit config (one domain per YAML document).
pub fn convert(text: &str) -> anyhow::Result<Import> {
    let mut notes = Vec::new();
    let mut domains = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(doc).with_context(|| format!("document {}: not YAML", i + 1))?;
        if v.is_null() {
            continue;
        }
        domains.push(translate::domain(&v, i + 1, &mut notes)?);
    }
    if domains.is_empty() {
        bail!("no ratelimit config in the file");
    }
    Ok(Import { domains, notes })
}

/// Reads FILE, prints the rules on stdout and the notes on stderr.
pub fn run(path: &std::path::Path) -> anyhow::Result<()> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    let import = convert(&text)?;
    let yaml = import.to_yaml(&path.display().to_string())?;
    // What we print must be a rule set sluiced accepts.
    sluice_core::rules::parse_yaml(&yaml)
        .map_err(|e| anyhow!("the converted rules do not validate (a bug in import-envoy): {e}"))?;
    print!("{yaml}");
    std::io::Write::flush(&mut std::io::stdout()).context("writing the rules")?;
    let rules: usize = import
        .domains
        .iter()
        .map(|d| d["rules"].as_array().map_or(0, Vec::len))
        .sum();
    if import.notes.is_empty() {
        eprintln!("import-envoy: {rules} rules; everything was carried over");
    } else {
        eprintln!(
            "import-envoy: {rules} rules; {} thing(s) not carried over as they were:",
            import.notes.len()
        );
        for n in &import.notes {
            eprintln!("  - {n}");
        }
    }
    Ok(())
}
