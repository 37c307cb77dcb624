//! A run started from the page is a real `iblab up`: this binary started again as a child,
//! `iblab up LAB --scenario … --backend … --set … --out RUNS/NAME --events RUNS/NAME/events.jsonl`,
//! in a process group of its own. It writes its state file (so `iblab status` sees it),
//! its run folder, its verdicts, exactly as from a terminal; what it printed goes to
//! `console.log` in its folder. The page follows it through its events file (JSON lines,
//! read as it grows) and, once it has ended, through its evidence. Stop is Ctrl-C to the
//! child (SIGINT): it tears its lab down and writes its evidence as interrupted. One run
//! at a time.

use std::collections::BTreeMap;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::lessons;
use crate::view::{self, Live};
use crate::words::Lang;
use iblab_core::evidence::{Evidence, StepRecord};

/// What the page asks to run.
#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    pub lab: String,
    #[serde(default)]
    pub scenario: Option<String>,
    #[serde(default)]
    pub backend: Option<String>,
    /// Parameters given a value (`--set KEY=VALUE`).
    #[serde(default)]
    pub set: BTreeMap<String, Value>,
}

/// Why a run was not started.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// A run is going.
    Busy,
    /// The request names something that is not there (a lab, a scenario, a parameter).
    Bad(String),
    /// The child could not be started.
    Start(String),
}

/// The backends the page may ask for.
pub const BACKENDS: &[&str] = &["auto", "local", "vm", "docker"];

/// The run of the page, going or last ended.
struct Current {
    name: String,
    dir: PathBuf,
    pid: u32,
    run: Option<Value>,
    steps: Vec<StepRecord>,
    stage: String,
    t: f64,
    stopping: bool,
    ended: Option<Ended>,
}

struct Ended {
    exit_code: Option<i32>,
    evidence: Option<Evidence>,
    console: String,
}

pub struct Runner {
    iblab: PathBuf,
    runs: PathBuf,
    default_backend: String,
    current: Mutex<Option<Current>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Runner {
    /// `iblab`: the binary to start (this one); `runs`: the runs folder.
    pub fn new(iblab: PathBuf, runs: PathBuf, default_backend: String) -> Arc<Runner> {
        Arc::new(Runner {
            iblab,
            runs,
            default_backend,
            current: Mutex::new(None),
            changed: tokio::sync::watch::channel(0).0,
        })
    }

    pub fn runs(&self) -> &Path {
        &self.runs
    }

    /// A receiver that changes whenever the current run does.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Is a run going?
    pub fn busy(&self) -> bool {
        self.lock().as_ref().is_some_and(|c| c.ended.is_none())
    }

    /// The argument vector of `iblab up` for a request, checked against the lab: only
    /// built-in labs, their own scenarios and parameters, a known backend, and values of
    /// letters, digits and `._-` (no value can be read as an option).
    pub fn argv(&self, req: &Request, out: &Path, lang: Lang) -> Result<Vec<String>, Refused> {
        let lab = lessons::find(&req.lab)
            .ok_or_else(|| Refused::Bad(format!("no built-in lab `{}`", req.lab)))?;
        let scenario = req.scenario.clone().unwrap_or_else(|| "default".into());
        if scenario != "default" && !lab.spec.scenarios.contains_key(&scenario) {
            return Err(Refused::Bad(format!(
                "lab `{}` has no scenario `{scenario}`",
                req.lab
            )));
        }
        let backend = req
            .backend
            .clone()
            .unwrap_or_else(|| self.default_backend.clone());
        if !BACKENDS.contains(&backend.as_str()) {
            return Err(Refused::Bad(format!(
                "backend `{backend}` is not one of {}",
                BACKENDS.join(", ")
            )));
        }
        let plain = |v: &str| {
            !v.is_empty()
                && v.len() <= 32
                && !v.starts_with('-')
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        };
        let mut argv: Vec<String> = vec![
            "up".into(),
            req.lab.clone(),
            "--scenario".into(),
            scenario,
            "--backend".into(),
            backend,
            "--color".into(),
            "never".into(),
            format!("--lang={}", lang.tag()),
        ];
        for (k, v) in &req.set {
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => String::new(),
            };
            if !lab.spec.params.contains_key(k) || !plain(&v) {
                return Err(Refused::Bad(format!(
                    "parameter `{k}`: not one of the lab's, or not a plain value"
                )));
            }
            argv.push(format!("--set={k}={v}"));
        }
        argv.push(format!("--out={}", out.display()));
        argv.push(format!("--events={}", out.join("events.jsonl").display()));
        Ok(argv)
    }

