//! End-to-end tests of what a platform team installs, on the real single-node Kubernetes
//! that `kube/cluster` builds and starts: the Helm chart (operator Deployment, RBAC, CRDs)
//! with the operator image imported into the node, `helm test`, a class of three students
//! whose LabRuns the operator runs to a verdict on the kube backend, the students' and the
//! operator's rights checked on the API server, a LabRun deleted mid-run (its lab torn
//! down), the operator's pod deleted mid-run (the run starts again and finishes), and
//! deletion leaving nothing behind.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::Scratch;
use common::chart::{Release, helm};
use common::cluster::{Cluster, Suite, repo, tail, trials};

/// Each scenario is a trial of this binary's `main` (`cargo test --all-features --test
/// operator_e2e NAME` runs the trials whose name contains NAME): the cluster is started by
/// the first trial that needs it, the release and the class they share (`Shared`) are made
/// by the first scenario that needs them, and after the last trial, whatever happened,
/// `main` deletes them (checking that nothing is left) and stops the cluster if it started
/// it.
static SUITE: Suite = Suite::new();

fn main() -> ExitCode {
    SUITE.run(
        trials![
            node_prep_loads_as_root_then_sits_unprivileged,
            the_chart_passes_its_checks_against_the_api_server,
            the_operator_is_ready_once_network_policy_is_enforced,
            helm_test_finds_the_operators_crds,
            a_class_whose_namespace_is_taken_is_refused,
            a_class_of_three_runs_to_its_verdicts,
            students_and_the_operator_have_only_their_rights,
            a_labrun_deleted_mid_run_is_torn_down,
            one_owners_down_all_leaves_the_others,
            a_students_flood_fails_their_run_and_the_operator_stays_up,
            a_flooded_background_server_fails_only_its_run,
            a_student_in_their_pod_cannot_touch_a_figure,
            the_operators_pod_deleted_mid_run_runs_it_again,
            two_replicas_elect_one_leader,
            the_operator_killed_before_its_runs_objects_leaves_nothing,
            a_leader_cut_off_from_the_api_writes_nothing_once_replaced,
            a_labrun_for_a_lab_nobody_has_is_an_error,
        ],
        Shared::teardown,
    )
}

/// What the operator's scenarios share: the chart installed with the operator's image built
/// from this binary, a class of three students (applied, its runs waited for), and a
/// namespace of the test's own for LabRuns, where the operator's lab rights are bound and
/// the Lab `operator-slow` is published.
struct Shared {
    c: Cluster,
    s: Scratch,
    release: Release,
    class_name: String,
    /// The class's file.
    class: PathBuf,
    classes: Cleanup,
    /// The test's own namespace for LabRuns.
    ns: String,
    labs_ns: Cleanup,
}

/// The shared objects once the first scenario asked for them.
enum Made {
    Ready(Box<Shared>),
    /// A prerequisite (helm, the operator's image) is missing: every scenario says so.
    Missing(String),
    /// Making them failed (the first scenario said how).
    Failed(String),
}

static SHARED: Mutex<Option<Made>> = Mutex::new(None);

/// Run a scenario on the shared objects (made first if no scenario made them yet); a
/// missing prerequisite skips it as `common::missing` says (a failure in CI).
fn with_shared(test: &str, scenario: impl FnOnce(&Shared)) {
    let Some((_g, c)) = SUITE.ready(test) else {
        return;
    };
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let made = shared.get_or_insert_with(|| Shared::make(&c));
    match made {
        Made::Ready(sh) => scenario(sh),
        Made::Missing(what) => common::missing(&format!("{test}: {what}")),
        Made::Failed(why) => panic!("the shared release and class could not be made: {why}"),
    }
}

impl Shared {
    fn make(c: &Cluster) -> Made {
        let helm = match helm() {
            Ok(h) => h,
            Err(e) => return Made::Missing(format!("helm: {e}")),
        };
        if let Err(e) = common::cluster::iblab_image() {
            return Made::Missing(format!("the operator image: {e}"));
        }
        let made =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Shared::install(c, helm)));
        match made {
            Ok(sh) => Made::Ready(Box::new(sh)),
            Err(e) => Made::Failed(
                (e.downcast_ref::<String>().cloned())
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        }
    }

    fn install(c: &Cluster, helm: PathBuf) -> Shared {
        let s = Scratch::new("operator");
        let tag = s.tag();
        let release = Release::install(c, helm, &tag, &[]);
        // A class of three, in one step.
        let class_name = format!("e2e{tag}");
        let class = s.out().join("class.yaml");
        std::fs::create_dir_all(s.out()).unwrap();
        std::fs::write(
            &class,
            format!(
                "apiVersion: iblab.dev/v1\nkind: Class\nmetadata: {{name: {class_name}}}\nspec:\n  \
                 lab: tcp-loss\n  paths: [tcp]\n  students: [alice, bob, carol]\n  \
                 quota: {{cpu: \"2\", memory: 2Gi}}\n  \
                 operator: {{serviceAccount: {}/{}-operator, clusterRole: {}-lab}}\n",
                release.ns, release.name, release.name
            ),
        )
        .unwrap();
        let classes = Cleanup {
            c: c.clone(),
            selector: format!("iblab.dev/class={class_name}"),
        };
        let applied = iblab(&s, c, &["class", "apply", class.to_str().unwrap()]);
        assert!(applied.status.success(), "class apply: {}", said(&applied));
        // The class's runs end before any scenario runs beside them (its trial checks
        // their verdicts).
        let _ = iblab(
            &s,
            c,
            &["class", "status", class.to_str().unwrap(), "--wait", "10m"],
        );

        // A lab published as a Lab object.
        let lab_file = repo().join("tests/labs/operator-slow.yaml");
        let obj = ok(
            "iblab crd --lab",
            iblab(&s, c, &["crd", "--lab", lab_file.to_str().unwrap()]),
        );
        let obj_file = s.out().join("lab-object.yaml");
        std::fs::write(&obj_file, &obj.stdout).unwrap();
        ok(
            "apply the Lab",
            c.kubectl(&["apply", "-f", obj_file.to_str().unwrap()]),
        );
        let ns = format!("iblab-{tag}-labs");
        let labs_ns = Cleanup {
            c: c.clone(),
            selector: "iblab.dev/e2e=operator".into(),
        };
        lab_namespace(c, &ns);
        // A namespace the class did not make: the platform team binds the operator's lab
        // rights there, as docs/helm.md says.
        ok(
            "bind the operator's lab rights",
            c.kubectl(&[
                "create",
                "rolebinding",
                "iblab-lab",
                "-n",
                &ns,
                &format!("--clusterrole={}-lab", release.name),
                &format!("--serviceaccount={}:{}-operator", release.ns, release.name),
            ]),
        );
        Shared {
            c: c.clone(),
            s,
            release,
            class_name,
            class,
            classes,
            ns,
            labs_ns,
        }
    }

    /// The student alice's namespace.
    fn alice(&self) -> String {
        format!("{}-alice", self.class_name)
    }

    /// After the last trial: deleting the class removes every student's namespace, run
    /// and evidence; the test's LabRuns go with their namespace while the operator still
    /// runs; the release's removal takes the CRDs and leaves no lab pod.
    fn teardown() {
        let made = SHARED.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(Made::Ready(sh)) = made else {
            return;
        };
        let sh = *sh;
        let Shared {
            c,
            s,
            release,
            class_name,
            class,
            classes,
            ns: _,
            labs_ns,
        } = sh;
        let del = iblab(&s, &c, &["class", "delete", class.to_str().unwrap()]);
        assert!(del.status.success(), "class delete: {}", said(&del));
        let left = c.json(&[
            "get",
            "namespaces",
            "-l",
            &format!("iblab.dev/class={class_name}"),
        ]);
        assert_eq!(left["items"].as_array().map_or(0, Vec::len), 0);
        drop(classes);
        drop(labs_ns);
        ok(
            "delete the Lab",
            c.kubectl(&["delete", "lab", "operator-slow", "--wait=true"]),
        );
        drop(release);
        let crds = c.kubectl(&["get", "crd", "labruns.iblab.dev"]);
        assert!(
            !crds.status.success(),
            "the CRDs remain after the test's cleanup"
        );
        let pods = c.json(&["get", "pods", "-A", "-l", "iblab.dev/run"]);
        assert_eq!(
            pods["items"].as_array().map_or(0, Vec::len),
            0,
            "lab pods remain: {pods}"
        );
    }
}

fn said(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        tail(&o.stdout),
        tail(&o.stderr)
    )
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("the command starts")
}

fn ok(what: &str, o: Output) -> Output {
    assert!(o.status.success(), "{what}: {}", said(&o));
    o
}

/// iblab from a scratch folder, against the test cluster.
fn iblab_cmd(s: &Scratch, c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = s.cmd(args);
    cmd.env("KUBECONFIG", &c.kubeconfig)
        .env("IBLAB_KUBE_BIN", &c.bin)
        .env_remove("IBLAB_KUBE_NAMESPACE")
        .env_remove("IBLAB_KUBE_CONTEXT");
    cmd
}

fn iblab(s: &Scratch, c: &Cluster, args: &[&str]) -> Output {
    run(&mut iblab_cmd(s, c, args))
}

