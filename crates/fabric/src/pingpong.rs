//! `iblab pingpong`: a TCP ping-pong of small messages, the kernel-socket counterpart of
//! `ib_send_lat` on path tcp. The client prints round-trip statistics as JSON (µs).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Round-trip times in microseconds, named as perftest names them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub bytes: usize,
    pub iterations: usize,
    pub t_min: f64,
    pub t_max: f64,
    /// The median, perftest's "typical".
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p99_9: f64,
}

/// Statistics of round-trip samples (µs); `None` without samples.
pub fn stats(bytes: usize, samples: &[f64]) -> Option<Stats> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let avg = s.iter().sum::<f64>() / n as f64;
    let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    let pct = |p: f64| s[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    Some(Stats {
        bytes,
        iterations: n,
        t_min: s[0],
        t_max: s[n - 1],
        t_typical: s[n / 2],
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: pct(0.99),
        p99_9: pct(0.999),
    })
}

/// A byte sequence (xorshift64*) seeded from the clock and the process: what each message
/// carries.
struct Bytes(u64);

impl Bytes {
    fn seeded() -> Bytes {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Bytes((t ^ (u64::from(std::process::id()) << 32)) | 1)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// What stopped a ping-pong, with the socket's own error where there is one.
#[derive(Debug, thiserror::Error)]
pub enum PingPongError {
    #[error("cannot listen on {at}: {source}")]
    Listen { at: String, source: std::io::Error },
    #[error("no client within {wait:?}: {source}")]
    NoClient {
        wait: Duration,
        source: std::io::Error,
    },
    #[error("cannot connect to {at}: {source}")]
    Connect { at: String, source: std::io::Error },
    /// Setting the socket up (blocking mode, no delay).
    #[error("{0}")]
    Socket(#[source] std::io::Error),
    #[error("read: {0}")]
    Read(#[source] std::io::Error),
    #[error("write: {0}")]
    Write(#[source] std::io::Error),
    #[error(
        "round trip {round} came back with other bytes than were sent: whatever answers \
         on {at} is not iblab's ping-pong"
    )]
    NotEchoed { round: usize, at: String },
    #[error("no round trip measured")]
    NoRoundTrip,
    #[error("give exactly one of --listen ADDR:PORT or --connect ADDR:PORT")]
    Usage,
}

/// Serve one client: echo `count` messages of `size` bytes.
fn serve(listen: &str, count: usize, size: usize, wait: Duration) -> Result<(), PingPongError> {
    let l = TcpListener::bind(listen).map_err(|source| PingPongError::Listen {
        at: listen.into(),
        source,
    })?;
    l.set_nonblocking(true).map_err(PingPongError::Socket)?;
    let deadline = Instant::now() + wait;
    let mut conn = loop {
        match l.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(source) => return Err(PingPongError::NoClient { wait, source }),
        }
    };
    conn.set_nonblocking(false).map_err(PingPongError::Socket)?;
    conn.set_nodelay(true).map_err(PingPongError::Socket)?;
    let mut buf = vec![0u8; size];
    for _ in 0..count {
        conn.read_exact(&mut buf).map_err(PingPongError::Read)?;
        conn.write_all(&buf).map_err(PingPongError::Write)?;
    }
    Ok(())
}

/// Connect (retrying while the server starts) and time `count` round trips.
fn client(
    connect: &str,
    count: usize,
    size: usize,
    wait: Duration,
) -> Result<Stats, PingPongError> {
    let deadline = Instant::now() + wait;
    let mut conn = loop {
        match TcpStream::connect(connect) {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("connect {connect}: {e}");
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(source) => {
                return Err(PingPongError::Connect {
                    at: connect.into(),
                    source,
                });
            }
        }
    };
    conn.set_nodelay(true).map_err(PingPongError::Socket)?;
    let mut out = vec![0u8; size];
    let mut back = vec![0u8; size];
    let mut samples = Vec::with_capacity(count);
    // Each message differs (a sequence drawn from this run's seed): only a server that
    // received it can send it back, so replies sent ahead of time never pass for round
    // trips.
    let mut bytes = Bytes::seeded();
    for i in 0..count {
        bytes.fill(&mut out);
        let t = Instant::now();
        conn.write_all(&out).map_err(PingPongError::Write)?;
        conn.read_exact(&mut back).map_err(PingPongError::Read)?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        if back != out {
            return Err(PingPongError::NotEchoed {
                round: i + 1,
                at: connect.into(),
            });
        }
    }
    stats(size, &samples).ok_or(PingPongError::NoRoundTrip)
}

/// Entry point of the hidden `iblab pingpong` subcommand.
pub fn main(
    listen: Option<&str>,
    connect: Option<&str>,
    count: usize,
    size: usize,
    wait_s: f64,
) -> i32 {
    let wait = Duration::from_secs_f64(wait_s.max(0.1));
    let size = size.max(1);
    let r = match (listen, connect) {
        (Some(l), None) => serve(l, count, size, wait).map(|_| None),
        (None, Some(c)) => client(c, count, size, wait).map(Some),
        _ => Err(PingPongError::Usage),
    };
    match r {
        Ok(Some(s)) => {
            println!("{}", serde_json::to_string(&s).unwrap_or_default());
            0
        }
        Ok(None) => 0,
        Err(e) => {
            eprintln!("pingpong: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_like_perftest() {
        let samples: Vec<f64> = (1..=1000).map(|x| x as f64).collect();
        let s = stats(2, &samples).unwrap();
        assert_eq!(s.t_min, 1.0);
        assert_eq!(s.t_max, 1000.0);
        assert_eq!(s.t_typical, 501.0);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p99_9, 999.0);
        assert!((s.t_avg - 500.5).abs() < 1e-9);
        assert!(stats(2, &[]).is_none());
    }

    #[test]
    fn round_trips_over_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let a = addr.clone();
        let t = std::thread::spawn(move || serve(&a, 50, 2, Duration::from_secs(5)));
        let s = client(&addr, 50, 2, Duration::from_secs(5)).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(s.iterations, 50);
        assert!(s.t_min > 0.0 && s.t_min <= s.t_typical && s.t_typical <= s.t_max);
    }

    /// A squatter on the port that sends every reply at once (no round trip at all) is
    /// named, never timed.
    #[test]
    fn replies_sent_ahead_of_the_messages_are_refused() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let _ = c.write_all(&[0x5au8; 50 * 2]);
            std::thread::sleep(Duration::from_millis(200));
        });
        let e = client(&addr, 50, 2, Duration::from_secs(5)).unwrap_err();
        assert!(
            matches!(e, PingPongError::NotEchoed { round: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("not iblab's ping-pong"), "{e}");
        t.join().unwrap();
    }
}
