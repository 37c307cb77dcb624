//! iblab: a declarative lab orchestrator for RDMA networking.

mod advise;
mod agent;
mod backend;
mod bundle;
mod caps;
mod class;
pub mod cli;
mod command;
mod counters;
mod crd;
mod evidence;
pub mod exit;
use lab::expr;
mod fabric;
mod fault;
mod home;
mod host;
mod image;
pub use iblab_lab as lab;
mod operator;
mod pingpong;
mod plan;
mod preflight;
mod programs;
mod report;
mod run;
mod steps;
pub use iblab_tools as tools;
pub use iblab_verbs as verbs;

fn main() {
    std::process::exit(cli::main());
}