/// What a student (impersonated, as the API server sees them) may and may not do: every
/// refusal of the class's Role and admission policy, and the one change they may make.
fn students_may_only_ask_for_a_rerun(c: &Cluster, ns: &str) {
    // (Reading, entering and not making pods are asked below, with the other students.)
    for args in [
        ["create", "pods/exec", "-n", "kube-system"],
        ["get", "labruns", "-n", "kube-system"],
        ["delete", "labruns", "-n", ns],
        ["create", "rolebindings", "-n", ns],
    ] {
        assert!(!can(c, "alice", &args), "can-i --as alice {args:?}");
    }
    let as_alice = |args: &[&str]| -> Output {
        let mut all = vec!["--as", "alice", "-n", ns];
        all.extend_from_slice(args);
        c.kubectl(&all)
    };
    // Server-side dry runs: admission judges them, nothing is changed. An admission policy
    // takes effect a moment after it is made: the first refusal is waited for.
    let patch = |p: &str| {
        as_alice(&[
            "patch",
            "labrun",
            "tcp-loss",
            "--type",
            "merge",
            "--dry-run=server",
            "-p",
            p,
        ])
    };
    let until = Instant::now() + Duration::from_secs(20);
    while patch(r#"{"spec":{"lab":"lesson4"}}"#).status.success() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(500));
    }
    for (what, p) in [
        ("spec", r#"{"spec":{"lab":"lesson4"}}"#),
        (
            "finalizers",
            r#"{"metadata":{"finalizers":["example.com/forever"]}}"#,
        ),
        (
            "labels",
            r#"{"metadata":{"labels":{"iblab.dev/student":"bob"}}}"#,
        ),
        (
            "annotation",
            r#"{"metadata":{"annotations":{"example.com/x":"y"}}}"#,
        ),
        // An owner that does not exist: garbage collection would delete the LabRun and
        // its evidence with it.
        (
            "owners",
            r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-4000-8000-00000000dead"}]}}"#,
        ),
    ] {
        let o = patch(p);
        assert!(
            !o.status.success(),
            "a student changed a LabRun's {what}: {}",
            said(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("a student may"),
            "the refusal of {what} says why: {}",
            said(&o)
        );
    }
    // The re-run annotation passes the policy (a server-side dry run: nothing changes).
    let o = as_alice(&[
        "annotate",
        "labrun",
        "tcp-loss",
        "iblab.dev/rerun=1",
        "--dry-run=server",
    ]);
    assert!(
        o.status.success(),
        "a student may ask for a re-run: {}",
        said(&o)
    );
}

fn labrun(c: &Cluster, ns: &str, name: &str) -> Option<Value> {
    let o = c.kubectl(&["get", "labrun", name, "-n", ns, "-o", "json"]);
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).expect("JSON"))
}

