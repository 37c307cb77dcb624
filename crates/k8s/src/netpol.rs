//! Does the cluster enforce NetworkPolicy? A run's policy is what keeps other students'
//! pods out of a lab and a lab's pods off the API server and the rest of the cluster, and a
//! network plugin that does not implement NetworkPolicy accepts the object and enforces
//! nothing. So it is asked, not assumed: a probe pod whose every egress a policy denies
//! tries to open a TCP connection to a target pod and must be refused, after a control pod
//! without that policy connected (so that a refusal is the policy's, not a target no pod
//! reaches). Pod to pod is what the policy of a run stops (another student's pods); what a
//! plugin does with a pod's traffic to its own node differs between plugins and is not
//! asked here. Every pod runs iblab's own image, unprivileged (`iblab connect`), in a
//! namespace the caller names, and goes whatever happens.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, PodSpec, SeccompProfile};
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
    pub fn describe(&self) -> String {
        match self {
            Enforcement::Enforced => "enforced: a pod whose egress a NetworkPolicy denies could \
                 not reach a pod that a pod without it reached"
                .into(),
            Enforcement::NotEnforced => "NOT enforced: a pod whose egress a NetworkPolicy denies \
                 reached another pod all the same; lab pods are then open to every pod of the \
                 cluster and reach every pod of it (use a network plugin that implements \
                 NetworkPolicy: Calico, Cilium, kube-router, …)"
                .into(),
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

/// The port the target pod listens on.
const TARGET_PORT: u16 = 8080;

/// A probe pod: `iblab connect ARGS` as iblab's unprivileged user, nothing added; `role`:
/// target (listens), control or denied (connect).
fn probe_pod(name: &str, ns: &str, image: &str, pull: &str, role: &str, args: &[String]) -> Pod {
    let mut command = vec!["/usr/local/bin/iblab".to_string(), "connect".into()];
    command.extend(args.iter().cloned());
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                (PROBE_LABEL.into(), role.into()),
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
                command: Some(command),
                security_context: Some(crate::manifest::unprivileged()),
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

/// How long a connecting pod waits after it started: a network plugin applies a policy
/// to a pod once it has seen the pod (kube-router after its next sync, a few seconds),
/// and a connection in between proves nothing.
pub const SETTLE_S: u64 = 15;

/// The connecting pods' arguments; `settle`: wait [`SETTLE_S`] first (the denied pod).
fn connect_args(target: &str, settle: bool) -> Vec<String> {
    let mut v = vec![
        target.to_string(),
        "--within".into(),
        format!("{CONNECT_WITHIN_S}s"),
    ];
    if settle {
        v.extend(["--after".into(), format!("{SETTLE_S}s")]);
    }
    v
}

/// Create `pod` and poll its status until `done` says what it shows, or fail after
/// [`POD_WITHIN`] (`want`: what it was waited for, for the message).
async fn create_and_wait<T>(
    pods: &Api<Pod>,
    pod: Pod,
    want: &str,
    done: impl Fn(&k8s_openapi::api::core::v1::PodStatus) -> Option<T>,
) -> Result<T, String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("cannot create the probe pod {name}: {e}"))?;
    let deadline = Instant::now() + POD_WITHIN;
    loop {
        let status = pods
            .get_opt(&name)
            .await
            .map_err(|e| format!("cannot read the probe pod {name}: {e}"))?
            .and_then(|p| p.status)
            .unwrap_or_default();
        if let Some(t) = done(&status) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the probe pod {name} did not {want} within {} s (phase {:?}: is the image \
                 on the nodes?)",
                POD_WITHIN.as_secs(),
                status.phase
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The target pod, running, and its IP (`Err` too if it failed).
async fn target_ip(pods: &Api<Pod>, pod: Pod) -> Result<String, String> {
    let ip = create_and_wait(pods, pod, "run", |s| match s.phase.as_deref() {
        Some("Running") => s.pod_ip.clone().map(Ok),
        Some("Failed") => Some(Err("the probe's target pod failed".to_string())),
        _ => None,
    })
    .await??;
    // Its listener starts a moment after the container does.
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(ip)
}

/// Run one probe pod to its end: did it connect? `Err`: it never said.
async fn connected(pods: &Api<Pod>, pod: Pod) -> Result<bool, String> {
    create_and_wait(pods, pod, "finish", |s| match s.phase.as_deref() {
        Some("Succeeded") => Some(true),
        Some("Failed") => Some(false),
        _ => None,
    })
    .await
}

/// Delete the probe's three pods and its policy (the policy is named after the denied
/// pod) and wait until the pods are gone, so that names can be used again. `Err`: what is
/// still there.
async fn remove(
    pods: &Api<Pod>,
    policies: &Api<NetworkPolicy>,
    ns: &str,
    names: [&String; 3],
) -> Result<(), String> {
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::background()
    };
    let gone = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
    for p in names {
        if let Err(e) = pods.delete(p, &now).await
            && !gone(&e)
        {
            tracing::warn!(pod = %p, namespace = ns, "cannot delete the probe's pod: {e}");
        }
    }
    if let Err(e) = policies.delete(names[2], &now).await
        && !gone(&e)
    {
        tracing::warn!(
            namespace = ns,
            "cannot delete the probe's NetworkPolicy: {e}"
        );
    }
    let deadline = Instant::now() + POD_WITHIN;
    for p in names {
        while pods.get_opt(p).await.is_ok_and(|p| p.is_some()) {
            if Instant::now() > deadline {
                return Err(format!("the probe's pod {p} in {ns} is not gone"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Probe the cluster in namespace `ns`: a target pod listens, the control pod connects
/// to it, then the denied one must not. Everything it made is deleted before it returns.
///
/// `suffix` names its objects: an operator passes the same one at every start (from its
/// pod's name), so that what a probe cut short by a crash left is removed by the next
/// one; `doctor` a fresh one.
pub async fn probe(
    client: &Client,
    ns: &str,
    image: &str,
    pull: &str,
    suffix: &str,
) -> Enforcement {
    let (target, control, denied) = (
        format!("iblab-netpol-target-{suffix}"),
        format!("iblab-netpol-control-{suffix}"),
        format!("iblab-netpol-denied-{suffix}"),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    // What an earlier probe of this name left goes first.
    if let Err(left) = remove(&pods, &policies, ns, [&target, &control, &denied]).await {
        return Enforcement::Unknown(left);
    }
    let asked = async {
        let listen = vec![format!("0.0.0.0:{TARGET_PORT}"), "--listen".into()];
        let ip = target_ip(
            &pods,
            probe_pod(&target, ns, image, pull, "target", &listen),
        )
        .await?;
        let to = format!("{ip}:{TARGET_PORT}");
        let args = connect_args(&to, false);
        if !connected(
            &pods,
            probe_pod(&control, ns, image, pull, "control", &args),
        )
        .await?
        {
            return Ok(Enforcement::Unknown(format!(
                "a pod without a NetworkPolicy could not reach the probe's target pod ({to}) \
                 either, so a refusal would prove nothing"
            )));
        }
        policies
            .create(&PostParams::default(), &deny_policy(&denied, ns))
            .await
            .map_err(|e| format!("cannot create the probe's NetworkPolicy: {e}"))?;
        // The pod it selects is created after it, and tries only once it has settled.
        Ok::<_, String>(
            match connected(
                &pods,
                probe_pod(&denied, ns, image, pull, "denied", &connect_args(&to, true)),
            )
            .await?
            {
                true => Enforcement::NotEnforced,
                false => Enforcement::Enforced,
            },
        )
    }
    .await;
    let _ = remove(&pods, &policies, ns, [&target, &control, &denied]).await;
    asked.unwrap_or_else(Enforcement::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_pod_is_unprivileged_and_only_the_denied_one_is_selected() {
        let args = connect_args("10.0.0.9:8080", true);
        let p = probe_pod("x", "ns", "iblab/operator:1", "Never", "denied", &args);
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
            ["connect".to_string(), "10.0.0.9:8080".into()]
        );
        let pol = deny_policy("x", "ns").spec.unwrap();
        assert_eq!(pol.egress, Some(vec![]));
        assert_eq!(
            pol.pod_selector.unwrap().match_labels.unwrap()[PROBE_LABEL],
            "denied"
        );
        let control = probe_pod("y", "ns", "i", "Never", "control", &args);
        assert_eq!(control.metadata.labels.unwrap()[PROBE_LABEL], "control");
    }
}
