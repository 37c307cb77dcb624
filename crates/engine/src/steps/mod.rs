//! Steps: each planned action run against the backend, turned into a step record.

mod exec;
mod fault;
pub mod links;
mod wait;

use std::collections::BTreeMap;
use std::time::Instant;

use iblab_backend::EnvError;
use iblab_core::evidence::{StepRecord, Verdict};
use iblab_core::plan::{Action, Plan, PlannedStep, Traffic, Wait};
use iblab_fabric::Fabric;

/// What the plan's steps start in the nodes themselves: a command's program, a fault's
/// `tc`, `nft` or `ip` (traffic, probes and subnet managers are their fabric's).
pub fn programs(plan: &Plan, needs: &mut iblab_core::programs::Needs) {
    fn of(a: &Action, by: &str, needs: &mut iblab_core::programs::Needs) {
        use iblab_core::programs::{Place, program_of};
        match a {
            Action::Exec { argv, .. } => {
                if let Some(p) = program_of(argv) {
                    needs.add(Place::Nodes, p, by);
                }
            }
            Action::Wait(Wait { inner, .. }) => of(inner, by, needs),
            Action::Fault(f) => {
                for c in fault::commands(f.action) {
                    if let Some(p) = program_of(&c.argv) {
                        needs.add(Place::Nodes, p, by);
                    }
                }
            }
            Action::Traffic(t) if t.count_links => {
                if let Some(p) = program_of(&links::read_cmd().argv) {
                    needs.add(Place::Nodes, p, by);
                }
            }
            Action::Traffic(_) | Action::Probe(_) | Action::Sm(_) | Action::Sleep { .. } => {}
        }
    }
    for s in plan.steps.iter().filter(|s| s.skip.is_none()) {
        of(&s.action, &format!("step `{}`", s.id), needs);
    }
}

/// Run a fabric's own step (a probe, SM control) on the fabric that handles it.
pub async fn control(
    step: &PlannedStep,
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
    at: f64,
) -> Result<StepRecord, EnvError> {
    for f in fabrics {
        if let Some(r) = f.control(step, ctx, at).await {
            return r;
        }
    }
    let mut rec = blank(step, at);
    rec.verdict = Verdict::Error;
    rec.reason = Some("no fabric of this run handles this step".into());
    Ok(rec)
}

/// Run a traffic step instance on its path's fabric.
async fn traffic(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
    at: f64,
) -> Result<StepRecord, EnvError> {
    let fabric = fabrics.iter().find(|f| Some(f.path()) == step.path);
    match fabric {
        Some(f) => {
            // `up --repeat N` or the step's own `repeat`, the larger: run it N times (logs
            // of the 2nd on as `ID-2`, …), then keep the median of each figure and the spread.
            let n = ctx.plan.repeat.max(t.repeat).max(1);
            let mut runs = Vec::new();
            for k in 1..=n {
                let each = if k == 1 {
                    step.clone()
                } else {
                    PlannedStep {
                        id: format!("{}-{k}", step.id),
                        ..step.clone()
                    }
                };
                let waited = drain_queues(ctx).await?;
                let before = match t.count_links {
                    true => Some(links::read(ctx).await?),
                    false => None,
                };
                let mut r = f.traffic(&each, t, ctx, at).await?;
                r.id = step.id.clone();
                let prov = r.provenance.clone();
                if let Some(s) = r.series.as_mut() {
                    s.of_step(prov.as_ref(), &t.to);
                }
                if let Some(before) = before {
                    let after = links::read(ctx).await?;
                    links::record(&mut r, &links::crossed(ctx.plan, &before, &after));
                }
                if waited > 0.15
                    && let Some(d) = r.detail.as_object_mut()
                {
                    d.insert(
                        "waited_for_the_bottleneck_to_empty_s".into(),
                        serde_json::json!(waited),
                    );
                }
                runs.push(r);
            }
            Ok(repeated(runs))
        }
        None => {
            let mut rec = blank(step, at);
            rec.verdict = Verdict::Error;
            rec.reason = Some(format!(
                "no fabric carries path {:?} in this run",
                step.path
            ));
            Ok(rec)
        }
    }
}

/// A record for a step that did not run.
pub fn skipped(step: &PlannedStep, reason: String, at: f64) -> StepRecord {
    let mut r = blank(step, at);
    r.verdict = Verdict::Skipped;
    r.reason = Some(reason);
    r
}

use iblab_core::evidence::blank;
use iblab_fabric::ctx::{StepCtx, drain_queues, harvest_drops};

/// Run one step under its deadline. `Err` is an environment problem, not a failed step.
pub async fn run(
    step: &PlannedStep,
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
) -> Result<StepRecord, EnvError> {
    let at = ctx.started.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut rec = match &step.action {
        Action::Exec {
            node,
            argv,
            expect_exit,
        } => exec::run(step, ctx, node, argv, *expect_exit, at).await?,
        Action::Traffic(t) => traffic(step, t, ctx, fabrics, at).await?,
        Action::Fault(f) => fault::run(step, f, ctx, fabrics, at).await?,
        Action::Wait(w) => wait::run(step, w, ctx, fabrics, at).await?,
        Action::Probe(_) | Action::Sm(_) => control(step, ctx, fabrics, at).await?,
        Action::Sleep { duration } => {
            tokio::time::sleep(*duration).await;
            blank(step, at)
        }
    };
    rec.duration_s = t0.elapsed().as_secs_f64();
    Ok(rec)
}

