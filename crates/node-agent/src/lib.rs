//! The node's side of path ② in unprivileged pods (docs/kube.md, "Path ② in pods"): a
//! lab pod asks for its links and Soft-RoCE devices in an annotation ([`spec`]); containerd
//! runs this project's wrapper instead of runc for such pods (a RuntimeClass), which checks
//! that each container is a lab pod's ([`shape`]), makes the links and devices in the pod's
//! network namespace before its measuring container is created and gives that container
//! exactly their device files ([`oci`], [`runtime`]); what it writes on the node is
//! escaped and bounded ([`log`]).

pub mod log;
pub mod oci;
pub mod runtime;
pub mod shape;
pub mod spec;
