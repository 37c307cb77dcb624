//! The real single-node Kubernetes that `kube/cluster` builds and starts, as the kube
//! tests use it: one start per test binary (its `main`, `Suite::run`, stops it after the
//! last trial, whatever happened), the lab image imported into its node, and checks that a
//! run left nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
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

impl Cluster {
    /// `iblab ARGS` from a scratch folder against this cluster, with none of the kube
    /// backend's settings of the environment the tests run in.
    pub fn iblab(&self, s: &super::Scratch, args: &[&str]) -> Command {
        let mut cmd = s.cmd(args);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("IBLAB_KUBE_BIN", &self.bin)
            .env_remove("IBLAB_IMAGE")
            .env_remove("IBLAB_KUBE_NAMESPACE")
            .env_remove("IBLAB_KUBE_PLACE")
            .env_remove("IBLAB_KUBE_RDMA_RESOURCE")
            .env_remove("IBLAB_OWNER")
            .env_remove("IBLAB_KUBE_CONTEXT");
        cmd
    }

    /// `iblab up ARGS --out <scratch>/run` against this cluster.
    pub fn up(&self, s: &super::Scratch, args: &[&str]) -> Output {
        let mut all = vec!["up"];
        all.extend_from_slice(args);
        let mut cmd = self.iblab(s, &all);
        cmd.arg("--out").arg(s.out());
        cmd.output().expect("iblab runs")
    }
}

impl Cluster {
    /// A lab on another backend (`other`: local, vm) and then on this cluster: both pass,
    /// with the same verdict for every expectation. The kube run's folder and evidence
    /// (its objects are the caller's to check).
    pub fn same_verdicts_as(
        &self,
        other: &str,
        tag: &str,
        args: &[&str],
    ) -> (super::Scratch, Value) {
        let there = super::Scratch::new(&format!("kube-{other}-{tag}"));
        let mut all = args.to_vec();
        all.extend(["--backend", other]);
        let o = there.up(&all);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{other} run:\n{}\n{}",
            said(&o),
            there.log_tails()
        );
        let (kube, e) = self.passed_on_kube(tag, args);
        // The same verdicts, but where the pods could not observe what a claim reads
        // (a step's `unobserved`, said in the claim's own words): not judged there.
        let unobserved = not_observed(&e);
        let theirs: Vec<(String, String)> = super::verdicts(&there.evidence())
            .into_iter()
            .map(|(id, v)| {
                let v = if unobserved.contains(&id) {
                    "skipped".into()
                } else {
                    v
                };
                (id, v)
            })
            .collect();
        assert_eq!(
            super::verdicts(&e),
            theirs,
            "verdicts differ between kube and {other} (not observed in the pods: {unobserved:?})"
        );
        (kube, e)
    }

    /// `iblab up ARGS --backend kube`, which must pass on this cluster: the run's folder
    /// and evidence.
    fn passed_on_kube(&self, tag: &str, args: &[&str]) -> (super::Scratch, Value) {
        let kube = super::Scratch::new(&format!("kube-{tag}"));
        let mut all = args.to_vec();
        all.extend(["--backend", "kube"]);
        let o = self.up(&kube, &all);
        let e = kube.evidence();
        assert_eq!(o.status.code(), Some(0), "kube run:\n{}", said(&o));
        assert_eq!(e["backend"].as_str(), Some("kube"));
        (kube, e)
    }

    /// `lab` `scenario` on the kube backend, judged against the course's prediction
    /// ([`super::lessons::CASES`], which lessons_e2e holds the vm backend to): each
    /// expectation as the course says, or skipped where the pods could not observe what
    /// it reads (a step's `unobserved`, said in the claim's own words).
    pub fn as_the_course_predicts(
        &self,
        tag: &str,
        lab: &str,
        scenario: &str,
    ) -> (super::Scratch, Value) {
        let held = super::lessons::held(lab, scenario)
            .unwrap_or_else(|| panic!("the course has no case {lab} {scenario}"));
        let (kube, e) = self.passed_on_kube(tag, &[lab, "--scenario", scenario]);
        let unobserved = not_observed(&e);
        super::lessons::as_the_course_predicts(
            &e,
            held,
            &unobserved,
            &format!("{lab} {scenario} on kube (not observed in the pods: {unobserved:?})"),
        );
        (kube, e)
    }
}

/// The expectations a run left not judged because a step could not observe a figure
/// they read where it ran.
pub fn not_observed(e: &Value) -> Vec<String> {
    e["expectations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| {
            x["verdict"] == "skipped"
                && (x["explanation_en"].as_str())
                    .or(x["explanation"].as_str())
                    .is_some_and(|t| {
                        t.starts_with("not judged: steps.") && t.contains("could not observe")
                    })
        })
        .filter_map(|x| x["id"].as_str().map(str::to_string))
        .collect()
}

