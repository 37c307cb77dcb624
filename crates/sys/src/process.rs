//! Child processes: run to completion under a deadline, or supervise in the background.
//! Every child leads its own process group so that all it started can be stopped.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use crate::counters;
use crate::pid::{start_ticks_of, wait_within};
use iblab_core::command::{Capture, ExecOutput};
use iblab_core::counters::ProcessCounters;

/// A check every launch on this host passes during a run: `Err` refuses it with the
/// reason. The executor sets one for the run's duration ([`guarded`]); outside a run (and
/// in tasks the run spawns) there is none. See the engine's `run::programs`.
pub type Guard = std::sync::Arc<dyn Fn(&[String]) -> Result<(), Refused> + Send + Sync>;

/// A launch a [`Guard`] refused: the program, and why (in words for the user). It reaches
/// the code that asked for the launch as the inner error of an
/// [`std::io::ErrorKind::Other`] I/O error, found there by type ([`Refused::of`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{why}")]
pub struct Refused {
    pub program: String,
    pub why: String,
}

impl Refused {
    /// The refusal an I/O error of a launch carries, if it is one.
    pub fn of(e: &std::io::Error) -> Option<&Refused> {
        e.get_ref()?.downcast_ref::<Refused>()
    }
}

tokio::task_local! {
    static GUARD: Guard;
}

/// Run `work` with `guard` holding every launch on this host that it makes.
pub async fn guarded<F: std::future::Future>(guard: Guard, work: F) -> F::Output {
    GUARD.scope(guard, work).await
}

/// Run `work` (building a cached image: not a lab's own work, and checked by the build's
/// own preflight) allowing exactly `programs` to start on this host, whatever the run's
/// guard allows: a launch of anything else inside it is refused with the reason.
pub async fn allowing<F: std::future::Future>(
    what: &'static str,
    programs: &'static [&'static str],
    work: F,
) -> F::Output {
    let guard: Guard = std::sync::Arc::new(move |argv: &[String]| {
        let name = argv
            .first()
            .map(|p| p.rsplit('/').next().unwrap_or(p))
            .unwrap_or_default();
        match programs.contains(&name) {
            true => Ok(()),
            false => Err(Refused {
                program: name.to_string(),
                why: format!(
                    "{what} started `{name}`, which its list of programs ({}) does not name: a bug in iblab",
                    programs.join(", ")
                ),
            }),
        }
    });
    GUARD.scope(guard, work).await
}

/// Read a stream to its end, keeping what [`Capture`] keeps (the rest is read and dropped,
/// so the writer is never blocked on a full pipe).
pub async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    r: Option<&mut R>,
    into: &mut Capture,
) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let Some(r) = r else { return Ok(()) };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        into.push(&buf[..n]);
    }
}

/// Ask the run's guard, if there is one, whether `argv` may be started.
fn allowed(argv: &[String]) -> std::io::Result<()> {
    match GUARD.try_with(|g| g(argv)) {
        Ok(Err(why)) => Err(std::io::Error::other(why)),
        _ => Ok(()),
    }
}

/// A program that is not on this host says so with its package, instead of the bare
/// `No such file or directory`.
fn spawn_error(program: &str, e: std::io::Error) -> std::io::Error {
    if e.kind() != std::io::ErrorKind::NotFound {
        return e;
    }
    let name = program.rsplit('/').next().unwrap_or(program);
    let fix = match iblab_core::caps::package_of(name) {
        Some(pkg) => format!("apt-get install {pkg}"),
        None => format!("install `{name}`"),
    };
    std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("`{program}` is not installed on this host (fix: {fix})"),
    )
}

/// [`wait_within`] for a command whose output is wanted (a host query): its exit status
/// and stdout, or an error when it could not run or did not finish within `limit` (then
/// it was killed). The output is read by a thread so that a full pipe cannot stall it.
pub fn output_within(
    cmd: &mut std::process::Command,
    limit: Duration,
) -> std::io::Result<std::process::Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut buf);
        buf
    });
    let status = wait_within(&mut child, limit)?;
    let stdout = reader.join().unwrap_or_default();
    match status {
        Some(status) => Ok(std::process::Output {
            status,
            stdout,
            stderr: Vec::new(),
        }),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("did not finish within {:.0}s (killed)", limit.as_secs_f64()),
        )),
    }
}

