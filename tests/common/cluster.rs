//! The real single-node Kubernetes that `kube/cluster` builds and starts, as the kube
//! tests use it: one start per test binary, the lab image imported into its node, and
//! checks that a run left nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use serde_json::Value;

#[derive(Clone)]
pub struct Cluster {
    pub kubeconfig: String,
    pub bin: PathBuf,
}

impl Cluster {
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.bin.join("kubectl"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("kubectl runs")
    }
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.kubectl(&all);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("kubectl prints JSON")
    }
    /// Every namespace, ConfigMap and pod (in any namespace) labelled with this run.
    pub fn objects_of(&self, run: &str) -> Vec<String> {
        let sel = format!("iblab.dev/run={run}");
        let mut left = Vec::new();
        for kind in ["namespaces", "configmaps", "pods", "networkpolicies"] {
            let v = self.json(&["get", kind, "-A", "-l", &sel]);
            for i in v["items"].as_array().into_iter().flatten() {
                left.push(format!(
                    "{kind} {}/{}",
                    i["metadata"]["namespace"].as_str().unwrap_or(""),
                    i["metadata"]["name"].as_str().unwrap_or("")
                ));
            }
        }
        let ns = self.kubectl(&["get", "namespace", &format!("iblab-{run}")]);
        if ns.status.success() {
            left.push(format!("namespace iblab-{run}"));
        }
        left
    }
    pub fn assert_nothing_left(&self, run: &str) {
        let left = self.objects_of(run);
        assert!(left.is_empty(), "objects of run {run} left: {left:?}");
    }
    pub fn pods_running(&self, run: &str) -> usize {
        let v = self.json(&["get", "pods", "-A", "-l", &format!("iblab.dev/run={run}")]);
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
    }
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One test binary's use of the cluster: its tests run one at a time, the cluster is
/// started once, and the last test to end stops it if this binary started it (so it does
/// not idle beside later suites).
pub struct Suite {
    serial: Mutex<()>,
    cluster: OnceLock<Result<Cluster, String>>,
    tests: usize,
    finished: AtomicUsize,
    started_here: AtomicBool,
}

/// Held by every test from its first line; counts it as ended, whatever happened.
pub struct Done<'a>(&'a Suite);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        let s = self.0;
        if s.finished.fetch_add(1, Ordering::SeqCst) + 1 == s.tests
            && s.started_here.load(Ordering::SeqCst)
        {
            let _ = Command::new(repo().join("kube/cluster"))
                .arg("down")
                .output();
        }
    }
}

impl Suite {
    pub const fn new(tests: usize) -> Suite {
        Suite {
            serial: Mutex::new(()),
            cluster: OnceLock::new(),
            tests,
            finished: AtomicUsize::new(0),
            started_here: AtomicBool::new(false),
        }
    }

    pub fn done(&self) -> Done<'_> {
        Done(self)
    }

    /// The cluster answering, and the lab image on its node; `None` (after saying why)
    /// skips, which `common::missing` turns into a failure in CI.
    pub fn ready(&self, test: &str) -> Option<(MutexGuard<'_, ()>, Cluster)> {
        let guard = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        if super::nix_euid() != 0 {
            super::missing(&format!(
                "{test}: root (kube/cluster starts a node's kubelet and containerd)"
            ));
            return None;
        }
        let c = self.cluster.get_or_init(|| {
            let (c, started) = start();
            self.started_here.store(started, Ordering::SeqCst);
            c
        });
        match c {
            Ok(c) => Some((guard, c.clone())),
            Err(e) => {
                super::missing(&format!("{test}: a Kubernetes cluster: {e}"));
                None
            }
        }
    }
}

/// Start the cluster (or find it answering) and put the lab image on its node; also
/// whether it was started here.
pub fn start() -> (Result<Cluster, String>, bool) {
    let answering = Command::new(repo().join("kube/cluster"))
        .arg("status")
        .output()
        .is_ok_and(|o| o.status.success());
    (start_and_import(), !answering)
}

fn start_and_import() -> Result<Cluster, String> {
    let script = repo().join("kube/cluster");
    let up = Command::new(&script)
        .arg("up")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run kube/cluster: {e}"))?;
    if !up.status.success() {
        return Err(format!(
            "`kube/cluster up` failed (it builds Kubernetes from source on a cold cache: \
             needs Go and the Go module proxy): {}",
            tail(&up.stderr)
        ));
    }
    let env = Command::new(&script)
        .arg("env")
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&env.stdout);
    let var = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("export {k}=")))
            .map(str::to_string)
            .ok_or(format!("`kube/cluster env` printed no {k}"))
    };
    let c = Cluster {
        kubeconfig: var("KUBECONFIG")?,
        bin: PathBuf::from(var("IBLAB_KUBE_BIN")?),
    };
    // The lab image: built (cached rootfs) by the docker engine, imported into the node.
    let image = format!("iblab/lab:{}", env!("CARGO_PKG_VERSION"));
    let node = c.json(&["get", "node", "iblab-node"]);
    let has = node["status"]["images"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|i| i["names"].as_array().cloned().unwrap_or_default())
        .any(|n| n.as_str() == Some(&format!("docker.io/{image}")));
    if !has {
        let built = Command::new(super::BIN)
            .args(["image", "build"])
            .env_remove("IBLAB_IMAGE")
            .output()
            .map_err(|e| e.to_string())?;
        if !built.status.success() {
            return Err(format!(
                "the lab image could not be built (needs a Docker engine: .ci/dockerd-start, \
                 and debootstrap): {}",
                tail(&built.stderr)
            ));
        }
        import_image(&image)?;
    }
    // The iblab image (the operator's), which brings iblab into lab pods: from this very
    // binary, every time.
    iblab_image()?;
    Ok(c)
}

/// The iblab image (`iblab/operator:<version>`), built from this very binary and imported
/// into the node.
pub fn iblab_image() -> Result<(), String> {
    let image = format!("iblab/operator:{}", env!("CARGO_PKG_VERSION"));
    let built = Command::new(super::BIN)
        .args(["image", "build", "--operator"])
        .env_remove("IBLAB_OPERATOR_IMAGE")
        .output()
        .map_err(|e| e.to_string())?;
    if !built.status.success() {
        return Err(format!(
            "iblab image build --operator (needs a Docker engine: .ci/dockerd-start): {}",
            tail(&built.stderr)
        ));
    }
    import_image(&image)
}

/// A Docker image of this host (`docker save`) into the node's containerd.
pub fn import_image(image: &str) -> Result<(), String> {
    let tar = std::env::temp_dir().join(format!(
        "iblab-e2e-image-{}-{}.tar",
        std::process::id(),
        image.replace(['/', ':'], "_")
    ));
    let saved = Command::new("docker")
        .args(["save", image, "-o"])
        .arg(&tar)
        .output()
        .map_err(|e| format!("docker save: {e}"))?;
    if !saved.status.success() {
        return Err(format!("docker save {image}: {}", tail(&saved.stderr)));
    }
    let imported = Command::new(repo().join("kube/cluster"))
        .arg("import")
        .arg(&tar)
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&tar);
    if !imported.status.success() {
        return Err(format!("kube/cluster import: {}", tail(&imported.stderr)));
    }
    Ok(())
}

pub fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}
