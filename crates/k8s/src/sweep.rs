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

/// The runs' objects in a namespace could not be listed.
#[derive(Debug, thiserror::Error)]
#[error("cannot list the runs' {what} in {ns}: {source}")]
pub struct ListError {
    /// "pods" or "anchors".
    pub what: &'static str,
    pub ns: String,
    #[source]
    pub source: kube::Error,
}

/// The runs that have objects in `ns` (pods, anchors), each with its owner label.
pub async fn runs_in(
    client: &Client,
    ns: &str,
) -> Result<std::collections::BTreeMap<String, Option<String>>, ListError> {
    let failed = |what| {
        move |source| ListError {
            what,
            ns: ns.to_string(),
            source,
        }
    };
    let any_run = ListParams::default().labels(label::RUN);
    let mut runs = std::collections::BTreeMap::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let labels: Vec<std::collections::BTreeMap<String, String>> = pods
        .list(&any_run)
        .await
        .map_err(failed("pods"))?
        .items
        .into_iter()
        .map(|p| p.metadata.labels.unwrap_or_default())
        .chain(
            maps.list(&any_run)
                .await
                .map_err(failed("anchors"))?
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

/// One object a sweep found for a run: what it is, where, and its uid.
#[derive(Debug, Clone)]
struct Found {
    kind: Kind,
    ns: Option<String>,
    name: String,
    uid: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Namespace,
    Anchor,
    Policy,
    Pod,
}

impl Found {
    fn of<K: kube::Resource>(kind: Kind, o: &K) -> Found {
        Found {
            kind,
            ns: o.meta().namespace.clone(),
            name: o.meta().name.clone().unwrap_or_default(),
            uid: o.meta().uid.clone().unwrap_or_default(),
        }
    }

    fn describe(&self) -> String {
        let kind = match self.kind {
            Kind::Namespace => "namespace",
            Kind::Anchor => "ConfigMap",
            Kind::Policy => "NetworkPolicy",
            Kind::Pod => "pod",
        };
        match &self.ns {
            Some(ns) => format!("{kind} {ns}/{}", self.name),
            None => format!("{kind} {}", self.name),
        }
    }
}

/// A run's objects in a namespace it does not own: its anchor, the NetworkPolicy of the
/// anchor's name that the anchor owns, and the pods the anchor owns (by its uid, not by a
/// label, which anyone who may make pods there can set).
async fn objects_with_anchor(client: &Client, anchor: &ConfigMap) -> Result<Vec<Found>, String> {
    let ns = anchor.namespace().unwrap_or_default();
    let uid = anchor.uid().unwrap_or_default();
    let owned = |refs: &Option<
        Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    >| { refs.iter().flatten().any(|r| r.uid == uid) };
    let mut out = vec![Found::of(Kind::Anchor, anchor)];
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    if let Some(p) = policies
        .get_opt(&anchor.name_any())
        .await
        .map_err(|e| format!("cannot read NetworkPolicy {ns}/{}: {e}", anchor.name_any()))?
        .filter(|p| owned(&p.metadata.owner_references))
    {
        out.push(Found::of(Kind::Policy, &p));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let listed = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list pods in {ns}: {e}"))?;
    out.extend(
        listed
            .items
            .iter()
            .filter(|p| owned(&p.metadata.owner_references))
            .map(|p| Found::of(Kind::Pod, p)),
    );
    Ok(out)
}

/// Delete exactly these objects: each by name with its uid as a precondition (an object
/// of that name made since is not this one and stays), then wait until each is gone.
async fn delete_exactly(client: &Client, objects: &[Found]) -> Vec<String> {
    let mut problems = Vec::new();
    for o in objects {
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(o.uid.clone()),
                resource_version: None,
            }),
            ..now()
        };
        let ns = o.ns.clone().unwrap_or_default();
        let r = match o.kind {
            Kind::Namespace => Api::<Namespace>::all(client.clone())
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
            Kind::Anchor => Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
            Kind::Policy => Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
            Kind::Pod => Api::<Pod>::namespaced(client.clone(), &ns)
                .delete(&o.name, &dp)
                .await
                .map(|_| ()),
        };
        match r {
            Ok(()) => {}
            // Gone already, or another object of that name by now (uid precondition).
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => problems.push(format!("{}: {e}", o.describe())),
        }
    }
    let deadline = Instant::now() + GONE_WITHIN;
    for o in objects {
        loop {
            let ns = o.ns.clone().unwrap_or_default();
            let uid = match o.kind {
                Kind::Namespace => Api::<Namespace>::all(client.clone())
                    .get_opt(&o.name)
                    .await
                    .map(|x| x.and_then(|x| x.metadata.uid)),
                Kind::Anchor => Api::<ConfigMap>::namespaced(client.clone(), &ns)
                    .get_opt(&o.name)
                    .await
                    .map(|x| x.and_then(|x| x.metadata.uid)),
                Kind::Policy => Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
                    .get_opt(&o.name)
                    .await
                    .map(|x| x.and_then(|x| x.metadata.uid)),
                Kind::Pod => Api::<Pod>::namespaced(client.clone(), &ns)
                    .get_opt(&o.name)
                    .await
                    .map(|x| x.and_then(|x| x.metadata.uid)),
            };
            match uid {
                Ok(Some(u)) if u == o.uid && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await
                }
                Ok(Some(u)) if u == o.uid => {
                    problems.push(format!(
                        "{} is still there after {}s",
                        o.describe(),
                        GONE_WITHIN.as_secs()
                    ));
                    break;
                }
                Ok(_) => break,
                Err(e) => {
                    problems.push(format!("cannot tell whether {} is gone: {e}", o.describe()));
                    break;
                }
            }
        }
    }
    problems
}

