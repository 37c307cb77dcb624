//! What iblab's backends share. ip(8) batch lines that wire a plan's topology: veth pairs
//! between node namespaces, then loopback, bridges, ports and addresses inside each node;
//! and the check that every link has carrier, and (where a segment has a loop) that
//! spanning tree has settled. For every backend whose nodes or switches are network
//! namespaces: local, docker, and the vm backend's switches. And [`bundle`]: iblab itself for
//! nodes that do not share this host's files.

pub mod bundle;

use std::time::Duration;

use iblab_backend::{Deployment, EnvError};
use iblab_core::command::Cmd;
use iblab_core::plan::{Plan, PlannedNode};

/// What the wiring runs in the nodes, for backends that wire through it: `ip` (batches,
/// link states), and `bridge` where a switch runs spanning tree.
pub fn programs(plan: &Plan, needs: &mut iblab_core::programs::Needs, by: &str) {
    use iblab_core::programs::Place;
    needs.add(Place::Nodes, IP, by);
    if plan.nodes.iter().any(|n| n.stp) {
        needs.add(Place::Nodes, BRIDGE, by);
    }
}

const BRIDGE: &str = "bridge";

/// iproute2's `ip`, on this host and in the nodes.
pub const IP: &str = "ip";

/// Run `ip -batch -` on this host with the given lines (in namespace `ns` when given).
pub async fn ip_batch(ns: Option<&str>, lines: &[String]) -> Result<(), EnvError> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut argv: Vec<String> = vec![IP.into()];
    if let Some(ns) = ns {
        argv.extend(["-n".into(), ns.to_string()]);
    }
    argv.extend(["-batch".into(), "-".into()]);
    let script = lines.join("\n") + "\n";
    let out = iblab_sys::process::run(&argv, Some(&script), Duration::from_secs(30))
        .await
        .map_err(|e| EnvError::not_started(format!("cannot run ip (iproute2): {e}"), e))?;
    if !out.success() {
        return Err(EnvError::new(format!(
            "provisioning failed: `{}` said: {}",
            argv.join(" "),
            out.stderr.trim()
        )));
    }
    Ok(())
}

