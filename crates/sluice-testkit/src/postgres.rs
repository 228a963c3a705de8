//! Throwaway databases on the machine's shared PostgreSQL.
//!
//! The rule source and its `LISTEN`/`NOTIFY` watcher need a real PostgreSQL. Starting one per
//! test is slow, so tests share the server at `127.0.0.1:5432` (trust auth, user `postgres`)
//! and each gets its own database, dropped afterwards. The shared server itself is never
//! stopped or reconfigured; to simulate a network failure, go through a
//! [`TcpProxy`](crate::TcpProxy) and use [`Postgres::url_via`].

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Result, anyhow, bail};

/// Host of the shared server.
pub const HOST: &str = "127.0.0.1";
/// Port of the shared server.
pub const PORT: u16 = 5432;
/// Superuser of the shared server (trust auth, no password).
pub const USER: &str = "postgres";
/// Database `psql` connects to for `CREATE/DROP DATABASE`.
const ADMIN_DB: &str = "test";
/// Fallback when [`ADMIN_DB`] does not exist.
const FALLBACK_ADMIN_DB: &str = "postgres";

const HOW_TO: &str = "install PostgreSQL with `apt-get install postgresql` and start it with \
     `service postgresql start` (or `pg_ctlcluster <version> main start`); tests expect it on \
     127.0.0.1:5432 with trust auth for user postgres";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A uniquely named database on the shared PostgreSQL, dropped (`WITH (FORCE)`) on drop.
///
/// Gives every test an isolated schema while sharing one server.
#[derive(Debug)]
pub struct Postgres {
    name: String,
}

impl Postgres {
    /// Creates a fresh, empty database named `sluice_test_<pid>_<counter>_<nanos>`.
    ///
    /// Fails with instructions when `psql` is missing or the server is not running: tests
    /// must fail loudly rather than skip.
    pub fn throwaway() -> Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!(
            "sluice_test_{}_{}_{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        admin_psql(&format!("CREATE DATABASE {name}"))?;
        Ok(Self { name })
    }

    /// The database name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The connection URL, `postgres://postgres@127.0.0.1:5432/<db>`, for the rule source.
    #[must_use]
    pub fn url(&self) -> String {
        self.url_via(PORT)
    }

    /// The connection URL through another local port (a [`TcpProxy`](crate::TcpProxy) in
    /// front of the server): `postgres://postgres@127.0.0.1:<port>/<db>`.
    ///
    /// So a test can cut the link without touching the shared server.
    #[must_use]
    pub fn url_via(&self, port: u16) -> String {
        format!("postgres://{USER}@{HOST}:{port}/{}", self.name)
    }

    /// The shared server's address, the target for a [`TcpProxy`](crate::TcpProxy).
    #[must_use]
    pub fn server_addr() -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, PORT))
    }

    /// Runs SQL in this database with `psql -At` (unaligned, tuples only) and returns stdout.
    ///
    /// For seeding rules or asserting on tables without a client crate; rows are lines,
    /// columns are separated by `|`.
    pub fn psql(&self, sql: &str) -> Result<String> {
        run_psql(&self.name, sql)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Err(e) = admin_psql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )) {
            eprintln!(
                "sluice-testkit: could not drop database {}: {e:#}",
                self.name
            );
        }
    }
}

/// Runs an administrative statement from the admin database.
fn admin_psql(sql: &str) -> Result<String> {
    match run_psql(ADMIN_DB, sql) {
        Err(e) if format!("{e:#}").contains(&format!("database \"{ADMIN_DB}\" does not exist")) => {
            run_psql(FALLBACK_ADMIN_DB, sql)
        }
        other => other,
    }
}

