//! A verbs test's cable, watched (`capture: true`): tcpdump on the sender's interface
//! while the test runs, then what it saw, in order. What a lesson reads from it: the TCP
//! connection of perftest's out-of-band exchange (the QP numbers it carried, as the text
//! each end writes) against the RoCEv2 packets that followed (the QP each was addressed to,
//! from its Base Transport Header). RoCE borrows an ordinary TCP connection to connect:
//! this shows it on the wire.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::ctx::StepCtx;
use iblab_backend::EnvError;
use iblab_core::evidence::{Metric, StepRecord};
use iblab_core::plan::{PlannedStep, Traffic};
use iblab_lab::names;
use iblab_sys::process::Background;
use iblab_tools::{perftest, tcpdump};

/// Packets tcpdump keeps at most: the exchange and the first RoCEv2 packets are what a
/// lesson reads; a whole stream's would fill the log.
const MAX_PACKETS: u32 = 400;
/// What of each packet is kept: IP, TCP and the exchange's text (about 110 bytes), or UDP
/// and the Base Transport Header.
const SNAPLEN: u32 = 256;

/// tcpdump watching the sender's cable, started before the test's server.
pub struct Capture {
    process: Background,
    node: String,
    log: PathBuf,
    rel: String,
    iface: String,
    port: u16,
}

/// The sender's interface toward `to_address` (the planner gives every segment a /24).
fn interface_toward(ctx: &StepCtx<'_>, from: &str, to_address: &str) -> Option<String> {
    let segment = |a: &str| a.rsplit_once('.').map(|x| x.0.to_string());
    ctx.plan
        .nodes
        .iter()
        .find(|n| n.name == from)?
        .interfaces
        .iter()
        .find(|i| {
            i.address
                .as_deref()
                .is_some_and(|a| segment(a.split('/').next().unwrap_or(a)) == segment(to_address))
        })
        .map(|i| i.name.clone())
}

/// The packet sockets open in `node`'s network namespace (`/proc/net/packet`, one line
/// each after its header): tcpdump listens once it has opened one.
async fn packet_sockets(ctx: &StepCtx<'_>, node: &str) -> Result<usize, EnvError> {
    let c = iblab_core::command::Cmd::new(&[super::CAT, "/proc/net/packet"]).may_fail();
    let out = ctx.backend.exec(node, &c, Duration::from_secs(10)).await?;
    Ok(out
        .stdout
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count())
}

