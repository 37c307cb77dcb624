//! The operator's probes: `GET /healthz` (alive) and `GET /readyz` (connected to the API
//! server, and watching LabRuns or standing by for the leader Lease; its answer also says
//! whether the cluster enforces NetworkPolicy, as probed, and with
//! `--require-network-policy` it is ready only once that is known to hold), plain
//! HTTP/1.1, one short answer per connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What readiness reports of NetworkPolicy, and whether it is required to hold.
#[derive(Debug, Default)]
pub struct Policy {
    /// The probe's line (`None`: not probed yet).
    pub found: Mutex<Option<(bool, String)>>,
    pub required: bool,
}

/// The answer to one request line: `ready` (connected), and the NetworkPolicy probe's
/// finding (enforced?, its line) once there is one.
pub fn answer(
    request: &str,
    ready: bool,
    policy: Option<&(bool, String)>,
    required: bool,
) -> (u16, String) {
    let path = request.split_whitespace().nth(1).unwrap_or("");
    let netpol = match policy {
        Some((_, line)) => format!("networkpolicy: {line}\n"),
        None => "networkpolicy: not probed yet\n".into(),
    };
    match path {
        "/healthz" | "/livez" => (200, "ok\n".into()),
        "/readyz" if !ready => (
            503,
            format!("not ready: not connected to the API server yet\n{netpol}"),
        ),
        "/readyz" if required && !policy.is_some_and(|(enforced, _)| *enforced) => (
            503,
            format!("not ready: --require-network-policy, and it is not known to hold\n{netpol}"),
        ),
        "/readyz" => (200, format!("ready\n{netpol}")),
        _ => (404, "not found: /healthz or /readyz\n".into()),
    }
}

/// Serve until the process ends.
pub async fn serve(listener: TcpListener, ready: Arc<AtomicBool>, policy: Arc<Policy>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let (ready, policy) = (ready.clone(), policy.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let found = policy
                .found
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let (code, body) = answer(
                &req,
                ready.load(Ordering::SeqCst),
                found.as_ref(),
                policy.required,
            );
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
        assert_eq!(answer("GET /healthz HTTP/1.1", false, None, false).0, 200);
        assert_eq!(answer("GET /readyz HTTP/1.1", false, None, false).0, 503);
        assert_eq!(answer("GET /readyz HTTP/1.1", true, None, false).0, 200);
        assert_eq!(answer("GET / HTTP/1.1", true, None, false).0, 404);
    }

    #[test]
    fn readiness_says_what_the_network_policy_probe_found_and_may_require_it() {
        let enforced = (true, "enforced: …".to_string());
        let open = (false, "NOT enforced: …".to_string());
        let (code, body) = answer("GET /readyz HTTP/1.1", true, Some(&open), false);
        assert_eq!(code, 200);
        assert!(body.contains("networkpolicy: NOT enforced"), "{body}");
        assert_eq!(
            answer("GET /readyz HTTP/1.1", true, Some(&open), true).0,
            503
        );
        assert_eq!(answer("GET /readyz HTTP/1.1", true, None, true).0, 503);
        let (code, body) = answer("GET /readyz HTTP/1.1", true, Some(&enforced), true);
        assert_eq!(code, 200);
        assert!(body.contains("networkpolicy: enforced"), "{body}");
    }
}
