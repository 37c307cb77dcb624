//! What the page shows of one run, finished or going: its steps, the three graphs (drawn
//! by the report's own drawing, so the page and report.html show the same pictures), the
//! paths' standing, the retention rows, the expectations in the lab's words and the
//! comparison with grey and green rows, each cell one short line with its detail beside.
//! A run in progress is an evidence document of the steps so far.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::words::{self, Lang};
use iblab_core::evidence::{
    Comparison, Evidence, Group, HostInfo, RunVerdict, StepRecord, Verdict,
};
use iblab_lab::PathKind;
use iblab_lab::names;
use iblab_report::graphs;

/// How far a run in progress is.
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// What it is doing now (the terminal's spinner line).
    pub stage: String,
    /// Stop was asked for: it is tearing down.
    pub stopping: bool,
}

/// The evidence of a run in progress: what its `run` event said, and its steps so far.
pub fn partial(run: &Value, steps: &[StepRecord], t: f64) -> Evidence {
    let s = |k: &str| run[k].as_str().unwrap_or_default().to_string();
    Evidence {
        schema: iblab_core::evidence::SCHEMA.into(),
        lab: s("lab"),
        title: s("title"),
        lesson: run["lesson"].as_u64().map(|l| l as u8),
        scenario: s("scenario"),
        backend: s("backend"),
        backend_reason: s("backend_reason"),
        nic: String::new(),
        run_id: s("run_id"),
        started: s("started"),
        duration_s: t,
        verdict: RunVerdict::Interrupted,
        paths: serde_json::from_value(run["paths"].clone()).unwrap_or_default(),
        excluded_paths: serde_json::from_value(run["excluded_paths"].clone()).unwrap_or_default(),
        params: serde_json::from_value(run["params"].clone()).unwrap_or_default(),
        host: HostInfo {
            kernel: String::new(),
            loss_mechanism: String::new(),
        },
        steps: steps.to_vec(),
        expectations: vec![],
        topology: Default::default(),
        comparison: Comparison::default(),
        measurements: Comparison::default(),
        timings: BTreeMap::new(),
        notes: vec![],
        run_dir: run["run_dir"].as_str().unwrap_or_default().into(),
        lang: serde_json::from_value(run["lang"].clone()).unwrap_or_default(),
    }
}

/// A cell in one short line: its first line if that is short; else its first clause (up
/// to `, `, `; ` or `: `) if that is; else the first line cut at about 48 characters.
fn short(text: &str) -> String {
    const MAX: usize = 48;
    let first = text.lines().next().unwrap_or("").trim();
    if first.chars().count() <= MAX {
        return first.to_string();
    }
    let clause = [", ", "; ", ": "]
        .iter()
        .filter_map(|sep| first.find(sep))
        .min()
        .map(|at| &first[..at]);
    if let Some(c) = clause.filter(|c| (4..=MAX).contains(&c.chars().count())) {
        return format!("{c} …");
    }
    let cut: String = first.chars().take(MAX - 2).collect();
    format!("{}…", cut.trim_end())
}

fn cell_text(v: &Value) -> String {
    match v {
        Value::Number(n) => n
            .as_f64()
            .map(iblab_report::terminal::fmt_num)
            .unwrap_or_else(|| n.to_string()),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn verdict_of(e: &Evidence, live: Option<&Live>) -> &'static str {
    match live {
        Some(l) if l.stopping => "stopping",
        Some(_) => "running",
        None => match e.verdict {
            RunVerdict::Pass => "pass",
            RunVerdict::Fail => "fail",
            RunVerdict::Error => "error",
            RunVerdict::Interrupted => "interrupted",
        },
    }
}

fn step_verdict(v: Verdict) -> &'static str {
    v.as_str()
}

