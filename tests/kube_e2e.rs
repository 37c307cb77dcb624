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

use std::path::Path;
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::Scratch;
use common::cluster::{Cluster, Suite, repo, run_id, said, trials};

/// Each test is a trial of this binary's `main`: after the last one, whatever happened, it
/// stops the cluster if these trials started it (`cargo test --all-features --test kube_e2e NAME` runs
/// the trials whose name contains NAME).
static SUITE: Suite = Suite::new();

fn main() -> ExitCode {
    SUITE.run(
        trials![
            tcp_loss_gives_the_same_verdicts_as_on_local,
            lesson2_gives_the_same_verdicts_as_on_local,
            lesson4_gives_the_same_verdicts_as_on_local,
            lesson4_without_a_subnet_manager_gives_the_same_verdicts_as_on_local,
            a_pod_deleted_mid_run_gives_exit_3_and_a_clean_teardown,
            the_subnet_pod_deleted_mid_run_gives_exit_3_and_a_clean_teardown,
            ctrl_c_mid_step_ends_with_130_and_removes_the_run,
            a_kept_run_is_entered_with_exec_and_removed_by_down,
            down_all_finds_a_crashed_runs_objects_by_label,
            every_owners_sweep_takes_only_the_runs_it_showed,
            doctor_probes_whether_the_cluster_enforces_network_policy,
            a_given_namespace_is_used_and_left_in_place,
            rendered_manifests_pass_the_api_servers_validation,
        ],
        || {},
    )
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

/// The same lab on local and on kube: both pass, with the same verdict per expectation.
/// Returns the kube run's evidence.
fn same_verdicts_as_local(test: &str, args: &[&str]) -> Option<Value> {
    let (_g, c) = SUITE.ready(test)?;
    let (_, e) = c.same_verdicts_as("local", test, args);
    c.assert_nothing_left(&run_id(&e));
    Some(e)
}

fn tcp_loss_gives_the_same_verdicts_as_on_local() {
    let Some(kube) = same_verdicts_as_local("tcp-loss", &["tcp-loss"]) else {
        return;
    };
    // Host-internal counters from inside the pods, as on local: both sides of the clean
    // transfer have a data phase, and there each copied the payload through user space
    // once (TCP's write() on the sender, read() on the receiver): about 1 MiB per MiB.
    let clean = kube["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "clean")
        .expect("the clean step");
    for side in ["sender", "receiver"] {
        let c = &clean["detail"]["host_counters"][side];
        assert!(
            c["counters"]["data_phase"]["to_s"].as_f64()
                > c["counters"]["data_phase"]["from_s"].as_f64(),
            "{side}: no data phase from the pod: {c}"
        );
        let per_mib = clean["metrics"][format!("{side}_copied_bytes_per_mib")]["value"]
            .as_f64()
            .unwrap_or_else(|| panic!("{side}: no copied bytes per MiB: {}", clean["metrics"]));
        let mib = 1024.0 * 1024.0;
        assert!(
            (0.85 * mib..=1.15 * mib).contains(&per_mib),
            "{side}: {per_mib} B copied per MiB moved, not one copy"
        );
        assert!(
            clean["metrics"][format!("{side}_cpu_s_per_mib")]["value"].as_f64() > Some(0.0),
            "{side}: no CPU time from the pod"
        );
    }
}

/// Path ①'s latency test runs iblab's own ping-pong in the pods, which an init container
/// of the iblab image brings in; the bandwidth test's counters come from the pods.
fn lesson2_gives_the_same_verdicts_as_on_local() {
    let Some(kube) = same_verdicts_as_local("lesson2", &["lesson2", "--paths", "tcp,ib"]) else {
        return;
    };
    let latency = kube["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "latency" && s["path"] == "tcp")
        .expect("the latency step on path tcp");
    assert_eq!(latency["verdict"], "pass", "{latency}");
    let min = latency["metrics"]["latency_min_us"]["value"].as_f64();
    assert!(
        min > Some(0.0),
        "no round trip measured in the pods: {latency}"
    );
}

fn lesson4_gives_the_same_verdicts_as_on_local() {
    same_verdicts_as_local("lesson4", &["lesson4", "--paths", "tcp,ib"]);
}

fn lesson4_without_a_subnet_manager_gives_the_same_verdicts_as_on_local() {
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
    let mut cmd = c.iblab(s, &all);
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

fn a_pod_deleted_mid_run_gives_exit_3_and_a_clean_teardown() {
    let Some((_g, c)) = SUITE.ready("pod deleted") else {
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

fn the_subnet_pod_deleted_mid_run_gives_exit_3_and_a_clean_teardown() {
    let Some((_g, c)) = SUITE.ready("subnet pod deleted") else {
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

fn ctrl_c_mid_step_ends_with_130_and_removes_the_run() {
    let Some((_g, c)) = SUITE.ready("ctrl-c") else {
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

fn a_kept_run_is_entered_with_exec_and_removed_by_down() {
    let Some((_g, c)) = SUITE.ready("kept") else {
        return;
    };
    let s = Scratch::new("kube-kept");
    let o = c.up(&s, &["tcp-loss", "--backend", "kube", "--keep"]);
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    let run = run_id(&s.evidence());
    assert!(c.pods_running(&run) == 3, "a kept lab stays up");
    // Its pods exchange traffic only with one another (enforced where the network plugin
    // implements NetworkPolicy).
    let ns = format!("iblab-{run}");
    let name = format!("iblab-{run}");
    let p = c.json(&["get", "networkpolicy", "-n", &ns, &name]);
    let only_the_run = serde_json::json!({"matchLabels": {"iblab.dev/run": run}});
    assert_eq!(p["spec"]["podSelector"], only_the_run, "{p}");
    assert_eq!(
        p["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"]),
        "{p}"
    );
    assert_eq!(
        p["spec"]["ingress"][0]["from"][0]["podSelector"], only_the_run,
        "{p}"
    );
    assert_eq!(
        p["spec"]["egress"][0]["to"][0]["podSelector"], only_the_run,
        "{p}"
    );
    assert_eq!(
        p["metadata"]["ownerReferences"][0]["name"],
        name.as_str(),
        "{p}"
    );
    // And the cluster enforces it (the test cluster runs kube-router's firewall): a run's pod reaches another of its pods; a pod of another
    // namespace, which reaches the node, does not reach them.
    the_policy_keeps_out_other_pods(&c, &ns);
    // Its links' VNIs are its own draw, not the scheme's first (4000).
    let anchor = c.json(&["get", "configmap", "-n", &ns, &name]);
    let links = anchor["data"]["links"].as_str().unwrap_or_default();
    assert!(
        links.contains("type vxlan id ") && !links.contains("type vxlan id 4000 "),
        "{links}"
    );
    let ex = exec(&s, &c, &run, "a", &["ip", "-br", "addr", "show", "eth0"]);
    assert_eq!(ex.status.code(), Some(0), "{}", said(&ex));
    assert!(
        String::from_utf8_lossy(&ex.stdout).contains("198.18."),
        "node a has its lab address on eth0: {}",
        said(&ex)
    );
    let code = exec(&s, &c, &run, "b", &["sh", "-c", "exit 7"]);
    assert_eq!(code.status.code(), Some(7), "the exit code passes through");
    // Whoever enters a pod cannot replace the tools iblab measures with: the root
    // filesystem is read-only, and only /tmp (an emptyDir with a size limit) is writable.
    let replace = exec(
        &s,
        &c,
        &run,
        "a",
        &["sh", "-c", "cp /bin/true /usr/bin/iperf3"],
    );
    assert_ne!(replace.status.code(), Some(0), "{}", said(&replace));
    assert!(
        said(&replace).contains("Read-only file system"),
        "{}",
        said(&replace)
    );
    let scratch = exec(&s, &c, &run, "a", &["sh", "-c", "echo x > /tmp/x"]);
    assert_eq!(scratch.status.code(), Some(0), "{}", said(&scratch));
    // A second run given this run's namespace does not take over its pods: creating pod
    // `a` is refused (no forced apply), named with the run that holds it, and the second
    // run leaves nothing behind.
    let uid = |c: &Cluster| c.json(&["get", "pod", "-n", &ns, "a"])["metadata"]["uid"].clone();
    let before = uid(&c);
    let s2 = Scratch::new("kube-kept-clash");
    let clash = c.up(&s2, &["tcp-loss", "--backend", "kube", "--namespace", &ns]);
    assert_eq!(clash.status.code(), Some(3), "{}", said(&clash));
    assert!(
        said(&clash).contains("exists already") && said(&clash).contains(&run),
        "{}",
        said(&clash)
    );
    assert_eq!(uid(&c), before, "the first run's pod a is the same pod");
    assert!(c.pods_running(&run) == 3, "the first run's pods still run");
    let clashed = run_id(&s2.evidence());
    c.assert_nothing_left(&clashed);
    let down = c.iblab(&s, &["down", &run]).output().unwrap();
    assert_eq!(down.status.code(), Some(0), "{}", said(&down));
    c.assert_nothing_left(&run);
}

fn down_all_finds_a_crashed_runs_objects_by_label() {
    let Some((_g, c)) = SUITE.ready("crash") else {
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
    // Another owner's sweep (another machine or state folder on the same cluster) leaves
    // the run and says so.
    let other = c
        .iblab(&s, &["down", "--all"])
        .env("IBLAB_OWNER", "e2e-someone-else")
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(0), "{}", said(&other));
    assert!(
        String::from_utf8_lossy(&other.stdout).contains("another owner")
            && String::from_utf8_lossy(&other.stdout).contains(&run),
        "down --all of another owner names what it left: {}",
        said(&other)
    );
    assert!(
        !c.objects_of(&run).is_empty(),
        "another owner's down --all left the run's objects"
    );
    // Every owner's sweep lists what it would take and asks first: with no terminal and
    // no --yes it refuses (exit 2) and the run stays.
    let asked = c
        .iblab(&s, &["down", "--all", "--all-owners"])
        .env("IBLAB_OWNER", "e2e-someone-else")
        .output()
        .unwrap();
    assert_eq!(asked.status.code(), Some(2), "{}", said(&asked));
    assert!(
        String::from_utf8_lossy(&asked.stdout).contains("would also remove")
            && String::from_utf8_lossy(&asked.stdout).contains(&run)
            && said(&asked).contains("--yes"),
        "{}",
        said(&asked)
    );
    assert!(!c.objects_of(&run).is_empty(), "asked, not removed");
    // A LabRun's run is never a sweep's from here, not even every owner's with --yes.
    let ns = format!("iblab-{run}");
    let labrun = "iblab.dev/owner=labrun-00000000-0000-4000-8000-000000000e2e";
    let relabel = |l: &str| {
        let o = c.kubectl(&["label", "namespace", &ns, l, "--overwrite"]);
        assert!(o.status.success(), "{}", said(&o));
    };
    let mine = c.json(&["get", "namespace", &ns])["metadata"]["labels"]["iblab.dev/owner"]
        .as_str()
        .unwrap()
        .to_string();
    relabel(labrun);
    let everyone = c
        .iblab(&s, &["down", "--all", "--all-owners", "--yes"])
        .env("IBLAB_OWNER", "e2e-someone-else")
        .output()
        .unwrap();
    assert_eq!(everyone.status.code(), Some(0), "{}", said(&everyone));
    assert!(
        String::from_utf8_lossy(&everyone.stdout).contains("of LabRuns"),
        "{}",
        said(&everyone)
    );
    assert!(
        !c.objects_of(&run).is_empty(),
        "every owner's sweep left the LabRun's run"
    );
    relabel(&format!("iblab.dev/owner={mine}"));
    let down = c.iblab(&s, &["down", "--all"]).output().unwrap();
    assert_eq!(down.status.code(), Some(0), "{}", said(&down));
    assert!(
        String::from_utf8_lossy(&down.stdout).contains(&format!("iblab-{run}")),
        "down --all says what it removed: {}",
        said(&down)
    );
    c.assert_nothing_left(&run);
}

/// A run crashed with its state file lost: its objects stay on the cluster, and only a
/// sweep by label finds them.
fn crash_slow_lab(s: &Scratch, c: &Cluster) -> String {
    let (mut child, run) = start_slow_lab(s, c);
    let _ = nix_kill(child.id());
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(s.state());
    assert!(
        !c.objects_of(&run).is_empty(),
        "the crash left {run}'s objects"
    );
    run
}

/// `down --all --all-owners` takes exactly the runs it listed and the user confirmed: a
/// run of another owner that appears while the prompt is open is listed afresh and asked
/// for again, and survives a "no".
fn every_owners_sweep_takes_only_the_runs_it_showed() {
    let Some((_g, c)) = SUITE.ready("all owners") else {
        return;
    };
    let s1 = Scratch::new("kube-owners-shown");
    let shown = crash_slow_lab(&s1, &c);
    // Another owner's every-owner sweep, on a terminal (script(1) gives it one).
    let s = Scratch::new("kube-owners-sweeper");
    let inner = c.iblab(&s, &["down", "--all", "--all-owners"]);
    let mut line = vec![inner.get_program().to_string_lossy().into_owned()];
    line.extend(inner.get_args().map(|a| a.to_string_lossy().into_owned()));
    let mut cmd = Command::new("script");
    cmd.args(["-qefc", &line.join(" "), "/dev/null"])
        .env("IBLAB_OWNER", "e2e-someone-else")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut sweeper = cmd.spawn().expect("script runs");
    let mut answer = sweeper.stdin.take().unwrap();
    let out = sweeper.stdout.take().unwrap();
    let (said_tx, said_rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = said_tx.send(l.clone());
            all.push_str(&l);
            all.push('\n');
        }
        all
    });
    let wait_for = |what: &str| -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match said_rx.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(_) => panic!("the sweep never said `{what}`"),
            }
        }
    };
    // The list, object by object with uids, before the question.
    wait_for("would also remove");
    let first = wait_for(&format!("run {shown}: namespace iblab-{shown}"));
    assert!(first.contains("(uid "), "{first}");
    // While the prompt is open, another run of the first owner crashes.
    let s2 = Scratch::new("kube-owners-unseen");
    let unseen = crash_slow_lab(&s2, &c);
    use std::io::Write;
    answer.write_all(b"y\n").unwrap();
    wait_for("appeared since");
    let again = wait_for("(uid ");
    assert!(
        again.contains(&format!("run {unseen}: namespace iblab-{unseen}")),
        "asked again for the new run only: {again}"
    );
    answer.write_all(b"n\n").unwrap();
    drop(answer);
    let status = sweeper.wait().unwrap();
    let all = reader.join().unwrap();
    assert_eq!(status.code(), Some(2), "a no is exit 2:\n{all}");
    c.assert_nothing_left(&shown);
    assert!(
        !c.objects_of(&unseen).is_empty(),
        "the run that appeared during the prompt was taken unseen:\n{all}"
    );
    let down = c.iblab(&s2, &["down", "--all"]).output().unwrap();
    assert_eq!(down.status.code(), Some(0), "{}", said(&down));
    c.assert_nothing_left(&unseen);
}

/// `doctor` asks the cluster whether it enforces NetworkPolicy (a pod whose egress a policy
/// denies must not reach the API server, after one without it did) and says so; the probe
/// leaves nothing behind.
fn doctor_probes_whether_the_cluster_enforces_network_policy() {
    let Some((_g, c)) = SUITE.ready("doctor") else {
        return;
    };
    let s = Scratch::new("kube-doctor");
    let o = c.iblab(&s, &["doctor"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.contains("NetworkPolicy"))
        .unwrap_or_else(|| panic!("doctor says nothing of NetworkPolicy:\n{}", said(&o)));
    assert!(
        line.contains("enforced:") && !line.contains("NOT enforced"),
        "this cluster (kube-router) enforces NetworkPolicy: {line}"
    );
    let left = c.json(&[
        "get",
        "namespaces",
        "-l",
        "app.kubernetes.io/managed-by=iblab",
    ]);
    let probes: Vec<&str> = left["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .filter(|n| n.starts_with("iblab-netpol-probe-"))
        .collect();
    assert!(probes.is_empty(), "the probe left {probes:?}");
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

fn a_given_namespace_is_used_and_left_in_place() {
    let Some((_g, c)) = SUITE.ready("given namespace") else {
        return;
    };
    let ns = format!("iblab-e2e-given-{}", std::process::id());
    let made = c.kubectl(&["create", "namespace", &ns]);
    assert!(made.status.success(), "{}", said(&made));
    let s = Scratch::new("kube-given-ns");
    let o = c.up(&s, &["tcp-loss", "--backend", "kube", "--namespace", &ns]);
    let run = run_id(&s.evidence());
    let still = c.kubectl(&["get", "namespace", &ns]);
    let _ = c.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    assert_eq!(o.status.code(), Some(0), "{}", said(&o));
    assert!(still.status.success(), "the given namespace stays");
    c.assert_nothing_left(&run);
}

fn rendered_manifests_pass_the_api_servers_validation() {
    let Some((_g, c)) = SUITE.ready("render") else {
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
    // Path ②'s pods run under the node agent's RuntimeClass, which admission looks up: the
    // one manifests/node-agent.yaml installs, made for the dry run when it is not there
    // (and removed after it).
    let agent = std::fs::read_to_string(repo().join("manifests/node-agent.yaml")).unwrap();
    let runtime_class = agent
        .split("\n---\n")
        .find(|d| d.contains("kind: RuntimeClass"))
        .expect("manifests/node-agent.yaml has the RuntimeClass")
        .to_string();
    let made_class = !c
        .kubectl(&["get", "runtimeclass", "iblab-rxe"])
        .status
        .success();
    if made_class {
        let f = dir.join("runtime-class.yaml");
        std::fs::write(&f, &runtime_class).unwrap();
        let o = c.kubectl(&["create", "-f", f.to_str().unwrap()]);
        assert!(o.status.success(), "the RuntimeClass: {}", said(&o));
    }
    let golden = repo().join("crates/backend-kube/tests/fixtures/kube");
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
    if made_class {
        let _ = c.kubectl(&["delete", "runtimeclass", "iblab-rxe"]);
    }
    assert!(
        o.status.success(),
        "golden files fail validation: {}",
        said(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ping` from a pod of the run (b) to a's pod IP answers; from a pod in a namespace of its
/// own it does not, while that pod reaches the node's address (its network works: the
/// policy is what stops it); and from b that pod does not answer (egress only to the
/// run's pods). The namespace is removed whatever the outcome.
fn the_policy_keeps_out_other_pods(c: &Cluster, ns: &str) {
    let a_ip = c.json(&["get", "pod", "-n", ns, "a"])["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!a_ip.is_empty(), "pod a has no IP");
    let ping = |pod_ns: &str, pod: &str, ip: &str| {
        c.kubectl(&[
            "exec", "-n", pod_ns, pod, "--", "ping", "-c", "2", "-W", "2", ip,
        ])
    };
    let inside = ping(ns, "b", &a_ip);
    assert!(inside.status.success(), "b reaches a: {}", said(&inside));
    let other = format!("iblab-e2e-outsider-{}", std::process::id());
    struct Gone<'a>(&'a Cluster, String);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let _ = self
                .0
                .kubectl(&["delete", "namespace", &self.1, "--wait=false"]);
        }
    }
    let made = c.kubectl(&["create", "namespace", &other]);
    assert!(made.status.success(), "{}", said(&made));
    let _gone = Gone(c, other.clone());
    let image = format!("iblab/lab:{}", env!("CARGO_PKG_VERSION"));
    let run = c.kubectl(&[
        "run",
        "outsider",
        "-n",
        &other,
        &format!("--image={image}"),
        "--image-pull-policy=Never",
        "--restart=Never",
        "--command",
        "--",
        "sleep",
        "300",
    ]);
    assert!(run.status.success(), "{}", said(&run));
    let ready = c.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/outsider",
        "-n",
        &other,
        "--timeout=90s",
    ]);
    assert!(ready.status.success(), "{}", said(&ready));
    let node = ping(&other, "outsider", "198.19.0.1");
    assert!(
        node.status.success(),
        "the outsider reaches the node: {}",
        said(&node)
    );
    let into = ping(&other, "outsider", &a_ip);
    assert!(
        !into.status.success(),
        "a pod of another namespace reached the lab's pod a ({a_ip}) past its NetworkPolicy: {}",
        said(&into)
    );
    // And out: from the lab's pod no pod but the run's. (The node's own address stays
    // reachable on this cluster: kube-router applies NetworkPolicy to traffic between
    // pods, not to a pod's traffic to the node it runs on; docs/kube.md.)
    let outsider_ip = c.json(&["get", "pod", "-n", &other, "outsider"])["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let out = ping(ns, "b", &outsider_ip);
    assert!(
        !out.status.success(),
        "the lab's pod b reached a pod of another namespace ({outsider_ip}) past its \
         NetworkPolicy: {}",
        said(&out)
    );
}
