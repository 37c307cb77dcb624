//! What a kube run is told from outside: which cluster (kubeconfig context), which
//! namespace, which image and how it is pulled, which device-plugin resource a node asks
//! for on real HCAs. Set once from the command line; each has an environment variable.

use std::collections::BTreeMap;
use std::sync::OnceLock;

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// kubeconfig context (`--context`, `IBLAB_KUBE_CONTEXT`); `None`: the current one.
    pub context: Option<String>,
    /// Run in this existing namespace (`--namespace`, `IBLAB_KUBE_NAMESPACE`); `None`: a
    /// namespace per run, made and removed by iblab.
    pub namespace: Option<String>,
    /// The lab image (`IBLAB_IMAGE`; default the locally built `iblab/lab:<version>`).
    pub image: String,
    /// `Never` for the locally built image (no registry has it: import it into the
    /// nodes' runtime), `IfNotPresent` for an image named with `IBLAB_IMAGE`;
    /// `IBLAB_KUBE_PULL_POLICY` overrides.
    pub pull_policy: String,
    /// The image iblab itself comes from into lab pods whose lab runs iblab there (path
    /// ①'s ping-pong, `{{ iblab }}`): the operator's image (`IBLAB_OPERATOR_IMAGE`;
    /// default the locally built `iblab/operator:<version>`), pulled as the lab image is.
    pub iblab_image: String,
    pub iblab_pull_policy: String,
    /// The device-plugin resource a lab node asks for on a cluster with real HCAs
    /// (`IBLAB_KUBE_RDMA_RESOURCE`, e.g. `rdma/hca_shared_devices_a`); `None`: none.
    pub rdma_resource: Option<String>,
    /// Who starts the runs, as the `iblab.dev/owner` label of every object
    /// ([`iblab_sys::state::owner`]): `down --all` sweeps only its own owner's.
    pub owner: String,
    /// Lab nodes pinned to cluster nodes (`--place NODE=CLUSTER_NODE`, `IBLAB_KUBE_PLACE`
    /// as `a=n1,b=n2`): their pods go there (by the node's hostname label), whatever
    /// taint it has; the others go where the scheduler puts them.
    pub placement: BTreeMap<String, String>,
    /// The RuntimeClass path ②'s lab pods run under (`IBLAB_KUBE_RUNTIME_CLASS`, default
    /// [`RUNTIME_CLASS`]): its handler is the node agent's wrapper around runc, which makes
    /// each pod's links and rxe before its container starts (docs/kube.md).
    pub runtime_class: String,
}

/// The RuntimeClass (and containerd runtime handler) of path ②'s lab pods.
pub const RUNTIME_CLASS: &str = "iblab-rxe";

/// `a=n1,b=n2` (or the flag's values) as a placement; `Err` names what is wrong.
pub fn parse_placement<'a>(
    items: impl IntoIterator<Item = &'a str>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in items
        .into_iter()
        .flat_map(|i| i.split(','))
        .map(str::trim)
        .filter(|i| !i.is_empty())
    {
        match item.split_once('=') {
            Some((node, on)) if !node.trim().is_empty() && !on.trim().is_empty() => {
                if let Some(before) = out.insert(node.trim().to_string(), on.trim().to_string()) {
                    return Err(format!(
                        "--place {item}: lab node `{}` is placed twice (also on `{before}`)",
                        node.trim()
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "--place {item}: write LAB_NODE=CLUSTER_NODE, e.g. --place a=worker-1"
                ));
            }
        }
    }
    Ok(out)
}

static SET: OnceLock<Settings> = OnceLock::new();

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

impl Settings {
    /// From the environment alone.
    pub fn from_env() -> Settings {
        let named = env("IBLAB_IMAGE").is_some();
        let named_iblab = env("IBLAB_OPERATOR_IMAGE").is_some();
        let policy = |named: bool| {
            env("IBLAB_KUBE_PULL_POLICY")
                .unwrap_or_else(|| if named { "IfNotPresent" } else { "Never" }.into())
        };
        Settings {
            context: env("IBLAB_KUBE_CONTEXT"),
            namespace: env("IBLAB_KUBE_NAMESPACE"),
            image: iblab_core::images::lab(),
            pull_policy: policy(named),
            iblab_image: iblab_core::images::operator(),
            iblab_pull_policy: policy(named_iblab),
            rdma_resource: env("IBLAB_KUBE_RDMA_RESOURCE"),
            owner: iblab_sys::state::owner(),
            // A bad value is refused by the command line, which reads the same variable.
            placement: env("IBLAB_KUBE_PLACE")
                .and_then(|v| parse_placement([v.as_str()]).ok())
                .unwrap_or_default(),
            runtime_class: env("IBLAB_KUBE_RUNTIME_CLASS").unwrap_or_else(|| RUNTIME_CLASS.into()),
        }
    }

    /// Fixed values for rendering tests, whatever the environment says.
    #[doc(hidden)]
    pub fn for_tests() -> Settings {
        Settings {
            context: None,
            namespace: None,
            image: "iblab/lab:test".into(),
            pull_policy: "Never".into(),
            iblab_image: "iblab/operator:test".into(),
            iblab_pull_policy: "Never".into(),
            rdma_resource: None,
            owner: "test-owner".into(),
            placement: BTreeMap::new(),
            runtime_class: RUNTIME_CLASS.into(),
        }
    }
}

/// Set once, from the command line (`--context`, `--namespace`, `--place` on top of the
/// environment).
pub fn set(
    context: Option<String>,
    namespace: Option<String>,
    placement: Option<BTreeMap<String, String>>,
) {
    let mut s = Settings::from_env();
    if context.is_some() {
        s.context = context;
    }
    if namespace.is_some() {
        s.namespace = namespace;
    }
    if let Some(p) = placement {
        s.placement = p;
    }
    let _ = SET.set(s);
}

/// The settings of this process.
pub fn get() -> Settings {
    SET.get().cloned().unwrap_or_else(Settings::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_are_read_and_refused_with_the_fix() {
        let p = parse_placement(["a=n1,b=n2", " c = n3 "]).unwrap();
        assert_eq!(p.get("a").map(String::as_str), Some("n1"));
        assert_eq!(p.get("c").map(String::as_str), Some("n3"));
        assert!(
            parse_placement(["a"])
                .unwrap_err()
                .contains("LAB_NODE=CLUSTER_NODE")
        );
        assert!(parse_placement(["a="]).is_err());
        assert!(
            parse_placement(["a=n1", "a=n2"])
                .unwrap_err()
                .contains("twice")
        );
        assert!(parse_placement([""]).unwrap().is_empty());
    }
}
