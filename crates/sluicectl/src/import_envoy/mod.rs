//! `sluicectl import-envoy FILE...`: envoyproxy/ratelimit config files turned into Sluice rules,
//! so an Envoy fleet can move its limits along with its `rate_limit_service` address. Every file
//! the service loads is converted; every file it refuses is refused with its reason.
//!
//! The reference service matches a request descriptor by walking its config tree one entry at
//! a time (an exact `key`/`value` first, then a wildcard value, then the bare `key`) and applies
//! the limit found at exactly the request's depth, counted in a fixed window of one unit per
//! full descriptor. Each config node with a `rate_limit` becomes one rule:
//!
//! - `match`: `envoy.keys` (the entry keys in order, joined by `/`, which sluiced adds to every
//!   Envoy descriptor, see crates/sluiced/src/envoy/translate.rs) pins the depth and order;
//!   each entry's value, or `"*"` for a bare key or a `*` value.
//! - `key`: every entry key, so the count is per full descriptor, as in Envoy (less a `"*"`
//!   entry with `share_threshold`, whose values share one count there).
//! - `fixed_window`, `limit: requests_per_unit`, `window` one unit (month = 30 d and year =
//!   365 d, as the reference service counts them).
//! - `shadow_mode` → `mode: shadow`; `unlimited` → `mode: off`, which still wins its group and
//!   so exempts the descriptor from a less specific limit, as in Envoy.
//! - Alternatives for the same keys (`key` vs `key`+`value`) share a `group`, listed most
//!   specific first, so exactly one applies, as in Envoy.
//!
//! What cannot be carried over is left out or kept with a note, never silently changed:
//! wildcards other than `"*"` (`value: "foo*"`, `"a*b"`), `requests_per_unit: 0`, `replaces`,
//! `quota_mode`, `detailed_metric`, `value_to_metric`, `metadata`, keys that are not Sluice
//! descriptor names, keys the service accepts but ignores where they stand, documents after a
//! file's first, and the cases where the tree walk and Sluice's "most specific rule of the
//! group" pick different limits.
//!
//! `yaml_in` reads the YAML as the service's yaml.v2 does, `parse` the config tree as the
//! service's loader does (accepting every key it accepts, refusing what it refuses), `translate`
//! turns its limits into rules, `ids` names them, `walk` notes where Envoy's tree walk and
//! Sluice's groups part ways, and `yaml` writes the rules file.

mod ids;
mod parse;
mod translate;
mod walk;
mod yaml;
mod yaml_in;

use anyhow::{Context as _, anyhow, bail};
use serde_json::Value;
use std::collections::HashSet;
use std::fmt;

/// The synthetic descriptor sluiced adds to each Envoy descriptor
/// (crates/sluiced/src/envoy/translate.rs).
pub const KEYS_DESCRIPTOR: &str = "envoy.keys";

/// One thing not carried over as it was: where (file, descriptor path, config key) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The config file.
    pub file: String,
    /// The descriptor path in it, `descriptors[0].descriptors[1]` (or `root`, `document 2`).
    pub at: String,
    /// The config key the note is about (`replaces`, `value`, ...).
    pub key: String,
    /// What happened to it.
    pub text: String,
}

impl Note {
    pub(crate) fn new(file: &str, at: &str, key: &str, text: impl Into<String>) -> Note {
        Note {
            file: file.into(),
            at: at.into(),
            key: key.into(),
            text: text.into(),
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} {}: {}", self.file, self.at, self.key, self.text)
    }
}

/// The converted rules and what could not be carried over.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    /// One rules document per domain, in the rule format.
    pub domains: Vec<Value>,
    /// Everything that was dropped or changes meaning, each naming file, path and key.
    pub notes: Vec<Note>,
    /// The files read, in order.
    pub files: Vec<String>,
}

/// A domain's tree, gathered over the files that name it.
struct Tree {
    name: String,
    nodes: Vec<parse::Node>,
    /// The composite keys of its top level (merged files may not repeat one).
    taken: HashSet<String>,
}

