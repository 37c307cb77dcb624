//! `iblab class apply|status|delete|render`: a class file against a cluster.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::summary::{self, Row};
use super::{CLASS_LABEL, Class, MANAGER};
use iblab_core::exit;
use iblab_k8s::crd::LabRun;
use iblab_k8s::{cluster, settings};

/// What `class status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

fn load(file: &Path) -> Result<Class, i32> {
    Class::load(file).map_err(|e| {
        eprintln!("error: {e}");
        exit::BAD_INPUT
    })
}

async fn connect() -> Result<Client, i32> {
    cluster::connect(&settings::get()).await.map_err(|e| {
        eprintln!("error: {e}");
        exit::ENVIRONMENT
    })
}

fn block_on(f: impl std::future::Future<Output = i32>) -> i32 {
    match iblab_sys::interrupt::runtime() {
        Ok(rt) => rt.block_on(f),
        Err(code) => code,
    }
}

/// `iblab class render FILE`: every student's objects, without a cluster.
pub fn render(file: &Path) -> i32 {
    let class = match load(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (policy, binding) = class.policy();
    for doc in [
        serde_saphyr::to_string(&policy),
        serde_saphyr::to_string(&binding),
    ] {
        match doc {
            Ok(y) => print!("---\n{y}"),
            Err(e) => {
                eprintln!("error: cannot write an object: {e}");
                return exit::ENVIRONMENT;
            }
        }
    }
    for s in &class.spec.students {
        match class.objects(s).to_yaml() {
            Ok(y) => print!("{y}"),
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ENVIRONMENT;
            }
        }
    }
    exit::OK
}

/// A namespace that exists and that this class did not make (its labels do not say this
/// class, this student, managed by iblab): `class apply` would adopt it, and `class delete`
/// delete it with everything in it. `Some` says which and how to go on.
pub fn not_ours(class: &Class, student: &str, existing: &Namespace) -> Option<String> {
    let labels = existing.labels();
    let has = |k: &str, v: &str| labels.get(k).is_some_and(|x| x == v);
    if has(CLASS_LABEL, &class.metadata.name)
        && has(super::STUDENT_LABEL, student)
        && has("app.kubernetes.io/managed-by", MANAGER)
    {
        return None;
    }
    Some(format!(
        "namespace {} already exists and was not made by class {} for {student}: iblab \
         does not take over a namespace it did not create (deleting the class would delete \
         it). Rename the class (metadata.name) or the student, or remove that namespace \
         yourself if it is a leftover; nothing was applied",
        existing.name_any(),
        class.metadata.name
    ))
}

/// Why a class could not be applied or read on the cluster.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(
        "{kind} {name} (what the class's students may change on their LabRuns; applying it \
         needs rights on admissionregistration.k8s.io): {source}"
    )]
    Policy {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A student's namespace exists and this class did not make it (`not_ours` says which).
    #[error("{0}")]
    NotOurs(String),
    #[error("cannot read namespace {ns}: {source}")]
    ReadNamespace {
        ns: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} for {student} in {ns}: {source}")]
    Object {
        kind: &'static str,
        student: String,
        ns: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read {student}'s LabRun in {ns}: {source}")]
    ReadRun {
        student: String,
        ns: String,
        #[source]
        source: kube::Error,
    },
}

/// The class's admission policy and its binding: what its students may change on their
/// LabRuns (the re-run annotation only).
async fn apply_policy(client: &Client, class: &Class) -> Result<(), Error> {
    let (policy, binding) = class.policy();
    let pp = PatchParams::apply(MANAGER).force();
    let name = class.policy_name();
    let what = |kind: &'static str, source: kube::Error| Error::Policy {
        kind,
        name: name.clone(),
        source,
    };
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(&policy))
        .await
        .map_err(|e| what("ValidatingAdmissionPolicy", e))?;
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(&binding))
        .await
        .map_err(|e| what("ValidatingAdmissionPolicyBinding", e))?;
    Ok(())
}

