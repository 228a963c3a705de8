//! The command line: global flags, subcommands and their arguments (clap derive). Only
//! what is typed; what each subcommand does is in its own module.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Operate Sluice's rules: apply, inspect, shadow, roll back, check.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
pub struct Cli {
    /// Admin API of any daemon (they all write to the same PostgreSQL).
    #[arg(
        long,
        global = true,
        env = "SLUICE_SERVER",
        default_value = "http://127.0.0.1:8082"
    )]
    pub server: String,
    /// PEM CA certificates to verify an https:// server with (default: the system's roots).
    #[arg(long, global = true, env = "SLUICE_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Output: a table for people, or the server's JSON for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Seconds to wait for the server.
    #[arg(long, global = true, default_value_t = 30)]
    pub timeout: u64,
    #[command(subcommand)]
    pub command: Command,
}

/// A share of daemons: `10` or `10%`, 0 to 100.
fn parse_pct(s: &str) -> Result<u8, String> {
    let n = s.trim().strip_suffix('%').unwrap_or(s.trim());
    match n.trim().parse::<u8>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(format!(
            "expected a share from 0 to 100 (10 or 10%), got {s:?}"
        )),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned tables and YAML.
    Table,
    /// The server's JSON, unchanged.
    Json,
    /// Rule-format YAML (for `get` and `export`).
    Yaml,
}

/// The decision log window and daemons a what-if reads.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WhatIfFlags {
    /// Replay from (epoch µs, or a duration back: `30m`); default an hour back.
    #[arg(long)]
    pub since: Option<String>,
    /// Replay until (epoch µs, or a duration back); default now.
    #[arg(long)]
    pub until: Option<String>,
    /// A daemon's admin API whose decision log to read (repeat for each daemon of the
    /// fleet); without it, the server's own log, replayed there.
    #[arg(long = "decisions", value_name = "URL")]
    pub decisions: Vec<String>,
}

