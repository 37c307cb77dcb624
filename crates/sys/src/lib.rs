//! iblab on this host: child processes under deadlines and in the background, the
//! write-ahead state file that every teardown reads, Ctrl-C and SIGTERM, progress on the
//! terminal (and as events for a watcher), sampling a process's counters, reading the host
//! itself, files that could not be made or read (with their path), and async work run from
//! synchronous code. One of the two
//! crates that may use `unsafe` (signal handlers, `setsid` before exec, PATH as init, rekeying the RNG);
//! each block says why it holds.

pub mod counters;
pub mod events;
pub mod fs;
pub mod host;
pub mod interrupt;
pub mod pid;
pub mod process;
pub mod progress;
pub mod rng;
pub mod runtime;
pub mod state;
