//! The read-only commands: schema, completions, advise, report. No root needed.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");

/// `iblab ARGS`, in English whatever the runner's locale (the words are what is tested).
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("IBLAB_LANG", "en")
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn schema_is_json_schema_of_lab_files() {
    let (code, out, _) = run(&["schema"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["title"], "Lab");
    assert!(v["properties"]["spec"].is_object());
    let text = out.as_str();
    for field in ["subnetManagers", "continueOnError", "onFail", "apiVersion"] {
        assert!(text.contains(field), "{field} missing from the schema");
    }
}

#[test]
fn completions_for_bash() {
    let (code, out, _) = run(&["completions", "bash"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("iblab") && out.contains("doctor"));
}

#[test]
fn advise_follows_lesson_6() {
    let (code, out, _) = run(&["advise", "--json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["advice"]["choice"], "start-with-roce");
    let (_, out, _) = run(&[
        "advise",
        "--json",
        "--rdma-in-use",
        "--nodes",
        "2048",
        "--congestion",
        "constant",
        "--ib-team",
        "--tail-latency",
        "extreme",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["advice"]["choice"], "infiniband");
    let (_, out, _) = run(&[
        "advise",
        "--json",
        "--rdma-in-use",
        "--nodes",
        "2048",
        "--congestion",
        "constant",
        "--across-subnets",
        "--much-tcp",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["advice"]["choice"], "roce");
    for r in v["advice"]["reasons"].as_array().unwrap() {
        let lesson = r["lesson"].as_u64().unwrap();
        assert!(iblab_lab::builtin::lessons().contains(&(lesson as u8)));
    }
}

#[test]
fn advise_reads_a_situation_file_and_points_at_mistakes() {
    let dir = std::env::temp_dir().join(format!("iblab-advise-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.yaml");
    std::fs::write(
        &good,
        "rdmaInUse: true\nnodes: 4000\ncongestion: constant\nibTeam: true\n",
    )
    .unwrap();
    let (code, out, _) = run(&["advise", "--json", "--file", good.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"infiniband\""), "{out}");
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "rdmaInUse: true\ncongestion: often\n").unwrap();
    let (code, _, err) = run(&["advise", "--file", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("bad.yaml:2:"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_of_a_missing_run_is_bad_input() {
    let (code, _, err) = run(&["report", "/nonexistent/run"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("evidence.json"));
}

/// `--hca` names a real adapter; a device this host does not have is an environment error
/// (exit 3) naming it, a malformed port is bad input (exit 2). Nothing runs either way.
#[test]
fn hca_that_is_not_here_is_refused_before_anything_runs() {
    if std::path::Path::new("/sys/class/infiniband/iblab_none").exists() {
        return;
    }
    let (code, _, err) = run(&["plan", "lesson2", "--hca", "iblab_none:1"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no RDMA device iblab_none"), "{err}");
    let (code, _, err) = run(&["plan", "lesson2", "--hca", "iblab_none:x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a port number"), "{err}");
}

/// On the kube backend `--hca` names the adapter a device plugin gives the pods: without
/// the plugin's resource there is none, which is bad input (exit 2) saying what to set.
#[cfg(feature = "kube")]
#[test]
fn hca_on_kube_without_a_device_plugin_resource_is_bad_input() {
    let o = Command::new(BIN)
        .args(["plan", "roce-basics", "--backend", "kube", "--hca", "rxe0"])
        .env_remove("IBLAB_KUBE_RDMA_RESOURCE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--hca names the adapter a device plugin gives each lab pod; set IBLAB_KUBE_RDMA_RESOURCE"),
        "{err}"
    );
}

/// `iblab list | head -1`: a reader that goes away ends a printing command quietly (as
/// SIGPIPE ends Unix tools), with no panic message. The reader is gone before iblab
/// writes its first byte.
#[test]
fn a_closed_pipe_ends_a_listing_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_iblab"))
        .arg("list")
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(13),
        "ended by SIGPIPE: {:?}",
        out.status
    );
}

/// A gain computed from soft figures says so on its own line, not only in brackets.
#[test]
fn advise_says_when_a_measured_gain_is_not_hardware() {
    let dir = std::env::temp_dir().join(format!("iblab-advise-soft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut e: serde_json::Value = serde_json::from_str(iblab_core::testdata::TCP_LOSS).unwrap();
    e["measurements"] = serde_json::json!({"rows": [{
        "group": "network",
        "name": "throughput_mbps (bandwidth)",
        "unit": "Mbit/s",
        "values": {
            "tcp": {"value": 800.0, "provenance": "soft"},
            "roce": {"value": 40.0, "provenance": "soft"}
        }
    }]});
    std::fs::write(dir.join("evidence.json"), e.to_string()).unwrap();
    let (code, out, err) = run(&["advise", "--evidence", dir.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(0), "{err}");
    let line = out
        .lines()
        .skip_while(|l| !l.contains("① tcp → ② roce"))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(line.contains("×0.05"), "{out}");
    assert!(line.contains("not on hardware"), "{out}");
}

/// Where a lab runs iblab in its nodes (path ①'s ping-pong), `plan` says how iblab gets
/// into containers and pods; where it does not, it says nothing of it.
#[test]
fn plan_says_how_iblab_gets_into_the_nodes() {
    let mut backends = vec![("docker", "bind-mounted")];
    if cfg!(feature = "kube") {
        backends.push(("kube", "init container"));
    }
    for (backend, how) in backends {
        let (code, out, err) = run(&["plan", "lesson2", "--backend", backend, "--paths", "tcp,ib"]);
        assert_eq!(code, Some(0), "{err}");
        let line = out
            .lines()
            .find(|l| l.starts_with("iblab in the nodes:"))
            .unwrap_or_else(|| panic!("{backend}: no word of iblab in the nodes:\n{out}"));
        assert!(line.contains(how) && line.contains("/opt/iblab"), "{line}");
        let (_, out, _) = run(&["plan", "tcp-loss", "--backend", backend]);
        assert!(!out.contains("iblab in the nodes"), "{backend}: {out}");
    }
    let (_, out, _) = run(&["plan", "lesson2", "--backend", "local", "--paths", "tcp,ib"]);
    assert!(
        !out.contains("iblab in the nodes"),
        "local shares this host's files"
    );
}

/// The learner's build (no `kube` feature) answers the kube backend and its commands with
/// the build that has them (exit 3), never as an unknown backend.
#[cfg(not(feature = "kube"))]
#[test]
fn the_learners_build_names_the_build_with_the_kube_backend() {
    for args in [
        &["plan", "tcp-loss", "--backend", "kube"][..],
        &["render", "tcp-loss", "--backend", "kube"],
        &["crd"],
        &["operator", "--check"],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, Some(3), "{args:?}: {err}");
        assert!(
            err.contains("cargo build --release --features kube"),
            "{args:?}: {err}"
        );
    }
}
