//! What a run will start: every program iblab execs for a plan, where it runs and what
//! starts it, derived from the plan by the parts that start them (the backend, the link
//! check, the fabrics, the steps). `up` (what is missing, `--yes`), `plan` and `doctor`
//! read this one list; while the run goes, [`Declared`] holds the executor to it: a
//! program started that the list does not name is a bug in iblab, refused in debug builds
//! (every test) and noted in the evidence otherwise. A program that cannot be started is
//! an environment error naming it and its package, never a result (see [`not_started`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use crate::backend::{Backend, EnvError, Kind, Runner};
use crate::fault::{Cmd, LossMechanism};
use crate::plan::Plan;
use crate::run::process::{Background, ExecOutput};
use crate::run::state::StateFile;

/// Where a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// This host: the backend's own helpers (`ip`, qemu).
    Host,
    /// The lab's nodes: this host's programs in a namespace (local), the guest image
    /// (vm), the lab image (docker, kube).
    Nodes,
    /// Where path ③'s emulated subnet runs: a namespace of this host, or a pod of the run.
    Subnet,
}

impl Place {
    pub fn as_str(self) -> &'static str {
        match self {
            Place::Host => "host",
            Place::Nodes => "nodes",
            Place::Subnet => "subnet",
        }
    }
}

/// Who provides a place's programs.
#[derive(Debug, Clone, Copy)]
pub enum Provider {
    /// This host's own programs, found on PATH; a missing one is installed with its package.
    Host,
    /// An image iblab builds itself: `what` names it, `has` says whether a program is in
    /// it. A program it lacks is a bug in iblab, not something a user installs.
    Image {
        what: &'static str,
        has: fn(&str) -> bool,
    },
}

/// One program a run starts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Need {
    pub place: Place,
    pub program: String,
    /// What starts it: `the link check`, `fabric ibsim`, `step send [① tcp]`.
    pub by: String,
}

/// The programs of one plan.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct Needs(Vec<Need>);

impl Needs {
    /// `program` runs at `place`, started by `by`.
    pub fn add(&mut self, place: Place, program: impl Into<String>, by: impl Into<String>) {
        let program = program.into();
        if program.is_empty() || self.has(place, &program) {
            return;
        }
        self.0.push(Need {
            place,
            program,
            by: by.into(),
        });
    }

    /// Every program of a list, all started by `by`.
    pub fn add_all(&mut self, place: Place, programs: &[&str], by: &str) {
        for p in programs {
            self.add(place, *p, by);
        }
    }

    pub fn all(&self) -> &[Need] {
        &self.0
    }

    /// Does the list name `program` (by its name, or the file name of a path) at `place`?
    pub fn has(&self, place: Place, program: &str) -> bool {
        let name = base(program);
        self.0
            .iter()
            .any(|n| n.place == place && (n.program == program || base(&n.program) == name))
    }

    /// The programs at one place, by name.
    pub fn at(&self, place: Place) -> BTreeSet<&str> {
        self.0
            .iter()
            .filter(|n| n.place == place)
            .map(|n| n.program.as_str())
            .collect()
    }

    fn sorted(mut self) -> Needs {
        self.0
            .sort_by(|a, b| (a.place, &a.program).cmp(&(b.place, &b.program)));
        self
    }
}

