//! Helpers the end-to-end tests share: a scratch folder per test with its own state
//! directory, the `iblab` binary, and checks that nothing of a run is left.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod chart;
pub mod cluster;
pub mod graphs;
pub mod lessons;
pub mod rng;

pub const BIN: &str = env!("CARGO_BIN_EXE_iblab");
pub static SERIAL: Mutex<()> = Mutex::new(());

/// The opening of an end-to-end test: one test of the suite at a time (`SERIAL`, held by the
/// guard until the test ends), then its prerequisites, which `ready` checks and gives. `None`
/// when one is missing (`ready` said which through `missing`: `SKIPPED` here, a failure in
/// CI), and the test returns.
pub fn serial<T>(ready: impl FnOnce() -> Option<T>) -> Option<(MutexGuard<'static, ()>, T)> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    ready().map(|t| (guard, t))
}

/// `serial` for prerequisites that give nothing: `let Some(_g) = begin(root) else { return };`.
pub fn begin(ready: impl FnOnce() -> bool) -> Option<MutexGuard<'static, ()>> {
    serial(|| ready().then_some(())).map(|(guard, ())| guard)
}

pub fn root() -> bool {
    if nix_euid() == 0 {
        return true;
    }
    missing("root: the end-to-end tests create namespaces (run the tests as root, as CI does)");
    false
}

/// A prerequisite of an end-to-end test is missing (`what` names it and how to get it).
/// Outside CI the test says `SKIPPED` and the caller returns without checking anything;
/// in CI (`CI=true`) every end-to-end test must run, so the test fails here, naming it.
pub fn missing(what: &str) {
    if in_ci() {
        panic!(
            "missing in CI, where every end-to-end test must run (CI={}): {what}",
            std::env::var("CI").unwrap_or_default()
        );
    }
    eprintln!("SKIPPED: {what}");
}

/// Is this a CI run? `CI=true` (or `1`), as CI services set it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

