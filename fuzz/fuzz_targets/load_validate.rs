//! Fuzz the lab loader and validator: any bytes given as a lab file must load, or be
//! refused with a diagnostic that renders, and never panic or hang.
//!
//! iblab is a binary crate, so the modules the loader needs are compiled here from the
//! same source files (`#[path]`); the entry is `lab::load::load_str`, which `iblab
//! validate FILE` and `iblab up FILE` reach through `load_file` once the file is read.
#![no_main]
#![allow(dead_code, unused_imports)]

#[path = "../../src/lab/mod.rs"]
mod lab;

#[path = "../../src/expr.rs"]
mod expr;

#[path = "../../src/fault.rs"]
mod fault;

#[path = "../../src/plan/address.rs"]
pub mod address;

#[path = "../../src/evidence/names.rs"]
pub mod names;

/// `crate::plan::address` and `crate::evidence::names`, as the loader names them.
mod plan {
    pub use super::address;
}
mod evidence {
    pub use super::names;
}

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // load_file refuses what is not UTF-8 before load_str sees it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = lab::load::load_str("fuzz.yaml", text) {
        // The CLI prints every refusal with its source excerpt: that must not panic either.
        let _ = e.render(false);
    }
});
