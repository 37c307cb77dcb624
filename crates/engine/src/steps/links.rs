//! Which links and switches a measurement crossed, from every node's interface byte
//! counters read before and after it (`cat /proc/net/dev` in each node): the wire a path's
//! bytes took, told by the counters rather than assumed from the plan.

use std::collections::BTreeMap;
use std::time::Duration;

use iblab_core::command::Cmd;
use iblab_core::plan::Plan;
use iblab_lab::names;
use iblab_tools::netdev::{self, Bytes};
use serde_json::json;

use iblab_backend::EnvError;
use iblab_fabric::ctx::StepCtx;

/// What a node's interfaces had carried, by (node, interface).
pub type Counters = BTreeMap<(String, String), Bytes>;

/// The command that reads a node's interface counters.
pub fn read_cmd() -> Cmd {
    Cmd {
        argv: vec!["cat".into(), "/proc/net/dev".into()],
        stdin: None,
        may_fail: true,
    }
}

/// Every node's interface counters now, switches included.
pub async fn read(ctx: &StepCtx<'_>) -> Result<Counters, EnvError> {
    let cmd = read_cmd();
    let backend = ctx.backend;
    let read = futures_util::future::join_all(ctx.plan.nodes.iter().map(|n| {
        let cmd = &cmd;
        async move {
            backend
                .exec(&n.name, cmd, Duration::from_secs(10))
                .await
                .map(|o| (n.name.clone(), netdev::parse(&o.stdout).unwrap_or_default()))
        }
    }))
    .await;
    let mut out = Counters::new();
    for r in read {
        let (node, ifaces) = r?;
        for (iface, b) in ifaces {
            out.insert((node.clone(), iface), b);
        }
    }
    Ok(out)
}

/// Below this many bytes a link carried no measurement (ARP, spanning tree, neighbour
/// discovery are a few hundred bytes a second).
const MIN_BYTES: u64 = 16 * 1024;

/// What crossed where between two readings.
#[derive(Debug, Clone, PartialEq)]
pub struct Crossed {
    /// Bytes each link carried (the most either end counted, sent or received).
    pub bytes: BTreeMap<String, u64>,
    /// Links that carried the measurement: at least half of what the busiest link carried,
    /// and at least [`MIN_BYTES`].
    pub links: Vec<String>,
    /// Switches with two or more crossed links: the measurement went through them.
    pub switches: Vec<String>,
}

/// The links and switches the bytes between `before` and `after` crossed.
pub fn crossed(plan: &Plan, before: &Counters, after: &Counters) -> Crossed {
    let delta = |end: &(String, String)| -> u64 {
        let (Some(a), b) = (after.get(end), before.get(end).copied().unwrap_or_default()) else {
            return 0;
        };
        a.rx.saturating_sub(b.rx).max(a.tx.saturating_sub(b.tx))
    };
    let bytes: BTreeMap<String, u64> = plan
        .links
        .iter()
        .map(|l| (l.name.clone(), delta(&l.ends[0]).max(delta(&l.ends[1]))))
        .collect();
    let busiest = bytes.values().copied().max().unwrap_or(0);
    let links: Vec<String> = bytes
        .iter()
        .filter(|(_, b)| **b >= MIN_BYTES && **b * 2 >= busiest)
        .map(|(l, _)| l.clone())
        .collect();
    let switches = plan
        .nodes
        .iter()
        .filter(|n| n.switch)
        .filter(|n| {
            plan.links
                .iter()
                .filter(|l| {
                    links.contains(&l.name) && l.ends.iter().any(|(node, _)| *node == n.name)
                })
                .count()
                >= 2
        })
        .map(|n| n.name.clone())
        .collect();
    Crossed {
        bytes,
        links,
        switches,
    }
}

