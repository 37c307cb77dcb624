//! iblab: a declarative lab orchestrator for RDMA networking. The binary: the command
//! line over the crates under crates/.
#![forbid(unsafe_code)]

mod advise;
pub mod cli;
mod homes;

fn main() {
    std::process::exit(cli::main());
}
