//! End to end on the local backend (needs root): real namespaces, veth, bridges, iperf3,
//! loss faults; then nothing of the run may be left. Runs one at a time.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");
static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> bool {
    if nix_euid() == 0 {
        return true;
    }
    eprintln!("SKIPPED: the local backend needs root (run the tests as root, as CI does)");
    false
}

fn nix_euid() -> u32 {
    // /proc/self/status: "Uid: real effective saved fs"
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2))
                .and_then(|u| u.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("iblab-e2e-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }
    fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    fn out(&self) -> PathBuf {
        self.dir.join("run")
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .arg("--color")
            .arg("never")
            .env("IBLAB_STATE_DIR", self.state());
        c
    }
    fn up(&self, args: &[&str]) -> Output {
        let mut all = vec!["up"];
        all.extend_from_slice(args);
        let mut c = self.cmd(&all);
        c.arg("--out").arg(self.out());
        c.output().unwrap()
    }
    fn evidence(&self) -> Value {
        let text = std::fs::read_to_string(self.out().join("evidence.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Whatever happened, leave nothing: the same command a user would run.
        let _ = Command::new(BIN)
            .args(["down", "--all"])
            .env("IBLAB_STATE_DIR", self.state())
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn namespaces_of(run_id: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.contains(run_id))
                .collect()
        })
        .unwrap_or_default()
}

/// Live (non-zombie) processes with this name.
fn processes_named(name: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == name)
                .unwrap_or(false)
        })
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .map(|x| x.1.trim_start().chars().next())
                .unwrap_or(None);
            !matches!(state, Some('Z') | Some('X') | None)
        })
        .collect()
}

/// Killed processes take a moment to go; wait a little before calling them left over.
fn processes_left(name: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let p = processes_named(name);
        if p.is_empty() || Instant::now() > deadline {
            return p;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn assert_nothing_left(s: &Scratch, run_id: &str) {
    assert!(!run_id.is_empty());
    assert_eq!(
        namespaces_of(run_id),
        Vec::<String>::new(),
        "namespaces of run {run_id} left behind"
    );
    assert_eq!(
        processes_left("iperf3"),
        Vec::<u32>::new(),
        "iperf3 left running"
    );
    let states: Vec<_> = std::fs::read_dir(s.state())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(states.is_empty(), "state files left: {states:?}");
}

fn metric(e: &Value, step: &str, path: &str, name: &str) -> f64 {
    e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == step && (path.is_empty() || s["path"] == path))
        .and_then(|s| s["metrics"][name]["value"].as_f64())
        .unwrap_or_else(|| panic!("no metric {name} on step {step} {path}"))
}

fn step<'a>(e: &'a Value, id: &str) -> &'a Value {
    e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap()
}

