//! Judging: the evidence seen as an expression context, and expectations turned into verdicts.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{ExpectationRecord, ProvenanceKind, StepRecord, Verdict};
use crate::plan::{Plan, PlannedExpectation};
use iblab_lab::expr;
use iblab_lab::{Lang, Needs, PathKind};
use rust_i18n::t;

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
        fields.insert("runs".into(), Value::Object(each_run(s)));
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
        &plan.backend_facts,
    );
    ctx.insert("steps".into(), json!(by_id));
    ctx.insert("repeat".into(), json!(plan.repeat.max(1)));
    Value::Object(ctx)
}

/// `steps.ID[.PATH].runs.METRIC`: every repetition's value of each metric, in the order
/// they ran (one value where the step ran once), so an expectation can judge a figure with
/// its spread (`| min`, `| max`) and not only its median.
fn each_run(s: &StepRecord) -> Map<String, Value> {
    let figures = &s.detail["repeat"]["figures"];
    s.metrics
        .iter()
        .map(|(k, m)| {
            let values = match figures[k.as_str()]["values"].as_array() {
                Some(v) if !v.is_empty() => Value::Array(v.clone()),
                _ => json!([m.value]),
            };
            (k.clone(), values)
        })
        .collect()
}

/// With `up --repeat N`, the context of each run on its own: every repeated step's
/// metrics set to that run's values (a metric some run did not measure keeps its
/// median). Empty when nothing was repeated.
fn run_contexts(plan: &Plan, steps: &[StepRecord]) -> Vec<Value> {
    let n = plan.repeat as usize;
    if n <= 1 {
        return vec![];
    }
    (0..n)
        .map(|k| {
            let mut these = steps.to_vec();
            for s in these.iter_mut() {
                let figures = s.detail["repeat"]["figures"].clone();
                for (name, m) in s.metrics.iter_mut() {
                    let values = figures[name.as_str()]["values"].as_array();
                    if let Some(v) = values.filter(|v| v.len() == n).and_then(|v| v[k].as_f64()) {
                        m.value = v;
                    }
                }
            }
            context(plan, &these)
        })
        .collect()
}

/// The step id a variable of an expression reads and the step instances it reads
/// (`steps.ID.PATH.x` the instance on PATH, `steps.ID.x` every instance); `None` for a
/// variable that reads no step.
fn instances_read<'v, 's>(
    var: &'v str,
    steps: &'s [StepRecord],
) -> Option<(&'v str, Vec<&'s StepRecord>)> {
    let mut parts = var.split('.');
    if parts.next() != Some("steps") {
        return None;
    }
    let id = parts.next()?;
    let path = parts.next().and_then(PathKind::parse);
    let read = steps
        .iter()
        .filter(|s| s.id == id && (path.is_none() || s.path == path))
        .collect();
    Some((id, read))
}

/// Why an expectation cannot be judged at all: every step instance its expression reads
/// was skipped by the plan (not by a failure or a `when` at run time), with the plan's
/// first reason. `None` when any of them ran, or one was skipped while the run went.
fn skipped_by_plan(plan: &Plan, that: &str, steps: &[StepRecord]) -> Option<String> {
    let vars = expr::check_expression(that).ok()?;
    let mut reason = None;
    let mut read_any = false;
    for v in vars {
        let Some((_, read)) = instances_read(&v, steps) else {
            continue;
        };
        for s in read {
            read_any = true;
            let planned = plan
                .steps
                .iter()
                .find(|p| p.id == s.id && p.path == s.path)
                .and_then(|p| p.skip.as_ref());
            match planned {
                Some(why) if s.verdict == Verdict::Skipped => {
                    reason.get_or_insert_with(|| why.clone());
                }
                _ => return None,
            }
        }
    }
    if read_any { reason } else { None }
}