/// Refuse the class before anything is applied if any student's namespace is not ours.
async fn check_namespaces(client: &Client, class: &Class) -> Result<(), Error> {
    let nss: Api<Namespace> = Api::all(client.clone());
    for s in &class.spec.students {
        let ns = class.namespace_of(s);
        match nss.get_opt(&ns).await {
            Ok(Some(existing)) => {
                if let Some(why) = not_ours(class, s, &existing) {
                    return Err(Error::NotOurs(why));
                }
            }
            Ok(None) => {}
            Err(source) => return Err(Error::ReadNamespace { ns, source }),
        }
    }
    Ok(())
}

async fn apply_one(client: &Client, class: &Class, student: &str) -> Result<(), Error> {
    let o = class.objects(student);
    let ns = class.namespace_of(student);
    let pp = PatchParams::apply(MANAGER).force();
    let what = |kind: &'static str, source: kube::Error| Error::Object {
        kind,
        student: student.to_string(),
        ns: ns.clone(),
        source,
    };
    Api::<Namespace>::all(client.clone())
        .patch(&ns, &pp, &Patch::Apply(&o.namespace))
        .await
        .map_err(|e| what("namespace", e))?;
    Api::<ResourceQuota>::namespaced(client.clone(), &ns)
        .patch(&o.quota.name_any(), &pp, &Patch::Apply(&o.quota))
        .await
        .map_err(|e| what("quota", e))?;
    Api::<Role>::namespaced(client.clone(), &ns)
        .patch(&o.role.name_any(), &pp, &Patch::Apply(&o.role))
        .await
        .map_err(|e| what("role", e))?;
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .patch(&o.binding.name_any(), &pp, &Patch::Apply(&o.binding))
        .await
        .map_err(|e| what("role binding", e))?;
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .patch(&o.operator.name_any(), &pp, &Patch::Apply(&o.operator))
        .await
        .map_err(|e| what("the operator's role binding", e))?;
    Api::<LabRun>::namespaced(client.clone(), &ns)
        .patch(&o.run.name_any(), &pp, &Patch::Apply(&o.run))
        .await
        .map_err(|e| {
            what(
                "LabRun (is iblab's operator installed? its CRDs come with it)",
                e,
            )
        })?;
    Ok(())
}

/// `iblab class apply FILE`.
pub fn apply(file: &Path) -> i32 {
    let class = match load(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    block_on(async {
        let client = match connect().await {
            Ok(c) => c,
            Err(code) => return code,
        };
        if let Err(e) = check_namespaces(&client, &class).await {
            eprintln!("error: {e}");
            return exit::ENVIRONMENT;
        }
        if let Err(e) = apply_policy(&client, &class).await {
            eprintln!("error: {e}");
            return exit::ENVIRONMENT;
        }
        for s in &class.spec.students {
            if let Err(e) = apply_one(&client, &class, s).await {
                eprintln!("error: {e}");
                return exit::ENVIRONMENT;
            }
            println!(
                "{s}: namespace {} (PodSecurity {}), quota, role, the operator's lab rights, LabRun {}",
                class.namespace_of(s),
                super::POD_SECURITY,
                class.spec.lab
            );
        }
        println!(
            "class {}: {} students; follow it with `iblab class status {}`",
            class.metadata.name,
            class.spec.students.len(),
            file.display()
        );
        exit::OK
    })
}

async fn rows(client: &Client, class: &Class) -> Result<Vec<Row>, Error> {
    let mut out = Vec::new();
    for s in &class.spec.students {
        let ns = class.namespace_of(s);
        let runs: Api<LabRun> = Api::namespaced(client.clone(), &ns);
        let run = runs
            .get_opt(&class.spec.lab)
            .await
            .map_err(|source| Error::ReadRun {
                student: s.clone(),
                ns: ns.clone(),
                source,
            })?;
        out.push(summary::row(s, &ns, run));
    }
    Ok(out)
}

/// `iblab class status FILE`: the class's verdicts; with `wait`, until every run has
/// finished (or the time is up).
pub fn status(file: &Path, format: Format, junit: Option<&Path>, wait: Option<Duration>) -> i32 {
    let class = match load(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    block_on(async {
        let client = match connect().await {
            Ok(c) => c,
            Err(code) => return code,
        };
        let until = wait.map(|w| Instant::now() + w);
        let rows = loop {
            let rows = match rows(&client, &class).await {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: {e}");
                    return exit::ENVIRONMENT;
                }
            };
            match until {
                Some(t) if !summary::all_finished(&rows) && Instant::now() < t => {
                    tokio::time::sleep(Duration::from_secs(2)).await
                }
                _ => break rows,
            }
        };
        match format {
            Format::Table => print!(
                "{}",
                summary::table(&class.metadata.name, &class.spec.lab, &rows)
            ),
            Format::Json => println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "class": class.metadata.name,
                    "lab": class.spec.lab,
                    "students": rows,
                }))
                .unwrap_or_default()
            ),
        }
        if let Some(path) = junit
            && let Err(e) = std::fs::write(path, summary::junit(&class.metadata.name, &rows))
        {
            eprintln!("error: cannot write {}: {e}", path.display());
            return exit::ENVIRONMENT;
        }
        summary::exit_code(&rows)
    })
}

