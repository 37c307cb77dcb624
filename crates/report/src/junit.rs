//! JUnit XML: one test case per expectation, and one per step instance. JUnit agrees with
//! the run's verdict: a step the lab allows to fail (`continueOnError`) that failed is
//! evidence the expectations judge, so its case passes with what happened in its output.
//! In English, whatever the evidence's language (an expectation's English explanation is
//! kept beside the evidence's own).

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use iblab_core::evidence::{Evidence, Verdict};

pub fn render(e: &Evidence) -> String {
    let mut report = Report::new(format!("iblab {}", e.lab));
    let class = format!("iblab.{}.{}", e.lab, e.scenario);

    let mut expectations = TestSuite::new(format!("{} [{}] expectations", e.lab, e.scenario));
    for x in &e.expectations {
        let explanation = x.explanation_en.as_deref().unwrap_or(&x.explanation);
        let status = status(
            x.verdict,
            explanation,
            &format!(
                "expression: {}\nobserved: {}",
                x.expression,
                serde_json::to_string(&x.observed).unwrap_or_default()
            ),
        );
        let mut tc = TestCase::new(x.id.clone(), status);
        tc.set_classname(class.clone());
        tc.set_system_out(format!("{}\n{explanation}", x.expression));
        expectations.add_test_case(tc);
    }
    let mut steps = TestSuite::new(format!("{} [{}] steps", e.lab, e.scenario));
    for s in &e.steps {
        let name = match s.path {
            Some(p) => format!("{}[{p}]", s.id),
            None => s.id.clone(),
        };
        let reason = s.reason.clone().unwrap_or_default();
        let tolerated = s.allowed_to_fail && matches!(s.verdict, Verdict::Fail | Verdict::Error);
        let verdict = if tolerated { Verdict::Pass } else { s.verdict };
        let mut tc = TestCase::new(name, status(verdict, &reason, &reason));
        if tolerated {
            tc.set_system_out(format!(
                "{} as the lab allows (continueOnError): {reason}\nits failure is evidence; the expectations judge it",
                if s.verdict == Verdict::Fail { "failed" } else { "errored" }
            ));
        }
        tc.set_classname(format!("{class}.steps"));
        tc.set_time(std::time::Duration::from_secs_f64(s.duration_s.max(0.0)));
        steps.add_test_case(tc);
    }
    report.add_test_suite(expectations);
    report.add_test_suite(steps);
    report.to_string().unwrap_or_default()
}

fn status(v: Verdict, message: &str, description: &str) -> TestCaseStatus {
    match v {
        Verdict::Pass => TestCaseStatus::success(),
        Verdict::Skipped => {
            let mut s = TestCaseStatus::skipped();
            s.set_message(message.to_string());
            s
        }
        Verdict::Fail | Verdict::Error => {
            let kind = if v == Verdict::Fail {
                NonSuccessKind::Failure
            } else {
                NonSuccessKind::Error
            };
            let mut s = TestCaseStatus::non_success(kind);
            s.set_message(message.to_string());
            s.set_description(description.to_string());
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iblab_core::evidence::RunVerdict;

    fn evidence() -> Evidence {
        serde_json::from_str(include_str!(
            "../../../tests/fixtures/evidence/tcp-loss.json"
        ))
        .unwrap()
    }

    fn failures(xml: &str) -> usize {
        xml.matches("<failure").count() + xml.matches("<error").count()
    }

    /// A step the lab lets fail that failed as the lesson says is not a JUnit failure: a
    /// CI that reads junit.xml sees the run's verdict. A step that fails without leave, or
    /// a failed expectation, still is one.
    #[test]
    fn junit_agrees_with_the_verdict() {
        let mut e = evidence();
        assert_eq!(e.verdict, RunVerdict::Pass);
        assert_eq!(failures(&render(&e)), 0);
        let s = &mut e.steps[0];
        s.verdict = Verdict::Fail;
        s.reason = Some("refused by the subnet: no route".into());
        s.allowed_to_fail = true;
        let xml = render(&e);
        assert_eq!(failures(&xml), 0, "{xml}");
        assert!(xml.contains("as the lab allows (continueOnError): refused by the subnet"));
        e.steps[0].allowed_to_fail = false;
        assert_eq!(failures(&render(&e)), 1);
        e.steps[0].allowed_to_fail = true;
        e.expectations[0].verdict = Verdict::Fail;
        assert_eq!(failures(&render(&e)), 1);
    }
}
