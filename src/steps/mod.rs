//! Steps: each planned action run against the backend, turned into a step record.

mod exec;
mod fault;
mod wait;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::backend::{Backend, EnvError};
use crate::evidence::{StepRecord, Verdict};
use crate::fabric::Fabric;
use crate::fault::Shaping;
use crate::plan::{Action, Plan, PlannedStep, Probe, Traffic, Wait};
use crate::run::state::StateFile;

/// What steps share during a run.
pub struct StepCtx<'a> {
    pub plan: &'a Plan,
    pub backend: &'a dyn Backend,
    pub state: &'a StateFile,
    pub run_dir: PathBuf,
    pub started: Instant,
    /// Shaping currently on each (node, interface).
    pub shaping: HashMap<(String, String), Shaping>,
    /// Drops counted on each (node, interface) by shaping that was since replaced
    /// (re-applying a qdisc or an nftables table resets its counters).
    pub drops: HashMap<(String, String), u64>,
    /// Records so far (for `wait` expressions over earlier results).
    pub done: Vec<StepRecord>,
}

/// Add what an interface's shaping has dropped so far to the run's tally; call it before
/// the shaping is replaced, since that resets the kernel's counters.
pub async fn harvest_drops(ctx: &mut StepCtx<'_>, node: &str, iface: &str) -> Result<(), EnvError> {
    let c = crate::fault::counters(iface);
    let tc = ctx
        .backend
        .exec(node, &c[0], std::time::Duration::from_secs(10))
        .await?;
    let nft = ctx
        .backend
        .exec(node, &c[1], std::time::Duration::from_secs(10))
        .await?;
    *ctx.drops
        .entry((node.to_string(), iface.to_string()))
        .or_default() += crate::fault::dropped_from(&tc.stdout, &nft.stdout);
    Ok(())
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
        Some(f) => f.traffic(step, t, ctx, at).await,
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

impl StepCtx<'_> {
    /// Path of a log file for a step, relative to the run folder, and its absolute path.
    pub fn log_file(&self, step: &PlannedStep, what: &str) -> (String, PathBuf) {
        let mut name = step.id.clone();
        if let Some(p) = step.path {
            name.push('.');
            name.push_str(p.as_str());
        }
        let rel = format!("logs/{name}.{what}.log");
        (rel.clone(), self.run_dir.join(rel))
    }
}

/// A record for a step that did not run.
pub fn skipped(step: &PlannedStep, reason: String, at: f64) -> StepRecord {
    let mut r = blank(step, at);
    r.verdict = Verdict::Skipped;
    r.reason = Some(reason);
    r
}

/// A record with nothing measured yet.
pub fn blank(step: &PlannedStep, at: f64) -> StepRecord {
    let (kind, node) = match &step.action {
        Action::Exec { node, .. } => ("exec", Some(node.clone())),
        Action::Traffic(Traffic { from, .. }) => ("traffic", Some(from.clone())),
        Action::Fault(_) => ("fault", None),
        Action::Wait(Wait { inner, .. }) => match inner.as_ref() {
            Action::Exec { node, .. } | Action::Probe(Probe { node, .. }) => {
                ("wait", Some(node.clone()))
            }
            _ => ("wait", None),
        },
        Action::Sleep { .. } => ("sleep", None),
        Action::Probe(Probe { node, .. }) => ("probe", Some(node.clone())),
        Action::Sm(_) => ("sm", None),
    };
    StepRecord {
        id: step.id.clone(),
        name: step.name.clone(),
        kind: kind.to_string(),
        path: step.path,
        node,
        verdict: Verdict::Pass,
        started_s: at,
        duration_s: 0.0,
        metrics: BTreeMap::new(),
        provenance: None,
        log: None,
        reason: None,
        detail: serde_json::Value::Null,
        allowed_to_fail: step.continue_on_error,
    }
}

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

/// Write a step's full output to its log.
pub fn write_log(path: &Path, argv: &[String], out: &crate::run::process::ExecOutput) {
    let text = format!(
        "$ {}\n# exit: {:?}  duration: {:.3}s{}\n--- stdout\n{}\n--- stderr\n{}\n",
        argv.join(" "),
        out.exit_code,
        out.duration.as_secs_f64(),
        if out.timed_out {
            "  (deadline reached)"
        } else {
            ""
        },
        out.stdout,
        out.stderr
    );
    let _ = std::fs::write(path, text);
}

/// The first `max` characters of a text, for excerpts in evidence.json.
pub fn excerpt(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let head: String = text.chars().take(max).collect();
        format!("{head}…")
    }
}
