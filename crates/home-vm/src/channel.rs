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
    pub async fn connect(socket: &Path, deadline: Instant) -> Result<(Agent, Body), String> {
        let (agent, hello_rx) = Agent::open(socket, deadline).await?;
        let left = deadline.saturating_duration_since(Instant::now());
        // On an error the agent is dropped, which stops its reader.
        match tokio::time::timeout(left, hello_rx).await {
            Ok(Ok(h)) => Ok((agent, h)),
            Ok(Err(_)) => Err("the VM closed its agent channel before the agent said hello".into()),
            Err(_) => Err("the guest agent did not start in time".into()),
        }
    }

    /// Connect to the agent of a guest restored from a snapshot: it said its hello before
    /// it was saved, so none comes; its first answer tells that it runs.
    pub async fn attach(socket: &Path, deadline: Instant) -> Result<Agent, String> {
        Agent::open(socket, deadline).await.map(|(agent, _)| agent)
    }

    /// Connect to qemu's socket and start reading answers; the agent's hello arrives on
    /// the receiver.
    async fn open(
        socket: &Path,
        deadline: Instant,
    ) -> Result<(Agent, oneshot::Receiver<Body>), String> {
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("cannot reach {}: {e}", socket.display()));
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
    pub async fn call(&self, op: Op, wait: Duration) -> Result<Body, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.pending.lock() {
            m.insert(id, tx);
        }
        let mut line = serde_json::to_string(&Request { id, op }).map_err(|e| e.to_string())?;
        line.push('\n');
        {
            let mut w = self.writer.lock().await;
            w.write_all(line.as_bytes())
                .await
                .map_err(|e| format!("the agent channel is closed: {e}"))?;
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(_)) => Err("the VM went away (agent channel closed)".into()),
            Err(_) => {
                if let Ok(mut m) = self.pending.lock() {
                    m.remove(&id);
                }
                Err(format!(
                    "the guest agent did not answer within {:.0}s",
                    wait.as_secs_f64()
                ))
            }
        }
    }
}
