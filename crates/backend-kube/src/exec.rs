//! Commands in pods through the API's exec (a websocket): an argument vector, optional
//! standard input (closed with the stream-close message of the v5 protocol), output and
//! exit code, and a deadline kept inside the pod by coreutils `timeout` (the API cannot
//! kill an exec); background servers whose output goes to a log and which are stopped by
//! their pid in the pod. On lab nodes both run under the in-pod sampler ([`sample`]), so
//! they come back with their process counters. Everything read is bounded
//! ([`super::capture`]): a pod cannot make iblab hold or write more than the caps.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, AttachedProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::capture::{Budget, Lines, Piece, Stream};
use super::manifest::CONTAINER;
use super::sample::{self, Mode};
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::counters::ProcessCounters;
use iblab_sys::process::{RemoteProcess, Stopped};

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

/// What every command in a pod runs under: `timeout` for its deadline, a shell for a
/// background command's pid and for signals (a minimal image has no kill(1)).
pub const WRAPPERS: &[&str] = &["timeout", "sh"];

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

/// Why a command in a pod could not be run or started.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The API server did not open the exec.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The exec ended with a status that carries no exit code: what it says.
    #[error("{0}")]
    Ended(String),
    #[error("cannot create {}: {source}", path.display())]
    Log {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the exec has no standard output")]
    NoStdout,
    /// A background command said no pid within 10 s: what its log holds.
    #[error("it did not start: {0}")]
    NotStarted(String),
}

async fn start(
    pods: &Api<Pod>,
    pod: &str,
    argv: Vec<String>,
    stdin: bool,
) -> Result<AttachedProcess, ExecError> {
    let ap = AttachParams::default()
        .container(CONTAINER)
        .stdin(stdin)
        .stdout(true)
        .stderr(true);
    Ok(pods.exec(pod, argv, &ap).await?)
}

/// Run `cmd` in `pod` to completion, or have it killed at the deadline; `sampled`: under
/// the in-pod sampler, so the output carries its process counters.
pub async fn run(
    pods: &Api<Pod>,
    pod: &str,
    cmd: &Cmd,
    timeout: Duration,
    sampled: bool,
    budget: &Budget,
) -> Result<ExecOutput, ExecError> {
    let started = Instant::now();
    let argv = if sampled {
        sample::wrap(Mode::Run, &cmd.argv)
    } else {
        cmd.argv.clone()
    };
    let mut p = start(
        pods,
        pod,
        under_deadline(&argv, timeout),
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
        let read = |mut r: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>| async move {
            let mut v = iblab_core::command::Capture::default();
            let _ = iblab_sys::process::read_capped(r.as_mut(), &mut v).await;
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
                return Err(ExecError::Ended(m.clone()));
            }
            let stderr = e.text();
            let (stderr, samples) = sample::split(&stderr);
            let what = |stream: &str| format!("`{}` on {pod}, {stream}", cmd.argv.join(" "));
            Ok(ExecOutput {
                exit_code: code,
                stdout: charged(o.text(), budget, &what("stdout")),
                stderr: charged(stderr.to_string(), budget, &what("stderr")),
                duration: started.elapsed(),
                timed_out: false,
                counters: samples.and_then(|t| counters_of(pod, &cmd.argv.join(" "), t)),
            })
        }
        Err(_) => {
            p.abort();
            Ok(ExecOutput::killed_at_deadline(timeout, started))
        }
    }
}

/// A command's output (already cut at its stream's cap, with that cut's note) charged to
/// the run's allowance: what the allowance does not cover is cut, said at its end and
/// reported.
fn charged(text: String, budget: &Budget, what: &str) -> String {
    let granted = budget.take(text.len() as u64) as usize;
    if granted == text.len() {
        return text;
    }
    let mut at = granted;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let (tail, note) = super::capture::run_cut_note(what, (text.len() - at) as u64);
    budget.cut(note);
    text[..at].to_string() + &tail
}

