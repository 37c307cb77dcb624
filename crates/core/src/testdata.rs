//! Evidence of captured runs, kept in this crate (`tests/fixtures/evidence/`), for the
//! tests of the crates that read evidence (the report, the engine, the page, the binary):
//! they get it from here, never by a path into this crate. Older captures than the kept
//! evidence of `tests/evidence/` (which `refresh` rewrites); tests assert on their figures.

use crate::evidence::Evidence;

/// A run of the tcp-loss lab (path ① under loss, on the local backend).
pub const TCP_LOSS: &str = include_str!("../tests/fixtures/evidence/tcp-loss.json");
/// A run of lesson 3.
pub const LESSON3: &str = include_str!("../tests/fixtures/evidence/lesson3.json");
/// A run of lesson 4's `sm-off` scenario.
pub const LESSON4_SM_OFF: &str = include_str!("../tests/fixtures/evidence/lesson4-sm-off.json");
/// A run of lesson 5 (congestion on each path).
pub const LESSON5_CONGESTION: &str =
    include_str!("../tests/fixtures/evidence/lesson5-congestion.json");

/// One of the above, read.
pub fn evidence(text: &str) -> Evidence {
    serde_json::from_str(text).expect("a captured run's evidence reads")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric in a captured run's evidence is in the lab's catalogue of its step's
    /// kind (`iblab_lab::names`): the captures above and every kept run of `tests/evidence/`.
    #[test]
    fn captured_metrics_are_all_catalogued() {
        let kept = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/evidence");
        let mut runs: Vec<(String, String)> =
            [TCP_LOSS, LESSON3, LESSON4_SM_OFF, LESSON5_CONGESTION]
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("capture {i}"), t.to_string()))
                .collect();
        for f in std::fs::read_dir(&kept).unwrap().flatten() {
            if f.path().extension().is_some_and(|x| x == "json") {
                let text = std::fs::read_to_string(f.path()).unwrap();
                runs.push((f.path().display().to_string(), text));
            }
        }
        assert!(runs.len() > 10, "kept runs are read ({})", runs.len());
        let mut seen = 0;
        for (name, text) in &runs {
            let e: serde_json::Value = serde_json::from_str(text).unwrap();
            for step in e["steps"].as_array().unwrap() {
                let kind = step["kind"].as_str().unwrap();
                let known = iblab_lab::names::for_step(kind);
                for metric in step["metrics"].as_object().unwrap().keys() {
                    assert!(
                        known.contains(metric),
                        "{name}: {kind} step metric {metric} is not catalogued"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 100, "the runs have metrics to check ({seen})");
    }
}
