//! `iblab exec` and `iblab shell` into a VM of a kept run, from a second iblab: through
//! the guest agent's channel (the Unix socket qemu bridges to the guest's virtio-serial
//! port), which the run's `iblab up` let go of when it ended. The channel is a stream of
//! lines, not a terminal: a command's output is streamed and its exit code passed
//! through, but there is no pty for full-screen programs.

use std::io::{IsTerminal, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::agent::proto::{Body, Op, Request, Response};
use iblab_core::exit;

/// How long a guest command may run before the agent kills it.
const DEADLINE: Duration = Duration::from_secs(3600);
/// How long the agent gets to answer a first request: qemu serves one client at a time,
/// so a channel someone else holds answers nothing.
const FIRST_ANSWER: Duration = Duration::from_secs(20);

/// What the line shell prints first, so nobody expects a terminal.
pub fn no_terminal_notice(run: &str, node: &str) -> String {
    format!(
        "{node} is a VM reached through iblab's guest agent, which gives no terminal: each line \
         you type runs on its own as `sh -c LINE` (cd and variables do not carry over; \
         full-screen programs such as vi or top do not work). `iblab exec {run} {node} -- CMD` \
         runs one command. Leave with `exit` or Ctrl-D."
    )
}

/// Why a command could not be run through the agent's channel.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(
        "cannot reach the VM's agent at {}: {source} (is the run still up?)",
        .socket.display()
    )]
    Unreachable {
        socket: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    #[error("the VM's agent channel closed: {0}")]
    Write(#[source] std::io::Error),
    #[error("the VM's agent channel closed")]
    Closed,
    #[error("reading from the VM's agent: {0}")]
    Read(#[source] std::io::Error),
    /// Another client holds the channel (qemu serves one at a time).
    #[error(
        "{node}'s agent did not answer within {}s: its channel serves one client at a \
         time, and another holds it (the run's `iblab up` while it still runs, or \
         another `iblab exec`/`shell` on {node}); try again when that ends",
        FIRST_ANSWER.as_secs()
    )]
    Held { node: String },
    #[error("the agent did not answer within 20s")]
    NoAnswer,
    #[error("unexpected answer from the agent: {0:?}")]
    Unexpected(Box<Body>),
    #[error("reading the terminal: {0}")]
    Terminal(#[source] std::io::Error),
}

struct Channel {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
    next: u64,
    /// The node's network namespace in the guest, where every command runs.
    netns: Option<String>,
}

impl Channel {
    async fn open(socket: &Path, netns: Option<&str>) -> Result<Channel, AttachError> {
        let stream =
            UnixStream::connect(socket)
                .await
                .map_err(|source| AttachError::Unreachable {
                    socket: socket.to_path_buf(),
                    source,
                })?;
        let (rd, wr) = stream.into_split();
        // Answers to an earlier client's requests may still come: ids of our own, far
        // from theirs (which count from 1), tell ours apart.
        let base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | (1 << 62);
        Ok(Channel {
            lines: BufReader::new(rd).lines(),
            writer: wr,
            next: base,
            netns: netns.map(str::to_string),
        })
    }

    async fn send(&mut self, op: Op) -> Result<u64, AttachError> {
        let id = self.next;
        self.next += 1;
        let mut line = serde_json::to_string(&Request { id, op }).map_err(AttachError::Encode)?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(AttachError::Write)?;
        Ok(id)
    }

    /// The next answer to request `id` (others are dropped).
    async fn answer(&mut self, id: u64) -> Result<Body, AttachError> {
        loop {
            match self.lines.next_line().await {
                Ok(Some(line)) => {
                    if let Ok(r) = serde_json::from_str::<Response>(&line)
                        && r.id == id
                    {
                        return Ok(r.body);
                    }
                }
                Ok(None) => return Err(AttachError::Closed),
                Err(e) => return Err(AttachError::Read(e)),
            }
        }
    }

    /// Check that the agent answers at all (nobody else holds the channel).
    async fn ready(&mut self, node: &str) -> Result<(), AttachError> {
        let id = self
            .send(Op::Run {
                argv: vec!["true".into()],
                stdin: None,
                timeout_ms: 5000,
                netns: self.netns.clone(),
            })
            .await?;
        match tokio::time::timeout(FIRST_ANSWER, self.answer(id)).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(AttachError::Held {
                node: node.to_string(),
            }),
        }
    }

    /// Run one command to its end and return what it printed (nothing streamed).
    async fn output(&mut self, argv: &[&str]) -> Result<String, AttachError> {
        let id = self
            .send(Op::Run {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                stdin: None,
                timeout_ms: 10_000,
                netns: self.netns.clone(),
            })
            .await?;
        match tokio::time::timeout(Duration::from_secs(20), self.answer(id)).await {
            Ok(Ok(Body::Done { stdout, .. })) => Ok(stdout),
            Ok(Ok(other)) => Err(AttachError::Unexpected(Box::new(other))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(AttachError::NoAnswer),
        }
    }

    /// Run one command, its output copied here as it comes; Ctrl-C kills it in the guest.
    /// Returns its exit code (128 + N for a signal N, as shells do).
    async fn exec(&mut self, argv: Vec<String>, stdin: Option<String>) -> Result<i32, AttachError> {
        let id = self
            .send(Op::Exec {
                argv,
                stdin,
                timeout_ms: DEADLINE.as_millis() as u64,
                netns: self.netns.clone(),
            })
            .await?;
        let mut interrupted = false;
        loop {
            let body = tokio::select! {
                b = self.answer(id) => b?,
                _ = tokio::signal::ctrl_c(), if !interrupted => {
                    interrupted = true;
                    self.send(Op::Cancel { of: id }).await?;
                    continue;
                }
            };
            match body {
                Body::Output { stream, data } => {
                    let r = if stream == "stderr" {
                        let mut e = std::io::stderr();
                        e.write_all(data.as_bytes()).and_then(|_| e.flush())
                    } else {
                        let mut o = std::io::stdout();
                        o.write_all(data.as_bytes()).and_then(|_| o.flush())
                    };
                    if r.is_err() {
                        // Our reader went away: stop the command too.
                        self.send(Op::Cancel { of: id }).await?;
                    }
                }
                Body::Exited {
                    exit_code,
                    signal,
                    timed_out,
                } => {
                    if timed_out {
                        eprintln!(
                            "iblab: killed in the guest after {}s (the agent's deadline)",
                            DEADLINE.as_secs()
                        );
                    }
                    return Ok(match (exit_code, signal) {
                        (Some(c), _) => c,
                        (None, Some(s)) => 128 + s,
                        (None, None) => 1,
                    });
                }
                // The program could not be started (not in the image).
                Body::Error { message } => {
                    eprintln!("{message}");
                    return Ok(127);
                }
                // Answers to our Cancel come under their own id; nothing else is expected.
                other => return Err(AttachError::Unexpected(Box::new(other))),
            }
        }
    }
}

/// Stdin handed to a command when it is a pipe or a file (read to its end, as the agent
/// takes a command's input whole); a terminal or nothing is not read.
fn piped_stdin() -> Option<String> {
    let meta = std::fs::metadata("/dev/stdin").ok()?;
    let ft = meta.file_type();
    if std::io::stdin().is_terminal() || !(ft.is_fifo() || ft.is_file()) {
        return None;
    }
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).ok()?;
    Some(text)
}

