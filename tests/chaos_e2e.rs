//! Signals at awkward moments: Ctrl-C or SIGTERM in the first moments of `iblab up`,
//! before it has planned or created anything, must still stop the run (exit 130, after
//! teardown), leave nothing behind, and leave no child of iblab unreaped.
//! Needs root (the local backend creates namespaces); the lab runs `sleep` in them.

mod common;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::rng::Rng;
use common::*;
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, kill};
use nix::unistd::Pid;

/// Six seconds of steps: a run that ends before that was stopped.
const LAB: &str = "tests/labs/slow-steps.yaml";

/// What the process inherits for SIGINT and SIGTERM from whoever started it.
#[derive(Clone, Copy, Debug)]
enum Inherited {
    /// The default disposition, unblocked (a terminal).
    Default,
    /// Blocked: a signal sent now stays pending until iblab unblocks it.
    Blocked,
    /// SIGINT ignored, as a shell script's background job (`iblab up … &`) starts.
    IgnoredInt,
}

fn spawn_up(s: &Scratch, inherited: Inherited) -> Child {
    let mut c = s.cmd(&["up", LAB]);
    c.arg("--out")
        .arg(s.out())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls (sigprocmask, signal) between fork and exec.
    unsafe {
        c.pre_exec(move || {
            // The test runner's own dispositions are not the case under test: a runner
            // started as a background job of a script (`bash .ci/run &`) has SIGINT
            // ignored, and every child would inherit that.
            nix::sys::signal::signal(Signal::SIGINT, SigHandler::SigDfl)?;
            nix::sys::signal::signal(Signal::SIGTERM, SigHandler::SigDfl)?;
            let mut ours = SigSet::empty();
            ours.add(Signal::SIGINT);
            ours.add(Signal::SIGTERM);
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&ours), None)?;
            match inherited {
                Inherited::Default => {}
                Inherited::Blocked => {
                    let mut set = SigSet::empty();
                    set.add(Signal::SIGINT);
                    set.add(Signal::SIGTERM);
                    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
                }
                Inherited::IgnoredInt => {
                    nix::sys::signal::signal(Signal::SIGINT, SigHandler::SigIgn)?;
                }
            }
            Ok(())
        });
    }
    c.spawn().unwrap()
}

/// Does the process catch SIGINT now (its handler is installed)?
fn catches_sigint(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("SigCgt:"))
                .and_then(|l| u64::from_str_radix(l[7..].trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (Signal::SIGINT as u64 - 1)) != 0)
}

