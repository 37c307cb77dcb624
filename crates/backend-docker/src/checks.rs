//! The docker backend's Soft-RoCE preflight: the host's RDMA devices passed through, the
//! containers' memlock limit.

use iblab_core::caps::HostCaps;
use iblab_core::caps::preflight::{Check, Mark, check, memlock_check};

/// Soft-RoCE in containers: the host's RDMA devices passed through, the containers' limit.
pub fn softroce_in_docker(caps: &HostCaps) -> Vec<Check> {
    let devices = &caps.rdma_device_files;
    let memlock = super::container::memlock();
    vec![
        check(
            "rdma devices",
            if devices.is_empty() {
                Mark::Fail
            } else {
                Mark::Ok
            },
            if devices.is_empty() {
                "none under /dev/infiniband: containers share the host's kernel, so roce needs rdma_rxe or an RDMA NIC on the host".to_string()
            } else {
                format!("passed through: {}", devices.join(", "))
            },
        ),
        iblab_sys::host::host_rdma_system(caps),
        memlock_check(
            (memlock >= 0).then_some(memlock as u64),
            "run dockerd with CAP_SYS_RESOURCE",
        ),
    ]
}
