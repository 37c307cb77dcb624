//! iblab: a declarative lab orchestrator for RDMA networking.

mod advise;
mod agent;
mod backend;
mod bundle;
use iblab_core::caps;
mod class;
pub mod cli;
use iblab_core::counters;
mod crd;
use iblab_core::evidence;
pub use iblab_core::exit;
mod fabric;
use iblab_core::fault;
use iblab_core::home;
use iblab_sys::host;
mod image;
pub use iblab_lab as lab;
mod operator;
mod pingpong;
use iblab_core::plan;
use iblab_core::preflight;
use iblab_core::programs;
use iblab_report as report;
mod run;
mod steps;
pub use iblab_tools as tools;
pub use iblab_verbs as verbs;

fn main() {
    std::process::exit(cli::main());
}