/// A diagnostics log's entry: `== header`, then what the command printed, or why it
/// could not run.
pub fn transcript<E: std::fmt::Display>(header: &str, out: Result<ExecOutput, E>) -> String {
    match out {
        Ok(o) => format!("== {header}\n{}{}", o.stdout, o.stderr),
        Err(e) => format!("== {header}\n(could not run: {e})\n"),
    }
}

/// Run `argv` with optional stdin; kill its whole process group at the deadline.
pub async fn run(
    argv: &[String],
    stdin: Option<&str>,
    timeout: Duration,
) -> std::io::Result<ExecOutput> {
    run_env(argv, stdin, timeout, &[], None).await
}

/// [`run`] with extra environment variables.
pub async fn run_env(
    argv: &[String],
    stdin: Option<&str>,
    timeout: Duration,
    env: &[(String, String)],
    cwd: Option<&Path>,
) -> std::io::Result<ExecOutput> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    allowed(argv)?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
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
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd.spawn().map_err(|e| spawn_error(program, e))?;
    let pgid = child.id();
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await?;
        drop(pipe);
    }
    let guard = GroupGuard(pgid);
    let sampler = pgid.map(counters::Sampler::start);
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let work = async {
        let (mut o, mut e) = (Capture::default(), Capture::default());
        let (r1, r2) = tokio::join!(
            read_capped(out_pipe.as_mut(), &mut o),
            read_capped(err_pipe.as_mut(), &mut e)
        );
        r1?;
        r2?;
        // Finished but not reaped yet: its accounting is still in /proc.
        let counters = match pgid {
            Some(pid) => {
                counters::wait_unreaped(pid, Duration::MAX).await;
                sampler.and_then(|s| s.finish(counters::read(pid)))
            }
            None => None,
        };
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, o, e, counters))
    };
    let waited = tokio::time::timeout(timeout, work).await;
    let out = match waited {
        Ok(out) => {
            std::mem::forget(guard);
            let (status, o, e, counters) = out?;
            ExecOutput {
                exit_code: status.code(),
                stdout: o.text(),
                stderr: e.text(),
                duration: start.elapsed(),
                timed_out: false,
                counters,
            }
        }
        Err(_) => {
            drop(guard);
            ExecOutput::killed_at_deadline(timeout, start)
        }
    };
    Ok(out)
}

/// Reap every child of this process that has ended, and wait up to `grace` for the ones
/// still running (teardown has just killed them: a killed qemu takes a moment to free its
/// memory). A child that is killed but never waited for stays a zombie until iblab exits
/// and init reaps it; the handles that would have waited (a dropped [`Background`], a
/// cancelled command) hand theirs to the runtime, which reaps them only if it runs again.
/// Call it only once nothing holds a child handle any more: a reaped pid may be reused.
/// Returns how many children were still running when `grace` ran out.
pub async fn reap_children(grace: Duration) -> usize {
    use nix::errno::Errno;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let deadline = Instant::now() + grace;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            // One reaped; there may be more.
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => continue,
            Ok(WaitStatus::StillAlive) | Ok(_) => {
                if Instant::now() >= deadline {
                    return children_running();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(Errno::EINTR) => continue,
            // ECHILD: no child left.
            Err(_) => return 0,
        }
    }
}

/// Children of this process still running, from /proc.
fn children_running() -> usize {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| {
                    st.rsplit_once(')')
                        .and_then(|x| x.1.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                == Some(me)
        })
        .count()
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
    /// Let it finish on its own for up to `grace`, else stop it; collect its exit code and
    /// counters (its output goes where the backend said).
    async fn stop(self: Box<Self>, grace: Duration) -> Stopped;
    /// Dropped without `stop`: ask for it to be stopped, without waiting.
    fn abandon(&mut self);
    /// Has it ended on its own (its backend saw it end)? `false` where that is not known.
    fn has_ended(&self) -> bool {
        false
    }
}

/// How a background process ended.
#[derive(Debug, Clone, Default)]
pub struct Stopped {
    /// Exit code; `None` when killed by a signal or not known.
    pub exit_code: Option<i32>,
    /// Its accounting at its end, read before it was reaped, where the platform allows.
    pub counters: Option<ProcessCounters>,
}

/// A supervised background process (a server a step needs).
pub struct Background {
    inner: Inner,
    pub pid: u32,
}

enum Inner {
    /// A child of this process, in its own process group, sampled while it runs.
    Child(Child, Option<counters::Sampler>),
    /// A process on this host that someone else started for us (a container engine's exec),
    /// known by pid and start time; `pump` copies its output to the log.
    Adopted {
        start_ticks: Option<u64>,
        pump: Option<tokio::task::JoinHandle<()>>,
        sampler: Option<counters::Sampler>,
    },
    /// A process inside a guest (the vm backend), driven through its agent.
    Remote(Option<Box<dyn RemoteProcess>>),
}

