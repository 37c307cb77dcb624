//! Verbs without a tool in between: libibverbs loaded at run time, and the lesson-3 probe.

pub mod ffi;
pub mod probe;