#[test]
fn tcp_loss_lab_measures_loss_and_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root() {
        return;
    }
    let s = Scratch::new("tcp-loss");
    let out = s.up(&["tcp-loss", "--paths", "tcp"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = s.evidence();
    assert_eq!(e["verdict"], "pass");
    assert_eq!(e["backend"], "local");
    let clean = metric(&e, "clean", "tcp", "throughput_mbps");
    let lossy = metric(&e, "lossy", "tcp", "throughput_mbps");
    assert!(clean > 0.0 && lossy > 0.0, "clean {clean} lossy {lossy}");
    assert!(
        lossy < clean,
        "loss did not cost throughput: clean {clean} lossy {lossy}"
    );
    assert!(metric(&e, "loss_off", "", "dropped_packets") > 0.0);
    assert_eq!(step(&e, "clean")["provenance"]["kind"], "soft");
    let verdicts: Vec<(&str, &str)> = e["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["id"].as_str().unwrap(), x["verdict"].as_str().unwrap()))
        .collect();
    assert_eq!(
        verdicts,
        vec![
            ("loss_costs_throughput", "pass"),
            ("frames_were_dropped", "pass"),
            ("tcp_degrades_gracefully", "pass"),
            ("heavy_loss_hurts_tcp_too", "skipped")
        ]
    );
    let junit = std::fs::read_to_string(s.out().join("junit.xml")).unwrap();
    assert_eq!(
        junit.matches("<testcase").count(),
        4 + e["steps"].as_array().unwrap().len()
    );
    assert!(s.out().join("report.html").exists());
    assert!(s.out().join("logs/clean.tcp.iperf3-client.log").exists());
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

#[test]
fn heavy_loss_scenario_hurts_tcp() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root() {
        return;
    }
    let s = Scratch::new("heavy");
    let out = s.up(&["tcp-loss", "--scenario", "heavy-loss", "--yes"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let e = s.evidence();
    assert_eq!(e["scenario"], "heavy-loss");
    assert_eq!(e["params"]["loss"], 5);
    let heavy = e["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == "heavy_loss_hurts_tcp_too")
        .unwrap();
    assert_eq!(heavy["verdict"], "pass");
    assert!(
        heavy["observed"]["steps.lossy.tcp.throughput_mbps"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{heavy}"
    );
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

#[test]
fn failures_give_exit_1_and_finally_still_runs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root() {
        return;
    }
    let s = Scratch::new("failing");
    let out = s.up(&["tests/labs/failing.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let e = s.evidence();
    assert_eq!(e["verdict"], "fail");
    assert_eq!(step(&e, "says_no")["verdict"], "fail");
    assert_eq!(step(&e, "never")["verdict"], "skipped");
    assert_eq!(step(&e, "cleanup")["verdict"], "pass");
    let x = &e["expectations"][0];
    assert_eq!(x["verdict"], "fail");
    assert_eq!(x["observed"]["steps.cleanup.exit_code"], 0);
    assert!(x["explanation"].as_str().unwrap().contains("exited 0"));
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

#[test]
fn left_out_paths_skip_their_expectations() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root() {
        return;
    }
    let s = Scratch::new("paths");
    // Without --paths the ib path cannot be provided here: an environment error, not a pass.
    let plan = s
        .cmd(&["plan", "tests/labs/paths-subset.yaml"])
        .output()
        .unwrap();
    assert_eq!(
        plan.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    assert!(String::from_utf8_lossy(&plan.stderr).contains("--paths tcp"));
    let out = s.up(&["tests/labs/paths-subset.yaml", "--paths", "tcp"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let e = s.evidence();
    let ib = e["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == "ib_side")
        .unwrap();
    assert_eq!(ib["verdict"], "skipped");
    assert!(
        ib["explanation"].as_str().unwrap().contains("--paths"),
        "{ib}"
    );
    assert_eq!(e["excluded_paths"]["ib"], "left out with --paths");
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

/// Start a long run and wait until its traffic step is under way (the server is recorded).
// The child is returned to the caller, which waits for it.
#[allow(clippy::zombie_processes)]
fn start_long(s: &Scratch) -> (Child, String) {
    let mut c = s.cmd(&["up", "tests/labs/long-transfer.yaml"]);
    c.arg("--out")
        .arg(s.out())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run never reached its traffic step");
        }
        if let Some(state) = read_state(&s.state()) {
            let has_process = state["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["kind"] == "process");
            if has_process {
                std::thread::sleep(Duration::from_millis(1500));
                return (child, state["run_id"].as_str().unwrap().to_string());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn read_state(dir: &Path) -> Option<Value> {
    let f = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))?;
    serde_json::from_str(&std::fs::read_to_string(f).ok()?).ok()
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("iblab did not exit within {limit:?}");
}

#[test]
fn interrupt_mid_step_tears_down_and_exits_130() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root() {
        return;
    }
    let s = Scratch::new("interrupt");
    let (mut child, run_id) = start_long(&s);
    assert!(
        !namespaces_of(&run_id).is_empty(),
        "the lab was not up when interrupted"
    );
    assert!(!processes_named("iperf3").is_empty());
    let t = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(wait_exit(&mut child, Duration::from_secs(20)), Some(130));
    eprintln!("interrupt to exit: {:?}", t.elapsed());
    let e = s.evidence();
    assert_eq!(e["verdict"], "interrupted");
    assert_nothing_left(&s, &run_id);
}

#[test]
fn down_all_cleans_up_after_a_crash() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root() {
        return;
    }
    let s = Scratch::new("crash");
    let (mut child, run_id) = start_long(&s);
    // A crash: no chance to tear down.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !namespaces_of(&run_id).is_empty(),
        "nothing was left to clean, the test proves nothing"
    );
    let status = s.cmd(&["status"]).output().unwrap();
    assert!(String::from_utf8_lossy(&status.stdout).contains(&run_id));
    let down = s.cmd(&["down", "--all"]).output().unwrap();
    assert_eq!(
        down.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(String::from_utf8_lossy(&down.stdout).contains(&run_id));
    assert_nothing_left(&s, &run_id);
}
