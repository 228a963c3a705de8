//! One throwaway `redis-server` on a free loopback port.
//!
//! The Redis store's promises (atomic scripts, timeouts, breaker behaviour when Redis stalls or
//! dies) are only meaningful against a real server, so tests start their own: never the shared
//! one on 6379, which must keep running for everyone else.

use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::ports::free_port;
use crate::process::{kill_and_reap, signal, tail};
use crate::resp::{Reply, RespConn, cmd_once};
use crate::tempdir::TempDir;

/// How long a server may take to answer `PING` after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout for [`RedisServer::cmd`] (connect, write and read).
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// How many ports [`RedisServer::start`] tries when another process grabs the free port first.
const PORT_ATTEMPTS: usize = 3;

/// The message for a missing `redis-server`; tests must fail loudly, never skip.
const NOT_FOUND: &str = "redis-server not found: install it with `apt-get install redis-server`";

/// A `redis-server` child process on `127.0.0.1:<free port>`, with its own data directory.
///
/// Started with `--save "" --appendonly no`, so it never writes to disk behind the test's back.
/// Dropping it kills the process (resuming it first if paused) and removes its directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    extra_args: Vec<String>,
    child: Option<Child>,
    paused: AtomicBool,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers `PING`.
    ///
    /// The usual entry point for a test that needs a Redis of its own.
    pub fn start() -> Result<Self> {
        Self::start_with_args::<&str>(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--maxmemory", "1mb"]` or
    /// cluster mode), on a free port, and waits until it answers `PING`.
    ///
    /// For tests that need a non-default configuration; arguments come after the defaults, so
    /// they override them.
    pub fn start_with_args<S: AsRef<str>>(extra_args: &[S]) -> Result<Self> {
        let extra: Vec<String> = extra_args.iter().map(|s| s.as_ref().to_owned()).collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_on(free_port(), extra.clone()) {
                Err(e) if attempt < PORT_ATTEMPTS && format!("{e:#}").contains("in use") => {}
                result => return result,
            }
        }
    }

    /// Starts a server on exactly `port` (no retry on another port).
    pub(crate) fn start_on(port: u16, extra_args: Vec<String>) -> Result<Self> {
        let dir = TempDir::new(&format!("redis-{port}"))?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)
            .with_context(|| format!("creating redis data dir {}", data.display()))?;
        let mut server = Self {
            port,
            extra_args,
            child: None,
            paused: AtomicBool::new(false),
            dir,
        };
        server.launch()?;
        Ok(server)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Spawns the process on `self.port` and waits for `PING`.
    fn launch(&mut self) -> Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .with_context(|| format!("opening {}", self.log_path().display()))?;
        let log_err = log
            .try_clone()
            .with_context(|| format!("opening {}", self.log_path().display()))?;
        let data = self.data_dir();
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--logfile", ""])
            .arg("--dir")
            .arg(&data)
            .args(&self.extra_args)
            .current_dir(&data)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(NOT_FOUND),
            Err(e) => return Err(anyhow!(e).context("spawning redis-server")),
        };
        self.child = Some(child);
        self.paused.store(false, Ordering::SeqCst);
        if let Err(e) = self.wait_ready(READY_TIMEOUT) {
            if let Some(child) = self.child.as_mut() {
                let _ = kill_and_reap(child);
            }
            self.child = None;
            return Err(e);
        }
        Ok(())
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let addr = self.addr();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().context("checking redis-server")?
            {
                let log = tail(&self.log_path(), 20);
                let hint = if log.contains("Address already in use") {
                    " (port in use)"
                } else {
                    ""
                };
                bail!(
                    "redis-server on port {} exited with {status}{hint}; log:\n{log}",
                    self.port
                );
            }
            let last_err = match cmd_once(addr, &["PING"], Duration::from_millis(500)) {
                Ok(reply) if reply == "PONG" => return Ok(()),
                Ok(reply) => anyhow!("PING answered {reply:?}"),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                bail!(
                    "redis-server on port {} did not answer PING within {timeout:?}: {last_err:#}; log:\n{}",
                    self.port,
                    tail(&self.log_path(), 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The TCP port the server listens on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address (`127.0.0.1:port`), for raw connections and [`TcpProxy`](crate::TcpProxy).
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The connection URL, `redis://127.0.0.1:PORT/`, as the store and daemon configs expect.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts a server that also serves TLS on a free port with `tls`'s files (clients are not
    /// asked for certificates); [`tls_url`](Self::tls_url) names it.
    pub fn start_tls(tls: &crate::cluster::RedisTls) -> Result<Self> {
        Self::start_with_args(&tls.args(free_port()))
    }

    /// The TLS port given with `--tls-port`, if any.
    #[must_use]
    pub fn tls_port(&self) -> Option<u16> {
        let i = self.extra_args.iter().position(|a| a == "--tls-port")?;
        self.extra_args.get(i + 1)?.parse().ok()
    }

    /// The TLS connection URL, `rediss://127.0.0.1:TLS_PORT/`; an error for a server started
    /// without TLS.
    pub fn tls_url(&self) -> Result<String> {
        let port = self
            .tls_port()
            .ok_or_else(|| anyhow!("redis-server on port {} serves no TLS", self.port))?;
        Ok(format!("rediss://127.0.0.1:{port}/"))
    }

    /// The directory holding the server's data directory and log, for inspecting `nodes.conf`.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, or `None` after [`kill`](Self::kill).
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server is currently stopped with SIGSTOP.
    #[must_use]
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The server's log (stdout and stderr across restarts), for failure messages.
    #[must_use]
    pub fn logs(&self) -> String {
        std::fs::read(self.log_path())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    fn running_pid(&self) -> Result<u32> {
        self.pid()
            .ok_or_else(|| anyhow!("redis-server on port {} is not running", self.port))
    }

    /// Freezes the server with SIGSTOP: connections stay open but nothing is answered.
    ///
    /// Simulates a stalled Redis (long fork, swapping, GC-like pause) to test store timeouts
    /// and circuit breakers; the kernel still accepts new TCP connections meanwhile.
    pub fn pause(&self) -> Result<()> {
        signal(self.running_pid()?, "STOP")?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Unfreezes the server with SIGCONT; queued commands are then answered.
    ///
    /// Ends the stall started by [`pause`](Self::pause) to test recovery.
    pub fn resume(&self) -> Result<()> {
        signal(self.running_pid()?, "CONT")?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Kills the server with SIGKILL and reaps it; its port becomes unreachable.
    ///
    /// Simulates a crashed Redis (or a cluster node failure). Does nothing if already dead.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            if self.is_paused() {
                let _ = signal(child.id(), "CONT");
            }
            kill_and_reap(&mut child)
                .with_context(|| format!("killing redis-server on port {}", self.port))?;
        }
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Kills the server if running, wipes its data directory and starts it again on the same
    /// port with the same arguments, empty.
    ///
    /// Simulates a Redis that restarted and lost its volatile counters.
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        let data = self.data_dir();
        std::fs::remove_dir_all(&data)
            .with_context(|| format!("wiping redis data dir {}", data.display()))?;
        std::fs::create_dir_all(&data)
            .with_context(|| format!("creating {}", self.data_dir().display()))?;
        self.launch()
    }

    /// Kills the server if running and starts it again on the same port, keeping its data
    /// directory (so a cluster node keeps its `nodes.conf` identity and rejoins its cluster).
    ///
    /// For failover tests where a killed node comes back.
    pub fn restart_keeping_files(&mut self) -> Result<()> {
        self.kill()?;
        self.launch()
    }

    /// Sends one command on a fresh connection (5 s timeout) and returns the flattened reply;
    /// an error reply is an `Err` whose message contains Redis's error text.
    ///
    /// For assertions in tests. See [`crate::resp`] for the string format: `OK`, `PONG`,
    /// integers in decimal, bulk strings as text, nil as `(nil)`, arrays joined with `\n`.
    pub fn cmd<A: AsRef<[u8]>>(&self, args: &[A]) -> Result<String> {
        cmd_once(self.addr(), args, CMD_TIMEOUT)
    }

    /// Like [`cmd`](Self::cmd) with a caller-chosen timeout for connect, write and read.
    ///
    /// E.g. a `PING` with a 200 ms timeout that must fail while the server is paused.
    pub fn cmd_timeout<A: AsRef<[u8]>>(&self, args: &[A], timeout: Duration) -> Result<String> {
        cmd_once(self.addr(), args, timeout)
    }

    /// Sends one command on a fresh connection and returns the structured [`Reply`], error
    /// replies included.
    ///
    /// For asserting on errors (`MOVED`, `ASK`) or binary data.
    pub fn cmd_reply<A: AsRef<[u8]>>(&self, args: &[A]) -> Result<Reply> {
        RespConn::connect(self.addr(), CMD_TIMEOUT)?.cmd_reply(args)
    }

    /// Opens a persistent [`RespConn`] (5 s timeouts) to the server.
    ///
    /// For tests that send many commands or watch one connection survive or break.
    pub fn connect(&self) -> Result<RespConn> {
        RespConn::connect(self.addr(), CMD_TIMEOUT)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("sluice-testkit: {e:#}");
        }
    }
}
