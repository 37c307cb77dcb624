//! iblab: a declarative lab orchestrator for RDMA networking. The binary: the command
//! line over the crates under crates/.
#![forbid(unsafe_code)]

mod advise;
use iblab_backends as backend;
use iblab_backends::bundle;
use iblab_backends::vm::agent;
use iblab_core::caps;
use iblab_operator::class;
pub mod cli;
use iblab_backends::docker::image;
use iblab_core::caps::preflight;
use iblab_core::evidence;
pub use iblab_core::exit;
use iblab_core::plan;
use iblab_engine::fabric;
use iblab_engine::pingpong;
use iblab_engine::run;
use iblab_k8s::crd;
pub use iblab_lab as lab;
use iblab_operator::operator;
use iblab_report as report;
use iblab_sys::host;
pub use iblab_tools as tools;
pub use iblab_verbs as verbs;

fn main() {
    std::process::exit(cli::main());
}
