//! The six lessons, every scenario, end to end with the verdict the course predicts:
//! exit 0, and exactly the expectations that belong to the scenario hold (the others are
//! skipped, never passed). Paths ② and ③'s bytes need the vm backend here (no rdma_rxe
//! on the host), which `auto` picks (lesson 4 too: ② beside ① and ③'s bytes on rxe).
//!
//! With `IBLAB_TEST_BUSY_CORES=N` every lesson runs beside N busy loops (one per core, as
//! a busy laptop would): `.ci/run` runs the suite with both cores kept busy, and every
//! verdict must hold there (idle, as a developer runs it, they hold all the more).

mod common;

use common::lessons::CASES;
use common::*;

fn ready() -> bool {
    if !root() {
        return false;
    }
    for tool in ["qemu-system-x86_64", "ibsim", "opensm", "iperf3"] {
        if !installed(tool) {
            missing(&format!(
                "{tool} is not installed (bash .ci/run installs what the lessons need)"
            ));
            return false;
        }
    }
    true
}

/// Run a scenario. A run whose links carried no frames at bring-up (the link check's
/// environment error, seen once in CI on a TCG guest, cause not yet known) is run once
/// more, and the first attempt's diagnostics are printed so the flake stays visible.
fn up_once_more_if_silent(l: &str, scenario: &str) -> (Scratch, String) {
    for attempt in 1..=2 {
        let s = Scratch::new(&format!("{l}-{scenario}-{attempt}"));
        let out = s.up(&[l, "--scenario", scenario]);
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if attempt == 1 && out.status.code() == Some(3) && text.contains("carry no frames") {
            eprintln!(
                "WARNING {l} {scenario}: silent links at bring-up, running it again:\n{text}\n{}",
                std::fs::read_to_string(s.out().join("logs/links.log")).unwrap_or_default()
            );
            continue;
        }
        assert_eq!(
            out.status.code(),
            Some(0),
            "{l} {scenario}:\n{text}\n{}",
            s.log_tails()
        );
        return (s, text);
    }
    unreachable!("the second attempt returns or fails")
}

/// Busy loops beside a run (`IBLAB_TEST_BUSY_CORES`), stopped when dropped.
struct Busy(Vec<std::process::Child>);

