//! Many runs at once on the local backend (needs root), as on a machine a class shares:
//! they all pass and see nothing of each other, and `down --all` from elsewhere removes
//! only what dead runs left.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const ISOLATION: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/isolation.yaml");
const LONG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/long-transfer.yaml");

fn evidence(dir: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("evidence.json")).unwrap()).unwrap()
}

/// Ten runs of one lab at once, in one state folder: each passes (its a reaches its own b,
/// holds only its own link and knows only its own neighbour), the run ids differ, and
/// nothing of any of them is left.
#[test]
fn ten_runs_at_once_all_pass_and_see_nothing_of_each_other() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("ten");
    let runs: Vec<(std::path::PathBuf, Child)> = (0..10)
        .map(|i| {
            let out = s.dir.join(format!("run{i}"));
            let child = s
                .cmd(&["up", ISOLATION])
                .arg("--out")
                .arg(&out)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (out, child)
        })
        .collect();
    let mut ids = Vec::new();
    for (out, child) in runs {
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let e = evidence(&out);
        assert_eq!(e["verdict"], "pass");
        ids.push(e["run_id"].as_str().unwrap().to_string());
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 10, "run ids collided: {ids:?}");
    for id in &ids {
        assert_nothing_left(&s, id);
    }
}

/// Start a long run and wait until its namespaces exist.
#[allow(clippy::zombie_processes)] // the caller waits for it
fn start_long(s: &Scratch, out: &std::path::Path) -> (Child, String) {
    let mut child = s
        .cmd(&["up", LONG])
        .arg("--out")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(id) = s.runs().into_iter().find(|id| namespaces_of(id).len() == 3) {
            return (child, id);
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the long run ended early: {st}");
        }
        assert!(Instant::now() < deadline, "the long run never came up");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Two live runs, a dead run's leftover namespace with no state file:
/// `down --all` run with another state folder removes the leftover and spares the live
/// runs, which then stop on SIGINT with 130 and leave nothing.
#[test]
fn down_all_elsewhere_removes_only_dead_runs_leftovers() {
    let Some(_g) = begin(root) else {
        return;
    };
    // Each live run has a state folder of its own (one state file each, so start_long
    // can tell them apart); the sweep runs with a third.
    let live = Scratch::new("live");
    let live2 = Scratch::new("live2");
    let other = Scratch::new("other");
    let (mut first, id1) = start_long(&live, &live.out());
    let (mut second, id2) = start_long(&live2, &live2.out());
    let dead = "iblab-dead00-a";
    let made = Command::new("ip")
        .args(["netns", "add", dead])
        .status()
        .unwrap();
    assert!(made.success());
    let down = other.cmd(&["down", "--all"]).output().unwrap();
    let dead_left = std::path::Path::new("/run/netns").join(dead).exists();
    if dead_left {
        let _ = Command::new("ip").args(["netns", "del", dead]).status();
    }
    let (ns1, ns2) = (namespaces_of(&id1), namespaces_of(&id2));
    for child in [&mut first, &mut second] {
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
    }
    let codes: Vec<Option<i32>> = [&mut first, &mut second]
        .into_iter()
        .map(|c| c.wait().unwrap().code())
        .collect();
    assert_eq!(
        down.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(!dead_left, "the dead run's namespace was not removed");
    assert_eq!(ns1.len(), 3, "a live run lost namespaces: {ns1:?}");
    assert_eq!(ns2.len(), 3, "a live run lost namespaces: {ns2:?}");
    assert_eq!(codes, vec![Some(130), Some(130)]);
    assert_nothing_left(&live, &id1);
    assert_nothing_left(&live2, &id2);
}
