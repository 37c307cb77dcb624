//! Teardown and reaping, each alone: what a run created is undone by the state file that
//! names it, and every child the run had is waited for, so none is left a zombie.

use std::time::Duration;

use iblab_sys::state::{StateFile, Undo};

/// How long reaping waits for the children teardown stopped before it says some still run.
pub const GRACE: Duration = Duration::from_secs(10);

/// Undo every resource `state` names, newest first, asking `by` (the run's backend) for its
/// own; the state file goes once nothing is left. What could not be undone comes back as
/// the run's notes, each naming the way out (`iblab down --all`).
pub async fn undo(state: StateFile, by: &dyn Undo) -> Vec<String> {
    state
        .teardown(by)
        .await
        .into_iter()
        .map(|p| format!("teardown: {p}; run `iblab down --all`"))
        .collect()
}

/// Wait up to `grace` for every child of this process, reaping each that ended; call it
/// only once nothing holds a child's handle any more. A note when some still run.
pub async fn reap(grace: Duration) -> Option<String> {
    let running = iblab_sys::process::reap_children(grace).await;
    (running > 0).then(|| {
        format!(
            "teardown: {running} child process(es) still running {}s after they were stopped",
            grace.as_secs()
        )
    })
}