/// Wait until the LabRun's status satisfies `done`, or fail with what it last said.
fn wait_labrun(
    r: &Release,
    ns: &str,
    name: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let until = Instant::now() + within;
    loop {
        let v = labrun(&r.c, ns, name).unwrap_or(Value::Null);
        if done(&v) {
            return v;
        }
        assert!(
            Instant::now() < until,
            "LabRun {ns}/{name} after {within:?}: {}\noperator: {}",
            serde_json::to_string_pretty(&v["status"]).unwrap_or_default(),
            r.operator_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn pods_of_run(c: &Cluster, run: &str) -> usize {
    c.json(&["get", "pods", "-A", "-l", &format!("iblab.dev/run={run}")])["items"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Wait until the LabRun's run has `n` pods whose containers all run (a student can enter
/// them): the run id is in the status before the run makes anything.
fn wait_running_pods(c: &Cluster, r: &Release, ns: &str, name: &str, n: usize) {
    let v = wait_labrun(r, ns, name, Duration::from_secs(120), |v| {
        v["status"]["phase"] == "Running" && v["status"]["runId"].is_string()
    });
    let run = v["status"]["runId"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let pods = c.json(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            &format!("iblab.dev/run={run}"),
        ]);
        let running = pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| {
                        !cs.is_empty() && cs.iter().all(|c| c["state"]["running"].is_object())
                    })
            })
            .count();
        if running >= n {
            return;
        }
        assert!(Instant::now() < until, "{name}'s pods never ran: {pods}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A namespace for a LabRun of the test's own, at the level lab pods need.
fn lab_namespace(c: &Cluster, ns: &str) {
    ok(
        "create a lab namespace",
        c.kubectl(&["create", "namespace", ns]),
    );
    ok(
        "label it",
        c.kubectl(&[
            "label",
            "namespace",
            ns,
            "pod-security.kubernetes.io/enforce=privileged",
            "iblab.dev/e2e=operator",
        ]),
    );
}

fn apply_labrun(c: &Cluster, s: &Scratch, ns: &str, name: &str, lab: &str) {
    let file = s.out().join(format!("{name}.yaml"));
    std::fs::create_dir_all(s.out()).unwrap();
    std::fs::write(
        &file,
        format!(
            "apiVersion: iblab.dev/v1\nkind: LabRun\nmetadata: {{name: {name}, namespace: {ns}}}\n\
             spec: {{lab: {lab}, paths: [tcp], student: e2e}}\n"
        ),
    )
    .unwrap();
    ok(
        "apply a LabRun",
        c.kubectl(&["apply", "-f", file.to_str().unwrap()]),
    );
}

fn can(c: &Cluster, who: &str, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i", "--as", who];
    all.extend_from_slice(args);
    let o = c.kubectl(&all);
    String::from_utf8_lossy(&o.stdout).trim() == "yes"
}

fn has_all_files(cm: &Value) -> bool {
    ["evidence.json", "junit.xml", "report.html"]
        .iter()
        .all(|k| cm["data"][k].is_string())
}

/// The chart's own checks, with the dry run of both value sets against this API server
/// (its OpenAPI schemas, `--validate=strict`, PodSecurity admission of the namespaces).
fn the_chart_passes_its_checks_against_the_api_server() {
    let test = "the chart's checks";
    let Some((_g, c)) = SUITE.ready(test) else {
        return;
    };
    let helm = match helm() {
        Ok(h) => h,
        Err(e) => return common::missing(&format!("{test}: helm: {e}")),
    };
    let checked = run(Command::new(repo().join("tests/chart/check"))
        .env("KUBECONFIG", &c.kubeconfig)
        .env("IBLAB_KUBE_BIN", &c.bin)
        .env("HELM", &helm));
    let said_checks = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(
        checked.status.success(),
        "tests/chart/check: {}",
        said(&checked)
    );
    assert!(
        said_checks.contains("ok   API server"),
        "no dry run: {said_checks}"
    );
}

/// Ready only once its probe found NetworkPolicy enforced (requireNetworkPolicy, on by
/// default), and /readyz says so; the probe's pods and policy are gone.
fn the_operator_is_ready_once_network_policy_is_enforced() {
    with_shared("operator ready", |sh| {
        let (c, release) = (&sh.c, &sh.release);
        let holder = one_ready_holder(c, release);
        let readyz = c.kubectl(&[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{}/pods/{holder}:8080/proxy/readyz",
                release.ns
            ),
        ]);
        assert!(
            String::from_utf8_lossy(&readyz.stdout).contains("networkpolicy: enforced:"),
            "/readyz: {}",
            said(&readyz)
        );
        let probes = c.json(&[
            "get",
            "pods,networkpolicies",
            "-n",
            &release.ns,
            "-l",
            "iblab.dev/netpol-probe",
        ]);
        assert_eq!(
            probes["items"].as_array().map_or(0, Vec::len),
            0,
            "the NetworkPolicy probe left {probes}\n{}",
            release.operator_log()
        );
    });
}

/// helm test: the operator applied its CRDs and LabRuns can be listed.
fn helm_test_finds_the_operators_crds() {
    with_shared("helm test", |sh| {
        let release = &sh.release;
        let t = release.helm(&[
            "test",
            &release.name,
            "-n",
            &release.ns,
            "--timeout",
            "120s",
        ]);
        assert!(
            t.status.success(),
            "helm test: {}\n{}",
            said(&t),
            release.operator_log()
        );
    });
}

/// A class whose student's namespace exists already (made by someone else) is refused
/// before anything is applied, and that namespace is left as it was.
fn a_class_whose_namespace_is_taken_is_refused() {
    with_shared("taken namespace", |sh| {
        let (c, s) = (&sh.c, &sh.s);
        let tag = s.tag();
        let theirs = format!("e2e{tag}x-dave");
        ok(
            "kubectl create namespace",
            c.kubectl(&["create", "namespace", &theirs]),
        );
        let taken = s.out().join("taken.yaml");
        std::fs::create_dir_all(s.out()).unwrap();
        std::fs::write(
            &taken,
            format!(
                "apiVersion: iblab.dev/v1\nkind: Class\nmetadata: {{name: e2e{tag}x}}\nspec:\n  \
                 lab: tcp-loss\n  paths: [tcp]\n  students: [dave]\n"
            ),
        )
        .unwrap();
        let refused = iblab(s, c, &["class", "apply", taken.to_str().unwrap()]);
        let ns_after = c.json(&["get", "namespace", &theirs]);
        let quotas = c.json(&["get", "resourcequotas", "-n", &theirs]);
        let _ = c.kubectl(&["delete", "namespace", &theirs, "--wait=false"]);
        assert_eq!(refused.status.code(), Some(3), "{}", said(&refused));
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains(&theirs),
            "the refusal names the namespace: {}",
            said(&refused)
        );
        assert!(
            ns_after["metadata"]["labels"]
                .get("iblab.dev/class")
                .is_none(),
            "the existing namespace was not relabelled: {ns_after}"
        );
        assert_eq!(
            quotas["items"].as_array().map(Vec::len),
            Some(0),
            "{quotas}"
        );
    });
}

/// The class of three (applied in one step by `Shared`): its LabRuns listed with their
/// columns, its students' rights, its quota, and every student's run to a pass whose
/// status agrees with the evidence kept in the cluster, in one JUnit file.
fn a_class_of_three_runs_to_its_verdicts() {
    with_shared("class", |sh| {
        let (c, s, release, class_name) = (&sh.c, &sh.s, &sh.release, &sh.class_name);
        let class = &sh.class;
        let listed = ok("kubectl get labruns", c.kubectl(&["get", "labruns", "-A"]));
        let header = String::from_utf8_lossy(&listed.stdout);
        for col in ["LAB", "SCENARIO", "PHASE", "VERDICT", "AGE"] {
            assert!(
                header.contains(col),
                "printer column {col} missing: {header}"
            );
        }
        students_may_only_ask_for_a_rerun(c, &sh.alice());
        // Each student's quota bounds cpu and memory requests: a lab pod without requests
        // would be refused by it, so the verdicts below show that lab pods carry them.
        let q = c.json(&["get", "resourcequotas", "-n", &sh.alice()]);
        let hard = &q["items"][0]["spec"]["hard"];
        assert_eq!(
            (
                hard["requests.cpu"].as_str(),
                hard["requests.memory"].as_str()
            ),
            (Some("2"), Some("2Gi")),
            "{q}"
        );

        let junit = s.out().join("class.junit.xml");
        let st = iblab(
            s,
            c,
            &[
                "class",
                "status",
                class.to_str().unwrap(),
                "--json",
                "--wait",
                "10m",
                "--junit",
                junit.to_str().unwrap(),
            ],
        );
        let summary: Value = serde_json::from_slice(&st.stdout)
            .unwrap_or_else(|e| panic!("class status --json: {e}: {}", said(&st)));
        assert_eq!(
            st.status.code(),
            Some(0),
            "class status: {}\n{}",
            said(&st),
            release.operator_log()
        );
        let students = summary["students"].as_array().unwrap();
        assert_eq!(students.len(), 3);
        for stu in students {
            a_students_run_agrees_with_its_evidence(c, class_name, stu);
        }
        let x = std::fs::read_to_string(&junit).unwrap();
        assert_eq!(x.matches("<testsuite ").count(), 3, "{x}");
        for name in ["alice", "bob", "carol"] {
            assert!(x.contains(&format!("name=\"{class_name}/{name}\"")), "{x}");
        }
        assert!(!x.contains("<failure") && !x.contains("<error"), "{x}");
    });
}

/// A student of `class status --json`: passed, and its LabRun's status agrees with the
/// evidence the run wrote, kept in the cluster and owned by the LabRun; the run's own
/// objects are gone.
fn a_students_run_agrees_with_its_evidence(c: &Cluster, class_name: &str, stu: &Value) {
    let name = stu["student"].as_str().unwrap();
    let ns = format!("{class_name}-{name}");
    assert_eq!(stu["phase"], "Succeeded", "{stu}");
    assert_eq!(stu["verdict"], "pass", "{stu}");
    // The status agrees with the evidence the run wrote, kept in the cluster.
    let run = labrun(c, &ns, "tcp-loss").unwrap();
    let status = &run["status"];
    assert_eq!(status["labSource"], "builtin/tcp-loss");
    let cm = c.json(&["get", "configmap", "tcp-loss-evidence", "-n", &ns]);
    assert!(
        has_all_files(&cm),
        "evidence files: {:?}",
        cm["data"].as_object().map(|m| m.keys().collect::<Vec<_>>())
    );
    let ev: Value = serde_json::from_str(cm["data"]["evidence.json"].as_str().unwrap()).unwrap();
    assert_eq!(ev["verdict"], "pass");
    assert_eq!(ev["backend"], "kube");
    assert_eq!(status["runId"], ev["run_id"]);
    let ids = |v: &Value, key: &str| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!(
                    "{}={}",
                    e["id"].as_str().unwrap_or(""),
                    e[key].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    assert_eq!(
        ids(&status["expectations"], "verdict"),
        ids(&ev["expectations"], "verdict")
    );
    assert_eq!(
        cm["metadata"]["ownerReferences"][0]["uid"], run["metadata"]["uid"],
        "the evidence is owned by its LabRun"
    );
    // The run's own objects are gone; only the evidence stays.
    assert_eq!(pods_of_run(c, ev["run_id"].as_str().unwrap()), 0);
}

/// Who may do what, asked of the API server: a student in their own namespace only, the
/// operator's lab rights only where a namespace binds them, its Lease its own only.
fn students_and_the_operator_have_only_their_rights() {
    with_shared("rights", |sh| {
        let (c, s, release, class_name) = (&sh.c, &sh.s, &sh.release, &sh.class_name);
        let (alice, bob) = (format!("{class_name}-alice"), format!("{class_name}-bob"));
        assert!(can(c, "alice", &["get", "pods", "-n", &alice]));
        assert!(can(
            c,
            "alice",
            &["create", "pods", "--subresource=exec", "-n", &alice]
        ));
        assert!(can(c, "alice", &["get", "labruns.iblab.dev", "-n", &alice]));
        assert!(can(c, "alice", &["get", "configmaps", "-n", &alice]));
        assert!(
            !can(c, "alice", &["get", "pods", "-n", &bob]),
            "alice reads bob's pods"
        );
        assert!(
            !can(c, "alice", &["get", "labruns.iblab.dev", "-n", &bob]),
            "alice reads bob's runs"
        );
        assert!(
            !can(c, "alice", &["get", "configmaps", "-n", &bob]),
            "alice reads bob's evidence"
        );
        assert!(
            !can(c, "alice", &["create", "pods", "-n", &alice]),
            "alice makes pods"
        );
        assert!(
            !can(c, "alice", &["delete", "pods", "-n", &alice]),
            "alice deletes pods"
        );
        assert!(
            !can(c, "alice", &["get", "secrets", "-n", &alice]),
            "alice reads secrets"
        );
        let sa = format!(
            "system:serviceaccount:{}:{}-operator",
            release.ns, release.name
        );
        assert!(
            can(c, &sa, &["create", "pods", "-n", &alice]),
            "the operator makes lab pods"
        );
        assert!(can(
            c,
            &sa,
            &["create", "pods", "--subresource=exec", "-n", &alice]
        ));
        assert!(can(
            c,
            &sa,
            &[
                "patch",
                "labruns.iblab.dev",
                "--subresource=status",
                "-n",
                &bob
            ]
        ));
        assert!(
            !can(c, &sa, &["get", "secrets", "-n", &alice]),
            "the operator reads secrets"
        );
        assert!(
            !can(c, &sa, &["create", "namespaces"]),
            "the operator makes namespaces"
        );
        assert!(
            !can(c, &sa, &["delete", "nodes"]),
            "the operator deletes nodes"
        );
        assert!(
            !can(c, &sa, &["create", "clusterrolebindings"]),
            "the operator grants rights"
        );
        // The leader election's Lease, its own only.
        let lease = format!("leases.coordination.k8s.io/{}-operator", release.name);
        assert!(can(c, &sa, &["update", &lease, "-n", &release.ns]));
        for (what, ns) in [
            (
                "leases.coordination.k8s.io/kube-controller-manager",
                "kube-system",
            ),
            ("leases.coordination.k8s.io/kube-scheduler", "kube-system"),
            ("leases.coordination.k8s.io/another", release.ns.as_str()),
        ] {
            assert!(
                !can(c, &sa, &["update", what, "-n", ns]),
                "the operator updates {what} in {ns}"
            );
        }
        operator_pods_are_only_lab_pods(c, release, &sa, &alice, s);
        // Its lab rights hold only where a namespace binds them (the class's do): no pods,
        // no exec, no ConfigMaps anywhere else; in its own namespace only the NetworkPolicy
        // probe's pods (create, get, delete: no exec, no list; the pod policy admits them as
        // it admits lab pods).
        for ns in ["kube-system", "default", &release.ns] {
            for args in [
                vec!["create", "pods", "--subresource=exec", "-n", ns],
                vec!["create", "pods", "-n", ns],
                vec!["list", "pods", "-n", ns],
                vec!["patch", "configmaps", "-n", ns],
            ] {
                if ns == release.ns && args[..2] == ["create", "pods"] && args.len() == 4 {
                    assert!(can(c, &sa, &args), "the NetworkPolicy probe needs {args:?}");
                    continue;
                }
                assert!(!can(c, &sa, &args), "the operator can {args:?}");
            }
        }
    });
}

/// A LabRun of a published Lab, deleted mid-run: its lab is torn down.
fn a_labrun_deleted_mid_run_is_torn_down() {
    with_shared("deleted mid-run", |sh| {
        let (c, s, release, ns) = (&sh.c, &sh.s, &sh.release, &sh.ns);
        apply_labrun(c, s, ns, "doomed", "operator-slow");
        let going = wait_labrun(release, ns, "doomed", Duration::from_secs(120), |v| {
            v["status"]["phase"] == "Running" && v["status"]["runId"].is_string()
        });
        assert_eq!(going["status"]["labSource"], "Lab/operator-slow");
        let doomed_run = going["status"]["runId"].as_str().unwrap().to_string();
        let until = Instant::now() + Duration::from_secs(60);
        while pods_of_run(c, &doomed_run) < 2 {
            assert!(Instant::now() < until, "the doomed run's pods never came");
            std::thread::sleep(Duration::from_millis(300));
        }
        ok(
            "delete the running LabRun",
            c.kubectl(&[
                "delete",
                "labrun",
                "doomed",
                "-n",
                ns,
                "--wait=true",
                "--timeout=120s",
            ]),
        );
        assert_eq!(
            pods_of_run(c, &doomed_run),
            0,
            "the deleted run's pods remain"
        );
        c.assert_nothing_left(&doomed_run);
    });
}

fn one_owners_down_all_leaves_the_others() {
    with_shared("one owner's down --all", |sh| {
        one_owners_down_all_leaves_the_others_on(&sh.c, &sh.release, &sh.ns)
    });
}

fn a_students_flood_fails_their_run_and_the_operator_stays_up() {
    with_shared("a student's flood", |sh| {
        a_students_flood_fails_their_run_and_the_operator_stays_up_on(
            &sh.c,
            &sh.release,
            &sh.ns,
            &sh.alice(),
        )
    });
}

fn a_flooded_background_server_fails_only_its_run() {
    with_shared("a flooded background server", |sh| {
        a_flooded_background_server_fails_only_its_run_on(&sh.c, &sh.release, &sh.ns, &sh.alice())
    });
}

fn a_student_in_their_pod_cannot_touch_a_figure() {
    with_shared("a student in their pod", |sh| {
        a_student_in_their_pod_cannot_touch_a_figure_on(&sh.c, &sh.release, &sh.alice())
    });
}

/// The operator's pod deleted mid-run: it stops the run (torn down, back to Pending), the
/// Deployment's next operator runs it again, to its verdict.
fn the_operators_pod_deleted_mid_run_runs_it_again() {
    with_shared("operator deleted mid-run", |sh| {
        let (c, s, release, ns) = (&sh.c, &sh.s, &sh.release, &sh.ns);
        apply_labrun(c, s, ns, "survivor", "operator-slow");
        let first = wait_labrun(release, ns, "survivor", Duration::from_secs(120), |v| {
            v["status"]["phase"] == "Running" && v["status"]["runId"].is_string()
        });
        let first_run = first["status"]["runId"].as_str().unwrap().to_string();
        ok(
            "delete the operator's pod",
            c.kubectl(&[
                "delete",
                "pod",
                "-n",
                &release.ns,
                "-l",
                "app.kubernetes.io/component=operator",
                "--wait=true",
                "--timeout=120s",
            ]),
        );
        assert_eq!(
            pods_of_run(c, &first_run),
            0,
            "the interrupted run's pods remain"
        );
        let done = wait_labrun(release, ns, "survivor", Duration::from_secs(300), |v| {
            v["status"]["phase"] == "Succeeded"
        });
        assert_eq!(done["status"]["attempts"], 2, "{}", done["status"]);
        assert_ne!(done["status"]["runId"].as_str(), Some(first_run.as_str()));
    });
}

/// Two replicas: the one holding the Lease runs LabRuns, the other waits; when the holder
/// goes, the other takes the Lease over and runs the next one.
fn two_replicas_elect_one_leader() {
    with_shared("two replicas", |sh| {
        two_replicas_elect_one_leader_on(&sh.c, &sh.release, &sh.s, &sh.ns)
    });
}

fn the_operator_killed_before_its_runs_objects_leaves_nothing() {
    with_shared("operator killed", |sh| {
        the_operator_killed_before_its_runs_objects_leaves_nothing_on(
            &sh.c,
            &sh.release,
            &sh.s,
            &sh.ns,
        )
    });
}

fn a_leader_cut_off_from_the_api_writes_nothing_once_replaced() {
    with_shared("leader cut off", |sh| {
        a_leader_cut_off_from_the_api_writes_nothing_once_replaced_on(
            &sh.c,
            &sh.release,
            &sh.s,
            &sh.ns,
        )
    });
}

/// A LabRun for a lab nobody has: an error that says so, nothing deployed.
fn a_labrun_for_a_lab_nobody_has_is_an_error() {
    with_shared("no such lab", |sh| {
        let (c, s, release, ns) = (&sh.c, &sh.s, &sh.release, &sh.ns);
        apply_labrun(c, s, ns, "nolab", "no-such-lab");
        let bad = wait_labrun(release, ns, "nolab", Duration::from_secs(60), |v| {
            v["status"]["phase"] == "Error"
        });
        assert_eq!(bad["status"]["exitCode"], 2);
        assert!(
            bad["status"]["message"]
                .as_str()
                .unwrap()
                .contains("no-such-lab")
        );
    });
}

/// The operator's pods, by name, with whether each is ready.
fn operator_pods(c: &Cluster, r: &Release) -> Vec<(String, bool)> {
    let pods = c.json(&[
        "get",
        "pods",
        "-n",
        &r.ns,
        "-l",
        "app.kubernetes.io/component=operator",
    ]);
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                ready,
            )
        })
        .collect()
}

