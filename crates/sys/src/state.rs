//! The state file: every resource a run creates, written down before it is created, so
//! that `down`, an interrupt, a failed step, or `down --all` after a crash can remove it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::pid::{alive, start_ticks_of};

/// Prefix of every namespace, process tag and file a run creates.
pub const PREFIX: &str = "iblab-";

/// One thing a run created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Resource {
    /// A network namespace (its veths and bridge go with it).
    Netns { name: String },
    /// A process group leader, with its start time to guard against pid reuse.
    Process { pid: u32, start_ticks: u64 },
    /// A file outside the run folder (a fifo, a socket).
    File { path: PathBuf },
    /// A scratch folder outside the run folder, removed with all it holds.
    Dir { path: PathBuf },
    /// A resource of a backend (a container, a pod, …), recorded by name before it is
    /// created; the backend that owns it undoes it.
    Owned(Owned),
}

/// What a state file holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunState {
    pub run_id: String,
    pub lab: String,
    pub scenario: String,
    pub backend: String,
    /// The `iblab up` process that owns the run.
    pub owner_pid: u32,
    /// Its start time (clock ticks after boot, `/proc/PID/stat`): the pid alone may name
    /// another process once the owner is gone (after a crash, or a reboot), which `down`
    /// would otherwise kill as the owner. Absent in state files of older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_start_ticks: Option<u64>,
    pub started: String,
    pub run_dir: PathBuf,
    pub resources: Vec<Resource>,
    /// The lab's nodes and switches with their addresses, for `status` and `exec`.
    #[serde(default)]
    pub nodes: Vec<NodeEntry>,
    /// Left running on purpose (`up --keep`) once its owner ends.
    #[serde(default)]
    pub kept: bool,
}

/// A node or switch of a run, as `status RUN` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEntry {
    pub name: String,
    pub switch: bool,
    /// `interface address/prefix`, one per addressed interface.
    pub addresses: Vec<String>,
    /// Path ③'s LID, as the run's last port probe saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lid: Option<u64>,
    /// Path ②'s RoCEv2 GIDs, `DEVICE GID`, read from the node's rxe devices when the run
    /// was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gids: Vec<String>,
}

/// How a run stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Its `iblab up` is still running.
    Running,
    /// Its owner ended and left it up on purpose (`--keep`).
    Kept,
    /// Its owner is gone and did not finish teardown (a crash): `down` removes it.
    Stale,
}

impl Standing {
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Running => "running",
            Standing::Kept => "kept",
            Standing::Stale => "stale",
        }
    }
}

/// Is process `pid`, started at `start_ticks` (when known), still running? A live pid
/// whose start time differs is another process that got the same number.
pub fn owner_alive(pid: u32, start_ticks: Option<u64>) -> bool {
    alive(pid)
        && match start_ticks {
            Some(t) => crate::pid::start_ticks_of(pid) == Some(t),
            None => true,
        }
}

/// This process as a run's owner: its pid and start time.
pub fn this_owner() -> (u32, Option<u64>) {
    let pid = std::process::id();
    (pid, crate::pid::start_ticks_of(pid))
}

impl RunState {
    /// Is the `iblab up` that owns the run still running (and not this process)?
    pub fn owner_running(&self) -> bool {
        self.owner_pid != std::process::id() && owner_alive(self.owner_pid, self.owner_start_ticks)
    }

    pub fn standing(&self) -> Standing {
        if self.owner_running() {
            Standing::Running
        } else if self.kept {
            Standing::Kept
        } else {
            Standing::Stale
        }
    }
}

/// A state file on disk, updated atomically on every change.
pub struct StateFile {
    path: PathBuf,
    state: Mutex<RunState>,
}

/// Where state files live: `$IBLAB_STATE_DIR`, else `/run/iblab`.
pub fn state_dir() -> PathBuf {
    std::env::var_os("IBLAB_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/iblab"))
}

/// Who started a run, as a label value: this machine (its machine id, else its hostname)
/// and its state folder, hashed (FNV-1a, stable across builds), or `$IBLAB_OWNER` when set
/// and usable as a label value. On a shared cluster `down --all` sweeps only the crashed
/// runs of its own owner: a teacher cleaning up does not delete the students' runs.
pub fn owner() -> String {
    if let Some(o) = std::env::var("IBLAB_OWNER")
        .ok()
        .filter(|o| is_label_value(o))
    {
        return o;
    }
    let machine = std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default();
    // Absolute but not resolved: the folder may be gone (a crash lost it) when `down
    // --all` asks whose runs to sweep.
    let dir = state_dir();
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    owner_of(machine.trim(), &dir.to_string_lossy())
}

