//! A finished run's evidence as a LabRun's status: the verdict, each expectation with
//! what the learner reads, the comparison rows as text, sized to stay far below an
//! object's limit (the whole evidence goes to a ConfigMap beside it).

use iblab_core::evidence::{Evidence, RunVerdict};
use iblab_core::exit;
use iblab_k8s::crd::{ComparisonStatus, ExpectationStatus, LabRunStatus, Phase};

/// At most this many expectations and rows, each text cut to this many characters.
const MAX_ITEMS: usize = 60;
const MAX_TEXT: usize = 600;
/// A message (a child's diagnostics) is cut to its last this many characters.
const MAX_MESSAGE: usize = 4000;

/// The phase `iblab up`'s exit code stands for.
pub fn phase_of(exit_code: i32) -> Phase {
    match exit_code {
        exit::OK => Phase::Succeeded,
        exit::FAILED => Phase::Failed,
        _ => Phase::Error,
    }
}

/// Text cut to `n` characters on a character boundary, marked when cut.
pub fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut t: String = s.chars().take(n).collect();
    t.push('…');
    t
}

/// The end of a long text (diagnostics end with what matters).
pub fn tail(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        return s.trim().to_string();
    }
    let t: String = s.chars().skip(count - n).collect();
    format!("…{}", t.trim())
}

fn verdict_word(v: RunVerdict) -> &'static str {
    match v {
        RunVerdict::Pass => "pass",
        RunVerdict::Fail => "fail",
        RunVerdict::Error => "error",
        RunVerdict::Interrupted => "interrupted",
    }
}