fn run_psql(db: &str, sql: &str) -> Result<String> {
    let out = Command::new("psql")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", HOST, "-p", &PORT.to_string(), "-U", USER, "-d", db])
        .arg("-c")
        .arg(sql)
        .env("PGCONNECT_TIMEOUT", "5")
        .env("PGOPTIONS", "-c statement_timeout=60000")
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("psql not found: {HOW_TO} (`apt-get install postgresql-client` for psql alone)")
        }
        Err(e) => return Err(anyhow!(e).context("running psql")),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let refused = [
            "Connection refused",
            "could not connect",
            "No such file or directory",
        ]
        .iter()
        .any(|s| stderr.contains(s));
        if refused {
            bail!(
                "PostgreSQL is not reachable at {HOST}:{PORT}: {HOW_TO}. psql said: {}",
                stderr.trim()
            );
        }
        bail!(
            "psql -d {db} -c {sql:?} failed ({}): {}",
            out.status,
            stderr.trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
}

/// A PostgreSQL server of a test's own (`initdb` + `pg_ctl` in a temp dir, on a free port,
/// trust auth for user `postgres`), stopped and removed on drop.
///
/// For what the shared server must not be reconfigured for: [`PgServer::start_tls`] serves
/// `ssl = on` with a [`TestPki`](crate::TestPki) certificate. When run as root, the server
/// runs as the `postgres` user (PostgreSQL refuses root).
#[derive(Debug)]
pub struct PgServer {
    port: u16,
    dir: crate::tempdir::TempDir,
    as_postgres: bool,
}

/// Where the server binaries are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin`.
fn pg_bin(name: &str) -> Result<std::path::PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let p = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(name);
        if p.exists() {
            return Ok(p);
        }
    }
    let mut dirs: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.into_iter()
        .rev()
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .ok_or_else(|| {
            anyhow!("{name} not found: install the server with `apt-get install postgresql`")
        })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PgServer {
    /// Starts a server with `ssl = on`, the PKI's server certificate and key, on a free port.
    pub fn start_tls(pki: &crate::TestPki) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let port = crate::free_port();
        let dir = crate::tempdir::TempDir::new(&format!("pg-{port}"))?;
        let as_postgres = is_root();
        let data = dir.path().join("data");
        let cert = dir.path().join("server.crt");
        let key = dir.path().join("server.key");
        std::fs::copy(pki.server_cert_file(), &cert)?;
        std::fs::copy(pki.server_key_file(), &key)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        if as_postgres {
            let (uid, gid) = postgres_ids()?;
            for p in [dir.path(), cert.as_path(), key.as_path()] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid))?;
            }
        }
        let server = PgServer {
            port,
            dir,
            as_postgres,
        };
        server.run(
            &pg_bin("initdb")?,
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                USER,
                "--auth=trust",
                "--no-sync",
            ],
        )?;
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file={} \
             -c ssl_key_file={} -c fsync=off",
            server.dir.path().display(),
            cert.display(),
            key.display()
        );
        server.run(
            &pg_bin("pg_ctl")?,
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &server.dir.path().join("pg.log").display().to_string(),
                "-o",
                &opts,
                "-w",
                "start",
            ],
        )?;
        Ok(server)
    }

    fn run(&self, bin: &std::path::Path, args: &[&str]) -> Result<()> {
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let out = cmd
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| anyhow!(e).context(format!("running {}", bin.display())))?;
        if !out.status.success() {
            let log = std::fs::read_to_string(self.dir.path().join("pg.log")).unwrap_or_default();
            bail!(
                "{} failed ({}): {}{}\n{log}",
                bin.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The server's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`, plus `query` (e.g. `sslmode=require`)
    /// after a `?` when not empty.
    #[must_use]
    pub fn url(&self, query: &str) -> String {
        let base = format!("postgres://{USER}@{HOST}:{}/postgres", self.port);
        if query.is_empty() {
            base
        } else {
            format!("{base}?{query}")
        }
    }
}

fn postgres_ids() -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| anyhow!("no `postgres` user to run a test server as: {HOW_TO}"))
    };
    Ok((id("-u")?, id("-g")?))
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let data = self.dir.path().join("data").display().to_string();
        if let Ok(pg_ctl) = pg_bin("pg_ctl") {
            let _ = self.run(&pg_ctl, &["-D", &data, "-m", "immediate", "-w", "stop"]);
        }
    }
}
