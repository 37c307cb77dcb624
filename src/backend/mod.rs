//! Backends: where a lab's nodes live. One trait; each home in its own module.

pub mod docker;
pub mod local;
pub mod vm;
pub mod wiring;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use crate::caps::HostCaps;
use crate::fault::{Cmd, LossMechanism};
use crate::lab::PathKind;
use crate::plan::Plan;
use crate::run::process::{Background, ExecOutput};
use crate::run::state::StateFile;

/// Backends iblab knows, and whether this build can run them.
pub const BACKENDS: &[(&str, &str)] = &[
    ("auto", "pick the best backend this host can run"),
    ("local", "network namespaces on this host (needs root)"),
    (
        "vm",
        "one qemu microVM per node, a Debian kernel with rdma_rxe (needs root and qemu)",
    ),
    (
        "docker",
        "containers through the Docker Engine API (a local engine; needs root for the links)",
    ),
    ("kube", "pods on a Kubernetes cluster (not built yet)"),
];

/// Something went wrong provisioning or driving nodes: an environment problem (exit 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct EnvError(pub String);

/// Where nodes live and how commands reach them.
#[async_trait]
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Create nodes, switches and links. Every resource is recorded in `state` before
    /// it is created, so teardown can always find it.
    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError>;
    /// Run a command on a node to completion (killed at the deadline).
    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError>;
    /// The path of the `iblab` binary as a node sees it (for `iblab pingpong`).
    fn iblab_path(&self) -> String {
        iblab_path_for(self.name())
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
    /// Start a long-running command on a node; its output goes to `log`.
    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError>;
}

pub enum ChooseError {
    Unknown(String),
    Unavailable(String),
}

/// Resolve `--backend` to a concrete backend for these paths, with the reason for the choice.
pub fn choose(
    requested: &str,
    paths: &[PathKind],
    caps: &HostCaps,
) -> Result<(String, String), ChooseError> {
    let names = |ps: &[PathKind]| ps.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(",");
    match requested {
        "auto" | "" => {
            let local = paths.iter().try_for_each(|p| provides("local", *p, caps));
            let vm = paths.iter().try_for_each(|p| provides("vm", *p, caps));
            match (local, vm) {
                (Ok(()), _) if caps.netns => Ok((
                    "local".into(),
                    format!(
                        "auto: this host carries paths {} in network namespaces",
                        names(paths)
                    ),
                )),
                (Err(why), Ok(())) => Ok((
                    "vm".into(),
                    format!("auto: not on this host ({why}), so one qemu microVM per node"),
                )),
                // Neither carries every path: local, and the planner names each missing
                // path with its fix (qemu for roce) and the --paths way out.
                (Err(lw), Err(vw)) if caps.netns => Ok((
                    "local".into(),
                    format!("auto: no backend carries every path here (local: {lw}; vm: {vw})"),
                )),
                _ => Err(ChooseError::Unavailable(
                    "auto: no backend can run here: the kernel has no network namespaces".into(),
                )),
            }
        }
        "local" => Ok(("local".into(), "requested with --backend local".into())),
        "vm" => match caps.has(vm::qemu::QEMU) {
            true => Ok(("vm".into(), "requested with --backend vm".into())),
            false => Err(ChooseError::Unavailable(format!(
                "the vm backend needs {}\n  fix: apt-get install qemu-system-x86",
                vm::qemu::QEMU
            ))),
        },
        "docker" => match &caps.docker_socket {
            Some(socket) => Ok((
                "docker".into(),
                format!(
                    "requested with --backend docker: nodes and switches are containers of {} \
                     on the engine at {}, {}",
                    crate::image::reference(),
                    socket.display(),
                    docker::container::privileges_in_words(&docker::container::rdma_devices())
                ),
            )),
            None => Err(ChooseError::Unavailable(format!(
                "no Docker engine here (no socket at {})\n  fix: {}",
                docker::engine::socket_path().display(),
                docker::engine::FIX
            ))),
        },
        "kube" => Err(ChooseError::Unavailable(
            "the kube backend is not part of this build yet; use --backend local, vm or docker"
                .into(),
        )),
        other => Err(ChooseError::Unknown(format!(
            "unknown backend `{other}`; choose one of: {}",
            BACKENDS.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Can this backend carry this path here? `Err` says why not.
pub fn provides(backend: &str, path: PathKind, caps: &HostCaps) -> Result<(), String> {
    match (backend, path) {
        ("local", PathKind::Tcp) => Ok(()),
        ("local", PathKind::Roce) if !caps.rdma_rxe.usable() => Err(format!(
            "the kernel ({}) has no rdma_rxe (Soft-RoCE)",
            caps.kernel
        )),
        // rxe binds to the initial network namespace on every kernel tried (6.1, 6.12):
        // one namespace per node cannot carry RDMA traffic, so roce needs a kernel per node.
        ("local", PathKind::Roce) => Err(
            "rdma_rxe works only in a kernel's initial network namespace, so namespaces cannot each have their own Soft-RoCE device".into(),
        ),
        ("local", PathKind::Ib) => Ok(()),
        ("docker", PathKind::Tcp) => Ok(()),
        ("docker", PathKind::Roce) if !caps.rdma_rxe.usable() => Err(format!(
            "containers share the host's kernel, and it ({}) has no rdma_rxe (Soft-RoCE), so \
             roce in containers needs a host with rdma_rxe (or a real RDMA NIC, whose \
             /dev/infiniband the containers get)",
            caps.kernel
        )),
        ("docker", PathKind::Roce) => Err(
            "rxe binds to the host kernel's initial namespace, so containers cannot each have \
             a device of their own; run roce on the vm backend"
                .into(),
        ),
        // The emulated subnet runs in a namespace of its own on the host, next to the
        // containers; only its data-path verdict concerns the nodes.
        ("docker", PathKind::Ib) => Ok(()),
        ("vm", _) if !caps.has(vm::qemu::QEMU) => {
            Err(format!("{} is not installed", vm::qemu::QEMU))
        }
        ("vm", PathKind::Tcp | PathKind::Roce) => Ok(()),
        // The emulated subnet runs in a host namespace; its bytes ride rxe in the VMs.
        ("vm", PathKind::Ib) => Ok(()),
        _ => Err(format!("the {backend} backend is not available")),
    }
}

/// What a user can do to get a path.
pub fn fix_for(path: PathKind) -> &'static str {
    match path {
        PathKind::Tcp => "install iproute2 and iperf3",
        PathKind::Roce => {
            "install qemu-system-x86 so the vm backend can bring a kernel with rdma_rxe"
        }
        PathKind::Ib => "install ibsim-utils, opensm and infiniband-diags",
    }
}

/// The `iblab` binary as a node of this backend sees it (`{{ iblab }}` in lab files).
pub fn iblab_path_for(backend: &str) -> String {
    match backend {
        // The agent archive puts iblab itself at /init.
        "vm" => "/init".into(),
        _ => std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "iblab".into()),
    }
}

/// The backend object for a name chosen by [`choose`].
pub fn instantiate(name: &str, run_id: &str) -> Result<Box<dyn Backend>, EnvError> {
    match name {
        "local" => Ok(Box::new(local::Local::new(run_id))),
        "vm" => Ok(Box::new(vm::Vm::new(run_id))),
        "docker" => Ok(Box::new(docker::Docker::new(run_id))),
        other => Err(EnvError(format!(
            "the {other} backend is not part of this build"
        ))),
    }
}
