//! Removing what the kube backend created: a run's namespace (or, in a namespace iblab
//! did not make, the run's anchor and pods by label), waited for until the API no longer
//! has it; and, for `down --all`, every object labelled with a run id whose run is gone.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};

use crate::manifest::{anchor_name, label};
use iblab_backend::{Scope, Swept};

/// The owner label of a LabRun's run (`labrun-` and the LabRun's uid, set by the
/// operator): its operator removes it, and no sweep from the command line does, not even
/// one of every owner.
pub const LABRUN_OWNER_PREFIX: &str = "labrun-";

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

/// Delete a run's objects in a namespace it does not own: its pods, its anchor and its
/// NetworkPolicy, by
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
    // Its anchor owns it, but the garbage collector takes its time: gone now.
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    match policies.delete(&anchor_name(run_id), &now()).await {
        Ok(_) => {}
        Err(e) if not_found(&e) => {}
        Err(e) => problems.push(format!("NetworkPolicy of run {run_id} in {ns}: {e}")),
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

/// The runs that have objects in `ns` (pods, anchors), each with its owner label.
pub async fn runs_in(
    client: &Client,
    ns: &str,
) -> Result<std::collections::BTreeMap<String, Option<String>>, String> {
    let any_run = ListParams::default().labels(label::RUN);
    let mut runs = std::collections::BTreeMap::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let labels: Vec<std::collections::BTreeMap<String, String>> = pods
        .list(&any_run)
        .await
        .map_err(|e| format!("cannot list the runs' pods in {ns}: {e}"))?
        .items
        .into_iter()
        .map(|p| p.metadata.labels.unwrap_or_default())
        .chain(
            maps.list(&any_run)
                .await
                .map_err(|e| format!("cannot list the runs' anchors in {ns}: {e}"))?
                .items
                .into_iter()
                .map(|m| m.metadata.labels.unwrap_or_default()),
        )
        .collect();
    for l in labels {
        if let Some(run) = l.get(label::RUN) {
            runs.insert(run.clone(), l.get(label::OWNER).cloned());
        }
    }
    Ok(runs)
}

/// Every namespace and anchor labelled with a run id, in every namespace, that `scope`
/// lets go: its owner's (or, with no owner, everyone's), except the runs it spares. What
/// it leaves of other owners' runs it counts, so `down --all` can say so.
pub async fn sweep_labelled(client: &Client, scope: &Scope<'_>) -> Swept {
    let mut out = Swept::default();
    let labelled = ListParams::default().labels(label::RUN);
    let run_of = |l: &std::collections::BTreeMap<String, String>| l.get(label::RUN).cloned();
    let mut others = std::collections::BTreeSet::new();
    let mut labruns = std::collections::BTreeSet::new();
    let mut ours = |l: &std::collections::BTreeMap<String, String>, run: &str| -> bool {
        let owner = l.get(label::OWNER).map(String::as_str);
        let mine = is_ours(scope.owner, owner);
        if !mine {
            if is_labruns(owner) {
                labruns.insert(run.to_string());
            } else {
                others.insert(run.to_string());
            }
        }
        mine && !(scope.spare)(run)
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut own = Vec::new();
    match namespaces.list(&labelled).await {
        Ok(list) => {
            for ns in list.items {
                let Some(run) = run_of(ns.labels()) else {
                    continue;
                };
                let name = ns.name_any();
                if !ours(ns.labels(), &run) {
                    own.push(name);
                    continue;
                }
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
                if own.contains(&ns) || !ours(cm.labels(), &run) {
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
    if !others.is_empty() {
        out.left.push(format!(
            "{} run(s) on the cluster started by another owner (another machine or state \
             folder): {}; `iblab down --all --all-owners` lists them and, once confirmed, \
             removes those whose owner is not alive here too",
            others.len(),
            others.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
        out.others = others.into_iter().collect();
    }
    if !labruns.is_empty() {
        out.left.push(format!(
            "{} run(s) of LabRuns: {}; their operator removes each when its LabRun is \
             deleted (`kubectl delete labrun NAME`), never a sweep from here",
            labruns.len(),
            labruns.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    out
}

/// Is this owner label a LabRun's?
fn is_labruns(object: Option<&str>) -> bool {
    object.is_some_and(|o| o.starts_with(LABRUN_OWNER_PREFIX))
}

/// Does an object with this owner label belong to the sweep's owner? Every object does
/// when the sweep is for every owner; none without the label otherwise (it was made by an
/// iblab before owners were labelled, or by hand: not provably ours).
/// A LabRun's objects are only ever the sweep's of that same owner.
fn is_ours(sweeper: Option<&str>, object: Option<&str>) -> bool {
    match sweeper {
        None => !is_labruns(object),
        Some(me) => object == Some(me),
    }
}

#[cfg(test)]
mod tests {
    use super::is_ours;

    #[test]
    fn a_sweep_takes_only_its_owners_objects_unless_told_everyones() {
        assert!(is_ours(Some("me"), Some("me")));
        assert!(!is_ours(Some("me"), Some("you")));
        assert!(!is_ours(Some("me"), None));
        assert!(is_ours(None, Some("you")));
        assert!(is_ours(None, None));
    }

    #[test]
    fn a_labruns_objects_are_never_a_sweep_of_every_owners() {
        let labrun = Some("labrun-5f0c3a4e-1b2d-4c8e-9a7f-0e6d5c4b3a21");
        assert!(!is_ours(None, labrun));
        assert!(!is_ours(Some("me"), labrun));
        assert!(is_ours(labrun, labrun));
    }
}
