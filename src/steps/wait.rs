//! `wait`: repeat a command or a probe until an expression over its result holds, or the
//! deadline passes.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{StepCtx, blank, control, excerpt, write_log};
use crate::backend::EnvError;
use crate::evidence::judge::context;
use crate::evidence::names;
use crate::evidence::{Metric, StepRecord, Verdict};
use crate::expr;
use crate::fabric::Fabric;
use crate::fault::Cmd;
use crate::plan::{Action, PlannedStep, Wait};

pub async fn run(
    step: &PlannedStep,
    wait: &Wait,
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
    at: f64,
) -> Result<StepRecord, EnvError> {
    let Wait {
        inner,
        until,
        interval,
    } = wait;
    let mut rec = blank(step, at);
    let start = Instant::now();
    let deadline = start + step.timeout;
    let mut attempts = 0u32;
    let (rel, abs) = ctx.log_file(step, "wait");
    loop {
        attempts += 1;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        let result = match inner.as_ref() {
            Action::Exec { node, argv, .. } => {
                let cmd = Cmd {
                    argv: argv.clone(),
                    stdin: None,
                    may_fail: true,
                };
                let out = ctx.backend.exec(node, &cmd, left).await?;
                write_log(&abs, argv, &out);
                json!({"exit_code": out.exit_code, "ok": out.success(), "stdout": out.stdout, "stderr": out.stderr})
            }
            other => {
                let probe = PlannedStep {
                    action: other.clone(),
                    timeout: left,
                    ..step.clone()
                };
                let r = control(&probe, ctx, fabrics, at).await?;
                let mut v = r.detail.get("facts").cloned().unwrap_or(json!({}));
                v["ok"] = json!(r.verdict == Verdict::Pass);
                if let Some(log) = &r.log {
                    rec.log = Some(log.clone());
                }
                v
            }
        };
        let mut c = context(ctx.plan, &ctx.done);
        c["result"] = result.clone();
        let held = expr::eval_bool(until, &c);
        let mut shown = result.clone();
        if let Some(s) = shown
            .get_mut("stdout")
            .and_then(|s| s.as_str().map(|t| excerpt(t, 2000)))
        {
            shown["stdout"] = json!(s);
        }
        rec.detail = json!({"until": until, "attempts": attempts, "result": shown});
        match held {
            Ok(true) => break,
            Err(e) => {
                rec.verdict = Verdict::Error;
                rec.reason = Some(format!("`until: {until}` could not be evaluated: {e}"));
                break;
            }
            Ok(false) if Instant::now() + *interval >= deadline => {
                rec.verdict = Verdict::Fail;
                rec.reason = Some(format!(
                    "`{until}` still false after {attempts} attempts in {:.1}s",
                    start.elapsed().as_secs_f64()
                ));
                break;
            }
            Ok(false) => tokio::time::sleep(*interval).await,
        }
    }
    if rec.log.is_none() && abs.exists() {
        rec.log = Some(rel);
    }
    rec.metrics.insert(
        names::ATTEMPTS.into(),
        Metric::new(attempts as f64, "count"),
    );
    rec.metrics.insert(
        names::WAITED.into(),
        Metric::new(start.elapsed().as_secs_f64(), "s"),
    );
    Ok(rec)
}
