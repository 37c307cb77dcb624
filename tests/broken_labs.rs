//! Broken lab files: each must be refused with exit 2, the right file:line:col, a hint,
//! and nothing deployed. And the loader fed the repository's labs and inputs mutated from
//! them (`broken_labs/mutate.rs`): refused at a position, never a panic.

use std::path::Path;
use std::process::Command;

mod common;
#[path = "broken_labs/mutate.rs"]
mod mutate;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");

/// (file, line:col of the offending value, words the message must contain)
const CASES: &[(&str, &str, &str)] = &[
    ("01-yaml-syntax", "9:13", "indicator"),
    ("02-wrong-type", "19:43", "found a list"),
    ("03-unknown-field", "6:3", "unknown field `author`"),
    ("04-missing-field", "24:7", "missing field `because`"),
    ("05-api-version", "1:13", "unsupported apiVersion"),
    (
        "06-dangling-link-end",
        "12:18",
        "link end `c` is not a node or switch",
    ),
    ("07-duplicate-node", "8:19", "`a` is declared twice"),
    (
        "08-duplicate-step-id",
        "20:11",
        "step id `clean` is used twice",
    ),
    (
        "09-unknown-step-in-expression",
        "24:13",
        "unknown step `clear`",
    ),
    ("10-bad-expression", "24:13", "bad expression"),
    ("11-unknown-scenario-param", "16:24", "parameter `drop`"),
    ("12-unknown-link", "21:22", "no link is called `a-sw2`"),
    ("13-traffic-to-self", "19:31", "to itself"),
    ("14-step-two-kinds", "18:7", "several things at once"),
    ("15-loss-out-of-range", "21:52", "out of range"),
    ("16-unknown-enum", "21:37", "unknown variant `lose`"),
    ("17-bad-step-id", "20:11", "step id `cut-it`"),
    ("18-bad-template", "19:40", "bad template"),
    ("19-link-to-itself", "12:17", "to itself"),
    ("20-duplicate-key", "15:5", "duplicate mapping key"),
    (
        "21-unknown-path",
        "19:54",
        "path `ib` is not one of the lab's paths",
    ),
    ("22-scenario-named-default", "16:5", "`default`"),
    ("23-bad-duration", "22:16", "not a duration"),
    ("24-needs-no-step", "19:14", "reads no step"),
    ("25-mtu-mismatch", "13:32", "same Ethernet segment"),
    (
        "26-step-result-in-template",
        "21:40",
        "before any step has run",
    ),
    ("27-unknown-node-field", "21:40", "a node has no `mac`"),
    (
        "28-misspelled-metric",
        "19:13",
        "did you mean `throughput_mbps`",
    ),
    (
        "29-bad-rate-param",
        "20:49",
        "in scenario `slow` this is `50mbps`, which is not a rate",
    ),
    // Found by the fuzz loop (broken_labs/mutate.rs): this used to panic.
    (
        "30-fault-on-a-one-ended-link",
        "12:17",
        "a link has exactly two ends, this one has 1",
    ),
    ("31-sleep-too-long", "17:14", "longer than a lab may wait"),
    ("32-too-many-steps", "13:3", "at most 200"),
    (
        "33-misspelled-metric-of-runs",
        "19:13",
        "did you mean `throughput_mbps`",
    ),
];

fn file(name: &str) -> String {
    format!("tests/broken/{name}.yaml")
}

#[test]
fn every_broken_file_has_a_case_and_every_case_a_file() {
    let mut on_disk: Vec<String> = std::fs::read_dir("tests/broken")
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".yaml")
                .to_string()
        })
        .collect();
    on_disk.sort();
    let mut cases: Vec<String> = CASES.iter().map(|c| c.0.to_string()).collect();
    cases.sort();
    assert_eq!(on_disk, cases);
    assert!(cases.len() >= 15);
}

#[test]
fn validate_points_at_the_problem() {
    for (name, at, words) in CASES {
        let out = Command::new(BIN)
            .args(["validate", "--color", "never", &file(name)])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: exit code\n{err}");
        let headline = err.lines().next().unwrap_or_default();
        assert!(
            headline.starts_with(&format!("error: {}:{at}: ", file(name))),
            "{name}: expected {at} in the headline, got:\n{err}"
        );
        assert!(
            headline.contains(words),
            "{name}: expected `{words}` in:\n{headline}"
        );
        assert!(err.contains("help:"), "{name}: no hint in:\n{err}");
        assert!(err.contains("nothing was deployed"), "{name}: {err}");
    }
}

