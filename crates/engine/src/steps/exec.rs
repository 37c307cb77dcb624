//! `exec`: a command on a node; its exit code, output and duration are the evidence.

use serde_json::json;

use iblab_backend::EnvError;
use iblab_core::command::Cmd;
use iblab_core::evidence::blank;
use iblab_core::evidence::{StepRecord, Verdict};
use iblab_core::plan::PlannedStep;
use iblab_fabric::ctx::{StepCtx, excerpt, write_log};

pub async fn run(
    step: &PlannedStep,
    ctx: &mut StepCtx<'_>,
    node: &str,
    argv: &[String],
    expect_exit: i32,
    at: f64,
) -> Result<StepRecord, EnvError> {
    let mut rec = blank(step, at);
    let cmd = Cmd {
        argv: argv.to_vec(),
        stdin: None,
        may_fail: false,
    };
    let out = ctx.backend.exec(node, &cmd, step.timeout).await?;
    // A command on a lab node runs on kernel software standing in for hardware (a
    // namespace, a container or a VM with rxe); a lab on real HCAs would say hardware.
    rec.provenance = Some(iblab_core::evidence::Provenance {
        kind: iblab_core::evidence::ProvenanceKind::Soft,
        source: format!(
            "a command run on node {node} ({} backend)",
            ctx.plan.backend
        ),
    });
    let (rel, abs) = ctx.log_file(step, "exec");
    write_log(&abs, argv, &out);
    rec.log = Some(rel);
    rec.detail = json!({
        "command": argv,
        "exit_code": out.exit_code,
        "stdout": excerpt(&out.stdout, 4000),
        "stderr": excerpt(&out.stderr, 2000),
        "timed_out": out.timed_out,
    });
    // A program that prints one JSON document (iblab's own probes do) is readable in
    // expressions as `steps.ID.json`.
    if let Ok(doc @ serde_json::Value::Object(_)) = serde_json::from_str(out.stdout.trim()) {
        rec.detail["json"] = doc;
    }
    let cut: u64 = [&out.stdout, &out.stderr]
        .iter()
        .filter_map(|t| iblab_core::command::cut_bytes(t))
        .sum();
    if cut > 0 {
        // What the command printed is not all there: its evidence is incomplete, and a
        // tool does not print that much for a lab (a replaced tool, or output written into
        // its stream by someone who can enter the node, does).
        rec.detail["output_cut_bytes"] = json!(cut);
        rec.verdict = Verdict::Fail;
        rec.reason = Some(format!(
            "its output passed the {} MiB iblab keeps of a command ({cut} more bytes were \
             read and dropped): the evidence is incomplete, so the step is not judged \
             as passed; a tool does not print that much for a lab, a flood written into \
             its output (by someone who can enter node {node}) does",
            iblab_core::command::OUTPUT_CAP >> 20
        ));
    } else if out.exit_code != Some(expect_exit) {
        rec.verdict = Verdict::Fail;
        rec.reason = Some(if out.timed_out {
            format!("no answer within {:.0}s", step.timeout.as_secs_f64())
        } else {
            format!(
                "exit code {:?}, expected {expect_exit}: {}",
                out.exit_code,
                excerpt(out.stderr.trim(), 200)
            )
        });
    }
    Ok(rec)
}
