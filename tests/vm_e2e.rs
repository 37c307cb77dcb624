//! End to end on the vm backend (needs root and qemu): one microVM whose network
//! namespaces are the nodes, each with its own rxe, ib_write_bw, ib_send_lat and rping
//! over Soft-RoCE beside TCP, and lesson 3's verbs mistakes; then nothing of the run may
//! be left: no qemu, namespace, temporary folder, image lock or state file.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    SERIAL, Scratch, become_subreaper, begin, installed, missing, nix_euid, orphans_of_this_test,
    verdict_of,
};
use serde_json::Value;

/// Why this machine cannot run the test, if it cannot.
fn cannot_run() -> Option<&'static str> {
    if nix_euid() != 0 {
        return Some(
            "the vm backend needs root (qemu, the emulated subnet's namespace); run the tests as root, as CI does",
        );
    }
    if !installed("qemu-system-x86_64") {
        return Some("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)");
    }
    None
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("IBLAB_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("iblab").join("vm")
}

/// Live qemu processes started for this run (their command line names the run's files).
/// Zombies are left out: once iblab has exited, init reaps the ones it was handed; that
/// iblab itself waited for its qemus is checked with a subreaper
/// (`interrupt_while_booting_leaves_nothing`).
fn qemus_of(run_id: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .and_then(|x| x.1.trim_start().chars().next())
                == Some('Z');
            cmd.contains("qemu-system") && cmd.contains(&format!("iblab-{run_id}-vm")) && !zombie
        })
        .collect()
}

/// The names in folder `dir` that `keep` keeps.
fn names_in(dir: &std::path::Path, keep: impl Fn(&str) -> bool) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default()
}

/// Beyond what every run must leave: no qemu, tap, temporary folder, image lock or build.
fn assert_no_vm_left(s: &Scratch, run_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !qemus_of(run_id).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(qemus_of(run_id), Vec::<u32>::new(), "qemu left running");
    let namespaces = names_in(std::path::Path::new("/run/netns"), |n| n.contains(run_id));
    assert!(namespaces.is_empty(), "namespaces left: {namespaces:?}");
    let tmp = std::env::temp_dir().join(format!("iblab-{run_id}-vm"));
    assert!(!tmp.exists(), "temporary folder left: {}", tmp.display());
    let lock = cache_dir().join("build.lock");
    assert!(!lock.exists(), "image lock left: {}", lock.display());
    let builds = names_in(&cache_dir(), |n| n.starts_with("build-"));
    assert!(builds.is_empty(), "build folders left: {builds:?}");
    let partial = names_in(&cache_dir().join("snapshots"), |n| n.ends_with(".tmp"));
    assert!(partial.is_empty(), "partial snapshots left: {partial:?}");
    let states: Vec<_> = std::fs::read_dir(s.state())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(states.is_empty(), "state files left: {states:?}");
}

/// A metric of a passing soft step, with its unit.
fn soft_metric(e: &Value, id: &str, path: &str, name: &str) -> f64 {
    let step = e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id && s["path"] == path)
        .unwrap_or_else(|| panic!("no step {id} on {path}"));
    assert_eq!(step["verdict"], "pass", "{id} on {path}: {step}");
    assert_eq!(step["provenance"]["kind"], "soft", "{id} on {path}");
    let m = &step["metrics"][name];
    assert!(
        m["unit"].is_string(),
        "{id}.{path}.{name} has no unit: {step}"
    );
    m["value"]
        .as_f64()
        .unwrap_or_else(|| panic!("{id}.{path}.{name} missing: {step}"))
}