fn cell_text(c: &iblab_core::evidence::Cell, unit: &str) -> String {
    let v = match &c.value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() != 0.0 => format!("{f:.3}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    };
    let unit = if unit.is_empty() || !c.value.is_number() {
        String::new()
    } else {
        format!(" {unit}")
    };
    let prov = serde_json::to_value(c.provenance)
        .ok()
        .and_then(|p| p.as_str().map(str::to_string))
        .unwrap_or_default();
    cut(&format!("{v}{unit} ({prov})"), MAX_TEXT)
}

/// The status of a run that ended with `exit_code` and wrote `evidence` (if it got so far);
/// `diagnostics` is what it printed on stderr, for runs that could not be judged.
pub fn finished(
    evidence: Option<&Evidence>,
    exit_code: i32,
    diagnostics: &str,
    base: &LabRunStatus,
) -> LabRunStatus {
    let mut s = base.clone();
    s.phase = phase_of(exit_code);
    s.exit_code = Some(exit_code);
    s.finished_at = Some(crate::operator::now());
    s.expectations.clear();
    s.comparison.clear();
    match evidence {
        Some(e) => {
            s.verdict = Some(verdict_word(e.verdict).into());
            s.run_id = Some(e.run_id.clone());
            let held = e
                .expectations
                .iter()
                .filter(|x| x.verdict == iblab_core::evidence::Verdict::Pass)
                .count();
            let failed = e
                .expectations
                .iter()
                .filter(|x| x.verdict == iblab_core::evidence::Verdict::Fail)
                .count();
            let mut msg = format!(
                "{} · scenario {} · {held} held, {failed} failed, {} skipped · {:.1}s",
                e.lab,
                e.scenario,
                e.expectations.len() - held - failed,
                e.duration_s
            );
            if exit_code != exit::OK && exit_code != exit::FAILED {
                let why = e
                    .notes
                    .iter()
                    .chain(std::iter::once(&diagnostics.to_string()))
                    .filter(|n| !n.trim().is_empty())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n");
                msg.push_str(&format!("\n{}", tail(&why, MAX_MESSAGE)));
            }
            s.message = Some(msg);
            s.expectations = e
                .expectations
                .iter()
                .take(MAX_ITEMS)
                .map(|x| ExpectationStatus {
                    id: x.id.clone(),
                    verdict: x.verdict.as_str().into(),
                    explanation: cut(&x.explanation, MAX_TEXT),
                })
                .collect();
            s.comparison = e
                .comparison
                .rows
                .iter()
                .take(MAX_ITEMS)
                .map(|r| ComparisonStatus {
                    group: match r.group {
                        iblab_core::evidence::Group::Host => "host".into(),
                        iblab_core::evidence::Group::Network => "network".into(),
                    },
                    row: cut(&r.name, MAX_TEXT),
                    values: r
                        .values
                        .iter()
                        .map(|(p, c)| (p.as_str().to_string(), cell_text(c, &r.unit)))
                        .collect(),
                    roce_equals_ib: r.roce_equals_ib,
                    same_device: !r.same_device.is_empty(),
                })
                .collect();
        }
        None => {
            s.verdict = Some(
                match exit_code {
                    exit::INTERRUPTED => "interrupted",
                    _ => "error",
                }
                .into(),
            );
            let what = match exit_code {
                exit::BAD_INPUT => "bad input (exit 2): nothing was deployed",
                exit::ENVIRONMENT => "the environment (exit 3)",
                exit::INTERRUPTED => "interrupted (exit 130), torn down",
                _ => "iblab up ended without evidence",
            };
            s.message = Some(format!("{what}\n{}", tail(diagnostics, MAX_MESSAGE)));
        }
    }
    s
}

/// What `measuredWhere` says of a run in namespace `ns` for `student` (if the LabRun
/// names one): where the figures come from, who could have touched them and how.
pub fn measured_where(ns: &str, student: Option<&str>) -> String {
    let shell = iblab_k8s::manifest::SHELL;
    let node = iblab_k8s::manifest::CONTAINER;
    let unreachable = format!(
        "iblab measures in each lab pod's {node} container (its tools from a read-only \
         root, their output over the exec iblab started, their files in a /tmp only that \
         container mounts)"
    );
    let traffic = format!(
        "from the pod's {shell} container (no capability, user nobody, the same network \
         namespace) one can send traffic over the lab's links, which can move a network \
         figure (throughput, latency, loss, retransmissions, the counters), but not reach a \
         tool, what it printed, its binary or its files, nor answer for one (no port below \
         32768 is its to bind, and each server's port is checked to be held by that server \
         before its client starts; the emulated subnet's pod has no {shell})"
    );
    match student.filter(|s| !s.trim().is_empty()) {
        Some(who) => format!(
            "in lab pods of namespace {ns}: {unreachable}, which student {who} may not \
             enter (the class's admission policy); {traffic}, and {shell} is the only \
             container {who} may enter"
        ),
        None => format!(
            "in lab pods of namespace {ns}: {unreachable}; whoever may exec into {node} \
             there could have altered any figure; {traffic}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_says_who_could_have_moved_a_figure_and_how() {
        let s = measured_where("class-ada", Some("ada"));
        assert!(
            s.contains("class-ada")
                && s.contains("student ada may not enter")
                && s.contains("the only container ada may enter")
                && s.contains("nor answer for one"),
            "{s}"
        );
        let none = measured_where("team", None);
        assert!(
            none.contains("whoever may exec into node") && !none.contains("student"),
            "{none}"
        );
        assert_eq!(measured_where("team", Some(" ")), none);
    }

    fn fixture(name: &str) -> Evidence {
        use iblab_core::testdata::{LESSON5_CONGESTION, TCP_LOSS, evidence};
        match name {
            "tcp-loss" => evidence(TCP_LOSS),
            "lesson5-congestion" => evidence(LESSON5_CONGESTION),
            _ => panic!("no captured evidence {name} in iblab_core::testdata"),
        }
    }

    #[test]
    fn a_passing_run_reads_as_the_evidence_says() {
        let e = fixture("tcp-loss");
        let s = finished(Some(&e), 0, "", &LabRunStatus::default());
        assert_eq!(s.phase, Phase::Succeeded);
        assert_eq!(s.verdict.as_deref(), Some("pass"));
        assert_eq!(s.run_id.as_deref(), Some(e.run_id.as_str()));
        assert_eq!(s.expectations.len(), e.expectations.len());
        for (st, ev) in s.expectations.iter().zip(&e.expectations) {
            assert_eq!(st.id, ev.id);
            assert_eq!(st.verdict, ev.verdict.as_str());
        }
        assert!(s.message.unwrap().starts_with("tcp-loss · scenario"));
    }

    #[test]
    fn comparison_rows_carry_values_with_provenance() {
        let e = fixture("lesson5-congestion");
        let s = finished(Some(&e), 1, "", &LabRunStatus::default());
        assert_eq!(s.phase, Phase::Failed);
        assert_eq!(s.comparison.len(), e.comparison.rows.len());
        for (st, row) in s.comparison.iter().zip(&e.comparison.rows) {
            assert_eq!(st.values.len(), row.values.len());
            assert!(st.values.values().all(|v| v.ends_with(')')), "{st:?}");
        }
    }

    #[test]
    fn without_evidence_the_diagnostics_are_the_message() {
        let diag = format!(
            "{}error: lab.yaml:3:5: unknown field `nodez`",
            "x".repeat(9000)
        );
        let s = finished(None, 2, &diag, &LabRunStatus::default());
        assert_eq!(s.phase, Phase::Error);
        assert_eq!(s.verdict.as_deref(), Some("error"));
        let m = s.message.unwrap();
        assert!(m.contains("bad input"));
        assert!(m.ends_with("unknown field `nodez`"));
        assert!(m.chars().count() < MAX_MESSAGE + 100);
    }

    #[test]
    fn texts_are_cut_on_characters() {
        assert_eq!(cut("①②③④", 2), "①②…");
        assert_eq!(tail("abc③", 2), "…c③");
    }
}