#[test]
fn up_refuses_before_creating_anything() {
    let state = tempdir("broken-up");
    for (name, at, _) in CASES.iter().take(8) {
        let out = Command::new(BIN)
            .args(["up", "--color", "never", &file(name), "--out"])
            .arg(state.join("run"))
            .env("IBLAB_STATE_DIR", state.join("state"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(&format!("{}:{at}", file(name))),
            "{name}: {err}"
        );
        assert!(
            !state.join("state").exists(),
            "{name}: a state file was written"
        );
        assert!(
            !state.join("run").exists(),
            "{name}: a run folder was created"
        );
    }
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn unknown_lab_scenario_and_backend_are_bad_input() {
    let cases: &[&[&str]] = &[
        &["up", "no-such-lab"],
        &["plan", "tcp-loss", "--scenario", "no-such-scenario"],
        &["plan", "tcp-loss", "--backend", "no-such-backend"],
        &["plan", "tcp-loss", "--paths", "tcp,infiniband"],
        &["plan", "tcp-loss", "--paths", "ib"],
    ];
    for args in cases {
        let out = Command::new(BIN).args(*args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Values known only after templating are checked when the lab is loaded, in every
/// scenario (what `validate` refuses, `plan` and `up` refuse too), with exit 2 and a
/// message at the value's position: out of range, not a finite number, an endless
/// template (the expression engine's fuel) and steps whose limits add up to more than a
/// run may take. Never a panic.
#[test]
fn templated_values_are_checked_after_rendering() {
    let lab = "tests/labs/bounds-after-templating.yaml";
    for cmd in [
        &["validate", "--color", "never", lab][..],
        &["plan", "--color", "never", lab, "--scenario", "default"],
    ] {
        let (code, err) = run_within(cmd, 30);
        assert!(!err.contains("panicked"), "{cmd:?}: {err}");
        assert_eq!(code, Some(2), "{cmd:?}: {err}");
        for words in [
            "in scenario `negative` this is -1 seconds, out of range",
            "in scenario `enormous` this is 1e300 seconds, out of range",
            "in scenario `huge-streams` this is 100000 streams, out of range",
            "in scenario `spin` this is a template that cannot be rendered",
            "out of fuel",
            "in scenario `long-run` the steps' time limits add up to",
        ] {
            assert!(
                err.contains(words),
                "{cmd:?}: expected `{words}` in:\n{err}"
            );
        }
        assert!(!err.contains("scenario `default`"), "{cmd:?}: {err}");
        assert!(
            err.contains(&format!("{lab}:33:")),
            "{cmd:?}: positioned: {err}"
        );
    }
}

/// For each built-in lab with a parameter a templated number reads, that parameter made
/// out of range: `validate` refuses the lab (exit 2, at the value that reads it, naming
/// the scenario), as `plan` (what `up` does before anything is deployed) does.
#[test]
fn a_builtin_lab_with_a_parameter_out_of_range_is_refused_by_validate_and_up() {
    let dir = tempdir("out-of-range");
    let mut tried = Vec::new();
    for (lab, param, bad, words) in [
        (
            "lesson2",
            "seconds",
            serde_json::json!(-3),
            "-3 seconds, out of range",
        ),
        (
            "lesson5",
            "seconds",
            serde_json::json!(0),
            "0 seconds, out of range",
        ),
        (
            "lesson5",
            "rate_mbit",
            serde_json::json!(-1),
            "`-1mbit`, which is not a rate",
        ),
        (
            "lesson5",
            "queue",
            serde_json::json!("deep"),
            "`deep`, which is not a size",
        ),
        (
            "lesson6",
            "seconds",
            serde_json::json!(7200),
            "7200 seconds, out of range",
        ),
        (
            "lesson6",
            "rate_mbit",
            serde_json::json!("fast"),
            "`fastmbit`, which is not a rate",
        ),
        (
            "roce-basics",
            "seconds",
            serde_json::json!(-0.5),
            "-0.5 seconds, out of range",
        ),
        (
            "tcp-loss",
            "loss",
            serde_json::json!(200),
            "200%, out of range",
        ),
        (
            "tcp-loss",
            "seconds",
            serde_json::json!("long"),
            "`long`, which is not a number",
        ),
    ] {
        let text = std::fs::read_to_string(format!("labs/{lab}.yaml")).unwrap();
        let mut doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert!(
            doc["spec"]["params"][param].is_number() || doc["spec"]["params"][param].is_string(),
            "{lab}: {param}"
        );
        doc["spec"]["params"][param] = bad.clone();
        let file = dir.join(format!("{lab}-{param}.yaml"));
        std::fs::write(&file, serde_saphyr::to_string(&doc).unwrap()).unwrap();
        let file = file.to_string_lossy().into_owned();
        for cmd in [
            &["validate", "--color", "never", &file][..],
            &[
                "plan",
                "--color",
                "never",
                &file,
                "--backend",
                "local",
                "--paths",
                "tcp",
            ],
        ] {
            let (code, err) = run_within(cmd, 30);
            assert_eq!(code, Some(2), "{cmd:?} with {param}={bad}: {err}");
            assert!(
                err.contains(words),
                "{cmd:?} with {param}={bad}: expected `{words}` in:\n{err}"
            );
            assert!(err.contains("in scenario `default`"), "{cmd:?}: {err}");
            assert!(
                err.contains(&format!("{file}:")),
                "{cmd:?}: not positioned: {err}"
            );
        }
        tried.push(lab);
    }
    // Every built-in lab that has parameters had one made out of range.
    for b in iblab_lab::builtin::all() {
        let loaded = iblab_lab::load::resolve(b.name).unwrap();
        let numeric = loaded.lab.spec.params.values().any(|v| v.is_number());
        assert!(
            !numeric || tried.contains(&b.name),
            "{}: no parameter tried",
            b.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn builtin_labs_are_valid() {
    let out = Command::new(BIN).arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(!text.contains("broken"), "{text}");
    for line in text.lines().skip(1) {
        let name = line.split_whitespace().next().unwrap();
        let v = Command::new(BIN).args(["validate", name]).output().unwrap();
        assert!(
            v.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&v.stderr)
        );
    }
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("iblab-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    assert!(Path::new(&d).exists());
    d
}

/// Run `iblab` with a deadline: a command that does not end is killed and reported.
fn run_within(args: &[&str], secs: u64) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), err);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`iblab {}` still running after {secs}s", args.join(" "));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A lab path that is not a regular file (a device that never ends, a folder, a fifo
/// that nobody writes) or that is larger than any lab is refused at once, saying why.
#[test]
fn a_path_that_is_no_lab_file_is_refused_at_once() {
    let dir = tempdir("not-a-file");
    let fifo = dir.join("fifo.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let big = dir.join("big.yaml");
    std::fs::write(&big, "# padding\n".repeat(120_000)).unwrap();
    let fifo = fifo.to_string_lossy().into_owned();
    let big = big.to_string_lossy().into_owned();
    let folder = dir.to_string_lossy().into_owned();
    let cases: &[(&str, &str)] = &[
        ("/dev/zero", "not a regular file"),
        (&folder, "not a regular file"),
        (&fifo, "not a regular file"),
        (&big, "1 MiB"),
    ];
    for (path, words) in cases {
        for cmd in ["validate", "plan", "up"] {
            let (code, err) = run_within(&[cmd, "--color", "never", path], 5);
            assert_eq!(code, Some(2), "{cmd} {path}: exit code\n{err}");
            let headline = err.lines().next().unwrap_or_default();
            assert!(
                headline.starts_with(&format!("error: {path}: ")) && headline.contains(words),
                "{cmd} {path}: expected `{words}` in the headline:\n{err}"
            );
            assert!(err.contains("help:"), "{cmd} {path}: no hint in:\n{err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A topology larger than v1 can address is refused in one sentence that says how
/// large it is, what the limit is, and where (file:line:col of `nodes`).
#[test]
fn too_many_nodes_is_one_clear_sentence_at_the_node_list() {
    let dir = tempdir("too-many-nodes");
    let names: Vec<String> = (0..5000).map(|i| format!("n{i}")).collect();
    let mut text = format!(
        "apiVersion: iblab.dev/v1\nkind: Lab\nmetadata:\n  name: big\n  title: t\n  goal: g\nspec:\n  topology:\n    nodes: [{}]\n    switches: [sw]\n    links:\n",
        names.join(", ")
    );
    for n in &names {
        text.push_str(&format!("      - {{ ends: [{n}, sw] }}\n"));
    }
    text.push_str(
        "  paths: [tcp]\n  steps:\n    - id: s\n      exec: { node: n0, command: [\"true\"] }\n  expect:\n    - id: e\n      that: steps.s.exit_code == 0\n      because: b\n      onFail: f\n",
    );
    let file = dir.join("big.yaml");
    std::fs::write(&file, text).unwrap();
    let path = file.to_string_lossy().into_owned();
    let (code, err) = run_within(&["validate", "--color", "never", &path], 30);
    assert_eq!(code, Some(2), "{err}");
    let headline = err.lines().next().unwrap_or_default();
    assert_eq!(
        headline,
        format!("error: {path}:9:12: the topology has 5000 nodes; a lab has at most 250"),
        "{err}"
    );
    assert!(err.contains("help:"), "no hint in:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
