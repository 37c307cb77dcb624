//! Does the cluster enforce NetworkPolicy? A run's policy is what keeps other students'
//! pods out of a lab and a lab's pods off the API server and the rest of the cluster, and a
//! network plugin that does not implement NetworkPolicy accepts the object and enforces
//! nothing. So it is asked, not assumed, both ways and for both protocols a lab uses (its
//! links are VXLAN, which is UDP): two target pods listen on TCP and UDP (an echo), one of
//! them selected by a policy that denies it every ingress; a control pod without a policy
//! must reach the open target over both and must not reach the closed one over either; a
//! pod whose every egress a policy denies must reach neither. A control that cannot reach
//! the open target makes the answer unknown (a refusal would prove nothing). Pod to pod is
//! what the policy of a run stops (another student's pods); what a plugin does with a
//! pod's traffic to its own node differs between plugins and is not asked here. Every pod
//! runs iblab's own image, unprivileged (`iblab connect`, which reports what it reached in
//! its termination message), in a namespace the caller names, and goes whatever happens.

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
    /// Every denied way was refused (egress and ingress, TCP and UDP), the control pod
    /// reached the open target over both.
    Enforced,
    /// These denied ways got through all the same.
    NotEnforced(Vec<String>),
    /// The probe could not tell (no control connection, a pod that never ran, rights).
    Unknown(String),
}

impl Enforcement {
    /// One line for `doctor`, a readiness answer and the logs.
    pub fn describe(&self) -> String {
        match self {
            Enforcement::Enforced => "enforced: a pod whose egress a NetworkPolicy denies \
                 reached nothing, and nothing reached a pod whose ingress one denies, over TCP \
                 and UDP, where a pod without a policy reached a target over both"
                .into(),
            Enforcement::NotEnforced(leaks) => format!(
                "NOT enforced: {} all the same; lab pods are then open to every pod of the \
                 cluster and reach every pod of it (use a network plugin that implements \
                 NetworkPolicy: Calico, Cilium, kube-router, …)",
                leaks.join(", ")
            ),
            Enforcement::Unknown(why) => format!("unknown: {why}"),
        }
    }
}

/// Why the probe could not tell (said in `Enforcement::Unknown`).
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("cannot create the probe pod {name}: {source}")]
    CreatePod {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read the probe pod {name}: {source}")]
    ReadPod {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the probe pod {name} did not {want} within {} s (phase {phase:?}: is the image on the \
         nodes?)",
        POD_WITHIN.as_secs()
    )]
    Late {
        name: String,
        want: &'static str,
        phase: Option<String>,
    },
    #[error("the probe's target pod failed")]
    TargetFailed,
    #[error("cannot create the probe's NetworkPolicy {name}: {source}")]
    CreatePolicy {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the probe's pod {pod} in {ns} is not gone")]
    NotGone { pod: String, ns: String },
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

/// A policy of the probe: it denies the pods of `role` every egress or every ingress.
fn deny_policy(name: &str, ns: &str, role: &str, direction: &str) -> NetworkPolicy {
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
                match_labels: Some(BTreeMap::from([(PROBE_LABEL.into(), role.into())])),
                ..Default::default()
            }),
            policy_types: Some(vec![direction.into()]),
            egress: (direction == "Egress").then(Vec::new),
            ingress: (direction == "Ingress").then(Vec::new),
        }),
    }
}

/// How long a connecting pod waits after it started: a network plugin applies a policy
/// to a pod once it has seen the pod (kube-router after its next sync, a few seconds),
/// and a connection in between proves nothing.
pub const SETTLE_S: u64 = 15;

/// The connecting pods' arguments: each target over TCP and UDP (`tcp:IP:PORT`,
/// `udp:IP:PORT`), after [`SETTLE_S`].
fn connect_args(targets: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = targets
        .iter()
        .flat_map(|t| [format!("tcp:{t}"), format!("udp:{t}")])
        .collect();
    v.extend([
        "--within".into(),
        format!("{CONNECT_WITHIN_S}s"),
        "--after".into(),
        format!("{SETTLE_S}s"),
    ]);
    v
}

/// What a connecting pod said it reached (`reached tcp:…` lines of its termination
/// message).
fn reached(message: &str) -> Vec<String> {
    message
        .lines()
        .filter_map(|l| l.strip_prefix("reached "))
        .map(|t| t.trim().to_string())
        .collect()
}