/// Converts envoyproxy/ratelimit config files, given as (name, text), as the service loads
/// them: one domain per file (its first YAML document), a domain named by two files refused
/// unless `merge_domains` (the service's `MERGE_DOMAIN_CONFIG`), which joins their trees.
pub fn convert(files: &[(String, String)], merge_domains: bool) -> anyhow::Result<Import> {
    let mut notes = Vec::new();
    let mut trees: Vec<Tree> = Vec::new();
    for (file, text) in files {
        load(file, text, merge_domains, &mut trees, &mut notes)
            .map_err(|e| anyhow!("{file}: {e:#}"))?;
    }
    let mut domains = Vec::new();
    for t in &trees {
        domains.push(translate::domain(&t.name, &t.nodes, &mut notes)?);
    }
    Ok(Import {
        domains,
        notes,
        files: files.iter().map(|(f, _)| f.clone()).collect(),
    })
}

/// One file, as `config.yaml`, without merging: the tests' shorthand.
#[cfg(test)]
pub(crate) fn convert_one(text: &str) -> anyhow::Result<Import> {
    convert(&[("config.yaml".into(), text.into())], false)
}

fn load(
    file: &str,
    text: &str,
    merge: bool,
    trees: &mut Vec<Tree>,
    notes: &mut Vec<Note>,
) -> anyhow::Result<()> {
    let docs = yaml_in::documents(text);
    let first = match docs.first() {
        None => yaml_in::Yaml::Null,
        Some(Ok(d)) => d.clone(),
        Some(Err(e)) => bail!("error loading config file (not YAML): {e}"),
    };
    if docs.len() > 1 {
        notes.push(Note::new(
            file,
            &if docs.len() == 2 {
                "document 2".to_string()
            } else {
                format!("documents 2-{}", docs.len())
            },
            "---",
            "not read: the ratelimit service loads only a file's first YAML document; put each domain in a file of its own",
        ));
    }
    let root = parse::root(&first, file, notes)?;
    let at = trees.iter().position(|t| t.name == root.domain);
    if at.is_some() && !merge {
        bail!(
            "duplicate domain '{}' in config file (the service merges domains only with MERGE_DOMAIN_CONFIG; here --merge-domains)",
            root.domain
        );
    }
    let i = at.unwrap_or_else(|| {
        trees.push(Tree {
            name: root.domain.clone(),
            nodes: Vec::new(),
            taken: HashSet::new(),
        });
        trees.len() - 1
    });
    let t = &mut trees[i];
    let nodes = parse::nodes(
        root.descriptors,
        parse::Level {
            taken: &mut t.taken,
            parent_key: &format!("{}.", root.domain),
            at: "descriptors",
            file,
        },
        notes,
    )?;
    t.nodes.extend(nodes);
    Ok(())
}

/// Reads the files (`-` is stdin), prints the rules on stdout and, on stderr, a report per
/// file of what was not carried over.
pub fn run(paths: &[std::path::PathBuf], merge_domains: bool) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for path in paths {
        let text = if path.as_os_str() == "-" {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("reading stdin")?;
            s
        } else {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        };
        files.push((path.display().to_string(), text));
    }
    let import = convert(&files, merge_domains)?;
    let yaml = import.to_yaml(&import.files.join(", "))?;
    // What we print must be a rule set sluiced accepts.
    sluice_core::rules::parse_yaml(&yaml)
        .map_err(|e| anyhow!("the converted rules do not validate (a bug in import-envoy): {e}"))?;
    print!("{yaml}");
    std::io::Write::flush(&mut std::io::stdout()).context("writing the rules")?;
    eprint!("{}", import.report());
    Ok(())
}

impl Import {
    /// The report: rule count, then per file what was not carried over as it was.
    pub fn report(&self) -> String {
        let rules: usize = self
            .domains
            .iter()
            .map(|d| d["rules"].as_array().map_or(0, Vec::len))
            .sum();
        let mut out = format!(
            "import-envoy: {rules} rules in {} domain(s) from {} file(s)\n",
            self.domains.len(),
            self.files.len()
        );
        for f in &self.files {
            let mine: Vec<&Note> = self.notes.iter().filter(|n| n.file == *f).collect();
            if mine.is_empty() {
                out.push_str(&format!("{f}: everything was carried over\n"));
                continue;
            }
            out.push_str(&format!(
                "{f}: {} thing(s) not carried over as they were:\n",
                mine.len()
            ));
            for n in mine {
                out.push_str(&format!("  - {} {}: {}\n", n.at, n.key, n.text));
            }
        }
        out
    }
}
