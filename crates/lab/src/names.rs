//! Every metric name a step can put into the evidence, in one place: the steps and fabrics
//! write them from here, the report reads them from here, and validation checks the names
//! an expression reads against [`for_step`].

// Traffic on any path.
pub const THROUGHPUT_MBPS: &str = "throughput_mbps";
pub const BYTES_RECEIVED: &str = "bytes_received";
pub const RETRANSMITS: &str = "retransmits";
pub const SENDER_CPU_PCT: &str = "sender_cpu_pct";
pub const RECEIVER_CPU_PCT: &str = "receiver_cpu_pct";
pub const MSG_RATE_MPPS: &str = "msg_rate_mpps";
pub const ITERATIONS: &str = "iterations";
pub const MSG_SIZE: &str = "msg_size";
pub const ACTIVE_MTU: &str = "active_mtu";
pub const RPING_MESSAGES: &str = "rping_messages";
pub const ROUND_TRIPS: &str = "round_trips";
pub const LATENCY_MIN_US: &str = "latency_min_us";
pub const LATENCY_TYPICAL_US: &str = "latency_typical_us";
pub const LATENCY_AVG_US: &str = "latency_avg_us";
pub const LATENCY_MAX_US: &str = "latency_max_us";
pub const LATENCY_STDEV_US: &str = "latency_stdev_us";
pub const LATENCY_P99_US: &str = "latency_p99_us";
pub const LATENCY_P99_9_US: &str = "latency_p99_9_us";
/// Path ③'s delivery, decided by the emulated subnet.
pub const DELIVERED: &str = "delivered";
pub const SWITCHES_CROSSED: &str = "switches_crossed";
/// Path ③'s admitted bytes also crossed the lab's links (rxe in the nodes carries them).
pub const CARRIED: &str = "carried";
/// A `countLinks` step: the links and switches its bytes crossed (interface counters), and
/// what each link carried.
pub const LINKS_CROSSED: &str = "links_crossed";
pub const WIRE_SWITCHES: &str = "wire_switches";
pub const LINK_BYTES: &str = "link_bytes";
/// Whether this backend carries path ③'s admitted bytes at all (rxe in the nodes), as
/// opposed to `carried`, whether this step's were.
pub const CARRIER: &str = "carrier";
/// Path ①'s transfer: the packets the RDMA devices of its two nodes sent and received
/// while it ran (none: ① uses no RDMA device), and how many devices were watched.
pub const RDMA_PACKETS: &str = "rdma_packets";
pub const RDMA_DEVICES_WATCHED: &str = "rdma_devices_watched";
/// A `capture` step: what tcpdump saw on the sender's cable. The exchange's TCP packets
/// (port 18515, perftest's out-of-band exchange), the RoCEv2 packets, whether every
/// exchange packet that carried the QP numbers came before the first RoCEv2 packet,
/// whether the QP numbers the exchange carried are those the RoCEv2 packets were sent
/// to, and the numbers themselves.
pub const EXCHANGE_TCP_PACKETS: &str = "exchange_tcp_packets";
pub const WIRE_ROCEV2_PACKETS: &str = "wire_rocev2_packets";
pub const EXCHANGE_BEFORE_RDMA: &str = "exchange_before_rdma";
pub const EXCHANGE_QPN_MATCHES: &str = "exchange_qpn_matches";
pub const EXCHANGE_QPNS: &str = "exchange_qpns";
pub const ROCEV2_DEST_QPS: &str = "rocev2_dest_qps";
/// rxe's transport counters over a step (go-back-N shows here).
pub const RECEIVER_OUT_OF_SEQUENCE: &str = "receiver_out_of_sequence";
pub const RECEIVER_DUPLICATES: &str = "receiver_duplicates";
pub const SENDER_RETRIES: &str = "sender_retries";
pub const SENDER_RETRY_EXCEEDED: &str = "sender_retry_exceeded";

/// Host counters of a side (`sender`, `receiver`) of a transfer: `<side>_<suffix>`.
pub const COUNTER_SUFFIXES: &[&str] = &[
    "data_phase_s",
    "syscalls",
    "cpu_user_s",
    "cpu_system_s",
    "context_switches",
    "syscalls_per_mib",
    "read_syscalls_per_mib",
    "write_syscalls_per_mib",
    "copied_bytes_per_mib",
    "cpu_s_per_mib",
    "context_switches_per_mib",
];