/// The verdict from what the control pod and the denied pod reached: the open target
/// `open`, the ingress-closed target `closed` (each `IP:PORT`).
fn judge(open: &str, closed: &str, control: &[String], denied: &[String]) -> Enforcement {
    let has = |v: &[String], t: String| v.contains(&t);
    let missing: Vec<String> = ["tcp", "udp"]
        .iter()
        .filter(|p| !has(control, format!("{p}:{open}")))
        .map(|p| p.to_uppercase())
        .collect();
    if !missing.is_empty() {
        return Enforcement::Unknown(format!(
            "a pod without a NetworkPolicy could not reach the probe's target pod ({open}) \
             over {} either, so a refusal would prove nothing",
            missing.join(" or ")
        ));
    }
    let mut leaks = Vec::new();
    for p in ["tcp", "udp"] {
        if has(denied, format!("{p}:{open}")) {
            leaks.push(format!(
                "a pod whose egress a NetworkPolicy denies reached another pod over {}",
                p.to_uppercase()
            ));
        }
        if has(control, format!("{p}:{closed}")) {
            leaks.push(format!(
                "a pod whose ingress a NetworkPolicy denies was reached over {}",
                p.to_uppercase()
            ));
        }
    }
    if leaks.is_empty() {
        Enforcement::Enforced
    } else {
        Enforcement::NotEnforced(leaks)
    }
}