fn wait_for(child: &mut Child, limit: Duration) -> (ExitStatus, String) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return (st, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("iblab did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The run id, if the run got far enough to write its evidence.
fn run_id(s: &Scratch) -> Option<String> {
    let text = std::fs::read_to_string(s.out().join("evidence.json")).ok()?;
    let e: serde_json::Value = serde_json::from_str(&text).ok()?;
    e["run_id"].as_str().map(String::from)
}

/// After an interrupted run: 130, the evidence (when a run folder was made) says
/// interrupted and that no step ran to its end, nothing of the run is left, and iblab
/// reaped every child it had (none was handed to this test, its subreaper, at its exit).
fn assert_stopped(s: &Scratch, what: &str, status: ExitStatus, err: &str, took: Duration) {
    assert_eq!(
        status.code(),
        Some(130),
        "{what}: expected exit 130 after {took:?}, got {status:?}\n{err}"
    );
    assert!(
        took < Duration::from_secs(5),
        "{what}: the run went on for {took:?} (its steps take 6 s)\n{err}"
    );
    if let Some(id) = run_id(s) {
        let e = s.evidence();
        assert_eq!(e["verdict"], "interrupted", "{what}");
        let finished: Vec<&serde_json::Value> = e["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|st| st["verdict"] == "pass")
            .collect();
        assert!(finished.is_empty(), "{what}: steps ran: {finished:?}");
        assert_nothing_left(s, &id);
    } else {
        assert!(
            err.contains("interrupted before the run started"),
            "{what}: {err}"
        );
        assert!(!s.out().exists(), "{what}: a run folder without evidence");
    }
    let states: Vec<_> = std::fs::read_dir(s.state())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(states.is_empty(), "{what}: state files left: {states:?}");
    let orphans = orphans_of_this_test(&[]);
    assert!(
        orphans.is_empty(),
        "{what}: iblab exited leaving children it did not reap (pid, name, state): {orphans:?}"
    );
}

/// A signal that arrives before iblab listens for it is not lost: here SIGINT (then
/// SIGTERM) is sent the moment iblab is started, with the signal blocked, as a parent's
/// mask may leave it; it must stop the run before anything is provisioned.
#[test]
fn a_signal_sent_before_iblab_listens_still_stops_the_run() {
    let Some(_g) = begin(root) else {
        return;
    };
    become_subreaper();
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let s = Scratch::new(&format!("early-{}", sig.as_str().to_lowercase()));
        let t = Instant::now();
        let mut child = spawn_up(&s, Inherited::Blocked);
        kill(Pid::from_raw(child.id() as i32), sig).unwrap();
        let (status, err) = wait_for(&mut child, Duration::from_secs(30));
        assert_stopped(&s, sig.as_str(), status, &err, t.elapsed());
    }
}

/// Ctrl-C at several moments of the first half second: once iblab listens (from its
/// first milliseconds) the run stops with 130 and leaves nothing. Before that, only the
/// default action can end it, which happens before it has created anything.
#[test]
fn ctrl_c_in_the_first_moments_stops_the_run_and_leaves_nothing() {
    let Some(_g) = begin(root) else {
        return;
    };
    become_subreaper();
    let moments = [0u64, 5, 15, 30, 60, 120, 250, 500];
    let starts = [Inherited::Default, Inherited::IgnoredInt];
    let mut listened = 0;
    for inherited in starts {
        for ms in moments {
            let what = format!("{inherited:?} start, SIGINT at {ms} ms");
            let s = Scratch::new(&format!("moment-{inherited:?}-{ms}").to_lowercase());
            let t = Instant::now();
            let mut child = spawn_up(&s, inherited);
            std::thread::sleep(Duration::from_millis(ms).saturating_sub(t.elapsed()));
            let listening = catches_sigint(child.id());
            kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
            let (status, err) = wait_for(&mut child, Duration::from_secs(30));
            let took = t.elapsed();
            if listening {
                listened += 1;
                assert_stopped(&s, &what, status, &err, took);
                continue;
            }
            // Not listening when the signal was sent: iblab's first milliseconds, before
            // main. Either it began to listen before the signal landed (then as above),
            // or the inherited disposition acted: the default action ends it before it
            // created anything; an ignored signal is lost and the run goes to its end.
            if status.code() == Some(130) {
                assert_stopped(&s, &what, status, &err, took);
                continue;
            }
            eprintln!("{what}: iblab was not listening yet: {status:?} after {took:?}");
            match inherited {
                Inherited::Default => assert_eq!(status.signal(), Some(2), "{what}: {err}"),
                _ => assert_eq!(status.code(), Some(0), "{what}: {err}"),
            }
            if let Some(id) = run_id(&s) {
                assert_nothing_left(&s, &id);
            }
            let orphans = orphans_of_this_test(&[]);
            assert!(
                orphans.is_empty(),
                "{what}: children not reaped: {orphans:?}"
            );
        }
    }
    assert!(
        listened >= moments.len(),
        "iblab listened for SIGINT at only {listened} of {} moments",
        2 * moments.len()
    );
}

/// The same lab, left alone, runs its steps to their end: the runs above were stopped,
/// not finished.
#[test]
fn the_lab_runs_for_seconds_when_left_alone() {
    let Some(_g) = begin(root) else {
        return;
    };
    let s = Scratch::new("alone");
    let t = Instant::now();
    let mut child = spawn_up(&s, Inherited::Default);
    let (status, err) = wait_for(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(t.elapsed() > Duration::from_secs(5), "{:?}", t.elapsed());
}

// ---------------------------------------------------------------------------------------
// Seeded cases: a signal in a step, in a `finally` step, and in teardown.

/// The seed of this run of the suite: `IBLAB_CHAOS_SEED` to replay one, else the clock.
/// Printed, so a failure names the seed that replays it.
fn chaos_seed(what: &str) -> u64 {
    let seed = std::env::var("IBLAB_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{what}: seed {seed} (replay with IBLAB_CHAOS_SEED={seed})");
    seed
}

/// How many seeded cases to run: `IBLAB_CHAOS_CASES`, else `default` (CI's bound).
fn chaos_cases(default: usize) -> usize {
    std::env::var("IBLAB_CHAOS_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

const PHASES_LAB: &str = "tests/labs/chaos-phases.yaml";

/// Where in the run a seeded case sends its signal.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// This long after `up` started: provisioning or the step `work` (1.5 s).
    After(Duration),
    /// This long into the `finally` step `tidy` (2.5 s).
    InFinally(Duration),
    /// The moment teardown begins: it kills the subnet's ibsim (an ib lab, so that
    /// teardown has processes to stop before its namespaces), then five more.
    InTeardown,
}

fn spawn_phases(s: &Scratch, lab: &str) -> Child {
    let mut c = s.cmd(&["up", lab]);
    c.arg("--out")
        .arg(s.out())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// The run id, read from the state file as soon as the run has written it.
fn run_id_live(s: &Scratch, child: &mut Child) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        let found = std::fs::read_dir(s.state()).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "json"))
        });
        if let Some(p) = found
            && let Ok(text) = std::fs::read_to_string(&p)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
            && let Some(id) = v["run_id"].as_str()
        {
            return Some(id.to_string());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// A live process of this test's runs whose command line holds `word`.
fn tagged_process(s: &Scratch, name: &str, word: &str) -> Option<u32> {
    processes_named(name, &s.tag()).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|a| a == word.as_bytes()))
            .unwrap_or(false)
    })
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// One seeded case: start the lab, send `sig` at `moment`, and check what every
/// interrupted run must show: 130, the phase named in the notes, nothing left.
fn signal_case(case: &str, sig: Signal, moment: Moment) {
    let s = Scratch::new(&format!("chaos-{case}"));
    let what = format!("case {case}: {sig} {moment:?}");
    let t = Instant::now();
    let lab = match moment {
        Moment::InTeardown => "tests/labs/ib-chaos.yaml",
        _ => PHASES_LAB,
    };
    let mut child = spawn_phases(&s, lab);
    let pid = Pid::from_raw(child.id() as i32);
    let id = run_id_live(&s, &mut child);
    let run = id.clone().unwrap_or_default();
    match moment {
        Moment::After(d) => {
            std::thread::sleep(d.saturating_sub(t.elapsed()));
            kill(pid, sig).unwrap();
        }
        Moment::InFinally(d) => {
            assert!(
                wait_until(Duration::from_secs(20), || tagged_process(
                    &s, "sleep", "2.5"
                )
                .is_some()),
                "{what}: the finally step never started"
            );
            std::thread::sleep(d);
            kill(pid, sig).unwrap();
        }
        Moment::InTeardown => {
            assert!(!run.is_empty(), "{what}: no run id");
            let mut ibsim = None;
            let up = wait_until(Duration::from_secs(30), || {
                ibsim = processes_named("ibsim", &s.tag()).first().copied();
                ibsim.is_some()
            });
            assert!(up, "{what}: ibsim never ran");
            // Spin (no sleep): ibsim killed (a zombie until iblab reaps it, or gone) is
            // teardown under way; the steps never stop it.
            let stat = format!("/proc/{}/stat", ibsim.unwrap());
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                let state = std::fs::read_to_string(&stat).ok().and_then(|t| {
                    t.rsplit_once(')')
                        .and_then(|x| x.1.trim_start().chars().next())
                });
                if matches!(state, None | Some('Z') | Some('X')) {
                    break;
                }
            }
            kill(pid, sig).unwrap();
            // More of the same while it tears down: none may cut teardown short.
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(1));
                let _ = kill(pid, sig);
            }
        }
    }
    let (status, err) = wait_for(&mut child, Duration::from_secs(60));
    let took = t.elapsed();
    assert_eq!(
        status.code(),
        Some(130),
        "{what}: expected 130 after {took:?}, got {status:?}\n{err}"
    );
    match run_id(&s) {
        Some(id) => {
            let e = s.evidence();
            assert_eq!(e["verdict"], "interrupted", "{what}");
            let notes: Vec<&str> = e["notes"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|n| n.as_str())
                .filter(|n| n.starts_with("interrupted"))
                .collect();
            assert_eq!(notes.len(), 1, "{what}: {notes:?}");
            let phase = notes[0];
            match moment {
                Moment::After(_) => {
                    assert!(phase.contains("before the steps ended"), "{what}: {phase}");
                    assert_ne!(step(&e, "work")["verdict"], "pass", "{what}");
                    assert_eq!(step(&e, "tidy")["verdict"], "skipped", "{what}");
                }
                Moment::InFinally(_) => {
                    assert!(
                        phase.contains("during the finally steps"),
                        "{what}: {phase}"
                    );
                    assert_eq!(step(&e, "work")["verdict"], "pass", "{what}");
                    assert_eq!(step(&e, "tidy")["reason"], "interrupted", "{what}");
                }
                Moment::InTeardown => {
                    assert!(phase.contains("during teardown"), "{what}: {phase}");
                    let last = path_step(&e, "send", "ib");
                    assert_eq!(last["verdict"], "pass", "{what}: every step ran: {last}");
                }
            }
            eprintln!("{what}: exit 130 after {took:?}, {phase}");
            assert_nothing_left(&s, &id);
        }
        None => {
            assert!(
                err.contains("interrupted before the run started"),
                "{what}: {err}"
            );
            if !run.is_empty() {
                assert!(namespaces_of(&run).is_empty(), "{what}: namespaces left");
            }
        }
    }
    assert_eq!(
        processes_left("sleep", &s.tag()),
        Vec::<u32>::new(),
        "{what}: a step's process left running"
    );
    let states: Vec<_> = std::fs::read_dir(s.state())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(states.is_empty(), "{what}: state files left: {states:?}");
    let orphans = orphans_of_this_test(&[]);
    assert!(
        orphans.is_empty(),
        "{what}: children not reaped: {orphans:?}"
    );
}

