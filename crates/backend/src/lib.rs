//! What the engine asks of a backend: its [`BackendOps`] (the backend as planning sees it,
//! [`iblab_core::plan::backend::Backend`], plus how to create, drive, undo and sweep its
//! resources) and, for one run, a [`Deployment`]. The backends themselves are crates of
//! their own (`crates/backend-*`), and the list of them is the binary's.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use iblab_core::caps::HostCaps;
use iblab_core::caps::preflight::Check;
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::fault::LossMechanism;
use iblab_core::plan::Plan;
use iblab_core::plan::backend::Backend;
use iblab_sys::process::Background;
use iblab_sys::state::{Owned, StateFile};

/// These backends, as the state file's teardown asks them to undo their own resources.
pub struct Backends<'a>(pub &'a [&'a dyn BackendOps]);

#[async_trait]
impl iblab_sys::state::Undo for Backends<'_> {
    async fn undo(&self, backend: &str, owned: &[Owned]) -> Option<Vec<String>> {
        let k = self.0.iter().find(|k| k.name() == backend)?;
        Some(k.undo(owned).await)
    }
}

/// What kind of environment problem an [`EnvError`] is: what a caller decides on (to go
/// on, to look whether a node is still there, to say what to install), never its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EnvKind {
    /// None of the kinds below (or not told apart yet).
    #[default]
    Other,
    /// The state file could not be written: the run cannot promise its teardown.
    State,
    /// This host lacks what the backend needs (a program, a package, an engine, a device):
    /// the message names the fix.
    Missing,
    /// The backend's own service (the Docker engine, the VM's agent or QMP socket, a cluster's
    /// API) did not answer, or not in time.
    Unreachable,
    /// A node (a container, the lab's VM) ended while the run still needed it.
    NodeGone,
    /// iblab started a program its own list for the run does not name: a bug in iblab.
    Undeclared,
}

/// Something went wrong provisioning or driving nodes: an environment problem (exit 3).
/// Carries its kind, and its cause where there is one, so a log can show the chain and a
/// caller can decide on the kind (or look at the cause's own type) rather than the text.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct EnvError {
    pub kind: EnvKind,
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl EnvError {
    /// An environment problem with no underlying error.
    pub fn new(message: impl Into<String>) -> EnvError {
        EnvError::of(EnvKind::Other, message)
    }

    /// An environment problem of a kind, with no underlying error.
    pub fn of(kind: EnvKind, message: impl Into<String>) -> EnvError {
        EnvError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An environment problem caused by `source` (an I/O error, an engine's answer, …).
    pub fn caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> EnvError {
        EnvError::new(message).because(source)
    }

    /// The same problem, with `source` as its cause.
    pub fn because(mut self, source: impl std::error::Error + Send + Sync + 'static) -> EnvError {
        self.source = Some(Box::new(source));
        self
    }

    /// The state file could not be written: the run cannot promise its teardown.
    pub fn state(source: std::io::Error) -> EnvError {
        EnvError::of(
            EnvKind::State,
            format!("cannot write the state file: {source}"),
        )
        .because(source)
    }

    /// A program could not be started on this host: [`EnvKind::Missing`] when it is not
    /// installed, [`EnvKind::Undeclared`] when the run's guard refused it.
    pub fn not_started(message: impl Into<String>, source: std::io::Error) -> EnvError {
        let kind = if iblab_sys::process::Refused::of(&source).is_some() {
            EnvKind::Undeclared
        } else if source.kind() == std::io::ErrorKind::NotFound {
            EnvKind::Missing
        } else {
            EnvKind::Other
        };
        EnvError::of(kind, message).because(source)
    }

    /// Its kind.
    pub fn kind(&self) -> EnvKind {
        self.kind
    }

    /// The first cause in its chain that is a `T` (a backend's own error, an I/O error).
    pub fn find_cause<T: std::error::Error + 'static>(&self) -> Option<&T> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(self);
        while let Some(e) = next {
            if let Some(t) = e.downcast_ref::<T>() {
                return Some(t);
            }
            next = e.source();
        }
        None
    }
}

/// An error of a backend's own crate that knows which kind of environment problem it is:
/// `?` turns it into an [`EnvError`] of that kind, with its words and itself as the cause.
pub trait BackendError: std::error::Error + Send + Sync + 'static {
    fn env_kind(&self) -> EnvKind {
        EnvKind::Other
    }
}

impl<E: BackendError> From<E> for EnvError {
    fn from(e: E) -> EnvError {
        EnvError::of(e.env_kind(), e.to_string()).because(e)
    }
}

/// A launch the run's guard refused: iblab started a program its list does not name.
impl BackendError for iblab_sys::process::Refused {
    fn env_kind(&self) -> EnvKind {
        EnvKind::Undeclared
    }
}