/// The sampler's text as counters; a text that does not parse is logged and gives none.
/// `what` names the command in the log.
fn counters_of(pod: &str, what: &str, text: &str) -> Option<ProcessCounters> {
    match sample::parse(text) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(pod, what, "the in-pod samples do not parse: {e}");
            None
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

/// A server started in a pod: its pid there, and the task that copies its output to the
/// log and ends with its exit code and, when sampled, the sampler's text.
pub struct PodProcess {
    pods: Api<Pod>,
    pod: String,
    pid: u32,
    ended: Option<tokio::task::JoinHandle<(Option<i32>, Option<String>)>>,
    budget: Arc<Budget>,
}

/// The pid a background wrapper says on its `iblab-pid` line, and what the command wrote
/// before it on that line (it runs already, and may have left a line unfinished).
fn pid_in(line: &[u8]) -> Option<(u32, &[u8])> {
    let text = std::str::from_utf8(line).ok()?;
    let at = text.rfind(sample::PID_LINE)?;
    let pid = text[at + sample::PID_LINE.len()..].trim().parse().ok()?;
    Some((pid, &line[..at]))
}

/// The most of the sampler's text kept (its samples come every 50 ms and a few hundred
/// bytes each: an hour of them is far less).
const SAMPLES_BYTES: usize = 4 << 20;

/// A log shared by a background command's two streams, each charged to its own [`Stream`]
/// and to the run's allowance.
#[derive(Clone)]
struct Log {
    file: Arc<tokio::sync::Mutex<tokio::fs::File>>,
    budget: Arc<Budget>,
}

impl Log {
    /// `what`: the command and stream, for the note of its first cut.
    async fn write(&self, stream: &mut Stream, bytes: &[u8], what: &str) {
        let kept = stream.admit(bytes, &self.budget);
        if !kept.is_empty() {
            let _ = self.file.lock().await.write_all(kept).await;
        }
        if let Some(note) = stream.first_cut(what) {
            self.budget.cut(note);
        }
    }

    /// The end of a stream: what it dropped, if anything, said in the log.
    async fn close(&self, stream: &Stream) {
        if let Some(tail) = stream.log_tail() {
            let _ = self.file.lock().await.write_all(tail.as_bytes()).await;
        }
    }
}

/// Start `argv` in `pod` in the background, output to `log`; `sampled`: under the in-pod
/// sampler, so that stopping it gives its counters. Either way its wrapper says the
/// command's pid first, so the command can be signalled by that pid later. The output is
/// read in chunks and kept within the caps ([`super::capture`]), whatever the pod writes.
pub async fn spawn(
    pods: &Api<Pod>,
    pod: &str,
    argv: &[String],
    log: &Path,
    sampled: bool,
    budget: Arc<Budget>,
) -> Result<PodProcess, ExecError> {
    let file = tokio::fs::File::create(log)
        .await
        .map_err(|source| ExecError::Log {
            path: log.to_path_buf(),
            source,
        })?;
    let file = Arc::new(tokio::sync::Mutex::new(file));
    let shell = if sampled {
        sample::wrap(Mode::Spawn, argv)
    } else {
        let mut v = vec![
            "sh".to_string(),
            "-c".into(),
            format!("echo \"{}$$\"; exec \"$@\"", sample::PID_LINE),
            "iblab-background".into(),
        ];
        v.extend(argv.iter().cloned());
        v
    };
    let mut p = start(pods, pod, shell, false).await?;
    let (out, err, status) = (p.stdout(), p.stderr(), p.take_status());
    let out = out.ok_or(ExecError::NoStdout)?;
    let (said_pid, pid) = tokio::sync::oneshot::channel();
    let log_to = Log {
        file: file.clone(),
        budget: budget.clone(),
    };
    let what = format!("`{}` on {pod}", argv.join(" "));
    let ended = tokio::spawn(async move {
        let copy_out = copy_stdout(out, log_to.clone(), format!("{what}, stdout"), said_pid);
        let copy_err = async {
            match err {
                Some(err) => copy_stderr(err, log_to.clone(), format!("{what}, stderr")).await,
                None => None,
            }
        };
        let ((), samples) = tokio::join!(copy_out, copy_err);
        let _ = file.lock().await.flush().await;
        let status = match status {
            Some(s) => s.await,
            None => None,
        };
        drop(p);
        (exit_code(status.as_ref()), samples)
    });
    match tokio::time::timeout(Duration::from_secs(10), pid).await {
        Ok(Ok(pid)) => Ok(PodProcess {
            pods: pods.clone(),
            pod: pod.to_string(),
            pid,
            ended: Some(ended),
            budget,
        }),
        _ => {
            ended.abort();
            let said = tokio::fs::read_to_string(log).await.unwrap_or_default();
            Err(ExecError::NotStarted(said.trim().to_string()))
        }
    }
}

/// A background command's standard output to its log, but for the pid line (which may
/// come after the command's first words), whose pid goes to `said_pid`.
async fn copy_stdout(
    mut out: impl tokio::io::AsyncRead + Unpin,
    log: Log,
    what: String,
    said_pid: tokio::sync::oneshot::Sender<u32>,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut stream = Stream::default();
    let mut said_pid = Some(said_pid);
    let mut lines = Some(Lines::default());
    loop {
        let n = match out.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let Some(l) = lines.as_mut() else {
            log.write(&mut stream, &buf[..n], &what).await;
            continue;
        };
        for piece in l.feed(&buf[..n]) {
            match piece {
                Piece::Line(line) if said_pid.is_some() => match pid_in(&line) {
                    Some((pid, before)) => {
                        let _ = said_pid.take().map(|s| s.send(pid));
                        log.write(&mut stream, before, &what).await;
                    }
                    None => log.write(&mut stream, &line, &what).await,
                },
                Piece::Line(b) | Piece::Part(b) => log.write(&mut stream, &b, &what).await,
            }
        }
        if said_pid.is_none() {
            // Found: the rest passes through in chunks.
            if let Some(rest) = l.finish() {
                log.write(&mut stream, &rest, &what).await;
            }
            lines = None;
        }
    }
    if let Some(rest) = lines.as_mut().and_then(Lines::finish) {
        log.write(&mut stream, &rest, &what).await;
    }
    log.close(&stream).await;
}

/// A background command's standard error to its log up to the sampler's mark; the
/// sampler's text after it (at most [`SAMPLES_BYTES`]), returned.
async fn copy_stderr(
    mut err: impl tokio::io::AsyncRead + Unpin,
    log: Log,
    what: String,
) -> Option<String> {
    let mark = format!("{}\n", sample::MARK);
    let mut buf = vec![0u8; 64 << 10];
    let mut stream = Stream::default();
    let (mut samples, mut blank, mut lines) = (None::<Vec<u8>>, false, Some(Lines::default()));
    let keep = |s: &mut Vec<u8>, b: &[u8]| {
        let room = SAMPLES_BYTES.saturating_sub(s.len());
        s.extend_from_slice(&b[..b.len().min(room)]);
    };
    loop {
        let n = match err.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let Some(l) = lines.as_mut() else {
            // After the mark: the sampler's text.
            if let Some(s) = samples.as_mut() {
                keep(s, &buf[..n]);
            }
            continue;
        };
        for piece in l.feed(&buf[..n]) {
            if let Some(s) = samples.as_mut() {
                let (Piece::Line(b) | Piece::Part(b)) = piece;
                keep(s, &b);
                continue;
            }
            match piece {
                // The wrapper's own line break before the mark is not the command's.
                Piece::Line(line) if line == mark.as_bytes() => {
                    samples = Some(Vec::new());
                }
                Piece::Line(b) | Piece::Part(b) => {
                    if std::mem::take(&mut blank) {
                        log.write(&mut stream, b"\n", &what).await;
                    }
                    if b == b"\n" {
                        blank = true;
                    } else {
                        log.write(&mut stream, &b, &what).await;
                    }
                }
            }
        }
        if let Some(s) = samples.as_mut() {
            if let Some(rest) = l.finish() {
                keep(s, &rest);
            }
            lines = None;
        }
    }
    if let Some(rest) = lines.as_mut().and_then(Lines::finish) {
        if blank {
            log.write(&mut stream, b"\n", &what).await;
        }
        log.write(&mut stream, &rest, &what).await;
    }
    log.close(&stream).await;
    samples.map(|s| String::from_utf8_lossy(&s).into_owned())
}

impl PodProcess {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    async fn signal(&self, sig: &str) {
        let cmd = kill(sig, self.pid);
        let _ = run(
            &self.pods,
            &self.pod,
            &cmd,
            Duration::from_secs(5),
            false,
            &self.budget,
        )
        .await;
    }
}

#[async_trait::async_trait]
impl RemoteProcess for PodProcess {
    async fn stop(mut self: Box<Self>, grace: Duration) -> Stopped {
        let Some(mut ended) = self.ended.take() else {
            return Stopped::default();
        };
        let mut done = tokio::time::timeout(grace, &mut ended).await.ok();
        if done.is_none() {
            self.signal("TERM").await;
            done = tokio::time::timeout(Duration::from_secs(2), &mut ended)
                .await
                .ok();
        }
        if done.is_none() {
            self.signal("KILL").await;
            done = tokio::time::timeout(Duration::from_secs(5), ended)
                .await
                .ok();
        }
        let (exit_code, samples) = done.and_then(|j| j.ok()).unwrap_or_default();
        let what = format!("pid {}", self.pid);
        Stopped {
            exit_code,
            counters: samples.and_then(|t| counters_of(&self.pod, &what, &t)),
        }
    }

    fn has_ended(&self) -> bool {
        self.ended.as_ref().is_some_and(|e| e.is_finished())
    }

    fn abandon(&mut self) {
        // The pod goes with the run; until then, ask for the process to stop.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (pods, pod, pid) = (self.pods.clone(), self.pod.clone(), self.pid);
            let budget = self.budget.clone();
            rt.spawn(async move {
                let cmd = kill("KILL", pid);
                let _ = run(&pods, &pod, &cmd, Duration::from_secs(5), false, &budget).await;
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
    fn the_pid_line_is_found_after_an_unfinished_line() {
        assert_eq!(pid_in(b"iblab-pid 42\n"), Some((42, &b""[..])));
        assert_eq!(
            pid_in(b"Server listening iblab-pid 7\n"),
            Some((7, &b"Server listening "[..]))
        );
        assert_eq!(pid_in(b"iblab-pid x\n"), None);
        assert_eq!(pid_in(b"nothing\n"), None);
    }

    #[test]
    fn a_commands_output_is_charged_to_the_run_whole_or_cut_with_a_note() {
        // Already cut at its stream's cap, with that cut's note: kept whole while the run's
        // allowance lasts (the note is not cut again).
        let mut c = iblab_core::command::Capture::default();
        c.push(&vec![0u8; iblab_core::command::OUTPUT_CAP + 100]);
        let text = c.text();
        let run = Budget::new(64 << 20);
        let kept = charged(text.clone(), &run, "x");
        assert_eq!(kept, text);
        assert_eq!(iblab_core::command::cut_bytes(&kept), Some(100));
        assert!(run.take_cuts().is_empty());
        // Past the allowance: cut, said, reported.
        let run = Budget::new(4);
        let kept = charged("0123456789".into(), &run, "`iperf3 -c` on a, stdout");
        assert!(
            kept.starts_with("0123\n[iblab: this output was cut at the run's"),
            "{kept}"
        );
        let cuts = run.take_cuts();
        assert!(
            cuts[0].contains("`iperf3 -c` on a") && cuts[0].contains("6 bytes"),
            "{cuts:?}"
        );
    }

    #[test]
    fn deadlines_are_kept_inside_the_pod() {
        let v = under_deadline(&["iperf3".into(), "-c".into()], Duration::from_millis(2500));
        assert_eq!(v, ["timeout", "-k", "2", "2.5", "iperf3", "-c"]);
    }
}
