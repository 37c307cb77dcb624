//! The objects a run applies, built from k8s-openapi types and nothing else: pure, so
//! `iblab render` writes exactly what `up --backend kube` applies, and golden files pin it.
//!
//! A run is one anchor ConfigMap (`iblab-<run>`: the lab, the plan of its links) that
//! owns every pod, so one deletion collects the run even in a namespace iblab did not
//! make; with no `--namespace`, the run also has a namespace of its own, and deleting that
//! removes everything.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, Namespace, Pod, PodSpec, ResourceRequirements,
    SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::links;
use super::settings::Settings;
use crate::plan::{Plan, PlannedNode};

/// Labels every object of a run carries.
pub mod label {
    pub const RUN: &str = "iblab.dev/run";
    pub const LAB: &str = "iblab.dev/lab";
    pub const NODE: &str = "iblab.dev/node";
    pub const ROLE: &str = "iblab.dev/role";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
}

/// The run id `iblab render` writes (a real run's is random).
pub const RENDER_RUN: &str = "render";

/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "iblab";
/// The container of a lab pod.
pub const CONTAINER: &str = "node";

/// Capabilities a lab pod gets on top of the runtime's defaults (which have NET_RAW for
/// ping on most runtimes; asked for explicitly so a restricted default does not break it):
/// NET_ADMIN for the VXLAN links, bridges, addresses, tc and nftables inside the pod.
pub const CAPABILITIES: &[&str] = &["NET_ADMIN", "NET_RAW"];
/// What verbs need on a real adapter: pinning registered memory.
pub const HCA_CAPABILITIES: &[&str] = &["IPC_LOCK"];

/// The namespace a run's objects go to, and whether the run owns it.
pub fn namespace_of(run_id: &str, settings: &Settings) -> (String, bool) {
    match &settings.namespace {
        Some(ns) => (ns.clone(), false),
        None => (format!("{}{run_id}", crate::run::state::PREFIX), true),
    }
}

/// The anchor object's name (a ConfigMap), which owns the run's pods.
pub fn anchor_name(run_id: &str) -> String {
    format!("{}{run_id}", crate::run::state::PREFIX)
}

fn labels(run_id: &str, lab: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (label::RUN.into(), run_id.into()),
        (label::LAB.into(), lab.into()),
        (label::MANAGED_BY.into(), "iblab".into()),
    ])
}

/// The run's own namespace.
pub fn namespace(run_id: &str, plan: &Plan, name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(run_id, &plan.lab)),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The anchor: what the run is, readable with kubectl, and the owner of its pods.
pub fn anchor(run_id: &str, plan: &Plan, ns: &str) -> ConfigMap {
    let links: Vec<String> = plan
        .nodes
        .iter()
        .flat_map(|n| {
            links::vxlan_lines(plan, n, |peer| format!("<pod IP of {peer}>"))
                .into_iter()
                .map(move |l| format!("{}: {l}", n.name))
        })
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(anchor_name(run_id)),
            namespace: Some(ns.into()),
            labels: Some(labels(run_id, &plan.lab)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("lab".into(), plan.lab.clone()),
            ("scenario".into(), plan.scenario.clone()),
            (
                "paths".into(),
                plan.paths
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("links".into(), links.join("\n") + "\n"),
        ])),
        ..Default::default()
    }
}

/// One node or switch as a pod of the lab image. `owner_uid` is the anchor's uid once it
/// exists (rendering without a cluster leaves the reference out).
pub fn pod(
    run_id: &str,
    plan: &Plan,
    n: &PlannedNode,
    ns: &str,
    settings: &Settings,
    owner_uid: Option<&str>,
) -> Pod {
    let mut labels = labels(run_id, &plan.lab);
    labels.insert(label::NODE.into(), n.name.clone());
    labels.insert(
        label::ROLE.into(),
        if n.switch { "switch" } else { "node" }.into(),
    );
    let hca = settings.rdma_resource.as_ref().filter(|_| !n.switch);
    let mut caps: Vec<String> = CAPABILITIES.iter().map(|c| c.to_string()).collect();
    if hca.is_some() {
        caps.extend(HCA_CAPABILITIES.iter().map(|c| c.to_string()));
    }
    let resources = hca.map(|r| {
        let one = BTreeMap::from([(r.clone(), Quantity("1".into()))]);
        ResourceRequirements {
            limits: Some(one.clone()),
            requests: Some(one),
            ..Default::default()
        }
    });
    Pod {
        metadata: ObjectMeta {
            name: Some(n.name.clone()),
            namespace: Some(ns.into()),
            labels: Some(labels),
            owner_references: owner_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: anchor_name(run_id),
                    uid: uid.into(),
                    block_owner_deletion: Some(true),
                    controller: Some(true),
                }]
            }),
            ..Default::default()
        },
        spec: Some(PodSpec {
            hostname: Some(n.name.clone()),
            restart_policy: Some("Never".into()),
            // `sleep` as PID 1 ignores SIGTERM: there is nothing to shut down gracefully.
            termination_grace_period_seconds: Some(0),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            containers: vec![Container {
                name: CONTAINER.into(),
                image: Some(settings.image.clone()),
                image_pull_policy: Some(settings.pull_policy.clone()),
                command: Some(vec!["sleep".into(), "infinity".into()]),
                security_context: Some(SecurityContext {
                    privileged: Some(false),
                    capabilities: Some(Capabilities {
                        add: Some(caps),
                        drop: None,
                    }),
                    ..Default::default()
                }),
                resources,
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every object of a run, in the order they are applied, as YAML documents.
pub fn render(run_id: &str, plan: &Plan, settings: &Settings) -> Result<String, String> {
    let (ns, own) = namespace_of(run_id, settings);
    let mut values = Vec::new();
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| e.to_string());
    if own {
        values.push(json(serde_json::to_value(namespace(run_id, plan, &ns)))?);
    }
    values.push(json(serde_json::to_value(anchor(run_id, plan, &ns)))?);
    for n in &plan.nodes {
        values.push(json(serde_json::to_value(pod(
            run_id, plan, n, &ns, settings, None,
        )))?);
    }
    let mut out = String::new();
    for v in values {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&v).map_err(|e| e.to_string())?);
    }
    Ok(out)
}