/// Wait until every interface of `nodes` reports carrier (operstate UP) and, on switches
/// whose segment has a loop, spanning tree has settled, asking each node through the
/// backend's own way in. The first step then never meets a link still coming up.
pub async fn wait_links_up(
    backend: &dyn Deployment,
    nodes: &[&PlannedNode],
) -> Result<(), EnvError> {
    // Spanning tree needs two forward delays (listening, learning) before it forwards.
    let limit = if nodes.iter().any(|n| n.stp) { 20 } else { 5 };
    let deadline = std::time::Instant::now() + Duration::from_secs(limit);
    let cmd = |argv: &[&str]| Cmd {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        may_fail: false,
    };
    let (ip, bridge) = (
        cmd(&[IP, "-j", "link", "show"]),
        cmd(&[BRIDGE, "-j", "link", "show"]),
    );
    loop {
        let shown = futures_util::future::join_all(nodes.iter().map(|n| {
            let (ip, bridge) = (&ip, &bridge);
            async move {
                let out = backend.exec(&n.name, ip, Duration::from_secs(5)).await?;
                let mut down = links_down(n, &out.stdout);
                if n.stp {
                    let out = backend
                        .exec(&n.name, bridge, Duration::from_secs(5))
                        .await?;
                    down.extend(stp_unsettled(n, &out.stdout));
                }
                Ok::<_, EnvError>(down)
            }
        }))
        .await;
        let mut down = Vec::new();
        for s in shown {
            down.extend(s?);
        }
        if down.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(EnvError::new(format!(
                "links did not come up within {limit}s: {}",
                down.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `ip -batch` lines, run on the host, that create every link of the plan as a veth pair
/// whose ends are made directly inside their nodes' namespaces. `netns` names a node's
/// namespace the way `ip link … netns X` accepts it (a name under /run/netns, or a pid).
///
/// Each end gets an ifindex unique in the lab: in fresh namespaces both ends would get the
/// same one, and a veth whose ifindex equals its peer's announces its carrier through
/// linkwatch up to a second late, during which a bridge does not forward on the port.
pub fn veth_lines(plan: &Plan, netns: impl Fn(&str) -> String) -> Vec<String> {
    plan.links
        .iter()
        .enumerate()
        .map(|(k, l)| {
            let [(a, ia), (b, ib)] = &l.ends;
            format!(
                "link add {ia} netns {} index {} mtu {m} gso_max_segs 1 type veth peer name {ib} netns {} index {} mtu {m} gso_max_segs 1",
                netns(a),
                100 + 2 * k,
                netns(b),
                101 + 2 * k,
                m = l.mtu
            )
        })
        .collect()
}

/// Interfaces of `n` that `ip -j link show` (run inside it) does not report as UP. A
/// tunnel (VXLAN) has no carrier of its own: its operstate stays UNKNOWN, and it is up
/// when it is administratively up with its lower layer up.
pub fn links_down(n: &PlannedNode, ip_json: &str) -> Vec<String> {
    let links: Vec<serde_json::Value> = serde_json::from_str(ip_json).unwrap_or_default();
    let up = |l: &serde_json::Value| {
        let flag = |f: &str| {
            l["flags"]
                .as_array()
                .is_some_and(|fs| fs.iter().any(|x| x == f))
        };
        l["operstate"] == "UP" || (l["operstate"] == "UNKNOWN" && flag("UP") && flag("LOWER_UP"))
    };
    n.interfaces
        .iter()
        .filter(|i| {
            !links
                .iter()
                .any(|l| l["ifname"] == i.name.as_str() && up(l))
        })
        .map(|i| format!("{}:{}", n.name, i.name))
        .collect()
}

/// Ports of a spanning-tree switch that have not settled yet (listening, learning), from
/// `bridge -j link show` run inside it.
pub fn stp_unsettled(n: &PlannedNode, bridge_json: &str) -> Vec<String> {
    let ports: Vec<serde_json::Value> = serde_json::from_str(bridge_json).unwrap_or_default();
    ports
        .iter()
        .filter(|p| {
            matches!(
                p["state"].as_str(),
                Some("listening" | "learning" | "disabled") | None
            )
        })
        .map(|p| {
            format!(
                "{}:{} (spanning tree: {})",
                n.name,
                p["ifname"].as_str().unwrap_or("?"),
                p["state"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// `ip -batch` lines, run inside a node, that bring up loopback, make a switch's bridge and
/// its ports, and give a host's interfaces their addresses. No route is added: the only
/// routes are the connected /24s, so nothing can leave the lab.
pub fn node_lines(n: &PlannedNode) -> Vec<String> {
    let mut lines = vec!["link set lo up".to_string()];
    if n.switch {
        // Kernel STP with its shortest timers where the segment has a loop: ~4 s to settle.
        lines.push(if n.stp {
            "link add br0 type bridge stp_state 1 forward_delay 200 hello_time 100 max_age 600"
                .into()
        } else {
            "link add br0 type bridge".into()
        });
        lines.push("link set br0 up".into());
        for i in &n.interfaces {
            lines.push(format!("link set {} master br0", i.name));
        }
    }
    for i in &n.interfaces {
        if let Some(a) = &i.address {
            lines.push(format!("addr add {a} dev {}", i.name));
        }
        lines.push(format!("link set {} up", i.name));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::plan::Interface;

    #[test]
    fn carrier_from_ip_json() {
        let n = PlannedNode {
            name: "sw1".into(),
            switch: true,
            stp: false,
            interfaces: ["p1", "p2"]
                .iter()
                .map(|i| Interface {
                    name: i.to_string(),
                    link: "l".into(),
                    address: None,
                    mtu: 1500,
                })
                .collect(),
        };
        // Trimmed from `ip -j link show` in a switch container.
        let json = r#"[{"ifindex":1,"ifname":"lo","operstate":"UNKNOWN"},{"ifindex":100,"ifname":"p1","operstate":"UP"},{"ifindex":102,"ifname":"p2","operstate":"LOWERLAYERDOWN"}]"#;
        assert_eq!(links_down(&n, json), vec!["sw1:p2".to_string()]);
        // Trimmed from `bridge -j link show` on a looped segment, 2 s into spanning tree.
        let stp = r#"[{"ifindex":101,"ifname":"p1","master":"br0","state":"learning"},{"ifindex":103,"ifname":"p2","master":"br0","state":"blocking"},{"ifindex":105,"ifname":"p3","master":"br0","state":"forwarding"}]"#;
        assert_eq!(
            stp_unsettled(&n, stp),
            vec!["sw1:p1 (spanning tree: learning)".to_string()]
        );
    }
}