/// Who holds the operator's Lease, and how many times it changed hands.
fn lease_holder(c: &Cluster, r: &Release) -> (String, i64) {
    let l = c.json(&["get", "lease", &format!("{}-operator", r.name), "-n", &r.ns]);
    (
        l["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        l["spec"]["leaseTransitions"].as_i64().unwrap_or(0),
    )
}

fn pod_log(c: &Cluster, r: &Release, pod: &str) -> String {
    let o = c.kubectl(&["logs", "-n", &r.ns, pod]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn two_replicas_elect_one_leader_on(c: &Cluster, r: &Release, s: &Scratch, ns: &str) {
    let deploy = format!("deployment/{}-operator", r.name);
    let scale = |n: &str| {
        ok(
            "scale the operator",
            c.kubectl(&["scale", &deploy, "-n", &r.ns, &format!("--replicas={n}")]),
        )
    };
    scale("2");
    let until = Instant::now() + Duration::from_secs(120);
    let pods = loop {
        let p = operator_pods(c, r);
        if p.len() == 2 && p.iter().all(|(_, ready)| *ready) {
            break p;
        }
        assert!(
            Instant::now() < until,
            "two ready operator pods never came: {p:?}\n{}",
            r.operator_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let (holder, transitions) = lease_holder(c, r);
    let waiter = pods
        .iter()
        .map(|(n, _)| n.clone())
        .find(|n| *n != holder)
        .unwrap_or_else(|| panic!("the Lease's holder {holder:?} is none of {pods:?}"));
    assert!(
        pods.iter().any(|(n, _)| *n == holder),
        "the Lease is held by {holder:?}, not by one of {pods:?}"
    );
    let until = Instant::now() + Duration::from_secs(30);
    while !pod_log(c, r, &waiter).contains("waiting for the lease") {
        assert!(
            Instant::now() < until,
            "the second replica does not wait: {}",
            pod_log(c, r, &waiter)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // One LabRun, run by the holder only.
    apply_labrun(c, s, ns, "elected", "operator-slow");
    wait_labrun(r, ns, "elected", Duration::from_secs(300), |v| {
        v["status"]["phase"] == "Succeeded"
    });
    assert!(
        pod_log(c, r, &holder).contains(&format!("{ns}/elected")),
        "the holder did not run it: {}",
        pod_log(c, r, &holder)
    );
    assert!(
        !pod_log(c, r, &waiter).contains(&format!("{ns}/elected")),
        "the waiting replica touched it: {}",
        pod_log(c, r, &waiter)
    );
    // The holder goes: it releases the Lease, and a waiting replica takes it at once
    // (within a poll, not the 15 s a holder that vanished would take). The waiting one, or
    // the Deployment's new pod, whichever asks first: never the one that went.
    ok(
        "delete the holder",
        c.kubectl(&[
            "delete",
            "pod",
            &holder,
            "-n",
            &r.ns,
            "--wait=true",
            "--timeout=120s",
        ]),
    );
    let gone = Instant::now();
    let until = gone + Duration::from_secs(30);
    let next = loop {
        let (now_holder, now_transitions) = lease_holder(c, r);
        if !now_holder.is_empty() && now_holder != holder {
            assert_eq!(now_transitions, transitions + 1);
            break now_holder;
        }
        assert!(
            Instant::now() < until,
            "no other replica took the Lease: held by {now_holder:?}\n{}",
            pod_log(c, r, &waiter)
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let took_s = gone.elapsed().as_secs_f64();
    assert!(took_s < 10.0, "the Lease changed hands after {took_s:.1} s");
    apply_labrun(c, s, ns, "after-election", "operator-slow");
    wait_labrun(r, ns, "after-election", Duration::from_secs(300), |v| {
        v["status"]["phase"] == "Succeeded"
    });
    assert!(
        pod_log(c, r, &next).contains(&format!("{ns}/after-election")),
        "the new holder {next} did not run it: {}",
        pod_log(c, r, &next)
    );
    scale("1");
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let p = operator_pods(c, r);
        let (h, _) = lease_holder(c, r);
        if p.len() == 1 && p[0].1 && p[0].0 == h {
            break;
        }
        assert!(
            Instant::now() < until,
            "one ready operator holding the Lease never came: {p:?}, held by {h:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A rule in a pod's network namespace that drops its traffic to the API server, taken
/// away when dropped (whatever the test's outcome).
struct Blackhole {
    pid: u32,
    rule: Vec<String>,
}

impl Blackhole {
    /// Cut the pod (by uid) off from the API server: a DROP in its own namespace, entered
    /// from this host through one of its processes.
    fn cut(pod_uid: &str) -> Blackhole {
        let want = format!("pod{pod_uid}");
        let pid = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| c.contains(&want))
            })
            .unwrap_or_else(|| panic!("no process of pod {pod_uid} on this host"));
        let rule: Vec<String> = [
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            common::chart::API_HOST,
            "--dport",
            common::chart::API_PORT,
            "-j",
            "DROP",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let b = Blackhole { pid, rule };
        b.iptables("-I");
        b
    }

    fn iptables(&self, op: &str) -> Output {
        let o = Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-n", "iptables", op])
            .args(&self.rule)
            .output()
            .expect("nsenter runs");
        if op == "-I" {
            assert!(o.status.success(), "iptables {op} in the pod: {}", said(&o));
        }
        o
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        let _ = self.iptables("-D");
    }
}

/// The API server's audit events (kube/cluster writes them as JSON lines).
fn audit_events() -> Vec<Value> {
    let text = std::fs::read_to_string("/var/lib/iblab/kube-run/logs/audit.log")
        .expect("the API server's audit log (kube/cluster turns it on)");
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Was this audit event asked by this pod (its service account token names it, or the
/// request came from its IP)?
fn asked_by(e: &Value, pod: &str, ip: &str) -> bool {
    e["user"]["extra"]["authentication.kubernetes.io/pod-name"]
        .as_array()
        .is_some_and(|a| a.iter().any(|n| n == pod))
        || e["sourceIPs"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i == ip))
}

/// Two replicas; the leader, while it runs a LabRun, is cut off from the API server for
/// 30 s (a DROP in its pod's network namespace). It stops its run before its Lease can
/// expire, the other replica takes the Lease over and runs the LabRun again to its
/// verdict, and from the moment the Lease changed hands the former leader writes no
/// LabRun status at all, not even once it hears the API again (read from the API
/// server's audit of status writes).
fn a_leader_cut_off_from_the_api_writes_nothing_once_replaced_on(
    c: &Cluster,
    r: &Release,
    s: &Scratch,
    ns: &str,
) {
    let deploy = format!("deployment/{}-operator", r.name);
    let scale = |n: &str| {
        ok(
            "scale the operator",
            c.kubectl(&["scale", &deploy, "-n", &r.ns, &format!("--replicas={n}")]),
        )
    };
    scale("2");
    let until = Instant::now() + Duration::from_secs(120);
    while !(operator_pods(c, r).len() == 2 && operator_pods(c, r).iter().all(|(_, ready)| *ready)) {
        assert!(Instant::now() < until, "two ready operator pods never came");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (leader, _) = lease_holder(c, r);
    let pod = c.json(&["get", "pod", "-n", &r.ns, &leader]);
    let (uid, ip) = (
        pod["metadata"]["uid"].as_str().unwrap().to_string(),
        pod["status"]["podIP"].as_str().unwrap().to_string(),
    );
    slow_lab(c, s, "cut-slow", 40);
    apply_labrun(c, s, ns, "cut-off", "cut-slow");
    let first = wait_labrun(r, ns, "cut-off", Duration::from_secs(120), |v| {
        v["status"]["phase"] == "Running" && v["status"]["runId"].is_string()
    });
    let first_run = first["status"]["runId"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(60);
    while pods_of_run(c, &first_run) < 2 {
        assert!(Instant::now() < until, "the first run's pods never came");
        std::thread::sleep(Duration::from_millis(300));
    }
    let cut = Blackhole::cut(&uid);
    let cut_at = Instant::now();
    // This host's clock is the API server's (the same machine): audit times compare to it.
    let cut_wall = String::from_utf8_lossy(
        &Command::new("date")
            .args(["-u", "+%Y-%m-%dT%H:%M:%S.%6NZ"])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();
    let until = cut_at + Duration::from_secs(45);
    let next = loop {
        let (h, _) = lease_holder(c, r);
        if !h.is_empty() && h != leader {
            break h;
        }
        assert!(
            Instant::now() < until,
            "no replica took the Lease from the cut-off leader {leader}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    eprintln!(
        "the Lease went from {leader} to {next} {:.1} s after the cut",
        cut_at.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(30).saturating_sub(cut_at.elapsed()));
    drop(cut);
    let done = wait_labrun(r, ns, "cut-off", Duration::from_secs(300), |v| {
        v["status"]["phase"] == "Succeeded"
    });
    assert_ne!(done["status"]["runId"].as_str(), Some(first_run.as_str()));
    // The former leader hears the API again: give it time to try anything it would.
    std::thread::sleep(Duration::from_secs(20));
    let events = audit_events();
    let took = events
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "leases"
                && e["verb"] == "update"
                && e["responseStatus"]["code"] == 200
                && e["requestReceivedTimestamp"]
                    .as_str()
                    .is_some_and(|t| t > cut_wall.as_str())
                && e["user"]["extra"]["authentication.kubernetes.io/pod-name"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|n| n == next.as_str()))
        })
        .filter_map(|e| e["requestReceivedTimestamp"].as_str())
        .min()
        .unwrap_or_else(|| panic!("the audit has no Lease update by {next}"))
        .to_string();
    let after: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "labruns"
                && e["objectRef"]["subresource"] == "status"
                && e["requestReceivedTimestamp"]
                    .as_str()
                    .is_some_and(|t| t > took.as_str())
                && asked_by(e, &leader, &ip)
        })
        .collect();
    assert!(
        after.is_empty(),
        "the former leader {leader} wrote LabRun statuses after {next} took the Lease at \
         {took}: {after:?}"
    );
    let mine = events
        .iter()
        .filter(|e| e["objectRef"]["subresource"] == "status" && asked_by(e, &next, ""))
        .count();
    assert!(
        mine > 0,
        "the audit shows no status write by {next}: it reads nothing"
    );
    ok(
        "delete a LabRun",
        c.kubectl(&["delete", "labrun", "cut-off", "-n", ns, "--wait=true"]),
    );
    ok(
        "delete the Lab cut-slow",
        c.kubectl(&["delete", "lab", "cut-slow", "--wait=true"]),
    );
    scale("1");
    one_ready_holder(c, r);
}

/// One ready operator pod, holding the Lease.
fn one_ready_holder(c: &Cluster, r: &Release) -> String {
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        let p = operator_pods(c, r);
        let (h, _) = lease_holder(c, r);
        if p.len() == 1 && p[0].1 && p[0].0 == h {
            return h;
        }
        assert!(
            Instant::now() < until,
            "one ready operator holding the Lease never came: {p:?}, held by {h:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The operator SIGKILLed (by its test hook, `IBLAB_OPERATOR_TEST_CRASH_AT`) at each point
/// from accepting a LabRun to its run's first objects: after deciding to start it, after
/// sweeping the namespace, after resolving its lab, after writing its run id, right after
/// starting the run, and while the run provisions. Each time the container's next
/// operator finishes the LabRun to its verdict, no attempt meets an object of an earlier
/// one (no 409), and nothing of the LabRun's runs is left.
fn the_operator_killed_before_its_runs_objects_leaves_nothing_on(
    c: &Cluster,
    r: &Release,
    s: &Scratch,
    ns: &str,
) {
    let deploy = format!("deployment/{}-operator", r.name);
    // A lab that ends soon after its pods run: what is tested is the operator's recovery.
    slow_lab(c, s, "crash-quick", 2);
    // The new pod is waited for until it runs and holds the Lease, not until it is ready
    // (its NetworkPolicy probe takes half a minute, and the LabRuns do not wait for it).
    let set_env = |env: &str| {
        let before: Vec<String> = operator_pods(c, r).into_iter().map(|(n, _)| n).collect();
        ok(
            "set the operator's test hook",
            c.kubectl(&["set", "env", &deploy, "-n", &r.ns, env]),
        );
        let until = Instant::now() + Duration::from_secs(180);
        loop {
            let pods = operator_pods(c, r);
            let (holder, _) = lease_holder(c, r);
            if pods.len() == 1 && !before.contains(&pods[0].0) && pods[0].0 == holder {
                return holder;
            }
            assert!(
                Instant::now() < until,
                "the operator's new pod never held the Lease: {pods:?}, held by {holder:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    for point in [
        "decided",
        "swept",
        "resolved",
        "written",
        "started",
        "provisioning",
    ] {
        let pod = set_env(&format!("IBLAB_OPERATOR_TEST_CRASH_AT={point}"));
        let name = format!("crash-{point}");
        apply_labrun(c, s, ns, &name, "crash-quick");
        let done = wait_labrun(r, ns, &name, Duration::from_secs(300), |v| {
            matches!(
                v["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed" | "Error")
            )
        });
        // It did die there, and came back in the same pod.
        let now = c.json(&["get", "pod", "-n", &r.ns, &pod]);
        assert!(
            now["status"]["containerStatuses"][0]["restartCount"]
                .as_i64()
                .unwrap_or(0)
                >= 1,
            "the operator did not die at {point}: {}",
            now["status"]
        );
        let before = c.kubectl(&["logs", "--previous", "-n", &r.ns, &pod]);
        assert!(
            String::from_utf8_lossy(&before.stdout).contains("killing myself here")
                && String::from_utf8_lossy(&before.stdout).contains(point),
            "the dead operator's log does not say it died at {point}: {}",
            tail(&before.stdout)
        );
        assert_eq!(
            done["status"]["phase"], "Succeeded",
            "killed at {point}: {}",
            done["status"]
        );
        let events = c.kubectl(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ]);
        let seen = format!(
            "{}{}",
            String::from_utf8_lossy(&events.stdout),
            done["status"]
        );
        for clash in ["AlreadyExists", "already exists", "409"] {
            assert!(
                !seen.contains(clash),
                "killed at {point}, then {clash}: {seen}"
            );
        }
        let uid = done["metadata"]["uid"].as_str().unwrap().to_string();
        let left = c.json(&[
            "get",
            "pods,configmaps,networkpolicies",
            "-n",
            ns,
            "-l",
            &format!("iblab.dev/owner=labrun-{uid}"),
        ]);
        assert_eq!(
            left["items"].as_array().map_or(0, Vec::len),
            0,
            "killed at {point}, the LabRun's runs left: {left}"
        );
        ok(
            "delete a LabRun",
            c.kubectl(&["delete", "labrun", &name, "-n", ns, "--wait=true"]),
        );
    }
    set_env("IBLAB_OPERATOR_TEST_CRASH_AT-");
    one_ready_holder(c, r);
    ok(
        "delete the Lab crash-quick",
        c.kubectl(&["delete", "lab", "crash-quick", "--wait=true"]),
    );
}

/// Namespaces a test made, by label, deleted whatever the outcome.
struct Cleanup {
    c: Cluster,
    selector: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.c.kubectl(&[
            "delete",
            "namespaces",
            "-l",
            &self.selector,
            "--wait=true",
            "--timeout=180s",
        ]);
    }
}

/// The chart's node prep on the real node: the privileged init container loads (or fails
/// to load, on this host's kernel) rdma_rxe and writes its report; what stays up prints it
/// and sits as an unprivileged user with no capability, so entering it is no root shell on
/// the node. Rendered with Helm, applied in a namespace of its own, removed whatever the
/// outcome.
fn node_prep_loads_as_root_then_sits_unprivileged() {
    let Some((_g, c)) = SUITE.ready("node prep") else {
        return;
    };
    let helm = match helm() {
        Ok(h) => h,
        Err(e) => return common::missing(&format!("node prep: helm: {e}")),
    };
    let ns = format!("iblab-e2e-prep-{}", std::process::id());
    struct Gone<'a>(&'a Cluster, &'a str);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let _ = self.0.kubectl(&[
                "delete",
                "namespace",
                self.1,
                "--wait=true",
                "--timeout=120s",
            ]);
        }
    }
    let s = Scratch::new("node-prep");
    let rendered = run(Command::new(&helm)
        .args(["template", "iblab-e2e-prep"])
        .arg(repo().join("charts/iblab"))
        .args(["-n", &ns, "--set", "nodePrep.enabled=true"])
        .args(["--set", "labImagePullPolicy=Never"])
        .args(["--show-only", "templates/node-prep.yaml"])
        .env("HELM_CACHE_HOME", s.dir.join("helm-cache"))
        .env("HELM_CONFIG_HOME", s.dir.join("helm-config"))
        .env("HELM_DATA_HOME", s.dir.join("helm-data")));
    let rendered = ok("helm template node-prep", rendered);
    let file = s.dir.join("node-prep.yaml");
    std::fs::write(&file, &rendered.stdout).unwrap();
    ok(
        "create the namespace",
        c.kubectl(&["create", "namespace", &ns]),
    );
    let _gone = Gone(&c, &ns);
    ok(
        "label it privileged (node prep's init container is)",
        c.kubectl(&[
            "label",
            "namespace",
            &ns,
            "pod-security.kubernetes.io/enforce=privileged",
        ]),
    );
    ok(
        "apply node prep",
        c.kubectl(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]),
    );
    let ds = "ds/iblab-e2e-prep-node-prep";
    let rolled = c.kubectl(&["rollout", "status", "-n", &ns, ds, "--timeout=120s"]);
    let pods = c.json(&["get", "pods", "-n", &ns]);
    assert!(rolled.status.success(), "{}\n{pods}", said(&rolled));
    let pod = &pods["items"][0];
    let init = &pod["spec"]["initContainers"][0];
    let main = &pod["spec"]["containers"][0];
    assert_eq!(init["securityContext"]["privileged"], true, "{pod}");
    assert_eq!(main["securityContext"]["privileged"], false, "{pod}");
    assert_eq!(
        pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"], 0,
        "{pod}"
    );
    // The report, from the container that stays up.
    let logs = ok(
        "node prep's log",
        c.kubectl(&["logs", "-n", &ns, ds, "-c", "node-prep"]),
    );
    let report = String::from_utf8_lossy(&logs.stdout).into_owned();
    assert!(
        report.contains("iblab-node-prep: node=") && report.contains(" rdma_rxe="),
        "{report}"
    );
    // Entering it: not root, no capability, nothing writable but nothing at all.
    let who = ok(
        "exec into node prep",
        c.kubectl(&[
            "exec",
            "-n",
            &ns,
            ds,
            "-c",
            "node-prep",
            "--",
            "sh",
            "-c",
            "id -u; grep -E '^Cap(Eff|Prm):' /proc/self/status; touch /x 2>&1 || true",
        ]),
    );
    let who = String::from_utf8_lossy(&who.stdout).into_owned();
    assert!(who.starts_with("65534\n"), "{who}");
    assert!(who.contains("CapEff:\t0000000000000000"), "{who}");
    assert!(who.contains("CapPrm:\t0000000000000000"), "{who}");
    assert!(
        who.contains("Read-only file system") || who.contains("Permission denied"),
        "{who}"
    );
}

/// The chart's ValidatingAdmissionPolicy: where the operator may create pods (a class's
/// namespace), the API server admits a pod of the lab pods' shape and refuses every way
/// out of it, each with the policy's reason (server-side dry runs as the operator's
/// ServiceAccount: nothing is created). The class's real runs, admitted under the same
/// policy, are the other half.
fn operator_pods_are_only_lab_pods(c: &Cluster, r: &Release, sa: &str, ns: &str, s: &Scratch) {
    let deploy = c.json(&[
        "get",
        "deployment",
        "-n",
        &r.ns,
        &format!("{}-operator", r.name),
    ]);
    let lab_image = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "IBLAB_IMAGE")
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("no IBLAB_IMAGE in {deploy}"))
        .to_string();
    let good = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "policy-probe",
            "labels": {"iblab.dev/run": "probe", "app.kubernetes.io/managed-by": "iblab"}
        },
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "node",
                "image": lab_image,
                "command": ["sleep", "infinity"],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                              "limits": {"cpu": "100m", "memory": "32Mi"}},
                "securityContext": {
                    "privileged": false,
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}
                }
            }],
            "volumes": [{"name": "tmp", "emptyDir": {}}]
        }
    });
    let try_as_operator = |what: &str, pod: &Value| -> Output {
        let f = s.out().join(format!("policy-{what}.json"));
        std::fs::write(&f, pod.to_string()).unwrap();
        c.kubectl(&[
            "create",
            "--dry-run=server",
            "--as",
            sa,
            "-n",
            ns,
            "-f",
            f.to_str().unwrap(),
        ])
    };
    let admitted = try_as_operator("good", &good);
    assert!(
        admitted.status.success(),
        "a lab-shaped pod is admitted: {}",
        said(&admitted)
    );
    let c0 = "/spec/containers/0";
    // What is changed in the probe pod (JSON pointer, value), and the policy's reason.
    type Changes = Vec<(String, Value)>;
    let bad: Vec<(&str, Changes, &str)> = vec![
        (
            "privileged",
            vec![
                (format!("{c0}/securityContext/privileged"), true.into()),
                // (the API refuses privileged with no escalation before any policy)
                (
                    format!("{c0}/securityContext/allowPrivilegeEscalation"),
                    true.into(),
                ),
            ],
            "unprivileged",
        ),
        (
            "sys-admin",
            vec![(
                format!("{c0}/securityContext/capabilities/add"),
                serde_json::json!(["SYS_ADMIN"]),
            )],
            "IPC_LOCK added",
        ),
        (
            "host-path",
            vec![(
                "/spec/volumes".into(),
                serde_json::json!([{"name": "root", "hostPath": {"path": "/"}}]),
            )],
            "emptyDir volumes only",
        ),
        (
            "host-pid",
            vec![("/spec/hostPID".into(), true.into())],
            "no namespace with the node",
        ),
        (
            "token",
            vec![("/spec/automountServiceAccountToken".into(), true.into())],
            // (the token's projected volume, or the flag itself)
            "token",
        ),
        (
            "image",
            vec![(format!("{c0}/image"), "busybox:latest".into())],
            "runs only the lab image",
        ),
        (
            "writable-root",
            vec![(
                format!("{c0}/securityContext/readOnlyRootFilesystem"),
                false.into(),
            )],
            "read-only",
        ),
        (
            "unlabelled",
            vec![("/metadata/labels".into(), serde_json::json!({}))],
            "iblab.dev/run",
        ),
    ];
    for (what, changes, reason) in bad {
        let mut pod = good.clone();
        for (ptr, v) in changes {
            let (parent, key) = ptr.rsplit_once('/').unwrap();
            pod.pointer_mut(parent)
                .and_then(Value::as_object_mut)
                .unwrap_or_else(|| panic!("{parent} in the probe pod"))
                .insert(key.to_string(), v);
        }
        let o = try_as_operator(what, &pod);
        assert!(!o.status.success(), "{what}: admitted: {}", said(&o));
        let why = String::from_utf8_lossy(&o.stderr);
        assert!(
            why.contains("ValidatingAdmissionPolicy") && why.contains(reason),
            "{what}: refused, but not by the policy's rule ({reason}): {why}"
        );
    }
}

