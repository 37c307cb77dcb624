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
    /// The LabRun's uid: the run's objects carry it as their owner, so that no sweep from
    /// the command line takes them (`down --all --all-owners` included).
    pub labrun_uid: String,
    /// The run's id, chosen by the operator and written in the LabRun's status before
    /// the run starts (`IBLAB_RUN_ID`).
    pub run_id: String,
}

impl Launch {
    /// The owner label of every object of the run.
    pub fn owner(&self) -> String {
        format!(
            "{}{}",
            iblab_k8s::sweep::LABRUN_OWNER_PREFIX,
            self.labrun_uid
        )
    }
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

/// Why a run could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {}: {source}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Start the run. Its state file goes to a folder of its own, so its run id can be read
/// as soon as it exists (and a sweep after a crash knows what to look for).
pub fn start(iblab: &Path, l: &Launch) -> Result<tokio::process::Child, StartError> {
    let create = |path: PathBuf| move |source| StartError::Create { path, source };
    std::fs::create_dir_all(l.state_dir()).map_err(create(l.state_dir()))?;
    let out = std::fs::File::create(l.stdout_file()).map_err(create(l.stdout_file()))?;
    let err = std::fs::File::create(l.stderr_file()).map_err(create(l.stderr_file()))?;
    tokio::process::Command::new(iblab)
        .args(l.argv())
        .env("IBLAB_STATE_DIR", l.state_dir())
        .env("IBLAB_OWNER", l.owner())
        .env("IBLAB_RUN_ID", &l.run_id)
        .env_remove("IBLAB_KUBE_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(false)
        .spawn()
        .map_err(|source| StartError::Spawn {
            program: iblab.to_path_buf(),
            source,
        })
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

/// What the operator reads of a finished run, at most: its stderr's last [`STDERR_TAIL`]
/// bytes, and each evidence file whole only up to [`FILE_CAP`] (a run whose files are
/// larger, for example from a flooding tool in a pod a student can enter, is reported
/// without them rather than held in the operator's memory).
pub const STDERR_TAIL: u64 = 1 << 20;
pub const FILE_CAP: u64 = 64 << 20;

pub fn collect(l: &Launch) -> Left {
    let mut stderr = tail(&l.stderr_file(), STDERR_TAIL);
    let run = l.run_dir();
    let mut files = Vec::new();
    for f in ["evidence.json", "junit.xml", "report.html"] {
        match bounded(&run.join(f), FILE_CAP) {
            Ok(Some(t)) => files.push((f.to_string(), t)),
            Ok(None) => {}
            Err(why) => stderr.push_str(&format!("\n{f}: {why}")),
        }
    }
    let evidence = files
        .iter()
        .find(|(f, _)| f == "evidence.json")
        .and_then(|(_, t)| serde_json::from_str::<Evidence>(t).ok());
    Left {
        evidence,
        stderr,
        files,
    }
}

/// A run's file larger than the operator reads.
#[derive(Debug, thiserror::Error)]
#[error(
    "{len} bytes, more than the {} MiB the operator reads of a run's file: left out",
    cap >> 20
)]
struct TooLarge {
    len: u64,
    cap: u64,
}

/// A file's text if it is at most `cap` bytes; `None` when it is not there.
fn bounded(path: &Path, cap: u64) -> Result<Option<String>, TooLarge> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    if meta.len() > cap {
        return Err(TooLarge {
            len: meta.len(),
            cap,
        });
    }
    Ok(std::fs::read_to_string(path).ok())
}

/// The last `cap` bytes of a file (all of it when shorter).
fn tail(path: &Path, cap: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut out = String::new();
    if len > cap {
        let _ = f.seek(SeekFrom::Start(len - cap));
        out.push_str(&format!("[the first {} bytes left out]\n", len - cap));
    }
    let mut buf = Vec::new();
    let _ = f.take(cap).read_to_end(&mut buf);
    out.push_str(&String::from_utf8_lossy(&buf));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flooded stderr is read from its end only, and a file past the cap is left out
    /// with the reason: the operator never holds more than the caps of a run.
    #[test]
    fn a_runs_files_are_read_within_bounds() {
        let dir = std::env::temp_dir().join(format!("iblab-child-bounds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big");
        std::fs::write(&big, vec![b'y'; 3 << 20]).unwrap();
        let t = tail(&big, 1 << 20);
        assert!(
            t.starts_with("[the first 2097152 bytes left out]"),
            "{}",
            &t[..60]
        );
        assert!(t.len() < (1 << 20) + 100);
        let why = bounded(&big, 1 << 20).unwrap_err().to_string();
        assert!(
            why.contains("3145728 bytes") && why.contains("left out"),
            "{why}"
        );
        assert_eq!(bounded(&dir.join("none"), 10).unwrap(), None);
        std::fs::write(dir.join("small"), "ok").unwrap();
        assert_eq!(
            bounded(&dir.join("small"), 10).unwrap().as_deref(),
            Some("ok")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_child_is_iblab_up_on_the_kube_backend_in_the_runs_namespace() {
        let l = Launch {
            lab: "lesson4".into(),
            scenario: Some("sm-off".into()),
            paths: Some(vec![PathKind::Tcp, PathKind::Ib]),
            namespace: "class-alice".into(),
            dir: PathBuf::from("/w/class-alice/run1"),
            labrun_uid: "5f0c3a4e-1b2d-4c8e-9a7f-0e6d5c4b3a21".into(),
            run_id: "0123456789abcdef".into(),
        };
        assert_eq!(l.owner(), "labrun-5f0c3a4e-1b2d-4c8e-9a7f-0e6d5c4b3a21");
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
            labrun_uid: String::new(),
            run_id: "a1b2c3".into(),
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
