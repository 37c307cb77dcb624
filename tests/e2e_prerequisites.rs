//! The end-to-end suites' rule for a missing prerequisite (root, a tool, the docker
//! socket, qemu, chromium…): outside CI the test says SKIPPED and passes; in CI
//! (`CI=true`) every end-to-end test must run, so it fails and names what is missing.
//! Each case runs the helper in a child process of this test binary, as an e2e test would.

mod common;

use std::process::{Command, Output};

const CHILD: &str = "IBLAB_PREREQUISITE_CHILD";
const WHAT: &str = "the frobnicator is not installed (apt-get install frobnicator)";

/// Run by the tests below in a child process (which sets `CHILD`); on its own, nothing.
#[test]
#[ignore = "run by the tests below in a child process"]
fn an_e2e_test_whose_prerequisite_is_missing() {
    if std::env::var_os(CHILD).is_some() {
        common::missing(WHAT);
    }
}

/// That test in a child process, with `CI` set to `ci` (or unset).
fn child(ci: Option<&str>) -> (Output, String) {
    let mut c = Command::new(std::env::current_exe().expect("the test binary"));
    c.args([
        "--ignored",
        "--exact",
        "an_e2e_test_whose_prerequisite_is_missing",
        "--nocapture",
    ])
    .env(CHILD, "1")
    .env_remove("CI");
    if let Some(v) = ci {
        c.env("CI", v);
    }
    let out = c.output().expect("the test binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn outside_ci_a_missing_prerequisite_is_skipped() {
    for ci in [None, Some(""), Some("false")] {
        let (out, text) = child(ci);
        assert!(out.status.success(), "CI={ci:?}: the test failed:\n{text}");
        assert!(
            text.contains(&format!("SKIPPED: {WHAT}")),
            "CI={ci:?}: no SKIPPED line naming it:\n{text}"
        );
    }
}

#[test]
fn in_ci_a_missing_prerequisite_fails_the_test_and_names_it() {
    for ci in ["true", "TRUE", "1"] {
        let (out, text) = child(Some(ci));
        assert!(
            !out.status.success(),
            "CI={ci}: a test with a missing prerequisite passed:\n{text}"
        );
        assert!(
            text.contains(WHAT),
            "CI={ci}: it does not say what:\n{text}"
        );
        assert!(
            !text.contains("SKIPPED:"),
            "CI={ci}: it said SKIPPED:\n{text}"
        );
    }
}
