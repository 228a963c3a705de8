//! A spawned project binary (`sluiced`, `sluicectl`, …) under test, with captured logs.
//!
//! End-to-end tests run the real binaries as separate processes, so that startup, config
//! parsing, signal handling and graceful shutdown are tested as an operator would run them.
//! [`Daemon`] captures stdout and stderr to files (a pipe nobody reads could fill up and block
//! the daemon), waits for readiness over HTTP, and prints the logs when a test panics.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use crate::http::http_request_timeout;
use crate::process::{kill_and_reap, signal, tail, wait_timeout};
use crate::tempdir::TempDir;

/// Lines of each log shown in error messages.
const LOG_TAIL: usize = 40;

/// The path of a workspace binary, for [`Daemon::spawn`].
///
/// Uses `CARGO_BIN_EXE_<name>` when set, else looks next to the running test executable
/// (`target/<profile>/deps/<test>` → `target/<profile>/<name>`). Cargo only builds the binaries
/// of the package under test, so for other packages' binaries run `cargo build --workspace`
/// first; the error says so.
pub fn cargo_bin(name: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(format!("CARGO_BIN_EXE_{name}")) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
    }
    let exe = std::env::current_exe().context("locating the current test executable")?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| anyhow!("test executable {} has no parent dir", exe.display()))?;
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        dir = dir.parent().unwrap_or(dir);
    }
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if path.is_file() {
        Ok(path)
    } else {
        bail!(
            "binary `{name}` not found at {}: run `cargo build --workspace` first \
             (cargo test only builds the binaries of the package under test)",
            path.display()
        )
    }
}

/// A running child process with stdout/stderr captured to files in a temp dir, which is
/// also its `$TMPDIR` unless the caller sets one.
///
/// Dropping it kills the process (SIGKILL); if the test is panicking, the logs are printed to
/// stderr first so the failure shows what the daemon said.
#[derive(Debug)]
pub struct Daemon {
    name: String,
    child: Option<Child>,
    dir: TempDir,
}

impl Daemon {
    /// Spawns `program` with `args` and extra environment variables (on top of the test's
    /// own environment).
    ///
    /// The common case: `Daemon::spawn(cargo_bin("sluiced")?, &["--config", path], &[("RUST_LOG", "debug")])`.
    pub fn spawn(program: impl AsRef<Path>, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let program = program.as_ref();
        let mut cmd = Command::new(program);
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::from_command(cmd)
    }

