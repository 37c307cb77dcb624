//! Judging: the evidence seen as an expression context, and expectations turned into verdicts.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{ExpectationRecord, StepRecord, Verdict};
use crate::expr;
use crate::lab::{Needs, PathKind};
use crate::plan::{Plan, PlannedExpectation};

/// The context expressions read: scenario, params, paths, nodes, backend and steps by id.
pub fn context(plan: &Plan, steps: &[StepRecord]) -> Value {
    let mut by_id: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for s in steps {
        let entry = by_id.entry(s.id.clone()).or_default();
        let mut fields = Map::new();
        fields.insert("ok".into(), json!(s.verdict == Verdict::Pass));
        fields.insert("verdict".into(), json!(s.verdict.as_str()));
        fields.insert("skipped".into(), json!(s.verdict == Verdict::Skipped));
        fields.insert("duration_s".into(), json!(s.duration_s));
        if let Some(p) = &s.provenance {
            fields.insert("provenance".into(), json!(p.kind));
        }
        for (k, m) in &s.metrics {
            fields.insert(k.clone(), json!(m.value));
        }
        if let Value::Object(d) = &s.detail {
            for key in [
                "exit_code",
                "stdout",
                "stderr",
                "attempts",
                "result",
                "json",
            ] {
                if let Some(v) = d.get(key) {
                    fields.insert(key.into(), v.clone());
                }
            }
            // What probes observed (ports, routes, traces) reads as `steps.ID.<fact>`.
            if let Some(Value::Object(facts)) = d.get("facts") {
                for (k, v) in facts {
                    fields.insert(k.clone(), v.clone());
                }
            }
        }
        match s.path {
            Some(p) => {
                entry.insert(p.as_str().into(), Value::Object(fields));
            }
            None => entry.extend(fields),
        }
    }
    // For per-path steps: ok when every instance that ran passed and at least one ran.
    for (id, entry) in by_id.iter_mut() {
        let instances: Vec<&StepRecord> = steps
            .iter()
            .filter(|s| &s.id == id && s.path.is_some())
            .collect();
        if !instances.is_empty() {
            let ran: Vec<_> = instances
                .iter()
                .filter(|s| s.verdict != Verdict::Skipped)
                .collect();
            entry.insert(
                "ok".into(),
                json!(!ran.is_empty() && ran.iter().all(|s| s.verdict == Verdict::Pass)),
            );
            entry.insert("skipped".into(), json!(ran.is_empty()));
        }
    }
    let nodes: Map<String, Value> = plan
        .nodes
        .iter()
        .filter(|n| !n.switch)
        .map(|n| {
            let ip = n
                .interfaces
                .first()
                .and_then(|i| i.address.as_deref())
                .and_then(|a| a.split('/').next())
                .unwrap_or("");
            (n.name.clone(), json!({"ip": ip}))
        })
        .collect();
    json!({
        "scenario": plan.scenario,
        "params": plan.params,
        "paths": plan.paths.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
        "nodes": nodes,
        "backend": plan.backend,
        "steps": by_id,
    })
}

/// Which step an expression reads ran on something other than hardware, if any
/// (`steps.ID.PATH.x` reads the step's instance on PATH, `steps.ID.x` the step).
fn not_on_hardware(that: &str, ctx: &Value) -> Option<String> {
    let vars = match expr::check_expression(that) {
        Ok(v) => v,
        Err(e) => return Some(format!("cannot tell which steps it reads: {e}")),
    };
    for v in vars {
        let mut parts = v.split('.');
        if parts.next() != Some("steps") {
            continue;
        }
        let Some(id) = parts.next() else { continue };
        let step = &ctx["steps"][id];
        let (shown, inst) = match parts.next() {
            Some(p) if step.get(p).is_some_and(Value::is_object) => (format!("{id}.{p}"), &step[p]),
            _ => (id.to_string(), step),
        };
        match inst.get("provenance").and_then(Value::as_str) {
            Some("hardware") => {}
            Some(kind) => return Some(format!("step {shown} is {kind}")),
            None => return Some(format!("step {shown} has no hardware provenance")),
        }
    }
    None
}