/// Start tcpdump on `t.from`'s interface toward `t.to`, for the exchange's TCP `port` and
/// RoCEv2, and wait until it listens: until its packet socket shows in the node's
/// `/proc/net/packet` (at most 5 s; a capture that never showed one is kept anyway, and
/// what it saw tells).
pub async fn start(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    port: u16,
) -> Result<Capture, EnvError> {
    let iface = interface_toward(ctx, &t.from, &t.to_address).ok_or_else(|| {
        EnvError::new(format!(
            "capture: {} has no interface on {}'s segment",
            t.from, t.to_address
        ))
    })?;
    let argv: Vec<String> = [
        super::TCPDUMP,
        "-i",
        &iface,
        "-n",
        "-tt",
        "-x",
        "-l",
        "-s",
        &SNAPLEN.to_string(),
        "-c",
        &MAX_PACKETS.to_string(),
        // tcpdump drops to its own user by default; the nodes have none.
        "-Z",
        "root",
        &format!("tcp port {port} or udp port {}", tcpdump::ROCEV2_PORT),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (rel, log) = ctx.log_file(step, "tcpdump");
    let open = packet_sockets(ctx, &t.from).await?;
    let process = ctx.backend.spawn(&t.from, &argv, &log, ctx.state).await?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && packet_sockets(ctx, &t.from).await? <= open {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Capture {
        process,
        node: t.from.clone(),
        log,
        rel,
        iface,
        port,
    })
}

/// What the capture saw, read into `rec` (metrics and `facts`), with the QP number the
/// client printed for its peer (`client_output`) to hold it against.
pub async fn finish(
    cap: Capture,
    rec: &mut StepRecord,
    client_output: &str,
    client_ip: &str,
) -> Result<(), EnvError> {
    // tcpdump ends on its own after MAX_PACKETS; else it is stopped (SIGTERM flushes it).
    let _ = cap.process.finish(Duration::from_millis(500)).await;
    let text = std::fs::read_to_string(&cap.log).unwrap_or_default();
    if let Some(why) = tcpdump::never_listened(&text) {
        // Not a cable that carried nothing: one nobody could watch here.
        let why = format!("tcpdump could not watch {}'s cable: {why}", cap.node);
        for name in WATCHED {
            rec.unobserved.insert(name.to_string(), why.clone());
        }
        rec.detail["capture"] = json!({"log": cap.rel, "error": why});
        return Ok(());
    }
    let seen = match tcpdump::parse(&text) {
        Ok(p) => read(&p, cap.port, client_ip, perftest::qpns(client_output).1),
        Err(e) => {
            rec.detail["capture"] = json!({"log": cap.rel, "error": e.to_string()});
            return Ok(());
        }
    };
    for (name, value, unit) in [
        (
            names::EXCHANGE_TCP_PACKETS,
            seen.exchange_packets,
            "packets",
        ),
        (names::WIRE_ROCEV2_PACKETS, seen.rocev2_packets, "packets"),
    ] {
        rec.metrics
            .insert(name.into(), Metric::new(value as f64, unit));
    }
    let facts = json!({
        names::EXCHANGE_BEFORE_RDMA: seen.before,
        names::EXCHANGE_QPN_MATCHES: seen.matches,
        names::EXCHANGE_QPNS: seen.exchange_qpns,
        names::ROCEV2_DEST_QPS: seen.dest_qps,
    });
    crate::ctx::merge_facts(rec, facts);
    rec.detail["capture"] = json!({
        "log": cap.rel,
        "interface": cap.iface,
        "filter": format!("tcp port {} or udp port {}", cap.port, tcpdump::ROCEV2_PORT),
        "peer_qpn_printed_by_client": seen.printed,
        "timeline": seen.timeline,
    });
    Ok(())
}

/// Every figure a capture gives a lab.
const WATCHED: [&str; 6] = [
    names::EXCHANGE_TCP_PACKETS,
    names::WIRE_ROCEV2_PACKETS,
    names::EXCHANGE_BEFORE_RDMA,
    names::EXCHANGE_QPN_MATCHES,
    names::EXCHANGE_QPNS,
    names::ROCEV2_DEST_QPS,
];

/// What a lesson reads off the captured packets.
#[derive(Debug, Default, PartialEq)]
pub struct Seen {
    pub exchange_packets: u64,
    pub rocev2_packets: u64,
    /// Every exchange packet that carried a key came before the first RoCEv2 packet (and
    /// there was one of each).
    pub before: bool,
    /// The client's RoCEv2 packets went to the QP number the server sent it over TCP (and
    /// that perftest printed for its peer, where it printed one), and the first of them
    /// carried the packet sequence number the client had sent the server: the exchange's
    /// two random-looking numbers, seen again in the transport headers.
    pub matches: bool,
    pub exchange_qpns: Vec<u32>,
    pub dest_qps: Vec<u32>,
    pub printed: Option<u32>,
    /// The first packets, in words, with their time since the first one.
    pub timeline: Vec<String>,
}

pub fn read(packets: &[tcpdump::Packet], port: u16, client_ip: &str, printed: Option<u32>) -> Seen {
    let mut seen = Seen {
        printed,
        ..Seen::default()
    };
    let t0 = packets.first().map(|p| p.time).unwrap_or(0.0);
    let mut qpns = BTreeSet::new();
    let mut dest = BTreeSet::new();
    // The first key each end sent: (client's, server's).
    let mut keys: (Option<perftest::ExchangeKey>, Option<perftest::ExchangeKey>) = (None, None);
    let mut first_psn = None::<u32>;
    let mut last_key_at = None::<f64>;
    let mut first_roce_at = None::<f64>;
    for p in packets {
        let line = |what: String| format!("+{:.6} s {what}", p.time - t0);
        let (src, dst) = p.addresses().unwrap_or_default();
        if let Some((sp, dp)) = p.ports()
            && p.protocol() == Some(6)
            && (sp == port || dp == port)
        {
            seen.exchange_packets += 1;
            let payload = p.tcp_payload().unwrap_or(&[]);
            let found = perftest::exchange_keys(payload);
            if let Some(k) = found.first() {
                last_key_at = Some(p.time);
                let slot = if src == client_ip {
                    &mut keys.0
                } else {
                    &mut keys.1
                };
                slot.get_or_insert(*k);
            }
            qpns.extend(found.iter().map(|k| k.qpn));
            if seen.timeline.len() < 24 {
                seen.timeline.push(line(format!(
                    "TCP {src}:{sp} → {dst}:{dp} flags 0x{:02x}, {} bytes{}",
                    p.tcp_flags().unwrap_or(0),
                    payload.len(),
                    match found.first() {
                        Some(k) => format!(": carries QPN 0x{:06x}, PSN 0x{:06x}", k.qpn, k.psn),
                        None => String::new(),
                    }
                )));
            }
        } else if let Some(bth) = p.bth() {
            seen.rocev2_packets += 1;
            first_roce_at.get_or_insert(p.time);
            if src == client_ip {
                dest.insert(bth.dest_qp);
                first_psn.get_or_insert(bth.psn);
            }
            if seen.timeline.len() < 24 {
                seen.timeline.push(line(format!(
                    "RoCEv2 {src} → {dst}: {} to QP 0x{:06x}, PSN 0x{:06x}",
                    bth.opcode_name(),
                    bth.dest_qp,
                    bth.psn
                )));
            }
        }
    }
    seen.exchange_qpns = qpns.iter().copied().collect();
    seen.dest_qps = dest.iter().copied().collect();
    seen.before = matches!((last_key_at, first_roce_at), (Some(k), Some(r)) if k < r);
    seen.matches = match keys {
        (Some(client), Some(server)) => {
            dest.len() == 1
                && dest.contains(&server.qpn)
                && first_psn == Some(client.psn)
                && printed.is_none_or(|q| q == server.qpn)
        }
        _ => false,
    };
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured() -> Vec<tcpdump::Packet> {
        tcpdump::parse(include_str!(
            "../../../../tests/fixtures/tools/tcpdump_send_lat_tcp_exchange.txt"
        ))
        .unwrap()
    }

    /// ib_send_lat with `exchange: tcp` between two namespaces of the vm backend's guest,
    /// a's cable captured: the TCP connection to 18515 first, every key in it before the
    /// first RoCEv2 packet, which went to the QP number the server sent and carried the
    /// PSN the client sent.
    #[test]
    fn the_exchange_comes_first_and_its_numbers_come_back() {
        let p = captured();
        let seen = read(&p, 18515, "198.18.0.1", Some(0x11));
        assert_eq!(seen.exchange_packets, 25, "{seen:#?}");
        assert_eq!(seen.rocev2_packets, 15);
        assert!(seen.before && seen.matches, "{seen:#?}");
        assert_eq!(seen.exchange_qpns, vec![0x11]);
        assert_eq!(seen.dest_qps, vec![0x11]);
        assert!(
            seen.timeline[0].contains("flags 0x02"),
            "{:?}",
            seen.timeline
        );
    }

    /// Each claim fails on a capture that does not show it.
    #[test]
    fn a_capture_without_the_story_does_not_tell_it() {
        let p = captured();
        // Another QP number printed by perftest than the one that went over TCP.
        assert!(!read(&p, 18515, "198.18.0.1", Some(0x12)).matches);
        // The exchange on another port: no TCP exchange seen at all.
        let other = read(&p, 18516, "198.18.0.1", None);
        assert_eq!(other.exchange_packets, 0);
        assert!(!other.before && !other.matches);
        // Only the RoCEv2 packets, the TCP connection cut out: nothing came first.
        let roce: Vec<_> = p.iter().filter(|x| x.bth().is_some()).cloned().collect();
        let seen = read(&roce, 18515, "198.18.0.1", None);
        assert!(!seen.before && !seen.matches);
        // The RoCEv2 packets first, the exchange after: not before.
        let mut late = roce.clone();
        late.extend(
            p.iter()
                .filter(|x| x.bth().is_none())
                .map(|x| tcpdump::Packet {
                    time: x.time + 100.0,
                    bytes: x.bytes.clone(),
                }),
        );
        assert!(!read(&late, 18515, "198.18.0.1", None).before);
    }
}
