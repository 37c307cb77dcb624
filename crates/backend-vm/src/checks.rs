//! The vm backend's Soft-RoCE preflight: its guest kernel and whether that kernel's rxe has
//! a socket per namespace.

use super::image;
use iblab_core::caps::preflight::{Check, Mark, check, has_per_netns_sockets};

/// Soft-RoCE in the vm backend's guest: which kernel, from where, and why; once the image
/// is built, whether its rxe really has per-namespace sockets.
pub fn softroce_in_vm() -> Vec<Check> {
    let mut v = Vec::new();
    match image::inputs() {
        Ok(i) => {
            v.push(check(
                "guest kernel",
                Mark::Ok,
                format!(
                    "{} {} from Debian {} (pinned; IBLAB_VM_KERNEL_PACKAGE and IBLAB_VM_KERNEL_SUITE change it): Linux ≥ {}.{} gives rxe a socket per network namespace, so one VM holds every node as a namespace{}",
                    i.kernel_package,
                    i.kernel_version,
                    i.kernel_suite,
                    image::MIN_KERNEL.0,
                    image::MIN_KERNEL.1,
                    if i.kernel_package == image::DEFAULT_KERNEL_PACKAGE {
                        "; a 7.2 kernel, not the newest: 7.3's rxe panicked the guest on lesson 3 and retried through lesson 5's lossless bottleneck"
                    } else {
                        ""
                    }
                ),
            ));
            v.push(check(
                "rdma_rxe",
                if i.modules.iter().any(|m| m == "rdma_rxe") {
                    Mark::Ok
                } else {
                    Mark::Fail
                },
                "a module of the guest kernel, loaded by the agent at boot".to_string(),
            ));
            if let Some(img) = image::cached(&i) {
                let module = std::fs::read(&img.base)
                    .map(|b| super::cpio::find(&b, "/rdma_rxe.ko").map(has_per_netns_sockets));
                let (mark, text) = match module {
                    Ok(None) => (Mark::Fail, "not known: the image holds no rdma_rxe.ko".to_string()),
                    Ok(Some(true)) => (
                        Mark::Ok,
                        "the guest kernel's rxe has per-namespace sockets: every node gets its own rxe in its namespace".to_string(),
                    ),
                    Ok(Some(false)) => (
                        Mark::Fail,
                        "the guest kernel's rxe has one socket, in the initial namespace: RDMA between the nodes' namespaces fails".to_string(),
                    ),
                    Err(e) => (Mark::Info, format!("not known: {e}")),
                };
                v.push(check("rxe per namespace", mark, text));
            }
        }
        Err(e) => v.push(check("guest kernel", Mark::Fail, format!("none: {e}"))),
    }
    v.push(check(
        "netns mode",
        Mark::Info,
        "shared in the guest (every namespace lists every node's rxe; each is bound to its own node's netdev); `rdma system show` is kept in the run's logs",
    ));
    v.push(check(
        "memlock",
        Mark::Ok,
        "unlimited in the guest (the agent raises it as init)",
    ));
    v
}
