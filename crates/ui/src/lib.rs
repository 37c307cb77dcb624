//! `iblab ui`: the course's page, served by this binary on this machine. The lessons as the
//! course orders them, each with its scenarios, switches and parameters and a Run button;
//! a run started here is a real `iblab up` (its own child process, run folder, state file
//! and verdicts: `iblab status` sees it), followed live (server-sent events: the steps as
//! they pass and the three paths' throughput graphs); the runs under the runs folder, by
//! lesson, and two of them side by side.
//!
//! Assets (one HTML page, one script, one style sheet) are in the binary; the graphs are
//! SVG drawn here by the report's own drawing; nothing is fetched from anywhere at run time.
//! Every request passes the [`guard`]: loopback by default, a random token, Host and Origin
//! checked.

// The page's own words, in zh-CN and en (locales/ui.yml).
rust_i18n::i18n!("locales", fallback = "en");

pub mod guard;
pub mod history;
pub mod lessons;
pub mod runner;
mod server;
pub mod view;
pub mod words;

use std::net::SocketAddr;
use std::path::PathBuf;

/// How `iblab ui` was started.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    /// The runs folder (`iblab-runs`, as `iblab up` writes it).
    pub runs: PathBuf,
    /// The backend a run uses unless the page picks one.
    pub backend: String,
    /// The binary to run `iblab up` with (this one).
    pub iblab: PathBuf,
}

/// Serve the page until Ctrl-C or SIGTERM; a run going then is stopped and torn down
/// before this returns. The exit code.
pub fn main(opts: Options) -> i32 {
    if let Err(e) = iblab_sys::interrupt::install() {
        eprintln!("error: cannot catch Ctrl-C and SIGTERM: {e}");
        return iblab_core::exit::ENVIRONMENT;
    }
    let rt = match iblab_sys::interrupt::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(server::serve(opts))
}
