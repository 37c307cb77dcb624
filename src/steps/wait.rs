//! `wait`: repeat a command until an expression over its result holds, or the deadline passes.

use std::time::Instant;

use serde_json::json;

use super::{StepCtx, blank, excerpt, write_log};
use crate::backend::EnvError;
use crate::evidence::judge::context;
use crate::evidence::{Metric, StepRecord, Verdict};
use crate::expr;
use crate::fault::Cmd;
use crate::plan::{Action, PlannedStep};

pub async fn run(
    step: &PlannedStep,
    ctx: &mut StepCtx<'_>,
    at: f64,
) -> Result<StepRecord, EnvError> {
    let Action::Wait {
        node,
        argv,
        until,
        interval,
    } = &step.action
    else {
        unreachable!("wait::run on another action")
    };
    let mut rec = blank(step, at);
    let start = Instant::now();
    let deadline = start + step.timeout;
    let cmd = Cmd {
        argv: argv.clone(),
        stdin: None,
        may_fail: true,
    };
    let mut attempts = 0u32;
    let (rel, abs) = ctx.log_file(step, "wait");
    loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let out = ctx
            .backend
            .exec(node, &cmd, left.max(std::time::Duration::from_millis(100)))
            .await?;
        write_log(&abs, argv, &out);
        let mut c = context(ctx.plan, &ctx.done);
        c["result"] = json!({"exit_code": out.exit_code, "ok": out.success(), "stdout": out.stdout, "stderr": out.stderr});
        let held = expr::eval_bool(until, &c);
        rec.detail = json!({"command": argv, "until": until, "attempts": attempts, "exit_code": out.exit_code, "stdout": excerpt(&out.stdout, 2000)});
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
    rec.log = Some(rel);
    rec.metrics
        .insert("attempts".into(), Metric::new(attempts as f64, "count"));
    rec.metrics.insert(
        "waited".into(),
        Metric::new(start.elapsed().as_secs_f64(), "s"),
    );
    Ok(rec)
}
