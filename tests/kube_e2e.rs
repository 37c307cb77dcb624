//! End-to-end tests of the kube backend on a real single-node Kubernetes, the one
//! `kube/cluster` builds from source and starts (`.ci/run` starts it first; here `up` is
//! called again, which returns at once when it answers). The lab image is the full
//! debootstrap one, imported into the node's containerd (no registry).
//!
//! tcp-loss and lesson4 (`--paths tcp,ib`, default and `sm-off`) give the same verdicts as
//! on the local backend; a pod deleted mid-run gives exit 3 and a clean teardown; a kept
//! run is entered with `iblab exec`; `down --all` finds a crashed run's objects by label;
//! a given namespace is used and kept; rendered manifests pass the API server's own
//! validation. After each, no object with the run's label and no run namespace remain.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::Scratch;

static SERIAL: Mutex<()> = Mutex::new(());
static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// How many tests this file has (checked by `every_test_is_counted`): the last one to end
/// stops the cluster if these tests started it, so it does not idle beside later suites.
const TESTS: usize = 11;
static FINISHED: AtomicUsize = AtomicUsize::new(0);
static STARTED_HERE: AtomicBool = AtomicBool::new(false);

/// Held by every test from its first line; counts it as ended, whatever happened.
struct Done;

impl Drop for Done {
    fn drop(&mut self) {
        if FINISHED.fetch_add(1, Ordering::SeqCst) + 1 == TESTS
            && STARTED_HERE.load(Ordering::SeqCst)
        {
            let _ = Command::new(repo().join("kube/cluster"))
                .arg("down")
                .output();
        }
    }
}

#[test]
fn every_test_is_counted() {
    let _done = Done;
    let n = include_str!("kube_e2e.rs").matches("#[test]\n").count();
    assert_eq!(n, TESTS, "update TESTS");
}

#[derive(Clone)]
struct Cluster {
    kubeconfig: String,
    bin: PathBuf,
}

