//! iblab: a declarative lab orchestrator for RDMA networking.

mod advise;
use iblab_backends as backend;
use iblab_backends::agent;
use iblab_backends::bundle;
use iblab_core::caps;
mod class;
pub mod cli;
mod crd;
use iblab_backends::image;
use iblab_core::evidence;
pub use iblab_core::exit;
use iblab_engine::fabric;
pub use iblab_lab as lab;
use iblab_sys::host;
mod operator;
use iblab_core::plan;
use iblab_core::preflight;
use iblab_engine::pingpong;
use iblab_engine::run;
use iblab_report as report;
pub use iblab_tools as tools;
pub use iblab_verbs as verbs;

fn main() {
    std::process::exit(cli::main());
}