/// Judge one expectation against the context.
pub fn judge(plan: &Plan, e: &PlannedExpectation, ctx: &Value) -> ExpectationRecord {
    let mut rec = ExpectationRecord {
        id: e.id.clone(),
        verdict: Verdict::Skipped,
        expression: e.that.clone(),
        observed: BTreeMap::new(),
        explanation: String::new(),
        because: e.because.clone(),
        on_fail: e.on_fail.clone(),
        paths: e.paths.clone(),
    };
    if let Some(p) = e.paths.iter().find(|p| !plan.paths.contains(p)) {
        let why = plan
            .excluded
            .get(p)
            .cloned()
            .unwrap_or_else(|| "not in this run".into());
        rec.explanation = format!(
            "not judged: it is about path {} {p}, which is {why}",
            p.mark()
        );
        return rec;
    }
    if let Some(w) = &e.when {
        match expr::eval_bool(w, ctx) {
            Ok(true) => {}
            Ok(false) => {
                rec.explanation = format!(
                    "not judged in scenario {}: `when: {w}` is false",
                    plan.scenario
                );
                return rec;
            }
            Err(err) => {
                rec.verdict = Verdict::Error;
                rec.explanation = format!("could not evaluate `when: {w}`: {err}");
                return rec;
            }
        }
    }
    if e.needs == Some(Needs::Hardware)
        && let Some(why) = not_on_hardware(&e.that, ctx)
    {
        rec.explanation =
            format!("not judged: holds only on hardware: rxe's post is a write() syscall ({why})");
        return rec;
    }
    if let Ok(vars) = expr::check_expression(&e.that) {
        for v in vars {
            let val =
                expr::eval(&v, ctx).unwrap_or_else(|err| json!(format!("<undefined: {err}>")));
            rec.observed.insert(v, val);
        }
    }
    match expr::eval_bool(&e.that, ctx) {
        Ok(true) => {
            rec.verdict = Verdict::Pass;
            rec.explanation = e.because.clone();
        }
        Ok(false) => {
            rec.verdict = Verdict::Fail;
            rec.explanation = e
                .on_fail
                .clone()
                .unwrap_or_else(|| format!("The evidence does not show this: {}", e.because));
        }
        Err(err) => {
            rec.verdict = Verdict::Error;
            rec.explanation =
                format!("could not evaluate: {err} (did a step it reads fail or get skipped?)");
        }
    }
    rec
}

/// The comparison rows a lab declares, each cell its expression's value in this run, with
/// the provenance of the step it reads. A cell whose expression cannot be evaluated (its
/// step skipped or failed) is left empty, never guessed.
pub fn declared_rows(plan: &Plan, ctx: &Value, steps: &[StepRecord]) -> Vec<super::ComparisonRow> {
    use super::{Cell, ComparisonRow, Group, ProvenanceKind};
    plan.compare
        .iter()
        .map(|spec| {
            let mut values = BTreeMap::new();
            for (path, e) in spec.cells() {
                if !plan.paths.contains(&path) {
                    continue;
                }
                let Ok(v) = expr::eval(e, ctx) else { continue };
                if v.is_null() {
                    continue;
                }
                // Provenance: the step the expression reads (its instance on this path).
                let id = expr::check_expression(e).ok().and_then(|vars| {
                    vars.iter().find_map(|v| {
                        v.strip_prefix("steps.")
                            .map(|r| r.split('.').next().unwrap_or("").to_string())
                    })
                });
                let prov = id
                    .and_then(|id| {
                        steps
                            .iter()
                            .filter(|s| s.id == id)
                            .find(|s| s.path.is_none() || s.path == Some(path))
                            .and_then(|s| s.provenance.as_ref().map(|p| p.kind))
                    })
                    .unwrap_or(ProvenanceKind::Modelled);
                values.insert(
                    path,
                    Cell {
                        value: v,
                        provenance: prov,
                    },
                );
            }
            let roce_equals_ib = match (values.get(&PathKind::Roce), values.get(&PathKind::Ib)) {
                (Some(a), Some(b)) => Some(super::agree(&a.value, &b.value)),
                _ => None,
            };
            ComparisonRow {
                group: match spec.group {
                    crate::lab::CompareGroup::Host => Group::Host,
                    crate::lab::CompareGroup::Network => Group::Network,
                },
                name: spec.row.clone(),
                unit: spec.unit.clone().unwrap_or_default(),
                values,
                roce_equals_ib,
            }
        })
        .collect()
}
