//! iblab: a declarative lab orchestrator for RDMA networking. The binary: the command
//! line over the crates under crates/.
#![forbid(unsafe_code)]

// The command line's own words, in zh-CN and en (locales/cli.yml).
rust_i18n::i18n!("locales", fallback = "en");

mod advise;
mod backends;
pub mod cli;

fn main() {
    std::process::exit(cli::main());
}
