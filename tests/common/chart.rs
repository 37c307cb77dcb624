//! The Helm chart installed on the test cluster for a test: a release in a namespace of
//! its own, removed with everything it brought (its CRDs too) whatever the outcome.

use std::path::PathBuf;
use std::process::{Command, Output};

use super::cluster::{Cluster, repo, said, tail};

/// The node IP the test cluster's API server listens on (no kube-proxy: pods reach it
/// there, not at the `kubernetes` Service IP).
pub const API_HOST: &str = "198.19.0.1";
pub const API_PORT: &str = "6443";

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("the command runs")
}

fn ok(what: &str, o: Output) -> Output {
    assert!(o.status.success(), "{what}: {}", said(&o));
    o
}

/// helm, as `kube/tools helm` provides it (built from the Go module proxy, cached).
pub fn helm() -> Result<PathBuf, String> {
    let o = Command::new(repo().join("kube/tools"))
        .arg("helm")
        .output()
        .map_err(|e| format!("cannot run kube/tools: {e}"))?;
    if !o.status.success() {
        return Err(format!("kube/tools helm failed: {}", tail(&o.stderr)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
}

/// The chart installed in a namespace of its own, removed with everything it brought
/// (its CRDs too, which Helm leaves) whatever the test's outcome.
pub struct Release {
    pub c: Cluster,
    pub helm: PathBuf,
    pub name: String,
    pub ns: String,
}

impl Release {
    pub fn helm(&self, args: &[&str]) -> Output {
        run(Command::new(&self.helm)
            .args(args)
            .env("KUBECONFIG", &self.c.kubeconfig)
            .env(
                "HELM_CACHE_HOME",
                std::env::temp_dir().join("iblab-e2e-helm/cache"),
            )
            .env(
                "HELM_CONFIG_HOME",
                std::env::temp_dir().join("iblab-e2e-helm/config"),
            )
            .env(
                "HELM_DATA_HOME",
                std::env::temp_dir().join("iblab-e2e-helm/data"),
            ))
    }

    /// `sets`: more `--set KEY=VALUE` of this test's.
    pub fn install(c: &Cluster, helm: PathBuf, tag: &str, sets: &[&str]) -> Release {
        let r = Release {
            c: c.clone(),
            helm,
            name: format!("iblab-{tag}"),
            ns: format!("iblab-{tag}-system"),
        };
        // The operator's namespace at the strictest PodSecurity level: it needs nothing.
        ok(
            "create the operator's namespace",
            c.kubectl(&["create", "namespace", &r.ns]),
        );
        ok(
            "label it restricted",
            c.kubectl(&[
                "label",
                "namespace",
                &r.ns,
                "pod-security.kubernetes.io/enforce=restricted",
            ]),
        );
        let chart = repo().join("charts/iblab");
        let o = r.helm(
            &[
                "install",
                &r.name,
                chart.to_str().unwrap(),
                "-n",
                &r.ns,
                "--set",
                "image.pullPolicy=Never",
                "--set",
                &format!("apiServer.host={API_HOST}"),
                "--set",
                &format!("apiServer.port={API_PORT}"),
                "--set",
                "operator.maxConcurrent=2",
                "--wait",
                "--timeout",
                "180s",
            ]
            .into_iter()
            .chain(sets.iter().flat_map(|s| ["--set", *s]))
            .collect::<Vec<_>>(),
        );
        if !o.status.success() {
            let pods = c.kubectl(&["get", "pods", "-n", &r.ns, "-o", "wide"]);
            let logs = c.kubectl(&[
                "logs",
                "-n",
                &r.ns,
                "-l",
                "app.kubernetes.io/component=operator",
                "--tail",
                "30",
            ]);
            panic!(
                "helm install: {}\npods: {}\noperator log: {}",
                said(&o),
                String::from_utf8_lossy(&pods.stdout),
                String::from_utf8_lossy(&logs.stdout)
            );
        }
        r
    }

    pub fn operator_log(&self) -> String {
        let o = self.c.kubectl(&[
            "logs",
            "-n",
            &self.ns,
            "-l",
            "app.kubernetes.io/component=operator",
            "--tail",
            "40",
        ]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        // LabRuns first, while the operator still runs: their finalizers tear their labs
        // down. Whatever is left then (an operator that did not answer) loses its
        // finalizer, so that the CRDs can go.
        let k = |args: &[&str]| self.c.kubectl(args);
        let _ = k(&[
            "delete",
            "labruns",
            "--all",
            "-A",
            "--wait=true",
            "--timeout=120s",
        ]);
        let _ = self.helm(&["uninstall", &self.name, "-n", &self.ns, "--wait"]);
        let left = k(&[
            "get",
            "labruns",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name}{\"\\n\"}{end}",
        ]);
        for line in String::from_utf8_lossy(&left.stdout).lines() {
            if let Some((ns, name)) = line.split_once(' ') {
                let _ = k(&[
                    "patch",
                    "labrun",
                    name,
                    "-n",
                    ns,
                    "--type",
                    "merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        let _ = k(&[
            "delete",
            "namespace",
            &self.ns,
            "--wait=true",
            "--timeout=120s",
        ]);
        let _ = k(&[
            "delete",
            "crd",
            "labs.iblab.dev",
            "labruns.iblab.dev",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ]);
    }
}