/// A program's file name (`/usr/sbin/ip` → `ip`).
fn base(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// Everything a run of `plan` starts.
pub fn of(plan: &Plan) -> Needs {
    let mut n = Needs::default();
    if let Some(k) = crate::backend::kind(&plan.backend) {
        k.programs(plan, &mut n);
    }
    crate::run::linkcheck::programs(plan, &mut n);
    crate::fabric::programs(plan, &mut n);
    crate::steps::programs(plan, &mut n);
    n.sorted()
}

/// Is `program` iblab itself, as the nodes of `kind` see it (path ①'s ping-pong,
/// `{{ iblab }}` in a command)? iblab brings itself there.
pub fn is_iblab(kind: &dyn Kind, program: &str) -> bool {
    program == kind.iblab_path() || base(program) == "iblab"
}

/// Programs of `needs` that this host must have but lacks, with the package that brings
/// each; `Err` names one an image of iblab's lacks (a bug in iblab: no package helps).
pub fn missing(
    kind: &dyn Kind,
    needs: &Needs,
    caps: &crate::caps::HostCaps,
) -> Result<Vec<(String, &'static str)>, String> {
    let mut out: Vec<(String, &'static str)> = Vec::new();
    for n in needs.all() {
        if is_iblab(kind, &n.program) {
            continue;
        }
        match kind.provider(n.place) {
            Provider::Host => {
                let name = base(&n.program);
                let known = crate::caps::package_of(name).is_some();
                // The snapshot knows the programs iblab has packages for; any other (a
                // lab's own command) is looked for on PATH here.
                if caps.has(name)
                    || (!known && crate::caps::which(name).is_some())
                    || (n.program.contains('/') && Path::new(&n.program).is_file())
                {
                    continue;
                }
                match crate::caps::package_of(name) {
                    Some(pkg) => {
                        if !out.iter().any(|(p, _)| p == name) {
                            out.push((name.to_string(), pkg));
                        }
                    }
                    None => {
                        return Err(format!(
                            "{} runs `{}` on this host, and it is not installed; iblab knows no \
                             package that brings it\n  fix: install it, or correct the command",
                            n.by, n.program
                        ));
                    }
                }
            }
            Provider::Image { what, has } => {
                // A program iblab knows the package of, which the image does not carry.
                // Any other (a lab's own command) is the lab's to know: if it is not
                // there, the run says so when it cannot start it.
                let name = base(&n.program);
                if crate::caps::package_of(name).is_some() && !has(name) {
                    return Err(if n.by.starts_with("step") {
                        format!(
                            "{} runs `{}` in the nodes, and {what} does not carry it\n  fix: \
                             use a program the image has, or another backend",
                            n.by, n.program
                        )
                    } else {
                        format!(
                            "{} runs `{}` in the nodes, but {what} does not carry it: a bug in \
                             iblab (please report it)",
                            n.by, n.program
                        )
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The program an argument vector starts, looking through the wrappers iblab puts around
/// commands: `ip netns exec NS`, `nsenter … --`, `timeout [-k N] SECS`, `env VAR=…`.
pub fn program_of(argv: &[String]) -> Option<&str> {
    let mut rest = argv;
    loop {
        let first = base(rest.first()?.as_str());
        rest = match first {
            "ip" if rest.len() > 4 && rest[1] == "netns" && rest[2] == "exec" => &rest[4..],
            "busybox" if rest.get(1).is_some_and(|a| a == "nsenter") => {
                let dash = rest.iter().position(|a| a == "--")?;
                &rest[dash + 1..]
            }
            "nsenter" => {
                let dash = rest.iter().position(|a| a == "--")?;
                &rest[dash + 1..]
            }
            "timeout" => {
                let mut i = 1;
                while let Some(a) = rest.get(i) {
                    match a.as_str() {
                        "-k" | "-s" | "--kill-after" | "--signal" => i += 2,
                        a if a.starts_with('-') => i += 1,
                        _ => break,
                    }
                }
                // The duration, then the command.
                &rest[(i + 1).min(rest.len())..]
            }
            "env" => {
                let mut i = 1;
                while let Some(a) = rest.get(i) {
                    match a.as_str() {
                        "-C" | "-u" | "--chdir" | "--unset" => i += 2,
                        a if a.starts_with('-') || a.contains('=') => i += 1,
                        _ => break,
                    }
                }
                &rest[i.min(rest.len())..]
            }
            _ => return rest.first().map(String::as_str),
        };
    }
}

/// A command that could not be started: the program, and why (as its launcher said).
#[derive(Debug, Clone, PartialEq)]
pub struct NotStarted {
    pub program: String,
    pub why: String,
    /// The launcher's own line, for the evidence.
    pub said: String,
}

/// Did this command fail to start at all (its program missing or not executable), by what
/// the launcher in between printed? The launchers are the ones iblab runs commands
/// through, with their messages as captured on real systems: `ip netns exec`, coreutils'
/// `timeout`, busybox's `nsenter`, a POSIX shell's `exec`, iblab's guest agent, the
/// container runtimes' exec.
pub fn not_started(out: &ExecOutput, program: &str) -> Option<NotStarted> {
    if out.success() || out.timed_out {
        return None;
    }
    let name = base(program);
    let why_of = |tail: &str| {
        let t = tail.trim();
        if t.is_empty() || t == "not found" {
            "not found".to_string()
        } else {
            t.to_string()
        }
    };
    for line in out.stderr.lines().chain(out.stdout.lines()) {
        let line = line.trim();
        // A named program and what followed it, in the launcher's own words.
        let found = named(line, "exec of \"", "\" failed: ")
            .or_else(|| named(line, "failed to run command ‘", "’: "))
            .or_else(|| named(line, "failed to run command '", "': "))
            .or_else(|| named(line, "can't execute '", "': "))
            .or_else(|| named(line, "exec: \"", "\": "))
            .or_else(|| named(line, "cannot run ", ": "))
            .or_else(|| shell_exec(line));
        if let Some((who, why)) = found
            && (who == program || base(who) == name || base(first_word(who)) == name)
            && missing_or_denied(why)
        {
            return Some(NotStarted {
                program: program.to_string(),
                why: why_of(why.split(": unknown").next().unwrap_or(why)),
                said: line.to_string(),
            });
        }
    }
    None
}

fn first_word(s: &str) -> &str {
    s.split_whitespace().next().unwrap_or(s)
}

/// `… {open}NAME{close}WHY`: (NAME, WHY).
fn named<'a>(line: &'a str, open: &str, close: &str) -> Option<(&'a str, &'a str)> {
    let start = line.find(open)? + open.len();
    let rest = &line[start..];
    let end = rest.find(close)?;
    Some((&rest[..end], &rest[end + close.len()..]))
}

/// dash: `sh: 1: exec: NAME: not found`; busybox: `sh: exec: line 0: NAME: not found`.
fn shell_exec(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_suffix(": not found")?;
    let name = rest.rsplit(": ").next()?;
    (rest.contains("exec: ") && !name.is_empty()).then_some((name, "not found"))
}

fn missing_or_denied(why: &str) -> bool {
    let w = why.to_ascii_lowercase();
    [
        "no such file or directory",
        "not found",
        "permission denied",
        "executable file not found",
    ]
    .iter()
    .any(|k| w.contains(k))
}

/// The error for a program that could not be started at `place`, with the fix; `by`
/// says what started it (a lab's own step, or a part of iblab).
pub fn not_started_error(
    kind: &dyn Kind,
    place: Place,
    node: &str,
    ns: &NotStarted,
    by: Option<&str>,
) -> EnvError {
    let name = base(&ns.program);
    let at = match place {
        Place::Host => "this host".to_string(),
        Place::Nodes => format!("node {node}"),
        Place::Subnet => format!("{node}, where the emulated subnet runs"),
    };
    let lab_own = by.is_some_and(|b| b.starts_with("step"));
    let fix = match kind.provider(place) {
        Provider::Host => match crate::caps::package_of(name) {
            Some(pkg) => {
                format!("apt-get install {pkg} (or run `iblab up` with --yes to let it install it)")
            }
            None => format!("install `{name}` on this host"),
        },
        Provider::Image { what, .. } if lab_own => format!(
            "{} names a program {what} does not carry: use one it has (`iblab doctor LAB` \
             lists what a run starts), or another backend",
            by.unwrap_or("the step")
        ),
        Provider::Image { what, .. } => format!(
            "{what} should carry it: rebuild it (`iblab image build --rebuild` for the lab \
             image, a new cache folder for the vm backend's), or report a bug"
        ),
    };
    EnvError::new(format!(
        "could not start `{}` on {at}: {} (it said: {})\n  fix: {fix}",
        ns.program, ns.why, ns.said
    ))
}

/// What started `argv`'s program at `place`, by the plan's list.
fn started_by<'n>(needs: &'n Needs, place: Place, argv: &[String]) -> Option<&'n str> {
    let p = program_of(argv)?;
    needs
        .all()
        .iter()
        .find(|n| n.place == place && (n.program == p || base(&n.program) == base(p)))
        .map(|n| n.by.as_str())
}

/// Programs started that the plan did not list, as a run saw them.
#[derive(Debug, Default)]
pub struct Undeclared(Mutex<BTreeSet<String>>);

impl Undeclared {
    pub fn list(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Hold a launch to the list: `Err` in debug builds when the list does not name it (a
/// bug in iblab, which every test then shows), and remember it for the evidence always.
fn check(
    needs: &Needs,
    undeclared: &Undeclared,
    place: Place,
    argv: &[String],
    iblab: &str,
) -> Result<(), String> {
    let Some(program) = program_of(argv) else {
        return Ok(());
    };
    if needs.has(place, program) || program == iblab || base(program) == "iblab" {
        return Ok(());
    }
    let said = format!("{program} ({})", place.as_str());
    if let Ok(mut s) = undeclared.0.lock() {
        s.insert(said);
    }
    if cfg!(debug_assertions) {
        return Err(format!(
            "iblab started `{program}` ({}), which the plan's program list does not name: a bug \
             in iblab (run/programs.rs derives that list; add it where the command is built)",
            place.as_str()
        ));
    }
    Ok(())
}

/// The host-side guard for [`crate::run::process`]: launches of this host's programs
/// during a run are held to the places this host provides.
pub fn host_guard(
    kind: &'static dyn Kind,
    needs: Arc<Needs>,
    undeclared: Arc<Undeclared>,
) -> crate::run::process::Guard {
    let places: Vec<Place> = [Place::Host, Place::Nodes, Place::Subnet]
        .into_iter()
        .filter(|p| matches!(kind.provider(*p), Provider::Host))
        .collect();
    let iblab = kind.iblab_path();
    Arc::new(move |argv: &[String]| {
        let Some(program) = program_of(argv) else {
            return Ok(());
        };
        if places.iter().any(|p| needs.has(*p, program)) {
            return Ok(());
        }
        check(&needs, &undeclared, Place::Host, argv, &iblab)
    })
}

/// The run's backend as the executor sees it: every command on a node or in the subnet's
/// home is held to the plan's list, and one that could not start becomes an environment
/// error that names the program and the fix.
pub struct Declared<'a> {
    pub inner: &'a dyn Backend,
    pub needs: Arc<Needs>,
    pub undeclared: Arc<Undeclared>,
}

impl Declared<'_> {
    fn hold(&self, place: Place, argv: &[String]) -> Result<(), EnvError> {
        check(
            &self.needs,
            &self.undeclared,
            place,
            argv,
            &self.inner.iblab_path(),
        )
        .map_err(EnvError::new)
    }

    fn started(
        &self,
        place: Place,
        node: &str,
        argv: &[String],
        out: ExecOutput,
    ) -> Result<ExecOutput, EnvError> {
        match program_of(argv).and_then(|p| not_started(&out, p)) {
            Some(ns) => Err(not_started_error(
                self.inner.kind(),
                place,
                node,
                &ns,
                started_by(&self.needs, place, argv),
            )),
            None => Ok(out),
        }
    }
}

#[async_trait]
impl Backend for Declared<'_> {
    fn kind(&self) -> &'static dyn Kind {
        self.inner.kind()
    }
    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        self.inner.provision(plan, state).await
    }
    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        self.hold(Place::Nodes, &cmd.argv)?;
        let out = self.inner.exec(node, cmd, timeout).await?;
        self.started(Place::Nodes, node, &cmd.argv, out)
    }
    fn iblab_path(&self) -> String {
        self.inner.iblab_path()
    }
    fn loss_mechanism(&self, node: &str, plan: LossMechanism) -> LossMechanism {
        self.inner.loss_mechanism(node, plan)
    }
    fn report(&self) -> (Vec<String>, Vec<(String, f64)>) {
        self.inner.report()
    }
    async fn host_side_diagnostics(&self, plan: &Plan) -> String {
        self.inner.host_side_diagnostics(plan).await
    }
    fn keep(&self) {
        self.inner.keep()
    }
    fn subnet_home(&self) -> Option<Arc<dyn Runner>> {
        self.inner.subnet_home().map(|r| {
            Arc::new(DeclaredRunner {
                inner: r,
                kind: self.inner.kind(),
                needs: self.needs.clone(),
                undeclared: self.undeclared.clone(),
            }) as Arc<dyn Runner>
        })
    }
    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError> {
        self.hold(Place::Nodes, argv)?;
        self.inner.spawn(node, argv, log, state).await
    }
    async fn exec_measured(
        &self,
        node: &str,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<ExecOutput, EnvError> {
        self.hold(Place::Nodes, &cmd.argv)?;
        let out = self.inner.exec_measured(node, cmd, timeout).await?;
        self.started(Place::Nodes, node, &cmd.argv, out)
    }
    async fn spawn_measured(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError> {
        self.hold(Place::Nodes, argv)?;
        self.inner.spawn_measured(node, argv, log, state).await
    }
}

/// The subnet's home, held to the list like the nodes.
struct DeclaredRunner {
    inner: Arc<dyn Runner>,
    kind: &'static dyn Kind,
    needs: Arc<Needs>,
    undeclared: Arc<Undeclared>,
}

#[async_trait]
impl Runner for DeclaredRunner {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn exec(&self, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        check(
            &self.needs,
            &self.undeclared,
            Place::Subnet,
            &cmd.argv,
            &self.kind.iblab_path(),
        )
        .map_err(EnvError::new)?;
        let out = self.inner.exec(cmd, timeout).await?;
        match program_of(&cmd.argv).and_then(|p| not_started(&out, p)) {
            Some(ns) => Err(not_started_error(
                self.kind,
                Place::Subnet,
                &self.inner.describe(),
                &ns,
                started_by(&self.needs, Place::Subnet, &cmd.argv),
            )),
            None => Ok(out),
        }
    }
    async fn spawn(&self, argv: &[String], log: &Path) -> Result<Background, EnvError> {
        check(
            &self.needs,
            &self.undeclared,
            Place::Subnet,
            argv,
            &self.kind.iblab_path(),
        )
        .map_err(EnvError::new)?;
        self.inner.spawn(argv, log).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    fn failed(code: i32, stderr: &str) -> ExecOutput {
        ExecOutput {
            exit_code: Some(code),
            stdout: String::new(),
            stderr: stderr.into(),
            duration: Duration::ZERO,
            timed_out: false,
            counters: None,
        }
    }

    #[test]
    fn the_program_is_found_through_iblabs_wrappers() {
        let p = |w: &[&str]| program_of(&v(w)).map(str::to_string);
        assert_eq!(p(&["ping", "-c", "1"]).as_deref(), Some("ping"));
        assert_eq!(
            p(&["ip", "netns", "exec", "iblab-1-a", "iperf3", "-s"]).as_deref(),
            Some("iperf3")
        );
        assert_eq!(p(&["ip", "-j", "link"]).as_deref(), Some("ip"));
        assert_eq!(
            p(&["timeout", "-k", "2", "5.0", "ib_write_bw", "-d"]).as_deref(),
            Some("ib_write_bw")
        );
        assert_eq!(
            p(&[
                "/usr/bin/busybox",
                "nsenter",
                "--net=/run/netns/a",
                "--",
                "/usr/bin/rping"
            ])
            .as_deref(),
            Some("/usr/bin/rping")
        );
        assert_eq!(
            p(&["env", "SIM_HOST=a", "LD_PRELOAD=x.so", "smpquery", "-D"]).as_deref(),
            Some("smpquery")
        );
        assert_eq!(
            p(&["env", "-C", "/tmp/iblab-ib/scratch", "A=1", "opensm", "-F"]).as_deref(),
            Some("opensm")
        );
        assert_eq!(
            p(&["ip", "netns", "exec", "ns", "timeout", "3", "ping"]).as_deref(),
            Some("ping")
        );
        assert_eq!(p(&[]), None);
    }

    /// What each launcher printed on this project's machines when the program was not
    /// there (or not executable): Debian 12's iproute2 6.1, coreutils 9.1 (UTF-8 and C
    /// locales), dash, busybox 1.35 (nsenter and sh), the guest agent.
    #[test]
    fn a_program_that_could_not_start_is_told_from_one_that_failed() {
        let cases = [
            (
                1,
                "exec of \"no-such-prog-x\" failed: No such file or directory",
            ),
            (
                127,
                "timeout: failed to run command ‘no-such-prog-x’: No such file or directory",
            ),
            (
                127,
                "timeout: failed to run command 'no-such-prog-x': No such file or directory",
            ),
            (127, "sh: 1: exec: no-such-prog-x: not found"),
            (
                127,
                "nsenter: can't execute 'no-such-prog-x': No such file or directory",
            ),
            (127, "sh: exec: line 0: no-such-prog-x: not found"),
            (
                127,
                "cannot run no-such-prog-x -c 1: No such file or directory (os error 2)",
            ),
            // Debian's docker.io 20.10 (runc 1.1), its CLI and its Engine API alike.
            (
                126,
                "OCI runtime exec failed: exec failed: unable to start container process: exec: \"no-such-prog-x\": executable file not found in $PATH: unknown",
            ),
        ];
        for (code, text) in cases {
            let got = not_started(&failed(code, text), "no-such-prog-x");
            assert!(got.is_some(), "{text}");
        }
        let denied = not_started(
            &failed(1, "exec of \"/tmp/noexec-x\" failed: Permission denied"),
            "/tmp/noexec-x",
        )
        .unwrap();
        assert_eq!(denied.why, "Permission denied");
        // A program that ran and failed, or a message about another program, is a result.
        for (code, text, prog) in [
            (1, "ping: connect: Network is unreachable", "ping"),
            (2, "iperf3: error - unable to connect to server", "iperf3"),
            (
                1,
                "exec of \"other\" failed: No such file or directory",
                "ping",
            ),
            (1, "Couldn't open file: No such file or directory", "cat"),
        ] {
            assert_eq!(not_started(&failed(code, text), prog), None, "{text}");
        }
        let mut ok = failed(0, "exec of \"ping\" failed: No such file or directory");
        ok.exit_code = Some(0);
        assert_eq!(not_started(&ok, "ping"), None);
    }

    /// A host with every program iblab knows installed, whose kernel's rxe serves every
    /// namespace, with qemu and a Docker engine: every backend can plan every path it
    /// carries.
    fn full_host() -> crate::caps::HostCaps {
        let mut c = crate::caps::HostCaps::for_tests();
        for t in crate::caps::TOOLS {
            c.tools.insert(
                t.program.into(),
                Some(format!("/usr/bin/{}", t.program).into()),
            );
        }
        c.rdma_rxe = crate::caps::Feature::Module;
        c.rxe_netns = crate::preflight::RxeNetns::Yes("test".into());
        c.docker_socket = Some("/run/docker.sock".into());
        c
    }

    /// Every built-in lab, in every scenario, on every backend, with every set of its
    /// paths that backend carries: each program the run starts is listed where it runs,
    /// and is one this host can install (a package iblab knows), iblab itself, or one the
    /// backend's image carries. A program added to a command builder without a package or
    /// outside an image fails here.
    #[test]
    fn every_builtin_plan_lists_programs_a_host_or_an_image_provides() {
        let caps = full_host();
        let mut plans = 0;
        for b in crate::lab::builtin::all() {
            let loaded = crate::lab::load::load_str(b.name, b.text).unwrap();
            let lab = &loaded.lab;
            let scenarios: Vec<Option<String>> = std::iter::once(None)
                .chain(lab.spec.scenarios.keys().map(|k| Some(k.clone())))
                .collect();
            let paths = &lab.spec.paths;
            let subsets: Vec<Vec<crate::lab::PathKind>> = (1..(1u32 << paths.len()))
                .map(|m| {
                    paths
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| m & (1 << i) != 0)
                        .map(|(_, p)| *p)
                        .collect()
                })
                .collect();
            for kind in crate::backend::KINDS {
                for scenario in &scenarios {
                    for set in &subsets {
                        let req = crate::plan::Request {
                            scenario: scenario.clone(),
                            backend: kind.name().into(),
                            paths: Some(set.clone()),
                            hca: None,
                        };
                        let plan = match crate::plan::plan(&loaded, &req, &caps) {
                            Ok(p) => p,
                            // A path this backend does not carry (roce in pods).
                            Err(crate::plan::PlanError::Environment(_)) => continue,
                            Err(e) => panic!("{} {scenario:?} {}: {e}", b.name, kind.name()),
                        };
                        plans += 1;
                        let needs = of(&plan);
                        let what = format!(
                            "{} scenario {scenario:?} on {} with {set:?}",
                            b.name,
                            kind.name()
                        );
                        for n in needs.all() {
                            if is_iblab(*kind, &n.program) {
                                continue;
                            }
                            match kind.provider(n.place) {
                                Provider::Host => assert!(
                                    crate::caps::package_of(base(&n.program)).is_some(),
                                    "{what}: {} starts `{}` on this host, and no package is known for it",
                                    n.by,
                                    n.program
                                ),
                                Provider::Image { what: image, has } => assert!(
                                    has(base(&n.program)),
                                    "{what}: {} starts `{}`, which {image} lacks",
                                    n.by,
                                    n.program
                                ),
                            }
                        }
                        // Each command a step names, and the link check's ping.
                        for s in plan.steps.iter().filter(|s| s.skip.is_none()) {
                            if let crate::plan::Action::Exec { argv, .. } = &s.action {
                                let p = program_of(argv).unwrap();
                                assert!(
                                    needs.has(Place::Nodes, p) || is_iblab(*kind, p),
                                    "{what}: {p}"
                                );
                            }
                        }
                        if !crate::run::linkcheck::probes(&plan.nodes).is_empty() {
                            assert!(needs.has(Place::Nodes, "ping"), "{what}: no ping");
                        }
                        assert_eq!(
                            missing(*kind, &needs, &caps).map(|m| m.len()),
                            Ok(0),
                            "{what}"
                        );
                    }
                }
            }
        }
        assert!(plans > 100, "only {plans} plans");
    }

    #[test]
    fn needs_are_named_once_and_found_by_file_name() {
        let mut n = Needs::default();
        n.add(Place::Nodes, "ping", "the link check");
        n.add(Place::Nodes, "ping", "step x");
        n.add(Place::Host, "/usr/sbin/ip", "the local backend");
        assert_eq!(n.all().len(), 2);
        assert!(n.has(Place::Nodes, "/usr/bin/ping"));
        assert!(n.has(Place::Host, "ip"));
        assert!(!n.has(Place::Host, "ping"));
        assert_eq!(n.all()[0].by, "the link check");
    }
}
