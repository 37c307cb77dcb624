//! Commands in pods through the API's exec (a websocket): an argument vector, optional
//! standard input (closed with the stream-close message of the v5 protocol), output and
//! exit code, and a deadline kept inside the pod by coreutils `timeout` (the API cannot
//! kill an exec); background servers whose output goes to a log and which are stopped by
//! their pid in the pod.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, AttachedProcess};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::manifest::CONTAINER;
use crate::fault::Cmd;
use crate::run::process::{ExecOutput, RemoteProcess, Stopped};

/// How long after its deadline a command may take to be reported killed before iblab
/// stops waiting for the API.
const SLACK: Duration = Duration::from_secs(10);
/// `timeout`'s exit codes: the deadline passed (TERM), or it had to KILL.
const TIMED_OUT: [i32; 2] = [124, 137];

/// The exit code an exec's final status carries (`Success`: 0; `NonZeroExitCode`: the
/// `ExitCode` cause); `None` when the status says nothing about one.
pub fn exit_code(status: Option<&Status>) -> Option<i32> {
    let s = status?;
    if s.status.as_deref() == Some("Success") {
        return Some(0);
    }
    s.details
        .as_ref()?
        .causes
        .as_ref()?
        .iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref()?.parse().ok())
}

/// The argument vector that runs `argv` under a deadline inside the pod.
pub fn under_deadline(argv: &[String], timeout: Duration) -> Vec<String> {
    let secs = timeout.as_secs_f64().max(0.1);
    let mut v = vec![
        "timeout".to_string(),
        "-k".into(),
        "2".into(),
        format!("{secs:.1}"),
    ];
    v.extend(argv.iter().cloned());
    v
}

async fn start(
    pods: &Api<Pod>,
    pod: &str,
    argv: Vec<String>,
    stdin: bool,
) -> Result<AttachedProcess, String> {
    let ap = AttachParams::default()
        .container(CONTAINER)
        .stdin(stdin)
        .stdout(true)
        .stderr(true);
    pods.exec(pod, argv, &ap).await.map_err(|e| e.to_string())
}

/// Run `cmd` in `pod` to completion, or have it killed at the deadline.
pub async fn run(
    pods: &Api<Pod>,
    pod: &str,
    cmd: &Cmd,
    timeout: Duration,
) -> Result<ExecOutput, String> {
    let started = Instant::now();
    let mut p = start(
        pods,
        pod,
        under_deadline(&cmd.argv, timeout),
        cmd.stdin.is_some(),
    )
    .await?;
    let (stdin, out, err, status) = (p.stdin(), p.stdout(), p.stderr(), p.take_status());
    let work = async {
        let write = async {
            if let (Some(mut w), Some(text)) = (stdin, &cmd.stdin) {
                let _ = w.write_all(text.as_bytes()).await;
                let _ = w.shutdown().await;
            }
        };
        let read = |r: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>| async move {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v).await;
            }
            v
        };
        let (_, o, e) = tokio::join!(write, read(out), read(err));
        let status = match status {
            Some(s) => s.await,
            None => None,
        };
        (o, e, status)
    };
    match tokio::time::timeout(timeout + SLACK, work).await {
        Ok((o, e, status)) => {
            tracing::debug!(?status, pod, argv = ?cmd.argv, "exec ended");
            let code = exit_code(status.as_ref());
            if code.is_some_and(|c| TIMED_OUT.contains(&c)) && started.elapsed() >= timeout {
                return Ok(ExecOutput::killed_at_deadline(timeout, started));
            }
            if code.is_none()
                && let Some(s) = &status
                && let Some(m) = s.message.as_ref().filter(|m| !m.is_empty())
            {
                return Err(m.clone());
            }
            Ok(ExecOutput {
                exit_code: code,
                stdout: String::from_utf8_lossy(&o).into_owned(),
                stderr: String::from_utf8_lossy(&e).into_owned(),
                duration: started.elapsed(),
                timed_out: false,
                // The pod's processes are not this host's to sample (on a remote cluster
                // they are not even on it): no process counters on this backend yet.
                counters: None,
            })
        }
        Err(_) => {
            p.abort();
            Ok(ExecOutput::killed_at_deadline(timeout, started))
        }
    }
}

/// `kill -SIG PID` in a pod: the shell's builtin (a minimal image has no kill(1)).
pub fn kill(sig: &str, pid: u32) -> Cmd {
    Cmd {
        argv: vec!["sh".into(), "-c".into(), format!("kill -{sig} {pid}")],
        stdin: None,
        may_fail: true,
    }
}

/// A server started in a pod: its pid there, the task copying its output to the log, and
/// the exit status when the exec ends.
pub struct PodProcess {
    pods: Api<Pod>,
    pod: String,
    pid: u32,
    ended: Option<tokio::task::JoinHandle<Option<i32>>>,
}

