//! iblab's Kubernetes objects: the Lab and LabRun CRDs from the lab file's own types, the
//! objects a kube run applies (namespaces, pods, links), the cluster settings and client,
//! and the sweep by label. The kube backend, the operator and `iblab class` share them.

pub mod cluster;
pub mod crd;
pub mod links;
pub mod manifest;
pub mod netpol;
pub mod settings;
pub mod sweep;