    /// Spawns a prepared [`Command`] (for `OsStr` arguments, a working directory, or a
    /// cleared environment); its stdin, stdout and stderr are replaced.
    ///
    /// The general form of [`spawn`](Self::spawn).
    pub fn from_command(mut cmd: Command) -> Result<Self> {
        let program = PathBuf::from(cmd.get_program());
        let name = program
            .file_name()
            .map_or_else(|| "daemon".to_owned(), |n| n.to_string_lossy().into_owned());
        let dir = TempDir::new(&format!("daemon-{name}"))?;
        // Files a daemon keeps under `$TMPDIR` by default are named by its port (the decision
        // log's directory), and ports are reused across tests: each process gets its own.
        if !cmd.get_envs().any(|(k, _)| k == "TMPDIR") {
            cmd.env("TMPDIR", dir.path());
        }
        let out = File::create(dir.path().join("stdout.log"))
            .with_context(|| format!("creating the stdout log in {}", dir.path().display()))?;
        let err = File::create(dir.path().join("stderr.log"))
            .with_context(|| format!("creating the stderr log in {}", dir.path().display()))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "{} not found: build it with `cargo build --workspace`",
                program.display()
            ),
            Err(e) => return Err(anyhow!(e).context(format!("spawning {}", program.display()))),
        };
        Ok(Self {
            name,
            child: Some(child),
            dir,
        })
    }

    /// The process id, or `None` once it has been killed or terminated.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The directory holding `stdout.log` and `stderr.log` (also a scratch dir for the test,
    /// removed on drop).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything the process wrote to stdout so far.
    #[must_use]
    pub fn stdout(&self) -> String {
        read_lossy(&self.dir.path().join("stdout.log"))
    }

    /// Everything the process wrote to stderr so far.
    #[must_use]
    pub fn stderr(&self) -> String {
        read_lossy(&self.dir.path().join("stderr.log"))
    }

    /// stdout and stderr so far, labelled, for assertions on log lines and failure messages.
    #[must_use]
    pub fn logs(&self) -> String {
        format!(
            "--- {} stdout ---\n{}\n--- {} stderr ---\n{}",
            self.name,
            self.stdout(),
            self.name,
            self.stderr()
        )
    }

    fn log_tails(&self) -> String {
        format!(
            "--- {} stdout (tail) ---\n{}\n--- {} stderr (tail) ---\n{}",
            self.name,
            tail(&self.dir.path().join("stdout.log"), LOG_TAIL),
            self.name,
            tail(&self.dir.path().join("stderr.log"), LOG_TAIL)
        )
    }

    /// `Some(status)` if the process has exited, `None` while it runs.
    ///
    /// For tests that expect a daemon to refuse a bad config and exit.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => child
                .try_wait()
                .with_context(|| format!("checking {}", self.name)),
            None => bail!("{} was already killed", self.name),
        }
    }

    /// Waits up to `timeout` for the process to exit on its own and returns its status.
    ///
    /// For one-shot binaries (`sluicectl`, `sluice-sim`) and for daemons expected to fail.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let child = self
            .child
            .as_mut()
            .ok_or_else(|| anyhow!("{} was already killed", self.name))?;
        match wait_timeout(child, timeout)? {
            Some(status) => Ok(status),
            None => bail!(
                "{} did not exit within {timeout:?}\n{}",
                self.name,
                self.log_tails()
            ),
        }
    }

    /// Polls `GET path` on `addr` (plain HTTP/1.1) until it answers 200, failing after
    /// `timeout` or as soon as the process exits, with the logs in the error.
    ///
    /// The readiness check before a test talks to the daemon, e.g.
    /// `d.wait_http_ok(admin_addr, "/readyz", Duration::from_secs(10))`.
    pub fn wait_http_ok(&mut self, addr: SocketAddr, path: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                bail!(
                    "{} exited with {status} while waiting for GET http://{addr}{path} to answer 200\n{}",
                    self.name,
                    self.log_tails()
                );
            }
            let last =
                match http_request_timeout(addr, "GET", path, &[], b"", Duration::from_millis(500))
                {
                    Ok(resp) if resp.status == 200 => return Ok(()),
                    Ok(resp) => format!("status {}: {}", resp.status, resp.text()),
                    Err(e) => format!("{e:#}"),
                };
            if Instant::now() >= deadline {
                bail!(
                    "{}: GET http://{addr}{path} did not answer 200 within {timeout:?} (last: {last})\n{}",
                    self.name,
                    self.log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until stdout or stderr contains `needle`, failing after `timeout` or if the
    /// process exits first.
    ///
    /// For readiness signals that are not HTTP (e.g. "gossip listening on").
    pub fn wait_log_contains(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stdout().contains(needle) || self.stderr().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.try_wait()? {
                bail!(
                    "{} exited with {status} before logging {needle:?}\n{}",
                    self.name,
                    self.log_tails()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not log {needle:?} within {timeout:?}\n{}",
                    self.name,
                    self.log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a signal by name (`HUP`, `STOP`, `CONT`, …) with `kill -SIG PID`.
    ///
    /// For reload-on-SIGHUP tests or to freeze a daemon.
    pub fn signal(&self, sig: &str) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("{} is not running", self.name))?;
        signal(pid, sig)
    }

    /// Kills the process with SIGKILL and reaps it (a crash). Does nothing if already gone.
    ///
    /// For tests of what the rest of the system does when a daemon dies abruptly.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child).with_context(|| format!("killing {}", self.name))?;
        }
        Ok(())
    }

    /// Sends SIGTERM and waits up to `timeout` for a graceful exit, returning the exit status;
    /// if the process does not exit in time it is killed and an error (with logs) returned.
    ///
    /// For graceful-shutdown tests: `assert!(d.terminate(Duration::from_secs(10))?.success())`.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow!("{} was already killed", self.name))?;
        if let Some(status) = child.try_wait().context("checking the process")? {
            return Ok(status);
        }
        signal(child.id(), "TERM")?;
        match wait_timeout(&mut child, timeout)? {
            Some(status) => Ok(status),
            None => {
                let _ = kill_and_reap(&mut child);
                bail!(
                    "{} did not exit within {timeout:?} of SIGTERM (killed)\n{}",
                    self.name,
                    self.log_tails()
                )
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("sluice-testkit: logs of {}:\n{}", self.name, self.logs());
        }
        if let Err(e) = self.kill() {
            eprintln!("sluice-testkit: {e:#}");
        }
    }
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_logs_and_terminates() -> Result<()> {
        let mut d = Daemon::spawn(
            "sh",
            &[
                "-c",
                "echo hello; echo oops >&2; echo $SLUICE_X; exec sleep 30",
            ],
            &[("SLUICE_X", "from-env")],
        )?;
        d.wait_log_contains("from-env", Duration::from_secs(5))?;
        assert!(d.stdout().contains("hello"));
        assert_eq!(d.stderr().trim(), "oops");
        assert!(d.logs().contains("stderr"));
        let status = d.terminate(Duration::from_secs(5))?;
        assert!(!status.success());
        assert!(d.pid().is_none());
        Ok(())
    }

    /// Daemons keep files under `$TMPDIR` named by their port (the decision log's default
    /// directory); a port another test's daemon used before would hand them its files.
    #[test]
    fn each_process_gets_a_temp_dir_of_its_own() -> Result<()> {
        let mut d = Daemon::spawn("sh", &["-c", "printf '%s\\n' \"tmp=$TMPDIR\""], &[])?;
        d.wait(Duration::from_secs(5))?;
        assert_eq!(
            d.stdout().trim(),
            format!("tmp={}", d.dir().display()),
            "the child's TMPDIR"
        );
        let mut d = Daemon::spawn(
            "sh",
            &["-c", "printf '%s\\n' \"tmp=$TMPDIR\""],
            &[("TMPDIR", "/chosen")],
        )?;
        d.wait(Duration::from_secs(5))?;
        assert_eq!(
            d.stdout().trim(),
            "tmp=/chosen",
            "a TMPDIR the caller set wins"
        );
        Ok(())
    }

    #[test]
    fn early_exit_is_reported() -> Result<()> {
        let mut d = Daemon::spawn("sh", &["-c", "echo bad config >&2; exit 3"], &[])?;
        let err = d
            .wait_http_ok(
                SocketAddr::from(([127, 0, 0, 1], crate::free_port())),
                "/healthz",
                Duration::from_secs(5),
            )
            .err()
            .ok_or_else(|| anyhow!("expected an error"))?;
        let msg = format!("{err:#}");
        assert!(msg.contains("exited"), "{msg}");
        assert!(msg.contains("bad config"), "{msg}");
        Ok(())
    }

    #[test]
    fn missing_binary_says_how_to_build() {
        let err = cargo_bin("no-such-sluice-binary")
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|m| m.contains("cargo build --workspace")),
            "{err:?}"
        );
    }
}
