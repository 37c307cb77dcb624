//! One lab container: what it is allowed (and why), how it is created and started, and
//! where its network namespace is.

use std::collections::HashMap;
use std::path::Path;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, DeviceMapping, HostConfig, ResourcesUlimits};
use bollard::query_parameters::CreateContainerOptions;

use super::labels;

/// What a lab container runs while it is up: nothing, until iblab execs its commands.
pub const IDLE: &str = "sleep";

/// Capabilities a lab container gets on top of Docker's default set (which already has
/// NET_RAW for ping): NET_ADMIN for links, addresses, bridges, tc and nftables; IPC_LOCK
/// so verbs can pin registered memory.
pub const CAPABILITIES: &[&str] = &["NET_ADMIN", "IPC_LOCK"];

/// The memlock limit containers get: unlimited (-1) where the engine can raise it, else
/// this host's hard limit in bytes (raising a hard limit needs CAP_SYS_RESOURCE, which
/// root lacks on some VMs: the runtime then refuses to start the container at all).
pub fn memlock() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    memlock_from(&status, &limits)
}

/// [`memlock`] from the text of /proc/self/status and /proc/self/limits.
pub fn memlock_from(status: &str, limits: &str) -> i64 {
    const CAP_SYS_RESOURCE: u32 = 24;
    let can_raise = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_none_or(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0);
    let hard = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .and_then(|l| l.split_whitespace().nth(4))
        .map(|h| {
            if h == "unlimited" {
                -1
            } else {
                h.parse().unwrap_or(-1)
            }
        })
        .unwrap_or(-1);
    if can_raise || hard == -1 { -1 } else { hard }
}

/// In words, for the plan.
pub fn privileges_in_words(devices: &[String]) -> String {
    let memlock = match memlock() {
        -1 => "memlock unlimited".to_string(),
        b => format!(
            "memlock {} KiB (this host's hard limit: root here lacks CAP_SYS_RESOURCE, so it \
             cannot be raised; verbs can pin no more than that)",
            b / 1024
        ),
    };
    let mut s = format!(
        "unprivileged with {} and {memlock}, network none (links are veth pairs made from the \
         host); no fabric here needs --privileged",
        CAPABILITIES.join(" + ")
    );
    if !devices.is_empty() {
        s.push_str(&format!(
            "; RDMA devices passed through: {}",
            devices.join(" ")
        ));
    }
    s
}

/// RDMA character devices on this host (`/dev/infiniband/*`), passed through when present.
pub fn rdma_devices() -> Vec<String> {
    iblab_sys::host::rdma_devices()
}

/// Why a container of the run could not be made, or is not running.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("cannot create container {name}: {source}")]
    Create {
        name: String,
        source: bollard::errors::Error,
    },
    #[error("cannot start container {name}: {source}")]
    Start {
        name: String,
        source: bollard::errors::Error,
    },
    #[error("cannot inspect container {name}: {source}")]
    Inspect {
        name: String,
        source: bollard::errors::Error,
    },
    #[error(
        "container {name} runs as pid {pid}, which is not visible on this host: the engine must \
         run on this machine"
    )]
    NotVisible { name: String, pid: i64 },
    #[error("container {name} is not running (exit code {exit_code:?})")]
    NotRunning {
        name: String,
        exit_code: Option<i64>,
    },
}

impl iblab_backend::BackendError for ContainerError {
    fn env_kind(&self) -> iblab_backend::EnvKind {
        match self {
            ContainerError::NotRunning { .. } => iblab_backend::EnvKind::NodeGone,
            _ => iblab_backend::EnvKind::Other,
        }
    }
}

/// What a container of a run needs to be created.
pub struct Spec<'a> {
    pub name: &'a str,
    pub node: &'a str,
    pub switch: bool,
    pub image: &'a str,
    pub run_id: &'a str,
    pub lab: &'a str,
    pub devices: &'a [String],
    /// iblab's folder on this host, mounted read-only at [`iblab_core::images::IN_NODE`] where
    /// the lab runs iblab in its nodes.
    pub iblab: Option<&'a std::path::Path>,
}

/// Create and start the container; it idles under docker-init so exec works and orphans
/// are reaped.
pub async fn create_and_start(docker: &Docker, spec: &Spec<'_>) -> Result<(), ContainerError> {
    let labels = HashMap::from([
        (labels::RUN.to_string(), spec.run_id.to_string()),
        (labels::LAB.to_string(), spec.lab.to_string()),
        (labels::NODE.to_string(), spec.node.to_string()),
        (
            labels::ROLE.to_string(),
            if spec.switch { "switch" } else { "node" }.to_string(),
        ),
    ]);
    let host_config = HostConfig {
        network_mode: Some("none".into()),
        cap_add: Some(CAPABILITIES.iter().map(|c| c.to_string()).collect()),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("memlock".into()),
            soft: Some(memlock()),
            hard: Some(memlock()),
        }]),
        devices: Some(
            spec.devices
                .iter()
                .map(|d| DeviceMapping {
                    path_on_host: Some(d.clone()),
                    path_in_container: Some(d.clone()),
                    cgroup_permissions: Some("rwm".into()),
                })
                .collect(),
        ),
        binds: spec.iblab.map(|dir| {
            vec![format!(
                "{}:{}:ro",
                dir.display(),
                iblab_core::images::IN_NODE
            )]
        }),
        init: Some(true),
        privileged: Some(false),
        ..Default::default()
    };
    let body = ContainerCreateBody {
        image: Some(spec.image.to_string()),
        cmd: Some(vec![IDLE.into(), "infinity".into()]),
        hostname: Some(spec.node.to_string()),
        labels: Some(labels),
        host_config: Some(host_config),
        ..Default::default()
    };
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(spec.name.to_string()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|source| ContainerError::Create {
            name: spec.name.to_string(),
            source,
        })?;
    docker
        .start_container(spec.name, None)
        .await
        .map_err(|source| ContainerError::Start {
            name: spec.name.to_string(),
            source,
        })
}

/// The host pid of a running container's init, whose network namespace is the node's.
pub async fn pid(docker: &Docker, name: &str) -> Result<u32, ContainerError> {
    let i = docker
        .inspect_container(name, None)
        .await
        .map_err(|source| ContainerError::Inspect {
            name: name.to_string(),
            source,
        })?;
    let state = i.state.unwrap_or_default();
    match state.pid {
        Some(p) if p > 0 && state.running == Some(true) => {
            if Path::new(&format!("/proc/{p}/ns/net")).exists() {
                Ok(p as u32)
            } else {
                Err(ContainerError::NotVisible {
                    name: name.to_string(),
                    pid: p,
                })
            }
        }
        _ => Err(ContainerError::NotRunning {
            name: name.to_string(),
            exit_code: state.exit_code,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \nMax locked memory         8388608              8388608              bytes     \n";

    #[test]
    fn memlock_unlimited_only_when_it_can_be_raised() {
        // This VM's root: every capability but CAP_SYS_RESOURCE.
        assert_eq!(memlock_from("CapEff:\t000001fffeffffff\n", LIMITS), 8388608);
        assert_eq!(memlock_from("CapEff:\t000001ffffffffff\n", LIMITS), -1);
        let unlimited = LIMITS.replace(
            "8388608              8388608",
            "unlimited            unlimited",
        );
        assert_eq!(memlock_from("CapEff:\t000001fffeffffff\n", &unlimited), -1);
    }
}