/// The page's view of a run (`name`: its folder under the runs folder).
pub fn of(e: &Evidence, name: &str, lang: Lang, live: Option<&Live>) -> Value {
    let run = graphs::Run {
        paths: &e.paths,
        excluded: &e.excluded_paths,
        steps: &e.steps,
        running: live.is_some(),
    };
    let gw = words::graph_words(lang);
    let graphs_html = graphs::html(&run, &gw);
    let paths: Vec<Value> = PathKind::ALL
        .into_iter()
        .map(|p| {
            let (status, reason) = match graphs::status(&run, p) {
                graphs::Status::Carried => ("carried", None),
                graphs::Status::Failed(why) => ("failed", Some(graphs::one_line(&why))),
                graphs::Status::NoThroughput => ("none", None),
                graphs::Status::NotRun(why) => ("not-run", Some(graphs::one_line(&why))),
                graphs::Status::NotInLab => ("not-run", None),
                graphs::Status::Waiting => ("waiting", None),
            };
            json!({ "path": p, "mark": p.mark(), "status": status, "reason": reason })
        })
        .collect();
    let steps: Vec<Value> = e
        .steps
        .iter()
        .map(|s| {
            json!({
                "id": s.id,
                "name": s.name,
                "path": s.path,
                "mark": s.path.map(|p| p.mark()),
                "kind": s.kind.word(),
                "verdict": step_verdict(s.verdict),
                "started_s": s.started_s,
                "duration_s": s.duration_s,
                "throughput_mbps": s.metrics.get(names::THROUGHPUT_MBPS).map(|m| m.value),
                "points": s.series.as_ref().map(|x| x.points.len()),
                "reason": s.reason.as_deref().map(graphs::one_line),
                "allowed_to_fail": s.allowed_to_fail,
            })
        })
        .collect();
    let expectations: Vec<Value> = e
        .expectations
        .iter()
        .map(|x| {
            json!({
                "id": x.id,
                "verdict": x.verdict.as_str(),
                // A run written in Chinese keeps its English too (JUnit's).
                "explanation": match (lang, &x.explanation_en) {
                    (Lang::En, Some(en)) => en,
                    _ => &x.explanation,
                },
                "expression": x.expression,
                "paths": x.paths,
            })
        })
        .collect();
    let comparison: Vec<Value> = [Group::Host, Group::Network]
        .into_iter()
        .flat_map(|g| e.comparison.rows.iter().filter(move |r| r.group == g))
        .map(|r| {
            let cells: Vec<Value> = PathKind::ALL
                .into_iter()
                .map(|p| match r.values.get(&p) {
                    Some(c) => {
                        let full = cell_text(&c.value);
                        json!({
                            "path": p,
                            "short": short(&full),
                            "full": full,
                            "provenance": c.provenance,
                        })
                    }
                    None => json!({ "path": p, "short": "—", "full": "" }),
                })
                .collect();
            json!({
                "group": r.group,
                "name": r.name,
                "unit": r.unit,
                "same": r.roce_equals_ib,
                "rule": r.rule,
                "cells": cells,
            })
        })
        .collect();
    let mut v = head(name, e);
    v["duration_s"] = json!(e.duration_s);
    v["verdict"] = json!(verdict_of(e, live));
    v["stage"] = json!(live.map(|l| l.stage.clone()));
    let more = json!({
        "steps": steps,
        "graphs": graphs_html,
        "paths": paths,
        "expectations": expectations,
        "comparison": comparison,
        "notes": e.notes,
        "report": (live.is_none()).then(|| format!("runs/{name}/report.html")),
    });
    if let (Some(o), Value::Object(m)) = (v.as_object_mut(), more) {
        o.extend(m);
    }
    v
}

/// Who a run is: its folder, lab, scenario, parameters, backend, start, verdict, and the
/// retention of each measurement that has one (the runs list shows this much).
pub fn head(name: &str, e: &Evidence) -> Value {
    json!({
        "name": name,
        "run_id": e.run_id,
        "lab": e.lab,
        "lesson": e.lesson,
        "title": e.title,
        "scenario": e.scenario,
        "backend": e.backend,
        "params": e.params,
        "started": e.started,
        "verdict": e.verdict,
        "retention": retention(e),
    })
}

fn retention(e: &Evidence) -> Vec<Value> {
    iblab_report::retention::all(e)
        .into_iter()
        .map(|((step, p), r)| {
            json!({
                "step": step,
                "path": p,
                "mark": p.mark(),
                "share": r.share,
                "of": r.of(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_one_short_line() {
        assert_eq!(short("LID 1, given by the SM"), "LID 1, given by the SM");
        assert_eq!(
            short("MAC 02:00:00:00:00:01, burnt in by the maker of the NIC; found by ARP"),
            "MAC 02:00:00:00:00:01 …"
        );
        let long = "learned by the bridge from the frames it forwarded and never written by anyone at all: 4 entries";
        let s = short(long);
        assert!(s.chars().count() <= 47 && s.ends_with('…'), "{s}");
        assert_eq!(short("a\nb"), "a");
        assert_eq!(cell_text(&json!(2.5)), "2.50");
    }

    /// A run of lesson 5 (kept evidence): the view has the three paths, the retention of
    /// the congested step per path, and the expectations in the lab's words.
    #[test]
    fn a_finished_run_of_lesson_5() {
        let e: Evidence = iblab_core::testdata::evidence(iblab_core::testdata::LESSON5_CONGESTION);
        let v = of(&e, "lesson5-congestion-x", Lang::Zh, None);
        assert_eq!(v["paths"].as_array().unwrap().len(), 3);
        assert_eq!(v["verdict"], serde_json::to_value(e.verdict).unwrap());
        let kept: Vec<&str> = v["retention"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["step"].as_str().unwrap())
            .collect();
        assert!(
            kept.iter().all(|s| *s == "congested") && kept.len() == 3,
            "{kept:?}"
        );
        assert!(
            v["graphs"]
                .as_str()
                .unwrap()
                .contains("秒（自每次传输开始）")
        );
        assert_eq!(
            v["expectations"].as_array().unwrap().len(),
            e.expectations.len()
        );
        assert_eq!(v["report"], "runs/lesson5-congestion-x/report.html");
    }
}
