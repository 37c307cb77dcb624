//! The runs under the runs folder (`iblab-runs/`, where `iblab up` writes them), by lesson:
//! every folder holding an evidence document, newest first. A run is named by its folder;
//! a name from a request is looked up among these folders, never joined onto a path.

use std::path::{Path, PathBuf};

use serde_json::Value;

use iblab_core::evidence::Evidence;

/// One run in the list.
pub fn entry(name: &str, e: &Evidence) -> Value {
    crate::view::head(name, e)
}

/// The folders of `runs` that hold an evidence document, newest first.
pub fn list(runs: &Path) -> Vec<(String, Evidence)> {
    let mut out: Vec<(String, Evidence)> = std::fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| d.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|d| {
            let name = d.file_name().to_str()?.to_string();
            let e = iblab_report::read(&d.path()).ok()?;
            Some((name, e))
        })
        .collect();
    out.sort_by(|a, b| b.1.started.cmp(&a.1.started).then(b.0.cmp(&a.0)));
    out
}

/// The folder of run `name`, if it is one of the runs folder's own (no path in a name).
pub fn dir(runs: &Path, name: &str) -> Option<PathBuf> {
    if name.is_empty()
        || name.starts_with('.')
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return None;
    }
    let found = std::fs::read_dir(runs)
        .ok()?
        .flatten()
        .find(|d| d.file_name().to_str() == Some(name))?;
    found
        .file_type()
        .ok()
        .filter(|t| t.is_dir())
        .map(|_| found.path())
}

/// A file of run `name` (its report, its evidence, a log), if it lies inside its folder.
pub fn file(runs: &Path, name: &str, rel: &str) -> Option<PathBuf> {
    let dir = dir(runs, name)?.canonicalize().ok()?;
    if rel
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return None;
    }
    let p = dir.join(rel).canonicalize().ok()?;
    (p.starts_with(&dir) && p.is_file()).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_inside_the_runs_folder() {
        let root = std::env::temp_dir().join(format!("iblab-ui-history-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let runs = root.join("runs");
        std::fs::create_dir_all(runs.join("lesson5-a/logs")).unwrap();
        std::fs::write(runs.join("lesson5-a/report.html"), "r").unwrap();
        std::fs::write(runs.join("lesson5-a/logs/x.log"), "l").unwrap();
        std::fs::write(root.join("secret"), "s").unwrap();
        std::fs::write(
            runs.join("lesson5-a/evidence.json"),
            include_str!("../../../tests/fixtures/evidence/lesson5-congestion.json"),
        )
        .unwrap();
        assert!(dir(&runs, "lesson5-a").is_some());
        assert!(file(&runs, "lesson5-a", "report.html").is_some());
        assert!(file(&runs, "lesson5-a", "logs/x.log").is_some());
        for bad in [
            "../secret",
            "logs/../../secret",
            "/etc/passwd",
            "",
            "logs//x.log",
        ] {
            assert!(file(&runs, "lesson5-a", bad).is_none(), "{bad}");
        }
        for bad in ["..", ".", "../runs", "lesson5-a/logs", ""] {
            assert!(dir(&runs, bad).is_none(), "{bad}");
        }
        let l = list(&runs);
        assert_eq!(l.len(), 1);
        assert_eq!(entry(&l[0].0, &l[0].1)["lab"], "lesson5");
        let _ = std::fs::remove_dir_all(&root);
    }
}
