//! QMP, qemu's machine protocol, over the VM's control socket: enough of it to stop a
//! booted guest, save it to a file and let it run on (the booted-guest snapshot).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// Why qemu did not do what QMP asked.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("cannot reach qemu's QMP socket: {0}")]
    Unreachable(#[source] std::io::Error),
    #[error("qemu's QMP socket did not greet: {0}")]
    NoGreeting(Value),
    #[error("QMP said `{line}`: {source}")]
    Unreadable {
        line: String,
        source: serde_json::Error,
    },
    #[error("qemu closed its QMP socket")]
    Closed,
    #[error("QMP: {0}")]
    Io(#[source] std::io::Error),
    #[error("qemu did not answer on QMP in time")]
    Timeout,
    #[error("qemu refused `{command}`: {reason}")]
    Refused { command: String, reason: String },
    #[error("saving the guest failed: {0}")]
    SaveFailed(String),
    #[error("the restored guest is {0} instead of paused")]
    NotPaused(String),
}

/// A QMP session, past its greeting and capabilities negotiation.
pub struct Qmp {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
}

impl Qmp {
    /// Connect to qemu's QMP socket (made at its start) by `deadline`.
    pub async fn connect(socket: &Path, deadline: Instant) -> Result<Qmp, QmpError> {
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(QmpError::Unreachable(e));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let (rd, writer) = stream.into_split();
        let mut q = Qmp {
            lines: BufReader::new(rd).lines(),
            writer,
        };
        let greeting = q.next(deadline).await?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::NoGreeting(greeting));
        }
        q.execute("qmp_capabilities", json!({}), deadline).await?;
        Ok(q)
    }

    async fn next(&mut self, deadline: Instant) -> Result<Value, QmpError> {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                serde_json::from_str(&line).map_err(|source| QmpError::Unreadable { line, source })
            }
            Ok(Ok(None)) => Err(QmpError::Closed),
            Ok(Err(e)) => Err(QmpError::Io(e)),
            Err(_) => Err(QmpError::Timeout),
        }
    }

    /// Run one command; its `return` value (events arriving meanwhile are skipped).
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Value,
        deadline: Instant,
    ) -> Result<Value, QmpError> {
        let mut line = json!({"execute": command, "arguments": arguments}).to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(QmpError::Io)?;
        loop {
            let v = self.next(deadline).await?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(QmpError::Refused {
                    command: command.to_string(),
                    reason: e["desc"].as_str().unwrap_or("no reason given").to_string(),
                });
            }
            // An event ({"event": …}): not the answer.
        }
    }

    /// Stop the guest and write its whole state to `uri` (an `exec:` command that stores
    /// it), then let it run on. The seconds it was stopped for.
    pub async fn save_and_continue(
        &mut self,
        uri: &str,
        deadline: Instant,
    ) -> Result<f64, QmpError> {
        let t = Instant::now();
        self.execute("stop", json!({}), deadline).await?;
        // The guest is stopped: one pass over its memory, as fast as the pipe takes it
        // (qemu's default cap is a live migration's, 32 MiB/s on older releases).
        self.execute(
            "migrate-set-parameters",
            json!({"max-bandwidth": 64_u64 << 30}),
            deadline,
        )
        .await?;
        self.execute("migrate", json!({"uri": uri}), deadline)
            .await?;
        let r = loop {
            let s = self.execute("query-migrate", json!({}), deadline).await?;
            match s["status"].as_str() {
                Some("completed") => break Ok(()),
                Some("failed") | Some("cancelled") => {
                    break Err(QmpError::SaveFailed(
                        s["error-desc"]
                            .as_str()
                            .unwrap_or("qemu gave no reason")
                            .to_string(),
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        // Whether or not it was saved, the run's guest goes on.
        let cont = self.execute("cont", json!({}), deadline).await;
        r?;
        cont?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Once qemu has read the whole snapshot, let the restored guest run: it was saved
    /// stopped, so qemu keeps it paused. The seconds the load took.
    pub async fn resume_after_incoming(&mut self, deadline: Instant) -> Result<f64, QmpError> {
        let t = Instant::now();
        loop {
            let s = self.execute("query-status", json!({}), deadline).await?;
            match s["status"].as_str() {
                Some("inmigrate") => tokio::time::sleep(Duration::from_millis(25)).await,
                Some("running") => return Ok(t.elapsed().as_secs_f64()),
                Some("paused") | Some("postmigrate") | Some("prelaunch") => {
                    self.execute("cont", json!({}), deadline).await?;
                    return Ok(t.elapsed().as_secs_f64());
                }
                other => {
                    return Err(QmpError::NotPaused(
                        other.unwrap_or("in no state qemu names").to_string(),
                    ));
                }
            }
        }
    }
}
