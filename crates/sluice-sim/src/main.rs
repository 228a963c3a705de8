//! `sluice-sim`: run a scenario, or sweep one of its parameters.
//!
//! ```text
//! sluice-sim run FILE [--seed N] [--format table|json|csv] [--out DIR] [--set NAME=VALUE]...
//! sluice-sim sweep FILE --param NAME=V1,V2,... [--seed N] [--format ...] [--out DIR] [--set ...]
//! ```
//!
//! The report goes to stdout (the seed is in it); with `--out`, CSV files and SVG plots go to
//! DIR. A progress line goes to stderr for runs longer than two seconds.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use sluice_sim::report::{self, Report, thousands, trim};
use sluice_sim::{Progress, Scenario, svg};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// A large run makes about a dozen short-lived allocations per request (keys, plans,
/// answers); mimalloc serves them in a fraction of glibc's instructions.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sluice-sim",
    version,
    about = "Deterministic simulator of Sluice across regions: what overshoot a sync interval, a failure or a hot key costs."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Table,
    Json,
    Csv,
}

#[derive(clap::Args)]
struct Common {
    /// Scenario file (TOML; see simulations/README.md).
    file: PathBuf,
    /// Seed (default: the scenario's `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Output on stdout.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write CSV files and SVG plots into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override a scenario field: an alias (ship_interval_ms, share_threshold, budget_bytes,
    /// loss, shippers, daemons) or a dotted path (gossip.delay_ms.max, traffic.0.rate_per_s,
    /// rules.hot.hot_keys.deny_cache: a list item by index or by id).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one scenario.
    Run(Common),
    /// Run a scenario once per value of one parameter: a row per value.
    Sweep {
        #[command(flatten)]
        common: Common,
        /// The swept parameter and its values, e.g. ship_interval_ms=100,250,500,1000,2000.
        #[arg(long, value_name = "NAME=V1,V2,...")]
        param: String,
    },
}

/// Prints a progress line to stderr once a run has taken more than two seconds.
struct Ticker {
    start: Instant,
    last: Instant,
    shown: bool,
    label: String,
}

impl Ticker {
    fn new(label: String) -> Ticker {
        let now = Instant::now();
        Ticker {
            start: now,
            last: now,
            shown: false,
            label,
        }
    }

    fn tick(&mut self, p: &Progress) {
        let now = Instant::now();
        let elapsed = now - self.start;
        if elapsed < Duration::from_secs(2) || now - self.last < Duration::from_millis(500) {
            return;
        }
        self.last = now;
        self.shown = true;
        let done = p.now as f64 / p.duration.max(1) as f64;
        let eta = if done > 0.0 {
            elapsed.as_secs_f64() * (1.0 - done) / done
        } else {
            0.0
        };
        eprint!(
            "\r{}{:.0} of {:.0} s simulated ({:.0}%), {} requests, {:.1} s elapsed, ~{:.0} s left   ",
            self.label,
            p.now as f64 / 1e6,
            p.duration as f64 / 1e6,
            100.0 * done,
            thousands(p.requests),
            elapsed.as_secs_f64(),
            eta
        );
        let _ = std::io::stderr().flush();
    }

    fn finish(&self) {
        if self.shown {
            eprintln!(
                "\r{}done in {:.1} s{}",
                self.label,
                self.start.elapsed().as_secs_f64(),
                " ".repeat(60)
            );
        }
    }
}

fn load(c: &Common, extra: &[(String, String)]) -> Result<Scenario> {
    let mut params = Vec::new();
    for s in &c.set {
        params.push(sluice_sim::set_spec(s)?);
    }
    params.extend_from_slice(extra);
    let path = c.file.to_string_lossy();
    Ok(sluice_sim::load(&path, &params)?)
}

fn run_one(sc: &Scenario, seed: u64, label: String) -> Report {
    let mut ticker = Ticker::new(label);
    let report = sluice_sim::run(sc, seed, &mut |p| ticker.tick(p));
    ticker.finish();
    report
}

fn write_file(dir: &Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

fn cmd_run(c: &Common) -> Result<()> {
    let sc = load(c, &[])?;
    let seed = c.seed.unwrap_or(sc.seed);
    let r = run_one(&sc, seed, String::new());
    let mut out = match c.format {
        Format::Table => report::table(&r),
        Format::Json => report::json(&r),
        Format::Csv => report::summary_csv(&r),
    };
    if let Some(dir) = &c.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_file(dir, "summary.csv", &report::summary_csv(&r))?;
        write_file(dir, "windows.csv", &report::windows_csv(&r))?;
        write_file(dir, "report.json", &report::json(&r))?;
        write_file(dir, "admitted.svg", &svg::admitted_plot(&r, &sc))?;
        write_file(dir, "calls.csv", &report::calls_csv(&r))?;
        write_file(dir, "calls.svg", &svg::calls_plot(&r, &sc))?;
        if c.format == Format::Table {
            let _ = writeln!(
                out,
                "\nwrote {}/summary.csv, windows.csv, report.json, admitted.svg, calls.csv, calls.svg",
                dir.display()
            );
        }
    }
    print!("{out}");
    Ok(())
}