/// A message only, for code not yet converted to errors of its own (kind [`EnvKind::Other`]).
impl From<String> for EnvError {
    fn from(message: String) -> EnvError {
        EnvError::new(message)
    }
}

/// Why a backend gives no way into a node of a run (its words say what to use instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoWayIn {
    /// The backend has none.
    #[error("the {0} backend offers no way into a node of a finished run")]
    NotOffered(&'static str),
    /// The program it goes through is not installed here.
    #[error("{0}")]
    ProgramMissing(&'static str),
    /// The run's nodes are no longer on this host.
    #[error("{0}")]
    Gone(String),
}

/// Which runs a sweep must leave alone, by run id.
pub type Spare<'a> = dyn Fn(&str) -> bool + Sync + 'a;

/// What a sweep for crashed runs may remove.
pub struct Scope<'a> {
    /// Runs to leave alone (live ones, whatever their state folder).
    pub spare: &'a Spare<'a>,
    /// On a backend that others share (a cluster), only the runs this owner started
    /// ([`iblab_sys::state::owner`]); `None`: every owner's (`down --all --all-owners`).
    /// A machine's own backends (namespaces, its Docker engine, its VMs) are this machine's.
    pub owner: Option<&'a str>,
    /// Remove exactly these objects, by their uid on a backend that has uids (a cluster), and
    /// nothing else there: what `down --all --all-owners` listed and its user confirmed.
    /// `None`: whatever the scope lets go.
    pub only: Option<&'a std::collections::BTreeSet<String>>,
}

/// An object a sweep of every owner would remove, as it is listed before anyone confirms:
/// its run, what it is (`namespace iblab-1a2b`, `pod ns/a`), and its uid (what the sweep
/// is then held to).
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub run: String,
    pub what: String,
    pub uid: String,
}

/// What a sweep for crashed runs removed, and what it could not.
#[derive(Debug, Default)]
pub struct Swept {
    pub removed: Vec<String>,
    pub problems: Vec<String>,
    /// What it found and left because the scope excludes it (another owner's runs).
    pub left: Vec<String>,
    /// Of what it left, the runs a sweep of every owner would remove (not a LabRun's):
    /// what `down --all --all-owners` lists before it asks.
    pub others: Vec<String>,
    /// Those runs' objects, one by one (where the backend has uids).
    pub listed: Vec<Listed>,
}

/// A backend for a lab's nodes, as iblab sees it before and after a run (and makes a
/// run's [`Deployment`]).
#[async_trait]
pub trait BackendOps: Backend {
    /// Debian packages this host lacks for what the backend prepares itself before a run
    /// (the sources of the vm backend's guest image).
    fn missing_packages(&self) -> Vec<&'static str> {
        vec![]
    }
    /// Soft-RoCE preflight for path ② on this backend (read-only).
    fn preflight(&self, caps: &HostCaps) -> Vec<Check>;
    /// `doctor`'s rows for this backend.
    fn doctor(&self, caps: &HostCaps) -> Vec<Check>;
    /// The command, run on this host, that runs `argv` on a node of a run that is up
    /// (`iblab exec`, `iblab shell`); `tty` asks for a terminal. `Err` says why not and
    /// what to use instead.
    fn way_in(
        &self,
        _run_id: &str,
        _node: &str,
        _argv: &[String],
        _tty: bool,
    ) -> Result<Vec<String>, NoWayIn> {
        Err(NoWayIn::NotOffered(self.name()))
    }
    /// The backend object of one run.
    fn instantiate(&self, run_id: &str) -> Result<Box<dyn Deployment>, EnvError>;
    /// Undo resources of this backend that a run recorded (newest first). Returns problems.
    async fn undo(&self, _owned: &[Owned]) -> Vec<String> {
        vec![]
    }
    /// Remove what crashed runs left, within `scope` (sparing runs whose state file
    /// exists or whose owner is alive).
    async fn sweep(&self, _scope: &Scope<'_>) -> Swept {
        Swept::default()
    }
}