impl Background {
    /// Start `argv` in its own session and process group, output to `log`.
    pub fn start(argv: &[String], log: &Path) -> std::io::Result<Background> {
        Background::start_with(argv, log, &[], None, None)
    }

    /// [`Background::start`] with extra environment variables and a file as stdin.
    pub fn start_with(
        argv: &[String],
        log: &Path,
        env: &[(String, String)],
        stdin: Option<std::fs::File>,
        cwd: Option<&Path>,
    ) -> std::io::Result<Background> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty command"))?;
        allowed(argv)?;
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(stdin.map(Stdio::from).unwrap_or_else(Stdio::null))
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        // Its own session (so also its own process group, led by it): no terminal's hangup
        // or Ctrl-C reaches it, and a kept lab's processes outlive this one untouched.
        // SAFETY: setsid is async-signal-safe and touches nothing of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let child = cmd.spawn().map_err(|e| spawn_error(program, e))?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("child exited at once"))?;
        Ok(Background {
            inner: Inner::Child(child, Some(counters::Sampler::start(pid))),
            pid,
        })
    }

    /// Supervise a process on this host that was started some other way (e.g. by a
    /// container engine); `pump` is the task copying its output to the log, if any.
    pub fn adopt(pid: u32, pump: Option<tokio::task::JoinHandle<()>>) -> Background {
        Background {
            inner: Inner::Adopted {
                start_ticks: start_ticks_of(pid),
                pump,
                sampler: Some(counters::Sampler::start_adopted(pid)),
            },
            pid,
        }
    }

    /// A process another backend runs; `pid` is its id there.
    pub fn remote(pid: u32, handle: Box<dyn RemoteProcess>) -> Background {
        Background {
            inner: Inner::Remote(Some(handle)),
            pid,
        }
    }

    /// Has it exited already? Returns the exit code if so (`None` when not known).
    pub fn exited(&mut self) -> Option<Option<i32>> {
        match &mut self.inner {
            Inner::Child(c, _) => c.try_wait().ok().flatten().map(|s| s.code()),
            Inner::Adopted { start_ticks, .. } => {
                let gone = start_ticks.is_none() || start_ticks_of(self.pid) != *start_ticks;
                gone.then_some(None)
            }
            // Its exit code, if any, comes with `finish`.
            Inner::Remote(h) => h.as_ref().is_some_and(|h| h.has_ended()).then_some(None),
        }
    }

    /// The scheduler's state letter of a process on this host (`R`, `S`, `T` stopped, …),
    /// while it has not been reaped; `None` for a process in a guest or one that is gone.
    pub fn state_letter(&self) -> Option<char> {
        if matches!(self.inner, Inner::Remote(_)) {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// Leave it running after this run ends (a kept lab): it is neither stopped nor
    /// reaped here; the state file still names it, so `iblab down` stops it.
    pub fn leave_running(self) {
        std::mem::forget(self);
    }

    /// Stop it: SIGTERM (to the group of a child), then SIGKILL after a grace period.
    pub async fn stop(self) -> Option<i32> {
        self.finish(Duration::ZERO).await.exit_code
    }

    /// Let it end on its own for up to `grace` (a server that serves one test), else stop
    /// it as [`Background::stop`] does; a child of ours is read (counters) before it is
    /// reaped.
    pub async fn finish(mut self, grace: Duration) -> Stopped {
        if let Inner::Remote(h) = &mut self.inner {
            return match h.take() {
                Some(h) => h.stop(grace).await,
                None => Stopped::default(),
            };
        }
        let pid = Pid::from_raw(self.pid as i32);
        if let Inner::Child(child, sampler) = &mut self.inner {
            let raw = self.pid;
            if !counters::wait_unreaped(raw, grace).await {
                let _ = killpg(pid, Signal::SIGTERM);
                // A stopped process acts on SIGTERM only once continued.
                let _ = killpg(pid, Signal::SIGCONT);
                if !counters::wait_unreaped(raw, Duration::from_secs(2)).await {
                    let _ = killpg(pid, Signal::SIGKILL);
                    counters::wait_unreaped(raw, Duration::from_secs(5)).await;
                }
            }
            let end = counters::read(raw);
            let counters = match sampler.take() {
                Some(s) => s.finish(end),
                None => end.map(ProcessCounters::from),
            };
            let exit_code = child.wait().await.ok().and_then(|s| s.code());
            return Stopped {
                exit_code,
                counters,
            };
        }
        let deadline = Instant::now() + grace;
        while self.exited().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(code) = self.exited() {
            let mut counters = None;
            if let Inner::Adopted { pump, sampler, .. } = &mut self.inner {
                finish_pump(pump.take()).await;
                // Not our child: its samples are all there is (the last stands for its end).
                counters = sampler.take().and_then(|s| s.finish(None));
            }
            return Stopped {
                exit_code: code,
                counters,
            };
        }
        if let Inner::Adopted { pump, sampler, .. } = &mut self.inner {
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(2);
            let pump = pump.take();
            // Its samples until now are all there is of its accounting, killed or not.
            let counters = sampler.take().and_then(|s| s.finish(None));
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if self.exited().is_some() {
                    finish_pump(pump).await;
                    return Stopped {
                        exit_code: None,
                        counters,
                    };
                }
            }
            let _ = kill(pid, Signal::SIGKILL);
            finish_pump(pump).await;
            return Stopped {
                exit_code: None,
                counters,
            };
        }
        Stopped::default()
    }
}

