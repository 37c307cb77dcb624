//! Link faults: the commands that put loss, a rate limit or an outage on one interface,
//! and take them off again.

use serde::Serialize;

use crate::command::Cmd;

/// How random loss is made on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossMechanism {
    /// `tc qdisc … netem loss P%` (sch_netem).
    Netem,
    /// nftables on the interface's netdev egress hook: `numgen random mod 10000 < N drop`,
    /// for kernels built without sch_netem.
    NftRandomDrop,
}

impl LossMechanism {
    pub fn describe(self) -> &'static str {
        match self {
            LossMechanism::Netem => "tc netem loss (sch_netem)",
            LossMechanism::NftRandomDrop => {
                "nftables random drop on the netdev egress hook (this kernel has no sch_netem)"
            }
        }
    }
}

/// What is on an interface's egress now; faults are re-applied as a whole.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Shaping {
    pub loss_percent: Option<f64>,
    /// Rate in bits per second and the queue in bytes.
    pub rate: Option<(u64, u64)>,
}

fn nft_table(iface: &str) -> String {
    format!("iblab_{}", iface.replace('-', "_"))
}

fn count_table(iface: &str) -> String {
    format!("iblab_count_{}", iface.replace('-', "_"))
}

/// Commands that start counting what leaves an interface: RoCEv2 (UDP to port 4791) and TCP.
pub fn count(iface: &str) -> Vec<Cmd> {
    let script = format!(
        "table netdev {t} {{\n  chain egress {{\n    type filter hook egress device \"{iface}\" priority -10;\n    udp dport 4791 counter\n    meta l4proto tcp counter\n  }}\n}}\n",
        t = count_table(iface)
    );
    vec![
        Cmd::new(&["nft", "delete", "table", "netdev", &count_table(iface)]).may_fail(),
        Cmd {
            argv: vec!["nft".into(), "-f".into(), "-".into()],
            stdin: Some(script),
            may_fail: false,
        },
    ]
}

/// Commands that read, then remove, the counting of [`count`].
pub fn read_count(iface: &str) -> Vec<Cmd> {
    vec![
        Cmd::new(&["nft", "-j", "list", "table", "netdev", &count_table(iface)]).may_fail(),
        Cmd::new(&["nft", "delete", "table", "netdev", &count_table(iface)]).may_fail(),
    ]
}

/// (RoCEv2 packets, TCP packets) counted, from `nft -j list table` of [`count`].
pub fn counts_from(nft_json: &str) -> (u64, u64) {
    let mut out = (0, 0);
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(nft_json)
        && let Some(items) = v.get("nftables").and_then(|n| n.as_array())
    {
        for item in items {
            let Some(exprs) = item.pointer("/rule/expr").and_then(|e| e.as_array()) else {
                continue;
            };
            let text = serde_json::to_string(exprs).unwrap_or_default();
            let packets: u64 = exprs
                .iter()
                .filter_map(|e| e.pointer("/counter/packets").and_then(|p| p.as_u64()))
                .sum();
            if text.contains("4791") {
                out.0 += packets;
            } else if text.contains("\"tcp\"") {
                out.1 += packets;
            }
        }
    }
    out
}

/// Commands that remove whatever shaping an interface has.
pub fn clear(iface: &str) -> Vec<Cmd> {
    vec![
        Cmd::new(&["tc", "qdisc", "del", "dev", iface, "root"]).may_fail(),
        Cmd::new(&["nft", "delete", "table", "netdev", &nft_table(iface)]).may_fail(),
    ]
}

/// Commands that read the drop counters of an interface (`tc -s -j`, `nft -j`).
pub fn counters(iface: &str) -> Vec<Cmd> {
    vec![
        Cmd::new(&["tc", "-s", "-j", "qdisc", "show", "dev", iface]).may_fail(),
        Cmd::new(&["nft", "-j", "list", "table", "netdev", &nft_table(iface)]).may_fail(),
    ]
}