#[test]
fn verbs_over_softroce_between_namespaces_of_one_vm() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    let s = Scratch::new("roce");
    let t = Instant::now();
    let out = s.up(&["roce-basics", "--backend", "vm"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(3)
        && format!("{stdout}{stderr}").contains("the guest kernel comes from Debian")
    {
        missing(&format!(
            "a Debian kernel ≥ 7.1 to build the guest from (its suite is not reachable): {stdout}{stderr}"
        ));
        return;
    }
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    eprintln!("roce-basics on the vm backend: {:?}", t.elapsed());
    let e = s.evidence();
    assert_eq!(e["backend"], "vm");
    assert!(soft_metric(&e, "bandwidth", "roce", "throughput_mbps") > 0.0);
    assert!(soft_metric(&e, "bandwidth", "roce", "iterations") > 0.0);
    for m in [
        "latency_typical_us",
        "latency_min_us",
        "latency_p99_us",
        "round_trips",
    ] {
        assert!(soft_metric(&e, "latency", "roce", m) > 0.0, "{m}");
    }
    assert!(soft_metric(&e, "connect", "roce", "rping_messages") >= 1.0);
    assert!(soft_metric(&e, "bandwidth", "tcp", "throughput_mbps") > 0.0);
    assert!(soft_metric(&e, "latency", "tcp", "latency_typical_us") > 0.0);
    // The tool really ran on rxe with the IPv4-mapped GID it picked.
    let bw = e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "bandwidth" && s["path"] == "roce")
        .unwrap();
    // One kernel holds every node: each node's rxe has a name of its own.
    let device = bw["detail"]["perftest_settings"]["Device"]
        .as_str()
        .unwrap_or_default();
    assert!(["a-rxe0", "b-rxe0"].contains(&device), "{device}");
    assert_eq!(bw["detail"]["perftest_settings"]["Link type"], "Ethernet");
    assert!(bw["detail"]["client"].to_string().contains("ib_write_bw"));
    // Lesson 3's mistakes, made on real queue pairs by iblab's verbs probe.
    let probe = e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "mistakes")
        .unwrap();
    let j = &probe["detail"]["json"];
    assert_eq!(j["device"], "a-rxe0", "{probe}");
    let frm = &j["forgot_register_memory"];
    assert_eq!(frm["held"], true, "{frm}");
    let statuses: Vec<u64> = frm["completions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_u64().unwrap())
        .collect();
    // 4: IBV_WC_LOC_PROT_ERR; rxe on Linux ≥ 7 reports the failing request as flushed (5).
    assert!(
        statuses.contains(&4) || statuses.contains(&5),
        "no IBV_WC_LOC_PROT_ERR: {frm}"
    );
    assert!(
        statuses.contains(&0),
        "the registered control did not succeed: {frm}"
    );
    assert_eq!(j["send_without_recv"]["held"], true, "{j}");
    assert!(
        j["send_without_recv"]["observed"]
            .as_str()
            .unwrap()
            .contains("status 13")
    );
    assert_eq!(j["post_before_rts"]["held"], true, "{j}");
    // What a shared device keeps apart: another context's region refuses this one's write.
    assert_eq!(j["another_contexts_key"]["held"], true, "{j}");
    // ① the same bytes through a plain TCP send went through.
    assert!(soft_metric(&e, "latency", "tcp", "round_trips") > 0.0);
    for id in [
        "forgot_register_memory",
        "send_needs_recv",
        "qp_must_reach_rts",
    ] {
        let x = e["expectations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == id)
            .unwrap();
        assert_eq!(x["verdict"], "pass", "{x}");
    }
    let run_id = e["run_id"].as_str().unwrap().to_string();
    assert_no_vm_left(&s, &run_id);
}

/// Ctrl-C while the VM is being restored from its snapshot, and while it boots (snapshots
/// off): nothing is left, and every qemu was waited for.
#[test]
fn interrupt_while_restoring_or_booting_leaves_nothing() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    // With a snapshot there, the VM is being restored when the interrupt comes.
    make_sure_of_a_snapshot();
    // Whatever iblab leaves unreaped when it exits (a killed qemu it never waited for,
    // a zombie until then) is handed to this test instead of init: see below.
    become_subreaper();
    for snapshots in ["1", "0"] {
        interrupt_early(snapshots);
    }
}

