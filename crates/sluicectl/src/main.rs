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

mod client;
mod import_envoy;
mod output;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use client::{Server, encode};
use serde::Deserialize as _;
use serde_json::{Value, json};
use std::io::Read as _;
use std::path::PathBuf;
use std::time::Duration;

/// Operate Sluice's rules: apply, inspect, shadow, roll back, check.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Admin API of any daemon (they all write to the same PostgreSQL).
    #[arg(
        long,
        global = true,
        env = "SLUICE_SERVER",
        default_value = "http://127.0.0.1:8082"
    )]
    server: String,
    /// PEM CA certificates to verify an https:// server with (default: the system's roots).
    #[arg(long, global = true, env = "SLUICE_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    /// Output: a table for people, or the server's JSON for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Seconds to wait for the server.
    #[arg(long, global = true, default_value_t = 30)]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Aligned tables and YAML.
    Table,
    /// The server's JSON, unchanged.
    Json,
    /// Rule-format YAML (for `get` and `export`).
    Yaml,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Make whole domains equal to a rules file: shows the diff, then applies it as one version.
    Apply {
        /// Rules file (one domain per YAML document); `-` reads stdin.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Show the diff only.
        #[arg(long)]
        dry_run: bool,
        /// Apply even if it tightens a rule more than 10×.
        #[arg(long)]
        force: bool,
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
        /// Roll back even if it tightens a rule more than 10×.
        #[arg(long)]
        force: bool,
    },
    /// Which rules version each daemon serves.
    Status,
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
        /// The ratelimit service's YAML config; `-` reads stdin.
        file: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum OverrideCmd {
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
        /// New rate (token bucket, GCRA).
        #[arg(long)]
        rate_per_s: Option<u64>,
        /// New burst (token bucket, GCRA).
        #[arg(long)]
        burst: Option<u64>,
        /// Exempt the identity instead.
        #[arg(long)]
        exempt: bool,
        /// Domain (when the rule id exists in several).
        #[arg(long)]
        domain: Option<String>,
        /// Apply even if it tightens more than 10×.
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

/// A server's error answer, printed as it came.
#[derive(Debug)]
struct ServerError(String);

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ServerError {}

struct Ctx {
    server: Server,
    format: Format,
    timeout: Duration,
}

impl Ctx {
    fn token(write: bool) -> Option<String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if write {
            var("SLUICE_ADMIN_TOKEN").or_else(|| var("SLUICE_READ_TOKEN"))
        } else {
            var("SLUICE_READ_TOKEN").or_else(|| var("SLUICE_ADMIN_TOKEN"))
        }
    }

    fn actor() -> String {
        if let Ok(a) = std::env::var("SLUICE_ACTOR")
            && !a.trim().is_empty()
        {
            return a;
        }
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| "unknown".into());
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        if host.is_empty() {
            user
        } else {
            format!("{user}@{host}")
        }
    }

    /// One admin call; a non-2xx answer becomes a [`ServerError`] with the server's words.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let write = !matches!(method, "GET" | "HEAD");
        let mut headers = vec![("X-Sluice-Actor", Self::actor())];
        if let Some(t) = Self::token(write) {
            headers.push(("Authorization", format!("Bearer {t}")));
        }
        let body = body.map(|b| b.to_string());
        let resp = client::request(
            &self.server,
            method,
            path,
            &headers,
            body.as_deref().map(str::as_bytes),
            self.timeout,
        )?;
        let text = String::from_utf8_lossy(&resp.body).into_owned();
        let json: Option<Value> = serde_json::from_str(&text).ok();
        if !(200..300).contains(&resp.status) {
            let msg = match &json {
                Some(v) if v["error"]["message"].is_string() => {
                    let mut m = format!(
                        "{} {}: {}",
                        resp.status,
                        v["error"]["code"].as_str().unwrap_or(""),
                        v["error"]["message"].as_str().unwrap_or("")
                    );
                    if let Some(ps) = v["error"]["problems"].as_array() {
                        for p in ps {
                            let line = match p.as_str() {
                                Some(s) => s.to_string(),
                                None => format!(
                                    "{}: {}: {}",
                                    output::short(&p["at"]),
                                    output::short(&p["field"]),
                                    output::short(&p["message"])
                                ),
                            };
                            // One line per problem, unless the message already says it all.
                            if ps.len() > 1 || !m.contains(&line) {
                                m.push_str(&format!("\n  - {line}"));
                            }
                        }
                    }
                    m
                }
                Some(v) if v["error"].is_string() => {
                    format!("{}: {}", resp.status, v["error"].as_str().unwrap_or(""))
                }
                _ => format!("{}: {}", resp.status, text.trim()),
            };
            return Err(ServerError(msg).into());
        }
        json.with_context(|| format!("the server answered {} with non-JSON: {text}", resp.status))
    }

    fn print_json(&self, v: &Value) {
        println!(
            "{}",
            serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
        );
    }

    /// Prints a write's outcome: the new version and what changed.
    fn print_write(&self, v: &Value) {
        if self.format == Format::Json {
            return self.print_json(v);
        }
        for c in v["changes"].as_array().into_iter().flatten() {
            print!("{}", output::change(c));
        }
        let version = v["version"].as_u64().unwrap_or(0);
        if v["dry_run"].as_bool() == Some(true) {
            if v["changed"].as_bool() == Some(true) {
                println!("dry run: would be version {} (now {version})", version + 1);
            } else {
                println!("dry run: no changes (version {version})");
            }
        } else if v["changed"].as_bool() == Some(true) {
            println!(
                "version {version} (was {})",
                v["previous_version"].as_u64().unwrap_or(0)
            );
        } else {
            println!("no changes (version {version})");
        }
    }
}

