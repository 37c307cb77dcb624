//! Every expectation of every built-in lab can fail, and this shows it.
//!
//! `evidence/` keeps one real run of every scenario of every built-in lab (refreshed by
//! `evidence/refresh`, which runs them). For each expectation, `evidence/worlds.yaml` says
//! how the evidence of a world where its claim is false differs from a kept run: only
//! what was measured changes (a step's metrics, facts, verdict, provenance or devices),
//! never the lab's constants. This test judges each kept run as the engine does (the same
//! verdicts as recorded), then each expectation on a copy changed that way, and requires a
//! failure. An expectation without a world, or one its world does not flip, fails the
//! test: a new one cannot slip in. Needs no root: it reads files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use iblab_core::caps::HostCaps;
use iblab_core::evidence::{Evidence, ProvenanceKind, StepRecord, Verdict, judge};
use iblab_core::plan::{self, Plan};
use iblab_lab::PathKind;

/// One change to a kept run's steps.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Edit {
    /// The step's id, and its path for per-path steps.
    step: String,
    #[serde(default)]
    path: Option<PathKind>,
    /// A metric set `to` a value or scaled `times` a factor (every repetition's too).
    #[serde(default)]
    metric: Option<String>,
    /// A fact of `detail.facts`, or any field under `detail` (`json.x.held`), by a
    /// dotted path; set `to` a value.
    #[serde(default)]
    fact: Option<String>,
    #[serde(default)]
    detail: Option<String>,
    /// The step's verdict (`fail`), with its reason.
    #[serde(default)]
    verdict: Option<Verdict>,
    /// What produced its figures (`hardware`, for a claim judged only there).
    #[serde(default)]
    provenance: Option<ProvenanceKind>,
    /// `own`: the step's verbs devices renamed as if each path had a device of its own.
    #[serde(default)]
    devices: Option<String>,
    #[serde(default)]
    to: Option<Value>,
    #[serde(default)]
    times: Option<f64>,
}

/// A world for one expectation: where its claim is false (`flip`), and for one that no
/// kept run judges (it holds only on hardware, or with a device per path), first the
/// changes that make it judged and true (`hold`), in `scenario`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct World {
    world: String,
    #[serde(default)]
    scenario: Option<String>,
    #[serde(default)]
    hold: Vec<Edit>,
    flip: Vec<Edit>,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/evidence")
}

fn worlds() -> BTreeMap<String, BTreeMap<String, World>> {
    let text = std::fs::read_to_string(dir().join("worlds.yaml")).expect("worlds.yaml");
    serde_saphyr::from_str(&text).expect("worlds.yaml parses")
}

fn load(name: &str) -> iblab_lab::LoadedLab {
    let b = iblab_lab::builtin::find(name).unwrap_or_else(|| panic!("no built-in lab {name}"));
    iblab_lab::load::load_str(b.name, b.text).expect("a built-in lab loads")
}

/// Every (lab, scenario) a built-in lab runs: `default` and each of its scenarios.
fn scenarios() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for b in iblab_lab::builtin::all() {
        let lab = load(b.name);
        let mut names = vec!["default".to_string()];
        names.extend(lab.lab.spec.scenarios.keys().cloned());
        for s in names {
            out.push((b.name.to_string(), s));
        }
    }
    out
}

