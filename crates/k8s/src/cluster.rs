//! Reaching a cluster the way kubectl users expect: `--context` (or the current context)
//! of `KUBECONFIG` / `~/.kube/config`, or the in-cluster service account when iblab runs
//! in a pod; and what `doctor` reports about it.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::settings::Settings;
use iblab_backend::EnvError;

/// How to fix an unreachable cluster, in the words of the error.
pub const FIX: &str = "point KUBECONFIG at a cluster (or ~/.kube/config; `--context NAME` \
                       picks a context), e.g. the test cluster: eval \"$(kube/cluster env)\" \
                       after `kube/cluster up`";

/// Is there configuration that names a cluster (a kubeconfig file, or in-cluster
/// service-account environment)? Says which, without connecting.
pub fn configured() -> Result<String, String> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Ok("the in-cluster service account".into());
    }
    let paths: Vec<std::path::PathBuf> = match std::env::var_os("KUBECONFIG") {
        Some(v) if !v.is_empty() => std::env::split_paths(&v).collect(),
        _ => std::env::var_os("HOME")
            .map(|h| vec![std::path::Path::new(&h).join(".kube/config")])
            .unwrap_or_default(),
    };
    match paths.iter().find(|p| p.is_file()) {
        Some(p) => Ok(format!("kubeconfig {}", p.display())),
        None => Err(format!(
            "no cluster configured: no kubeconfig at {} and not in a pod\n  fix: {FIX}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// A client for the configured cluster.
pub async fn connect(settings: &Settings) -> Result<Client, EnvError> {
    let config = config(settings).await?;
    let url = config.cluster_url.to_string();
    Client::try_from(config)
        .map_err(|e| EnvError::caused(format!("cannot make a client for {url}: {e}"), e))
}

async fn config(settings: &Settings) -> Result<Config, EnvError> {
    let config = match &settings.context {
        Some(ctx) => {
            let kc = Kubeconfig::read()
                .map_err(|e| EnvError::caused(format!("cannot read the kubeconfig: {e}"), e))?;
            Config::from_custom_kubeconfig(
                kc,
                &KubeConfigOptions {
                    context: Some(ctx.clone()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| EnvError::caused(format!("kubeconfig context `{ctx}`: {e}"), e))?
        }
        None => Config::infer().await.map_err(|e| {
            EnvError::caused(
                format!("no usable cluster configuration: {e}\n  fix: {FIX}"),
                e,
            )
        })?,
    };
    Ok(config)
}

/// What the cluster is, for `doctor` and the evidence.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub version: String,
    pub nodes: Vec<NodeFacts>,
    /// The cluster's RuntimeClasses by name; `None` where this user may not list them.
    pub runtime_classes: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    pub name: String,
    pub kernel: String,
    pub ready: bool,
    /// Extended resources that look like RDMA (`rdma/…`, `…/hca…`), with the amount
    /// allocatable.
    pub rdma_resources: Vec<(String, String)>,
    /// The same resources with the amount the node advertises (its capacity).
    pub rdma_capacity: Vec<(String, String)>,
    /// Every image name the node's runtime reports.
    pub images: Vec<String>,
    /// The node's labels (what a nodeSelector matches).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its taints, as `key=value:Effect`.
    pub taints: Vec<String>,
}

impl NodeFacts {
    /// Can pods on this node each have a Soft-RoCE device of their own? Read from the
    /// label its kernel's facts gave it ([`crate::manifest::label::RXE_PER_NETNS`]), never
    /// from its name.
    pub fn rxe_per_netns(&self) -> bool {
        self.labels
            .get(crate::manifest::label::RXE_PER_NETNS)
            .is_some_and(|v| v == "true")
    }
}

/// Ask the cluster what it is.
pub async fn facts(client: &Client) -> Result<Facts, EnvError> {
    let v = client
        .apiserver_version()
        .await
        .map_err(|e| EnvError::caused(format!("the cluster does not answer: {e}"), e))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| EnvError::caused(format!("cannot list nodes: {e}"), e))?;
    let classes: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(client.clone());
    let runtime_classes = classes.list(&ListParams::default()).await.ok().map(|l| {
        l.items
            .iter()
            .filter_map(|r| r.metadata.name.clone())
            .collect()
    });
    Ok(Facts {
        version: v.git_version,
        nodes: list.items.iter().map(node_facts).collect(),
        runtime_classes,
    })
}

pub fn node_facts(n: &Node) -> NodeFacts {
    let status = n.status.clone().unwrap_or_default();
    NodeFacts {
        name: n.metadata.name.clone().unwrap_or_default(),
        kernel: status
            .node_info
            .as_ref()
            .map(|i| i.kernel_version.clone())
            .unwrap_or_default(),
        ready: status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        rdma_resources: rdma_only(status.allocatable.clone()),
        rdma_capacity: rdma_only(status.capacity.clone()),
        images: status
            .images
            .unwrap_or_default()
            .iter()
            .flat_map(|i| i.names.clone().unwrap_or_default())
            .collect(),
        labels: n.metadata.labels.clone().unwrap_or_default(),
        taints: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .iter()
            .map(|t| {
                format!(
                    "{}{}:{}",
                    t.key,
                    t.value
                        .as_ref()
                        .map(|v| format!("={v}"))
                        .unwrap_or_default(),
                    t.effect
                )
            })
            .collect(),
    }
}

/// An extended resource that looks like an RDMA device plugin's (Mellanox's `rdma/…`,
/// NVIDIA's `nvidia.com/…rdma…`, an SR-IOV pool of `…hca…`, the test cluster's
/// `iblab.dev/rxe-stand-in`), or the one `IBLAB_KUBE_RDMA_RESOURCE` names.
fn is_rdma_resource(k: &str) -> bool {
    let k_lower = k.to_ascii_lowercase();
    ["rdma", "hca", "rxe", "infiniband", "roce"]
        .iter()
        .any(|w| k_lower.contains(w))
        || crate::settings::get().rdma_resource.as_deref() == Some(k)
}

fn rdma_only(
    r: Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
) -> Vec<(String, String)> {
    r.unwrap_or_default()
        .iter()
        .filter(|(k, _)| is_rdma_resource(k))
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// Does a node's runtime hold `image`? Runtimes report names fully qualified
/// (`docker.io/iblab/lab:0.1.0`), so a short reference is compared normalised.
pub fn has_image(images: &[String], image: &str) -> bool {
    let full = normalise(image);
    images.iter().any(|i| normalise(i) == full)
}

fn normalise(r: &str) -> String {
    let first = r.split('/').next().unwrap_or("");
    let has_registry =
        r.contains('/') && (first.contains('.') || first.contains(':')) || first == "localhost";
    let r = if has_registry {
        r.to_string()
    } else if r.contains('/') {
        format!("docker.io/{r}")
    } else {
        format!("docker.io/library/{r}")
    };
    if r.rsplit('/').next().is_some_and(|last| last.contains(':')) || r.contains('@') {
        r
    } else {
        format!("{r}:latest")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_compared_as_the_runtime_names_them() {
        let imgs = vec![
            "docker.io/iblab/lab:0.1.0".to_string(),
            "localhost/iblab/pause:1.0".to_string(),
        ];
        assert!(has_image(&imgs, "iblab/lab:0.1.0"));
        assert!(!has_image(&imgs, "iblab/lab:0.2.0"));
        assert!(has_image(&imgs, "localhost/iblab/pause:1.0"));
        assert!(!has_image(
            &["docker.io/library/busybox:latest".into()],
            "iblab/lab"
        ));
        assert!(has_image(
            &["docker.io/library/busybox:latest".into()],
            "busybox"
        ));
    }
}