fn domain_query(domain: &Option<String>) -> String {
    domain
        .as_deref()
        .map(|d| format!("?domain={}", encode(d)))
        .unwrap_or_default()
}

fn identity_path(pairs: &[String]) -> Result<String> {
    let mut out = Vec::new();
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            bail!("identity {p:?}: expected name=value");
        };
        out.push(format!("{}={}", encode(k), encode(v)));
    }
    Ok(out.join(","))
}

fn read_docs(file: &PathBuf) -> Result<Vec<Value>> {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let mut docs = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(&text).enumerate() {
        let v = Value::deserialize(doc)
            .with_context(|| format!("{}: document {} is not valid YAML", file.display(), i + 1))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    if docs.is_empty() {
        bail!("{}: no rules document in the file", file.display());
    }
    Ok(docs)
}

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
        } => {
            let docs = read_docs(&file)?;
            let preview = ctx.call(
                "POST",
                "/v1/rules:apply",
                Some(&json!({"domains": docs, "dry_run": true, "force": force})),
            )?;
            if dry_run || preview["changed"].as_bool() != Some(true) {
                ctx.print_write(&preview);
                return Ok(());
            }
            if ctx.format != Format::Json {
                for c in preview["changes"].as_array().into_iter().flatten() {
                    print!("{}", output::change(c));
                }
            }
            let done = ctx.call(
                "POST",
                "/v1/rules:apply",
                Some(&json!({"domains": docs, "force": force,
                             "expect_version": preview["version"]})),
            )?;
            if ctx.format == Format::Json {
                ctx.print_json(&done);
            } else {
                println!(
                    "applied: version {} (was {})",
                    done["version"].as_u64().unwrap_or(0),
                    done["previous_version"].as_u64().unwrap_or(0)
                );
            }
        }
        Command::Get { id, domain, route } => match id {
            Some(id) => {
                let v = ctx.call(
                    "GET",
                    &format!("/v1/rules/{}{}", encode(&id), domain_query(&domain)),
                    None,
                )?;
                match ctx.format {
                    Format::Json => ctx.print_json(&v),
                    _ => {
                        println!(
                            "# domain {}, version {}",
                            output::short(&v["domain"]),
                            output::short(&v["version"])
                        );
                        print!("{}", output::yaml(&v["rule"]));
                    }
                }
            }
            None => {
                let mut q: Vec<String> = Vec::new();
                if let Some(d) = &domain {
                    q.push(format!("domain={}", encode(d)));
                }
                if let Some(r) = &route {
                    q.push(format!("route={}", encode(r)));
                }
                let path = if q.is_empty() {
                    "/v1/rules".to_string()
                } else {
                    format!("/v1/rules?{}", q.join("&"))
                };
                let v = ctx.call("GET", &path, None)?;
                match ctx.format {
                    Format::Json => ctx.print_json(&v),
                    Format::Yaml => {
                        let rules: Vec<Value> = v["rules"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|r| r["rule"].clone())
                            .collect();
                        print!("{}", output::yaml(&Value::Array(rules)));
                    }
                    Format::Table => {
                        let rows: Vec<Vec<String>> = v["rules"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|r| {
                                let b = &r["rule"];
                                vec![
                                    output::short(&r["domain"]),
                                    output::short(&r["id"]),
                                    b["mode"].as_str().unwrap_or("enforce").to_string(),
                                    output::short(&b["algorithm"]),
                                    output::numbers(b),
                                    b.get("rollout_pct").map_or("100".into(), output::short),
                                    output::matchers(b),
                                ]
                            })
                            .collect();
                        print!(
                            "{}",
                            output::table(
                                &[
                                    "DOMAIN",
                                    "ID",
                                    "MODE",
                                    "ALGORITHM",
                                    "LIMIT",
                                    "ROLLOUT%",
                                    "MATCH"
                                ],
                                &rows
                            )
                        );
                        println!("version {}", output::short(&v["version"]));
                    }
                }
            }
        },
        Command::Delete { id, domain } => {
            let v = ctx.call(
                "DELETE",
                &format!("/v1/rules/{}{}", encode(&id), domain_query(&domain)),
                None,
            )?;
            ctx.print_write(&v);
        }
        Command::Shadow { id, domain } => mode(&ctx, &id, &domain, "shadow")?,
        Command::Enforce { id, domain } => mode(&ctx, &id, &domain, "enforce")?,
        Command::Off { id, domain } => mode(&ctx, &id, &domain, "off")?,
        Command::ShadowAll { domain } => {
            let v = ctx.call(
                "POST",
                &format!("/v1/rules:shadow-all{}", domain_query(&domain)),
                None,
            )?;
            ctx.print_write(&v);
            if ctx.format == Format::Table && v["changed"].as_bool() == Some(true) {
                println!(
                    "every rule now only records; undo with: sluicectl rollback --to {}",
                    v["previous_version"].as_u64().unwrap_or(0)
                );
            }
        }
        Command::Rollback { to, dry_run, force } => {
            let v = ctx.call(
                "POST",
                "/v1/rules:rollback",
                Some(&json!({"to_version": to, "dry_run": dry_run, "force": force})),
            )?;
            ctx.print_write(&v);
        }
        Command::Status => {
            let v = ctx.call("GET", "/v1/rules:status", None)?;
            if ctx.format == Format::Json {
                ctx.print_json(&v);
                return Ok(());
            }
            let version = v["version"].as_u64().unwrap_or(0);
            let daemons = v["daemons"].as_array().cloned().unwrap_or_default();
            let rows: Vec<Vec<String>> = daemons
                .iter()
                .map(|d| {
                    vec![
                        output::short(&d["daemon_id"]),
                        output::short(&d["region"]),
                        output::short(&d["version"]),
                        output::short(&d["source"]),
                        format!("{:.0}s ago", d["age_s"].as_f64().unwrap_or(0.0)),
                        if d["current"].as_bool() == Some(true) {
                            "yes"
                        } else {
                            "NO"
                        }
                        .into(),
                        d["last_error"].as_str().unwrap_or("").to_string(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &[
                        "DAEMON",
                        "REGION",
                        "VERSION",
                        "SOURCE",
                        "LAST SEEN",
                        "CURRENT",
                        "ERROR"
                    ],
                    &rows
                )
            );
            let current = daemons
                .iter()
                .filter(|d| d["current"].as_bool() == Some(true))
                .count();
            println!(
                "version {version}: {current} of {} daemons current",
                daemons.len()
            );
        }
        Command::History { id, domain, limit } => match id {
            Some(id) => {
                let mut path = format!("/v1/rules/{}/history?limit={limit}", encode(&id));
                if let Some(d) = &domain {
                    path.push_str(&format!("&domain={}", encode(d)));
                }
                let v = ctx.call("GET", &path, None)?;
                if ctx.format == Format::Json {
                    ctx.print_json(&v);
                    return Ok(());
                }
                let rows: Vec<Vec<String>> = v["history"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|h| {
                        let b = &h["body"];
                        let what = if b.is_null() {
                            "(deleted)".to_string()
                        } else {
                            format!(
                                "{} {} {}",
                                b["mode"].as_str().unwrap_or("enforce"),
                                output::short(&b["algorithm"]),
                                output::numbers(b)
                            )
                        };
                        vec![
                            output::short(&h["version"]),
                            output::short(&h["at"]),
                            output::short(&h["actor"]),
                            output::short(&h["action"]),
                            what,
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    output::table(&["VERSION", "AT", "ACTOR", "ACTION", "RULE"], &rows)
                );
            }
            None => {
                let v = ctx.call("GET", &format!("/v1/rules:history?limit={limit}"), None)?;
                if ctx.format == Format::Json {
                    ctx.print_json(&v);
                    return Ok(());
                }
                let rows: Vec<Vec<String>> = v["changes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let detail = match c["detail"].as_object() {
                            Some(m) if !m.is_empty() => c["detail"].to_string(),
                            _ => String::new(),
                        };
                        vec![
                            output::short(&c["version"]),
                            output::short(&c["at"]),
                            output::short(&c["actor"]),
                            output::short(&c["action"]),
                            output::short(&c["entries"]),
                            detail,
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    output::table(
                        &["VERSION", "AT", "ACTOR", "ACTION", "ENTRIES", "DETAIL"],
                        &rows
                    )
                );
            }
        },
        Command::Export { domain } => {
            let v = ctx.call(
                "GET",
                &format!("/v1/rules:export{}", domain_query(&domain)),
                None,
            )?;
            match ctx.format {
                Format::Json => ctx.print_json(&v),
                _ => {
                    println!("# exported at version {}", output::short(&v["version"]));
                    print!(
                        "{}",
                        output::yaml_docs(v["domains"].as_array().map_or(&[][..], Vec::as_slice))
                    );
                }
            }
        }
        Command::Override(cmd) => overrides(&ctx, cmd)?,
        Command::Check {
            domain,
            descriptors,
            cost,
            check_server,
        } => {
            let mut d = serde_json::Map::new();
            for p in &descriptors {
                let Some((k, v)) = p.split_once('=') else {
                    bail!("descriptor {p:?}: expected name=value");
                };
                d.insert(k.to_string(), Value::String(v.to_string()));
            }
            let body = json!({"domain": domain, "descriptors": d, "cost": cost});
            let check = Ctx {
                server: Server::parse(&check_server)?,
                ..ctx
            };
            let v = check.call("POST", "/v1/limits:check", Some(&body))?;
            if check.format == Format::Json {
                check.print_json(&v);
                return Ok(());
            }
            println!(
                "{} {}  decided_by={}  retry_after_ms={}  rules_version={}",
                if v["allowed"].as_bool() == Some(true) {
                    "ALLOWED"
                } else {
                    "DENIED"
                },
                output::short(&v["code"]),
                v["decided_by"].as_str().unwrap_or("-"),
                output::short(&v["retry_after_ms"]),
                output::short(&v["rules_version"]),
            );
            let rows: Vec<Vec<String>> = v["policies"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    ["id", "limit", "window_s", "remaining", "reset_s"]
                        .iter()
                        .map(|k| output::short(&p[*k]))
                        .collect()
                })
                .collect();
            if !rows.is_empty() {
                print!(
                    "{}",
                    output::table(
                        &["RULE", "LIMIT", "WINDOW_S", "REMAINING", "RESET_S"],
                        &rows
                    )
                );
            }
            if let Some(s) = v["shadow_denied"].as_array().filter(|s| !s.is_empty()) {
                let ids: Vec<String> = s.iter().map(output::short).collect();
                println!("shadow would deny: {}", ids.join(", "));
            }
        }
        Command::ImportEnvoy { file } => import_envoy::run(&file)?,
        Command::Migrate { postgres } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            let done = rt.block_on(async {
                let store = sluice_control::store::Store::new(&postgres)?;
                store.migrate().await
            })?;
            if ctx.format == Format::Json {
                ctx.print_json(&json!({
                    "applied": done.applied.iter().map(|(v, n)| json!({"version": v, "name": n})).collect::<Vec<_>>(),
                    "schema_version": done.schema_version,
                }));
            } else if done.applied.is_empty() {
                println!("schema up to date (version {})", done.schema_version);
            } else {
                for (v, n) in &done.applied {
                    println!("applied migration {v}: {n}");
                }
                println!("schema at version {}", done.schema_version);
            }
        }
    }
    Ok(())
}