fn kept(lab: &str, scenario: &str) -> Option<Evidence> {
    let path = dir().join(format!("{lab}-{scenario}.json"));
    let text = std::fs::read_to_string(&path).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The plan the kept run was made from, as far as judging reads it.
fn plan_of(lab: &iblab_lab::LoadedLab, e: &Evidence) -> Plan {
    let mut caps = HostCaps::for_tests();
    caps.tools.insert(
        "qemu-system-x86_64".into(),
        Some(PathBuf::from("/usr/bin/qemu-system-x86_64")),
    );
    let req = plan::Request {
        scenario: Some(e.scenario.clone()),
        backend: e.backend.clone(),
        paths: Some(e.paths.clone()),
        hca: None,
        run: None,
        lang: e.lang,
    };
    plan::plan(lab, &req, &caps, &plan::backend::testing::backends())
        .unwrap_or_else(|err| panic!("{} {}: {err}", e.lab, e.scenario))
}

fn judged(plan: &Plan, steps: &[StepRecord], id: &str) -> (Verdict, String) {
    let ctx = judge::context(plan, steps);
    let x = plan
        .expectations
        .iter()
        .find(|x| x.id == id)
        .unwrap_or_else(|| panic!("{}: no expectation {id}", plan.lab));
    let r = judge::judge(plan, x, &ctx, steps);
    (r.verdict, r.explanation)
}

fn set_dotted(root: &mut Value, dotted: &str, to: Value) {
    let mut at = root;
    for key in dotted.split('.') {
        if !at.is_object() {
            *at = Value::Object(Default::default());
        }
        at = at
            .as_object_mut()
            .expect("an object")
            .entry(key.to_string())
            .or_insert(Value::Null);
    }
    *at = to;
}

fn apply(steps: &mut [StepRecord], edits: &[Edit], lab: &str) {
    for ed in edits {
        let found: Vec<&mut StepRecord> = steps
            .iter_mut()
            .filter(|s| s.id == ed.step && (ed.path.is_none() || s.path == ed.path))
            .collect();
        assert!(
            !found.is_empty(),
            "{lab}: worlds.yaml names step {}{} that the kept run does not have",
            ed.step,
            ed.path.map(|p| format!(" on {p}")).unwrap_or_default()
        );
        for s in found {
            if let Some(m) = &ed.metric {
                let unit = s.metrics.get(m).map(|x| x.unit.clone()).unwrap_or_default();
                let old = s.metrics.get(m).map(|x| x.value);
                let new = match (&ed.to, ed.times, old) {
                    (Some(v), _, _) => v.as_f64().expect("a metric is a number"),
                    (None, Some(f), Some(o)) => o * f,
                    _ => panic!("{lab}: {} has no metric {m} to scale", s.id),
                };
                s.metrics
                    .insert(m.clone(), iblab_core::evidence::Metric { value: new, unit });
                // Every repetition moves with it, so a judgement on the runs' spread sees it.
                if let Some(Value::Array(vals)) =
                    s.detail.pointer_mut(&format!("/repeat/figures/{m}/values"))
                {
                    for v in vals.iter_mut() {
                        let x = v.as_f64().unwrap_or(0.0);
                        *v = serde_json::json!(match (&ed.to, ed.times) {
                            (Some(_), _) => new,
                            (None, Some(f)) => x * f,
                            _ => x,
                        });
                    }
                }
            }
            if let Some(f) = &ed.fact {
                set_dotted(
                    &mut s.detail,
                    &format!("facts.{f}"),
                    ed.to.clone().expect("a fact is set `to` a value"),
                );
            }
            if let Some(d) = &ed.detail {
                set_dotted(
                    &mut s.detail,
                    d,
                    ed.to.clone().expect("a detail is set `to` a value"),
                );
            }
            if let Some(v) = ed.verdict {
                s.verdict = v;
                s.reason = Some(format!("{lab}: a world where it {}", v.as_str()));
            }
            if let Some(k) = ed.provenance {
                let p = s
                    .provenance
                    .get_or_insert(iblab_core::evidence::Provenance {
                        kind: k,
                        source: String::new(),
                    });
                p.kind = k;
                p.source = format!("{k:?} (a world of worlds.yaml)").to_lowercase();
            }
            if let Some(how) = &ed.devices {
                assert_eq!(how, "own", "devices: own is the one change");
                for d in s.devices.iter_mut() {
                    d.device = format!("{}-{}", d.path, d.device);
                }
            }
        }
    }
}

/// Each kept run is a passing run of its scenario, judged now as it was then.
#[test]
fn kept_runs_are_judged_as_they_were() {
    let mut missing = Vec::new();
    for (lab, scenario) in scenarios() {
        let loaded = load(&lab);
        let Some(e) = kept(&lab, &scenario) else {
            missing.push(format!("{lab}-{scenario}.json"));
            continue;
        };
        assert_eq!(
            e.verdict,
            iblab_core::evidence::RunVerdict::Pass,
            "{lab} {scenario}: keep a passing run"
        );
        let plan = plan_of(&loaded, &e);
        for x in &e.expectations {
            let (v, why) = judged(&plan, &e.steps, &x.id);
            assert_eq!(
                v, x.verdict,
                "{lab} {scenario} {}: judged {v:?} now ({why}), {:?} when it ran ({})",
                x.id, x.verdict, x.explanation
            );
        }
        assert_eq!(
            e.expectations.len(),
            plan.expectations.len(),
            "{lab} {scenario}: the kept run has other expectations than the lab now: refresh it"
        );
    }
    assert!(
        missing.is_empty(),
        "no kept run of {missing:?}: run crates/core/tests/evidence/refresh (as root)"
    );
}

/// Every expectation has a world where its claim is false, and in it the expectation
/// fails: on a kept run where it passed, or after `hold` made it judged and true.
#[test]
fn every_expectation_can_fail() {
    let worlds = worlds();
    let mut problems = Vec::new();
    let mut checked = 0;
    for b in iblab_lab::builtin::all() {
        let loaded = load(b.name);
        let runs: Vec<(String, Evidence)> = scenarios()
            .into_iter()
            .filter(|(l, _)| l == b.name)
            .filter_map(|(l, s)| kept(&l, &s).map(|e| (s, e)))
            .collect();
        for (i, x) in loaded.lab.spec.expect.iter().enumerate() {
            let id = iblab_lab::expectation_id(x, i);
            let Some(w) = worlds.get(b.name).and_then(|m| m.get(&id)) else {
                problems.push(format!(
                    "{} {id}: no world in worlds.yaml where it fails",
                    b.name
                ));
                continue;
            };
            assert!(!w.world.trim().is_empty(), "{} {id}: say the world", b.name);
            assert!(!w.flip.is_empty(), "{} {id}: no change flips it", b.name);
            let mut tried = 0;
            for (scenario, e) in &runs {
                if w.scenario.as_ref().is_some_and(|s| s != scenario) {
                    continue;
                }
                let plan = plan_of(&loaded, e);
                let mut steps = e.steps.clone();
                apply(&mut steps, &w.hold, b.name);
                let (before, why) = judged(&plan, &steps, &id);
                if before != Verdict::Pass {
                    if !w.hold.is_empty() {
                        problems.push(format!(
                            "{} {id} in {scenario}: `hold` should make it pass, it is {before:?}: {why}",
                            b.name
                        ));
                    }
                    continue;
                }
                apply(&mut steps, &w.flip, b.name);
                let (after, why) = judged(&plan, &steps, &id);
                tried += 1;
                checked += 1;
                if after != Verdict::Fail {
                    problems.push(format!(
                        "{} {id} in {scenario}: in the world \"{}\" it is {after:?}, not a failure: {why}",
                        b.name, w.world
                    ));
                }
            }
            if tried == 0 {
                problems.push(format!(
                    "{} {id}: no kept run where it passes to flip (give `hold` and `scenario` for a claim judged only on hardware)",
                    b.name
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked > 40, "only {checked} flips checked");
}

/// The worlds name only expectations that exist.
#[test]
fn no_world_without_its_expectation() {
    for (lab, ids) in worlds() {
        let loaded = load(&lab);
        for id in ids.keys() {
            assert!(
                loaded
                    .lab
                    .spec
                    .expect
                    .iter()
                    .enumerate()
                    .any(|(i, x)| &iblab_lab::expectation_id(x, i) == id),
                "{lab}: worlds.yaml has {id}, which the lab no longer has"
            );
        }
    }
}