/// Every namespace and anchor labelled with a run id, in every namespace, that `scope`
/// lets go: its owner's (or, with no owner, everyone's), except the runs it spares, and
/// with [`Scope::only`] exactly the objects listed there. What it leaves of other owners'
/// runs it counts and lists object by object (uids), so `down --all --all-owners` can show
/// what it would remove before it asks, and then remove that and nothing else.
pub async fn sweep_labelled(client: &Client, scope: &Scope<'_>) -> Swept {
    let mut out = Swept::default();
    let labelled = ListParams::default().labels(label::RUN);
    let run_of = |l: &std::collections::BTreeMap<String, String>| l.get(label::RUN).cloned();
    let mut others = std::collections::BTreeSet::new();
    let mut labruns = std::collections::BTreeSet::new();
    // Per run it found: whether the scope takes it, and its objects.
    let mut runs: Vec<(String, bool, Vec<Found>)> = Vec::new();
    let mut classify =
        |l: &std::collections::BTreeMap<String, String>, run: &str| -> Option<bool> {
            let owner = l.get(label::OWNER).map(String::as_str);
            if (scope.spare)(run) {
                return None;
            }
            if is_ours(scope.owner, owner) {
                return Some(true);
            }
            if is_labruns(owner) {
                labruns.insert(run.to_string());
                None
            } else {
                // Another owner's: what a sweep of every owner would take.
                is_ours(None, owner).then_some(false)
            }
        };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut labelled_namespaces = Vec::new();
    match namespaces.list(&labelled).await {
        Ok(list) => {
            for ns in list.items {
                let Some(run) = run_of(ns.labels()) else {
                    continue;
                };
                labelled_namespaces.push(ns.name_any());
                if let Some(take) = classify(ns.labels(), &run) {
                    runs.push((run, take, vec![Found::of(Kind::Namespace, &ns)]));
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
                // A run's own namespace goes whole; only an anchor in a namespace iblab
                // did not make is taken apart.
                if labelled_namespaces.contains(&ns) || cm.name_any() != anchor_name(&run) {
                    continue;
                }
                let Some(take) = classify(cm.labels(), &run) else {
                    continue;
                };
                match objects_with_anchor(client, &cm).await {
                    Ok(objs) => runs.push((run, take, objs)),
                    Err(e) => out.problems.push(e),
                }
            }
        }
        Err(e) => out
            .problems
            .push(format!("cannot list iblab's anchors: {e}")),
    }
    for (run, take, objects) in runs {
        if !take {
            others.insert(run.clone());
            out.listed
                .extend(objects.iter().map(|o| iblab_backend::Listed {
                    run: run.clone(),
                    what: o.describe(),
                    uid: o.uid.clone(),
                }));
            continue;
        }
        let objects: Vec<Found> = objects
            .into_iter()
            .filter(|o| scope.only.is_none_or(|only| only.contains(&o.uid)))
            .collect();
        if objects.is_empty() {
            continue;
        }
        let problems = delete_exactly(client, &objects).await;
        if problems.is_empty() {
            out.removed.push(format!(
                "run {run}'s {}",
                objects
                    .iter()
                    .map(Found::describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.problems.extend(problems);
    }
    if !others.is_empty() {
        out.left.push(format!(
            "{} run(s) on the cluster started by another owner (another machine or state \
             folder): {}; `iblab down --all --all-owners` lists their objects and, once \
             confirmed, removes exactly those",
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