fn interrupt_early(snapshots: &str) {
    // Children an earlier test left this process are not this run's.
    let before: Vec<u32> = children_of_this_test().iter().map(|c| c.0).collect();
    let s = Scratch::new(&format!("int{snapshots}"));
    let mut c = s.cmd(&["up", "roce-basics", "--backend", "vm"]);
    c.env("IBLAB_VM_SNAPSHOT", snapshots);
    c.arg("--out")
        .arg(s.out())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    // Wait until a qemu of the run is up, then interrupt.
    let deadline = Instant::now() + Duration::from_secs(120);
    let run_id = loop {
        let id = std::fs::read_dir(s.state()).ok().and_then(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .find_map(|n| n.strip_suffix(".json").map(str::to_string))
        });
        if let Some(id) = id
            && !qemus_of(&id).is_empty()
        {
            break id;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("iblab exited before any VM started: {status}");
        }
        assert!(Instant::now() < deadline, "no VM started within 120s");
        std::thread::sleep(Duration::from_millis(100));
    };
    let code = interrupt(&mut child, Duration::from_secs(30));
    assert_eq!(code, Some(130));
    // iblab must have waited for every qemu it killed: a zombie of its (or anything
    // still running) became this test's child at its exit.
    let orphans = orphans_of_this_test(&before);
    assert!(
        orphans.is_empty(),
        "iblab exited without reaping these children (pid, name, state): {orphans:?}"
    );
    assert_no_vm_left(&s, &run_id);
}

/// Ctrl-C once the VMs are up (the guests answered, provisioning is done): teardown kills
/// every qemu, and iblab must wait for each before it exits. Before that was so, the killed
/// qemus stayed zombies of iblab until it exited and init reaped them.
#[test]
fn interrupt_after_boot_reaps_every_qemu() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    become_subreaper();
    // Children an earlier test left this process are not this run's.
    let before: Vec<u32> = children_of_this_test().iter().map(|c| c.0).collect();
    let s = Scratch::new("int-booted");
    std::fs::create_dir_all(&s.dir).unwrap();
    let err_log = s.dir.join("stderr.log");
    let mut c = s.cmd(&["up", "roce-basics", "--backend", "vm"]);
    c.arg("--out")
        .arg(s.out())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_log).unwrap());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let err = std::fs::read_to_string(&err_log).unwrap_or_default();
        if err.contains("provisioned ") {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("iblab exited before the VMs were up: {status}\n{err}");
        }
        assert!(Instant::now() < deadline, "the VMs were not up within 240s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let qemus = std::fs::read_dir(s.state())
        .ok()
        .and_then(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .find_map(|n| n.strip_suffix(".json").map(str::to_string))
        })
        .map(|id| (qemus_of(&id), id))
        .expect("the run's state file");
    assert!(!qemus.0.is_empty(), "no qemu of run {} is running", qemus.1);
    let code = interrupt(&mut child, Duration::from_secs(60));
    assert_eq!(code, Some(130));
    let orphans = orphans_of_this_test(&before);
    assert!(
        orphans.is_empty(),
        "iblab exited without reaping these children (pid, name, state): {orphans:?} (its qemus were {:?})",
        qemus.0
    );
    assert_no_vm_left(&s, &qemus.1);
}

/// Two switches joined by two cables (lesson4-reroute): on the vm backend the switches'
/// bridges run spanning tree, as on local and docker, instead of forming a bridging loop;
/// Ethernet then heals around the cut by itself.
#[test]
fn looped_switches_run_spanning_tree_on_the_vm_backend() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = cannot_run() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let s = Scratch::new("loop");
    let out = s.up(&[
        "lesson4-reroute",
        "--backend",
        "vm",
        "--paths",
        "tcp",
        "--keep",
    ]);
    let e = s.evidence();
    let run_id = e["run_id"].as_str().unwrap().to_string();
    // The switches are namespaces inside the VM: the backend keeps their bridges' state.
    let shown = std::fs::read_to_string(s.out().join("logs/vm-bridges.log")).unwrap_or_default();
    let down = s.cmd(&["down", &run_id]).output().unwrap();
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    // Where an earlier test made this process a subreaper, the kept qemu became its child
    // when `up` exited, and `down` left it a zombie of this process: reap it here, or the
    // next test that counts this process's children finds it (seen in `.ci/run`).
    orphans_of_this_test(&[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        s.log_tails()
    );
    let sw1 = shown
        .lines()
        .find_map(|l| l.strip_prefix("sw1: "))
        .unwrap_or_else(|| panic!("no bridge of sw1 in the log: {shown}"));
    let links: Value = serde_json::from_str(sw1).unwrap();
    assert_eq!(
        links[0]["linkinfo"]["info_data"]["stp_state"], 1,
        "sw1's bridge does not run spanning tree: {links}"
    );
    assert_eq!(verdict_of(&e, "ethernet_heals_by_itself"), "pass");
    assert_no_vm_left(&s, &run_id);
}