/// Create `pod` and poll its status until `done` says what it shows, or fail after
/// [`POD_WITHIN`] (`want`: what it was waited for, for the message).
async fn create_and_wait<T>(
    pods: &Api<Pod>,
    pod: Pod,
    want: &'static str,
    done: impl Fn(&k8s_openapi::api::core::v1::PodStatus) -> Option<T>,
) -> Result<T, ProbeError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if let Err(source) = pods.create(&PostParams::default(), &pod).await {
        return Err(ProbeError::CreatePod { name, source });
    }
    let deadline = Instant::now() + POD_WITHIN;
    loop {
        let status = pods
            .get_opt(&name)
            .await
            .map_err(|source| ProbeError::ReadPod {
                name: name.clone(),
                source,
            })?
            .and_then(|p| p.status)
            .unwrap_or_default();
        if let Some(t) = done(&status) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            return Err(ProbeError::Late {
                name,
                want,
                phase: status.phase,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The target pod, running, and its IP (`Err` too if it failed).
async fn target_ip(pods: &Api<Pod>, pod: Pod) -> Result<String, ProbeError> {
    let ip = create_and_wait(pods, pod, "run", |s| match s.phase.as_deref() {
        Some("Running") => s.pod_ip.clone().map(Ok),
        Some("Failed") => Some(Err(ProbeError::TargetFailed)),
        _ => None,
    })
    .await??;
    Ok(ip)
}

/// Run one connecting pod to its end: what it reached (its termination message). `Err`:
/// it never said.
async fn reached_by(pods: &Api<Pod>, pod: Pod) -> Result<Vec<String>, ProbeError> {
    create_and_wait(pods, pod, "finish", |s| match s.phase.as_deref() {
        Some("Succeeded") | Some("Failed") => Some(
            s.container_statuses
                .iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
                .flat_map(|m| reached(&m))
                .collect(),
        ),
        _ => None,
    })
    .await
}

/// Delete the probe's pods and its policies and wait until the pods are gone, so that
/// names can be used again. `Err`: what is still there.
async fn remove(
    pods: &Api<Pod>,
    policies: &Api<NetworkPolicy>,
    ns: &str,
    names: &[&String],
    policy_names: &[&String],
) -> Result<(), ProbeError> {
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
    for p in policy_names {
        if let Err(e) = policies.delete(p, &now).await
            && !gone(&e)
        {
            tracing::warn!(
                namespace = ns,
                "cannot delete the probe's NetworkPolicy {p}: {e}"
            );
        }
    }
    let deadline = Instant::now() + POD_WITHIN;
    for p in names {
        while pods.get_opt(p).await.is_ok_and(|p| p.is_some()) {
            if Instant::now() > deadline {
                return Err(ProbeError::NotGone {
                    pod: p.to_string(),
                    ns: ns.to_string(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Probe the cluster in namespace `ns`: two targets listen (one behind an ingress-deny
/// policy), then a control pod and a pod behind an egress-deny policy try both over TCP
/// and UDP. Everything it made is deleted before it returns.
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
    let name = |what: &str| format!("iblab-netpol-{what}-{suffix}");
    let (open, closed, control, denied) = (
        name("target"),
        name("closed"),
        name("control"),
        name("denied"),
    );
    let (deny_in, deny_out) = (name("deny-ingress"), name("deny-egress"));
    let all = [&open, &closed, &control, &denied];
    let all_policies = [&deny_in, &deny_out];
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    // What an earlier probe of this name left goes first.
    if let Err(left) = remove(&pods, &policies, ns, &all, &all_policies).await {
        return Enforcement::Unknown(left.to_string());
    }
    let asked = async {
        for (p, role, direction) in [
            (&deny_in, "closed", "Ingress"),
            (&deny_out, "denied", "Egress"),
        ] {
            policies
                .create(&PostParams::default(), &deny_policy(p, ns, role, direction))
                .await
                .map_err(|source| ProbeError::CreatePolicy {
                    name: p.to_string(),
                    source,
                })?;
        }
        let listen = vec![format!("0.0.0.0:{TARGET_PORT}"), "--listen".into()];
        let (open_ip, closed_ip) = tokio::try_join!(
            target_ip(&pods, probe_pod(&open, ns, image, pull, "target", &listen)),
            target_ip(
                &pods,
                probe_pod(&closed, ns, image, pull, "closed", &listen)
            ),
        )?;
        let (to_open, to_closed) = (
            format!("{open_ip}:{TARGET_PORT}"),
            format!("{closed_ip}:{TARGET_PORT}"),
        );
        // Both connecting pods at once: each waits for the plugin to have seen it.
        let (by_control, by_denied) = tokio::try_join!(
            reached_by(
                &pods,
                probe_pod(
                    &control,
                    ns,
                    image,
                    pull,
                    "control",
                    &connect_args(&[&to_open, &to_closed]),
                ),
            ),
            reached_by(
                &pods,
                probe_pod(
                    &denied,
                    ns,
                    image,
                    pull,
                    "denied",
                    &connect_args(&[&to_open])
                ),
            ),
        )?;
        Ok::<_, ProbeError>(judge(&to_open, &to_closed, &by_control, &by_denied))
    }
    .await;
    let _ = remove(&pods, &policies, ns, &all, &all_policies).await;
    asked.unwrap_or_else(|e| Enforcement::Unknown(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_pod_is_unprivileged_and_each_policy_selects_one_role() {
        let args = connect_args(&["10.0.0.9:8080"]);
        assert_eq!(
            args[..2],
            ["tcp:10.0.0.9:8080".to_string(), "udp:10.0.0.9:8080".into()]
        );
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
            ["connect".to_string(), "tcp:10.0.0.9:8080".into()]
        );
        let out = deny_policy("x", "ns", "denied", "Egress").spec.unwrap();
        assert_eq!(out.egress, Some(vec![]));
        assert_eq!(out.ingress, None);
        assert_eq!(
            out.pod_selector.unwrap().match_labels.unwrap()[PROBE_LABEL],
            "denied"
        );
        let inn = deny_policy("y", "ns", "closed", "Ingress").spec.unwrap();
        assert_eq!(
            (inn.ingress, inn.policy_types),
            (Some(vec![]), Some(vec!["Ingress".to_string()]))
        );
    }

    #[test]
    fn every_way_must_be_refused_and_the_control_must_get_through() {
        let (open, closed) = ("10.0.0.1:8080", "10.0.0.2:8080");
        let r = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let control = r(&["tcp:10.0.0.1:8080", "udp:10.0.0.1:8080"]);
        assert_eq!(judge(open, closed, &control, &[]), Enforcement::Enforced);
        // UDP out of an egress-denied pod (a VXLAN link is UDP).
        let leaks = judge(open, closed, &control, &r(&["udp:10.0.0.1:8080"]));
        assert!(
            matches!(&leaks, Enforcement::NotEnforced(l) if l.len() == 1 && l[0].contains("egress") && l[0].contains("UDP")),
            "{leaks:?}"
        );
        assert!(leaks.describe().starts_with("NOT enforced"));
        // TCP into an ingress-denied pod.
        let mut c2 = control.clone();
        c2.push("tcp:10.0.0.2:8080".into());
        assert!(
            matches!(judge(open, closed, &c2, &[]), Enforcement::NotEnforced(l) if l[0].contains("ingress"))
        );
        // A control that did not get through over UDP: nothing can be told.
        assert!(matches!(
            judge(open, closed, &r(&["tcp:10.0.0.1:8080"]), &[]),
            Enforcement::Unknown(w) if w.contains("UDP")
        ));
        assert_eq!(
            reached("reached tcp:a:1\nnot reached udp:a:1\n"),
            ["tcp:a:1"]
        );
    }
}
