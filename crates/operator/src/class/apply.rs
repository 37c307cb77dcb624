//! `iblab class apply|status|delete|render`: a class file against a cluster.

use std::path::Path;
use std::time::{Duration, Instant};

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

async fn apply_one(client: &Client, class: &Class, student: &str) -> Result<(), String> {
    let o = class.objects(student);
    let ns = class.namespace_of(student);
    let pp = PatchParams::apply(MANAGER).force();
    let what = |kind: &str, e: kube::Error| format!("{kind} for {student} in {ns}: {e}");
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
        for s in &class.spec.students {
            if let Err(e) = apply_one(&client, &class, s).await {
                eprintln!("error: {e}");
                return exit::ENVIRONMENT;
            }
            println!(
                "{s}: namespace {} (PodSecurity {}), quota, role, LabRun {}",
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

async fn rows(client: &Client, class: &Class) -> Result<Vec<Row>, String> {
    let mut out = Vec::new();
    for s in &class.spec.students {
        let ns = class.namespace_of(s);
        let runs: Api<LabRun> = Api::namespaced(client.clone(), &ns);
        let run = runs
            .get_opt(&class.spec.lab)
            .await
            .map_err(|e| format!("cannot read {s}'s LabRun in {ns}: {e}"))?;
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
        println!(
            "class {}: {} namespaces deleted",
            class.metadata.name,
            list.len()
        );
        exit::OK
    })
}
