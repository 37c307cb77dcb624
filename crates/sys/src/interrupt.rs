//! Ctrl-C and SIGTERM for `iblab up`: heard from the start of the process, remembered,
//! and checked by the run before it creates anything and at every stage.
//!
//! A signal that came before the run listened for it used to be lost (or to kill iblab
//! with its default action): `install` is called as soon as the command line is parsed,
//! before the host snapshot, planning, package installs or image builds. The handler only
//! sets a flag (all a signal handler may safely do); the run polls it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal, sigaction};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How often a waiting run looks at the flag.
const POLL: Duration = Duration::from_millis(20);

extern "C" fn note(_signal: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catch SIGINT and SIGTERM from now on, whatever this process inherited: a disposition
/// of "ignore" (a background job of a shell script) or a mask that blocks them. A signal
/// that is pending because it was blocked is delivered, and remembered, at once.
pub fn install() -> Result<(), nix::Error> {
    let action = SigAction::new(
        SigHandler::Handler(note),
        // Interrupted system calls resume: the flag is what stops the run.
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let mut ours = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(s, &action) }?;
        ours.add(s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&ours), None)
}

/// Put the default disposition back for a while (a question at a terminal, where Ctrl-C
/// must end iblab at once, as nothing has been created), then catch them again.
pub fn default_during<T>(f: impl FnOnce() -> T) -> T {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: restoring the default disposition has no handler to be unsafe.
        let _ = unsafe { sigaction(s, &default) };
    }
    let out = f();
    if let Err(e) = install() {
        tracing::warn!("cannot catch Ctrl-C again: {e}");
    }
    out
}

/// Has SIGINT or SIGTERM arrived since [`install`]?
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Wait until SIGINT or SIGTERM arrives (at once if one already has).
pub async fn wait() {
    while !interrupted() {
        tokio::time::sleep(POLL).await;
    }
}

/// Give SIGPIPE its default action back (Rust ignores it), so that a command whose
/// output is piped into `head` ends quietly. Call it before any thread is started.
pub fn default_sigpipe() {
    // SAFETY: called before any thread is started; restores the default disposition.
    unsafe {
        let _ = nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigDfl);
    }
}

extern "C" fn wait_for_the_command(_: nix::libc::c_int) {}

/// Let Ctrl-C go to a command in the foreground that iblab waits for (it reaches it
/// through the terminal's process group): iblab itself does nothing with it. A handler,
/// not SIG_IGN, which the command would inherit.
pub fn leave_sigint_to_the_child() {
    let noop = SigAction::new(
        SigHandler::Handler(wait_for_the_command),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler does nothing, so it is async-signal-safe.
    let _ = unsafe { sigaction(Signal::SIGINT, &noop) };
}

/// The single-threaded runtime a command drives its async work on; `Err` is the exit
/// code after saying why it could not start.
pub fn runtime() -> Result<tokio::runtime::Runtime, i32> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the runtime: {e}");
            iblab_core::exit::ENVIRONMENT
        })
}

/// Set PATH for this process, which has none (the kernel starts init without one).
/// Call it before any thread is started.
pub fn set_init_path(path: &str) {
    // SAFETY: called as PID 1 before any thread is started: nothing reads the environment
    // at the same time.
    unsafe { std::env::set_var("PATH", path) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flag is set by a real signal sent to this process, and a signal that arrived
    /// while the run was not waiting for it is still seen by a later wait.
    #[tokio::test(flavor = "current_thread")]
    async fn a_signal_is_remembered_until_the_run_looks() {
        install().unwrap();
        assert!(!interrupted());
        nix::sys::signal::raise(Signal::SIGTERM).unwrap();
        assert!(interrupted());
        tokio::time::timeout(Duration::from_secs(1), wait())
            .await
            .expect("wait() returns once a signal has arrived");
    }
}
