//! Backends: where a lab's nodes live. One trait; each home in its own module.

pub mod docker;
pub mod local;
pub mod wiring;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use crate::caps::HostCaps;
use crate::fault::Cmd;
use crate::lab::{Lab, PathKind};
use crate::plan::Plan;
use crate::run::process::{Background, ExecOutput};
use crate::run::state::StateFile;

/// Backends iblab knows, and whether this build can run them.
pub const BACKENDS: &[(&str, &str)] = &[
    ("auto", "pick the best backend this host can run"),
    ("local", "network namespaces on this host (needs root)"),
    (
        "vm",
        "a qemu microVM with a kernel that has rdma_rxe (not built yet)",
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

/// Resolve `--backend` to a concrete backend, with the reason for the choice.
pub fn choose(
    requested: &str,
    _lab: &Lab,
    caps: &HostCaps,
) -> Result<(String, String), ChooseError> {
    match requested {
        "auto" | "" => {
            if caps.netns {
                Ok((
                    "local".into(),
                    "auto: this host has network namespaces, so nodes are namespaces here".into(),
                ))
            } else {
                Err(ChooseError::Unavailable(
                    "auto: no backend can run here: the kernel has no network namespaces".into(),
                ))
            }
        }
        "local" => Ok(("local".into(), "requested with --backend local".into())),
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
        "vm" | "kube" => Err(ChooseError::Unavailable(format!(
            "the {requested} backend is not part of this build yet; use --backend local"
        ))),
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
        ("local", PathKind::Roce) => {
            Err("the softroce fabric is not part of this build yet".into())
        }
        ("local", PathKind::Ib) => Ok(()),
        ("docker", PathKind::Tcp) => Ok(()),
        ("docker", PathKind::Roce) if !caps.rdma_rxe.usable() => Err(format!(
            "containers share the host's kernel, and it ({}) has no rdma_rxe (Soft-RoCE), so \
             roce in containers needs a host with rdma_rxe (or a real RDMA NIC, whose \
             /dev/infiniband the containers get)",
            caps.kernel
        )),
        ("docker", PathKind::Roce) => {
            Err("the softroce fabric is not part of this build yet".into())
        }
        // The emulated subnet runs in a namespace of its own on the host, next to the
        // containers; only its data-path verdict concerns the nodes.
        ("docker", PathKind::Ib) => Ok(()),
        _ => Err(format!("the {backend} backend is not available")),
    }
}

/// What a user can do to get a path.
pub fn fix_for(path: PathKind) -> &'static str {
    match path {
        PathKind::Tcp => "install iproute2 and iperf3",
        PathKind::Roce => "use a kernel with rdma_rxe (most distribution kernels have it)",
        PathKind::Ib => "install ibsim-utils, opensm and infiniband-diags",
    }
}

/// The backend object for a name chosen by [`choose`].
pub fn instantiate(name: &str, run_id: &str) -> Result<Box<dyn Backend>, EnvError> {
    match name {
        "local" => Ok(Box::new(local::Local::new(run_id))),
        "docker" => Ok(Box::new(docker::Docker::new(run_id))),
        other => Err(EnvError(format!(
            "the {other} backend is not part of this build"
        ))),
    }
}