impl Cluster {
    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.bin.join("kubectl"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("kubectl runs")
    }
    fn json(&self, args: &[&str]) -> Value {
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
    fn objects_of(&self, run: &str) -> Vec<String> {
        let sel = format!("iblab.dev/run={run}");
        let mut left = Vec::new();
        for kind in ["namespaces", "configmaps", "pods"] {
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
    fn assert_nothing_left(&self, run: &str) {
        let left = self.objects_of(run);
        assert!(left.is_empty(), "objects of run {run} left: {left:?}");
    }
    fn pods_running(&self, run: &str) -> usize {
        let v = self.json(&["get", "pods", "-A", "-l", &format!("iblab.dev/run={run}")]);
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"]["phase"] == "Running")
            .count()
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The cluster answering, and the lab image on its node; `None` (after saying why) skips.
fn ready(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Cluster)> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if common::nix_euid() != 0 {
        common::missing(&format!(
            "{test}: root (kube/cluster starts a node's kubelet and containerd)"
        ));
        return None;
    }
    let c = CLUSTER.get_or_init(start);
    match c {
        Ok(c) => Some((guard, c.clone())),
        Err(e) => {
            common::missing(&format!("{test}: a Kubernetes cluster: {e}"));
            None
        }
    }
}

fn start() -> Result<Cluster, String> {
    let script = repo().join("kube/cluster");
    let answering = Command::new(&script)
        .arg("status")
        .output()
        .is_ok_and(|o| o.status.success());
    STARTED_HERE.store(!answering, Ordering::SeqCst);
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
        let built = Command::new(common::BIN)
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
        let tar = std::env::temp_dir().join(format!("iblab-kube-e2e-{}.tar", std::process::id()));
        let saved = Command::new("docker")
            .args(["save", &image, "-o"])
            .arg(&tar)
            .output()
            .map_err(|e| format!("docker save: {e}"))?;
        if !saved.status.success() {
            return Err(format!("docker save {image}: {}", tail(&saved.stderr)));
        }
        let imported = Command::new(&script)
            .arg("import")
            .arg(&tar)
            .output()
            .map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(&tar);
        if !imported.status.success() {
            return Err(format!("kube/cluster import: {}", tail(&imported.stderr)));
        }
    }
    Ok(c)
}

fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

/// A run on the cluster, from a scratch folder of its own.
fn kube_cmd(s: &Scratch, c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = s.cmd(args);
    cmd.env("KUBECONFIG", &c.kubeconfig)
        .env("IBLAB_KUBE_BIN", &c.bin)
        .env_remove("IBLAB_IMAGE")
        .env_remove("IBLAB_KUBE_NAMESPACE")
        .env_remove("IBLAB_KUBE_CONTEXT");
    cmd
}

/// `iblab exec RUN NODE -- ARGV` (no options after the command: they would be its own).
fn exec(s: &Scratch, c: &Cluster, run: &str, node: &str, argv: &[&str]) -> Output {
    Command::new(common::BIN)
        .args(["exec", run, node, "--"])
        .args(argv)
        .env("IBLAB_STATE_DIR", s.state())
        .env("KUBECONFIG", &c.kubeconfig)
        .env("IBLAB_KUBE_BIN", &c.bin)
        .output()
        .expect("iblab runs")
}

fn up(s: &Scratch, c: &Cluster, args: &[&str]) -> Output {
    let mut all = vec!["up"];
    all.extend_from_slice(args);
    let mut cmd = kube_cmd(s, c, &all);
    cmd.arg("--out").arg(s.out());
    cmd.output().expect("iblab runs")
}

fn run_id(e: &Value) -> String {
    e["run_id"]
        .as_str()
        .or_else(|| e["run"]["id"].as_str())
        .expect("evidence names its run")
        .to_string()
}

fn expectation_verdicts(e: &Value) -> Vec<(String, String)> {
    common::verdicts(e)
}

fn said(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        tail(&o.stderr)
    )
}

/// The same lab on local and on kube: both pass, with the same verdict per expectation.
fn same_verdicts_as_local(test: &str, args: &[&str]) {
    let Some((_g, c)) = ready(test) else { return };
    let local = Scratch::new(&format!("kube-local-{test}"));
    let mut all = args.to_vec();
    all.extend(["--backend", "local"]);
    let lo = local.up(&all);
    assert_eq!(lo.status.code(), Some(0), "local run:\n{}", said(&lo));
    let kube = Scratch::new(&format!("kube-{test}"));
    let mut all = args.to_vec();
    all.extend(["--backend", "kube"]);
    let ko = up(&kube, &c, &all);
    let e = kube.evidence();
    let run = run_id(&e);
    assert_eq!(ko.status.code(), Some(0), "kube run:\n{}", said(&ko));
    assert_eq!(
        e["backend"].as_str().or(e["plan"]["backend"].as_str()),
        Some("kube")
    );
    assert_eq!(
        expectation_verdicts(&e),
        expectation_verdicts(&local.evidence()),
        "verdicts differ between kube and local"
    );
    c.assert_nothing_left(&run);
}

#[test]
fn tcp_loss_gives_the_same_verdicts_as_on_local() {
    let _done = Done;
    same_verdicts_as_local("tcp-loss", &["tcp-loss"]);
}

#[test]
fn lesson4_gives_the_same_verdicts_as_on_local() {
    let _done = Done;
    same_verdicts_as_local("lesson4", &["lesson4", "--paths", "tcp,ib"]);
}

#[test]
fn lesson4_without_a_subnet_manager_gives_the_same_verdicts_as_on_local() {
    let _done = Done;
    same_verdicts_as_local(
        "lesson4-sm-off",
        &["lesson4", "--paths", "tcp,ib", "--scenario", "sm-off"],
    );
}

/// Wait for a run's pods to run; its run id from the state folder.
fn wait_for_pods(s: &Scratch, c: &Cluster, want: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(run) = s.runs().first()
            && c.pods_running(run) == want
        {
            return run.clone();
        }
        assert!(Instant::now() < deadline, "the run's pods never ran");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `up ARGS --backend kube` in the background, once `pods` pods of it run.
fn start_up(s: &Scratch, c: &Cluster, args: &[&str], pods: usize) -> (std::process::Child, String) {
    let mut all = vec!["up"];
    all.extend_from_slice(args);
    all.extend(["--backend", "kube"]);
    let mut cmd = kube_cmd(s, c, &all);
    cmd.arg("--out").arg(s.out());
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = wait_for_pods(s, c, pods);
    (child, run)
}

/// `up` of a lab whose two steps sleep 3 s each, in the background, once its pods run.
fn start_slow_lab(s: &Scratch, c: &Cluster) -> (std::process::Child, String) {
    let lab = repo().join("tests/labs/slow-steps.yaml");
    start_up(s, c, &[lab.to_str().unwrap()], 2)
}

/// Delete a pod of a run at once, as a node that dies would go.
fn delete_pod(c: &Cluster, run: &str, pod: &str) {
    let del = c.kubectl(&[
        "delete",
        "pod",
        pod,
        "-n",
        &format!("iblab-{run}"),
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    assert!(del.status.success(), "{}", said(&del));
}

#[test]
fn a_pod_deleted_mid_run_gives_exit_3_and_a_clean_teardown() {
    let _done = Done;
    let Some((_g, c)) = ready("pod deleted") else {
        return;
    };
    let s = Scratch::new("kube-pod-deleted");
    let (child, run) = start_slow_lab(&s, &c);
    // Into the first step (3 s of sleep on a), then node b goes.
    std::thread::sleep(Duration::from_secs(2));
    delete_pod(&c, &run, "b");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("node b") && (text.contains("deleted") || text.contains("being deleted")),
        "the run says which pod went: {text}"
    );
    c.assert_nothing_left(&run);
}

#[test]
fn the_subnet_pod_deleted_mid_run_gives_exit_3_and_a_clean_teardown() {
    let _done = Done;
    let Some((_g, c)) = ready("subnet pod deleted") else {
        return;
    };
    let s = Scratch::new("kube-subnet-deleted");
    // The lab's three pods and the subnet's.
    let (child, run) = start_up(&s, &c, &["lesson4", "--paths", "tcp,ib"], 4);
    std::thread::sleep(Duration::from_secs(2));
    delete_pod(&c, &run, "iblab-ib-subnet");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("iblab-ib-subnet"),
        "the run names the subnet's pod: {text}"
    );
    c.assert_nothing_left(&run);
}

#[test]
fn ctrl_c_mid_step_ends_with_130_and_removes_the_run() {
    let _done = Done;
    let Some((_g, c)) = ready("ctrl-c") else {
        return;
    };
    let s = Scratch::new("kube-ctrl-c");
    let (child, run) = start_slow_lab(&s, &c);
    std::thread::sleep(Duration::from_secs(1));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", said(&out));
    c.assert_nothing_left(&run);
}

#[test]
fn a_kept_run_is_entered_with_exec_and_removed_by_down() {
    let _done = Done;
    let Some((_g, c)) = ready("kept") else { return };
    let s = Scratch::new("kube-kept");
    let o = up(&s, &c, &["tcp-loss", "--backend", "kube", "--keep"]);
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let run = run_id(&s.evidence());
    assert!(c.pods_running(&run) == 3, "a kept lab stays up");
    let ex = exec(&s, &c, &run, "a", &["ip", "-br", "addr", "show", "eth0"]);
    assert_eq!(ex.status.code(), Some(0), "{}", said(&ex));
    assert!(
        String::from_utf8_lossy(&ex.stdout).contains("198.18."),
        "node a has its lab address on eth0: {}",
        said(&ex)
    );
    let code = exec(&s, &c, &run, "b", &["sh", "-c", "exit 7"]);
    assert_eq!(code.status.code(), Some(7), "the exit code passes through");
    let down = kube_cmd(&s, &c, &["down", &run]).output().unwrap();
    assert_eq!(down.status.code(), Some(0), "{}", said(&down));
    c.assert_nothing_left(&run);
}

#[test]
fn down_all_finds_a_crashed_runs_objects_by_label() {
    let _done = Done;
    let Some((_g, c)) = ready("crash") else {
        return;
    };
    let s = Scratch::new("kube-crash");
    let (mut child, run) = start_slow_lab(&s, &c);
    // A crash: no teardown, and its state file lost too.
    let _ = nix_kill(child.id());
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(s.state());
    assert!(
        !c.objects_of(&run).is_empty(),
        "the crash left the run's objects"
    );
    let down = kube_cmd(&s, &c, &["down", "--all"]).output().unwrap();
    assert_eq!(down.status.code(), Some(0), "{}", said(&down));
    assert!(
        String::from_utf8_lossy(&down.stdout).contains(&format!("iblab-{run}")),
        "down --all says what it removed: {}",
        said(&down)
    );
    c.assert_nothing_left(&run);
}

fn nix_kill(pid: u32) -> std::io::Result<()> {
    let st = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("kill failed"))
    }
}

#[test]
fn a_given_namespace_is_used_and_left_in_place() {
    let _done = Done;
    let Some((_g, c)) = ready("given namespace") else {
        return;
    };
    let ns = format!("iblab-e2e-given-{}", std::process::id());
    let made = c.kubectl(&["create", "namespace", &ns]);
    assert!(made.status.success(), "{}", said(&made));
    let s = Scratch::new("kube-given-ns");
    let o = up(
        &s,
        &c,
        &["tcp-loss", "--backend", "kube", "--namespace", &ns],
    );
    let run = run_id(&s.evidence());
    let still = c.kubectl(&["get", "namespace", &ns]);
    let _ = c.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(still.status.success(), "the given namespace stays");
    c.assert_nothing_left(&run);
}

#[test]
fn rendered_manifests_pass_the_api_servers_validation() {
    let _done = Done;
    let Some((_g, c)) = ready("render") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("iblab-kube-render-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Every built-in lab, in an existing namespace (a dry run creates no namespace for the
    // objects after it), then the golden files' Namespace object.
    let labs = Command::new(common::BIN).arg("list").output().unwrap();
    let names: Vec<String> = String::from_utf8_lossy(&labs.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(names.len() >= 6, "iblab list names the labs: {names:?}");
    let mut rendered = 0;
    for lab in &names {
        // Path ② is not carried in pods: the lab's other paths.
        let render = |paths: &str| {
            Command::new(common::BIN)
                .args(["render", lab, "--backend", "kube", "--paths", paths, "-o"])
                .arg(&dir)
                .env("IBLAB_KUBE_NAMESPACE", "default")
                .output()
                .unwrap()
        };
        let mut out = render("tcp,ib");
        if out.status.code() == Some(2) {
            out = render("tcp");
        }
        assert_eq!(out.status.code(), Some(0), "render {lab}: {}", said(&out));
        rendered += 1;
    }
    assert!(rendered >= 4, "rendered {rendered} labs");
    let check = |file: &Path| {
        let o = c.kubectl(&[
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "--server-side",
            "--field-manager=iblab",
            "-f",
            file.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "{} fails the API server's validation: {}",
            file.display(),
            said(&o)
        );
    };
    check(&dir);
    // The golden files name their namespaces: make them for the dry run's namespaced objects.
    for ns in ["iblab-render", "class-a"] {
        let _ = c.kubectl(&["create", "namespace", ns]);
    }
    let golden = repo().join("tests/fixtures/kube");
    let o = c.kubectl(&[
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "--server-side",
        "--field-manager=iblab",
        "-f",
        golden.to_str().unwrap(),
    ]);
    for ns in ["iblab-render", "class-a"] {
        let _ = c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
    assert!(
        o.status.success(),
        "golden files fail validation: {}",
        said(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
