//! Child processes: run to completion under a deadline, or supervise in the background.
//! Every child leads its own process group so that all it started can be stopped.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

/// What a finished command left behind.
#[derive(Debug, Clone, Serialize)]
pub struct ExecOutput {
    /// Exit code; `None` when killed by a signal or at the deadline.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub duration: Duration,
    pub timed_out: bool,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Run `argv` with optional stdin; kill its whole process group at the deadline.
pub async fn run(
    argv: &[String],
    stdin: Option<&str>,
    timeout: Duration,
) -> std::io::Result<ExecOutput> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let start = Instant::now();
    let mut child = cmd.spawn()?;
    let pgid = child.id();
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await?;
        drop(pipe);
    }
    let guard = GroupGuard(pgid);
    let waited = tokio::time::timeout(timeout, child.wait_with_output()).await;
    let out = match waited {
        Ok(out) => {
            std::mem::forget(guard);
            let out = out?;
            ExecOutput {
                exit_code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                duration: start.elapsed(),
                timed_out: false,
            }
        }
        Err(_) => {
            drop(guard);
            ExecOutput {
                exit_code: None,
                stdout: String::new(),
                stderr: format!(
                    "killed after {:.1}s: deadline reached",
                    timeout.as_secs_f64()
                ),
                duration: start.elapsed(),
                timed_out: true,
            }
        }
    };
    Ok(out)
}

/// Kills a process group when dropped (a deadline passed or the run was interrupted).
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// A background process that lives elsewhere (inside a VM), driven through its backend.
#[async_trait::async_trait]
pub trait RemoteProcess: Send + Sync {
    /// Stop it and collect its exit code (its output goes where the backend said).
    async fn stop(self: Box<Self>) -> Option<i32>;
    /// Dropped without `stop`: ask for it to be stopped, without waiting.
    fn abandon(&mut self);
}

enum Inner {
    Local(Child),
    Remote(Option<Box<dyn RemoteProcess>>),
}

/// A supervised background process (a server a step needs).
pub struct Background {
    inner: Inner,
    pub pid: u32,
}

impl Background {
    /// Start `argv` in its own process group, output to `log`.
    pub fn start(argv: &[String], log: &Path) -> std::io::Result<Background> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty command"))?;
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("child exited at once"))?;
        Ok(Background {
            inner: Inner::Local(child),
            pid,
        })
    }

    /// A process another backend runs; `pid` is its id there.
    pub fn remote(pid: u32, handle: Box<dyn RemoteProcess>) -> Background {
        Background {
            inner: Inner::Remote(Some(handle)),
            pid,
        }
    }

    /// Has it exited already? Returns the exit code if so (unknown for remote processes).
    pub fn exited(&mut self) -> Option<Option<i32>> {
        match &mut self.inner {
            Inner::Local(child) => child.try_wait().ok().flatten().map(|s| s.code()),
            Inner::Remote(_) => None,
        }
    }

    /// Stop it: SIGTERM to the group, then SIGKILL after a grace period.
    pub async fn stop(mut self) -> Option<i32> {
        if let Inner::Remote(h) = &mut self.inner {
            return match h.take() {
                Some(h) => h.stop().await,
                None => None,
            };
        }
        if let Some(code) = self.exited() {
            return code;
        }
        let pg = Pid::from_raw(self.pid as i32);
        let _ = killpg(pg, Signal::SIGTERM);
        let Inner::Local(child) = &mut self.inner else {
            return None;
        };
        match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = killpg(pg, Signal::SIGKILL);
                child.wait().await.ok().and_then(|s| s.code())
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        match &mut self.inner {
            Inner::Local(child) => {
                if child.try_wait().ok().flatten().is_none() {
                    let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
                }
            }
            Inner::Remote(h) => {
                if let Some(h) = h.as_mut() {
                    h.abandon();
                }
            }
        }
    }
}
