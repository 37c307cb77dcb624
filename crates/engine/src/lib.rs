//! iblab's engine: the steps (`steps`), and the executor that provisions, runs the steps
//! under deadlines, tears down whatever happened, judges and writes the evidence (`run`).
//! It drives a backend it is handed ([`iblab_backend`]) and the fabrics of the plan's
//! paths ([`iblab_fabric`]); the backends themselves are beside it.

// What a run says as it goes and in its notes, in zh-CN and en (locales/engine.yml).
rust_i18n::i18n!("locales", fallback = "en");

pub mod run;
pub mod steps;