/// Send SIGINT to a running iblab and wait for its exit code (it must exit within `limit`).
fn interrupt(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("iblab did not exit within {limit:?} of the interrupt");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// This test process's children, as (pid, comm, state letter), without touching them.
fn children_of_this_test() -> Vec<(u32, String, char)> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_string();
            let mut f = rest.split_whitespace();
            let state = f.next()?.chars().next()?;
            let ppid: u32 = f.next()?.parse().ok()?;
            (ppid == me).then_some((pid, comm, state))
        })
        .collect()
}

/// `iblab exec RUN NODE -- ARGV` (the options `Scratch::cmd` adds go before the `--`).
fn exec(s: &Scratch, run_id: &str, node: &str, argv: &[&str]) -> std::process::Output {
    s.cmd(&["exec", run_id, node])
        .arg("--")
        .args(argv)
        .output()
        .unwrap()
}

/// A lab kept with `--keep` on the vm backend stays up after `iblab up` ends: its VMs run
/// on (in sessions of their own), `iblab exec` reaches a VM through its guest agent with
/// the output and exit code passed through (and a switch through its namespace), the node
/// table shows path ②'s GIDs read from the rxe devices, `status` says the run is kept, and
/// `down` removes every qemu, tap and namespace, leaving no zombie.
#[test]
fn a_kept_vm_lab_stays_up_and_is_entered_through_the_agent() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    // The kept qemus become this process's children when iblab exits: what iblab leaves
    // (running or a zombie) shows here.
    become_subreaper();
    let s = Scratch::new("keep");
    let lab = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/kept-roce.yaml");
    let out = s.up(&[lab, "--backend", "vm", "--keep"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log_tails()
    );
    let run_id = s.evidence()["run_id"].as_str().unwrap().to_string();
    // iblab up is gone; the lab's one VM is not, and iblab left no zombie behind.
    let qemus = qemus_of(&run_id);
    assert_eq!(qemus.len(), 1, "the kept VM is not running: {stdout}");
    let handed_on = children_of_this_test();
    assert!(
        handed_on
            .iter()
            .all(|(pid, _, state)| qemus.contains(pid) && *state != 'Z'),
        "iblab up left other children than its running VMs (pid, name, state): {handed_on:?}"
    );
    // The node table: the way in, IPv4 per interface and ②'s IPv4-mapped GID.
    assert!(
        stdout.contains(&format!("iblab shell {run_id} a")),
        "{stdout}"
    );
    assert!(stdout.contains("eth0 198.18.0.1/24"), "{stdout}");
    assert!(
        stdout.contains("② GID ::ffff:198.18.0.1 (a-rxe0)"),
        "no GID in the node table:\n{stdout}"
    );
    // Through the guest agent: output and exit code pass through.
    let ran = exec(
        &s,
        &run_id,
        "a",
        &[
            "sh",
            "-c",
            "/usr/bin/ip -4 -o addr show dev eth0; echo to-stderr >&2; exit 7",
        ],
    );
    assert_eq!(
        ran.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    // In node a's namespace of the guest: its address, not b's.
    let said = String::from_utf8_lossy(&ran.stdout);
    assert!(
        said.contains("198.18.0.1/24") && !said.contains("198.18.0.2"),
        "{said}"
    );
    assert!(String::from_utf8_lossy(&ran.stderr).contains("to-stderr"));
    // Real programs of the image, the guest's own addresses and rxe.
    let ran = exec(&s, &run_id, "b", &["rdma", "link"]);
    assert!(ran.status.success(), "{ran:?}");
    assert!(
        String::from_utf8_lossy(&ran.stdout).contains("b-rxe0"),
        "{ran:?}"
    );
    // A program the image lacks: 127, as a shell says.
    let ran = exec(&s, &run_id, "a", &["no-such-program"]);
    assert_eq!(ran.status.code(), Some(127), "{ran:?}");
    // A switch is a namespace in the guest too.
    let ran = exec(&s, &run_id, "sw1", &["ip", "link", "show", "br0"]);
    assert!(ran.status.success(), "{ran:?}");
    // A line shell where stdin is no terminal: each line runs, the last code passes through.
    let mut sh = s
        .cmd(&["shell", &run_id, "a"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut input = sh.stdin.take().unwrap();
        input.write_all(b"echo line-one\nexit 3\n").unwrap();
    }
    let shell = sh.wait_with_output().unwrap();
    assert_eq!(shell.status.code(), Some(3), "{shell:?}");
    assert!(String::from_utf8_lossy(&shell.stdout).contains("line-one"));
    // status: kept, in the list and for the run.
    let st = s.cmd(&["status"]).output().unwrap();
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with(run_id.as_str()) && l.contains(" kept ")),
        "{text}"
    );
    let st = s.cmd(&["status", &run_id]).output().unwrap();
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(text.contains("· kept ·"), "{text}");
    assert!(text.contains("② GID ::ffff:198.18.0.2 (b-rxe0)"), "{text}");
    // The VMs are still the same processes: nothing above restarted or ended them.
    assert_eq!(qemus_of(&run_id), qemus);
    let down = s.cmd(&["down", &run_id]).output().unwrap();
    assert!(down.status.success(), "{down:?}");
    // Every qemu was killed by `down`; they were this test's (handed on) children: reap them.
    for pid in &qemus {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        let p = nix::unistd::Pid::from_raw(*pid as i32);
        let deadline = Instant::now() + Duration::from_secs(10);
        let waited = loop {
            match waitpid(p, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                other => break other,
            }
        };
        assert!(
            matches!(waited, Ok(WaitStatus::Signaled(..))),
            "qemu {pid} was not killed by `down`: {waited:?}"
        );
    }
    let left = children_of_this_test();
    assert!(
        left.is_empty(),
        "processes left (pid, name, state): {left:?}"
    );
    assert_no_vm_left(&s, &run_id);
}

