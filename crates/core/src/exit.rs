//! The exit codes of `iblab up`, a contract users and CI rely on.

/// Every expectation held.
pub const OK: i32 = 0;
/// An expectation or a step failed.
pub const FAILED: i32 = 1;
/// Bad input: an invalid lab, an unknown lab, scenario, path or backend.
pub const BAD_INPUT: i32 = 2;
/// The environment: a prerequisite is missing, or provisioning failed.
pub const ENVIRONMENT: i32 = 3;
/// Interrupted (after teardown).
pub const INTERRUPTED: i32 = 130;