impl WhatIfFlags {
    /// As the what-if module takes them.
    pub fn args(self) -> crate::whatif::Args {
        crate::whatif::Args {
            since: self.since,
            until: self.until,
            decisions: self.decisions,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Make whole domains equal to a rules file: shows the diff, then applies it as one version.
    Apply {
        /// Rules file (one domain per YAML document); `-` reads stdin.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Show the diff only.
        #[arg(long)]
        dry_run: bool,
        /// A change more than 10× tighter: hold it for another principal's approval
        /// (`sluicectl approve ID`) instead of refusing it (and show its what-if report).
        #[arg(long)]
        force: bool,
        /// Apply nothing: replay the decision logs through the file's rules and report who
        /// they would refuse, against the current set.
        #[arg(long)]
        what_if: bool,
        #[command(flatten)]
        window: WhatIfFlags,
    },
    /// List rules, or show one.
    Get {
        /// Rule id (omit to list).
        id: Option<String>,
        /// Only this domain.
        #[arg(long)]
        domain: Option<String>,
        /// Only rules that can apply to this route (`"POST /v1/login"`).
        #[arg(long)]
        route: Option<String>,
    },
    /// Delete a rule.
    Delete {
        /// Rule id.
        id: String,
        /// Domain (needed when the id exists in several).
        #[arg(long)]
        domain: Option<String>,
    },
    /// Put a rule in shadow: evaluated and recorded, never rejecting.
    Shadow {
        /// Rule id.
        id: String,
        /// Domain (needed when the id exists in several).
        #[arg(long)]
        domain: Option<String>,
    },
    /// Make a rule enforce (reject over its limit).
    Enforce {
        /// Rule id.
        id: String,
        /// Domain (needed when the id exists in several).
        #[arg(long)]
        domain: Option<String>,
    },
    /// Turn one rule off (not evaluated at all).
    Off {
        /// Rule id.
        id: String,
        /// Domain (needed when the id exists in several).
        #[arg(long)]
        domain: Option<String>,
    },
    /// Enforce a rule on N% of the daemons and shadow it on the others (its `enforce_on`),
    /// raised step by step: a bad change refuses traffic on that share only, and the other
    /// daemons' would-refusals show what enforcing everywhere will do. An ordinary rule
    /// write: versions, history and approval apply.
    Canary {
        /// Rule id.
        id: String,
        /// The share of daemons that enforce: 0 to 100 (`10` or `10%`); 100 is everywhere.
        #[arg(value_parser = parse_pct)]
        pct: u8,
        /// Domain (needed when the id exists in several).
        #[arg(long)]
        domain: Option<String>,
    },
    /// Kill switch: every enforcing rule to shadow (undo with `rollback --to` the version before).
    ShadowAll {
        /// Only this domain.
        #[arg(long)]
        domain: Option<String>,
    },
    /// Restore the rules of an earlier version, as a new version.
    Rollback {
        /// The version to restore (see `sluicectl history`).
        #[arg(long = "to")]
        to: u64,
        /// Show the diff only.
        #[arg(long)]
        dry_run: bool,
        /// A rollback more than 10× tighter: hold it for another principal's approval.
        #[arg(long)]
        force: bool,
    },
    /// Which rules version each daemon serves.
    Status,
    /// Changes held for a second principal's approval (more than 10× tighter, forced).
    Pending {
        /// Also those expired, approved or rejected.
        #[arg(long)]
        all: bool,
        /// With each held apply's what-if report over the window, now.
        #[arg(long)]
        what_if: bool,
        #[command(flatten)]
        window: WhatIfFlags,
    },
    /// Approve a held change: it is applied as a new version. Not by the one who proposed it.
    Approve {
        /// The pending change's id (see `sluicectl pending`).
        id: u64,
    },
    /// Reject a held change (its proposer may withdraw it too).
    Reject {
        /// The pending change's id.
        id: u64,
    },
    /// Every version of one rule, or the latest versions of everything.
    History {
        /// Rule id (omit for the change log).
        id: Option<String>,
        /// Domain (when the id exists in several).
        #[arg(long)]
        domain: Option<String>,
        /// How many versions.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Print every domain as a rules file (`-o json` for JSON).
    Export {
        /// Only this domain.
        #[arg(long)]
        domain: Option<String>,
    },
    /// Per-identity numbers or exemptions.
    #[command(subcommand)]
    Override(OverrideCmd),
    /// Send one check to a daemon's HTTP API (does count against the limits).
    Check {
        /// Rules domain.
        #[arg(long)]
        domain: String,
        /// Descriptors, `name=value`.
        #[arg(required = true)]
        descriptors: Vec<String>,
        /// Units asked for.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        /// The daemon's check API.
        #[arg(
            long,
            env = "SLUICE_CHECK_SERVER",
            default_value = "http://127.0.0.1:8080"
        )]
        check_server: String,
    },
    /// Create or upgrade the PostgreSQL schema (idempotent; daemons also do it on start).
    Migrate {
        /// PostgreSQL URL, e.g. postgres://sluice@db:5432/sluice.
        #[arg(long, env = "SLUICE_POSTGRES")]
        postgres: String,
    },
    /// Turn an envoyproxy/ratelimit config into Sluice rules (stdout) and say what could not
    /// be carried over (stderr). Needs no server. See docs/envoy.md.
    ImportEnvoy {
        /// The ratelimit service's YAML config files (one domain each); `-` reads stdin.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Join files of the same domain, as the service does with MERGE_DOMAIN_CONFIG=true
        /// (without it, as without that setting, a repeated domain is refused).
        #[arg(long)]
        merge_domains: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum OverrideCmd {
    /// List overrides.
    List {
        /// Only this domain.
        #[arg(long)]
        domain: Option<String>,
    },
    /// Create or replace an override: `override set pay-burst api_key=k_big --rate-per-s 200 --burst 400`.
    Set {
        /// The rule it changes, or `*` (exemption from every rule).
        rule: String,
        /// The identity, `name=value` (one or more).
        #[arg(required = true)]
        identity: Vec<String>,
        /// New limit (window and concurrency rules).
        #[arg(long)]
        limit: Option<u64>,
        /// New rate per second (token bucket, GCRA).
        #[arg(long, conflicts_with = "rate")]
        rate_per_s: Option<u64>,
        /// New rate over any period, as rules write it: `10/1m`, `1/1h` (token bucket, GCRA).
        #[arg(long)]
        rate: Option<String>,
        /// New burst (token bucket, GCRA).
        #[arg(long)]
        burst: Option<u64>,
        /// Exempt the identity instead.
        #[arg(long)]
        exempt: bool,
        /// Domain (when the rule id exists in several).
        #[arg(long)]
        domain: Option<String>,
        /// More than 10× tighter: hold it for another principal's approval.
        #[arg(long)]
        force: bool,
    },
    /// Delete an override.
    Delete {
        /// The rule, or `*`.
        rule: String,
        /// The identity, `name=value` (one or more).
        #[arg(required = true)]
        identity: Vec<String>,
        /// Domain.
        #[arg(long)]
        domain: Option<String>,
    },
}
