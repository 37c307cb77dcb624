//! Fuzz the lab loader and validator: any bytes given as a lab file must load, or be
//! refused with a diagnostic that renders, and never panic or hang. The entry is
//! `iblab_lab::load::load_str`, which `iblab validate FILE` and `iblab up FILE` reach
//! through `load_file` once the file is read.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // load_file refuses what is not UTF-8 before load_str sees it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = iblab_lab::load::load_str("fuzz.yaml", text) {
        // The CLI prints every refusal with its source excerpt: that must not panic either.
        let _ = e.render(false);
    }
});
