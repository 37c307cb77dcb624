//! iblab's core, with no I/O of its own: a lab planned for a backend (`plan`), the evidence a
//! run leaves and how it is judged (`evidence`), the faults as commands (`fault`), the
//! snapshot of a host planning reads (`caps`, `preflight`), what planning asks of a backend
//! (`plan::backend`), what a run starts (`programs`), process counters as data (`counters`), and
//! the exit codes.

// The core's own words, in zh-CN and en (locales/core.yml).
rust_i18n::i18n!("locales", fallback = "en");

pub mod caps;
pub mod command;
pub mod counters;
pub mod evidence;
pub mod exit;
pub mod fault;
pub mod images;
pub mod plan;
pub mod programs;

/// Captured runs' evidence that other crates' tests read (feature `testdata`, enabled only
/// in their `[dev-dependencies]`): the files stay in this crate, one copy.
#[cfg(any(test, feature = "testdata"))]
pub mod testdata;