/// The owner id of a machine and a state folder.
pub fn owner_of(machine: &str, state_dir: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in machine.bytes().chain([0]).chain(state_dir.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A Kubernetes label value: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn is_label_value(v: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !v.is_empty()
        && v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && alnum(v.chars().next())
        && alnum(v.chars().last())
}

impl StateFile {
    pub fn create(state: RunState) -> std::io::Result<StateFile> {
        let dir = state_dir();
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}.json", state.run_id));
        let live = live_dir();
        std::fs::create_dir_all(&live)?;
        let marker = match state.owner_start_ticks {
            Some(t) => format!("{} {t}", state.owner_pid),
            None => state.owner_pid.to_string(),
        };
        std::fs::write(live.join(&state.run_id), marker)?;
        let f = StateFile {
            path,
            state: Mutex::new(state),
        };
        f.flush()?;
        Ok(f)
    }

    pub fn open(path: &Path) -> std::io::Result<StateFile> {
        let text = std::fs::read_to_string(path)?;
        let state: RunState = serde_json::from_str(&text).map_err(std::io::Error::other)?;
        Ok(StateFile {
            path: path.to_path_buf(),
            state: Mutex::new(state),
        })
    }

    pub fn snapshot(&self) -> RunState {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Mark the run as kept on purpose: it outlives its owner until `iblab down`; what
    /// the run learned of its nodes (path ③'s LIDs, path ②'s GIDs) goes with it.
    pub fn mark_kept(
        &self,
        lids: &std::collections::BTreeMap<String, u64>,
        gids: &std::collections::BTreeMap<String, Vec<String>>,
    ) -> std::io::Result<()> {
        {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            s.kept = true;
            for n in &mut s.nodes {
                n.lid = lids.get(&n.name).copied();
                n.gids = gids.get(&n.name).cloned().unwrap_or_default();
            }
        }
        self.flush()?;
        // Its owner is about to end: the live marker now names the state file instead, so a
        // `down --all` run with another state folder spares it too.
        let run_id = self.snapshot().run_id;
        let path = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        std::fs::write(
            live_dir().join(run_id),
            format!("{KEPT_MARK}{}", path.display()),
        )
    }

    /// Write a resource down (durably) before creating it.
    pub fn record(&self, r: Resource) -> std::io::Result<()> {
        {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if !s.resources.contains(&r) {
                s.resources.push(r);
            }
        }
        self.flush()
    }

    fn flush(&self) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(&self.snapshot()).map_err(std::io::Error::other)?;
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Remove everything recorded, newest first, then the state file itself.
    /// Returns what could not be removed.
    pub async fn teardown(self, by: &dyn Undo) -> Vec<String> {
        let s = self.snapshot();
        let problems = undo(&s.resources, by).await;
        if problems.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_file(live_dir().join(&s.run_id));
        }
        problems
    }
}

/// Where every run, whatever its state directory, leaves `<run_id>` = its owner's pid
/// while it is up: `down --all` never sweeps the namespaces of a live run it cannot see.
fn live_dir() -> PathBuf {
    PathBuf::from("/run/iblab-live")
}

/// How a kept run's live marker starts; the path of its state file follows.
const KEPT_MARK: &str = "kept ";

/// Is the run with this id owned by a live process (other than this one), or kept with
/// `--keep` and its state file still there (whatever the state folder)?
pub fn run_is_live(run_id: &str) -> bool {
    std::fs::read_to_string(live_dir().join(run_id)).is_ok_and(|text| marker_is_live(&text))
}

/// What a live marker says: an owner's pid and start time (live while that process runs,
/// and is not us), or a kept run's state file (live while that file exists).
fn marker_is_live(text: &str) -> bool {
    match text.trim().strip_prefix(KEPT_MARK) {
        Some(state_file) => Path::new(state_file).exists(),
        None => {
            let mut words = text.split_whitespace();
            let pid = words.next().and_then(|w| w.parse::<u32>().ok());
            let ticks = words.next().map(|w| w.parse::<u64>().ok());
            match (pid, ticks) {
                (Some(pid), Some(Some(t))) => {
                    pid != std::process::id() && owner_alive(pid, Some(t))
                }
                (Some(pid), None) => pid != std::process::id() && alive(pid),
                _ => false,
            }
        }
    }
}

/// The run id in a namespace name `iblab-<run>-<node>`.
pub fn run_of_namespace(name: &str) -> Option<&str> {
    name.strip_prefix(PREFIX)?.split('-').next()
}

/// Remove live markers whose owner is gone (left by runs whose teardown met a problem).
pub fn forget_dead_runs() {
    let Ok(entries) = std::fs::read_dir(live_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !run_is_live(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Forget the live marker of a run that is gone.
pub fn forget(run_id: &str) {
    let _ = std::fs::remove_file(live_dir().join(run_id));
}

/// Every state file present.
pub fn all_runs() -> Vec<StateFile> {
    let Ok(entries) = std::fs::read_dir(state_dir()) else {
        return vec![];
    };
    let mut out: Vec<StateFile> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| StateFile::open(&p).ok())
        .collect();
    out.sort_by_key(|f| f.snapshot().started);
    out
}

/// A backend's own resource in the state file: `what` says which kind of thing (a
/// container, a pod, …) in the backend's words, `name` which one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Owned {
    pub backend: String,
    pub what: String,
    pub name: String,
}

/// Who undoes a backend's own resources: the backends the caller knows.
#[async_trait::async_trait]
pub trait Undo: Sync {
    /// Undo `owned`, all of backend `backend`; `None` when no such backend is known here.
    async fn undo(&self, backend: &str, owned: &[Owned]) -> Option<Vec<String>>;
}

/// Undo resources newest first: processes, then each backend's own resources (asked of
/// the backend that recorded them), then files, then namespaces with everything inside.
pub async fn undo(resources: &[Resource], by: &dyn Undo) -> Vec<String> {
    let mut problems = Vec::new();
    for r in resources.iter().rev() {
        if let Resource::Process { pid, start_ticks } = r
            && start_ticks_of(*pid) == Some(*start_ticks)
        {
            let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
    }
    let owned: Vec<Owned> = resources
        .iter()
        .rev()
        .filter_map(|r| match r {
            Resource::Owned(o) => Some(o.clone()),
            _ => None,
        })
        .collect();
    let mut backends: Vec<&str> = owned.iter().map(|o| o.backend.as_str()).collect();
    backends.dedup();
    for b in backends {
        let mine: Vec<Owned> = owned.iter().filter(|o| o.backend == b).cloned().collect();
        match by.undo(b, &mine).await {
            Some(p) => problems.extend(p),
            None => problems.push(format!(
                "{} resource(s) of backend `{b}`, which this build does not know: {}",
                mine.len(),
                mine.iter()
                    .map(|o| format!("{} {}", o.what, o.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    for r in resources.iter().rev() {
        let removed = match r {
            Resource::File { path } => std::fs::remove_file(path).map(|_| path),
            Resource::Dir { path } => std::fs::remove_dir_all(path).map(|_| path),
            _ => continue,
        };
        if let Err(e) = removed
            && e.kind() != std::io::ErrorKind::NotFound
        {
            problems.push(format!(
                "a scratch file of the run could not be removed: {e}"
            ));
        }
    }
    let namespaces: Vec<String> = resources
        .iter()
        .rev()
        .filter_map(|r| match r {
            Resource::Netns { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    match tokio::task::spawn_blocking(move || delete_namespaces(&namespaces)).await {
        Ok(p) => problems.extend(p),
        Err(e) => problems.push(format!("deleting the run's namespaces failed: {e}")),
    }
    problems
}

/// Kill every process inside the namespaces, then delete them (their veths and bridges go too).
pub fn delete_namespaces(names: &[String]) -> Vec<String> {
    let existing: Vec<&String> = names.iter().filter(|n| netns_path(n).exists()).collect();
    if existing.is_empty() {
        return vec![];
    }
    let inodes: Vec<u64> = existing
        .iter()
        .filter_map(|n| std::fs::metadata(netns_path(n)).ok().map(|m| m.ino()))
        .collect();
    for _ in 0..3 {
        let pids = pids_in_namespaces(&inodes);
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let script: String = existing
        .iter()
        .map(|n| format!("netns del {n}\n"))
        .collect();
    let _ = std::process::Command::new("ip")
        .args(["-force", "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            if let Some(mut i) = c.stdin.take() {
                i.write_all(script.as_bytes())?;
            }
            // Bounded: a namespace that will not go is reported below, not waited for.
            crate::pid::wait_within(&mut c, std::time::Duration::from_secs(30))
        });
    existing
        .into_iter()
        .filter(|n| netns_path(n).exists())
        .map(|n| format!("network namespace {n} could not be deleted"))
        .collect()
}

fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Namespaces on this host that carry iblab's prefix.
pub fn lab_namespaces() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return vec![];
    };
    let mut v: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    v.sort();
    v
}

/// Pids whose network namespace is one of `inodes`.
fn pids_in_namespaces(inodes: &[u64]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let me = std::process::id();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .map(|m| inodes.contains(&m.ino()))
                .unwrap_or(false)
        })
        .collect()
}

/// Bytes of randomness in a run id.
pub const RUN_ID_BYTES: usize = 8;

/// A random run id: 64 bits from the kernel's generator, in hex (16 characters). Run ids
/// scope every deletion (`down`, a cluster's sweep by label), so two runs must never share
/// one: with 64 bits, a billion runs collide with a chance of about 3 in 100 000. Short
/// enough for every name it goes into (a namespace `iblab-<run>` is 22 characters of a
/// DNS label's 63). Without /dev/urandom, the clock's nanoseconds and the pid stand in.
pub fn new_run_id() -> String {
    let mut b = [0u8; RUN_ID_BYTES];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut b)
    });
    if read.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        b = (t ^ ((std::process::id() as u64) << 40)).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Is `s` a run id as [`new_run_id`] makes them (what `IBLAB_RUN_ID` must be)?
pub fn is_run_id(s: &str) -> bool {
    s.len() == 2 * RUN_ID_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_run_is_live_while_its_state_file_exists() {
        let dir = std::env::temp_dir().join(format!("iblab-marker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("abc123.json");
        std::fs::write(&file, "{}").unwrap();
        let marker = format!("{KEPT_MARK}{}", file.display());
        assert!(marker_is_live(&marker));
        std::fs::remove_file(&file).unwrap();
        assert!(!marker_is_live(&marker));
        let _ = std::fs::remove_dir_all(&dir);
        // An owner's pid: live unless it is us or gone.
        assert!(!marker_is_live(&std::process::id().to_string()));
        assert!(marker_is_live(&nix::unistd::getppid().to_string()));
        assert!(!marker_is_live("not a pid"));
        // With its start time: live only while that very process runs.
        let parent = nix::unistd::getppid().as_raw() as u32;
        let ticks = crate::pid::start_ticks_of(parent).unwrap();
        assert!(marker_is_live(&format!("{parent} {ticks}")));
        assert!(
            !marker_is_live(&format!("{parent} {}", ticks + 1)),
            "a live pid that started at another time is another process"
        );
        assert!(!marker_is_live(&format!("{parent} soon")));
    }

    /// A state file's owner is running only while the process with its pid and start
    /// time runs: after the owner is gone its pid may be another process's.
    #[test]
    fn an_owner_is_its_pid_and_its_start_time() {
        let parent = nix::unistd::getppid().as_raw() as u32;
        let ticks = crate::pid::start_ticks_of(parent);
        assert!(ticks.is_some());
        assert!(owner_alive(parent, ticks));
        assert!(!owner_alive(parent, ticks.map(|t| t + 1)));
        assert!(
            owner_alive(parent, None),
            "an older state file has no start time"
        );
        let (me, my_ticks) = this_owner();
        assert_eq!(me, std::process::id());
        assert_eq!(my_ticks, crate::pid::start_ticks_of(me));
    }

    /// An owner id tells machines and state folders apart, is the same every time, and is
    /// a label value.
    #[test]
    fn an_owner_is_one_machine_and_state_folder() {
        let a = owner_of("m1", "/run/iblab");
        assert_eq!(a, owner_of("m1", "/run/iblab"));
        assert_ne!(a, owner_of("m2", "/run/iblab"));
        assert_ne!(a, owner_of("m1", "/tmp/other"));
        // The separator keeps (machine, folder) pairs apart that concatenate alike.
        assert_ne!(owner_of("m1/", "run"), owner_of("m1", "/run"));
        assert!(is_label_value(&a) && a.len() == 16);
        assert!(is_label_value(&owner()));
        for bad in ["", "-x", "x-", "a b", "é", &"x".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
        assert!(is_label_value("teacher.class-7_a"));
    }
}