/// `iblab attach SOCKET [--netns NODE] -- ARGV`: run one command in the VM (in the node's
/// network namespace); `--lines NODE`: the line shell (`run` names the run in what it
/// tells the user).
pub fn main(
    socket: &Path,
    netns: Option<&str>,
    lines: Option<&str>,
    run: &str,
    argv: &[String],
) -> i32 {
    let rt = match iblab_sys::interrupt::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let node = lines.unwrap_or("the node");
    let r = rt.block_on(async {
        let mut ch = Channel::open(socket, netns).await?;
        ch.ready(node).await?;
        match lines {
            None => {
                let mut stdin = piped_stdin();
                // `sh` reading a script (`iblab shell` with no terminal): the image's
                // programs first, as in the line shell.
                if let (Some(text), [sh]) = (&stdin, argv)
                    && sh == "sh"
                {
                    let preamble = ch.output(&["sh", "-c", PREFER_PROGRAMS]).await?;
                    stdin = Some(format!("{preamble}{text}"));
                }
                ch.exec(argv.to_vec(), stdin).await
            }
            Some(node) => line_shell(&mut ch, run, node).await,
        }
    });
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            exit::ENVIRONMENT
        }
    }
}

/// Shell functions that make the image's own programs win over busybox's applets of the
/// same name (busybox's sh runs its applets first: `ip` would be busybox's, not iproute2's).
const PREFER_PROGRAMS: &str = r#"l=" $(busybox --list 2>/dev/null | tr "\n" " ") "
for f in /usr/sbin/* /usr/bin/*; do
  [ -L "$f" ] && continue; n=${f##*/}
  case "$n" in busybox|*[!A-Za-z0-9_]*) continue;; esac
  case "$l" in *" $n "*) echo "$n() { $f \"\$@\"; }";; esac
done"#;

/// Read lines, run each as `sh -c LINE` in the guest; the last one's exit code is ours.
async fn line_shell(ch: &mut Channel, run: &str, node: &str) -> Result<i32, AttachError> {
    let tty = std::io::stdin().is_terminal();
    if tty {
        eprintln!("{}", no_terminal_notice(run, node));
    }
    let preamble = ch.output(&["sh", "-c", PREFER_PROGRAMS]).await?;
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut last = 0;
    loop {
        if tty {
            eprint!("{node}# ");
            let _ = std::io::stderr().flush();
        }
        let line = tokio::select! {
            l = input.next_line() => l.map_err(AttachError::Terminal)?,
            _ = tokio::signal::ctrl_c() => {
                eprintln!();
                continue;
            }
        };
        let Some(line) = line else {
            if tty {
                eprintln!();
            }
            return Ok(last);
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "exit" || line.starts_with("exit ") {
            return Ok(line[4..].trim().parse().unwrap_or(last));
        }
        let script = format!("{preamble}{line}");
        last = ch
            .exec(vec!["sh".into(), "-c".into(), script], None)
            .await?;
    }
}
