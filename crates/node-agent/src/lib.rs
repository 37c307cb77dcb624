//! The node's side of path ② in unprivileged pods (docs/kube.md, "Verbs in pods without
//! privilege"): a lab pod asks for its links and Soft-RoCE devices in an annotation
//! ([`spec`]); containerd runs this project's wrapper instead of runc for such pods (a
//! RuntimeClass), which makes them in the pod's network namespace before its measuring
//! container is created and gives that container exactly their device files ([`oci`],
//! [`runtime`]).

pub mod oci;
pub mod runtime;
pub mod spec;
