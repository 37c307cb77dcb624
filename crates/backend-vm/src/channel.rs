//! The host end of the agent channel: a Unix socket that qemu bridges to the guest's
//! virtio-serial port; requests go out as JSON lines, answers are matched by id.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::oneshot;

use crate::agent::proto::{Body, Op, Request, Response};

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Body>>>>;

/// Why the guest agent did not answer.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot reach {}: {source}", .socket.display())]
    Unreachable {
        socket: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the VM closed its agent channel before the agent said hello")]
    ClosedBeforeHello,
    #[error("the guest agent did not start in time")]
    NoHello,
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    #[error("the agent channel is closed: {0}")]
    Write(#[source] std::io::Error),
    /// The connection ended while a request waited: the VM is gone.
    #[error("the VM went away (agent channel closed)")]
    Gone,
    #[error("the guest agent did not answer within {:.0}s", .0.as_secs_f64())]
    NoAnswer(Duration),
}

impl iblab_backend::BackendError for AgentError {
    fn env_kind(&self) -> iblab_backend::EnvKind {
        use iblab_backend::EnvKind;
        match self {
            AgentError::ClosedBeforeHello | AgentError::Write(_) | AgentError::Gone => {
                EnvKind::NodeGone
            }
            AgentError::Unreachable { .. } | AgentError::NoHello | AgentError::NoAnswer(_) => {
                EnvKind::Unreachable
            }
            AgentError::Encode(_) => EnvKind::Other,
        }
    }
}

/// A connected agent.
pub struct Agent {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Agent {
    /// Connect to qemu's socket and wait for the agent's hello (the guest has booted).
    pub async fn connect(socket: &Path, deadline: Instant) -> Result<(Agent, Body), AgentError> {
        let (agent, hello_rx) = Agent::open(socket, deadline).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        // On an error the agent is dropped, which stops its reader.
        match tokio::time::timeout(left, hello_rx).await {
            Ok(Ok(h)) => Ok((agent, h)),
            Ok(Err(_)) => Err(AgentError::ClosedBeforeHello),
            Err(_) => Err(AgentError::NoHello),
        }
    }

    /// Connect to the agent of a guest restored from a snapshot: it said its hello before
    /// it was saved, so none comes; its first answer tells that it runs.
    pub async fn attach(socket: &Path, deadline: Instant) -> Result<Agent, AgentError> {
        Agent::open(socket, deadline).await.map(|(agent, _)| agent)
    }

    /// Connect to qemu's socket and start reading answers; the agent's hello arrives on
    /// the receiver.
    async fn open(
        socket: &Path,
        deadline: Instant,
    ) -> Result<(Agent, oneshot::Receiver<Body>), AgentError> {
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(source) if Instant::now() > deadline => {
                    return Err(AgentError::Unreachable {
                        socket: socket.to_path_buf(),
                        source,
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let (rd, wr) = stream.into_split();
        let pending: Pending = Arc::default();
        let (hello_tx, hello_rx) = oneshot::channel();
        let p = pending.clone();
        let reader = tokio::spawn(async move {
            let mut hello_tx = Some(hello_tx);
            let mut lines = BufReader::new(rd).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(r) = serde_json::from_str::<Response>(&line) else {
                    tracing::warn!("agent sent a line that is not a response: {line}");
                    continue;
                };
                if r.id == 0 {
                    if let (Body::Hello { .. }, Some(tx)) = (&r.body, hello_tx.take()) {
                        let _ = tx.send(r.body);
                    } else {
                        tracing::warn!("agent: {:?}", r.body);
                    }
                    continue;
                }
                let waiter = p.lock().ok().and_then(|mut m| m.remove(&r.id));
                if let Some(w) = waiter {
                    let _ = w.send(r.body);
                }
            }
            // The connection ended: every waiter learns it through its dropped sender.
            if let Ok(mut m) = p.lock() {
                m.clear();
            }
        });
        let agent = Agent {
            writer: tokio::sync::Mutex::new(wr),
            pending,
            next: AtomicU64::new(1),
            reader,
        };
        Ok((agent, hello_rx))
    }

    /// Send a request and wait (up to `wait`) for its answer.
    pub async fn call(&self, op: Op, wait: Duration) -> Result<Body, AgentError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.pending.lock() {
            m.insert(id, tx);
        }
        let mut line = serde_json::to_string(&Request { id, op }).map_err(AgentError::Encode)?;
        line.push('\n');
        {
            let mut w = self.writer.lock().await;
            w.write_all(line.as_bytes())
                .await
                .map_err(AgentError::Write)?;
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(_)) => Err(AgentError::Gone),
            Err(_) => {
                if let Ok(mut m) = self.pending.lock() {
                    m.remove(&id);
                }
                Err(AgentError::NoAnswer(wait))
            }
        }
    }
}
