//! Does the cluster enforce NetworkPolicy? A run's policy is what keeps other students'
//! pods out of a lab and a lab's pods off the API server and the rest of the cluster, and a
//! network plugin that does not implement NetworkPolicy accepts the object and enforces
//! nothing. So it is asked, not assumed: a probe pod whose every egress a policy denies
//! tries to open a TCP connection to the API server and must be refused, after a control
//! pod without that policy connected (so that a refusal is the policy's, not an address
//! that no pod reaches). Both pods run iblab's own image, unprivileged (`iblab connect`),
//! in a namespace the caller names, and go whatever happens.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, Pod, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};

/// What the probe found.
#[derive(Debug, Clone, PartialEq)]
pub enum Enforcement {
    /// The denied pod was refused, the control pod connected.
    Enforced,
    /// The denied pod connected all the same.
    NotEnforced,
    /// The probe could not tell (no control connection, a pod that never ran, rights).
    Unknown(String),
}

impl Enforcement {
    /// One line for `doctor`, a readiness answer and the logs.
    pub fn describe(&self, target: &str) -> String {
        match self {
            Enforcement::Enforced => format!(
                "enforced: a pod whose egress a NetworkPolicy denies could not reach {target}"
            ),
            Enforcement::NotEnforced => format!(
                "NOT enforced: a pod whose egress a NetworkPolicy denies reached {target}; lab \
                 pods are then open to every pod of the cluster and reach anything it reaches \
                 (use a network plugin that implements NetworkPolicy: Calico, Cilium, \
                 kube-router, …)"
            ),
            Enforcement::Unknown(why) => format!("unknown: {why}"),
        }
    }
}

/// The label that marks a probe's pods (and what its policy selects).
const PROBE_LABEL: &str = "iblab.dev/netpol-probe";
/// How long each pod may take from creation to its answer.
const POD_WITHIN: Duration = Duration::from_secs(90);
/// How long `iblab connect` waits for the connection.
pub const CONNECT_WITHIN_S: u64 = 3;

/// The probe's pod: `iblab connect TARGET` as iblab's unprivileged user, nothing added.
fn probe_pod(name: &str, ns: &str, image: &str, pull: &str, target: &str, denied: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                (
                    PROBE_LABEL.into(),
                    if denied { "denied" } else { "control" }.into(),
                ),
                // What the operator's pod policy asks of every pod it makes.
                (crate::manifest::label::RUN.into(), "netpol-probe".into()),
                ("app.kubernetes.io/managed-by".into(), "iblab".into()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(0),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(iblab_core::images::OPERATOR_UID.into()),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "connect".into(),
                image: Some(image.into()),
                image_pull_policy: Some(pull.into()),
                command: Some(vec![
                    "/usr/local/bin/iblab".into(),
                    "connect".into(),
                    target.into(),
                    "--within".into(),
                    format!("{CONNECT_WITHIN_S}s"),
                ]),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    read_only_root_filesystem: Some(true),
                    capabilities: Some(Capabilities {
                        add: None,
                        drop: Some(vec!["ALL".into()]),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The policy that denies the probe's denied pod every egress.
fn deny_policy(name: &str, ns: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                (PROBE_LABEL.into(), "policy".into()),
                ("app.kubernetes.io/managed-by".into(), "iblab".into()),
            ])),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(PROBE_LABEL.into(), "denied".into())])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(vec![]),
            ..Default::default()
        }),
    }
}

/// Run one probe pod to its end: did it connect? `Err`: it never said.
async fn connected(pods: &Api<Pod>, pod: Pod) -> Result<bool, String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("cannot create the probe pod {name}: {e}"))?;
    let deadline = Instant::now() + POD_WITHIN;
    loop {
        let p = pods
            .get_opt(&name)
            .await
            .map_err(|e| format!("cannot read the probe pod {name}: {e}"))?;
        let phase = p
            .as_ref()
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        match phase.as_str() {
            "Succeeded" => return Ok(true),
            "Failed" => return Ok(false),
            _ if Instant::now() > deadline => {
                return Err(format!(
                    "the probe pod {name} did not finish within {} s (phase {phase:?}: is the \
                     image on the nodes?)",
                    POD_WITHIN.as_secs()
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Probe the cluster in namespace `ns`: the control pod, then the denied one, both to
/// `target` (`host:port`, the API server as the pods reach it). Everything it made is
/// deleted before it returns.
pub async fn probe(
    client: &Client,
    ns: &str,
    image: &str,
    pull: &str,
    target: &str,
) -> Enforcement {
    let suffix = iblab_sys::state::new_run_id();
    let (control, denied) = (
        format!("iblab-netpol-control-{suffix}"),
        format!("iblab-netpol-denied-{suffix}"),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let asked = async {
        if !connected(&pods, probe_pod(&control, ns, image, pull, target, false)).await? {
            return Ok(Enforcement::Unknown(format!(
                "a pod without a NetworkPolicy could not reach {target} either, so a refusal \
                 would prove nothing"
            )));
        }
        policies
            .create(&PostParams::default(), &deny_policy(&denied, ns))
            .await
            .map_err(|e| format!("cannot create the probe's NetworkPolicy: {e}"))?;
        // A plugin enforces a policy a moment after it exists, never before a pod starts
        // that it selects (the pod is created after it).
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok::<_, String>(
            match connected(&pods, probe_pod(&denied, ns, image, pull, target, true)).await? {
                true => Enforcement::NotEnforced,
                false => Enforcement::Enforced,
            },
        )
    }
    .await;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::background()
    };
    for p in [&control, &denied] {
        let _ = pods.delete(p, &now).await;
    }
    let _ = policies.delete(&denied, &now).await;
    asked.unwrap_or_else(Enforcement::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_pod_is_unprivileged_and_only_the_denied_one_is_selected() {
        let p = probe_pod(
            "x",
            "ns",
            "iblab/operator:1",
            "Never",
            "198.19.0.1:6443",
            true,
        );
        let spec = p.spec.unwrap();
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(
            c.command.as_ref().unwrap()[1..3],
            ["connect".to_string(), "198.19.0.1:6443".into()]
        );
        let pol = deny_policy("x", "ns").spec.unwrap();
        assert_eq!(pol.egress, Some(vec![]));
        assert_eq!(
            pol.pod_selector.unwrap().match_labels.unwrap()[PROBE_LABEL],
            "denied"
        );
        let control = probe_pod("y", "ns", "i", "Never", "t:1", false);
        assert_eq!(control.metadata.labels.unwrap()[PROBE_LABEL], "control");
    }
}