fn mode(ctx: &Ctx, id: &str, domain: &Option<String>, action: &str) -> Result<()> {
    let v = ctx.call(
        "POST",
        &format!("/v1/rules/{}:{action}{}", encode(id), domain_query(domain)),
        None,
    )?;
    ctx.print_write(&v);
    Ok(())
}

fn overrides(ctx: &Ctx, cmd: OverrideCmd) -> Result<()> {
    match cmd {
        OverrideCmd::List { domain } => {
            let v = ctx.call(
                "GET",
                &format!("/v1/overrides{}", domain_query(&domain)),
                None,
            )?;
            if ctx.format == Format::Json {
                ctx.print_json(&v);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = v["overrides"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| {
                    let b = &o["override"];
                    let what = if b["exempt"].as_bool() == Some(true) {
                        "exempt".to_string()
                    } else {
                        ["limit", "rate_per_s", "burst"]
                            .iter()
                            .filter_map(|k| b.get(*k).map(|x| format!("{k}={}", output::short(x))))
                            .collect::<Vec<_>>()
                            .join(" ")
                    };
                    vec![
                        output::short(&o["domain"]),
                        b.get("rule").map_or("*".into(), output::short),
                        output::matchers(&json!({"match": b["identity"]})),
                        what,
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(&["DOMAIN", "RULE", "IDENTITY", "NUMBERS"], &rows)
            );
        }
        OverrideCmd::Set {
            rule,
            identity,
            limit,
            rate_per_s,
            burst,
            exempt,
            domain,
            force,
        } => {
            let mut body = serde_json::Map::new();
            if exempt {
                body.insert("exempt".into(), json!(true));
            }
            for (k, v) in [
                ("limit", limit),
                ("rate_per_s", rate_per_s),
                ("burst", burst),
            ] {
                if let Some(v) = v {
                    body.insert(k.into(), json!(v));
                }
            }
            let mut q = domain_query(&domain);
            if force {
                q.push_str(if q.is_empty() {
                    "?force=true"
                } else {
                    "&force=true"
                });
            }
            let path = format!(
                "/v1/overrides/{}/{}{q}",
                encode(&rule),
                identity_path(&identity)?
            );
            let v = ctx.call("PUT", &path, Some(&Value::Object(body)))?;
            ctx.print_write(&v);
        }
        OverrideCmd::Delete {
            rule,
            identity,
            domain,
        } => {
            let path = format!(
                "/v1/overrides/{}/{}{}",
                encode(&rule),
                identity_path(&identity)?,
                domain_query(&domain)
            );
            let v = ctx.call("DELETE", &path, None)?;
            ctx.print_write(&v);
        }
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