/// Two owners' command-line runs (each with a state folder and `IBLAB_OWNER` of its own,
/// as two users' machines) and one LabRun of the operator, side by side on the cluster:
/// `down --all` of the first owner stops and removes that owner's run only; the other
/// owner's run and the LabRun go on to their verdicts.
fn one_owners_down_all_leaves_the_others_on(c: &Cluster, r: &Release, ns: &str) {
    // operator-slow with a longer wait (and a name of its own), so that all three are
    // still running when the first owner's `down --all` is done.
    let scratch = Scratch::new("owners-labrun");
    let lab = slow_lab(c, &scratch, "owners-slow", 40);
    let start = |who: &str| {
        let s = Scratch::new(&format!("owner-{who}"));
        let child = iblab_cmd(&s, c, &["up", lab.to_str().unwrap(), "--backend", "kube"])
            .arg("--out")
            .arg(s.out())
            .env("IBLAB_OWNER", format!("e2e-owner-{who}"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("iblab runs");
        (s, child)
    };
    apply_labrun(c, &scratch, ns, "beside", "owners-slow");
    let (sa, child_a) = start("a");
    let (sb, child_b) = start("b");
    let until = Instant::now() + Duration::from_secs(120);
    let run_of = |s: &Scratch| s.runs().into_iter().next();
    let (run_a, run_b, run_lr) = loop {
        let lr =
            labrun(c, ns, "beside").and_then(|v| v["status"]["runId"].as_str().map(str::to_string));
        if let (Some(a), Some(b), Some(l)) = (run_of(&sa), run_of(&sb), lr)
            && [&a, &b, &l].iter().all(|r| pods_of_run(c, r) >= 2)
        {
            break (a, b, l);
        }
        assert!(
            Instant::now() < until,
            "the three runs' pods never all came: {}",
            r.operator_log()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let down = run(iblab_cmd(&sa, c, &["down", "--all"]).env("IBLAB_OWNER", "e2e-owner-a"));
    assert_eq!(down.status.code(), Some(0), "{}", said(&down));
    assert!(
        String::from_utf8_lossy(&down.stdout).contains(&run_a),
        "down --all names the run it removed: {}",
        said(&down)
    );
    // At once: the others' pods are all still there, and owner a's are gone.
    assert_eq!(pods_of_run(c, &run_a), 0, "owner a's run was not removed");
    assert!(
        pods_of_run(c, &run_b) >= 2,
        "owner a's down --all took owner b's pods"
    );
    assert!(
        pods_of_run(c, &run_lr) >= 2,
        "owner a's down --all took the LabRun's pods"
    );
    // The LabRun's run is owned by the LabRun (its uid), which no sweep from the command
    // line takes, not even every owner's.
    let uid = labrun(c, ns, "beside").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let lr_pods = c.json(&[
        "get",
        "pods",
        "-A",
        "-l",
        &format!("iblab.dev/run={run_lr}"),
    ]);
    for p in lr_pods["items"].as_array().unwrap() {
        assert_eq!(
            p["metadata"]["labels"]["iblab.dev/owner"].as_str(),
            Some(format!("labrun-{uid}").as_str()),
            "{}",
            p["metadata"]["labels"]
        );
    }
    let a = child_a.wait_with_output().unwrap();
    assert_ne!(a.status.code(), Some(0), "owner a's run was stopped");
    let b = child_b.wait_with_output().unwrap();
    assert_eq!(b.status.code(), Some(0), "owner b's run: {}", said(&b));
    let b_took = sb.evidence()["duration_s"].as_f64().unwrap_or_default();
    assert!(b_took > 40.0, "owner b's run went to its end ({b_took} s)");
    let done = wait_labrun(r, ns, "beside", Duration::from_secs(180), |v| {
        v["status"]["phase"] == "Succeeded" || v["status"]["phase"] == "Failed"
    });
    assert_eq!(done["status"]["phase"], "Succeeded", "{done}");
    // One attempt: the other owner's `down --all` left its run alone (a retry would hide
    // that it did not; the operator's log says why an attempt ended).
    assert_eq!(
        done["status"]["runId"].as_str(),
        Some(run_lr.as_str()),
        "{done}\n{}",
        r.operator_log()
    );
    assert!(
        done["status"]["measuredWhere"]
            .as_str()
            .is_some_and(|m| m.contains(ns)),
        "{done}"
    );
    ok(
        "delete the LabRun beside",
        c.kubectl(&["delete", "labrun", "beside", "-n", ns, "--wait=true"]),
    );
    ok(
        "delete the Lab owners-slow",
        c.kubectl(&["delete", "lab", "owners-slow", "--wait=true"]),
    );
    for run in [&run_a, &run_b, &run_lr] {
        c.assert_nothing_left(run);
    }
}

/// tests/labs/operator-slow.yaml as a lab file named `name` whose wait step sleeps
/// `seconds`, applied as a Lab object too; its file.
fn slow_lab(c: &Cluster, s: &Scratch, name: &str, seconds: u32) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("tests/labs/operator-slow.yaml")).unwrap();
    let text = text
        .replace("name: operator-slow,", &format!("name: {name},"))
        .replace("seconds: 12", &format!("seconds: {seconds}"));
    assert!(
        text.contains(&format!("name: {name},")) && text.contains(&format!("seconds: {seconds}"))
    );
    std::fs::create_dir_all(s.out()).unwrap();
    let lab = s.out().join(format!("{name}.yaml"));
    std::fs::write(&lab, text).unwrap();
    let obj = ok(
        "iblab crd --lab",
        iblab(s, c, &["crd", "--lab", lab.to_str().unwrap()]),
    );
    let obj_file = s.out().join(format!("{name}-object.yaml"));
    std::fs::write(&obj_file, &obj.stdout).unwrap();
    ok(
        "apply the Lab",
        c.kubectl(&["apply", "-f", obj_file.to_str().unwrap()]),
    );
    lab
}

/// The long-stream lab (tests/labs/operator-server.yaml) as a Lab object named `name`,
/// its stream `seconds` long.
fn server_lab(c: &Cluster, s: &Scratch, name: &str, seconds: u32) {
    let text = std::fs::read_to_string(repo().join("tests/labs/operator-server.yaml")).unwrap();
    let text = text
        .replace("name: operator-server,", &format!("name: {name},"))
        .replace("seconds: 70", &format!("seconds: {seconds}"));
    assert!(
        text.contains(&format!("name: {name},")) && text.contains(&format!("seconds: {seconds}"))
    );
    std::fs::create_dir_all(s.out()).unwrap();
    let lab = s.out().join(format!("{name}.yaml"));
    std::fs::write(&lab, text).unwrap();
    let obj = ok(
        "iblab crd --lab",
        iblab(s, c, &["crd", "--lab", lab.to_str().unwrap()]),
    );
    let obj_file = s.out().join(format!("{name}-object.yaml"));
    std::fs::write(&obj_file, &obj.stdout).unwrap();
    ok(
        "apply the Lab",
        c.kubectl(&["apply", "-f", obj_file.to_str().unwrap()]),
    );
}

/// The bytes under a folder of this host (the node's view of a pod's emptyDir).
fn bytes_under(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// A student who enters their own lab pod writes into the output of the server a step
/// runs there in the background (iperf3 -s, through `/proc/PID/fd/1`) for 60 s: 30 s of
/// lines, then 30 s without a line break. iblab keeps 8 MiB of that stream and drops the
/// rest, counted; their run fails saying so; a classmate's run beside it passes; the
/// operator is neither restarted nor evicted, and its memory and work folder stay bounded
/// (both measured from the node and printed).
fn a_flooded_background_server_fails_only_its_run_on(
    c: &Cluster,
    r: &Release,
    labs_ns: &str,
    student_ns: &str,
) {
    let scratch = Scratch::new("flood-server");
    server_lab(c, &scratch, "flood-server", 70);
    let watch = OperatorWatch::start(c, r);
    let (holder, uid) = (watch.holder.clone(), watch.uid.clone());
    let work = PathBuf::from(format!(
        "/var/lib/iblab/kube-run/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/work"
    ));
    assert!(
        work.is_dir(),
        "the operator's work folder {} is not there",
        work.display()
    );
    apply_labrun(c, &scratch, student_ns, "flooded-server", "flood-server");
    apply_labrun(c, &scratch, labs_ns, "classmate-server", "flood-server");
    for (ns, name) in [
        (student_ns, "flooded-server"),
        (labs_ns, "classmate-server"),
    ] {
        wait_running_pods(c, r, ns, name, 2);
    }
    // The work folder's size, sampled from the node while the flood runs.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, work) = (stop.clone(), work.clone());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(bytes_under(&work));
                std::thread::sleep(Duration::from_millis(500));
            }
            peak
        })
    };
    // As the student: find the iperf3 server in node b and write into its output.
    let script = "for i in $(seq 120); do for p in /proc/[0-9]*; do \
        case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in 'iperf3 -s '*) \
        timeout 30 yes 'a line of flood' > $p/fd/1; \
        timeout 30 sh -c \"tr '\\0' x < /dev/zero\" > $p/fd/1; \
        echo flooded ${p#/proc/}; exit 0;; esac; done; sleep 0.5; done; \
        echo 'no iperf3 server in node b'; exit 1";
    flood_in_b(c, student_ns, script);
    let flooded = wait_labrun(
        r,
        student_ns,
        "flooded-server",
        Duration::from_secs(240),
        finished,
    );
    let classmate = wait_labrun(
        r,
        labs_ns,
        "classmate-server",
        Duration::from_secs(240),
        finished,
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let work_peak = sampler.join().unwrap();
    let peak = watch.peak();
    eprintln!(
        "operator pod {holder}: peak memory {} MiB, work folder peak {} MiB, during 60 s of \
         flood into a background server",
        peak >> 20,
        work_peak >> 20
    );
    assert_eq!(flooded["status"]["phase"], "Failed", "{flooded}");
    let cm = c.json(&[
        "get",
        "configmap",
        "-n",
        student_ns,
        "flooded-server-evidence",
    ]);
    let ev: Value =
        serde_json::from_str(cm["data"]["evidence.json"].as_str().unwrap_or("{}")).unwrap();
    let stream = common::step(&ev, "stream");
    assert_eq!(stream["verdict"], "fail", "{stream}");
    let reason = stream["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("output past the cap")
            && reason.contains("iperf3 -s")
            && reason.contains("lines a stream"),
        "{stream}"
    );
    assert!(
        stream["detail"]["output_cuts"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "{stream}"
    );
    assert_eq!(classmate["status"]["phase"], "Succeeded", "{classmate}");
    watch.assert_stayed_up(c, r);
    // Bounded by construction: two runs' logs are within two runs' allowance (64 MiB
    // each), whatever was written; memory far below the container's 512 Mi.
    assert!(
        work_peak < 2 * (64 << 20) + (16 << 20),
        "the operator's work folder reached {} MiB",
        work_peak >> 20
    );
    assert!(
        peak < 384 << 20,
        "the operator's pod peaked at {} MiB during the flood",
        peak >> 20
    );
    for (ns, name) in [
        (student_ns, "flooded-server"),
        (labs_ns, "classmate-server"),
    ] {
        ok(
            "delete a LabRun",
            c.kubectl(&["delete", "labrun", name, "-n", ns, "--wait=true"]),
        );
    }
    ok(
        "delete the Lab flood-server",
        c.kubectl(&["delete", "lab", "flood-server", "--wait=true"]),
    );
}

/// The operator's pod that holds the Lease, watched through a test: its memory peak
/// (reset at the start) and whether it is still the same pod, never restarted.
struct OperatorWatch {
    holder: String,
    uid: String,
    restarts: Value,
    cg: PathBuf,
}

impl OperatorWatch {
    fn start(c: &Cluster, r: &Release) -> OperatorWatch {
        let holder = lease_holder(c, r).0;
        let pod = c.json(&["get", "pod", "-n", &r.ns, &holder]);
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let restarts = pod["status"]["containerStatuses"][0]["restartCount"].clone();
        let cg = pod_memory_cgroup(&uid)
            .unwrap_or_else(|| panic!("no memory cgroup for the operator's pod {holder} ({uid})"));
        // Its peak from now on (cgroup v1 resets it on a write; v2's memory.peak does too).
        for f in ["memory.max_usage_in_bytes", "memory.peak"] {
            let _ = std::fs::write(cg.join(f), "0");
        }
        OperatorWatch {
            holder,
            uid,
            restarts,
            cg,
        }
    }

    fn peak(&self) -> u64 {
        memory_peak(&self.cg).unwrap_or(u64::MAX)
    }

    fn assert_stayed_up(&self, c: &Cluster, r: &Release) {
        let after = c.json(&["get", "pod", "-n", &r.ns, &self.holder]);
        assert_eq!(
            after["metadata"]["uid"].as_str(),
            Some(self.uid.as_str()),
            "the operator's pod was replaced"
        );
        assert_eq!(
            after["status"]["containerStatuses"][0]["restartCount"], self.restarts,
            "the operator was restarted"
        );
    }
}

/// Run `script` in the measuring container of pod b of `student_ns`, where a class's
/// students may not go (their `exec` there is refused, which is checked first): as whoever
/// may (a cluster admin; or a lab's own step, whose output is the same stream). It must say
/// "flooded".
fn flood_in_b(c: &Cluster, student_ns: &str, script: &str) {
    let student = student_ns.rsplit('-').next().unwrap();
    let refused = c.kubectl(&[
        "exec", "--as", student, "-n", student_ns, "b", "-c", "node", "--", "true",
    ]);
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("shell container only"),
        "the student entered the measuring container: {}",
        said(&refused)
    );
    let flood = c.kubectl(&[
        "exec", "-n", student_ns, "b", "-c", "node", "--", "sh", "-c", script,
    ]);
    assert!(
        flood.status.success() && String::from_utf8_lossy(&flood.stdout).contains("flooded"),
        "the flood: {}",
        said(&flood)
    );
}