pub fn nix_euid() -> u32 {
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

pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("iblab-e2e-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir }
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn out(&self) -> PathBuf {
        self.dir.join("run")
    }
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .arg("--color")
            .arg("never")
            .env("IBLAB_STATE_DIR", self.state())
            .env("IBLAB_TEST_TAG", self.tag())
            // The words the tests read are English whatever the runner's locale; a test
            // of another language removes this.
            .env("IBLAB_LANG", "en");
        c
    }
    /// A mark every process of this test's runs inherits in its environment, so checks
    /// for leftovers see only this test's processes, not other labs running on the host.
    pub fn tag(&self) -> String {
        self.dir.file_name().unwrap().to_string_lossy().into_owned()
    }
    pub fn up(&self, args: &[&str]) -> Output {
        let mut all = vec!["up"];
        all.extend_from_slice(args);
        let mut c = self.cmd(&all);
        c.arg("--out").arg(self.out());
        c.output().unwrap()
    }
    /// The ends of the run's logs that say why a run went wrong (VM consoles, the link
    /// check, traffic clients), for a failing test's message.
    pub fn log_tails(&self) -> String {
        let mut names: Vec<_> = std::fs::read_dir(self.out().join("logs"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        let mut out = String::new();
        for p in names {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let wanted = ["console", "links", "client", "qemu"]
                .iter()
                .any(|w| name.contains(w));
            if !wanted || !p.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join("\n");
            out.push_str(&format!("--- logs/{name} (last lines)\n{tail}\n"));
        }
        out
    }
    /// Ids of the runs with a state file in this scratch's state folder now.
    pub fn runs(&self) -> Vec<String> {
        std::fs::read_dir(self.state())
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
    pub fn evidence(&self) -> Value {
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

pub fn namespaces_of(run_id: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.contains(run_id))
                .collect()
        })
        .unwrap_or_default()
}

/// Live (non-zombie) processes with this name that carry `tag` in their environment.
pub fn processes_named(name: &str, tag: &str) -> Vec<u32> {
    let mark = format!("IBLAB_TEST_TAG={tag}");
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
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|v| v == mark.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// Killed processes take a moment to go; wait a little before calling them left over.
pub fn processes_left(name: &str, tag: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let p = processes_named(name, tag);
        if p.is_empty() || Instant::now() > deadline {
            return p;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn assert_nothing_left(s: &Scratch, run_id: &str) {
    assert!(!run_id.is_empty());
    assert_eq!(
        namespaces_of(run_id),
        Vec::<String>::new(),
        "namespaces of run {run_id} left behind"
    );
    // libumad2sim writes `sys-<pid>/` trees into its working folder; none may land here.
    let strays: Vec<String> = std::fs::read_dir(".")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("sys-"))
        .collect();
    assert!(
        strays.is_empty(),
        "files left in the working folder: {strays:?}"
    );
    for tool in ["ibsim", "opensm"] {
        assert_eq!(
            processes_left(tool, &s.tag()),
            Vec::<u32>::new(),
            "{tool} left running"
        );
    }
    assert_eq!(
        processes_left("iperf3", &s.tag()),
        Vec::<u32>::new(),
        "iperf3 left running"
    );
    let states: Vec<_> = std::fs::read_dir(s.state())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(states.is_empty(), "state files left: {states:?}");
}

pub fn metric(e: &Value, step: &str, path: &str, name: &str) -> f64 {
    metric_if_any(e, step, path, name)
        .unwrap_or_else(|| panic!("no metric {name} on step {step} {path}"))
}

/// [`metric`], or `None` where the step recorded no such figure (it gave up, say).
pub fn metric_if_any(e: &Value, step: &str, path: &str, name: &str) -> Option<f64> {
    e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == step && (path.is_empty() || s["path"] == path))
        .and_then(|s| s["metrics"][name]["value"].as_f64())
}

pub fn step<'a>(e: &'a Value, id: &str) -> &'a Value {
    e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap()
}

/// The record of step `id` on path `path` (a traffic step has one per path).
pub fn path_step<'a>(e: &'a Value, id: &str, path: &str) -> &'a Value {
    e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id && s["path"] == path)
        .unwrap_or_else(|| panic!("no step {id} on path {path}"))
}

/// (expectation id, verdict) pairs of an evidence document.
pub fn verdicts(e: &Value) -> Vec<(String, String)> {
    e["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["id"].as_str().unwrap().to_string(),
                x["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The verdict of one expectation.
pub fn verdict_of(e: &Value, id: &str) -> String {
    verdicts(e)
        .into_iter()
        .find(|(i, _)| i == id)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no expectation {id}"))
}

/// Is a program installed (on PATH or in the sbin folders)?
pub fn installed(program: &str) -> bool {
    ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"]
        .iter()
        .any(|d| std::path::Path::new(d).join(program).exists())
}

/// Make this test process the reaper of every process its children leave behind: when
/// `iblab` exits, whatever it started and did not reap (a zombie it never waited for, a
/// process still running) becomes this process's child instead of init's, where
/// [`orphans_of_this_test`] sees it.
pub fn become_subreaper() {
    nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
}

/// Processes that became this test process's children because their parent exited
/// without reaping them, each as (pid, comm, state letter); `spawned` are the children
/// this test started itself. They are reaped (killed first if still running), so that
/// nothing is left either way.
pub fn orphans_of_this_test(spawned: &[u32]) -> Vec<(u32, String, char)> {
    let me = std::process::id();
    let mut found = Vec::new();
    for pid in std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
    {
        if spawned.contains(&pid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map(|x| x.1).unwrap_or("").to_string();
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == me {
            found.push((pid, comm, state));
        }
    }
    for (pid, _, _) in &found {
        let p = nix::unistd::Pid::from_raw(*pid as i32);
        let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(p, None);
    }
    found
}