/// Start `argv` in `pod` in the background, output to `log`. A shell prints its pid and
/// then becomes the command, so the command can be signalled by that pid later.
pub async fn spawn(
    pods: &Api<Pod>,
    pod: &str,
    argv: &[String],
    log: &Path,
) -> Result<PodProcess, String> {
    let mut file = tokio::fs::File::create(log)
        .await
        .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let mut shell = vec![
        "sh".to_string(),
        "-c".into(),
        "echo $$; exec \"$@\"".into(),
        "iblab-background".into(),
    ];
    shell.extend(argv.iter().cloned());
    let mut p = start(pods, pod, shell, false).await?;
    let (out, err, status) = (p.stdout(), p.stderr(), p.take_status());
    let mut out = BufReader::new(out.ok_or("the exec has no standard output")?);
    let mut first = String::new();
    let read = tokio::time::timeout(Duration::from_secs(10), out.read_line(&mut first)).await;
    let pid: u32 = match read {
        Ok(Ok(n)) if n > 0 => first
            .trim()
            .parse()
            .map_err(|_| format!("the pod said `{}` instead of a pid", first.trim()))?,
        _ => {
            let mut rest = String::new();
            if let Some(mut e) = err {
                let _ = e.read_to_string(&mut rest).await;
            }
            return Err(format!("it did not start: {}", rest.trim()));
        }
    };
    let ended = tokio::spawn(async move {
        let mut err = err;
        let mut buf_o = [0u8; 8192];
        let mut buf_e = [0u8; 8192];
        let (mut o_open, mut e_open) = (true, err.is_some());
        while o_open || e_open {
            tokio::select! {
                n = out.read(&mut buf_o), if o_open => match n {
                    Ok(0) | Err(_) => o_open = false,
                    Ok(n) => { let _ = file.write_all(&buf_o[..n]).await; }
                },
                n = async { err.as_mut().unwrap().read(&mut buf_e).await }, if e_open => match n {
                    Ok(0) | Err(_) => e_open = false,
                    Ok(n) => { let _ = file.write_all(&buf_e[..n]).await; }
                },
            }
        }
        let _ = file.flush().await;
        let status = match status {
            Some(s) => s.await,
            None => None,
        };
        drop(p);
        exit_code(status.as_ref())
    });
    Ok(PodProcess {
        pods: pods.clone(),
        pod: pod.to_string(),
        pid,
        ended: Some(ended),
    })
}

impl PodProcess {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    async fn signal(&self, sig: &str) {
        let cmd = kill(sig, self.pid);
        let _ = run(&self.pods, &self.pod, &cmd, Duration::from_secs(5)).await;
    }
}

#[async_trait::async_trait]
impl RemoteProcess for PodProcess {
    async fn stop(mut self: Box<Self>, grace: Duration) -> Stopped {
        let Some(mut ended) = self.ended.take() else {
            return Stopped::default();
        };
        if let Ok(done) = tokio::time::timeout(grace, &mut ended).await {
            return Stopped {
                exit_code: done.ok().flatten(),
                counters: None,
            };
        }
        self.signal("TERM").await;
        if let Ok(done) = tokio::time::timeout(Duration::from_secs(2), &mut ended).await {
            return Stopped {
                exit_code: done.ok().flatten(),
                counters: None,
            };
        }
        self.signal("KILL").await;
        let exit_code = tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .ok()
            .and_then(|j| j.ok())
            .flatten();
        Stopped {
            exit_code,
            counters: None,
        }
    }

    fn abandon(&mut self) {
        // The pod goes with the run; until then, ask for the process to stop.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (pods, pod, pid) = (self.pods.clone(), self.pod.clone(), self.pid);
            rt.spawn(async move {
                let cmd = kill("KILL", pid);
                let _ = run(&pods, &pod, &cmd, Duration::from_secs(5)).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_from_the_final_status() {
        // As the API server sends them on the error channel (v5 protocol).
        let ok: Status = serde_json::from_str(r#"{"metadata":{},"status":"Success"}"#).unwrap();
        assert_eq!(exit_code(Some(&ok)), Some(0));
        let failed: Status = serde_json::from_str(
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [false], exit code 1","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"1"}]}}"#,
        )
        .unwrap();
        assert_eq!(exit_code(Some(&failed)), Some(1));
        let no_such: Status = serde_json::from_str(
            r#"{"metadata":{},"status":"Failure","message":"failed to exec in container: exec: \"nope\": executable file not found in $PATH","reason":"InternalError"}"#,
        )
        .unwrap();
        assert_eq!(exit_code(Some(&no_such)), None);
        assert_eq!(exit_code(None), None);
    }

    #[test]
    fn deadlines_are_kept_inside_the_pod() {
        let v = under_deadline(&["iperf3".into(), "-c".into()], Duration::from_millis(2500));
        assert_eq!(v, ["timeout", "-k", "2", "2.5", "iperf3", "-c"]);
    }
}
