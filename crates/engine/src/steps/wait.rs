//! `wait`: repeat a command or a probe until an expression over its result holds, or the
//! deadline passes.

use std::time::{Duration, Instant};

use serde_json::json;

use super::control;
use iblab_backend::EnvError;
use iblab_core::command::Cmd;
use iblab_core::evidence::blank;
use iblab_core::evidence::judge::context;
use iblab_core::evidence::{Metric, StepRecord, Verdict};
use iblab_core::plan::{Action, PlannedStep, Wait};
use iblab_fabric::Fabric;
use iblab_fabric::ctx::{StepCtx, excerpt, write_log};
use iblab_lab::expr;
use iblab_lab::names;

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
    // When the last attempt that saw the condition false began: the condition turned true
    // after it (a lower bound); the attempt that saw it true ends the upper bound.
    let mut last_false_began: Option<f64> = None;
    let mut held_at = None;
    let (rel, abs) = ctx.log_file(step, "wait");
    loop {
        attempts += 1;
        let began = start.elapsed().as_secs_f64();
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
            Ok(true) => {
                held_at = Some(start.elapsed().as_secs_f64());
                break;
            }
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
            Ok(false) => {
                last_false_began = Some(began);
                tokio::time::sleep(*interval).await
            }
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
    if let Some(upper) = held_at {
        let lower = last_false_began.unwrap_or(0.0);
        rec.metrics
            .insert(names::WAITED_AT_LEAST.into(), Metric::new(lower, "s"));
        rec.detail["resolution"] = json!(bound(lower, upper, attempts));
    }
    Ok(rec)
}

/// What a wait's time means: the condition turned true after the last attempt that saw it
/// false began and before the attempt that saw it true ended. With one attempt that is
/// only an upper bound (it may have held before the wait started).
pub fn bound(lower: f64, upper: f64, attempts: u32) -> String {
    if attempts <= 1 || lower <= 0.0 {
        format!(
            "within {upper:.2} s: an upper bound, the first attempt already saw it (it may have held before)"
        )
    } else {
        format!(
            "between {lower:.2} s and {upper:.2} s: after the last attempt that saw it false began, before the one that saw it true ended ({attempts} attempts)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::bound;

    #[test]
    fn one_attempt_is_an_upper_bound() {
        let b = bound(0.0, 0.05, 1);
        assert!(
            b.contains("within 0.05 s") && b.contains("upper bound"),
            "{b}"
        );
        let b = bound(4.1, 4.6, 9);
        assert!(b.starts_with("between 4.10 s and 4.60 s"), "{b}");
    }
}
