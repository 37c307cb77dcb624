//! Links between pods, made inside the pods: each lab link is a pair of VXLAN interfaces
//! over the pod network, one in each end's pod, with the lab's interface names. They work
//! on any CNI and across nodes, and leave nothing on the hosts (the pods' deletion takes
//! them along).

use iblab_core::plan::{Plan, PlannedNode};
use iblab_node_agent::spec::LinkSpec;

/// The UDP port of the lab's VXLAN links (IANA's).
pub const VXLAN_PORT: u16 = 4789;
/// The VNI of the first link in `iblab render` (a run draws its own: [`run_vni`]); link k
/// gets the first VNI + k.
pub const FIRST_VNI: u32 = 4000;

/// A run's first VNI, drawn at random (a randomly keyed hasher's output: the keys come
/// from the OS once per thread and differ for every hasher) so that a pod of another run cannot aim frames at this
/// run's links by knowing the scheme: between 4096 and 2^24 − 4096, room for every link
/// a lab may have.
pub fn run_vni() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let h = std::collections::hash_map::RandomState::new().build_hasher();
    const LOW: u32 = 4096;
    const SPAN: u32 = (1 << 24) - 2 * 4096;
    LOW + (h.finish() % SPAN as u64) as u32
}

/// The pod network's interface in a pod, as the CNI names it.
pub const POD_INTERFACE: &str = "eth0";
/// What it is renamed to where a lab interface of the node has its name.
pub const POD_INTERFACE_RENAMED: &str = "podnet0";

/// The pod network's interface in `n`'s pod once the links are made.
pub fn underlay(n: &PlannedNode) -> &'static str {
    if n.interfaces.iter().any(|i| i.name == POD_INTERFACE) {
        POD_INTERFACE_RENAMED
    } else {
        POD_INTERFACE
    }
}

/// A shell script, run inside `n`'s pod before its links are made, that renames the pod
/// network's interface when a lab interface needs its name, keeping the pod's routes
/// (the kernel brings back the connected one). `None` when nothing collides.
pub fn rename_script(n: &PlannedNode) -> Option<String> {
    (underlay(n) != POD_INTERFACE)
        .then(|| iblab_node_agent::spec::rename_script(POD_INTERFACE, POD_INTERFACE_RENAMED))
}

/// `n`'s ends of the lab's links as its node makes them for path ② (VXLAN, no peer yet:
/// [`peer_lines`] sets it from inside the pod).
pub fn link_specs(plan: &Plan, n: &PlannedNode, first_vni: u32) -> Vec<LinkSpec> {
    let mut v = Vec::new();
    for (k, l) in plan.links.iter().enumerate() {
        for (node, ifname) in &l.ends {
            if node == &n.name {
                v.push(LinkSpec {
                    name: ifname.clone(),
                    mtu: l.mtu,
                    vni: first_vni + k as u32,
                    port: VXLAN_PORT,
                });
            }
        }
    }
    v
}

/// `ip -batch` lines, run inside `n`'s pod, that point each of its ends the node made
/// ([`link_specs`]) at the peer pod's IP (`ip_of`).
pub fn peer_lines(plan: &Plan, n: &PlannedNode, ip_of: impl Fn(&str) -> String) -> Vec<String> {
    let mut lines = Vec::new();
    for l in &plan.links {
        for (i, (node, ifname)) in l.ends.iter().enumerate() {
            if node == &n.name {
                lines.push(format!(
                    "link set {ifname} type vxlan remote {}",
                    ip_of(&l.ends[1 - i].0)
                ));
            }
        }
    }
    lines
}

/// `ip -batch` lines, run inside `n`'s pod, that create its end of every link it is on.
/// `ip_of` gives a peer pod's IP. The interface keeps the lab's MTU: the pod network
/// fragments the outer packets where the lab's frames and VXLAN's 50 bytes exceed it.
/// `first_vni` is the run's (see [`run_vni`]).
pub fn vxlan_lines(
    plan: &Plan,
    n: &PlannedNode,
    first_vni: u32,
    ip_of: impl Fn(&str) -> String,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (k, l) in plan.links.iter().enumerate() {
        for (i, (node, ifname)) in l.ends.iter().enumerate() {
            if node != &n.name {
                continue;
            }
            let peer = &l.ends[1 - i].0;
            lines.push(format!(
                "link add {ifname} mtu {} gso_max_segs 1 type vxlan id {} remote {} dstport {VXLAN_PORT} dev {}",
                l.mtu,
                first_vni + k as u32,
                ip_of(peer),
                underlay(n)
            ));
        }
    }
    lines
}
