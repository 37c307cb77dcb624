//! ip(8) batch lines that wire a plan's topology: veth pairs between node namespaces, then
//! loopback, bridges, ports and addresses inside each node; and the check that every link
//! has carrier. For every backend whose nodes are network namespaces (the docker backend
//! uses it; the local backend has the same lines inline and can move onto these).

use crate::plan::{Plan, PlannedNode};

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

/// Interfaces of `n` that `ip -j link show` (run inside it) does not report as UP.
pub fn links_down(n: &PlannedNode, ip_json: &str) -> Vec<String> {
    let links: Vec<serde_json::Value> = serde_json::from_str(ip_json).unwrap_or_default();
    n.interfaces
        .iter()
        .filter(|i| {
            !links
                .iter()
                .any(|l| l["ifname"] == i.name.as_str() && l["operstate"] == "UP")
        })
        .map(|i| format!("{}:{}", n.name, i.name))
        .collect()
}

/// `ip -batch` lines, run inside a node, that bring up loopback, make a switch's bridge and
/// its ports, and give a host's interfaces their addresses. No route is added: the only
/// routes are the connected /24s, so nothing can leave the lab.
pub fn node_lines(n: &PlannedNode) -> Vec<String> {
    let mut lines = vec!["link set lo up".to_string()];
    if n.switch {
        lines.push("link add br0 type bridge".into());
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
    use crate::plan::Interface;

    #[test]
    fn carrier_from_ip_json() {
        let n = PlannedNode {
            name: "sw1".into(),
            switch: true,
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
    }
}
