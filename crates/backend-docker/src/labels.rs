//! The labels the docker backend puts on everything it creates, so one selector finds it.

/// The run id (`iblab.run=<id>`): teardown and `down --all` select by it.
pub const RUN: &str = "iblab.run";
/// The lab's name.
pub const LAB: &str = "iblab.lab";
/// The node or switch a container is.
pub const NODE: &str = "iblab.node";
/// `node` or `switch`.
pub const ROLE: &str = "iblab.role";
