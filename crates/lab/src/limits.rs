//! How big a lab may be and how long it may run: checked when a lab is loaded (positioned
//! errors, exit 2) and again after templating, when the plan knows every value. One run of
//! a lab is a lesson's worth of work; these bounds stop a mistyped or hostile file from
//! deploying hundreds of nodes, running for days or spinning the expression engine.

use std::time::Duration;

pub use crate::address::MAX_NODES;

/// Links in a topology.
pub const MAX_LINKS: usize = 500;
/// Steps in a lab.
pub const MAX_STEPS: usize = 200;
/// Expectations and comparison rows, each.
pub const MAX_EXPECTATIONS: usize = 200;
/// Any one duration a lab writes (a step's timeout, a sleep, a wait's interval).
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// Every step's time limit added up, after templating: what one run may take at most.
pub const MAX_RUN: Duration = Duration::from_secs(6 * 3600);
/// Instructions the expression engine may run for one template or expression: far more
/// than any judged claim needs (a lesson's longest takes a few hundred), far fewer than a
/// loop that would never end.
pub const FUEL: u64 = 100_000;

/// A step's time limit when the lab gives it none: a command's.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// A traffic step's time limit beyond its `seconds` (per run of it), when the lab gives none.
pub const TRAFFIC_MARGIN: Duration = Duration::from_secs(20);
/// The time limit of a fault, wait, probe or subnet manager step the lab gives none.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// A sleep's time limit beyond its length.
pub const SLEEP_MARGIN: Duration = Duration::from_secs(5);

/// A traffic step's `seconds`.
pub const SECONDS: &str = "between 0 and 3600 seconds";
pub fn seconds_ok(v: f64) -> bool {
    v > 0.0 && v <= 3600.0
}

/// A traffic step's `streams`.
pub const STREAMS: &str = "between 1 and 64 streams";
pub fn streams_ok(v: u32) -> bool {
    (1..=64).contains(&v)
}

/// A traffic step's own `repeat` (and `up --repeat`).
pub const REPEAT: &str = "between 1 and 20 runs";
pub fn repeat_ok(v: u32) -> bool {
    (1..=20).contains(&v)
}