/// `iblab class delete FILE`: every namespace of the class, and wait until they are gone
/// (each LabRun's finalizer lets the operator tear its lab down first).
pub fn delete(file: &Path) -> i32 {
    let class = match load(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    block_on(async {
        let client = match connect().await {
            Ok(c) => c,
            Err(code) => return code,
        };
        let nss: Api<Namespace> = Api::all(client.clone());
        let by_class = ListParams::default().labels(&format!(
            "{CLASS_LABEL}={},app.kubernetes.io/managed-by={MANAGER}",
            class.metadata.name
        ));
        let list = match nss.list(&by_class).await {
            Ok(l) => l.items,
            Err(e) => {
                eprintln!("error: cannot list the class's namespaces: {e}");
                return exit::ENVIRONMENT;
            }
        };
        // The LabRuns first, while the operator still has its rights in their namespaces
        // (a namespace's deletion would take its RoleBinding along with them): their
        // finalizer is the operator's teardown.
        for ns in &list {
            let runs: Api<LabRun> = Api::namespaced(client.clone(), &ns.name_any());
            let _ = runs
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await;
        }
        let until = Instant::now() + Duration::from_secs(120);
        for ns in &list {
            let runs: Api<LabRun> = Api::namespaced(client.clone(), &ns.name_any());
            while Instant::now() < until
                && runs
                    .list(&ListParams::default())
                    .await
                    .is_ok_and(|l| !l.items.is_empty())
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        for ns in &list {
            if let Err(e) = nss.delete(&ns.name_any(), &DeleteParams::default()).await {
                eprintln!("error: cannot delete namespace {}: {e}", ns.name_any());
                return exit::ENVIRONMENT;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            match nss.list(&by_class).await {
                Ok(l) if l.items.is_empty() => break,
                Ok(l) if Instant::now() < deadline => {
                    tracing::debug!(left = l.items.len(), "waiting for namespaces to go");
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Ok(l) => {
                    eprintln!(
                        "error: still there after 300 s: {}",
                        l.items
                            .iter()
                            .map(|n| n.name_any())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    return exit::ENVIRONMENT;
                }
                Err(e) => {
                    eprintln!("error: cannot list the class's namespaces: {e}");
                    return exit::ENVIRONMENT;
                }
            }
        }
        // The policy last: while a namespace is going, its students' rules still hold.
        let name = class.policy_name();
        let dp = DeleteParams::default();
        let gone = |r: Result<(), kube::Error>| match r {
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            other => other,
        };
        let removed = gone(
            Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        )
        .and(gone(
            Api::<ValidatingAdmissionPolicy>::all(client.clone())
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        ));
        if let Err(e) = removed {
            eprintln!("error: cannot delete the class's admission policy {name}: {e}");
            return exit::ENVIRONMENT;
        }
        println!(
            "class {}: {} namespaces deleted",
            class.metadata.name,
            list.len()
        );
        exit::OK
    })
}