/// SIGINT or SIGTERM in the step, in the `finally` step and in teardown, at moments drawn
/// from a printed seed: every run ends 130, names where the signal came, and leaves
/// nothing. A signal in teardown does not cut it short (the finally step had run; every
/// namespace still goes). CI runs the three kinds of moment twice; `IBLAB_CHAOS_CASES=N`
/// runs N, `IBLAB_CHAOS_SEED=S` replays a seed.
#[test]
fn signals_in_a_step_a_finally_step_and_teardown_end_130_and_leave_nothing() {
    let Some(_g) = begin(|| root() && ib_tools()) else {
        return;
    };
    become_subreaper();
    let seed = chaos_seed("signals");
    let mut rng = Rng(seed);
    for n in 0..chaos_cases(6) {
        let sig = if rng.below(2) == 0 {
            Signal::SIGINT
        } else {
            Signal::SIGTERM
        };
        let moment = match n % 3 {
            0 => Moment::After(Duration::from_millis(rng.below(1400) as u64)),
            1 => Moment::InFinally(Duration::from_millis(rng.below(2000) as u64)),
            _ => Moment::InTeardown,
        };
        signal_case(&format!("{seed}-{n}"), sig, moment);
    }
}

// ---------------------------------------------------------------------------------------
// Things killed or filled under a run.