    /// Start a run: `Ok(its folder's name)`.
    /// `lang`: the page's, the run's language.
    pub fn start(self: &Arc<Self>, req: &Request, lang: Lang) -> Result<String, Refused> {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|c| c.ended.is_none()) {
            return Err(Refused::Busy);
        }
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace([':', '-'], "");
        let scenario = req.scenario.clone().unwrap_or_else(|| "default".into());
        let mut name = format!("{}-{scenario}-{stamp}", req.lab);
        let mut k = 2;
        while self.runs.join(&name).exists() {
            name = format!("{}-{scenario}-{stamp}-{k}", req.lab);
            k += 1;
        }
        let dir = self.runs.join(&name);
        let argv = self.argv(req, &dir, lang)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| Refused::Start(format!("cannot create {}: {e}", dir.display())))?;
        let console = std::fs::File::create(dir.join("console.log"))
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| Refused::Start(format!("cannot write console.log: {e}")))?;
        let mut cmd = tokio::process::Command::new(&self.iblab);
        cmd.args(&argv)
            .stdin(std::process::Stdio::null())
            .stdout(console.0)
            .stderr(console.1)
            // Its own process group: a Ctrl-C at `iblab ui`'s terminal is passed on by
            // `iblab ui` (which then waits for the teardown), not delivered to both.
            .process_group(0)
            .kill_on_drop(false);
        let child = cmd
            .spawn()
            .map_err(|e| Refused::Start(format!("cannot start {}: {e}", self.iblab.display())))?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(pid, run = %name, "started iblab {}", argv.join(" "));
        *cur = Some(Current {
            name: name.clone(),
            dir: dir.clone(),
            pid,
            run: None,
            steps: vec![],
            stage: String::new(),
            t: 0.0,
            stopping: false,
            ended: None,
        });
        drop(cur);
        self.bump();
        let me = self.clone();
        tokio::spawn(async move { me.follow(child, dir).await });
        Ok(name)
    }

    /// Read the child's events as they come until it has ended, then its evidence.
    async fn follow(self: Arc<Self>, mut child: tokio::process::Child, dir: PathBuf) {
        let path = dir.join("events.jsonl");
        let mut offset = 0u64;
        let mut partial = String::new();
        loop {
            let exited = child.try_wait();
            let fresh = read_from(&path, &mut offset, &mut partial);
            if !fresh.is_empty() {
                self.apply(&fresh);
            }
            match exited {
                Ok(Some(status)) => {
                    // Whatever it wrote after the last read.
                    let rest = read_from(&path, &mut offset, &mut partial);
                    self.apply(&rest);
                    let evidence = iblab_report::read(&dir).ok();
                    let console = tail(&dir.join("console.log"), 6000);
                    if let Some(c) = self.lock().as_mut() {
                        c.ended = Some(Ended {
                            exit_code: status.code(),
                            evidence,
                            console,
                        });
                    }
                    tracing::info!(code = ?status.code(), "the run ended");
                    self.bump();
                    return;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("cannot wait for the run: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn apply(&self, events: &[Value]) {
        if events.is_empty() {
            return;
        }
        let mut guard = self.lock();
        let Some(c) = guard.as_mut() else {
            return;
        };
        for ev in events {
            if let Some(t) = ev["t"].as_f64() {
                c.t = t;
            }
            match ev["event"].as_str() {
                Some("run") => c.run = Some(ev.clone()),
                Some("stage") => c.stage = ev["what"].as_str().unwrap_or_default().to_string(),
                Some("step") => {
                    if let Ok(r) = serde_json::from_value::<StepRecord>(ev["record"].clone()) {
                        c.steps.push(r);
                    }
                }
                _ => {}
            }
        }
        drop(guard);
        self.bump();
    }

    /// Ctrl-C to the run, if one is going: it tears down and ends as interrupted.
    pub fn stop(&self) -> bool {
        let mut guard = self.lock();
        let Some(c) = guard.as_mut().filter(|c| c.ended.is_none()) else {
            return false;
        };
        if c.pid > 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.pid as i32),
                nix::sys::signal::Signal::SIGINT,
            );
        }
        c.stopping = true;
        drop(guard);
        self.bump();
        true
    }

    /// Stop the run if one is going and wait until it has torn down.
    pub async fn stop_and_wait(&self) {
        if !self.stop() {
            return;
        }
        let mut rx = self.subscribe();
        while self.busy() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// The page's view of the run going or last ended (`{"idle": true}` when none).
    pub fn view(&self, lang: Lang) -> Value {
        let guard = self.lock();
        let Some(c) = guard.as_ref() else {
            return json!({ "idle": true });
        };
        match &c.ended {
            Some(Ended {
                evidence: Some(e), ..
            }) => view::of(e, &c.name, lang, None),
            Some(end) => json!({
                "name": c.name,
                "verdict": "error",
                "exit_code": end.exit_code,
                "console": end.console,
                "steps": [],
            }),
            None => {
                let live = Live {
                    stage: c.stage.clone(),
                    stopping: c.stopping,
                };
                match &c.run {
                    Some(run) => {
                        let e = view::partial(run, &c.steps, c.t);
                        view::of(&e, &c.name, lang, Some(&live))
                    }
                    None => json!({
                        "name": c.name,
                        "verdict": if c.stopping { "stopping" } else { "running" },
                        "stage": c.stage,
                        "steps": [],
                        "console": tail(&c.dir.join("console.log"), 2000),
                    }),
                }
            }
        }
    }
}

/// The JSON lines appended to `path` since `offset` (a line cut short waits in `partial`).
fn read_from(path: &Path, offset: &mut u64, partial: &mut String) -> Vec<Value> {
    let Ok(mut f) = std::fs::File::open(path) else {
        return vec![];
    };
    if f.seek(std::io::SeekFrom::Start(*offset)).is_err() {
        return vec![];
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return vec![];
    }
    *offset += buf.len() as u64;
    partial.push_str(&String::from_utf8_lossy(&buf));
    let mut out = Vec::new();
    while let Some(at) = partial.find('\n') {
        let line: String = partial.drain(..=at).collect();
        if let Ok(v) = serde_json::from_str(line.trim()) {
            out.push(v);
        }
    }
    out
}

/// The last `max` bytes of a file, as text.
fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let from = text.len().saturating_sub(max);
    String::from_utf8_lossy(&text[from..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner() -> Arc<Runner> {
        Runner::new("/bin/false".into(), std::env::temp_dir(), "auto".into())
    }

    fn req(v: Value) -> Request {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_request_becomes_an_argument_vector_only_from_the_labs_own_names() {
        let r = runner();
        let out = Path::new("/runs/x");
        let argv = r
            .argv(
                &req(json!({"lab": "lesson5", "scenario": "congestion-lossless", "set": {"rate_mbit": 40}})),
                out,
                Lang::Zh,
            )
            .unwrap();
        assert_eq!(
            argv,
            [
                "up",
                "lesson5",
                "--scenario",
                "congestion-lossless",
                "--backend",
                "auto",
                "--color",
                "never",
                "--lang=zh-CN",
                "--set=rate_mbit=40",
                "--out=/runs/x",
                "--events=/runs/x/events.jsonl"
            ]
        );
        for bad in [
            json!({"lab": "/etc/passwd"}),
            json!({"lab": "lesson5", "scenario": "--keep"}),
            json!({"lab": "lesson5", "backend": "kube"}),
            json!({"lab": "lesson5", "set": {"nope": 1}}),
            json!({"lab": "lesson5", "set": {"queue": "--keep"}}),
            json!({"lab": "lesson5", "set": {"queue": "4mb --keep"}}),
            json!({"lab": "lesson5", "set": {"queue": {"a": 1}}}),
        ] {
            assert!(
                matches!(
                    r.argv(&req(bad.clone()), out, Lang::En),
                    Err(Refused::Bad(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn events_are_read_as_the_file_grows() {
        let p = std::env::temp_dir().join(format!("iblab-ui-events-{}", std::process::id()));
        std::fs::write(&p, "{\"event\":\"run\",\"t\":0}\n{\"event\":\"sta").unwrap();
        let (mut off, mut part) = (0, String::new());
        let v = read_from(&p, &mut off, &mut part);
        assert_eq!(v.len(), 1);
        assert_eq!(part, "{\"event\":\"sta");
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"ge\",\"what\":\"x\"}\n").unwrap();
        let v = read_from(&p, &mut off, &mut part);
        assert_eq!(v[0]["what"], "x");
        assert!(part.is_empty());
        let _ = std::fs::remove_file(&p);
    }
}
