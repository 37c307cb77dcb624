//! iperf3 `-J` (JSON) output: throughput, retransmissions and CPU of both ends.

use serde::Deserialize;

/// What one iperf3 client run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Iperf3Result {
    pub seconds: f64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Goodput as the receiver counted it, bits per second.
    pub received_bps: f64,
    pub sent_bps: f64,
    /// TCP retransmissions on the sender (Linux reports them).
    pub retransmits: Option<u64>,
    /// CPU use of the client (sender) and the server, percent of one host.
    pub sender_cpu_pct: f64,
    pub receiver_cpu_pct: f64,
    pub streams: usize,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Iperf3Error {
    #[error("iperf3 printed no JSON: {0}")]
    NotJson(String),
    #[error("iperf3 reported: {0}")]
    Reported(String),
    #[error("iperf3 JSON lacks the end summary (`end.{0}`)")]
    Missing(&'static str),
}

#[derive(Deserialize)]
struct Doc {
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    end: Option<End>,
}

#[derive(Deserialize)]
struct End {
    #[serde(default)]
    streams: Vec<serde_json::Value>,
    sum_sent: Option<Sum>,
    sum_received: Option<Sum>,
    cpu_utilization_percent: Option<Cpu>,
}

#[derive(Deserialize)]
struct Sum {
    seconds: f64,
    bytes: u64,
    bits_per_second: f64,
    #[serde(default)]
    retransmits: Option<u64>,
}

#[derive(Deserialize)]
struct Cpu {
    host_total: f64,
    remote_total: f64,
}

/// Parse the client's `iperf3 -c … -J` output.
pub fn parse(json: &str) -> Result<Iperf3Result, Iperf3Error> {
    let doc: Doc = serde_json::from_str(json).map_err(|e| {
        let head: String = json.chars().take(120).collect();
        Iperf3Error::NotJson(format!("{e}: {head}"))
    })?;
    if let Some(err) = doc.error {
        return Err(Iperf3Error::Reported(err));
    }
    let end = doc.end.ok_or(Iperf3Error::Missing("end"))?;
    let sent = end.sum_sent.ok_or(Iperf3Error::Missing("sum_sent"))?;
    let recv = end
        .sum_received
        .ok_or(Iperf3Error::Missing("sum_received"))?;
    let cpu = end
        .cpu_utilization_percent
        .ok_or(Iperf3Error::Missing("cpu_utilization_percent"))?;
    Ok(Iperf3Result {
        seconds: recv.seconds,
        bytes_sent: sent.bytes,
        bytes_received: recv.bytes,
        received_bps: recv.bits_per_second,
        sent_bps: sent.bits_per_second,
        retransmits: sent.retransmits,
        sender_cpu_pct: cpu.host_total,
        receiver_cpu_pct: cpu.remote_total,
        streams: end.streams.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_clean_run() {
        let r = parse(include_str!("../tests/fixtures/iperf3_client_ok.json")).unwrap();
        assert_eq!(r.bytes_received, 3065249792);
        assert!((r.received_bps - 12215794620.008657).abs() < 1.0);
        assert_eq!(r.retransmits, Some(3598));
        assert!((r.sender_cpu_pct - 34.44960518818816).abs() < 1e-9);
        assert!((r.receiver_cpu_pct - 36.52922270067131).abs() < 1e-9);
        assert_eq!(r.streams, 1);
    }

    #[test]
    fn lossy_run_shows_less_goodput_and_more_retransmits() {
        let clean = parse(include_str!("../tests/fixtures/iperf3_client_ok.json")).unwrap();
        let lossy = parse(include_str!(
            "../tests/fixtures/iperf3_client_loss2pct.json"
        ))
        .unwrap();
        assert!(lossy.received_bps < clean.received_bps * 0.6);
        assert_eq!(lossy.retransmits, Some(23599));
    }

    #[test]
    fn counts_parallel_streams() {
        let r = parse(include_str!(
            "../tests/fixtures/iperf3_client_2streams.json"
        ))
        .unwrap();
        assert_eq!(r.streams, 2);
        assert!(r.received_bps > 0.0);
    }

    #[test]
    fn reports_the_tools_own_error() {
        let e = parse(include_str!("../tests/fixtures/iperf3_client_refused.json")).unwrap_err();
        assert_eq!(
            e,
            Iperf3Error::Reported("unable to connect to server: Connection refused".into())
        );
    }

    #[test]
    fn rejects_non_json() {
        assert!(matches!(
            parse("iperf3: error - unable to connect"),
            Err(Iperf3Error::NotJson(_))
        ));
    }
}
