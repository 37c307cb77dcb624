//! What a real adapter's name and link layer say, for `--hca`.

use iblab_lab::PathKind;

/// A software RDMA device (Soft-RoCE, Soft-iWARP), by its name: not a real adapter.
pub fn is_software(device: &str) -> bool {
    device.starts_with("rxe") || device.starts_with("siw")
}

/// The path a port's link layer carries.
pub fn path_of(link_layer: &str) -> Option<PathKind> {
    match link_layer {
        "Ethernet" => Some(PathKind::Roce),
        "InfiniBand" => Some(PathKind::Ib),
        _ => None,
    }
}

/// Why a connection test (rping, through the RDMA CM) is not run on an adapter the lab's
/// nodes were given by their backend.
pub const NO_RDMA_CM: &str = "rping connects through the RDMA CM, which resolves the \
     peer's lab address to the node's lab interface, and that interface has no verbs device \
     when the adapter is the node's: not run on an adapter the nodes were given";