/// A student enters their running lab pod as the class lets them (`kubectl exec` with
/// their own name): they land in its shell, user nobody with no capability, and see
/// none of the tools iblab runs; the measuring container is refused to them; they try to
/// overwrite the tool binaries, write a perftest-shaped JSON where iblab's would be, and
/// append to every file they can write. Their run passes with a figure of its own, the
/// measuring container's /tmp never saw their file, and the status says what they could
/// still have moved (traffic on the lab's links) and what not.
fn a_student_in_their_pod_cannot_touch_a_figure_on(c: &Cluster, r: &Release, student_ns: &str) {
    let scratch = Scratch::new("forge");
    server_lab(c, &scratch, "forge-server", 25);
    apply_labrun(c, &scratch, student_ns, "forged", "forge-server");
    wait_running_pods(c, r, student_ns, "forged", 2);
    let student = student_ns.rsplit('-').next().unwrap();
    let refused = c.kubectl(&[
        "exec",
        "--as",
        student,
        "-n",
        student_ns,
        "b",
        "-c",
        "node",
        "--",
        "cat",
        "/proc/1/cmdline",
    ]);
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("shell container only"),
        "{}",
        said(&refused)
    );
    let script = r#"
        echo "uid=$(id -u)"
        grep '^CapEff:' /proc/self/status
        for p in /proc/[0-9]*; do
            exe=$(tr '\0' '\n' < "$p/cmdline" 2>/dev/null | head -n 1)
            case "${exe##*/}" in iperf3|timeout|iblab|ib_*|perftest*) echo "SEEN $p $exe";; esac
        done
        for f in /usr/bin/iperf3 /usr/bin/ib_write_bw /usr/bin/timeout /usr/bin/perl /bin/sh; do
            if (: > "$f") 2>/dev/null; then echo "WROTE $f"; fi
        done
        echo '{"results":{"BW_average":999999,"MsgRate":999999}}' > /tmp/iblab-stream.json             && echo "WROTE /tmp/iblab-stream.json"
        find / \( -path /proc -o -path /sys \) -prune -o -type f -writable -print 2>/dev/null |
            while read -r f; do
                case "$f" in /tmp/iblab-stream.json) continue;; esac
                (printf '999999' >> "$f") 2>/dev/null && echo "WROTE $f"
            done
        echo entered
    "#;
    let inside = c.kubectl(&[
        "exec", "--as", student, "-n", student_ns, "b", "--", "sh", "-c", script,
    ]);
    let out = String::from_utf8_lossy(&inside.stdout).into_owned();
    assert!(
        inside.status.success() && out.contains("entered"),
        "{}",
        said(&inside)
    );
    assert!(out.contains("uid=65534"), "{out}");
    assert!(
        out.contains("CapEff:\t0000000000000000"),
        "the shell has a capability: {out}"
    );
    assert!(
        !out.contains("SEEN"),
        "the shell sees a tool iblab runs: {out}"
    );
    let wrote: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("WROTE "))
        .collect();
    assert!(
        wrote.contains(&"/tmp/iblab-stream.json"),
        "the shell's own /tmp is writable: {out}"
    );
    assert!(
        wrote
            .iter()
            .all(|f| f.starts_with("/tmp/") || *f == "/dev/termination-log"),
        "the student wrote outside their own /tmp: {wrote:?}"
    );
    // The measuring container never saw it (as an admin may look).
    let theirs = ok(
        "look at the measuring container's /tmp",
        c.kubectl(&[
            "exec",
            "-n",
            student_ns,
            "b",
            "-c",
            "node",
            "--",
            "sh",
            "-c",
            "cat /tmp/iblab-stream.json 2>/dev/null || echo absent",
        ]),
    );
    assert!(
        !String::from_utf8_lossy(&theirs.stdout).contains("999999"),
        "{}",
        said(&theirs)
    );
    let done = wait_labrun(r, student_ns, "forged", Duration::from_secs(180), finished);
    assert_eq!(done["status"]["phase"], "Succeeded", "{done}");
    let cm = c.json(&["get", "configmap", "-n", student_ns, "forged-evidence"]);
    let ev: Value =
        serde_json::from_str(cm["data"]["evidence.json"].as_str().unwrap_or("{}")).unwrap();
    let stream = common::step(&ev, "stream");
    assert_eq!(stream["verdict"], "pass", "{stream}");
    let mbps = stream["metrics"]["throughput_mbps"]["value"]
        .as_f64()
        .unwrap_or(-1.0);
    assert!(mbps > 0.0 && mbps < 999_999.0, "{stream}");
    let said_where = done["status"]["measuredWhere"].as_str().unwrap_or_default();
    // (the LabRun names the student it is for: `e2e`, whose namespace this is)
    assert!(
        said_where.contains("may not enter (the class's admission policy)")
            && said_where.contains("send traffic over the lab's links"),
        "{done}"
    );
    assert!(
        ev["notes"].as_array().into_iter().flatten().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("who could move a figure"))),
        "the evidence does not say who could move a figure: {}",
        ev["notes"]
    );
    ok(
        "delete the LabRun forged",
        c.kubectl(&[
            "delete",
            "labrun",
            "forged",
            "-n",
            student_ns,
            "--wait=true",
        ]),
    );
    ok(
        "delete the Lab forge-server",
        c.kubectl(&["delete", "lab", "forge-server", "--wait=true"]),
    );
}