/// One record from the repetitions of a traffic step instance: each metric is the
/// median of the values the repetitions measured (the mean of the middle two for an even
/// count), the verdict passes when most repetitions passed, and `detail.repeat` keeps
/// every value with its minimum, maximum and spread (max − min, in % of the median).
pub fn repeated(mut runs: Vec<StepRecord>) -> StepRecord {
    if runs.len() <= 1 {
        return runs.pop().expect("at least one run");
    }
    let n = runs.len();
    let passed = runs.iter().filter(|r| r.verdict == Verdict::Pass).count();
    let mut names: Vec<String> = runs
        .iter()
        .flat_map(|r| r.metrics.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    let mut figures = serde_json::Map::new();
    let mut metrics = BTreeMap::new();
    for name in names {
        let mut values: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.metrics.get(&name).map(|m| m.value))
            .collect();
        let unit = runs
            .iter()
            .find_map(|r| r.metrics.get(&name).map(|m| m.unit.clone()))
            .unwrap_or_default();
        let in_order = values.clone();
        values.sort_by(|a, b| a.total_cmp(b));
        let mid = values.len() / 2;
        let median = if values.len() % 2 == 1 {
            values[mid]
        } else {
            (values[mid - 1] + values[mid]) / 2.0
        };
        let (min, max) = (values[0], values[values.len() - 1]);
        figures.insert(
            name.clone(),
            serde_json::json!({
                "values": in_order,
                "median": median,
                "min": min,
                "max": max,
                "spread_pct": (median != 0.0).then(|| (max - min) / median.abs() * 100.0),
            }),
        );
        metrics.insert(name, iblab_core::evidence::Metric::new(median, &unit));
    }
    let verdict = if passed * 2 > n {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
    let reasons: Vec<String> = runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.reason.as_ref().map(|why| format!("run {}: {why}", i + 1)))
        .collect();
    // The record of a repetition that passed stands for the others (its log, its detail).
    let pick = runs.iter().position(|r| r.verdict == verdict).unwrap_or(0);
    let mut rec = runs.swap_remove(pick);
    rec.verdict = verdict;
    rec.metrics = metrics;
    rec.reason = (verdict != Verdict::Pass || !reasons.is_empty())
        .then(|| format!("{passed} of {n} runs passed; {}", reasons.join("; ")));
    if !rec.detail.is_object() {
        rec.detail = serde_json::json!({});
    }
    rec.detail["repeat"] = serde_json::json!({
        "runs": n,
        "passed": passed,
        "figures": figures,
        "rule": "each metric is the median of the runs that measured it; the step passes when most runs passed",
    });
    rec
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::evidence::Metric;

    fn run(verdict: Verdict, mbps: Option<f64>, cpu: f64) -> StepRecord {
        let e: iblab_core::evidence::Evidence =
            iblab_core::testdata::evidence(iblab_core::testdata::TCP_LOSS);
        let mut r = e
            .steps
            .into_iter()
            .find(|s| s.kind == iblab_lab::StepKind::Traffic)
            .unwrap();
        r.verdict = verdict;
        r.reason = (verdict != Verdict::Pass).then(|| "no bandwidth measured".into());
        r.metrics.clear();
        if let Some(v) = mbps {
            r.metrics
                .insert("throughput_mbps".into(), Metric::new(v, "Mbit/s"));
        }
        r.metrics
            .insert("receiver_cpu_s_per_mib".into(), Metric::new(cpu, "s/MiB"));
        r
    }

    /// Three runs: the median of each figure, every value and the spread kept.
    #[test]
    fn repetitions_are_judged_on_the_median() {
        let r = repeated(vec![
            run(Verdict::Pass, Some(100.0), 0.004),
            run(Verdict::Pass, Some(40.0), 0.006),
            run(Verdict::Pass, Some(70.0), 0.005),
        ]);
        assert_eq!(r.verdict, Verdict::Pass);
        assert_eq!(r.metrics["throughput_mbps"].value, 70.0);
        assert_eq!(r.metrics["throughput_mbps"].unit, "Mbit/s");
        assert_eq!(r.metrics["receiver_cpu_s_per_mib"].value, 0.005);
        let f = &r.detail["repeat"]["figures"]["throughput_mbps"];
        assert_eq!(f["values"], serde_json::json!([100.0, 40.0, 70.0]));
        assert_eq!(
            (f["min"].as_f64(), f["max"].as_f64()),
            (Some(40.0), Some(100.0))
        );
        assert!((f["spread_pct"].as_f64().unwrap() - 60.0 / 70.0 * 100.0).abs() < 1e-9);
        assert_eq!(r.detail["repeat"]["runs"], 3);
        assert!(r.reason.is_none());
    }

    /// Most runs failing fails the step, with each run's reason; an even count takes the
    /// mean of the middle two.
    #[test]
    fn most_runs_decide_the_verdict() {
        let r = repeated(vec![
            run(Verdict::Fail, None, 0.0),
            run(Verdict::Pass, Some(10.0), 0.0),
            run(Verdict::Fail, None, 0.0),
        ]);
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(
            r.reason
                .as_deref()
                .unwrap()
                .starts_with("1 of 3 runs passed")
        );
        assert_eq!(r.metrics["throughput_mbps"].value, 10.0);
        let r = repeated(vec![
            run(Verdict::Pass, Some(10.0), 0.0),
            run(Verdict::Pass, Some(20.0), 0.0),
        ]);
        assert_eq!(r.metrics["throughput_mbps"].value, 15.0);
        let one = repeated(vec![run(Verdict::Pass, Some(5.0), 0.0)]);
        assert!(one.detail.get("repeat").is_none());
    }
}