/// A boot that never reaches the guest agent (a TCG boot hang, seen once in CI with an
/// empty console) or whose kernel crashes (seen once in CI: "Fatal exception in
/// interrupt") is not the lab's failure: the VM is booted again, with the kernel's whole
/// console, and the run passes and its evidence says so. Both are made on purpose: the
/// first boot's agent parks without a hello and the second's exits, so that its kernel
/// panics, as the kernel's command line of those boots asks.
#[test]
fn a_hung_boot_and_a_crashed_boot_are_booted_again() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    let s = Scratch::new("hung");
    let out = s
        .cmd(&["up", "tcp-loss", "--backend", "vm"])
        .arg("--out")
        .arg(s.out())
        .env("IBLAB_VM_TEST_FAIL_BOOTS", "hang,crash")
        .env("IBLAB_VM_HUNG_BOOT_S", "8")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let e = s.evidence();
    let notes = e["notes"].to_string();
    assert!(
        notes.contains("boot 1 of the VM did not reach the guest agent within 8 s"),
        "no word of the hung boot: {notes}"
    );
    assert!(
        notes.contains(
            "boot 2 of the VM crashed: its kernel said `Kernel panic - not syncing: \
             Attempted to kill init!"
        ),
        "no word of the crashed boot: {notes}"
    );
    let console = |n: &str| std::fs::read_to_string(s.out().join("logs").join(n)).unwrap();
    // The first boot is quiet: its console may be empty, but it is kept.
    console("vm.console.boot-1.log");
    let second = console("vm.console.boot-2.log");
    assert!(
        second.contains("fail_boot=crash: init exits") && second.contains("Call Trace"),
        "the second boot's console is the kernel's whole one: {second}"
    );
    let third = console("vm.console.log");
    assert!(
        !third.contains("iblab.test.fail_boot") && third.lines().count() > 20,
        "the third boot's console is the kernel's whole one: {} lines",
        third.lines().count()
    );
    assert_no_vm_left(&s, e["run_id"].as_str().expect("a run id"));
}

