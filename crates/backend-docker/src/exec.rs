//! Commands in containers through the Engine API's exec: an argument vector, optional
//! standard input, output and exit code, a deadline enforced by killing the process; and
//! background processes whose output goes to a log.

use std::path::Path;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgid};
use tokio::io::AsyncWriteExt;

use iblab_core::command::Cmd;
use iblab_core::command::{Capture, ExecOutput};

/// Why a command could not be run, or started, in a container.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The engine refused or failed the exec (its own words).
    #[error("{0}")]
    Engine(#[from] bollard::errors::Error),
    #[error("the engine started the command detached")]
    Detached,
    #[error("cannot write its standard input: {0}")]
    Stdin(#[source] std::io::Error),
    #[error("cannot close its standard input: {0}")]
    CloseStdin(#[source] std::io::Error),
    /// The log of a background command could not be made.
    #[error("{0}")]
    Log(#[source] iblab_sys::fs::PathError),
    /// A background command that ended as it started.
    #[error("it exited at once (exit code {code:?}); see {}", .log.display())]
    ExitedAtOnce {
        code: Option<i32>,
        log: std::path::PathBuf,
    },
}

/// Run `cmd` in `container` to completion, or kill it at the deadline.
pub async fn run(
    docker: &Docker,
    container: &str,
    cmd: &Cmd,
    timeout: Duration,
) -> Result<ExecOutput, ExecError> {
    let start = Instant::now();
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(cmd.stdin.is_some()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(cmd.argv.clone()),
                ..Default::default()
            },
        )
        .await?;
    let started = docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: Some(64 * 1024),
            }),
        )
        .await?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        return Err(ExecError::Detached);
    };
    // The engine runs on this host, so the process is visible here: sample it while it
    // runs (it is not our child, so the samples are all there is of its accounting).
    let sampler = {
        let docker = docker.clone();
        let id = created.id.clone();
        tokio::spawn(async move {
            host_pid(&docker, &id)
                .await
                .map(iblab_sys::counters::Sampler::start_adopted)
        })
    };
    let collect = async {
        if let Some(text) = &cmd.stdin {
            input
                .write_all(text.as_bytes())
                .await
                .map_err(ExecError::Stdin)?;
            // Half-close: the command sees end of input.
            input.shutdown().await.map_err(ExecError::CloseStdin)?;
        }
        let (mut out, mut err) = (Capture::default(), Capture::default());
        while let Some(chunk) = output.next().await {
            match chunk? {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    out.push(&message)
                }
                LogOutput::StdErr { message } => err.push(&message),
                LogOutput::StdIn { .. } => {}
            }
        }
        Ok::<_, ExecError>((out, err))
    };
    match tokio::time::timeout(timeout, collect).await {
        Ok(Ok((out, err))) => {
            let exit_code = exit_code(docker, &created.id).await;
            // The pid lookup ends with the exec; never let it hold the step up.
            let counters = tokio::time::timeout(Duration::from_secs(1), sampler)
                .await
                .ok()
                .and_then(|j| j.ok())
                .flatten()
                .and_then(|s| s.finish(None));
            Ok(ExecOutput {
                exit_code,
                stdout: out.text(),
                stderr: err.text(),
                duration: start.elapsed(),
                timed_out: false,
                counters,
            })
        }
        Ok(Err(e)) => {
            kill_exec(docker, &created.id).await;
            Err(e)
        }
        Err(_) => {
            kill_exec(docker, &created.id).await;
            Ok(ExecOutput::killed_at_deadline(timeout, start))
        }
    }
}

/// How long the engine may take to report an exec's start or its exit code.
const SETTLE: Duration = Duration::from_secs(5);

/// The exit code once the engine has reaped the process (its output ends a moment before,
/// and until then the exec reports neither running nor an exit code).
async fn exit_code(docker: &Docker, exec_id: &str) -> Option<i32> {
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        match docker.inspect_exec(exec_id).await {
            Ok(i) if i.running != Some(true) && i.exit_code.is_some() => {
                return i.exit_code.map(|c| c as i32);
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(_) => return None,
        }
    }
    None
}

/// The host pid of an exec'd process (the engine runs on this host), once it has one;
/// `None` when it exited first. Right after a start the exec may not be running yet.
async fn host_pid(docker: &Docker, exec_id: &str) -> Option<u32> {
    let deadline = Instant::now() + SETTLE;
    while Instant::now() < deadline {
        match docker.inspect_exec(exec_id).await {
            Ok(i) => match i.pid {
                Some(p) if p > 0 && i.running == Some(true) => return Some(p as u32),
                _ if i.exit_code.is_some() => return None,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            Err(_) => return None,
        }
    }
    None
}

/// The Engine API cannot stop an exec; kill its process (and its group, if it leads one).
async fn kill_exec(docker: &Docker, exec_id: &str) {
    let Ok(i) = docker.inspect_exec(exec_id).await else {
        return;
    };
    if i.running != Some(true) {
        return;
    }
    if let Some(p) = i.pid.filter(|p| *p > 0) {
        let pid = Pid::from_raw(p as i32);
        if getpgid(Some(pid)) == Ok(pid) {
            let _ = killpg(pid, Signal::SIGKILL);
        }
        let _ = kill(pid, Signal::SIGKILL);
    }
}

/// Start `argv` in `container` in the background; its output goes to `log`. Returns its
/// host pid and the task that copies the output.
pub async fn spawn(
    docker: &Docker,
    container: &str,
    argv: &[String],
    log: &Path,
) -> Result<(u32, tokio::task::JoinHandle<()>), ExecError> {
    let mut file = tokio::fs::File::create(log)
        .await
        .map_err(|e| ExecError::Log(iblab_sys::fs::PathError::of("create", log)(e)))?;
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(argv.to_vec()),
                ..Default::default()
            },
        )
        .await?;
    let started = docker.start_exec(&created.id, None).await?;
    let StartExecResults::Attached { mut output, .. } = started else {
        return Err(ExecError::Detached);
    };
    let pump = tokio::spawn(async move {
        while let Some(Ok(chunk)) = output.next().await {
            let bytes = match chunk {
                LogOutput::StdOut { message }
                | LogOutput::StdErr { message }
                | LogOutput::Console { message } => message,
                LogOutput::StdIn { .. } => continue,
            };
            if file.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = file.flush().await;
    });
    match host_pid(docker, &created.id).await {
        Some(pid) => Ok((pid, pump)),
        None => {
            let code = exit_code(docker, &created.id).await;
            // Let the pump write what it printed before it died.
            let _ = tokio::time::timeout(Duration::from_secs(1), pump).await;
            Err(ExecError::ExitedAtOnce {
                code,
                log: log.to_path_buf(),
            })
        }
    }
}
