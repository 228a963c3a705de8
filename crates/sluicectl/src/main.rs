//! `sluicectl`: the operators' CLI for Sluice's admin API.
//!
//! Changes rules without a deploy (`apply`, `shadow`, `rollback`, …), shows which version
//! every daemon serves (`status`), sends one check to a daemon (`check`), and sets up the
//! PostgreSQL schema (`migrate`). Tables for people; `-o json` prints the server's JSON as is,
//! for scripts. Errors from the server are printed as the server wrote them, and the exit
//! status is non-zero.
//!
//! The token comes from the environment: `SLUICE_ADMIN_TOKEN` for changes, and
//! `SLUICE_READ_TOKEN` (else the admin token) for reads.
//!
//! # Layout
//!
//! - `cli`: the flags and subcommands (clap).
//! - `ctx`: one run's session: admin calls with token and actor, server errors, printing
//!   JSON and a write's outcome.
//! - `client`: the HTTP/1.1 requests (`sluice-http1`).
//! - `output`: tables, rule-format YAML and diffs for people.
//! - `rules`: `apply`, `get`, `delete`, `shadow` / `enforce` / `off`, `shadow-all`,
//!   `rollback`.
//! - `versions`: `status`, `history`, `export`.
//! - `pending`: `pending`, `approve`, `reject`: changes held for a second principal.
//! - `whatif`: `apply --what-if`: the decision logs replayed through a candidate set.
//! - `overrides`: `override list | set | delete`.
//! - `check`: one check against a daemon's HTTP API.
//! - `migrate`: the PostgreSQL schema.
//! - `import_envoy`: an envoyproxy/ratelimit config turned into Sluice rules.

mod check;
mod cli;
mod client;
mod ctx;
mod import_envoy;
mod migrate;
mod output;
mod overrides;
mod pending;
mod rules;
mod versions;
mod whatif;

use anyhow::Result;
use clap::Parser;
use cli::{Cli, Command};
use client::Server;
use ctx::{Ctx, ServerError};
use std::time::Duration;

fn run(cli: Cli) -> Result<()> {
    let ctx = Ctx {
        server: Server {
            ca_file: cli.ca_file.clone(),
            ..Server::parse(&cli.server)?
        },
        format: cli.output,
        timeout: Duration::from_secs(cli.timeout.max(1)),
    };
    match cli.command {
        Command::Apply {
            file,
            dry_run,
            force,
            what_if,
            window,
        } => rules::apply(&ctx, file, dry_run, force, what_if, &window.args())?,
        Command::Get { id, domain, route } => rules::get(&ctx, id, domain, route)?,
        Command::Delete { id, domain } => rules::delete(&ctx, id, domain)?,
        Command::Shadow { id, domain } => rules::mode(&ctx, &id, &domain, "shadow")?,
        Command::Enforce { id, domain } => rules::mode(&ctx, &id, &domain, "enforce")?,
        Command::Off { id, domain } => rules::mode(&ctx, &id, &domain, "off")?,
        Command::Canary { id, pct, domain } => rules::canary(&ctx, &id, pct, domain)?,
        Command::ShadowAll { domain } => rules::shadow_all(&ctx, domain)?,
        Command::Rollback { to, dry_run, force } => rules::rollback(&ctx, to, dry_run, force)?,
        Command::Status => versions::status(&ctx)?,
        Command::Pending {
            all,
            what_if,
            window,
        } => pending::list(&ctx, all, what_if.then(|| window.args()))?,
        Command::Approve { id } => pending::decide(&ctx, id, "approve")?,
        Command::Reject { id } => pending::decide(&ctx, id, "reject")?,
        Command::History { id, domain, limit } => versions::history(&ctx, id, domain, limit)?,
        Command::Export { domain } => versions::export(&ctx, domain)?,
        Command::Override(cmd) => overrides::run(&ctx, cmd)?,
        Command::Check {
            domain,
            descriptors,
            cost,
            check_server,
        } => check::run(ctx, domain, descriptors, cost, check_server)?,
        Command::ImportEnvoy {
            files,
            merge_domains,
        } => import_envoy::run(&files, merge_domains)?,
        Command::Migrate { postgres } => migrate::run(&ctx, postgres)?,
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        match e.downcast_ref::<ServerError>() {
            Some(s) => eprintln!("error: {s}"),
            None => eprintln!("error: {e:#}"),
        }
        std::process::exit(1);
    }
}