/// Let an output pump write what is left (its stream ends with the process), briefly.
async fn finish_pump(pump: Option<tokio::task::JoinHandle<()>>) {
    if let Some(p) = pump {
        let abort = p.abort_handle();
        if tokio::time::timeout(Duration::from_secs(1), p)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let pid = Pid::from_raw(self.pid as i32);
        match &mut self.inner {
            Inner::Child(child, _) => {
                if child.try_wait().ok().flatten().is_none() {
                    let _ = killpg(pid, Signal::SIGKILL);
                }
            }
            Inner::Adopted {
                start_ticks, pump, ..
            } => {
                if start_ticks.is_some() && start_ticks_of(self.pid) == *start_ticks {
                    let _ = kill(pid, Signal::SIGKILL);
                }
                if let Some(p) = pump.take() {
                    p.abort();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A launch the guard refuses never starts; the caller's I/O error carries the
    /// refusal, found by its type (the words are the guard's), and other launches go on.
    #[tokio::test]
    async fn a_refused_launch_is_found_by_its_type() {
        let argv = |p: &str| vec![p.to_string(), "-c".to_string(), "true".to_string()];
        let (refused, allowed) = allowing("a test", &["true"], async {
            (
                run(&argv("sh"), None, Duration::from_secs(5)).await,
                run(&["true".to_string()], None, Duration::from_secs(5)).await,
            )
        })
        .await;
        let e = refused.expect_err("sh is not on the list");
        let r = Refused::of(&e).expect("the refusal under the I/O error");
        assert_eq!(r.program, "sh");
        assert!(e.to_string().contains("a bug in iblab"), "{e}");
        assert_eq!(allowed.expect("true is on the list").exit_code, Some(0));
        let e = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(Refused::of(&e).is_none());
    }

    /// A command that floods its output (20 MiB, more than the cap) is read to its end,
    /// so it exits, and what is kept is the cap with a line that says what was dropped.
    #[tokio::test]
    async fn a_flooding_command_is_kept_to_the_cap() {
        let argv: Vec<String> = [
            "sh",
            "-c",
            "head -c 20971520 /dev/zero | tr '\\0' y; echo done >&2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = run(&argv, None, Duration::from_secs(60)).await.unwrap();
        assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
        assert!(out.stdout.len() < iblab_core::command::OUTPUT_CAP + 200);
        assert!(out.stdout.starts_with("yyyy"));
        let dropped = 20971520 - iblab_core::command::OUTPUT_CAP;
        assert!(
            out.stdout
                .ends_with(&format!("{dropped} more bytes were read and dropped]\n")),
            "{}",
            &out.stdout[out.stdout.len() - 120..]
        );
        assert_eq!(out.stderr.trim(), "done");
    }

    /// A synchronous command that hangs is killed at its limit and reaped; one that ends
    /// in time gives its status and output.
    #[test]
    fn synchronous_commands_are_bounded() {
        let t = Instant::now();
        let mut c = std::process::Command::new("sleep");
        c.arg("30");
        let err = output_within(&mut c, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let mut c = std::process::Command::new("echo");
        c.arg("hello");
        let out = output_within(&mut c, Duration::from_secs(10)).unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"hello\n");
    }
}
