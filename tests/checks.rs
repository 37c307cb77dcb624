//! The repository's own shell checks, run by `cargo test` so CI cannot pass without them:
//! the GitHub workflow (actionlint with shellcheck, and the self-test of its helper
//! scripts: tests/workflow/check) and the Helm chart offline (lint with default and
//! non-default values, values the schema must refuse, manifests/ identical to the chart's
//! output: tests/chart/check; its dry run against the API server runs in operator_e2e,
//! where the cluster is up). A missing tool is a failure that names it.

use std::path::Path;
use std::process::Command;

fn check(script: &str, env_off: &[&str]) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(repo.join(script));
    for v in env_off {
        cmd.env_remove(v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} failed:\n{text}");
}

#[test]
fn the_workflow_passes_actionlint_and_its_scripts_their_self_test() {
    check("tests/workflow/check", &[]);
}

#[test]
fn the_chart_lints_refuses_bad_values_and_matches_manifests() {
    // Offline: the API server's dry run is operator_e2e's business.
    check("tests/chart/check", &["KUBECONFIG"]);
}
