//! End-to-end tests of the docker backend against a real engine: the tcp-loss lab gives the
//! same verdicts in containers as on the local backend; a container killed mid-run gives
//! exit 3 and a clean teardown; `down --all` finds containers by label when their state
//! file is gone; SIGINT in a finally step and SIGTERM in teardown end 130; opensm killed
//! mid-run fails the SM probe. Each checks that nothing of its runs remains. Skipped, with
//! the reason printed, without root or a Docker engine (start one with `.ci/dockerd-start`).
//!
//! They use the quick lab image (this host's tools, <1 s to build) under their own tag;
//! set IBLAB_E2E_DEBOOTSTRAP=1 to also run the lab on the full debootstrap image.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptions, ListNetworksOptions, ListVolumesOptions};
use serde_json::Value;

mod common;
use common::serial;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");
const QUICK_IMAGE: &str = "iblab/lab:e2e-host";
static QUICK_BUILT: OnceLock<Result<(), String>> = OnceLock::new();

/// One runtime for the whole binary: the engine client keeps its connections in a pool
/// driven by the runtime that opened them, which a runtime per call would drop.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
    .block_on(f)
}

fn docker() -> Option<Docker> {
    let d = Docker::connect_with_local_defaults().ok()?;
    block_on(d.ping()).ok()?;
    Some(d)
}

