//! Removing what the kube backend created: a run's namespace (or, in a namespace iblab
//! did not make, the run's anchor and pods by label), waited for until the API no longer
//! has it; and, for `down --all`, every object labelled with a run id whose run is gone.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};

use crate::manifest::{anchor_name, label};
use iblab_engine::backend::{Spare, Swept};

/// How long a deletion may take to finish before it is reported as left behind.
const GONE_WITHIN: Duration = Duration::from_secs(90);

fn now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::background()
    }
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Delete a run's own namespace and wait until it is gone (its pods with it).
pub async fn remove_namespace(client: &Client, name: &str) -> Option<String> {
    let api: Api<Namespace> = Api::all(client.clone());
    // Pods first, at once: a namespace waits for its pods' grace periods otherwise.
    let pods: Api<Pod> = Api::namespaced(client.clone(), name);
    let _ = pods.delete_collection(&now(), &ListParams::default()).await;
    match api.delete(name, &now()).await {
        Ok(_) => {}
        Err(e) if not_found(&e) => return None,
        Err(e) => return Some(format!("namespace {name} could not be removed: {e}")),
    }
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        match api.get_opt(name).await {
            Ok(None) => return None,
            Ok(Some(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Ok(Some(ns)) => {
                return Some(format!(
                    "namespace {name} is still {} after {}s",
                    ns.status
                        .and_then(|s| s.phase)
                        .unwrap_or_else(|| "there".into()),
                    GONE_WITHIN.as_secs()
                ));
            }
            Err(e) => return Some(format!("cannot tell whether namespace {name} is gone: {e}")),
        }
    }
}

/// Delete a run's objects in a namespace it does not own: its pods and its anchor, by
/// the run label, and wait until the pods are gone.
pub async fn remove_run_objects(client: &Client, ns: &str, run_id: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let by_run = ListParams::default().labels(&format!("{}={run_id}", label::RUN));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    if let Err(e) = pods.delete_collection(&now(), &by_run).await {
        problems.push(format!("pods of run {run_id} in {ns}: {e}"));
    }
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match maps.delete(&anchor_name(run_id), &now()).await {
        Ok(_) => {}
        Err(e) if not_found(&e) => {}
        Err(e) => problems.push(format!("anchor of run {run_id} in {ns}: {e}")),
    }
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        match pods.list(&by_run).await {
            Ok(l) if l.items.is_empty() => break,
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Ok(l) => {
                problems.push(format!(
                    "pods of run {run_id} still in {ns}: {}",
                    l.items
                        .iter()
                        .map(|p| p.name_any())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                break;
            }
            Err(e) => {
                problems.push(format!("cannot list pods of run {run_id} in {ns}: {e}"));
                break;
            }
        }
    }
    problems
}

/// Every namespace and anchor labelled with a run id, in every namespace, except the runs
/// `spare` names.
pub async fn sweep_labelled(client: &Client, spare: &Spare<'_>) -> Swept {
    let mut out = Swept::default();
    let labelled = ListParams::default().labels(label::RUN);
    let run_of = |l: &std::collections::BTreeMap<String, String>| l.get(label::RUN).cloned();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut own = Vec::new();
    match namespaces.list(&labelled).await {
        Ok(list) => {
            for ns in list.items {
                let Some(run) = run_of(ns.labels()) else {
                    continue;
                };
                if spare(&run) {
                    continue;
                }
                let name = ns.name_any();
                own.push(name.clone());
                match remove_namespace(client, &name).await {
                    None => out
                        .removed
                        .push(format!("namespace {name} (by label {})", label::RUN)),
                    Some(p) => out.problems.push(p),
                }
            }
        }
        Err(e) => out.problems.push(format!("cannot list namespaces: {e}")),
    }
    let anchors: Api<ConfigMap> = Api::all(client.clone());
    match anchors.list(&labelled).await {
        Ok(list) => {
            for cm in list.items {
                let Some(run) = run_of(cm.labels()) else {
                    continue;
                };
                let ns = cm.namespace().unwrap_or_default();
                if spare(&run) || own.contains(&ns) {
                    continue;
                }
                let problems = remove_run_objects(client, &ns, &run).await;
                if problems.is_empty() {
                    out.removed
                        .push(format!("run {run}'s pods and anchor in namespace {ns}"));
                }
                out.problems.extend(problems);
            }
        }
        Err(e) => out
            .problems
            .push(format!("cannot list iblab's anchors: {e}")),
    }
    out
}