fn file_safe(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn cmd_sweep(c: &Common, param: &str) -> Result<()> {
    let (name, values) = sluice_sim::sweep_spec(param)?;
    let mut rows: Vec<(f64, Report, Scenario)> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let sc =
            load(c, &[(name.clone(), v.clone())]).with_context(|| format!("with {name}={v}"))?;
        let seed = c.seed.unwrap_or(sc.seed);
        let x = v.parse::<f64>().unwrap_or(i as f64);
        let r = run_one(&sc, seed, format!("{name}={v}: "));
        rows.push((x, r, sc));
    }
    let Some((_, first, _)) = rows.first() else {
        bail!("nothing to sweep");
    };
    let mut out = String::new();
    match c.format {
        Format::Table => {
            let _ = writeln!(out, "sluice-sim sweep: {} over {name}", first.scenario);
            let _ = writeln!(
                out,
                "seed {} · {} regions × {} daemon(s) · {} s simulated per run\n",
                first.seed,
                first.regions.len(),
                first.daemons_per_region,
                trim(first.duration_s, 3)
            );
            let mut cells: Vec<Vec<String>> = vec![
                [
                    name.as_str(),
                    "rule",
                    "overshoot max",
                    "p99",
                    "mean",
                    "excess",
                    "false rej",
                    "gossip B/s",
                    "deferred",
                    "admitted/s",
                    "calls/req",
                    "deny hits",
                    "lease calls",
                    "converged",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ];
            for ((_, r, _), v) in rows.iter().zip(&values) {
                let conv = r
                    .heals
                    .iter()
                    .map(|h| {
                        h.converged_after_s
                            .map_or("no".to_string(), |s| format!("{} s", trim(s, 2)))
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                for rule in &r.rules {
                    cells.push(vec![
                        v.clone(),
                        rule.id.clone(),
                        format!("{:.3}", rule.overshoot_max),
                        format!("{:.3}", rule.overshoot_p99),
                        format!("{:.3}", rule.overshoot_mean),
                        thousands(rule.excess_units),
                        format!("{:.2}%", rule.false_rejection_pct),
                        thousands(r.gossip.bytes_per_s.round() as u64),
                        thousands(r.gossip.deferred),
                        thousands(rule.admitted_per_s.round() as u64),
                        format!("{:.4}", rule.store_calls_per_request),
                        thousands(rule.deny_hits),
                        thousands(rule.lease_calls),
                        if conv.is_empty() {
                            "-".into()
                        } else {
                            conv.clone()
                        },
                    ]);
                }
            }
            out.push_str(&report::pad(&cells, 2));
        }
        Format::Json => {
            let all: Vec<serde_json::Value> = rows
                .iter()
                .zip(&values)
                .map(|((_, r, _), v)| {
                    let mut j: serde_json::Value =
                        serde_json::from_str(&report::json(r)).unwrap_or_default();
                    if let Some(o) = j.as_object_mut() {
                        o.insert("param".into(), serde_json::Value::String(name.clone()));
                        o.insert("value".into(), serde_json::Value::String(v.clone()));
                    }
                    j
                })
                .collect();
            out = serde_json::to_string_pretty(&all)?;
            out.push('\n');
        }
        Format::Csv => out = sweep_csv(&name, &values, &rows),
    }
    if let Some(dir) = &c.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_file(dir, "sweep.csv", &sweep_csv(&name, &values, &rows))?;
        let pts: Vec<(f64, Report)> = rows.iter().map(|(x, r, _)| (*x, r.clone())).collect();
        write_file(dir, "overshoot.svg", &svg::sweep_plot(&name, &pts))?;
        for ((_, r, sc), v) in rows.iter().zip(&values) {
            write_file(
                dir,
                &format!("admitted-{}-{}.svg", file_safe(&name), file_safe(v)),
                &svg::admitted_plot(r, sc),
            )?;
            write_file(
                dir,
                &format!("calls-{}-{}.svg", file_safe(&name), file_safe(v)),
                &svg::calls_plot(r, sc),
            )?;
        }
        if c.format == Format::Table {
            let _ = writeln!(
                out,
                "\nwrote {}/sweep.csv, overshoot.svg, admitted-{}-*.svg and calls-{}-*.svg",
                dir.display(),
                file_safe(&name),
                file_safe(&name)
            );
        }
    }
    print!("{out}");
    Ok(())
}

fn sweep_csv(name: &str, values: &[String], rows: &[(f64, Report, Scenario)]) -> String {
    let mut out = format!(
        "param,value,{},gossip_bytes_per_s,gossip_deferred,store_calls_per_request,converged_after_s\n",
        report::RULES_CSV_HEADER
    );
    for ((_, r, _), v) in rows.iter().zip(values) {
        let conv = r.converged_after_s();
        for rule in &r.rules {
            let _ = writeln!(
                out,
                "{name},{v},{},{:.1},{},{:.4},{}",
                report::rule_csv(rule),
                r.gossip.bytes_per_s,
                r.gossip.deferred,
                r.store_calls_per_request,
                conv.map_or(String::new(), |c| trim(c, 6))
            );
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.cmd {
        Cmd::Run(c) => cmd_run(c),
        Cmd::Sweep { common, param } => cmd_sweep(common, param),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The message and its causes, without a backtrace: a bad scenario is the user's
            // to fix, not a bug.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
