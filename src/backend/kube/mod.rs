//! The kube backend: pods on a Kubernetes cluster. Registered so that `--backend kube`,
//! `doctor` and `--help` know it; not built yet, so it refuses with the reason.

use async_trait::async_trait;

use super::{Backend, EnvError, Kind, Traits};
use crate::caps::HostCaps;
use crate::lab::PathKind;
use crate::plan::Plan;
use crate::preflight::{Check, Mark};

/// Why the kind refuses, everywhere it is asked.
const NOT_BUILT: &str =
    "the kube backend is not part of this build yet; use --backend local, vm or docker";

pub struct KubeKind;
pub static KIND: KubeKind = KubeKind;

#[async_trait]
impl Kind for KubeKind {
    fn name(&self) -> &'static str {
        "kube"
    }
    fn about(&self) -> &'static str {
        "pods on a Kubernetes cluster (not built yet)"
    }
    fn traits(&self) -> Traits {
        Traits {
            auto: false,
            own_kernel: false,
            verbs_in_nodes: false,
            nic: "VXLAN in a pod",
            tcp_carrier: "the node kernel's TCP stack between pods",
        }
    }
    fn available(&self, _caps: &HostCaps) -> Result<String, String> {
        Err(NOT_BUILT.into())
    }
    fn carries(&self, _path: PathKind, _caps: &HostCaps) -> Result<(), String> {
        Err(NOT_BUILT.into())
    }
    fn missing_programs(&self, _plan: &Plan, _caps: &HostCaps) -> Vec<(String, &'static str)> {
        vec![]
    }
    fn preflight(&self, _caps: &HostCaps) -> Vec<Check> {
        vec![]
    }
    fn doctor(&self, _caps: &HostCaps) -> Vec<Check> {
        vec![Check {
            name: "cluster",
            mark: Mark::Info,
            text: NOT_BUILT.into(),
        }]
    }
    fn instantiate(&self, _run_id: &str) -> Result<Box<dyn Backend>, EnvError> {
        Err(EnvError::new(NOT_BUILT))
    }
}