/// Packets dropped by iblab's shaping, from the outputs of [`counters`].
pub fn dropped_from(tc_json: &str, nft_json: &str) -> u64 {
    let mut total = 0;
    if let Ok(serde_json::Value::Array(qdiscs)) = serde_json::from_str::<serde_json::Value>(tc_json)
    {
        for q in qdiscs {
            if matches!(
                q.get("kind").and_then(|k| k.as_str()),
                Some("tbf" | "netem")
            ) {
                total += q.get("drops").and_then(|d| d.as_u64()).unwrap_or(0);
            }
        }
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(nft_json)
        && let Some(items) = v.get("nftables").and_then(|n| n.as_array())
    {
        for item in items {
            if let Some(exprs) = item.pointer("/rule/expr").and_then(|e| e.as_array()) {
                for e in exprs {
                    total += e
                        .pointer("/counter/packets")
                        .and_then(|p| p.as_u64())
                        .unwrap_or(0);
                }
            }
        }
    }
    total
}

/// Bytes still queued in iblab's shaping, from `tc -s -j qdisc show` (see [`counters`]).
pub fn backlog_from(tc_json: &str) -> u64 {
    match serde_json::from_str::<serde_json::Value>(tc_json) {
        Ok(serde_json::Value::Array(qdiscs)) => qdiscs
            .iter()
            .filter(|q| {
                matches!(
                    q.get("kind").and_then(|k| k.as_str()),
                    Some("tbf" | "netem")
                )
            })
            .filter_map(|q| q.get("backlog").and_then(|b| b.as_u64()))
            .sum(),
        _ => 0,
    }
}

/// Commands that make an interface's egress what `s` says (after [`clear`]).
pub fn apply(iface: &str, s: &Shaping, mech: LossMechanism) -> Vec<Cmd> {
    let mut out = clear(iface);
    if let Some((bps, queue)) = s.rate {
        // A burst of at least one full frame, else tbf refuses to pass anything.
        let burst = (bps / 8 / 250).max(3200);
        out.push(Cmd::new(&[
            "tc",
            "qdisc",
            "add",
            "dev",
            iface,
            "root",
            "handle",
            "1:",
            "tbf",
            "rate",
            &format!("{bps}bit"),
            "burst",
            &burst.to_string(),
            "limit",
            &queue.to_string(),
        ]));
    }
    if let Some(p) = s.loss_percent {
        match mech {
            LossMechanism::Netem => {
                let parent: &[&str] = if s.rate.is_some() {
                    &["parent", "1:1"]
                } else {
                    &["root"]
                };
                let mut argv = vec!["tc", "qdisc", "add", "dev", iface];
                argv.extend_from_slice(parent);
                let pct = format!("{p}%");
                argv.extend_from_slice(&["handle", "10:", "netem", "loss", &pct]);
                out.push(Cmd::new(&argv));
            }
            LossMechanism::NftRandomDrop => {
                let threshold = ((p * 100.0).round() as u64).clamp(1, 10000);
                let script = format!(
                    "table netdev {t} {{\n  chain egress {{\n    type filter hook egress device \"{iface}\" priority 0;\n    numgen random mod 10000 < {threshold} counter drop\n  }}\n}}\n",
                    t = nft_table(iface)
                );
                out.push(Cmd {
                    argv: vec!["nft".into(), "-f".into(), "-".into()],
                    stdin: Some(script),
                    may_fail: false,
                });
            }
        }
    }
    out
}

/// Commands that take an interface down or up.
pub fn set_link(iface: &str, up: bool) -> Vec<Cmd> {
    vec![Cmd::new(&[
        "ip",
        "link",
        "set",
        "dev",
        iface,
        if up { "up" } else { "down" },
    ])]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_loss_is_per_ten_thousand_on_egress() {
        let cmds = apply(
            "eth0",
            &Shaping {
                loss_percent: Some(1.5),
                rate: None,
            },
            LossMechanism::NftRandomDrop,
        );
        let script = cmds.last().unwrap().stdin.clone().unwrap();
        assert!(script.contains("hook egress device \"eth0\""), "{script}");
        assert!(script.contains("< 150 counter drop"), "{script}");
    }

    #[test]
    fn netem_sits_under_tbf_when_both() {
        let cmds = apply(
            "p1",
            &Shaping {
                loss_percent: Some(1.0),
                rate: Some((100_000_000, 16384)),
            },
            LossMechanism::Netem,
        );
        let last = cmds.last().unwrap().argv.join(" ");
        assert_eq!(
            last,
            "tc qdisc add dev p1 parent 1:1 handle 10: netem loss 1%"
        );
    }

    #[test]
    fn reads_the_queued_bytes_of_a_bottleneck() {
        // `tc -s -j qdisc show dev p1` in a guest's switch namespace, during an iperf3
        // stream through a 20 Mbit/s tbf with a 4 MB queue, then after it.
        let busy = r#"[{"kind":"tbf","handle":"8001:","root":true,"refcnt":3,"options":{"rate":2500000,"burst":3212,"lat":1598715},"bytes":5337793,"packets":3536,"drops":0,"overlimits":10506,"requeues":0,"backlog":7570,"qlen":5}]"#;
        let idle = r#"[{"kind":"tbf","handle":"8001:","root":true,"refcnt":3,"options":{"rate":2500000,"burst":3212,"lat":1598715},"bytes":7440040,"packets":4932,"drops":0,"overlimits":14638,"requeues":0,"backlog":0,"qlen":0}]"#;
        assert_eq!(backlog_from(busy), 7570);
        assert_eq!(backlog_from(idle), 0);
        assert_eq!(backlog_from("[]"), 0);
        assert_eq!(backlog_from("Cannot find device"), 0);
    }

    #[test]
    fn counts_drops_from_real_nft_json() {
        let nft = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"rule": {"family": "netdev", "table": "iblab_v1", "chain": "egress", "handle": 2, "expr": [{"match": {"op": "<", "left": {"numgen": {"mode": "random", "mod": 10000, "offset": 0}}, "right": 200}}, {"counter": {"packets": 550, "bytes": 32910144}}, {"drop": null}]}}]}"#;
        assert_eq!(dropped_from("", nft), 550);
        let tc = r#"[{"kind":"tbf","handle":"1:","root":true,"bytes":1,"packets":1,"drops":7,"overlimits":0,"requeues":0,"backlog":0,"qlen":0}]"#;
        assert_eq!(dropped_from(tc, ""), 7);
    }
}
