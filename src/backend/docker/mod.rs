//! The docker backend: every node and switch a container of the lab image (network none,
//! unprivileged), links veth pairs made from the host between the containers' network
//! namespaces, switches Linux bridges inside switch containers. Commands go through the
//! Engine API's exec. Everything carries the run's labels and is in the state file.

pub mod engine;
