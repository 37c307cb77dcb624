//! The operator's probes: `GET /healthz` (alive) and `GET /readyz` (connected to the API
//! server, and watching LabRuns or standing by for the leader Lease), plain HTTP/1.1, one
//! short answer per connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The answer to one request line.
pub fn answer(request: &str, ready: bool) -> (u16, &'static str) {
    let path = request.split_whitespace().nth(1).unwrap_or("");
    match path {
        "/healthz" | "/livez" => (200, "ok\n"),
        "/readyz" if ready => (200, "ready\n"),
        "/readyz" => (503, "not ready: not connected to the API server yet\n"),
        _ => (404, "not found: /healthz or /readyz\n"),
    }
}

/// Serve until the process ends.
pub async fn serve(listener: TcpListener, ready: Arc<AtomicBool>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let ready = ready.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let (code, body) = answer(&req, ready.load(Ordering::SeqCst));
            let reason = match code {
                200 => "OK",
                503 => "Service Unavailable",
                _ => "Not Found",
            };
            let resp = format!(
                "HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_flag() {
        assert_eq!(answer("GET /healthz HTTP/1.1", false).0, 200);
        assert_eq!(answer("GET /readyz HTTP/1.1", false).0, 503);
        assert_eq!(answer("GET /readyz HTTP/1.1", true).0, 200);
        assert_eq!(answer("GET / HTTP/1.1", true).0, 404);
    }
}
