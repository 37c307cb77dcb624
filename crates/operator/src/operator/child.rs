//! One LabRun's run: `iblab up` itself, as a child process with a folder of its own (the
//! lab file, its state file, its run folder, what it printed). The same engine as on the
//! command line, and a run that crashes takes nothing else with it.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use iblab_core::evidence::Evidence;
use iblab_lab::PathKind;

/// What to run, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// A built-in lab's name, or the path of the lab file written for a `Lab` object.
    pub lab: String,
    pub scenario: Option<String>,
    pub paths: Option<Vec<PathKind>>,
    /// The LabRun's namespace: the run's pods go there.
    pub namespace: String,
    /// The run's own folder.
    pub dir: PathBuf,
}

impl Launch {
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }
    fn stderr_file(&self) -> PathBuf {
        self.dir.join("stderr.log")
    }
    fn stdout_file(&self) -> PathBuf {
        self.dir.join("stdout.log")
    }

    /// `iblab up`'s arguments (after the program).
    pub fn argv(&self) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--color".into(),
            "never".into(),
            "--namespace".into(),
            self.namespace.clone(),
            "up".into(),
            self.lab.clone(),
            "--backend".into(),
            "kube".into(),
            "--out".into(),
            self.run_dir().to_string_lossy().into_owned(),
        ];
        if let Some(s) = &self.scenario {
            v.extend(["--scenario".into(), s.clone()]);
        }
        if let Some(p) = &self.paths {
            v.push("--paths".into());
            v.push(p.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(","));
        }
        v
    }
}

/// Start the run. Its state file goes to a folder of its own, so its run id can be read
/// as soon as it exists (and a sweep after a crash knows what to look for).
pub fn start(iblab: &Path, l: &Launch) -> Result<tokio::process::Child, String> {
    std::fs::create_dir_all(l.state_dir())
        .map_err(|e| format!("cannot create {}: {e}", l.state_dir().display()))?;
    let out = std::fs::File::create(l.stdout_file())
        .map_err(|e| format!("cannot create {}: {e}", l.stdout_file().display()))?;
    let err = std::fs::File::create(l.stderr_file())
        .map_err(|e| format!("cannot create {}: {e}", l.stderr_file().display()))?;
    tokio::process::Command::new(iblab)
        .args(l.argv())
        .env("IBLAB_STATE_DIR", l.state_dir())
        .env_remove("IBLAB_KUBE_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", iblab.display()))
}

/// The run id, once the run has written its state file.
pub fn run_id(l: &Launch) -> Option<String> {
    std::fs::read_dir(l.state_dir())
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .find_map(|n| n.strip_suffix(".json").map(str::to_string))
}

/// What a finished run left: its evidence (if it got so far), what it printed on stderr,
/// and the files a user fetches (name, text).
pub struct Left {
    pub evidence: Option<Evidence>,
    pub stderr: String,
    pub files: Vec<(String, String)>,
}

pub fn collect(l: &Launch) -> Left {
    let stderr = std::fs::read_to_string(l.stderr_file()).unwrap_or_default();
    let run = l.run_dir();
    let evidence = std::fs::read_to_string(run.join("evidence.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Evidence>(&t).ok());
    let files = ["evidence.json", "junit.xml", "report.html"]
        .iter()
        .filter_map(|f| {
            std::fs::read_to_string(run.join(f))
                .ok()
                .map(|t| (f.to_string(), t))
        })
        .collect();
    Left {
        evidence,
        stderr,
        files,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_is_iblab_up_on_the_kube_backend_in_the_runs_namespace() {
        let l = Launch {
            lab: "lesson4".into(),
            scenario: Some("sm-off".into()),
            paths: Some(vec![PathKind::Tcp, PathKind::Ib]),
            namespace: "class-alice".into(),
            dir: PathBuf::from("/w/class-alice/run1"),
        };
        assert_eq!(
            l.argv().join(" "),
            "--color never --namespace class-alice up lesson4 --backend kube --out \
             /w/class-alice/run1/run --scenario sm-off --paths tcp,ib"
        );
        let plain = Launch {
            scenario: None,
            paths: None,
            ..l
        };
        assert!(
            !plain
                .argv()
                .iter()
                .any(|a| a == "--paths" || a == "--scenario")
        );
    }

    #[test]
    fn the_run_id_is_read_from_its_state_file() {
        let dir = std::env::temp_dir().join(format!("iblab-child-test-{}", std::process::id()));
        let l = Launch {
            lab: "x".into(),
            scenario: None,
            paths: None,
            namespace: "n".into(),
            dir: dir.clone(),
        };
        std::fs::create_dir_all(l.state_dir()).unwrap();
        assert_eq!(run_id(&l), None);
        std::fs::write(l.state_dir().join("a1b2c3.json"), "{}").unwrap();
        assert_eq!(run_id(&l).as_deref(), Some("a1b2c3"));
        let left = collect(&l);
        assert!(left.evidence.is_none() && left.files.is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