/// Start `lab` with its run folder at `out`; output collected.
fn spawn_lab(s: &Scratch, lab: &str, out: &std::path::Path) -> Child {
    let mut c = s.cmd(&["up", lab]);
    c.arg("--out")
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// Wait for `child`, returning its status, stdout and stderr.
fn finish(child: Child, limit: Duration) -> (ExitStatus, String, String) {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(out)) => (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        _ => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            panic!("iblab did not exit within {limit:?}");
        }
    }
}

fn ib_tools() -> bool {
    let absent: Vec<&str> = ["ibsim", "opensm", "smpquery"]
        .into_iter()
        .filter(|t| !installed(t))
        .collect();
    if absent.is_empty() {
        return true;
    }
    missing(&format!(
        "{} not installed (ibsim-utils, opensm, infiniband-diags; bash .ci/run installs them)",
        absent.join(", ")
    ));
    false
}

/// opensm, then ibsim, killed (SIGKILL, from outside) while an ib lab pauses: the next
/// step that needs it fails at once and says what ended (no diagnostic left to wait out
/// its deadline), the steps after it are not run, the run exits 1 (a step failed), and
/// nothing of it is left: the dead process's siblings are stopped, namespaces removed.
#[test]
fn opensm_or_ibsim_killed_mid_run_fails_the_steps_that_need_them() {
    let Some(_g) = begin(|| root() && ib_tools()) else {
        return;
    };
    become_subreaper();
    for (victim, says) in [
        (
            "opensm",
            "subnet manager `sm` (killed by a signal) ended during the run",
        ),
        ("ibsim", "ibsim (the emulated subnet) is no longer running"),
    ] {
        let s = Scratch::new(&format!("kill-{victim}"));
        let t = Instant::now();
        let child = spawn_lab(&s, "tests/labs/ib-chaos.yaml", &s.out());
        // The `pause` step (`sleep 3`): the SM has answered the probe before it.
        let found = wait_until(Duration::from_secs(60), || {
            tagged_process(&s, "sleep", "3").is_some()
        });
        assert!(found, "the run never reached its pause");
        std::thread::sleep(Duration::from_millis(300));
        for pid in processes_named(victim, &s.tag()) {
            kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
        }
        let (status, out, err) = finish(child, Duration::from_secs(60));
        let took = t.elapsed();
        assert_eq!(status.code(), Some(1), "{victim}: {out}\n{err}");
        let e = s.evidence();
        assert_eq!(step(&e, "before")["verdict"], "pass", "{victim}");
        let after = step(&e, "after");
        assert_eq!(after["verdict"], "fail", "{victim}: {after}");
        let reason = after["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(says), "{victim}: {reason}");
        assert!(
            after["duration_s"].as_f64().unwrap() < 1.0,
            "{victim}: the failing step waited: {after}"
        );
        let send = path_step(&e, "send", "ib");
        assert_eq!(send["verdict"], "skipped", "{victim}: {send}");
        assert!(took < Duration::from_secs(20), "{victim}: took {took:?}");
        eprintln!("{victim} killed: exit 1 after {took:?}; `after`: {reason}");
        assert_nothing_left(&s, e["run_id"].as_str().unwrap());
        let orphans = orphans_of_this_test(&[]);
        assert!(
            orphans.is_empty(),
            "{victim}: children not reaped: {orphans:?}"
        );
    }
}

/// The run folder on a 64 KiB tmpfs that a step's output fills: iblab says that it cannot
/// write the evidence and why, still prints what the run saw, exits 3 (environment),
/// leaves no truncated evidence file, and tears the lab down (nothing left).
#[test]
fn a_full_run_folder_is_reported_and_the_lab_is_still_torn_down() {
    let Some(_g) = begin(root) else {
        return;
    };
    become_subreaper();
    let s = Scratch::new("disk-full");
    let disk = s.dir.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(mounted.success(), "cannot mount a tmpfs");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(disk.clone());
    let out = disk.join("run");
    let mut child = spawn_lab(&s, "tests/labs/big-output.yaml", &out);
    let id = run_id_live(&s, &mut child).expect("the run never started");
    let (status, stdout, err) = finish(child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{stdout}\n{err}");
    assert!(
        err.contains("cannot write the evidence") && err.contains("No space left on device"),
        "{err}"
    );
    assert!(err.contains("torn down"), "{err}");
    // What the run saw is still printed.
    assert!(stdout.contains("second"), "{stdout}");
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "logs")
        .collect();
    assert!(left.is_empty(), "partial files in the run folder: {left:?}");
    assert_nothing_left(&s, &id);
    let orphans = orphans_of_this_test(&[]);
    assert!(orphans.is_empty(), "children not reaped: {orphans:?}");
}

/// The receiving side of a transfer killed (it vanished), then stopped (it hangs), in the
/// middle of the step: the step ends with a reason that names the peer, a stopped peer by
/// the step's own deadline (8 s) rather than iblab's outer one, exit 1, nothing left.
#[test]
fn a_traffic_peer_that_vanishes_mid_step_ends_the_step_with_a_clear_error() {
    let iperf3 = || {
        installed("iperf3") || {
            missing("iperf3 (apt-get install iperf3; bash .ci/run installs it)");
            false
        }
    };
    let Some(_g) = begin(|| root() && iperf3()) else {
        return;
    };
    become_subreaper();
    for (sig, says, within) in [
        (
            Signal::SIGKILL,
            "the iperf3 server on a ended during the transfer (killed by a signal)",
            Duration::from_secs(6),
        ),
        (
            Signal::SIGSTOP,
            "did not finish within 8s and was stopped at the step's deadline; the iperf3 server on a was stopped",
            Duration::from_secs(11),
        ),
    ] {
        let s = Scratch::new(&format!("peer-{}", sig.as_str().to_lowercase()));
        let t = Instant::now();
        let child = spawn_lab(&s, "tests/labs/vanishing-peer.yaml", &s.out());
        let mut server = None;
        assert!(
            wait_until(Duration::from_secs(20), || {
                server = tagged_process(&s, "iperf3", "-s");
                server.is_some()
            }),
            "{sig}: the server never started"
        );
        // Let the transfer get going, then take its receiver away.
        std::thread::sleep(Duration::from_millis(1500));
        kill(Pid::from_raw(server.unwrap() as i32), sig).unwrap();
        let (status, out, err) = finish(child, Duration::from_secs(60));
        let took = t.elapsed();
        assert_eq!(status.code(), Some(1), "{sig}: {out}\n{err}");
        let e = s.evidence();
        let send = path_step(&e, "send", "tcp");
        assert_eq!(send["verdict"], "fail", "{sig}: {send}");
        let reason = send["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(says), "{sig}: {reason}");
        assert!(took < within, "{sig}: the step took {took:?}: {reason}");
        eprintln!("iperf3 server {sig}: exit 1 after {took:?}: {reason}");
        assert_nothing_left(&s, e["run_id"].as_str().unwrap());
        let orphans = orphans_of_this_test(&[]);
        assert!(
            orphans.is_empty(),
            "{sig}: children not reaped: {orphans:?}"
        );
    }
}

/// ibsim killed at several moments of setup (as it starts, while opensm starts and takes
/// its role, during the first sweep): setup fails at once (not after its 15 s or 20 s
/// waits) as an environment error, exit 3, saying that ibsim ended; or, if the kill landed
/// after setup, the first step fails naming it (exit 1). Nothing of the run is left.
#[test]
fn ibsim_killed_during_setup_is_an_environment_error_at_once() {
    let Some(_g) = begin(|| root() && ib_tools()) else {
        return;
    };
    become_subreaper();
    for delay in [0u64, 40, 120] {
        let s = Scratch::new(&format!("kill-ibsim-setup-{delay}"));
        let t = Instant::now();
        let child = spawn_lab(&s, "tests/labs/ib-chaos.yaml", &s.out());
        let mut victim = None;
        let found = wait_until(Duration::from_secs(60), || {
            victim = processes_named("ibsim", &s.tag()).first().copied();
            victim.is_some()
        });
        assert!(found, "ibsim never ran");
        std::thread::sleep(Duration::from_millis(delay));
        kill(Pid::from_raw(victim.unwrap() as i32), Signal::SIGKILL).unwrap();
        let (status, out, err) = finish(child, Duration::from_secs(60));
        let took = t.elapsed();
        let e = s.evidence();
        match status.code() {
            Some(3) => {
                assert!(out.contains("ibsim"), "{delay} ms: {out}");
                assert!(
                    took < Duration::from_secs(8),
                    "{delay} ms: setup waited {took:?}\n{out}"
                );
            }
            Some(1) => {
                // The kill landed after setup: the first step that failed names ibsim.
                let failed = e["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|st| st["verdict"] == "fail")
                    .cloned()
                    .unwrap_or_default();
                let why = failed["reason"].as_str().unwrap_or_default();
                assert!(why.contains("ibsim"), "{delay} ms: {failed}");
            }
            other => panic!("{delay} ms: exit {other:?}\n{out}\n{err}"),
        }
        eprintln!(
            "ibsim killed {delay} ms after it started: exit {:?} after {took:?}: {}",
            status.code(),
            e["notes"]
        );
        assert_nothing_left(&s, e["run_id"].as_str().unwrap());
        let orphans = orphans_of_this_test(&[]);
        assert!(orphans.is_empty(), "children not reaped: {orphans:?}");
    }
}
