//! The verbs engine on an adapter every lab node was given by its backend (on a cluster, a
//! device plugin's resource in each pod): no rxe is made. Each node's port is examined
//! where the node runs (a cluster's nodes may each have their own adapter), and what the
//! device is (on a bus, or virtual: a Soft-RoCE stand-in) is read from the first node's
//! sysfs, for the provenance of every figure.

use std::time::Duration;

use super::{Adapter, AdapterFacts, IBV_DEVINFO, Rxe, SH, argv, cmd};
use crate::hca::{PortUnfit, examine};
use iblab_backend::{Deployment, EnvError};
use iblab_core::plan::PlannedNode;
use iblab_lab::PathKind;
use iblab_tools::ibv_devinfo;

/// Why rping is not run on an adapter a node was given.
pub use iblab_core::plan::hca::NO_RDMA_CM;

/// The sysfs entry of `device`, resolved (POSIX sh builtins only).
fn sysfs_script(device: &str) -> String {
    format!("cd -P /sys/class/infiniband/{device} && pwd")
}

/// A device whose sysfs entry is virtual (not under a bus: rxe, siw) is software.
pub fn is_virtual(sysfs: &str) -> bool {
    sysfs.contains("/devices/virtual/")
}

/// What the adapter is, as the first node's sysfs shows it.
pub async fn what_it_is(
    backend: &dyn Deployment,
    nodes: &[&PlannedNode],
    a: &Adapter,
) -> Result<AdapterFacts, EnvError> {
    let Some(node) = nodes.first() else {
        return Ok(AdapterFacts::default());
    };
    let c = cmd(argv(&[SH, "-c", &sysfs_script(&a.device)]));
    let out = backend
        .exec(&node.name, &c, Duration::from_secs(10))
        .await?;
    if !out.success() {
        return Err(EnvError::new(format!(
            "{}: no RDMA device {} in the node (/sys/class/infiniband/{}): {}; is the \
             device plugin's resource the one that gives it?",
            node.name,
            a.device,
            a.device,
            out.stderr.trim()
        )));
    }
    let sysfs = out.stdout.trim().to_string();
    Ok(AdapterFacts {
        software: is_virtual(&sysfs),
        sysfs,
    })
}

/// The adapter's port in one node: ACTIVE, of the link layer its path needs, and on RoCE
/// its RoCEv2 GID (an IPv4-mapped one first).
pub async fn examine_in(
    backend: &dyn Deployment,
    node: &PlannedNode,
    a: &Adapter,
    run_dir: &std::path::Path,
) -> Result<Rxe, EnvError> {
    let show = argv(&[
        IBV_DEVINFO,
        "-v",
        "-d",
        &a.device,
        "-i",
        &a.port.to_string(),
    ]);
    let out = backend
        .exec(&node.name, &cmd(show.clone()), Duration::from_secs(20))
        .await?;
    let _ = std::fs::write(
        run_dir.join(format!("logs/adapter-setup.{}.log", node.name)),
        format!("$ {}\n{}{}", show.join(" "), out.stdout, out.stderr),
    );
    let devices = ibv_devinfo::parse(&out.stdout).unwrap_or_default();
    rxe_of(&devices, &a.device, a.port, a.path).map_err(|e| {
        let message = format!(
            "{}: --hca {}:{}: {e}{}",
            node.name,
            a.device,
            a.port,
            if out.success() {
                String::new()
            } else {
                format!(" (ibv_devinfo: {})", out.stderr.trim())
            }
        );
        EnvError::caused(message, e)
    })
}

/// Why an adapter's port cannot stand for the run's path, with the choice of paths that
/// would fit it where its link layer is the other path's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{unfit}{}", self.hint())]
pub struct AdapterUnfit {
    #[source]
    pub unfit: PortUnfit,
    pub path: PathKind,
}

impl AdapterUnfit {
    fn hint(&self) -> &'static str {
        match (&self.unfit, self.path) {
            (PortUnfit::LinkLayer { .. }, PathKind::Roce) => {
                "; leave path roce out with --paths, and the adapter carries ib"
            }
            (PortUnfit::LinkLayer { .. }, _) => {
                "; name path roce in --paths, which the adapter carries"
            }
            _ => "",
        }
    }
}

/// The engine's device on a port `ibv_devinfo -v` describes, checked for `path`.
fn rxe_of(
    devices: &[ibv_devinfo::Device],
    device: &str,
    port: u8,
    path: PathKind,
) -> Result<Rxe, AdapterUnfit> {
    // The planner gave the adapter the run's roce path, else its ib path.
    let found =
        examine(devices, device, port, path).map_err(|unfit| AdapterUnfit { unfit, path })?;
    let p = devices
        .iter()
        .find(|d| d.name == device)
        .and_then(|d| d.ports.iter().find(|p| p.number == u32::from(port)));
    let gid = p.and_then(|p| p.gids.iter().find(|g| Some(g.index) == found.gid_index));
    Ok(Rxe {
        device: device.to_string(),
        ipv4: gid
            .and_then(|g| g.gid.strip_prefix("::ffff:"))
            .unwrap_or_default()
            .to_string(),
        gid_index: found.gid_index,
        port,
        active_mtu: p.and_then(|p| p.active_mtu),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_sysfs_entry_is_a_stand_in() {
        assert!(is_virtual("/sys/devices/virtual/infiniband/rxe0"));
        assert!(!is_virtual(
            "/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0"
        ));
    }

    #[test]
    fn the_adapters_roce_gid_and_a_wrong_link_layer_are_read_from_real_output() {
        let text = iblab_tools::testdata::IBV_DEVINFO_V_RXE;
        let devices = ibv_devinfo::parse(text).unwrap();
        let d = &devices[0];
        let r = rxe_of(&devices, &d.name, 1, PathKind::Roce).unwrap();
        assert_eq!(r.device, d.name);
        assert!(r.gid_index.is_some());
        assert!(!r.ipv4.is_empty(), "an IPv4-mapped GID: {r:?}");
        let e = rxe_of(&devices, &d.name, 1, PathKind::Ib).unwrap_err();
        assert!(e.to_string().contains("name path roce in --paths"), "{e}");
        assert!(rxe_of(&devices, "mlx5_9", 1, PathKind::Roce).is_err());
    }
}
