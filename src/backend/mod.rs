//! Backends: where a lab's nodes live. Each home is one module that registers a [`Kind`]
//! in [`KINDS`]; the rest of iblab asks the kind what it needs (which paths it carries,
//! preflight, host programs, how to undo and sweep its resources) and never matches on a
//! backend's name. Adding a home: one folder, one line in [`KINDS`].

pub mod docker;
pub mod kube;
pub mod local;
pub mod vm;
pub mod wiring;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use crate::caps::HostCaps;
use crate::fault::{Cmd, LossMechanism};
use crate::home::Home;
use crate::plan::Plan;
use crate::preflight::Check;
use crate::run::process::{Background, ExecOutput};
use crate::run::state::StateFile;

/// Every home iblab knows, in the order `--backend auto` considers them.
pub static KINDS: &[&dyn Kind] = &[&local::KIND, &vm::KIND, &docker::KIND, &kube::KIND];

/// The registered kind with this name.
pub fn kind(name: &str) -> Option<&'static dyn Kind> {
    KINDS.iter().copied().find(|k| k.name() == name)
}

/// Add the Soft-RoCE preflight of the backends `requested` may resolve to (`auto`:
/// every kind auto considers). Read-only, but it runs `rdma system show` and looks at
/// kernel modules: done once, before planning.
pub fn with_preflight(mut caps: HostCaps, requested: &str) -> HostCaps {
    for k in KINDS {
        let wanted = if requested == "auto" || requested.is_empty() {
            k.traits().auto
        } else {
            k.name() == requested
        };
        if wanted {
            let checks = k.preflight(&caps);
            caps.preflight.insert(k.name().to_string(), checks);
        }
    }
    caps
}

/// These kinds, as the state file's teardown asks them to undo their own resources.
pub struct Kinds<'a>(pub &'a [&'a dyn Kind]);

#[async_trait]
impl crate::run::state::Undo for Kinds<'_> {
    async fn undo(&self, backend: &str, owned: &[Owned]) -> Option<Vec<String>> {
        let k = self.0.iter().find(|k| k.name() == backend)?;
        Some(k.undo(owned).await)
    }
}

/// Every registered kind as planning sees it, in the order `--backend auto` considers them.
pub fn homes() -> Vec<&'static dyn Home> {
    KINDS.iter().map(|k| *k as &dyn Home).collect()
}

pub use crate::home::{Traits, rxe_per_namespace};