/// Root, an engine, and the quick image; `None` (after printing why) means skip.
fn ready(test: &str) -> Option<Docker> {
    if common::nix_euid() != 0 {
        common::missing(&format!(
            "{test}: root (the docker backend's links are veths made from the host)"
        ));
        return None;
    }
    let Some(d) = docker() else {
        common::missing(&format!(
            "{test}: a Docker engine answering at /var/run/docker.sock (start one with `sudo .ci/dockerd-start`)"
        ));
        return None;
    };
    let built = QUICK_BUILT.get_or_init(|| {
        let out = Command::new(BIN)
            .args(["image", "build", "--from", "host"])
            .env("IBLAB_IMAGE", QUICK_IMAGE)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    if let Err(e) = built {
        panic!("iblab image build --from host failed: {e}");
    }
    Some(d)
}

/// A scratch folder with its own state directory; removes its runs when dropped.
struct Scratch {
    dir: PathBuf,
    image: String,
}

impl Scratch {
    fn new(tag: &str, image: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("iblab-docker-e2e-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        Scratch {
            dir,
            image: image.to_string(),
        }
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
            .args(["--color", "never"])
            .env("IBLAB_STATE_DIR", self.state())
            .env("IBLAB_IMAGE", &self.image);
        c
    }
    fn up(&self, args: &[&str]) -> Output {
        let mut all = vec!["up"];
        all.extend_from_slice(args);
        let mut c = self.cmd(&all);
        c.arg("--out").arg(self.out());
        c.output().expect("iblab runs")
    }
    fn evidence(&self) -> Value {
        let text =
            std::fs::read_to_string(self.out().join("evidence.json")).expect("evidence.json");
        serde_json::from_str(&text).expect("evidence.json is JSON")
    }
    /// Run ids with a state file now.
    fn live_runs(&self) -> Vec<String> {
        std::fs::read_dir(self.state())
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Whatever happened, remove this test's runs (only these: other labs may be up on
        // this machine, so no `down --all` here).
        for run in self.live_runs() {
            let _ = self.cmd(&["down", &run]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run_filter(run: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), vec![format!("iblab.run={run}")])])
}

fn containers_of(d: &Docker, run: &str) -> Vec<String> {
    block_on(d.list_containers(Some(ListContainersOptions {
        all: true,
        filters: Some(run_filter(run)),
        ..Default::default()
    })))
    .expect("list containers")
    .into_iter()
    .flat_map(|c| c.names.unwrap_or_default())
    .collect()
}

/// Nothing of `run` remains: no container, network or volume with its label, no namespace
/// with its prefix, no state file.
fn assert_nothing_left(d: &Docker, s: &Scratch, run: &str) {
    assert_eq!(
        containers_of(d, run),
        Vec::<String>::new(),
        "containers left"
    );
    let nets = block_on(d.list_networks(Some(ListNetworksOptions {
        filters: Some(run_filter(run)),
    })))
    .expect("list networks");
    assert!(nets.is_empty(), "networks left: {nets:?}");
    let vols = block_on(d.list_volumes(Some(ListVolumesOptions {
        filters: Some(run_filter(run)),
    })))
    .expect("list volumes");
    assert!(vols.volumes.unwrap_or_default().is_empty(), "volumes left");
    let prefix = format!("iblab-{run}-");
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(netns.is_empty(), "namespaces left: {netns:?}");
    assert!(!s.live_runs().contains(&run.to_string()), "state file left");
}

/// (id, verdict) of every step instance and expectation.
type Verdicts = Vec<(String, String)>;

fn verdicts(e: &Value) -> (Verdicts, Verdicts) {
    let pairs = |key: &str| {
        e[key]
            .as_array()
            .expect("an array")
            .iter()
            .map(|x| {
                let id = format!(
                    "{}{}",
                    x["id"].as_str().unwrap_or(""),
                    x["path"]
                        .as_str()
                        .map(|p| format!(".{p}"))
                        .unwrap_or_default()
                );
                (id, x["verdict"].as_str().unwrap_or("").to_string())
            })
            .collect::<Vec<_>>()
    };
    (pairs("steps"), pairs("expectations"))
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn tcp_loss_gives_the_same_verdicts_in_containers_as_on_local() {
    let Some((_serial, d)) =
        serial(|| ready("tcp_loss_gives_the_same_verdicts_in_containers_as_on_local"))
    else {
        return;
    };
    // The reference run, on the local backend.
    let local = Scratch::new("local", QUICK_IMAGE);
    let lo = local.up(&["tcp-loss", "--backend", "local"]);
    assert_eq!(lo.status.code(), Some(0), "{}", text(&lo));
    let in_docker = Scratch::new("docker", QUICK_IMAGE);
    let t = Instant::now();
    let dk = in_docker.up(&["tcp-loss", "--backend", "docker"]);
    eprintln!("tcp-loss on docker: {:.1}s", t.elapsed().as_secs_f64());
    assert_eq!(dk.status.code(), Some(0), "{}", text(&dk));

    let (le, de) = (local.evidence(), in_docker.evidence());
    assert_eq!(de["backend"], "docker");
    assert_eq!(verdicts(&le), verdicts(&de), "local and docker disagree");
    assert!(
        de["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == "loss_off"
                && s["metrics"]["dropped_packets"]["value"].as_f64() > Some(0.0)),
        "the nftables loss (sent over exec stdin) dropped nothing"
    );
    // Both tools' host counters, sampled from the host while the engine runs them, cover
    // the transfer: the receiver read what the sender wrote, a syscall per piece.
    for e in [&le, &de] {
        let clean = common::step(e, "clean");
        for side in ["sender", "receiver"] {
            let phase = clean["metrics"][format!("{side}_data_phase_s")]["value"].as_f64();
            assert!(
                phase > Some(1.0),
                "{side}: no data phase on {}: {clean}",
                e["backend"]
            );
        }
        let reads = clean["metrics"]["receiver_read_syscalls_per_mib"]["value"].as_f64();
        assert!(
            reads >= Some(1.0),
            "{}: receiver reads {reads:?}",
            e["backend"]
        );
    }
    for (s, e) in [(&local, &le), (&in_docker, &de)] {
        let run = e["run_id"].as_str().expect("a run id");
        assert_nothing_left(&d, s, run);
    }
}

#[test]
fn a_container_killed_mid_run_gives_exit_3_and_a_clean_teardown() {
    let Some((_serial, d)) =
        serial(|| ready("a_container_killed_mid_run_gives_exit_3_and_a_clean_teardown"))
    else {
        return;
    };
    let s = Scratch::new("killed", QUICK_IMAGE);
    let mut child = s
        .cmd(&["up", "tcp-loss", "--backend", "docker"])
        .arg("--out")
        .arg(s.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iblab starts");
    // Wait for the lab to be up, then for the first measurement to be under way.
    let deadline = Instant::now() + Duration::from_secs(30);
    let run = loop {
        if let Some(run) = s.live_runs().first().cloned()
            && containers_of(&d, &run).len() == 3
        {
            break run;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the lab did not come up within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(1500));
    block_on(d.kill_container(
        &format!("iblab-{run}-a"),
        None::<bollard::query_parameters::KillContainerOptions>,
    ))
    .expect("kill container a");
    let out = child.wait_with_output().expect("iblab finishes");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let e = s.evidence();
    assert_eq!(e["verdict"], "error");
    let notes = e["notes"].to_string();
    assert!(notes.contains("stopped during the run"), "{notes}");
    assert_nothing_left(&d, &s, &run);
}

#[test]
fn down_all_removes_containers_whose_state_file_is_gone() {
    let Some((_serial, d)) =
        serial(|| ready("down_all_removes_containers_whose_state_file_is_gone"))
    else {
        return;
    };
    let s = Scratch::new("sweep", QUICK_IMAGE);
    let kept = s.up(&["tcp-loss", "--backend", "docker", "--keep"]);
    assert_eq!(kept.status.code(), Some(0), "{}", text(&kept));
    let run = s.evidence()["run_id"]
        .as_str()
        .expect("a run id")
        .to_string();
    assert_eq!(containers_of(&d, &run).len(), 3, "--keep left the lab up");
    // The way in is the engine's exec: output and exit code pass through.
    let ip = Command::new(BIN)
        .args(["exec", &run, "a", "--", "ip", "-br", "addr", "show", "eth0"])
        .env("IBLAB_STATE_DIR", s.state())
        .output()
        .expect("iblab exec runs");
    assert_eq!(ip.status.code(), Some(0), "{}", text(&ip));
    assert!(
        String::from_utf8_lossy(&ip.stdout).contains("198.18.0."),
        "{}",
        text(&ip)
    );
    let code = Command::new(BIN)
        .args(["exec", &run, "b", "--", "sh", "-c", "exit 5"])
        .env("IBLAB_STATE_DIR", s.state())
        .output()
        .expect("iblab exec runs");
    assert_eq!(code.status.code(), Some(5), "{}", text(&code));
    // A crash: the state file is lost, the containers are not.
    std::fs::remove_file(s.state().join(format!("{run}.json"))).expect("state file");
    // `down --all` also deletes every iblab namespace on the host; other labs may be up on
    // this machine, so hide /run/netns from it in a mount namespace of its own.
    let mut down = if std::path::Path::new("/run/netns").exists() {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tmpfs iblab-e2e /run/netns && exec \"$0\" down --all")
            .arg(BIN);
        c
    } else {
        let mut c = Command::new(BIN);
        c.args(["down", "--all"]);
        c
    };
    let out = down
        .env("IBLAB_STATE_DIR", s.state())
        .output()
        .expect("down --all runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let swept = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("removed container ") && l.contains(&run))
        .count();
    assert_eq!(swept, 3, "{}", text(&out));
    assert_nothing_left(&d, &s, &run);
}

/// `down --all` run with another state folder while a docker run is live: that run's
/// containers are spared (its owner is alive), and the run goes on to pass.
#[test]
fn down_all_spares_a_live_run_of_another_state_folder() {
    let Some((_serial, d)) = serial(|| ready("down_all_spares_a_live_run_of_another_state_folder"))
    else {
        return;
    };
    let live = Scratch::new("live", QUICK_IMAGE);
    let other = Scratch::new("other", QUICK_IMAGE);
    let mut child = live
        .cmd(&["up", "tcp-loss", "--backend", "docker"])
        .arg("--out")
        .arg(live.out())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iblab starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let run = loop {
        if let Some(run) = live.live_runs().pop()
            && containers_of(&d, &run).len() == 3
        {
            break run;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the run ended before its containers were seen: {st}");
        }
        assert!(Instant::now() < deadline, "no containers within 120 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Hide /run/netns from `down --all` (other labs may be up on this machine).
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mkdir -p /run/netns && mount -t tmpfs iblab-e2e /run/netns && exec \"$0\" down --all")
        .arg(BIN)
        .env("IBLAB_STATE_DIR", other.state())
        .output()
        .expect("down --all runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let still_running = child.try_wait().expect("wait").is_none();
    let left = containers_of(&d, &run).len();
    let status = child.wait().expect("the run ends");
    assert!(
        still_running,
        "the run ended before down --all could be tried on it; rerun"
    );
    assert_eq!(
        left,
        3,
        "down --all removed a live run's containers: {}",
        text(&out)
    );
    assert_eq!(
        status.code(),
        Some(0),
        "the live run failed after down --all"
    );
    assert_nothing_left(&d, &live, &run);
}

#[test]
fn tcp_loss_on_the_debootstrap_image() {
    // Opt-in on a workstation; in CI every end-to-end test runs.
    if std::env::var_os("IBLAB_E2E_DEBOOTSTRAP").is_none() && !common::in_ci() {
        eprintln!(
            "SKIPPED tcp_loss_on_the_debootstrap_image: set IBLAB_E2E_DEBOOTSTRAP=1 (debootstrap takes ~45 s cold, ~5 s with its cache)"
        );
        return;
    }
    let Some((_serial, d)) = serial(|| ready("tcp_loss_on_the_debootstrap_image")) else {
        return;
    };
    let image = format!("iblab/lab:{}", env!("CARGO_PKG_VERSION"));
    let s = Scratch::new("debootstrap", &image);
    let built = s
        .cmd(&["image", "build"])
        .output()
        .expect("image build runs");
    assert_eq!(built.status.code(), Some(0), "{}", text(&built));
    let out = s.up(&["tcp-loss", "--backend", "docker"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let run = s.evidence()["run_id"]
        .as_str()
        .expect("a run id")
        .to_string();
    assert_nothing_left(&d, &s, &run);
}

#[test]
fn lesson4_gives_the_same_verdicts_in_containers_as_on_local() {
    let Some((_serial, d)) =
        serial(|| ready("lesson4_gives_the_same_verdicts_in_containers_as_on_local"))
    else {
        return;
    };
    if !std::path::Path::new("/usr/bin/ibsim").exists() {
        common::missing("ibsim is not installed (ibsim-utils; bash .ci/run installs it)");
        return;
    }
    for scenario in ["default", "sm-off"] {
        let local = Scratch::new(&format!("l4-local-{scenario}"), QUICK_IMAGE);
        let lo = local.up(&[
            "lesson4",
            "--backend",
            "local",
            "--paths",
            "tcp,ib",
            "-s",
            scenario,
        ]);
        assert_eq!(lo.status.code(), Some(0), "{}", text(&lo));
        let in_docker = Scratch::new(&format!("l4-docker-{scenario}"), QUICK_IMAGE);
        let dk = in_docker.up(&[
            "lesson4",
            "--backend",
            "docker",
            "--paths",
            "tcp,ib",
            "-s",
            scenario,
        ]);
        assert_eq!(dk.status.code(), Some(0), "{}", text(&dk));
        let (le, de) = (local.evidence(), in_docker.evidence());
        assert_eq!(de["backend"], "docker");
        assert_eq!(
            verdicts(&le),
            verdicts(&de),
            "{scenario}: local and docker disagree"
        );
        let held = de["expectations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["verdict"] == "pass")
            .count();
        assert!(held >= 3, "{scenario}: only {held} expectations held");
        for (s, e) in [(&local, &le), (&in_docker, &de)] {
            assert_nothing_left(&d, s, e["run_id"].as_str().expect("a run id"));
        }
    }
}

/// Is a `sleep 2.5` (the lab's finally step) running inside this container?
fn finally_running_in(container_id: &str) -> bool {
    sleep_running_in(container_id, "2.5")
}

/// Is a `sleep SECONDS` running inside this container (seen from the host: its cgroup)?
fn sleep_running_in(container_id: &str, seconds: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .any(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"sleep"))
                && args.get(1) == Some(&seconds.as_bytes())
                && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| c.contains(container_id))
        })
}

/// The id of the container named `name`, from the engine's listing (the call that found
/// the run's containers), asked again for up to 10 s: in CI an inspect of a container
/// the listing had just shown failed while it ran.
fn container_id(d: &Docker, name: &str) -> Option<String> {
    let filters = HashMap::from([("name".to_string(), vec![format!("^/{name}$")])]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = block_on(d.list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters.clone()),
            ..Default::default()
        })))
        .ok()
        .and_then(|l| l.into_iter().next())
        .and_then(|c| c.id);
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGINT in the `finally` step, then SIGTERM in teardown (the moment iblab says the
/// finally step ended), on the docker backend: each run ends 130, its notes name where
/// the signal came, a signal in teardown does not cut it short (the finally step had run;
/// every container, network and namespace still goes).
#[test]
fn signals_in_a_finally_step_and_in_teardown_end_130_and_leave_nothing_on_docker() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let test = "signals_in_a_finally_step_and_in_teardown_end_130_and_leave_nothing_on_docker";
    let Some((_serial, d)) = serial(|| ready(test)) else {
        return;
    };
    for (sig, in_teardown) in [(Signal::SIGINT, false), (Signal::SIGTERM, true)] {
        let what = format!(
            "{sig} {}",
            if in_teardown {
                "in teardown"
            } else {
                "in the finally step"
            }
        );
        let s = Scratch::new(
            if in_teardown {
                "sig-teardown"
            } else {
                "sig-finally"
            },
            QUICK_IMAGE,
        );
        let t = Instant::now();
        let mut child = s
            .cmd(&["up", "tests/labs/chaos-finally.yaml", "--backend", "docker"])
            .arg("--out")
            .arg(s.out())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("iblab starts");
        let pid = Pid::from_raw(child.id() as i32);
        // Its stderr, read as it comes: the line that says the finally step has ended is
        // the moment teardown begins (waiting for a container to go instead once sent the
        // signal after the run had ended, in CI).
        let (tidy_done, tidy_seen) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut all = String::new();
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if line.trim_start().starts_with("✔ tidy") {
                    let _ = tidy_done.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let run = loop {
            if let Some(run) = s.live_runs().first().cloned()
                && containers_of(&d, &run).len() == 2
            {
                break run;
            }
            assert!(Instant::now() < deadline, "{what}: the lab did not come up");
            std::thread::sleep(Duration::from_millis(50));
        };
        let Some(b) = container_id(&d, &format!("iblab-{run}-b")) else {
            let mut out = child.wait_with_output().expect("iblab finishes");
            out.stderr = reader.join().unwrap().into_bytes();
            panic!("{what}: no container b once the lab was up: {}", text(&out));
        };
        while !finally_running_in(&b) {
            assert!(
                Instant::now() < deadline,
                "{what}: the finally step never ran"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if in_teardown {
            tidy_seen
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("{what}: the finally step never ended"));
        } else {
            std::thread::sleep(Duration::from_millis(800));
        }
        kill(pid, sig).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let _ = kill(pid, sig);
        let mut out = child.wait_with_output().expect("iblab finishes");
        out.stderr = reader.join().unwrap().into_bytes();
        assert_eq!(out.status.code(), Some(130), "{what}: {}", text(&out));
        let e = s.evidence();
        assert_eq!(e["verdict"], "interrupted", "{what}");
        let notes = e["notes"].to_string();
        let tidy = e["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|st| st["id"] == "tidy")
            .unwrap()
            .clone();
        if in_teardown {
            assert!(
                notes.contains("interrupted during teardown"),
                "{what}: {notes}"
            );
            assert_eq!(tidy["verdict"], "pass", "{what}: {tidy}");
        } else {
            assert!(
                notes.contains("interrupted during the finally steps"),
                "{what}: {notes}"
            );
            assert_eq!(tidy["reason"], "interrupted", "{what}: {tidy}");
        }
        eprintln!("docker, {what}: exit 130 after {:?}", t.elapsed());
        assert_nothing_left(&d, &s, &run);
    }
}

/// Host processes named `name` started for this scratch's runs (they carry its state
/// folder in their environment).
fn host_processes_of(s: &Scratch, name: &str) -> Vec<u32> {
    let mark = format!("IBLAB_STATE_DIR={}", s.state().display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|x| x.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == mark.as_bytes()))
        })
        .collect()
}

/// opensm killed while an ib lab's containers run a step: the next SM probe fails at once
/// naming it, exit 1, and nothing of the run is left (the subnet runs beside the
/// containers, in a host namespace of the run's own).
#[test]
fn opensm_killed_mid_run_fails_the_sm_probe_on_docker() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Some((_serial, d)) = serial(|| ready("opensm_killed_mid_run_fails_the_sm_probe_on_docker"))
    else {
        return;
    };
    if !common::installed("opensm") || !common::installed("ibsim") {
        common::missing("opensm, ibsim (apt-get install opensm ibsim-utils)");
        return;
    }
    let s = Scratch::new("kill-opensm", QUICK_IMAGE);
    let child = s
        .cmd(&["up", "tests/labs/ib-chaos.yaml", "--backend", "docker"])
        .arg("--out")
        .arg(s.out())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iblab starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        if let Some(run) = s.live_runs().first().cloned()
            && containers_of(&d, &run).len() == 3
        {
            break run;
        }
        assert!(Instant::now() < deadline, "the lab did not come up");
        std::thread::sleep(Duration::from_millis(50));
    };
    let a = container_id(&d, &format!("iblab-{run}-a")).expect("container a");
    while !sleep_running_in(&a, "3") {
        assert!(Instant::now() < deadline, "the pause step never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sms = host_processes_of(&s, "opensm");
    assert_eq!(sms.len(), 1, "opensm processes of the run: {sms:?}");
    kill(Pid::from_raw(sms[0] as i32), Signal::SIGKILL).unwrap();
    let out = child.wait_with_output().expect("iblab finishes");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let e = s.evidence();
    let after = e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["id"] == "after")
        .unwrap()
        .clone();
    assert_eq!(after["verdict"], "fail", "{after}");
    assert!(
        after["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("subnet manager `sm` (killed by a signal)"),
        "{after}"
    );
    assert_nothing_left(&d, &s, &run);
    for tool in ["ibsim", "opensm"] {
        assert!(
            host_processes_of(&s, tool).is_empty(),
            "{tool} left running"
        );
    }
}

/// Path ①'s latency test runs iblab's own ping-pong inside the containers: this binary's
/// folder (its libraries with it) is mounted read-only into them, and nothing of it is
/// left in a container or on the host's run state after the run.
#[test]
fn lesson2_runs_iblab_in_the_containers() {
    let Some((_serial, d)) = serial(|| ready("lesson2_runs_iblab_in_the_containers")) else {
        return;
    };
    let s = Scratch::new("l2-docker", QUICK_IMAGE);
    let out = s.up(&["lesson2", "--backend", "docker", "--paths", "tcp,ib"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let e = s.evidence();
    let latency = e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == "latency" && x["path"] == "tcp")
        .expect("the latency step on path tcp");
    assert_eq!(latency["verdict"], "pass", "{latency}");
    assert!(
        latency["metrics"]["round_trips"]["value"].as_f64() >= Some(100.0),
        "{latency}"
    );
    assert_nothing_left(&d, &s, e["run_id"].as_str().expect("a run id"));
}

/// A step whose program the lab image lacks is an environment error naming it, with the
/// engine's own words (the container runtime could not exec it), not a failed command.
#[test]
fn a_program_the_image_lacks_is_an_environment_error() {
    let Some((_serial, d)) = serial(|| ready("a_program_the_image_lacks_is_an_environment_error"))
    else {
        return;
    };
    let s = Scratch::new("cannot-start", QUICK_IMAGE);
    let lab = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/labs/cannot-start.yaml");
    let out = s.up(&[lab, "--backend", "docker"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(3), "{t}");
    assert!(
        t.contains("could not start `iblab-no-such-program` on node a"),
        "{t}"
    );
    assert!(t.contains("executable file not found"), "{t}");
    let e = s.evidence();
    let run = e["run_id"].as_str().unwrap().to_string();
    assert_nothing_left(&d, &s, &run);
}
