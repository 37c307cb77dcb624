//! Before any step: does every Ethernet segment carry frames between its nodes? One ping
//! of a full-size frame (the link's MTU) from the segment's first node to each of the
//! others, retried until a deadline (a looped segment's spanning tree may still be
//! settling); at the deadline a small ping tells a silent link from one that drops only
//! full-size frames. A segment that stays silent is
//! an environment error named by its nodes, with what each node's interfaces counted
//! written to `logs/links.log`: better than every later step timing out without a word.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use iblab_backend::{Deployment, EnvError};
use iblab_core::command::Cmd;
use iblab_core::plan::{Plan, PlannedNode};

/// How long a segment may take to carry its first frame.
const DEADLINE: Duration = Duration::from_secs(20);

/// One check: `from` pings `to_addr` (an address of `to`).
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub from: String,
    pub to: String,
    pub to_addr: String,
    /// The MTU of `from`'s interface on the segment.
    pub mtu: u32,
}

/// The probes of a plan: per segment (nodes' addresses sharing a /24), the first node
/// to every other node. Switch ports have no address and take no part.
pub fn probes(nodes: &[PlannedNode]) -> Vec<Probe> {
    let mut segments: BTreeMap<String, Vec<(String, String, u32)>> = BTreeMap::new();
    for n in nodes.iter().filter(|n| !n.switch) {
        for i in &n.interfaces {
            let Some(addr) = i.address.as_deref() else {
                continue;
            };
            let ip = addr.split('/').next().unwrap_or(addr);
            let net = ip.rsplit_once('.').map(|(net, _)| net).unwrap_or(ip);
            segments.entry(net.to_string()).or_default().push((
                n.name.clone(),
                ip.to_string(),
                i.mtu,
            ));
        }
    }
    let mut out = Vec::new();
    for members in segments.values() {
        let Some((first, _, mtu)) = members.first() else {
            continue;
        };
        for (node, ip, _) in members.iter().skip(1) {
            out.push(Probe {
                from: first.clone(),
                to: node.clone(),
                to_addr: ip.clone(),
                mtu: *mtu,
            });
        }
    }
    out
}

/// What the check starts in the nodes: a ping per probe, and `ip` for what a silent
/// segment's nodes see.
pub fn programs(plan: &Plan, needs: &mut iblab_core::programs::Needs) {
    use iblab_core::programs::Place;
    if probes(&plan.nodes).is_empty() {
        return;
    }
    if let Some(p) = ping("198.18.0.1", 64).argv.first() {
        needs.add(Place::Nodes, p.as_str(), "the link check");
    }
    for c in diagnostics() {
        if let Some(p) = c.argv.first() {
            needs.add(Place::Nodes, p.as_str(), "the link check's diagnostics");
        }
    }
}

/// A ping whose IPv4 packet is `bytes` long (20 bytes of IP and 8 of ICMP header).
fn ping(addr: &str, bytes: u32) -> Cmd {
    let payload = bytes.saturating_sub(28).max(8).to_string();
    Cmd {
        argv: ["ping", "-n", "-c", "1", "-W", "1", "-s", &payload, addr]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        stdin: None,
        may_fail: true,
    }
}

/// Run every probe until it answers or the deadline passes. Returns how long it took.
pub async fn check(
    plan: &Plan,
    backend: &dyn Deployment,
    run_dir: &Path,
) -> Result<Duration, EnvError> {
    let started = Instant::now();
    let mut pending = probes(&plan.nodes);
    while !pending.is_empty() {
        let mut still = Vec::new();
        for p in pending {
            let out = backend
                .exec(&p.from, &ping(&p.to_addr, p.mtu), Duration::from_secs(5))
                .await?;
            if !out.success() {
                still.push(p);
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
        if started.elapsed() > DEADLINE {
            let mut said = Vec::new();
            for p in &pending {
                let small = backend
                    .exec(&p.from, &ping(&p.to_addr, 64), Duration::from_secs(5))
                    .await?;
                said.push(if small.success() {
                    format!(
                        "{} reaches {} at {} with small frames but not with full-size ones \
                         ({} bytes): frames are dropped on the way (an MTU mismatch?)",
                        p.from, p.to, p.to_addr, p.mtu
                    )
                } else {
                    format!("{} cannot reach {} at {}", p.from, p.to, p.to_addr)
                });
            }
            let log = run_dir.join("logs/links.log");
            write_diagnostics(plan, backend, &pending, &log).await;
            return Err(EnvError::new(format!(
                "the lab's links carry no frames after {}s: {} (each node's interface \
                 counters are in logs/links.log)",
                DEADLINE.as_secs(),
                said.join("; ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(started.elapsed())
}

/// What a node of a silent segment is asked: its interfaces with counters, addresses,
/// neighbours.
fn diagnostics() -> Vec<Cmd> {
    [
        &["ip", "-s", "link", "show"][..],
        &["ip", "addr", "show"],
        &["ip", "neigh", "show"],
    ]
    .iter()
    .map(|argv| Cmd {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        may_fail: true,
    })
    .collect()
}

/// What each node involved in a silent segment sees: interfaces with counters, neighbours.
async fn write_diagnostics(plan: &Plan, backend: &dyn Deployment, silent: &[Probe], log: &Path) {
    let mut text = String::new();
    let mut nodes: Vec<&str> = silent
        .iter()
        .flat_map(|p| [p.from.as_str(), p.to.as_str()])
        .collect();
    nodes.sort();
    nodes.dedup();
    for node in nodes {
        for cmd in diagnostics() {
            text.push_str(&iblab_sys::process::transcript(
                &format!("{node}: {}", cmd.argv.join(" ")),
                backend.exec(node, &cmd, Duration::from_secs(5)).await,
            ));
        }
    }
    text.push_str(&backend.host_side_diagnostics(plan).await);
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(log, text);
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::plan::Interface;

    fn node(name: &str, switch: bool, addrs: &[&str]) -> PlannedNode {
        PlannedNode {
            name: name.into(),
            switch,
            interfaces: addrs
                .iter()
                .enumerate()
                .map(|(k, a)| Interface {
                    name: format!("eth{k}"),
                    link: format!("l{k}"),
                    address: (!a.is_empty()).then(|| a.to_string()),
                    mtu: 1500,
                })
                .collect(),
            stp: false,
        }
    }

    #[test]
    fn one_probe_per_other_member_of_each_segment() {
        let nodes = vec![
            node("a", false, &["198.18.0.1/24", "198.18.1.1/24"]),
            node("sw1", true, &["", ""]),
            node("b", false, &["198.18.0.2/24"]),
            node("c", false, &["198.18.0.3/24", "198.18.1.3/24"]),
        ];
        let got: Vec<(String, String, String)> = probes(&nodes)
            .into_iter()
            .map(|p| (p.from, p.to, p.to_addr))
            .collect();
        let want = [
            ("a", "b", "198.18.0.2"),
            ("a", "c", "198.18.0.3"),
            ("a", "c", "198.18.1.3"),
        ];
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0.as_str(), g.1.as_str(), g.2.as_str()), w);
        }
    }
}