/// A node of the run that is no lab node, reached through its backend: where a fabric's
/// helpers run when the backend gives them a site of their own (the emulated IB subnet in
/// a pod of the run, on the kube backend).
#[async_trait]
pub trait Runner: Send + Sync {
    /// What and where it is, in words (`pod iblab-1a2b3c/iblab-ib-subnet`).
    fn describe(&self) -> String;
    /// Run a command there to completion (killed at the deadline).
    async fn exec(&self, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError>;
    /// Start a long-running command there; its output goes to `log` on this host. The
    /// process is not this host's: its pid means nothing here.
    async fn spawn(&self, argv: &[String], log: &Path) -> Result<Background, EnvError>;
}

/// Where nodes live and how commands reach them, during one run.
#[async_trait]
pub trait Deployment: Send + Sync {
    fn backend(&self) -> &'static dyn BackendOps;
    fn name(&self) -> &'static str {
        self.backend().name()
    }
    /// Create nodes, switches and links. Every resource is recorded in `state` before
    /// it is created, so teardown can always find it.
    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError>;
    /// Run a command on a node to completion (killed at the deadline).
    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError>;
    /// The path of the `iblab` binary as a node sees it (for `iblab pingpong`).
    fn iblab_path(&self) -> String {
        self.backend().iblab_path()
    }
    /// How random loss is made on a node's interfaces (the plan's choice unless the
    /// node runs its own kernel).
    fn loss_mechanism(&self, _node: &str, plan: LossMechanism) -> LossMechanism {
        plan
    }
    /// What the backend learned while provisioning, for the evidence: notes and timings.
    fn report(&self) -> (Vec<String>, Vec<(String, f64)>) {
        (vec![], vec![])
    }
    /// What the host side of the wiring counted (taps, bridges, veth ends), for a link
    /// that carries nothing; empty where the nodes' own view says it all.
    async fn host_side_diagnostics(&self, _plan: &Plan) -> String {
        String::new()
    }
    /// The lab is kept (`up --keep`): leave its nodes running after this process ends.
    fn keep(&self) {}
    /// Path ②'s rxe devices on `node` were made by the node that hosts it, before the lab
    /// began (a Kubernetes node's agent, for an unprivileged pod): they are found, not
    /// made.
    fn rdma_made_by_node(&self, _node: &str) -> bool {
        false
    }
    /// Where path ③'s emulated subnet runs, when the backend gives it a node of the run's
    /// own; `None`: in a network namespace of this host.
    fn subnet_site(&self) -> Option<std::sync::Arc<dyn Runner>> {
        None
    }
    /// Start a long-running command on a node; its output goes to `log`.
    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError>;
    /// Run a traffic tool whose process counters its step reports. The same as `exec`
    /// where counters of every command come for free; a backend that pays to read them
    /// (a wrapper in a pod) reads them only here.
    async fn exec_measured(
        &self,
        node: &str,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<ExecOutput, EnvError> {
        self.exec(node, cmd, timeout).await
    }
    /// Output of the run's commands cut at a cap since the last call, each in one line
    /// (which command, which stream, the cap, the bytes dropped): the executor fails the
    /// step it happened in. Empty where nothing a node writes is capped beyond what each
    /// command's own capture keeps.
    fn output_cuts(&self) -> Vec<String> {
        vec![]
    }
    /// Start a traffic tool's server whose counters its step reports (see
    /// [`Deployment::exec_measured`]).
    async fn spawn_measured(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError> {
        self.spawn(node, argv, log, state).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the engine is gone: {0}")]
    struct Gone(#[source] std::io::Error);

    impl BackendError for Gone {
        fn env_kind(&self) -> EnvKind {
            EnvKind::NodeGone
        }
    }

    fn provision() -> Result<(), EnvError> {
        Err(Gone(std::io::Error::from(std::io::ErrorKind::BrokenPipe)))?
    }

    /// A backend's own error keeps its words, its kind and itself as the cause; a caller
    /// finds it (and what caused it) by type.
    #[test]
    fn a_homes_error_keeps_its_words_kind_and_cause() {
        let e = provision().unwrap_err();
        assert_eq!(e.kind(), EnvKind::NodeGone);
        assert_eq!(e.to_string(), "the engine is gone: broken pipe");
        assert!(e.find_cause::<Gone>().is_some());
        let io = e
            .find_cause::<std::io::Error>()
            .expect("the I/O error under it");
        assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe);
    }

    /// A program that could not start is told apart by its cause: not installed, or
    /// refused by the run's guard.
    #[test]
    fn a_program_not_started_has_the_kind_of_its_cause() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = EnvError::not_started("cannot run ip: gone", missing);
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            (EnvKind::Missing, "cannot run ip: gone")
        );
        let refused = std::io::Error::other(iblab_sys::process::Refused {
            program: "sh".into(),
            why: "not on the list".into(),
        });
        assert_eq!(
            EnvError::not_started("x", refused).kind(),
            EnvKind::Undeclared
        );
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(EnvError::not_started("x", other).kind(), EnvKind::Other);
    }

    #[test]
    fn the_old_constructors_say_what_they_said() {
        let e = EnvError::state(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert_eq!(e.kind(), EnvKind::State);
        assert!(e.to_string().starts_with("cannot write the state file: "));
        assert!(e.find_cause::<std::io::Error>().is_some());
        assert_eq!(
            NoWayIn::NotOffered("podman").to_string(),
            "the podman backend offers no way into a node of a finished run"
        );
        let e = EnvError::from("no engine".to_string());
        assert_eq!(
            (e.kind(), e.message.as_str()),
            (EnvKind::Other, "no engine")
        );
        assert!(e.source.is_none());
    }
}