impl Busy {
    fn from_env() -> Busy {
        let n: usize = std::env::var("IBLAB_TEST_BUSY_CORES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Busy(
            (0..n)
                .map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("a busy loop starts")
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run_lesson(lab: &str) {
    let Some(_g) = begin(ready) else {
        return;
    };
    let busy = Busy::from_env();
    for (l, scenario, held) in CASES.iter().filter(|c| c.0 == lab) {
        let (s, text) = up_once_more_if_silent(l, scenario);
        let e = s.evidence();
        common::lessons::as_the_course_predicts(&e, held, &[], &format!("{l} {scenario}\n{text}"));
        assert!(s.out().join("report.html").exists());
        junit_agrees_with_the_verdict(&s, &e, l, scenario);
        // Throughput over time, per path, in the report (a greyed ③ without an SM).
        let drawn = graphs::report_draws_throughput(&s.out(), &e);
        if *l == "lesson4" && *scenario == "sm-off" {
            assert!(!drawn.contains(&"ib".to_string()), "③ drawn as carrying");
        }
        if *l == "lesson2" {
            host_counters_are_of_the_data_phase(&e);
        }
        if matches!(*l, "lesson2" | "lesson3") && *scenario == "default" {
            the_course_picture(&e, *l == "lesson3");
        }
        if *l == "lesson6" {
            gains_are_declared(&e);
        }
        if *l == "lesson4" {
            ethernet_learned_by_itself(&e);
        }
        eprintln!(
            "{l} {scenario}: {:.1} s on {}{}",
            e["duration_s"].as_f64().unwrap_or(0.0),
            e["backend"],
            if busy.0.is_empty() {
                String::new()
            } else {
                format!(" beside {} busy loops", busy.0.len())
            }
        );
        assert_nothing_left(&s, e["run_id"].as_str().unwrap());
    }
}

/// A CI that reads junit.xml sees the run's verdict: no failure or error in it exactly
/// when the run passed (a step the lab lets fail, failing as the lesson says, is not one).
fn junit_agrees_with_the_verdict(s: &Scratch, e: &serde_json::Value, l: &str, scenario: &str) {
    let xml = std::fs::read_to_string(s.out().join("junit.xml")).expect("junit.xml");
    let count = |attr: &str| -> u64 {
        xml.split(&format!("{attr}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{l} {scenario}: junit.xml has no {attr}: {xml}"))
    };
    let bad = count("failures") + count("errors");
    assert_eq!(
        bad == 0,
        e["verdict"] == "pass",
        "{l} {scenario}: verdict {} with {bad} JUnit failures/errors:\n{xml}",
        e["verdict"]
    );
}

/// The course's table: every host-internal row that compares ② with ③ says they are
/// equal (grey) or, where both were measured on one device (③'s bytes riding ②'s rxe),
/// that they agree by construction (never grey as if measured); every network-layer row
/// that compares them says they differ (green); only the lab's declared rows are in it,
/// each with its rule.
fn the_course_picture(e: &serde_json::Value, has_network_rows: bool) {
    let rows = e["comparison"]["rows"].as_array().expect("comparison rows");
    assert!(!rows.is_empty());
    let raw: Vec<&str> = e["measurements"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    let mut decided = [0, 0];
    for r in rows {
        let name = r["name"].as_str().unwrap();
        assert!(
            !raw.contains(&name),
            "a raw measurement in the comparison: {name}"
        );
        let by_construction = r["same_device"].as_array().is_some_and(|d| !d.is_empty());
        if by_construction {
            assert!(
                r["roce_equals_ib"].is_null(),
                "{name}: measured on one device, yet decided: {r}"
            );
            assert!(
                r["rule"]
                    .as_str()
                    .unwrap_or("")
                    .contains("same device here"),
                "{name}: {r}"
            );
            if r["group"] == "host" {
                decided[0] += 1;
            }
            continue;
        }
        let Some(same) = r["roce_equals_ib"].as_bool() else {
            continue;
        };
        assert!(
            !r["rule"].as_str().unwrap_or("").is_empty(),
            "{name}: no rule"
        );
        match r["group"].as_str() {
            Some("host") => {
                assert!(same, "host row `{name}` differs between ② and ③: {r}");
                decided[0] += 1;
            }
            // The cables and the switch are the same for every path (lesson 2's wire).
            _ if name == "links the transfer crossed" => {
                assert!(same, "② and ③ crossed different links: {r}");
            }
            _ => {
                assert!(!same, "network row `{name}` is the same on ② and ③: {r}");
                decided[1] += 1;
            }
        }
    }
    assert!(
        decided[0] >= 2,
        "too few host rows decided or marked by construction: {rows:?}"
    );
    if has_network_rows {
        assert!(decided[1] >= 3, "too few network rows decided: {rows:?}");
    }
    assert!(!e["measurements"]["rows"].as_array().unwrap().is_empty());
}

/// Lesson 6 sets its gains side by side as declared rows, each saying which way is
/// better; the throughput gain is the one that needs hardware.
fn gains_are_declared(e: &serde_json::Value) {
    let rows = e["comparison"]["rows"].as_array().expect("comparison rows");
    let gains: Vec<&serde_json::Value> = rows.iter().filter(|r| r["better"].is_string()).collect();
    assert!(gains.len() >= 4, "{rows:?}");
    for r in &gains {
        let hw = r["needs_hardware"].as_bool().unwrap_or(false);
        let name = r["name"].as_str().unwrap();
        assert_eq!(
            hw,
            name.starts_with("throughput"),
            "{name}: needs hardware?"
        );
    }
}

/// Lesson 4's Ethernet: the bridge learned both hosts, and each resolved the other by ARP.
fn ethernet_learned_by_itself(e: &serde_json::Value) {
    let step = e["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "learned")
        .expect("a learned probe");
    let facts = &step["detail"]["facts"];
    assert_eq!(
        facts["nodes_learned"],
        serde_json::json!(["a", "b"]),
        "{facts}"
    );
    assert_eq!(
        facts["nodes"]["a"]["arp"]["b"], facts["nodes"]["b"]["mac"],
        "{facts}"
    );
}

/// Lesson 2's host rows come from the data phase of both tools on ① and ② (the span the
/// node's interfaces carried the transfer), not from their whole lives.
fn host_counters_are_of_the_data_phase(e: &serde_json::Value) {
    for path in ["tcp", "roce"] {
        let step = path_step(e, "bandwidth", path);
        let hc = &step["detail"]["host_counters"];
        for side in ["sender", "receiver"] {
            let phase = &hc[side]["counters"]["data_phase"];
            let (from, to) = (phase["from_s"].as_f64(), phase["to_s"].as_f64());
            assert!(
                matches!((from, to), (Some(f), Some(t)) if t - f > 0.5),
                "{path} {side}: no data phase of at least 0.5 s: {hc}"
            );
            assert!(
                step["metrics"][format!("{side}_data_phase_s")]["value"].as_f64() > Some(0.5),
                "{path} {side}"
            );
        }
    }
}

#[test]
fn lesson1_three_words() {
    run_lesson("lesson1");
}

#[test]
fn lesson2_who_gets_the_credit() {
    run_lesson("lesson2");
}

#[test]
fn lesson3_the_network_layer() {
    run_lesson("lesson3");
}

#[test]
fn lesson4_the_subnet_manager() {
    run_lesson("lesson4");
}

#[test]
fn lesson5_lossless() {
    run_lesson("lesson5");
}

#[test]
fn lesson6_which_to_choose() {
    run_lesson("lesson6");
}

#[test]
fn every_builtin_lesson_has_a_case_for_every_scenario() {
    for n in iblab_lab::builtin::lessons() {
        let lab = format!("lesson{n}");
        let out = std::process::Command::new(BIN)
            .args(["show", &lab])
            .output()
            .unwrap();
        assert!(out.status.success(), "{lab} is not built in");
        let text = String::from_utf8_lossy(&out.stdout);
        let scenarios: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "scenarios")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(!scenarios.is_empty(), "{lab}: no scenarios listed:\n{text}");
        for sc in scenarios {
            assert!(
                CASES.iter().any(|c| c.0 == lab && c.1 == sc),
                "{lab} scenario {sc} has no end-to-end case"
            );
        }
    }
}

/// Lesson 2's latency clause (② and ③'s typical round trips within ×1.5) fails where
/// they really differ: ③'s round trips through a 50 kbit/s bottleneck that ②'s did not
/// cross (③'s median at least twice ②'s: with 100 kbit/s it was 57× idle and 2.1× with
/// both cores busy, where the slower round trips let the bucket refill between frames).
/// The check is not a margin so wide that it cannot fail.
#[test]
fn a_real_latency_difference_fails_lesson2s_check() {
    let Some(_g) = begin(ready) else {
        return;
    };
    let _busy = Busy::from_env();
    a_real_difference_fails(Difference {
        lab: "latency-differs",
        lesson: "lesson2",
        metric: "latency_typical_us",
        renames: &[
            ("steps.lat_ib.ib", "steps.latency.ib"),
            ("steps.lat_roce.roce", "steps.latency.roce"),
        ],
        clause: "same_typical_latency",
        slow: ("lat_ib", "ib"),
        fast: ("lat_roce", "roce"),
        higher_is_slower: true,
    });
}

/// Lesson 6's clause (② and ③'s uncongested throughput within ×2, judged on three runs'
/// ranges) fails where they really differ: ③'s runs through a 5 Mbit/s bottleneck that
/// ②'s did not cross.
#[test]
fn a_real_throughput_difference_fails_lesson6s_check() {
    let Some(_g) = begin(ready) else {
        return;
    };
    let _busy = Busy::from_env();
    a_real_difference_fails(Difference {
        lab: "throughput-differs",
        lesson: "lesson6",
        metric: "throughput_mbps",
        renames: &[
            ("steps.slow_ib.ib", "steps.uncongested.ib"),
            ("steps.fast_roce.roce", "steps.uncongested.roce"),
        ],
        clause: "ib_or_roce_is_small_uncongested",
        slow: ("slow_ib", "ib"),
        fast: ("fast_roce", "roce"),
        higher_is_slower: false,
    });
}

/// A test lab whose ② and ③ really differ, judged by a lesson's own clause.
struct Difference {
    lab: &'static str,
    lesson: &'static str,
    metric: &'static str,
    /// The test lab's step names, and the lesson's they stand for.
    renames: &'static [(&'static str, &'static str)],
    clause: &'static str,
    /// (step, path) of the slowed path and of the clean one.
    slow: (&'static str, &'static str),
    fast: (&'static str, &'static str),
    /// Whether the metric grows as the path slows (latency) or shrinks (throughput).
    higher_is_slower: bool,
}

/// Runs `d.lab` (whose clause must be the lesson's own, word for word up to step names)
/// and asserts that it fails there, with every run of the slowed path beyond every run
/// of the clean one.
fn a_real_difference_fails(d: Difference) {
    let s = Scratch::new(d.lab);
    let lab = format!("{}/tests/labs/{}.yaml", env!("CARGO_MANIFEST_DIR"), d.lab);
    let here = std::fs::read_to_string(&lab).unwrap();
    let lesson = std::fs::read_to_string(format!(
        "{}/labs/{}.yaml",
        env!("CARGO_MANIFEST_DIR"),
        d.lesson
    ))
    .unwrap();
    let needle = format!("runs.{}", d.metric);
    let clauses: Vec<&str> = here.lines().filter(|l| l.contains(&needle)).collect();
    assert!(
        !clauses.is_empty(),
        "{} judges no runs of {}",
        d.lab,
        d.metric
    );
    for clause in clauses {
        let mut theirs = clause.to_string();
        for (ours, lessons) in d.renames {
            theirs = theirs.replace(ours, lessons);
        }
        let theirs = theirs.trim().trim_start_matches("and ");
        assert!(
            lesson
                .lines()
                .any(|l| l.trim().trim_start_matches("and ") == theirs),
            "{} no longer judges as this test does: {theirs}",
            d.lesson
        );
    }
    let out = s.up(&[&lab]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    let e = s.evidence();
    assert_eq!(verdict_of(&e, "both_measured"), "pass", "{text}");
    assert_eq!(verdict_of(&e, d.clause), "fail", "{text}");
    let runs = |(id, path): (&str, &str)| -> Vec<f64> {
        let step = e["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == id && x["path"] == path)
            .unwrap();
        step["detail"]["repeat"]["figures"][d.metric]["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                v.as_f64().unwrap_or_else(|| {
                    panic!("{id} on {path}: a figure that is no number ({v}) in {step}\n{text}")
                })
            })
            .collect()
    };
    let (slow, fast) = (runs(d.slow), runs(d.fast));
    assert_eq!(
        (slow.len(), fast.len()),
        (3, 3),
        "slowed {slow:?} clean {fast:?}"
    );
    // The slowed path really was slower in every run, by more than the clause allows.
    let (worst_fast, best_slow) = if d.higher_is_slower {
        (
            fast.iter().cloned().fold(f64::MIN, f64::max),
            slow.iter().cloned().fold(f64::MAX, f64::min),
        )
    } else {
        (
            fast.iter().cloned().fold(f64::MAX, f64::min),
            slow.iter().cloned().fold(f64::MIN, f64::max),
        )
    };
    let beyond = if d.higher_is_slower {
        best_slow > worst_fast
    } else {
        best_slow < worst_fast
    };
    assert!(beyond, "slowed {slow:?} against clean {fast:?}");
    assert_nothing_left(&s, e["run_id"].as_str().unwrap());
}
