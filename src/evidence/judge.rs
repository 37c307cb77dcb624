//! Judging: the evidence seen as an expression context, and expectations turned into verdicts.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{ExpectationRecord, ProvenanceKind, StepRecord, Verdict};
use crate::expr;
use crate::lab::{Needs, PathKind};
use crate::plan::{Plan, PlannedExpectation};

/// The context expressions read during and after the run: what templates read at plan
/// time ([`crate::plan::context`]), and the steps' results by id.
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
    let mut ctx = crate::plan::context(
        &plan.scenario,
        &plan.params,
        &plan.paths,
        &plan.nodes,
        &plan.backend,
    );
    ctx.insert("steps".into(), json!(by_id));
    ctx.insert("repeat".into(), json!(plan.repeat.max(1)));
    Value::Object(ctx)
}

/// Why an expectation that holds only on hardware cannot be judged in this run: what
/// produced each step instance its expression reads (`steps.ID.PATH.x` reads the instance
/// on PATH, `steps.ID.x` every instance) that is not hardware, from its provenance.
fn not_on_hardware(that: &str, steps: &[StepRecord]) -> Option<String> {
    let vars = match expr::check_expression(that) {
        Ok(v) => v,
        Err(e) => return Some(format!("cannot tell which steps it reads: {e}")),
    };
    let mut why: Vec<String> = Vec::new();
    for v in vars {
        let mut parts = v.split('.');
        if parts.next() != Some("steps") {
            continue;
        }
        let Some(id) = parts.next() else { continue };
        let path = parts.next().and_then(PathKind::parse);
        let read: Vec<&StepRecord> = steps
            .iter()
            .filter(|s| s.id == id && (path.is_none() || s.path == path))
            .collect();
        let mut said = Vec::new();
        if read.is_empty() {
            said.push(format!("step {id} has no record in this run"));
        }
        for s in read {
            let step = match s.path {
                Some(p) => format!("step {id} on path {} {p}", p.mark()),
                None => format!("step {id}"),
            };
            said.push(match &s.provenance {
                Some(p) if p.kind == ProvenanceKind::Hardware => continue,
                Some(p) => format!("{step} was measured on {}: {}", kind_word(p.kind), p.source),
                None => format!(
                    "{step} has no provenance ({})",
                    s.reason.as_deref().unwrap_or(s.verdict.as_str())
                ),
            });
        }
        for w in said {
            if !why.contains(&w) {
                why.push(w);
            }
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

fn kind_word(k: ProvenanceKind) -> &'static str {
    match k {
        ProvenanceKind::Hardware => "hardware",
        ProvenanceKind::Soft => "soft",
        ProvenanceKind::Emulated => "emulated",
        ProvenanceKind::Modelled => "modelled",
    }
}

/// Judge one expectation against the context (`steps`: the records it was made from).
pub fn judge(
    plan: &Plan,
    e: &PlannedExpectation,
    ctx: &Value,
    steps: &[StepRecord],
) -> ExpectationRecord {
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
        && let Some(why) = not_on_hardware(&e.that, steps)
    {
        rec.explanation = format!("not judged: it holds only on hardware, and {why}");
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
            let tolerance = spec.tolerance.as_ref();
            let (roce_equals_ib, mut rule) =
                match (values.get(&PathKind::Roce), values.get(&PathKind::Ib)) {
                    (Some(a), Some(b)) => super::agree(&a.value, &b.value, tolerance),
                    _ => (None, String::new()),
                };
            if let (Some(t), false) = (&spec.tolerance, rule.is_empty()) {
                rule = format!("{rule}: {}", t.why);
            }
            ComparisonRow {
                group: match spec.group {
                    crate::lab::CompareGroup::Host => Group::Host,
                    crate::lab::CompareGroup::Network => Group::Network,
                },
                name: spec.row.clone(),
                unit: spec.unit.clone().unwrap_or_default(),
                values,
                roce_equals_ib,
                rule,
                better: spec.better,
                needs_hardware: spec.needs == Some(crate::lab::Needs::Hardware),
                floor: spec.tolerance.as_ref().and_then(|t| t.absolute),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::Provenance;

    const LAB: &str = r#"
apiVersion: iblab.dev/v1
kind: Lab
metadata: { name: judged, title: Judged }
spec:
  topology:
    nodes: [a, b]
    switches: [sw1]
    links:
      - { ends: [a, sw1] }
      - { ends: [b, sw1] }
  paths: [tcp, ib]
  steps:
    - id: clean
      traffic: { from: b, to: a, seconds: 1, paths: [tcp] }
    - id: send
      traffic: { from: b, to: a, seconds: 1, paths: [ib] }
  expect:
    - id: tcp_claim
      needs: hardware
      that: steps.clean.tcp.throughput_mbps > 0
      because: TCP moves bytes.
    - id: ib_claim
      needs: hardware
      that: steps.send.ib.delivered == 1
      because: The subnet delivers.
"#;

    fn plan() -> Plan {
        let lab = crate::lab::load::load_str("judged.yaml", LAB).unwrap();
        let req = crate::plan::Request {
            scenario: None,
            backend: "local".into(),
            paths: None,
            hca: None,
        };
        crate::plan::plan(&lab, &req, &crate::caps::HostCaps::probe()).unwrap()
    }

    /// The records of a run on the local backend: tcp over veth (soft), ib emulated.
    fn records(plan: &Plan) -> Vec<StepRecord> {
        plan.steps
            .iter()
            .map(|s| {
                let mut r = crate::steps::blank(s, 0.0);
                let (kind, source, metric) = match s.path {
                    Some(PathKind::Ib) => (
                        ProvenanceKind::Emulated,
                        "delivery decided by the emulated subnet (ibsim)",
                        "delivered",
                    ),
                    _ => (
                        ProvenanceKind::Soft,
                        "iperf3 over the kernel TCP stack on veth links (no NIC)",
                        "throughput_mbps",
                    ),
                };
                r.provenance = Some(Provenance {
                    kind,
                    source: source.into(),
                });
                r.metrics
                    .insert(metric.into(), crate::evidence::Metric::new(1.0, "x"));
                r
            })
            .collect()
    }

    /// Each `needs: hardware` skip says why from the steps it reads, not one fixed sentence.
    #[test]
    fn a_hardware_skip_names_the_provenance_of_what_it_reads() {
        let plan = plan();
        let recs = records(&plan);
        let ctx = context(&plan, &recs);
        let judged = |id: &str| {
            let e = plan.expectations.iter().find(|e| e.id == id).unwrap();
            judge(&plan, e, &ctx, &recs)
        };
        let tcp = judged("tcp_claim");
        let ib = judged("ib_claim");
        assert_eq!(tcp.verdict, Verdict::Skipped);
        assert_eq!(ib.verdict, Verdict::Skipped);
        for (rec, step, kind, source, other) in [
            (&tcp, "clean", "soft", "iperf3", "ibsim"),
            (&ib, "send", "emulated", "ibsim", "iperf3"),
        ] {
            let why = &rec.explanation;
            assert!(why.contains(&format!("step {step}")), "{why}");
            assert!(why.contains(kind), "{why}");
            assert!(why.contains(source), "{why}");
            assert!(!why.contains(other), "{why}");
            assert!(!why.contains("rxe"), "{why}");
        }
    }

    /// What plan-time templates read, judged expressions read too: one context shape, and
    /// every name validation lets an expectation read is in it.
    #[test]
    fn judged_expressions_read_what_templates_read() {
        let plan = plan();
        let ctx = context(&plan, &records(&plan));
        let mut names: Vec<String> = expr::ROOTS
            .iter()
            .filter(|r| r.1 <= expr::Phase::Run)
            .map(|r| r.0.to_string())
            .collect();
        names.extend(expr::NODE_FIELDS.iter().map(|f| format!("nodes.a.{f}")));
        for name in &names {
            assert!(
                expr::eval(name, &ctx).is_ok_and(|v| !v.is_null()),
                "`{name}` is missing when expectations are judged: {ctx}"
            );
        }
        assert_eq!(ctx["nodes"]["a"]["interfaces"], json!(["eth0"]), "{ctx}");
    }
}
