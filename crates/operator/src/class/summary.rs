//! A class's verdicts: each student's LabRun as a row of a table, as JSON, and as one
//! JUnit file with a test suite per student (a test case per expectation).

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use serde::Serialize;

use iblab_core::exit;
use iblab_k8s::crd::{LabRun, Phase};

/// One student's line.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub student: String,
    pub namespace: String,
    /// `Missing` when the student's LabRun is not there.
    pub phase: String,
    pub verdict: Option<String>,
    pub held: usize,
    pub failed: usize,
    pub skipped: usize,
    pub message: Option<String>,
    pub evidence: Option<String>,
    #[serde(skip)]
    pub run: Option<LabRun>,
}

pub fn row(student: &str, namespace: &str, run: Option<LabRun>) -> Row {
    let st = run.as_ref().and_then(|r| r.status.clone());
    let count = |v: &str| {
        st.as_ref()
            .map(|s| s.expectations.iter().filter(|e| e.verdict == v).count())
            .unwrap_or(0)
    };
    Row {
        student: student.into(),
        namespace: namespace.into(),
        phase: match (&run, &st) {
            (None, _) => "Missing".into(),
            (Some(_), None) => Phase::Pending.as_str().into(),
            (Some(_), Some(s)) => s.phase.as_str().into(),
        },
        verdict: st.as_ref().and_then(|s| s.verdict.clone()),
        held: count("pass"),
        failed: count("fail"),
        skipped: count("skipped"),
        message: st.as_ref().and_then(|s| s.message.clone()),
        evidence: st
            .as_ref()
            .and_then(|s| s.evidence.as_ref())
            .map(|e| format!("configmap/{} -n {namespace}", e.config_map)),
        run,
    }
}

/// Every row finished (or missing: nothing will come).
pub fn all_finished(rows: &[Row]) -> bool {
    rows.iter()
        .all(|r| r.phase != "Pending" && r.phase != "Running")
}

/// The exit code of `class status`: 0 all passed, 1 a lesson's claim failed for someone,
/// 3 a run could not be judged or is missing, 4 some are still going.
pub fn exit_code(rows: &[Row]) -> i32 {
    if rows
        .iter()
        .any(|r| matches!(r.phase.as_str(), "Error" | "Missing"))
    {
        exit::ENVIRONMENT
    } else if rows.iter().any(|r| r.phase == "Failed") {
        exit::FAILED
    } else if all_finished(rows) {
        exit::OK
    } else {
        4
    }
}

pub fn table(class: &str, lab: &str, rows: &[Row]) -> String {
    let mut o = format!("class {class} · lab {lab}\n");
    o.push_str(&format!(
        "  {:<16} {:<10} {:<12} {:>4} {:>6} {:>7}  evidence\n",
        "student", "phase", "verdict", "held", "failed", "skipped"
    ));
    for r in rows {
        o.push_str(&format!(
            "  {:<16} {:<10} {:<12} {:>4} {:>6} {:>7}  {}\n",
            r.student,
            r.phase,
            r.verdict.as_deref().unwrap_or("-"),
            r.held,
            r.failed,
            r.skipped,
            r.evidence.as_deref().unwrap_or("-")
        ));
    }
    let done = rows
        .iter()
        .filter(|r| matches!(r.phase.as_str(), "Succeeded" | "Failed" | "Error"))
        .count();
    o.push_str(&format!("  {done} of {} finished\n", rows.len()));
    o
}

/// One JUnit report: a suite per student, a case per expectation; a run that could not be
/// judged (or is missing, or still going) is one errored case.
pub fn junit(class: &str, rows: &[Row]) -> String {
    let mut report = Report::new(format!("iblab class {class}"));
    for r in rows {
        let mut suite = TestSuite::new(format!("{class}/{}", r.student));
        let st = r.run.as_ref().and_then(|x| x.status.as_ref());
        let expectations = st.map(|s| s.expectations.as_slice()).unwrap_or(&[]);
        if matches!(r.phase.as_str(), "Succeeded" | "Failed") && !expectations.is_empty() {
            for e in expectations {
                let status = match e.verdict.as_str() {
                    "pass" => TestCaseStatus::success(),
                    "skipped" => {
                        let mut s = TestCaseStatus::skipped();
                        s.set_message(e.explanation.clone());
                        s
                    }
                    v => {
                        let mut s = TestCaseStatus::non_success(if v == "fail" {
                            NonSuccessKind::Failure
                        } else {
                            NonSuccessKind::Error
                        });
                        s.set_message(e.explanation.clone());
                        s
                    }
                };
                let mut tc = TestCase::new(e.id.clone(), status);
                tc.set_classname(format!("iblab.{class}.{}", r.student));
                suite.add_test_case(tc);
            }
        } else {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Error);
            s.set_message(format!(
                "run {}: {}",
                r.phase,
                r.message.as_deref().unwrap_or("no status yet")
            ));
            let mut tc = TestCase::new("run", s);
            tc.set_classname(format!("iblab.{class}.{}", r.student));
            suite.add_test_case(tc);
        }
        report.add_test_suite(suite);
    }
    report.to_string().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_k8s::crd::{ExpectationStatus, LabRunSpec, LabRunStatus};

    fn run(phase: Phase, verdicts: &[&str]) -> LabRun {
        let mut r = LabRun::new("lesson4", LabRunSpec::default());
        r.status = Some(LabRunStatus {
            phase,
            verdict: Some("pass".into()),
            expectations: verdicts
                .iter()
                .enumerate()
                .map(|(i, v)| ExpectationStatus {
                    id: format!("e{i}"),
                    verdict: v.to_string(),
                    explanation: format!("because {i}"),
                })
                .collect(),
            ..Default::default()
        });
        r
    }

    #[test]
    fn the_class_exit_code_and_junit_follow_the_runs() {
        let rows = vec![
            row(
                "alice",
                "c-alice",
                Some(run(Phase::Succeeded, &["pass", "skipped"])),
            ),
            row("bob", "c-bob", Some(run(Phase::Failed, &["pass", "fail"]))),
            row("carol", "c-carol", None),
        ];
        assert_eq!((rows[0].held, rows[0].skipped), (1, 1));
        assert_eq!(rows[2].phase, "Missing");
        assert_eq!(exit_code(&rows), exit::ENVIRONMENT);
        assert_eq!(exit_code(&rows[..2]), exit::FAILED);
        assert_eq!(exit_code(&rows[..1]), exit::OK);
        let going = vec![row("dan", "c-dan", Some(run(Phase::Running, &[])))];
        assert_eq!(exit_code(&going), 4);
        let x = junit("c", &rows);
        assert_eq!(x.matches("<testsuite ").count(), 3);
        assert!(x.contains("name=\"c/bob\""));
        assert!(x.contains("<failure"));
        assert!(x.contains("run Missing"));
        let t = table("c", "lesson4", &rows);
        assert!(t.contains("2 of 3 finished"), "{t}");
    }
}