/// Why an expectation that holds only on hardware cannot be judged in this run: what
/// produced each step instance its expression reads (`steps.ID.PATH.x` reads the instance
/// on PATH, `steps.ID.x` every instance) that is not hardware, from its provenance; in
/// `lang`.
fn not_on_hardware(that: &str, steps: &[StepRecord], lang: Lang) -> Option<String> {
    let l = lang.tag();
    let vars = match expr::check_expression(that) {
        Ok(v) => v,
        Err(e) => return Some(t!("judge.cannot_tell", locale = l, err = e).into_owned()),
    };
    let mut why: Vec<String> = Vec::new();
    for v in vars {
        let Some((id, read)) = instances_read(&v, steps) else {
            continue;
        };
        let mut said = Vec::new();
        if read.is_empty() {
            said.push(t!("judge.no_record", locale = l, id = id).into_owned());
        }
        for s in read {
            let step = match s.path {
                Some(p) => {
                    t!(
                        "judge.step_on_path",
                        locale = l,
                        id = id,
                        mark = p.mark(),
                        path = p
                    )
                }
                None => t!("judge.step", locale = l, id = id),
            };
            said.push(match &s.provenance {
                Some(p) if p.kind == ProvenanceKind::Hardware => continue,
                Some(p) => t!(
                    "judge.measured_on",
                    locale = l,
                    step = step,
                    kind = p.kind.word(lang),
                    source = p.source
                )
                .into_owned(),
                None => t!(
                    "judge.no_provenance",
                    locale = l,
                    step = step,
                    why = s.reason.as_deref().unwrap_or(s.verdict.as_str())
                )
                .into_owned(),
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

/// What judging an expectation found, before it is said in a language.
enum Outcome {
    /// It is about a path the run left out (with the plan's reason).
    PathOut(PathKind, Option<String>),
    /// Its `when` is false: over results (this run's), or over the scenario.
    WhenFalse(String, bool),
    WhenError(String, String),
    /// The steps it reads were skipped by the plan (the plan's first reason).
    NotRun(String),
    /// It needs hardware and reads steps that were not.
    NotOnHardware,
    /// It needs ② and ③ on devices of their own, and they shared these.
    SameDevice(Vec<String>),
    /// It reads a figure step `id` could not observe where it ran (`name`, `why`).
    Unobserved {
        id: String,
        name: String,
        why: String,
    },
    Held,
    Failed,
    EvalError(String),
}

/// What the learner reads of an outcome, in `lang`.
fn explain(
    o: &Outcome,
    plan: &Plan,
    e: &PlannedExpectation,
    steps: &[StepRecord],
    lang: Lang,
) -> String {
    let l = lang.tag();
    match o {
        Outcome::PathOut(p, why) => {
            let why = match why {
                Some(w) => reason(w, lang),
                None => t!("judge.not_in_run", locale = l).into_owned(),
            };
            t!(
                "judge.path_out",
                locale = l,
                mark = p.mark(),
                path = p,
                why = why
            )
            .into_owned()
        }
        Outcome::WhenFalse(w, run) => t!(
            if *run {
                "judge.when_false_run"
            } else {
                "judge.when_false"
            },
            locale = l,
            scenario = plan.scenario,
            when = w
        )
        .into_owned(),
        Outcome::WhenError(w, err) => {
            t!("judge.when_error", locale = l, when = w, err = err).into_owned()
        }
        Outcome::NotRun(why) => t!("judge.not_run", locale = l, why = why).into_owned(),
        Outcome::NotOnHardware => {
            let why = not_on_hardware(&e.that, steps, lang).unwrap_or_default();
            t!("judge.needs_hardware", locale = l, why = why).into_owned()
        }
        Outcome::SameDevice(shared) => {
            t!("judge.same_device", locale = l, devices = shared.join(", ")).into_owned()
        }
        Outcome::Unobserved { id, name, why } => t!(
            "judge.unobserved",
            locale = l,
            id = id,
            name = name,
            why = why
        )
        .into_owned(),
        Outcome::Held => e.because.get(lang).to_string(),
        Outcome::Failed => match &e.on_fail {
            Some(f) => f.get(lang).to_string(),
            None => t!("judge.not_shown", locale = l, because = e.because.get(lang)).into_owned(),
        },
        Outcome::EvalError(err) => t!("judge.eval_error", locale = l, err = err).into_owned(),
    }
}

/// The verbs devices that both path ② and path ③ used in the step instances `that` reads;
/// `None` when they share none (or the expression reads no use of one of them).
fn shared_devices_read(that: &str, steps: &[StepRecord]) -> Option<Vec<String>> {
    let vars = expr::check_expression(that).ok()?;
    let mut read_all: Vec<&StepRecord> = Vec::new();
    for v in vars {
        if let Some((_, read)) = instances_read(&v, steps) {
            read_all.extend(read);
        }
    }
    same_devices(&read_all)
}

/// Why `that` cannot be judged in this run: it reads a figure a step was asked for and
/// could not observe where it ran (its `unobserved`): the first such step, figure and
/// reason.
fn unobserved_read(that: &str, steps: &[StepRecord]) -> Option<(String, String, String)> {
    let vars = expr::check_expression(that).ok()?;
    for v in vars {
        let Some((id, read)) = instances_read(&v, steps) else {
            continue;
        };
        // `steps.ID.NAME…` or `steps.ID.PATH.NAME…`: the name the step records.
        let mut rest = v.split('.').skip(2);
        let first = rest.next();
        let name = match first.and_then(PathKind::parse) {
            Some(_) => rest.next(),
            None => first,
        };
        let Some(name) = name else { continue };
        for s in read {
            if let Some(why) = s.unobserved.get(name) {
                return Some((id.to_string(), name.to_string(), why.clone()));
            }
        }
    }
    None
}

/// The devices both path ② and path ③ used in `records`, by name, sorted; `None` when
/// they share none.
fn same_devices(records: &[&StepRecord]) -> Option<Vec<String>> {
    let used = |records: &[&StepRecord], p: PathKind| -> Vec<String> {
        records
            .iter()
            .flat_map(|s| s.devices.iter())
            .filter(|d| d.path == p)
            .map(|d| d.name())
            .collect()
    };
    let ib = used(records, PathKind::Ib);
    let mut both: Vec<String> = used(records, PathKind::Roce)
        .into_iter()
        .filter(|d| ib.contains(d))
        .collect();
    both.sort();
    both.dedup();
    (!both.is_empty()).then_some(both)
}

/// A reason iblab's machinery gave (a path left out, a step skipped), in `lang` where it is
/// one of the fixed ones it knows the words of, else as it was given.
pub fn reason(why: &str, lang: Lang) -> String {
    match why {
        "left out with --paths" => t!("reason.left_out", locale = lang.tag()).into_owned(),
        other => other.to_string(),
    }
}

/// Judge one expectation against the context (`steps`: the records it was made from); its
/// explanation in the plan's language (and in English too, for JUnit, when that is
/// another).
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
        explanation_en: None,
        because: e.because.get(plan.lang).to_string(),
        on_fail: e.on_fail.as_ref().map(|f| f.get(plan.lang).to_string()),
        paths: e.paths.clone(),
    };
    let outcome = outcome(plan, e, ctx, steps, &mut rec);
    rec.explanation = explain(&outcome, plan, e, steps, plan.lang);
    if plan.lang != Lang::En {
        rec.explanation_en = Some(explain(&outcome, plan, e, steps, Lang::En));
    }
    rec
}

/// What judging `e` finds; its verdict and the values it read go into `rec`.
fn outcome(
    plan: &Plan,
    e: &PlannedExpectation,
    ctx: &Value,
    steps: &[StepRecord],
    rec: &mut ExpectationRecord,
) -> Outcome {
    if let Some(p) = e.paths.iter().find(|p| !plan.paths.contains(p)) {
        return Outcome::PathOut(*p, plan.excluded.get(p).cloned());
    }
    if let Some(w) = &e.when {
        match expr::eval_bool(w, ctx) {
            Ok(true) => {}
            Ok(false) => {
                // A `when` over results is about this run, one over the scenario about it.
                let reads_steps = expr::check_expression(w)
                    .is_ok_and(|vars| vars.iter().any(|v| v.starts_with("steps.")));
                return Outcome::WhenFalse(w.clone(), reads_steps);
            }
            Err(err) => {
                rec.verdict = Verdict::Error;
                return Outcome::WhenError(w.clone(), err.to_string());
            }
        }
    }
    if let Some(why) = skipped_by_plan(plan, &e.that, steps) {
        return Outcome::NotRun(why);
    }
    if e.needs == Some(Needs::Hardware) && not_on_hardware(&e.that, steps, Lang::En).is_some() {
        return Outcome::NotOnHardware;
    }
    if e.needs == Some(Needs::SeparateDevices)
        && let Some(shared) = shared_devices_read(&e.that, steps)
    {
        return Outcome::SameDevice(shared);
    }
    if let Some((id, name, why)) = unobserved_read(&e.that, steps) {
        return Outcome::Unobserved { id, name, why };
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
            Outcome::Held
        }
        Ok(false) => {
            rec.verdict = Verdict::Fail;
            Outcome::Failed
        }
        Err(err) => {
            rec.verdict = Verdict::Error;
            Outcome::EvalError(err.to_string())
        }
    }
}

/// The comparison rows a lab declares, each cell its expression's value in this run (the
/// expression of the plan's language where a cell has one per language), with the
/// provenance of the step it reads. A cell whose expression cannot be evaluated (its step
/// skipped or failed) is left empty, never guessed.
pub fn declared_rows(plan: &Plan, ctx: &Value, steps: &[StepRecord]) -> Vec<super::ComparisonRow> {
    let per_run = run_contexts(plan, steps);
    plan.compare
        .iter()
        .enumerate()
        .map(|(index, spec)| declared_row(plan, ctx, steps, &per_run, index, spec))
        .collect()
}

/// One declared row: its cells, and whether ② and ③ agree on it.
fn declared_row(
    plan: &Plan,
    ctx: &Value,
    steps: &[StepRecord],
    per_run: &[Value],
    index: usize,
    spec: &iblab_lab::CompareSpec,
) -> super::ComparisonRow {
    use super::{ComparisonRow, Group};
    let lang = plan.lang;
    let (values, devices) = row_cells(plan, ctx, steps, per_run, spec);
    let (roce_equals_ib, same_device, rule) =
        roce_vs_ib(lang, spec, &values, &devices, per_run.len());
    ComparisonRow {
        id: iblab_lab::compare_id(spec, index),
        group: match spec.group {
            iblab_lab::CompareGroup::Host => Group::Host,
            iblab_lab::CompareGroup::Network => Group::Network,
        },
        name: spec.row.get(lang).to_string(),
        unit: spec
            .unit
            .as_ref()
            .map(|u| u.get(lang).to_string())
            .unwrap_or_default(),
        values,
        roce_equals_ib,
        same_device,
        rule,
        better: spec.better,
        needs_hardware: spec.needs == Some(iblab_lab::Needs::Hardware),
        floor: spec.tolerance.as_ref().and_then(|t| t.absolute),
    }
}

/// Each path's cell of a row that the run has a value for, and the step record each
/// reads (for its device).
fn row_cells<'a>(
    plan: &Plan,
    ctx: &Value,
    steps: &'a [StepRecord],
    per_run: &[Value],
    spec: &iblab_lab::CompareSpec,
) -> (
    BTreeMap<PathKind, super::Cell>,
    BTreeMap<PathKind, &'a StepRecord>,
) {
    use super::{Cell, ProvenanceKind};
    let lang = plan.lang;
    let mut values = BTreeMap::new();
    let details: BTreeMap<PathKind, &str> = spec
        .detail
        .iter()
        .flat_map(|d| d.cells())
        .map(|(p, t)| (p, t.get(lang)))
        .collect();
    let mut devices: BTreeMap<PathKind, &StepRecord> = BTreeMap::new();
    for (path, e) in spec.cells() {
        let e = e.get(lang);
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
        let read = id.and_then(|id| {
            steps
                .iter()
                .filter(|s| s.id == id)
                .find(|s| s.path.is_none() || s.path == Some(path))
        });
        let prov = read
            .and_then(|s| s.provenance.as_ref().map(|p| p.kind))
            .unwrap_or(ProvenanceKind::Modelled);
        if let Some(s) = read {
            devices.insert(path, s);
        }
        let range = v.as_f64().and_then(|_| {
            let each: Vec<f64> = per_run
                .iter()
                .filter_map(|c| expr::eval(e, c).ok()?.as_f64())
                .collect();
            (each.len() == per_run.len() && each.len() > 1).then(|| {
                [
                    each.iter().copied().fold(f64::INFINITY, f64::min),
                    each.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ]
            })
        });
        let detail = details
            .get(&path)
            .and_then(|d| expr::eval(d, ctx).ok())
            .filter(|d| !d.is_null())
            .map(|d| match d {
                Value::String(s) => s,
                other => other.to_string(),
            });
        values.insert(
            path,
            Cell {
                value: v,
                provenance: prov,
                range,
                detail,
            },
        );
    }
    (values, devices)
}

/// Whether ② and ③ agree on a row and by which rule (its tolerance, else the spread of
/// `runs` repeated runs); where both were measured on one device, not decided, and the
/// devices.
fn roce_vs_ib(
    lang: Lang,
    spec: &iblab_lab::CompareSpec,
    values: &BTreeMap<PathKind, super::Cell>,
    devices: &BTreeMap<PathKind, &StepRecord>,
    runs: usize,
) -> (Option<bool>, Vec<String>, String) {
    let tolerance = spec.tolerance.as_ref();
    let (roce_equals_ib, mut rule) = match (values.get(&PathKind::Roce), values.get(&PathKind::Ib))
    {
        // No declared tolerance, but repeated runs: the figure's own spread.
        (Some(a), Some(b)) if tolerance.is_none() => match (a.range, b.range) {
            (Some(x), Some(y)) => (
                Some(x[0] <= y[1] && y[0] <= x[1]),
                t!("rule.ranges", locale = lang.tag(), runs = runs).into_owned(),
            ),
            _ => super::agree(&a.value, &b.value, tolerance, lang),
        },
        (Some(a), Some(b)) => super::agree(&a.value, &b.value, tolerance, lang),
        _ => (None, String::new()),
    };
    if let (Some(tol), false) = (&spec.tolerance, rule.is_empty()) {
        let sep = if lang == Lang::ZhCn { "：" } else { ": " };
        rule = format!("{rule}{sep}{}", tol.why.get(lang));
    }
    // Both measured on one device: they agree by construction, whatever the rule.
    let same_device = match (devices.get(&PathKind::Roce), devices.get(&PathKind::Ib)) {
        (Some(a), Some(b))
            if values.contains_key(&PathKind::Roce) && values.contains_key(&PathKind::Ib) =>
        {
            same_devices(&[*a, *b])
        }
        _ => None,
    }
    .unwrap_or_default();
    if same_device.is_empty() {
        return (roce_equals_ib, same_device, rule);
    }
    rule = t!(
        "rule.same_device",
        locale = lang.tag(),
        devices = same_device.join(", ")
    )
    .into_owned();
    (None, same_device, rule)
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
        let lab = iblab_lab::load::load_str("judged.yaml", LAB).unwrap();
        let req = crate::plan::Request {
            scenario: None,
            backend: "local".into(),
            paths: None,
            hca: None,
            run: None,
            lang: Lang::En,
        };
        crate::plan::plan(
            &lab,
            &req,
            &crate::caps::HostCaps::for_tests(),
            &crate::plan::backend::testing::backends(),
        )
        .unwrap()
    }

    /// The records of a run on the local backend: tcp over veth (soft), ib emulated.
    fn records(plan: &Plan) -> Vec<StepRecord> {
        plan.steps
            .iter()
            .map(|s| {
                let mut r = crate::evidence::blank(s, 0.0);
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

    /// `runs.METRIC` holds every repetition's value (one where the step ran once), so an
    /// expectation can judge two paths by whether their runs' ranges are apart.
    #[test]
    fn each_runs_values_read_as_a_list() {
        let plan = plan();
        let mut recs = records(&plan);
        let ctx = context(&plan, &recs);
        assert_eq!(
            expr::eval("steps.clean.tcp.runs.throughput_mbps", &ctx).unwrap(),
            json!([1.0])
        );
        let clean = recs.iter_mut().find(|r| r.id == "clean").unwrap();
        clean.detail = serde_json::json!({"repeat": {"runs": 3, "figures": {
            "throughput_mbps": {"values": [80.0, 2000.0, 100.0], "median": 100.0}
        }}});
        let ctx = context(&plan, &recs);
        let v = |e: &str| expr::eval_bool(e, &ctx).unwrap();
        assert!(v(
            "steps.clean.tcp.runs.throughput_mbps == [80.0, 2000.0, 100.0]"
        ));
        assert!(v("(steps.clean.tcp.runs.throughput_mbps | min) == 80"));
        assert!(v("(steps.clean.tcp.runs.throughput_mbps | max) == 2000"));
    }

    /// A row whose ② and ③ cells were measured on one device is not decided, whatever its
    /// rule says of the values, and says so; on devices of their own it is decided. A
    /// `needs: separate-devices` claim likewise is skipped, then judged.
    #[test]
    fn one_device_under_both_paths_decides_nothing() {
        use crate::evidence::DeviceUse;
        let mut plan = plan();
        plan.paths = vec![PathKind::Tcp, PathKind::Roce, PathKind::Ib];
        plan.compare = vec![iblab_lab::CompareSpec {
            id: None,
            row: "status".into(),
            group: iblab_lab::CompareGroup::Host,
            unit: None,
            tcp: None,
            roce: Some("steps.send.roce.status".into()),
            ib: Some("steps.send.ib.status".into()),
            detail: None,
            tolerance: None,
            better: None,
            needs: None,
        }];
        let mut x = plan.expectations[1].clone();
        x.needs = Some(Needs::SeparateDevices);
        x.paths = vec![];
        x.that = "steps.send.roce.status == steps.send.ib.status".into();
        let rec = |p: PathKind, device: &str| {
            let mut r = crate::evidence::blank(&plan.steps[1], 0.0);
            r.path = Some(p);
            r.detail = json!({"facts": {"status": "IBV_WC_WR_FLUSH_ERR"}});
            r.devices = vec![DeviceUse::new(p, "a", device)];
            r
        };
        let one = vec![rec(PathKind::Roce, "a-rxe0"), rec(PathKind::Ib, "a-rxe0")];
        let rows = declared_rows(&plan, &context(&plan, &one), &one);
        assert_eq!(rows[0].roce_equals_ib, None);
        assert_eq!(rows[0].same_device, vec!["a/a-rxe0".to_string()]);
        assert!(
            rows[0].rule.contains("same device here"),
            "{}",
            rows[0].rule
        );
        let j = judge(&plan, &x, &context(&plan, &one), &one);
        assert_eq!(j.verdict, Verdict::Skipped);
        assert!(
            j.explanation.contains("same device here (a/a-rxe0)"),
            "{}",
            j.explanation
        );
        let two = vec![rec(PathKind::Roce, "a-rxe0"), rec(PathKind::Ib, "mlx5_0")];
        let rows = declared_rows(&plan, &context(&plan, &two), &two);
        assert_eq!(rows[0].roce_equals_ib, Some(true));
        assert!(rows[0].same_device.is_empty());
        assert_eq!(
            judge(&plan, &x, &context(&plan, &two), &two).verdict,
            Verdict::Pass
        );
    }

    /// A figure the step could not observe where it ran (tcpdump refused in a pod) leaves
    /// the claim that reads it not judged, with the step's reason; observed, the same
    /// claim is judged, and fails when the figure says it is false.
    #[test]
    fn a_figure_not_observed_here_judges_nothing() {
        let plan = plan();
        let mut x = plan.expectations[1].clone();
        x.paths = vec![];
        x.needs = None;
        x.that = "steps.send.roce.exchange_tcp_packets >= 3".into();
        let rec = |unobserved: bool, packets: f64| {
            let mut r = crate::evidence::blank(&plan.steps[1], 0.0);
            r.path = Some(PathKind::Roce);
            if unobserved {
                r.unobserved.insert(
                    "exchange_tcp_packets".into(),
                    "tcpdump could not start: Operation not permitted".into(),
                );
            } else {
                r.metrics.insert(
                    "exchange_tcp_packets".into(),
                    crate::evidence::Metric::new(packets, "packets"),
                );
            }
            vec![r]
        };
        let none = rec(true, 0.0);
        let j = judge(&plan, &x, &context(&plan, &none), &none);
        assert_eq!(j.verdict, Verdict::Skipped);
        assert_eq!(
            j.explanation,
            "not judged: steps.send could not observe `exchange_tcp_packets` here: tcpdump could not start: Operation not permitted"
        );
        for (packets, verdict) in [(4.0, Verdict::Pass), (0.0, Verdict::Fail)] {
            let seen = rec(false, packets);
            assert_eq!(
                judge(&plan, &x, &context(&plan, &seen), &seen).verdict,
                verdict
            );
        }
    }

    /// With `--repeat`, a numeric row without a tolerance decides ② = ③ by whether the
    /// ranges its expression takes over the runs overlap, and keeps each cell's range.
    #[test]
    fn repeated_runs_decide_by_their_own_spread() {
        let mut plan = plan().with_repeat(3);
        plan.paths = vec![PathKind::Tcp, PathKind::Roce, PathKind::Ib];
        let spec = |ib: &str| iblab_lab::CompareSpec {
            id: None,
            row: "rate".into(),
            group: iblab_lab::CompareGroup::Host,
            unit: Some("Mbit/s".into()),
            tcp: None,
            roce: Some("steps.clean.tcp.throughput_mbps".into()),
            ib: Some(ib.into()),
            detail: None,
            tolerance: None,
            better: None,
            needs: None,
        };
        plan.compare = vec![
            spec("steps.clean.tcp.throughput_mbps * 2"),
            spec("steps.clean.tcp.throughput_mbps + 30"),
        ];
        let mut recs = records(&plan);
        let clean = recs.iter_mut().find(|r| r.id == "clean").unwrap();
        clean.metrics.insert(
            "throughput_mbps".into(),
            crate::evidence::Metric::new(100.0, "Mbit/s"),
        );
        clean.detail = serde_json::json!({"repeat": {"runs": 3, "figures": {
            "throughput_mbps": {"values": [80.0, 120.0, 100.0], "median": 100.0}
        }}});
        let ctx = context(&plan, &recs);
        let rows = declared_rows(&plan, &ctx, &recs);
        assert_eq!(rows[0].values[&PathKind::Roce].range, Some([80.0, 120.0]));
        assert_eq!(rows[0].values[&PathKind::Ib].range, Some([160.0, 240.0]));
        assert_eq!(rows[0].roce_equals_ib, Some(false), "{}", rows[0].rule);
        assert_eq!(rows[1].roce_equals_ib, Some(true), "{}", rows[1].rule);
        assert!(rows[1].rule.contains("ranges of their 3 runs overlap"));
        // A single run decides nothing without a tolerance.
        let mut once = plan.clone();
        once.repeat = 1;
        let rows = declared_rows(&once, &ctx, &recs);
        assert_eq!(rows[1].roce_equals_ib, None);
        assert_eq!(rows[1].values[&PathKind::Roce].range, None);
    }
}
