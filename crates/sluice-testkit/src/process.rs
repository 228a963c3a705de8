//! Process helpers shared by the server handles: signals through `kill(1)` (no `libc`), waiting
//! with a timeout, and reading the tail of a log file for error messages.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Sends `signal` (a name such as `STOP`, `CONT`, `KILL`, `TERM`) to `pid` with `kill -SIG PID`.
pub(crate) fn signal(pid: u32, signal: &str) -> Result<()> {
    let out = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running `kill -{signal} {pid}` (is procps installed?)"))?;
    if !out.status.success() {
        bail!(
            "`kill -{signal} {pid}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Waits for `child` to exit for at most `timeout`; `None` if it is still running.
pub(crate) fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().context("waiting for a child process")? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILLs `child` (resuming it first, harmlessly, in case it was stopped) and reaps it.
pub(crate) fn kill_and_reap(child: &mut Child) -> Result<()> {
    if child
        .try_wait()
        .context("checking a child process")?
        .is_some()
    {
        return Ok(());
    }
    // Child::kill sends SIGKILL, which also ends a SIGSTOPped process.
    child
        .kill()
        .with_context(|| format!("killing pid {}", child.id()))?;
    child
        .wait()
        .with_context(|| format!("reaping pid {}", child.id()))?;
    Ok(())
}

/// The last `max_lines` lines of a log file, for error messages ("" if unreadable).
pub(crate) fn tail(path: &Path, max_lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(max_lines);
    lines[start..].join("\n")
}
