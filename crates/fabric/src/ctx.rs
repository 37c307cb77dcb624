//! What the steps and the fabrics share during a run: the context ([`StepCtx`]), a step's
//! log file, the bottleneck's drops and queues, excerpts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use iblab_backend::{Deployment, EnvError};
use iblab_core::evidence::StepRecord;
use iblab_core::fault::Shaping;
use iblab_core::plan::{Plan, PlannedStep};
use iblab_sys::state::StateFile;

/// What steps share during a run.
pub struct StepCtx<'a> {
    pub plan: &'a Plan,
    pub backend: &'a dyn Deployment,
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
    let c = iblab_core::fault::counters(iface);
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
        .or_default() += iblab_core::fault::dropped_from(&tc.stdout, &nft.stdout);
    Ok(())
}

/// Wait until the queues of the shaping in force are empty (at most 10 s): what one
/// path's traffic left queued at a bottleneck must not delay the next path's first
/// packets, each path is measured through an empty queue. Returns the seconds waited.
pub async fn drain_queues(ctx: &mut StepCtx<'_>) -> Result<f64, EnvError> {
    use std::time::{Duration, Instant};
    let shaped: Vec<(String, String)> = ctx
        .shaping
        .iter()
        .filter(|(_, s)| s.rate.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    let t = Instant::now();
    for (node, iface) in shaped {
        let c = &iblab_core::fault::counters(&iface)[0];
        loop {
            let out = ctx.backend.exec(&node, c, Duration::from_secs(10)).await?;
            if iblab_core::fault::backlog_from(&out.stdout) == 0
                || t.elapsed() > Duration::from_secs(10)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(t.elapsed().as_secs_f64())
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

/// Write a step's full output to its log.
pub fn write_log(path: &Path, argv: &[String], out: &iblab_core::command::ExecOutput) {
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

/// The verbs probe's report (`iblab verbs-probe` prints one JSON object) into `rec`, with
/// the command that made it; a probe that printed none fails the step with its stderr.
pub fn verbs_report(
    rec: &mut StepRecord,
    command: serde_json::Value,
    out: &iblab_core::command::ExecOutput,
) {
    rec.detail = serde_json::json!({"command": command, "exit_code": out.exit_code});
    match serde_json::from_str::<serde_json::Value>(out.stdout.trim()) {
        Ok(doc @ serde_json::Value::Object(_)) => rec.detail["json"] = doc,
        _ => {
            rec.verdict = iblab_core::evidence::Verdict::Fail;
            rec.reason = Some(format!(
                "the verbs probe printed no report (exit {:?}): {}",
                out.exit_code,
                excerpt(out.stderr.trim(), 200)
            ));
        }
    }
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

/// Add `facts` to the record's `detail.facts`.
pub fn merge_facts(rec: &mut iblab_core::evidence::StepRecord, facts: serde_json::Value) {
    if !rec.detail.is_object() {
        rec.detail = serde_json::json!({});
    }
    let slot = &mut rec.detail["facts"];
    if !slot.is_object() {
        *slot = serde_json::json!({});
    }
    if let (serde_json::Value::Object(to), serde_json::Value::Object(from)) = (slot, facts) {
        to.extend(from);
    }
}