/// A step whose program the guest image lacks is an environment error naming it (the
/// busybox nsenter the agent runs it through says it could not start it), not a failed
/// command; nothing of the run is left.
#[test]
fn a_program_the_guest_lacks_is_an_environment_error() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    let s = Scratch::new("cannot-start");
    let lab = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/cannot-start.yaml");
    let out = s.up(&[lab, "--backend", "vm"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("could not start `iblab-no-such-program` on node a"),
        "{text}"
    );
    assert!(text.contains("nsenter: can't execute"), "{text}");
    assert!(text.contains("step `run` names a program"), "{text}");
    let e = s.evidence();
    assert_eq!(e["verdict"], "error");
    assert_no_vm_left(&s, e["run_id"].as_str().unwrap());
}

/// The notes of a run's evidence.
fn notes_of(e: &Value) -> Vec<String> {
    e["notes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `iblab up roce-basics --backend vm`, which must pass.
fn roce_basics_passes(tag: &str) -> Scratch {
    let s = Scratch::new(tag);
    let out = s.up(&["roce-basics", "--backend", "vm"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log_tails()
    );
    s
}

/// A run of roce-basics, so that the booted-guest snapshot of this binary exists (the
/// first run of a new binary boots and saves it; any later one restores it). Its notes.
/// The key of the booted-guest snapshot a run's notes name (saved or restored).
fn snapshot_key(notes: &[String]) -> String {
    notes
        .iter()
        .find_map(|n| {
            let rest = n.split("booted-guest snapshot ").nth(1)?;
            let key: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
            (key.len() == 16).then_some(key)
        })
        .unwrap_or_else(|| panic!("no snapshot named in {notes:?}"))
}

fn make_sure_of_a_snapshot() -> Vec<String> {
    let s = roce_basics_passes("snap-make");
    let notes = notes_of(&s.evidence());
    assert!(
        notes
            .iter()
            .any(|n| n.contains("saved as the booted-guest snapshot") || n.contains("restored in")),
        "the run neither saved nor restored a snapshot: {notes:?}"
    );
    notes
}

/// Restored guests are fresh machines, and several restore one snapshot at once: two labs
/// kept up side by side, both restored from the same file, each with the host's clock,
/// its own random bytes and its own identity.
#[test]
fn two_restored_labs_at_once_are_two_fresh_machines() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    make_sure_of_a_snapshot();
    let lab = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/kept-roce.yaml");
    let runs: Vec<Scratch> = ["snap-one", "snap-two"].map(Scratch::new).into();
    let children: Vec<_> = runs
        .iter()
        .map(|s| {
            let mut c = s.cmd(&["up", lab, "--backend", "vm", "--keep"]);
            c.arg("--out")
                .arg(s.out())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let mut seen = Vec::new();
    for (s, out) in runs.iter().zip(&outs) {
        let e = s.evidence();
        let run_id = e["run_id"].as_str().unwrap().to_string();
        // Down in every outcome (the asserts below may fail).
        struct Down<'a>(&'a Scratch, String);
        impl Drop for Down<'_> {
            fn drop(&mut self) {
                let _ = self.0.cmd(&["down", &self.1]).output();
            }
        }
        seen.push((Down(s, run_id.clone()), run_id.clone()));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            s.log_tails()
        );
        let notes = notes_of(&e);
        assert!(
            notes.iter().any(|n| n.contains("restored in")),
            "{run_id} was not restored: {notes:?}"
        );
        assert!(
            notes
                .iter()
                .any(|n| n.contains("its RNG reseeded from the host")),
            "{notes:?}"
        );
    }
    let mut draws = Vec::new();
    for (s, (_, run_id)) in runs.iter().zip(&seen) {
        let say = |argv: &[&str]| {
            let o = exec(s, run_id, "a", argv);
            assert!(o.status.success(), "{argv:?}: {o:?}");
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        // Its identity: the run's id, the lab's hostname.
        assert_eq!(say(&["cat", "/run/iblab/run"]), *run_id);
        assert_eq!(say(&["cat", "/proc/sys/kernel/hostname"]), "kept-roce");
        // The host's clock, not the snapshot's.
        let guest: f64 = say(&["busybox", "date", "+%s"]).parse().unwrap();
        let host = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            (guest - host).abs() < 5.0,
            "{run_id}: the guest's clock is {guest}, the host's {host}"
        );
        // Random bytes of its own (a random UUID is 122 bits drawn from the kernel's
        // generator, whose state both guests restored from one file).
        draws.push(say(&["cat", "/proc/sys/kernel/random/uuid"]));
    }
    assert_ne!(
        draws[0], draws[1],
        "two restored guests drew the same bytes"
    );
    for (s, (down, run_id)) in runs.iter().zip(seen) {
        drop(down);
        assert_no_vm_left(s, &run_id);
    }
    // The kept qemus that `down` stopped: zombies of this process if an earlier test
    // made it a subreaper (see looped_switches_run_spanning_tree_on_the_vm_backend).
    orphans_of_this_test(&[]);
}

/// A snapshot that qemu cannot load (here its stream damaged past its first bytes, so that
/// only qemu itself can tell) is no failed run: the VM is booted instead, the evidence
/// says so, and the boot saves a good snapshot again.
#[test]
fn a_damaged_snapshot_falls_back_to_a_boot_with_a_note() {
    let Some(_g) = begin(|| cannot_run().map(missing).is_none()) else {
        return;
    };
    // The snapshot this binary's runs use (a cache may hold others, of other builds).
    let key = snapshot_key(&make_sure_of_a_snapshot());
    let snap = cache_dir().join("snapshots").join(format!("{key}.vmstate"));
    assert!(snap.exists(), "{} is missing", snap.display());
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&snap).unwrap();
        f.seek(std::io::SeekFrom::Start(4)).unwrap();
        f.write_all(&[0xff; 64]).unwrap();
    }
    let s = roce_basics_passes("snap-bad");
    let e = s.evidence();
    let notes = notes_of(&e);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("could not be restored") && n.contains("booted instead")),
        "{notes:?}"
    );
    assert!(
        s.out().join("logs/vm.console.restore.log").exists(),
        "the failed restore's console is not kept"
    );
    // The boot saves a good snapshot again. A boot that had to be retried (a guest kernel
    // that crashed under TCG, rare but seen) is not an ordinary boot and is never saved:
    // then the next run, finding no snapshot, boots and saves it.
    let retried = notes.iter().any(|n| n.contains("booted once more"));
    let again = retried.then(|| roce_basics_passes("snap-bad-again"));
    let saver = again
        .as_ref()
        .map_or(notes.clone(), |a| notes_of(&a.evidence()));
    assert!(
        saver
            .iter()
            .any(|n| n.contains("saved as the booted-guest snapshot")),
        "the boot did not save a new snapshot (retried: {retried}): {saver:?}"
    );
    let head = std::fs::read(&snap).unwrap();
    assert_eq!(&head[..4], b"QEVM");
    assert_ne!(
        &head[4..68],
        &[0xff; 64][..],
        "the damaged snapshot was not replaced"
    );
    assert_no_vm_left(&s, e["run_id"].as_str().unwrap());
    if let Some(a) = again {
        assert_no_vm_left(&a, a.evidence()["run_id"].as_str().unwrap());
    }
}