/// Something went wrong provisioning or driving nodes: an environment problem (exit 3).
/// Carries its cause where there is one, so a log can show the chain.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct EnvError {
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl EnvError {
    /// An environment problem with no underlying error.
    pub fn new(message: impl Into<String>) -> EnvError {
        EnvError {
            message: message.into(),
            source: None,
        }
    }

    /// An environment problem caused by `source` (an I/O error, an engine's answer, …).
    pub fn caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> EnvError {
        EnvError {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The state file could not be written: the run cannot promise its teardown.
    pub fn state(source: std::io::Error) -> EnvError {
        EnvError::caused(format!("cannot write the state file: {source}"), source)
    }
}

impl From<String> for EnvError {
    fn from(message: String) -> EnvError {
        EnvError::new(message)
    }
}

pub use crate::run::state::Owned;

/// Which runs a sweep must leave alone, by run id.
pub type Spare<'a> = dyn Fn(&str) -> bool + Sync + 'a;

/// What a sweep for crashed runs removed, and what it could not.
#[derive(Debug, Default)]
pub struct Swept {
    pub removed: Vec<String>,
    pub problems: Vec<String>,
}

/// A home for a lab's nodes, as iblab sees it before and after a run.
#[async_trait]
pub trait Kind: Home {
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
    ) -> Result<Vec<String>, String> {
        Err(format!(
            "the {} backend offers no way into a node of a finished run",
            self.name()
        ))
    }
    /// The backend object of one run.
    fn instantiate(&self, run_id: &str) -> Result<Box<dyn Backend>, EnvError>;
    /// Undo resources of this kind that a run recorded (newest first). Returns problems.
    async fn undo(&self, _owned: &[Owned]) -> Vec<String> {
        vec![]
    }
    /// Remove what crashed runs left, sparing runs in `spare` (their state file exists,
    /// or their owner is alive).
    async fn sweep(&self, _spare: &Spare<'_>) -> Swept {
        Swept::default()
    }
}

/// A node of the run that is no lab node, reached through its backend: where a fabric's
/// helpers run when the backend gives them a home of their own (the emulated IB subnet in
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
pub trait Backend: Send + Sync {
    fn kind(&self) -> &'static dyn Kind;
    fn name(&self) -> &'static str {
        self.kind().name()
    }
    /// Create nodes, switches and links. Every resource is recorded in `state` before
    /// it is created, so teardown can always find it.
    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError>;
    /// Run a command on a node to completion (killed at the deadline).
    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError>;
    /// The path of the `iblab` binary as a node sees it (for `iblab pingpong`).
    fn iblab_path(&self) -> String {
        self.kind().iblab_path()
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
    /// Where path ③'s emulated subnet runs, when the backend gives it a node of the run's
    /// own; `None`: in a network namespace of this host.
    fn subnet_home(&self) -> Option<std::sync::Arc<dyn Runner>> {
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
    /// Start a traffic tool's server whose counters its step reports (see
    /// [`Backend::exec_measured`]).
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
    use crate::home::{ChooseError, Home};
    use crate::lab::PathKind;

    /// `--backend` resolved among the registered kinds.
    fn choose(
        requested: &str,
        paths: &[PathKind],
        caps: &HostCaps,
    ) -> Result<(&'static dyn Home, String), ChooseError> {
        crate::home::choose(&homes(), requested, paths, caps)
    }

    fn caps(qemu: bool) -> HostCaps {
        let mut c = HostCaps::for_tests();
        c.netns = true;
        c.tools.insert(
            vm::qemu::QEMU.into(),
            qemu.then(|| "/usr/bin/qemu-system-x86_64".into()),
        );
        c
    }

    #[test]
    fn every_kind_is_registered_once() {
        let mut names: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KINDS.len());
        for n in ["local", "vm", "docker", "kube"] {
            assert!(kind(n).is_some(), "{n} is not registered");
        }
    }

    #[test]
    fn auto_prefers_local_and_falls_back_to_vm_for_roce() {
        let c = caps(true);
        let (k, why) = choose("auto", &[PathKind::Tcp, PathKind::Ib], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "local", "{why}");
        let (k, why) = choose("auto", &[PathKind::Tcp, PathKind::Roce], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "vm", "{why}");
        assert!(why.contains("local backend"), "{why}");
        // Without qemu nothing carries roce: local, and the planner names the path.
        let (k, why) = choose("auto", &[PathKind::Roce], &caps(false))
            .ok()
            .unwrap();
        assert_eq!(k.name(), "local", "{why}");
    }

    /// On a host kernel whose rxe serves every namespace (≥ 7.1), local and docker carry
    /// roce natively and auto prefers local; on older ones, or where it is not known, they
    /// refuse with the reason and auto goes to the vm backend. Decided on captured facts:
    /// the machines iblab is developed on have no rxe at all.
    #[test]
    fn roce_is_native_where_rxe_serves_every_namespace() {
        use crate::preflight::RxeNetns;
        let mut c = caps(true);
        c.rdma_rxe = crate::caps::Feature::Module;
        c.rxe_netns = RxeNetns::Yes("the running kernel's symbols".into());
        c.docker_socket = Some("/run/docker.sock".into());
        assert!(kind("local").unwrap().carries(PathKind::Roce, &c).is_ok());
        assert!(kind("docker").unwrap().carries(PathKind::Roce, &c).is_ok());
        let (k, why) = choose("auto", &[PathKind::Tcp, PathKind::Roce], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "local", "{why}");
        assert_eq!(kind("local").unwrap().rdma_device("a", 0), "a-rxe0");
        c.rxe_netns = RxeNetns::No("rdma_rxe.ko".into());
        let why = kind("local")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(
            why.contains("initial network namespace") && why.contains("7.1"),
            "{why}"
        );
        assert!(kind("docker").unwrap().carries(PathKind::Roce, &c).is_err());
        let (k, _) = choose("auto", &[PathKind::Tcp, PathKind::Roce], &c)
            .ok()
            .unwrap();
        assert_eq!(k.name(), "vm");
        c.rxe_netns = RxeNetns::Unknown("rdma_rxe.ko.xz is compressed".into());
        let why = kind("local")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(why.contains("not known"), "{why}");
        c.rdma_rxe = crate::caps::Feature::Absent;
        let why = kind("docker")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(why.contains("no rdma_rxe"), "{why}");
    }

    #[test]
    fn unknown_and_unavailable_backends_are_told_apart() {
        let c = caps(false);
        assert!(
            matches!(choose("nope", &[], &c), Err(ChooseError::Unknown(m)) if m.contains("local, vm, docker, kube"))
        );
        assert!(
            matches!(choose("vm", &[], &c), Err(ChooseError::Unavailable(m)) if m.contains("qemu"))
        );
        // kube plans without a cluster (reaching one is provisioning's business), and
        // says why it carries no roce.
        assert!(choose("kube", &[], &c).is_ok());
        let why = kind("kube")
            .unwrap()
            .carries(PathKind::Roce, &c)
            .unwrap_err();
        assert!(why.contains("7.1") && why.contains("--paths"), "{why}");
    }
}
