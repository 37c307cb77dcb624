//! Teardown and reaping alone, without a lab: what a state file names is undone and the
//! file goes, and reaping leaves no child a zombie nor waits on one a kept run leaves
//! running. Its own test binary: reaping waits for every child of the process.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use iblab_engine::run::teardown;
use iblab_sys::state::{self, Owned, Resource, RunState, StateFile};

/// Reaping waits for every child of this process: one test at a time.
static CHILDREN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Root, or say it is missing: a failure in CI (`CI=true`), where every test must run.
fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let what = "root: a state file's live marker is written in /run (run as root, as CI does)";
    assert!(
        !matches!(std::env::var("CI").as_deref(), Ok("true" | "1")),
        "missing in CI, where every test must run: {what}"
    );
    eprintln!("SKIPPED: {what}");
    false
}

/// A process's state letter (`Z` a zombie), `None` once it is gone.
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

fn until(what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "waited 10s for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn reaping_leaves_no_zombie_and_says_which_children_run_on() {
    let _one = CHILDREN.lock().await;
    // A child that ended with nothing holding its handle: a zombie until waited for.
    let ended = Command::new("true").spawn().unwrap();
    let ended_pid = ended.id();
    drop(ended);
    until("the child to end", || state_of(ended_pid) == Some('Z'));
    // One that runs on, as a kept run's processes do.
    let running = Command::new("sleep").arg("30").spawn().unwrap();
    let running_pid = running.id();
    drop(running);

    let note = teardown::reap(Duration::from_millis(50)).await;
    assert_eq!(state_of(ended_pid), None, "the ended child is reaped");
    assert!(
        state_of(running_pid).is_some_and(|s| s != 'Z'),
        "the running child is left running"
    );
    let note = note.expect("a child still running is noted");
    assert!(note.contains("1 child process(es) still running"), "{note}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(running_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert_eq!(teardown::reap(teardown::GRACE).await, None);
    assert_eq!(state_of(running_pid), None, "the killed child is reaped");
}

/// A state file for a test run (`iblab-test-teardown`), as `up` writes it.
fn state_file(run_id: &str) -> StateFile {
    let (owner_pid, owner_start_ticks) = state::this_owner();
    StateFile::create(RunState {
        run_id: run_id.into(),
        lab: "iblab-test-teardown".into(),
        scenario: "default".into(),
        backend: "local".into(),
        owner_pid,
        owner_start_ticks,
        started: "2025-01-01T00:00:00Z".into(),
        run_dir: std::env::temp_dir(),
        resources: vec![],
        nodes: vec![],
        kept: false,
    })
    .expect("the state file is written (as root: its live marker is in /run)")
}

#[tokio::test]
async fn teardown_undoes_what_the_state_file_names_then_removes_it() {
    if !root() {
        return;
    }
    let _one = CHILDREN.lock().await;
    let run_id = state::new_run_id();
    let state_path = state::state_dir().join(format!("{run_id}.json"));
    let state = state_file(&run_id);
    let scratch = std::env::temp_dir().join(format!("iblab-test-teardown-{run_id}"));
    state
        .record(Resource::Dir {
            path: scratch.clone(),
        })
        .unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::write(scratch.join("fifo"), "").unwrap();
    let child = {
        use std::os::unix::process::CommandExt;
        Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let pid = child.id();
    drop(child);
    state
        .record(Resource::Process {
            pid,
            start_ticks: iblab_sys::pid::start_ticks_of(pid).unwrap(),
        })
        .unwrap();
    assert!(state_path.exists());

    let notes = teardown::undo(state, &iblab_backend::Backends(&[])).await;
    assert_eq!(notes, Vec::<String>::new());
    assert!(!scratch.exists(), "the scratch folder is removed");
    assert!(
        !state_path.exists(),
        "the state file goes once all is undone"
    );
    assert_eq!(teardown::reap(teardown::GRACE).await, None);
    assert_eq!(state_of(pid), None, "the killed process is reaped");
}

#[tokio::test]
async fn what_teardown_cannot_undo_is_a_note_and_the_state_file_stays() {
    if !root() {
        return;
    }
    let run_id = state::new_run_id();
    let state_path = state::state_dir().join(format!("{run_id}.json"));
    let state = state_file(&run_id);
    state
        .record(Resource::Owned(Owned {
            backend: "iblab-test-nowhere".into(),
            what: "container".into(),
            name: format!("iblab-test-{run_id}"),
        }))
        .unwrap();
    let notes = teardown::undo(state, &iblab_backend::Backends(&[])).await;
    let kept = state_path.exists();
    // Cleanup in every outcome: the state file and its live marker.
    let _ = std::fs::remove_file(&state_path);
    let _ = std::fs::remove_file(Path::new("/run/iblab-live").join(&run_id));
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("teardown: ")
            && notes[0].contains("iblab-test-nowhere")
            && notes[0].ends_with("; run `iblab down --all`"),
        "{}",
        notes[0]
    );
    assert!(
        kept,
        "a run not wholly undone keeps its state file for `down`"
    );
}
