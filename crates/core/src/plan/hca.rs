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