/// Put what crossed into a step record's facts: `links_crossed`, `wire_switches` and
/// `link_bytes` read as `steps.ID.PATH.<fact>`.
pub fn record(rec: &mut iblab_core::evidence::StepRecord, c: &Crossed) {
    if !rec.detail.is_object() {
        rec.detail = json!({});
    }
    let Some(d) = rec.detail.as_object_mut() else {
        return;
    };
    let facts = d.entry("facts").or_insert_with(|| json!({}));
    if let Some(f) = facts.as_object_mut() {
        f.insert(names::LINKS_CROSSED.into(), json!(c.links));
        f.insert(names::WIRE_SWITCHES.into(), json!(c.switches));
        f.insert(names::LINK_BYTES.into(), json!(c.bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::plan::{Interface, PlannedLink, PlannedNode};

    fn node(name: &str, switch: bool, ifaces: &[&str]) -> PlannedNode {
        PlannedNode {
            name: name.into(),
            switch,
            interfaces: ifaces
                .iter()
                .map(|i| Interface {
                    name: i.to_string(),
                    link: String::new(),
                    address: None,
                    mtu: 1500,
                })
                .collect(),
            stp: false,
        }
    }

    fn link(name: &str, a: (&str, &str), b: (&str, &str)) -> PlannedLink {
        PlannedLink {
            name: name.into(),
            ends: [(a.0.into(), a.1.into()), (b.0.into(), b.1.into())],
            mtu: 1500,
            segment: 0,
        }
    }

    /// a and b on sw1, c on sw2 (sw1–sw2 joined): a transfer a → b crosses a-sw1, b-sw1
    /// and sw1 only; the spare links' spanning-tree chatter does not count.
    #[test]
    fn the_links_that_carried_the_bytes_are_crossed() {
        let lab = iblab_lab::load::resolve("lesson2").unwrap();
        let req = iblab_core::plan::Request {
            backend: "local".into(),
            paths: Some(vec![iblab_lab::PathKind::Tcp]),
            ..Default::default()
        };
        let mut plan = iblab_core::plan::plan(
            &lab,
            &req,
            &iblab_core::caps::HostCaps::for_tests(),
            &iblab_core::plan::backend::testing::backends(),
        )
        .unwrap();
        plan.nodes = vec![
            node("a", false, &["eth0"]),
            node("b", false, &["eth0"]),
            node("c", false, &["eth0"]),
            node("sw1", true, &["p1", "p2", "p3"]),
            node("sw2", true, &["p1", "p2"]),
        ];
        plan.links = vec![
            link("a-sw1", ("a", "eth0"), ("sw1", "p1")),
            link("b-sw1", ("b", "eth0"), ("sw1", "p2")),
            link("sw1-sw2", ("sw1", "p3"), ("sw2", "p1")),
            link("c-sw2", ("c", "eth0"), ("sw2", "p2")),
        ];
        let at = |v: &[((&str, &str), u64, u64)]| -> Counters {
            v.iter()
                .map(|((n, i), rx, tx)| {
                    ((n.to_string(), i.to_string()), Bytes { rx: *rx, tx: *tx })
                })
                .collect()
        };
        let before = at(&[
            (("a", "eth0"), 100, 100),
            (("b", "eth0"), 100, 100),
            (("sw1", "p3"), 500, 500),
            (("c", "eth0"), 100, 100),
        ]);
        let after = at(&[
            (("a", "eth0"), 40_000, 20_000_100),
            (("b", "eth0"), 20_000_100, 40_000),
            (("sw1", "p3"), 900, 2_500),
            (("c", "eth0"), 300, 100),
        ]);
        let c = crossed(&plan, &before, &after);
        assert_eq!(c.links, ["a-sw1", "b-sw1"]);
        assert_eq!(c.switches, ["sw1"]);
        assert_eq!(c.bytes["a-sw1"], 20_000_000);
        assert_eq!(c.bytes["sw1-sw2"], 2_000);
        // Nothing moved: nothing crossed.
        let none = crossed(&plan, &before, &before);
        assert!(none.links.is_empty() && none.switches.is_empty());
    }
}