/// A command's exit, its whole stdout and the end of its stderr, for a failing test.
pub fn said(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        tail(&o.stderr)
    )
}

/// The run id an evidence document names.
pub fn run_id(e: &Value) -> String {
    e["run_id"]
        .as_str()
        .or_else(|| e["run"]["id"].as_str())
        .expect("evidence names its run")
        .to_string()
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One test binary's use of the cluster: its tests are trials of its own `main`
/// (`harness = false`, libtest-mimic), run one at a time; the cluster is started by the
/// first trial that asks for it, and `run` stops it after the last one, whatever the
/// trials did, if this binary started it (so it does not idle beside later suites; one
/// that was up before stays up).
pub struct Suite {
    serial: Mutex<()>,
    cluster: OnceLock<Result<Cluster, String>>,
    started_here: AtomicBool,
    /// Also the second node, on the vm backend's Linux 7.2 guest (`kube/cluster vm-node`):
    /// started with the cluster, stopped after the last trial whoever started the cluster.
    vm_node: bool,
    vm_node_up: OnceLock<Result<(), String>>,
}

/// The VM node's name (`kube/cluster vm-node`'s default).
pub const VM_NODE: &str = "iblab-vmnode";
/// The host's node.
pub const HOST_NODE: &str = "iblab-node";

/// The trials of a suite, one per test function, named as the function:
/// `cargo test --test SUITE NAME` runs those whose name contains NAME.
#[allow(unused_macros)]
macro_rules! trials {
    ($($test:ident),* $(,)?) => {
        vec![$(libtest_mimic::Trial::test(stringify!($test), || {
            let _took = $crate::common::cluster::Took::new(stringify!($test));
            $test();
            Ok(())
        })),*]
    };
}
#[allow(unused_imports)]
pub(crate) use trials;

/// Says how long a trial took when it ends, passed or not (libtest-mimic does not):
/// `trial NAME took N s`, which `.ci/run` lists among its timings.
pub struct Took(&'static str, std::time::Instant);

impl Took {
    pub fn new(name: &'static str) -> Took {
        Took(name, std::time::Instant::now())
    }
}

impl Drop for Took {
    fn drop(&mut self) {
        eprintln!(
            "trial {} took {:.0} s",
            self.0,
            self.1.elapsed().as_secs_f64()
        );
    }
}

impl Suite {
    pub const fn new() -> Suite {
        Suite {
            serial: Mutex::new(()),
            cluster: OnceLock::new(),
            started_here: AtomicBool::new(false),
            vm_node: false,
            vm_node_up: OnceLock::new(),
        }
    }

    /// A suite whose tests also need the VM node (with the lab and iblab images on it).
    pub const fn with_vm_node() -> Suite {
        let mut s = Suite::new();
        s.vm_node = true;
        s
    }

    /// The test binary's `main`: the trials the command line selects (a name filter,
    /// `--exact`, `--skip`, `--list`), one at a time and in order, then `after` (what the
    /// trials shared, e.g. the operator's release) and the cluster stopped, both whatever
    /// the trials did. Fails if a trial or the stopping failed.
    pub fn run(&self, trials: Vec<libtest_mimic::Trial>, after: impl FnOnce()) -> ExitCode {
        let mut args = libtest_mimic::Arguments::from_args();
        // One cluster, one run at a time on it.
        args.test_threads = Some(1);
        let conclusion = libtest_mimic::run(&args, trials);
        let after = std::panic::catch_unwind(std::panic::AssertUnwindSafe(after));
        let stopped = self.stop();
        match (after, stopped) {
            (Ok(()), Ok(())) => conclusion.exit_code(),
            (after, stopped) => {
                if after.is_err() {
                    eprintln!("error: the suite's shared objects were not torn down cleanly");
                }
                if let Err(e) = stopped {
                    eprintln!("error: {e}");
                }
                ExitCode::from(101)
            }
        }
    }

    /// After the last trial: the VM node (its agent's objects, then the node) and, if this
    /// binary started it, the cluster. Nothing if no trial asked for the cluster.
    fn stop(&self) -> Result<(), String> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(());
        };
        let mut result = Ok(());
        if self.vm_node && self.vm_node_up.get().is_some() {
            // The node agent's objects (namespace, DaemonSet, RuntimeClass), then the node.
            if let Ok(c) = cluster {
                let _ = c.kubectl(&[
                    "delete",
                    "-f",
                    &repo().join(NODE_AGENT_MANIFEST).to_string_lossy(),
                    "--wait=true",
                    "--timeout=60s",
                    "--ignore-not-found",
                ]);
            }
            let _ = Command::new(repo().join("kube/cluster"))
                .args(["vm-node", "down"])
                .output();
            // The node goes as cleanly as it came: its qemu, its tap on the cluster
            // bridge, the route to its pods and its run folder (its cgroups and mounts
            // lived in the guest's own kernel).
            let left = vm_node_leftovers();
            if !left.is_empty() {
                result = Err(format!("`kube/cluster vm-node down` left: {left:?}"));
            }
        }
        if self.started_here.load(Ordering::SeqCst) {
            let _ = Command::new(repo().join("kube/cluster"))
                .arg("down")
                .output();
        }
        result
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
        let c = match c {
            Ok(c) => c.clone(),
            Err(e) => {
                super::missing(&format!("{test}: a Kubernetes cluster: {e}"));
                return None;
            }
        };
        if self.vm_node
            && let Err(e) = self.vm_node_up.get_or_init(|| vm_node_up(&c))
        {
            super::missing(&format!(
                "{test}: the cluster's second node on Linux 7.2 (kube/cluster vm-node up): {e}"
            ));
            return None;
        }
        Some((guard, c))
    }
}