/// A LabRun that has ended, one way or another.
fn finished(v: &Value) -> bool {
    v["status"]["phase"] == "Succeeded"
        || v["status"]["phase"] == "Failed"
        || v["status"]["phase"] == "Error"
}

/// The memory cgroup (v1, or v2) of a pod on the test cluster's node, found by its uid.
fn pod_memory_cgroup(uid: &str) -> Option<PathBuf> {
    let want = format!("pod{uid}");
    for root in [
        "/sys/fs/cgroup/memory/iblab-kube",
        "/sys/fs/cgroup/iblab-kube",
    ] {
        let mut stack = vec![PathBuf::from(root)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if !p.is_dir() {
                    continue;
                }
                if e.file_name().to_string_lossy() == want {
                    return Some(p);
                }
                stack.push(p);
            }
        }
    }
    None
}

/// The peak memory of a cgroup since it was last reset, in bytes.
fn memory_peak(cg: &std::path::Path) -> Option<u64> {
    ["memory.max_usage_in_bytes", "memory.peak"]
        .iter()
        .find_map(|f| std::fs::read_to_string(cg.join(f)).ok())
        .and_then(|t| t.trim().parse().ok())
}

/// A student who enters their own lab pod floods the output of the step running there
/// (100 MB written into its stdout, from `/proc/PID/fd/1`: the tools themselves cannot be
/// replaced, the root is read-only). Their run fails with the reason; the operator, which
/// reads that stream through its child, stays up (its pod's peak memory is measured
/// during the test) and runs a classmate's run beside it to its verdict.
fn a_students_flood_fails_their_run_and_the_operator_stays_up_on(
    c: &Cluster,
    r: &Release,
    labs_ns: &str,
    student_ns: &str,
) {
    let scratch = Scratch::new("flood");
    slow_lab(c, &scratch, "flood-slow", 40);
    let watch = OperatorWatch::start(c, r);
    let holder = watch.holder.clone();
    apply_labrun(c, &scratch, student_ns, "flooded", "flood-slow");
    apply_labrun(c, &scratch, labs_ns, "classmate", "flood-slow");
    for (ns, name) in [(student_ns, "flooded"), (labs_ns, "classmate")] {
        wait_running_pods(c, r, ns, name, 2);
    }
    // As the student (impersonated): find the step's `sleep 40` in node b and write into
    // its output stream.
    let script = "for i in $(seq 60); do for p in /proc/[0-9]*; do \
        if [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = 'sleep 40 ' ]; then \
        head -c 100000000 /dev/zero > $p/fd/1 && echo flooded ${p#/proc/}; exit $?; fi; done; \
        sleep 0.5; done; echo 'no sleep 40 in node b'; exit 1";
    flood_in_b(c, student_ns, script);
    let flooded = wait_labrun(r, student_ns, "flooded", Duration::from_secs(180), finished);
    let classmate = wait_labrun(r, labs_ns, "classmate", Duration::from_secs(180), finished);
    let peak = watch.peak();
    eprintln!(
        "operator pod {holder}: peak memory {} MiB during the flood test",
        peak >> 20
    );
    assert_eq!(flooded["status"]["phase"], "Failed", "{flooded}");
    let cm = c.json(&["get", "configmap", "-n", student_ns, "flooded-evidence"]);
    let ev: Value =
        serde_json::from_str(cm["data"]["evidence.json"].as_str().unwrap_or("{}")).unwrap();
    let wait = common::step(&ev, "wait");
    assert_eq!(wait["verdict"], "fail", "{wait}");
    assert!(
        wait["reason"]
            .as_str()
            .is_some_and(|t| t.contains("MiB iblab keeps") && t.contains("node b")),
        "{wait}"
    );
    assert!(
        wait["detail"]["output_cut_bytes"].as_u64().unwrap_or(0) > 80_000_000,
        "{wait}"
    );
    assert_eq!(classmate["status"]["phase"], "Succeeded", "{classmate}");
    // The operator stayed up: the same pod, not restarted, far below its 512Mi limit.
    watch.assert_stayed_up(c, r);
    assert!(
        peak < 384 << 20,
        "the operator's pod peaked at {} MiB during a flood of 100 MB",
        peak >> 20
    );
    for (ns, name) in [(student_ns, "flooded"), (labs_ns, "classmate")] {
        ok(
            "delete a LabRun",
            c.kubectl(&["delete", "labrun", name, "-n", ns, "--wait=true"]),
        );
    }
    ok(
        "delete the Lab flood-slow",
        c.kubectl(&["delete", "lab", "flood-slow", "--wait=true"]),
    );
}
