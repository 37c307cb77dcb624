//! End to end on the local backend (needs root): real namespaces, veth, bridges, iperf3,
//! loss faults; then nothing of the run may be left. Runs one at a time.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

#[test]
fn tcp_loss_lab_measures_loss_and_leaves_nothing() {
    let Some(_g) = begin(root) else {
        return;
    };
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
    // Nearly every dropped frame was a data segment of this flow, and TCP sent it again.
    let dropped = metric(&e, "loss_off", "", "dropped_packets");
    assert!(dropped > 0.0);
    assert!(metric(&e, "lossy", "tcp", "retransmits") >= 0.8 * dropped);
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
            ("frames_were_dropped", "pass"),
            ("every_loss_is_repaired", "pass"),
            ("only_the_loss_is_repaired", "pass"),
            ("tcp_degrades_gracefully", "pass"),
            ("heavy_loss_hurts_tcp_too", "skipped")
        ]
    );
    let junit = std::fs::read_to_string(s.out().join("junit.xml")).unwrap();
    assert_eq!(
        junit.matches("<testcase").count(),
        5 + e["steps"].as_array().unwrap().len()
    );
    assert!(s.out().join("report.html").exists());
    assert!(s.out().join("logs/clean.tcp.iperf3-client.log").exists());
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

/// `--repeat 3`: every traffic step runs three times, its figures are the medians, every
/// value is kept with the spread, and the lab's verdicts still hold (tcp-loss compares
/// one run's retransmissions × repeat with the drops of all three).
#[test]
fn repeated_traffic_is_judged_on_the_median() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("repeat");
    let out = s.up(&["tcp-loss", "--repeat", "3", "--yes"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let e = s.evidence();
    for id in ["clean", "lossy"] {
        let st = path_step(&e, id, "tcp");
        let f = &st["detail"]["repeat"]["figures"]["throughput_mbps"];
        let mut values: Vec<f64> = f["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(values.len(), 3, "{id}: {f}");
        values.sort_by(|a, b| a.total_cmp(b));
        assert_eq!(
            st["metrics"]["throughput_mbps"]["value"].as_f64(),
            Some(values[1])
        );
        assert_eq!(f["median"].as_f64(), Some(values[1]));
        assert_eq!(st["detail"]["repeat"]["passed"], 3);
        assert!(
            s.out()
                .join(format!("logs/{id}-3.tcp.iperf3-client.log"))
                .exists()
        );
    }
    assert!(
        verdicts(&e).iter().all(|(_, v)| v != "fail"),
        "{:?}",
        verdicts(&e)
    );
    assert!(
        e["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap_or("").contains("--repeat")),
        "the evidence says the figures are medians"
    );
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

#[test]
fn heavy_loss_scenario_hurts_tcp() {
    let Some(_g) = begin(root) else {
        return;
    };
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
    let Some(_g) = begin(root) else {
        return;
    };
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
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("paths");
    // Without --paths, path roce cannot be provided by the local backend: an environment error, not a pass.
    let plan = s
        .cmd(&["plan", "tests/labs/paths-subset.yaml", "--backend", "local"])
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
        .find(|x| x["id"] == "roce_side")
        .unwrap();
    assert_eq!(ib["verdict"], "skipped");
    assert!(
        ib["explanation"].as_str().unwrap().contains("--paths"),
        "{ib}"
    );
    assert_eq!(e["excluded_paths"]["roce"], "left out with --paths");
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
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("interrupt");
    let (mut child, run_id) = start_long(&s);
    assert!(
        !namespaces_of(&run_id).is_empty(),
        "the lab was not up when interrupted"
    );
    assert!(!processes_named("iperf3", &s.tag()).is_empty());
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
    let Some(_g) = begin(root) else {
        return;
    };
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

#[test]
fn a_rate_fault_caps_throughput_and_clear_lifts_it() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("rate");
    let out = s.up(&["tests/labs/rate-limit.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let e = s.evidence();
    let slow = metric(&e, "slow", "tcp", "throughput_mbps");
    let fast = metric(&e, "fast", "tcp", "throughput_mbps");
    assert!(slow > 25.0 && slow <= 55.0, "slow {slow}");
    assert!(fast > 2.0 * slow, "fast {fast} slow {slow}");
    let cmds = step(&e, "limit")["detail"]["commands"].to_string();
    assert!(cmds.contains("tbf") && cmds.contains("\"b\""), "{cmds}");
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

/// `up --keep` ends with the node table; `status RUN` says the run is kept and shows the
/// table again; `exec` runs a command on a node with its output and exit code passed
/// through; a node that does not exist is bad input; `down RUN` removes it all.
#[test]
fn a_kept_lab_can_be_entered_and_removed() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("kept");
    let out = s.up(&["tcp-loss", "--paths", "tcp", "--keep"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let run_id = s.evidence()["run_id"].as_str().unwrap().to_string();
    let result = std::panic::catch_unwind(|| {
        assert_eq!(out.status.code(), Some(0), "{stdout}");
        assert!(
            stdout.contains("NODE") && stdout.contains("WAY IN"),
            "{stdout}"
        );
        assert!(
            stdout.contains("198.18.0.1/24") && stdout.contains(&format!("iblab shell {run_id} a")),
            "{stdout}"
        );
        let status = s.cmd(&["status", &run_id]).output().unwrap();
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(text.contains("· kept ·") && text.contains("sw1"), "{text}");
        // By lab name too (its newest run), with the command's own output and exit code.
        let ip = exec(
            &s,
            &["tcp-loss", "a", "--", "ip", "-br", "addr", "show", "eth0"],
        );
        assert_eq!(ip.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&ip.stdout).contains("198.18.0.1/24"));
        let code = exec(&s, &[&run_id, "b", "--", "sh", "-c", "exit 7"]);
        assert_eq!(code.status.code(), Some(7));
        // The kept lab is still wired: a reaches b.
        let ping = exec(
            &s,
            &[&run_id, "a", "--", "ping", "-c1", "-W2", "198.18.0.2"],
        );
        assert_eq!(
            ping.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&ping.stdout)
        );
        let bad = exec(&s, &[&run_id, "zz", "--", "true"]);
        assert_eq!(bad.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&bad.stderr).contains("its nodes: a, b, sw1"));
    });
    let down = s.cmd(&["down", &run_id]).output().unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert_eq!(down.status.code(), Some(0));
    assert_nothing_left(&s, &run_id);
}

/// `iblab exec ARGS…` with this test's state folder (no options after `--`).
fn exec(s: &Scratch, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("exec")
        .args(args)
        .env("IBLAB_STATE_DIR", s.state())
        .env("IBLAB_TEST_TAG", s.tag())
        .output()
        .unwrap()
}

/// A step whose program this host lacks (the local backend's nodes run the host's own
/// programs) is refused before anything is deployed: exit 3, the program named, no
/// namespace made, no run folder written.
#[test]
fn a_program_the_host_lacks_is_named_before_anything_is_deployed() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("cannot-start");
    let lab = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/cannot-start.yaml");
    let out = s.up(&[lab, "--backend", "local"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains(
            "step `run` runs `iblab-no-such-program` on this host, and it is not installed"
        ),
        "{text}"
    );
    assert!(!text.contains("provisioned"), "{text}");
    assert!(!s.out().exists(), "a run folder was written");
    assert!(s.runs().is_empty(), "a state file was written");
}

/// `down` stops a run's owner before it removes the run, and knows the owner by its pid
/// and its start time: a live process that merely has the owner's old pid (the owner
/// crashed and the pid was reused) is left alone, while the owner itself is stopped.
#[test]
fn down_stops_the_owner_only_while_it_is_the_owner() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for same_start in [false, true] {
        let s = Scratch::new(&format!("owner-{same_start}"));
        std::fs::create_dir_all(s.state()).unwrap();
        let mut stand_in = Command::new("sleep").arg("60").spawn().unwrap();
        let pid = stand_in.id();
        let ticks = iblab_sys::pid::start_ticks_of(pid).unwrap();
        let run = format!("own{}", u8::from(same_start));
        let state = serde_json::json!({
            "run_id": run, "lab": "tcp-loss", "scenario": "default", "backend": "local",
            "owner_pid": pid,
            "owner_start_ticks": if same_start { ticks } else { ticks + 1 },
            "started": "2026-12-03T00:00:00Z", "run_dir": s.out(), "resources": [],
        });
        std::fs::write(s.state().join(format!("{run}.json")), state.to_string()).unwrap();
        let down = s.cmd(&["down", &run]).output().unwrap();
        assert!(down.status.success(), "{down:?}");
        std::thread::sleep(Duration::from_millis(200));
        let ended = stand_in.try_wait().unwrap();
        let _ = stand_in.kill();
        let _ = stand_in.wait();
        if same_start {
            assert!(ended.is_some(), "down did not stop the run's owner");
        } else {
            assert!(
                ended.is_none(),
                "down killed a process that only had the owner's old pid"
            );
        }
        assert!(
            !s.state().join(format!("{run}.json")).exists(),
            "the run's state file is left"
        );
    }
}

/// A step whose output passes the cap iblab keeps of a command fails, and says so with
/// the bytes it dropped: its evidence is incomplete (a flood, as from a replaced tool or
/// output written into its stream, cannot pass as a result).
#[test]
fn a_step_that_floods_its_output_fails_with_the_cap_in_its_reason() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("flood");
    let lab = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/flooding-step.yaml");
    let out = s.up(&[lab, "--yes"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let e = s.evidence();
    let st = common::step(&e, "chatty");
    assert_eq!(st["verdict"], "fail", "{st}");
    assert!(
        st["reason"]
            .as_str()
            .is_some_and(|r| r.contains("8 MiB iblab keeps")),
        "{st}"
    );
    assert_eq!(
        st["detail"]["output_cut_bytes"].as_u64(),
        // iblab's cap: 8 MiB (iblab_core::command::OUTPUT_CAP)
        Some(20_000_000 - (8 << 20)),
        "{st}"
    );
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}

/// A tool's port taken first by another process in its server's node: the run does not
/// take its figures from whoever answers there; it stops (exit 3) naming the process, and
/// leaves nothing.
#[test]
fn a_port_taken_before_the_tools_server_is_named_never_measured() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("port-taken");
    let lab = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/port-taken.yaml");
    let out = s.up(&[lab]);
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The squatter goes with this test whatever happened.
    for pid in processes_named("perl", &s.tag()) {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("port 5201 on b is held by process") && said.contains("not by iperf3"),
        "names what was in the way: {said}"
    );
    let e = s.evidence();
    let steps = e["steps"].as_array().cloned().unwrap_or_default();
    assert!(
        steps
            .iter()
            .all(|st| st["metrics"]["throughput_mbps"].is_null()),
        "no figure was taken from the squatter: {steps:?}"
    );
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}