/// What of the VM node is still on this host: its qemu process, its tap, the route to its
/// pods, its run folder.
pub fn vm_node_leftovers() -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.starts_with("qemu-system") && cmd.contains(&format!("-name {VM_NODE} ")) {
            left.push(format!("qemu: {cmd}"));
        }
    }
    let run = |argv: &[&str]| {
        Command::new(argv[0])
            .args(&argv[1..])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    if !run(&["ip", "-o", "link", "show", "iblabkvm0"]).is_empty() {
        left.push("tap iblabkvm0".into());
    }
    let routes = run(&["ip", "route", "show", "198.19.1.0/24"]);
    if !routes.is_empty() {
        left.push(format!("route {routes}"));
    }
    let dir = Path::new("/var/lib/iblab/kube-run/vm-node");
    if dir.exists() {
        left.push(format!("folder {}", dir.display()));
    }
    left
}

/// The RDMA devices the VM node's kernel lists now (`kube/cluster vm-node status`, at most
/// 2 s old).
pub fn vm_node_rdma_links() -> String {
    let out = Command::new(repo().join("kube/cluster"))
        .args(["vm-node", "status"])
        .output()
        .expect("kube/cluster runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .skip_while(|l| !l.starts_with("rdma links"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The node agent as a platform team without the chart installs it (tests/chart/check
/// renders it from the chart): what makes path ②'s pods' rxe on the VM node.
pub const NODE_AGENT_MANIFEST: &str = "manifests/node-agent.yaml";

/// The node agent installed on the VM node: applied, then its DaemonSet rolled out there.
fn node_agent_up(c: &Cluster) -> Result<(), String> {
    let applied = c.kubectl(&[
        "apply",
        "-f",
        &repo().join(NODE_AGENT_MANIFEST).to_string_lossy(),
    ]);
    if !applied.status.success() {
        return Err(format!(
            "applying {NODE_AGENT_MANIFEST}: {}",
            tail(&applied.stderr)
        ));
    }
    let rolled = c.kubectl(&[
        "rollout",
        "status",
        "-n",
        "iblab-node-agent",
        "daemonset/iblab-node-agent",
        "--timeout=180s",
    ]);
    if !rolled.status.success() {
        return Err(format!(
            "the node agent did not roll out on {VM_NODE}: {}{}",
            tail(&rolled.stdout),
            tail(&rolled.stderr)
        ));
    }
    Ok(())
}

/// `kube/cluster vm-node up`, then the lab and iblab images into its containerd (the
/// host's node got them from `start`), then the node agent.
fn vm_node_up(c: &Cluster) -> Result<(), String> {
    let up = Command::new(repo().join("kube/cluster"))
        .args(["vm-node", "up"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run kube/cluster: {e}"))?;
    if !up.status.success() {
        return Err(format!(
            "`kube/cluster vm-node up` failed: {}",
            tail(&up.stderr)
        ));
    }
    eprintln!("{}", String::from_utf8_lossy(&up.stdout).trim());
    // The operator's image, built from the tested binary: the node agent installs its iblab.
    iblab_image()?;
    let version = env!("CARGO_PKG_VERSION");
    for image in [
        format!("iblab/lab:{version}"),
        format!("iblab/operator:{version}"),
    ] {
        import_image_to(&image, &["vm-node", "import"])?;
    }
    node_agent_up(c)
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
    import_image_to(image, &["import"])
}

/// A Docker image of this host into the containerd `kube/cluster ARGS` imports into.
fn import_image_to(image: &str, args: &[&str]) -> Result<(), String> {
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
        .args(args)
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