/// The name of a host counter of one side of a transfer.
pub fn counter(side: &str, suffix: &str) -> String {
    format!("{side}_{suffix}")
}

// Faults.
pub const ROCEV2_PACKETS: &str = "rocev2_packets";
pub const TCP_PACKETS: &str = "tcp_packets";
pub const DROPPED_PACKETS: &str = "dropped_packets";
/// Packets the bottlenecks dropped during one traffic step (path ③'s, through the queues
/// its credit model deepened).
pub const BOTTLENECK_DROPS: &str = "bottleneck_drops";

// Waits.
pub const ATTEMPTS: &str = "attempts";
pub const WAITED: &str = "waited";
/// A wait that ended held: when the last attempt that saw its condition false began (the
/// condition turned true between this and `waited`).
pub const WAITED_AT_LEAST: &str = "waited_at_least";

// Subnet probes (counts of ports and nodes) and subnet-manager control.
pub const PROBE_COUNTS: &[&str] = &["active", "init", "switches", "hcas"];
pub const TOOK: &str = "took";

const TRAFFIC: &[&str] = &[
    THROUGHPUT_MBPS,
    BYTES_RECEIVED,
    RETRANSMITS,
    SENDER_CPU_PCT,
    RECEIVER_CPU_PCT,
    MSG_RATE_MPPS,
    ITERATIONS,
    MSG_SIZE,
    ACTIVE_MTU,
    RPING_MESSAGES,
    ROUND_TRIPS,
    LATENCY_MIN_US,
    LATENCY_TYPICAL_US,
    LATENCY_AVG_US,
    LATENCY_MAX_US,
    LATENCY_STDEV_US,
    LATENCY_P99_US,
    LATENCY_P99_9_US,
    DELIVERED,
    SWITCHES_CROSSED,
    CARRIED,
    LINKS_CROSSED,
    WIRE_SWITCHES,
    LINK_BYTES,
    RECEIVER_OUT_OF_SEQUENCE,
    RECEIVER_DUPLICATES,
    SENDER_RETRIES,
    SENDER_RETRY_EXCEEDED,
    BOTTLENECK_DROPS,
    CARRIER,
    RDMA_PACKETS,
    RDMA_DEVICES_WATCHED,
    EXCHANGE_TCP_PACKETS,
    WIRE_ROCEV2_PACKETS,
    EXCHANGE_BEFORE_RDMA,
    EXCHANGE_QPN_MATCHES,
    EXCHANGE_QPNS,
    ROCEV2_DEST_QPS,
];

/// Every metric a step of this kind (`traffic`, `fault`, `wait`, `probe`, `sm`, `exec`,
/// `sleep`) can produce.
pub fn for_step(kind: &str) -> Vec<String> {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match kind {
        "traffic" => {
            let mut v = names(TRAFFIC);
            for side in ["sender", "receiver"] {
                v.extend(COUNTER_SUFFIXES.iter().map(|s| counter(side, s)));
            }
            v
        }
        "fault" => names(&[ROCEV2_PACKETS, TCP_PACKETS, DROPPED_PACKETS]),
        "wait" => names(&[ATTEMPTS, WAITED, WAITED_AT_LEAST]),
        "probe" => names(PROBE_COUNTS),
        "sm" => names(&[TOOK]),
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric in a captured run's evidence is in the catalogue of its step's kind.
    #[test]
    fn captured_metrics_are_all_catalogued() {
        let e: serde_json::Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/evidence/tcp-loss.json"
        ))
        .unwrap();
        let mut seen = 0;
        for step in e["steps"].as_array().unwrap() {
            let kind = step["kind"].as_str().unwrap();
            let known = for_step(kind);
            for name in step["metrics"].as_object().unwrap().keys() {
                assert!(
                    known.contains(name),
                    "{kind} step metric {name} is not catalogued"
                );
                seen += 1;
            }
        }
        assert!(seen > 10, "the fixture has metrics to check ({seen})");
    }

    #[test]
    fn counters_follow_the_side() {
        assert_eq!(
            counter("sender", "syscalls_per_mib"),
            "sender_syscalls_per_mib"
        );
        assert!(for_step("traffic").contains(&"receiver_cpu_s_per_mib".to_string()));
        assert!(for_step("exec").is_empty());
    }
}
