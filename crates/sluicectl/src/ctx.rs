//! One run's session with the admin API: the server, the token and actor every call sends,
//! server errors turned into the server's own words, and how results are printed (JSON as
//! is, or a write's version and changes). Shared by every subcommand.

use crate::cli::Format;
use crate::client::{self, Server, encode};
use crate::output;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::time::Duration;

/// A server's error answer, printed as it came.
#[derive(Debug)]
pub struct ServerError(pub String);

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ServerError {}

pub struct Ctx {
    pub server: Server,
    pub format: Format,
    pub timeout: Duration,
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
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
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

    pub fn print_json(&self, v: &Value) {
        println!(
            "{}",
            serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
        );
    }

    /// Prints a write's outcome: the new version and what changed.
    pub fn print_write(&self, v: &Value) {
        if self.format == Format::Json {
            return self.print_json(v);
        }
        for c in v["changes"].as_array().into_iter().flatten() {
            print!("{}", output::change(c));
        }
        let version = v["version"].as_u64().unwrap_or(0);
        if let Some(id) = v["pending"]["id"].as_u64() {
            return println!("{}", held_line(id, &v["pending"]));
        }
        if v["dry_run"].as_bool() == Some(true) && v["needs_approval"].as_bool() == Some(true) {
            println!(
                "dry run: more than 10× tighter: would be held for another principal's approval"
            );
        } else if v["dry_run"].as_bool() == Some(true) {
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

/// What a held change's answer says: its id and how to approve it.
pub fn held_line(id: u64, p: &serde_json::Value) -> String {
    format!(
        "held as pending change {id} (proposed by {}, expires {}): another principal approves it with `sluicectl approve {id}`",
        output::short(&p["principal"]),
        output::short(&p["expires"])
    )
}

pub fn domain_query(domain: &Option<String>) -> String {
    domain
        .as_deref()
        .map(|d| format!("?domain={}", encode(d)))
        .unwrap_or_default()
}

pub fn identity_path(pairs: &[String]) -> Result<String> {
    let mut out = Vec::new();
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            bail!("identity {p:?}: expected name=value");
        };
        out.push(format!("{}={}", encode(k), encode(v)));
    }
    Ok(out.join(","))
}
