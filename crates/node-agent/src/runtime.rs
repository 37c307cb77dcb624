//! The wrapper around runc, on the node: containerd's runtime handler for path ② lab pods
//! (a RuntimeClass) runs it instead of runc. On `create` of a container of a pod that asks
//! for the agent, it checks that the container is one of a lab pod's ([`shape`]); for the
//! measuring container it then makes, in the pod's network namespace (which exists since
//! the sandbox's CNI setup), the pod's lab links and its own rxe devices, and adds exactly
//! those devices' verbs files (and `rdma_cm`) to the container's spec, with the RDMA
//! subsystem's netlink taken away and its processes bounded; the other containers get
//! their bound. Every other call goes to runc untouched. The devices go with the pod:
//! deleting the sandbox deletes its network namespace, its interfaces, and the rxe devices
//! on them.
//!
//! Transactional and bounded: every command has a deadline, what a create made is undone
//! when it fails half way (and what an earlier, killed attempt left in the pod's namespace
//! is cleared first), so a retry starts from the pod as the CNI left it; device creation is
//! serialized on the node and capped ([`Policy::max_devices`]).
//!
//! A pod's devices stay its own: the agent remembers which verbs device numbers it gave
//! which container (a container keeps its device file and cgroup rule for its life), and
//! a number a pod freed by deleting its own device is held by a device of that same pod
//! before any other pod's devices are made ([`hold_freed_numbers`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::log::{clean, note};
use crate::oci::{self, DeviceFile, Role, RuncCall, Target};
use crate::shape::{self, Policy};
use crate::spec::{RoceSpec, rename_script};

/// The verbs files' class in sysfs: `uverbsN/ibdev` names the device, `uverbsN/dev` its
/// number. Not per network namespace: the node sees every pod's.
const UVERBS_CLASS: &str = "/sys/class/infiniband_verbs";
/// The RDMA CM's file, which rping and perftest's `-R` open.
const RDMA_CM_SYSFS: &str = "/sys/class/misc/rdma_cm/dev";
const RDMA_CM: &str = "/dev/infiniband/rdma_cm";
/// How long a new device's verbs file may take to appear.
const APPEAR_WITHIN: Duration = Duration::from_secs(5);
/// How long one command (`ip`, `rdma`, `sh`) may run (measured: making an rxe took over
/// 10 s on the test cluster's emulated node while its host was busy).
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(30);
/// How long a whole create may take, undoing included (the kubelet gives up on a create
/// after 2 minutes).
pub const CREATE_DEADLINE: Duration = Duration::from_secs(100);
/// Held while a create counts the node's devices and makes its own: one at a time.
const LOCK: &str = "/run/iblab-node-runtime.lock";

/// Why a lab pod's container must not be created, or why its devices could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Target(#[from] oci::TargetError),
    #[error(transparent)]
    NotALabPod(#[from] shape::NotALabPod),
    #[error("pod {pod}: {source}")]
    Pod {
        pod: String,
        #[source]
        source: Box<Error>,
    },
    #[error("the node has no `{0}` (it is needed to make a pod's rxe)")]
    NoProgram(String),
    #[error("cannot run `{shown}`: {source}")]
    Start {
        shown: String,
        #[source]
        source: std::io::Error,
    },
    /// A command failed: what it said on its standard error (cut).
    #[error("`{shown}` failed: {said}")]
    Failed { shown: String, said: String },
    #[error("`{shown}` did not finish within {} s and was killed", within.as_secs())]
    Killed { shown: String, within: Duration },
    #[error(
        "the create took longer than {} s; `{shown}` was not run",
        CREATE_DEADLINE.as_secs()
    )]
    OutOfTime { shown: String },
    #[error("in the pod's network namespace: {0}")]
    InPod(#[source] Box<Error>),
    /// A tool's answer that is not what it prints.
    #[error("`{tool}` said {said}")]
    Unreadable { tool: &'static str, said: String },
    #[error("cannot {verb} {}: {source}", path.display())]
    File {
        verb: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another pod's devices were being made for {} s ({LOCK}: {source})",
        CREATE_DEADLINE.as_secs()
    )]
    Busy {
        #[source]
        source: nix::Error,
    },
    #[error(
        "the node's RDMA subsystem is in `{0}` network namespace mode: there an rxe device a \
         pod's namespace asks for stays in the node's own namespace (measured on Linux 7.2: \
         `rdma dev set DEV netns NS` answers Operation not supported for rxe) and the pod can \
         neither see nor open it. Path ② in pods needs `shared` (`rdma system set netns \
         shared` before any pod starts, or ib_core netns_mode=1; docs/kube.md)"
    )]
    NetnsMode(String),
    #[error(
        "the node has {have} RDMA devices and the pod asks for {asked} more: at most {max} on \
         this node (the node agent's --max-devices)"
    )]
    TooManyDevices {
        have: usize,
        asked: usize,
        max: usize,
    },
    #[error(
        "{device} got verbs device number {minor}, which another container of the node was \
         given"
    )]
    NumberTaken { device: String, minor: u32 },
    #[error("the node has no RDMA CM ({RDMA_CM_SYSFS}: {0}; modprobe rdma_ucm)")]
    NoRdmaCm(#[source] std::io::Error),
    #[error("{RDMA_CM_SYSFS} says {0:?}")]
    RdmaCm(String),
    #[error(
        "no verbs file for {device} appeared in {UVERBS_CLASS} within {} s",
        APPEAR_WITHIN.as_secs()
    )]
    NoVerbsFile { device: String },
    /// A step failed and what the create had made was undone.
    #[error("{0} (what it had made is undone)")]
    Undone(#[source] Box<Error>),
    /// A step failed, and undoing what the create had made failed too (`left`: how).
    #[error("{source}; undoing it also failed: {}", left.join("; "))]
    UndoFailed {
        #[source]
        source: Box<Error>,
        left: Vec<String>,
    },
}

impl Error {
    /// The same error of a command, shown as `shown` (not as the program that entered the
    /// pod's namespace to run it).
    fn shown_as(self, argv: &[&str]) -> Error {
        let shown = argv.join(" ");
        match self {
            Error::Start { source, .. } => Error::Start { shown, source },
            Error::Failed { said, .. } => Error::Failed { shown, said },
            Error::Killed { within, .. } => Error::Killed { shown, within },
            other => other,
        }
    }

    /// This error after the create undid what it made (`left`: what it could not).
    fn undone(self, left: Vec<String>) -> Error {
        if left.is_empty() {
            Error::Undone(Box::new(self))
        } else {
            Error::UndoFailed {
                source: Box::new(self),
                left,
            }
        }
    }
}

/// What the wrapper did with a call, for its log.
pub enum Done {
    /// Not a container of a pod that asked for the agent: runc goes on as asked.
    Untouched,
    /// A lab pod's container, checked and bounded; for the measuring one, these devices
    /// were made and given.
    Prepared {
        pod: String,
        role: Role,
        devices: Vec<DeviceFile>,
    },
}

/// Before runc runs: prepare a lab pod's container if this call creates one. `Err`: the
/// reason the container must not be created (also written to runc's log file, where the
/// shim reads a failure's reason, so the pod's events say it).
pub fn before_runc(args: &[String], policy: &Policy) -> Result<Done, Error> {
    let call = RuncCall::parse(args);
    if call.subcommand.as_deref() != Some("create") {
        return Ok(Done::Untouched);
    }
    let bundle = call.bundle.clone().unwrap_or_else(|| PathBuf::from("."));
    let path = bundle.join("config.json");
    // runc says what is wrong with a bundle it cannot read.
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Done::Untouched);
    };
    let Ok(mut config) = serde_json::from_str::<Value>(&text) else {
        return Ok(Done::Untouched);
    };
    let Some(target) = oci::target(&config) else {
        return Ok(Done::Untouched);
    };
    let result = target.map_err(Error::Target).and_then(|t| {
        shape::check(&config, &t, policy)?;
        let devices = match t.role {
            Role::Node => {
                let devices = make_devices(&t, &call, policy).map_err(|e| Error::Pod {
                    pod: t.pod.clone(),
                    source: Box::new(e),
                })?;
                oci::give(&mut config, &devices);
                for r in &t.spec.rxe {
                    let counters =
                        format!("/sys/class/infiniband/{}/ports/1/hw_counters", r.device);
                    if Path::new(&counters).is_dir() {
                        oci::give_counters(&mut config, &r.device, &counters);
                    }
                }
                shape::deny_rdma_netlink(&mut config);
                devices
            }
            Role::Shell | Role::Init => vec![],
        };
        shape::limit_pids(&mut config, shape::pids_limit(t.role));
        let tmp = bundle.join("config.json.iblab");
        std::fs::write(&tmp, config.to_string())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| Error::File {
                verb: "write",
                path: path.clone(),
                source,
            })?;
        Ok(Done::Prepared {
            pod: t.pod,
            role: t.role,
            devices,
        })
    });
    if let Err(e) = &result
        && let Some(log) = &call.log
    {
        let msg = format!(
            "iblab node runtime: {}",
            clean(&e.to_string(), crate::log::LINE_CAP)
        );
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(oci::log_line(call.log_json, &msg).as_bytes()));
    }
    result
}

/// A program of the node, by name: where PATH or the usual folders have it.
fn program(name: &str) -> Result<PathBuf, Error> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::NoProgram(name.to_string()))
}

/// Run `argv` with `stdin` until it ends or `deadline` passes (then it is killed): its
/// standard output, or why it failed (its standard error, cut).
pub fn run(argv: &[String], stdin: Option<&str>, deadline: Duration) -> Result<String, Error> {
    let shown = argv.join(" ");
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Start {
            shown: shown.clone(),
            source,
        })?;
    if let (Some(text), Some(mut w)) = (stdin, child.stdin.take()) {
        let _ = w.write_all(text.as_bytes());
    }
    // Both streams read while it runs (a full pipe would stop it before it ends).
    let reader = |s: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut s) = s {
                let _ = s.by_ref().take(1 << 20).read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let until = Instant::now() + deadline;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    match status {
        Some(st) if st.success() => Ok(out),
        Some(_) => Err(Error::Failed {
            shown,
            said: clean(err.trim(), 400),
        }),
        None => Err(Error::Killed {
            shown,
            within: deadline,
        }),
    }
}

/// Where the agent's commands run: a pod's network namespace. A trait so that the
/// transaction can be tested without a node.
pub trait Netns {
    /// Run `argv` there with `stdin`: its standard output, or why it failed.
    fn run(&self, argv: &[&str], stdin: Option<&str>) -> Result<String, Error>;
}

/// A pod's network namespace on this node, entered with `nsenter`, each command under the
/// create's deadline.
struct PodNetns {
    path: String,
    until: Instant,
}

impl Netns for PodNetns {
    fn run(&self, argv: &[&str], stdin: Option<&str>) -> Result<String, Error> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::OutOfTime {
                shown: argv.join(" "),
            });
        }
        let mut full = vec![
            program("nsenter")?.display().to_string(),
            format!("--net={}", self.path),
            "--".into(),
            program(argv[0])?.display().to_string(),
        ];
        full.extend(argv[1..].iter().map(|s| s.to_string()));
        run(&full, stdin, left.min(COMMAND_DEADLINE))
            .map_err(|e| Error::InPod(Box::new(e.shown_as(argv))))
    }
}

/// Something a create made in the pod's network namespace, to be undone if it fails.
#[derive(Debug, Clone, PartialEq)]
pub enum Made {
    Renamed { from: String, to: String },
    Link(String),
    Rxe(String),
}

/// The interfaces of a network namespace: name and kind (`vxlan`, `veth`, …).
fn interfaces(ns: &dyn Netns) -> Result<Vec<(String, String)>, Error> {
    let out = ns.run(&["ip", "-j", "-d", "link", "show"], None)?;
    let v: Value = serde_json::from_str(&out).map_err(|e| Error::Unreadable {
        tool: "ip -j link",
        said: format!("{e}"),
    })?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            Some((
                l["ifname"].as_str()?.to_string(),
                l["linkinfo"]["info_kind"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            ))
        })
        .collect())
}

/// Undo what was made, last first; what could not be undone, in words.
pub fn undo(made: &[Made], ns: &dyn Netns) -> Vec<String> {
    let mut left = Vec::new();
    for m in made.iter().rev() {
        let r = match m {
            Made::Rxe(d) => ns.run(&["rdma", "link", "delete", d], None),
            Made::Link(l) => ns.run(&["ip", "link", "delete", l], None),
            Made::Renamed { from, to } => ns.run(&["sh", "-c", &rename_script(to, from)], None),
        };
        if let Err(e) = r {
            left.push(e.to_string());
        }
    }
    left
}

/// What an earlier attempt at this container's create left in the pod's namespace (one
/// killed at its deadline, or whose undo failed): its rxe devices, its VXLAN links, the
/// underlay's new name. Only the pod's own namespace is touched: a device is deleted only
/// if it is on one of the pod's own links there (every namespace sees every device of the
/// node, so a name alone could be another pod's).
fn clear_leftovers(spec: &RoceSpec, ns: &dyn Netns) -> Result<(), Error> {
    for r in &spec.rxe {
        // Absent is the usual answer.
        let Ok(shown) = ns.run(&["rdma", "link", "show", &format!("{}/1", r.device)], None) else {
            continue;
        };
        let words: Vec<&str> = shown.split_whitespace().collect();
        let on_ours = spec
            .links
            .iter()
            .any(|l| words.windows(2).any(|w| w == ["netdev", l.name.as_str()]));
        if on_ours {
            ns.run(&["rdma", "link", "delete", &r.device], None)?;
        }
    }
    let now = interfaces(ns)?;
    for l in &spec.links {
        if now.iter().any(|(n, kind)| n == &l.name && kind == "vxlan") {
            ns.run(&["ip", "link", "delete", &l.name], None)?;
        }
    }
    if let Some(to) = &spec.rename_underlay_to {
        let has = |n: &str| now.iter().any(|(i, _)| i == n);
        if has(to) && !has(&spec.underlay) {
            ns.run(&["sh", "-c", &rename_script(to, &spec.underlay)], None)?;
        }
    }
    Ok(())
}

/// Make the pod's links and rxe devices in its network namespace, all or nothing: when a
/// step fails, what this attempt made is undone before the error is returned (and says
/// what could not be).
pub fn make(spec: &RoceSpec, ns: &dyn Netns) -> Result<Vec<Made>, Error> {
    clear_leftovers(spec, ns)?;
    let mut made = Vec::new();
    let result = (|| {
        if let Some(to) = &spec.rename_underlay_to {
            ns.run(&["sh", "-c", &rename_script(&spec.underlay, to)], None)?;
            made.push(Made::Renamed {
                from: spec.underlay.clone(),
                to: to.clone(),
            });
        }
        for line in spec.link_lines() {
            let mut argv = vec!["ip"];
            argv.extend(line.split_whitespace());
            ns.run(&argv, None)?;
            made.push(Made::Link(argv[3].to_string()));
        }
        for r in &spec.rxe {
            // A name that exists is refused by the kernel: a pod never gets a device it
            // did not make here.
            ns.run(
                &[
                    "rdma", "link", "add", &r.device, "type", "rxe", "netdev", &r.netdev,
                ],
                None,
            )?;
            made.push(Made::Rxe(r.device.clone()));
        }
        Ok::<(), Error>(())
    })();
    match result {
        Ok(()) => Ok(made),
        Err(e) => {
            let mut left = undo(&made, ns);
            // A command killed at its deadline may have done its work all the same.
            if let Err(more) = clear_leftovers(spec, ns) {
                left.push(more.to_string());
            }
            Err(e.undone(left))
        }
    }
}

/// The node's RDMA subsystem's network namespace mode (`rdma system show`): `exclusive`
/// or `shared`.
fn netns_mode() -> Result<String, Error> {
    let out = run(
        &[
            program("rdma")?.display().to_string(),
            "system".into(),
            "show".into(),
        ],
        None,
        COMMAND_DEADLINE,
    )?;
    mode_of(&out).ok_or_else(|| Error::Unreadable {
        tool: "rdma system show",
        said: format!("{:?}", clean(&out, 200)),
    })
}

/// `netns exclusive copy-on-fork on` → `exclusive`.
pub fn mode_of(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == "netns")?;
    words.next().map(str::to_string)
}

/// How many RDMA devices the node has (each has a verbs file).
fn devices_on_node() -> usize {
    std::fs::read_dir(UVERBS_CLASS)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("uverbs"))
        .count()
}

/// Hold the node's lock (waiting up to the create's deadline for another create).
fn lock() -> Result<nix::fcntl::Flock<std::fs::File>, Error> {
    use nix::fcntl::{Flock, FlockArg};
    let until = Instant::now() + CREATE_DEADLINE;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .map_err(|source| Error::File {
            verb: "open",
            path: LOCK.into(),
            source,
        })?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, _)) if Instant::now() < until => {
                file = f;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err((_, source)) => return Err(Error::Busy { source }),
        }
    }
}

/// Where the agent keeps which verbs device numbers it gave to which container, for as
/// long as the node runs (`/run` is a tmpfs).
const GRANTS: &str = "/run/iblab-node-runtime/grants.json";

/// The verbs device numbers the agent gave a container, and where that container is.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    pub pod: String,
    /// runc's state folder: the container exists while `<root>/<id>/state.json` does.
    pub root: String,
    /// Its pod's network namespace.
    pub netns: String,
    pub minors: Vec<u32>,
    /// When it was given (seconds since the epoch): runc writes the container's state
    /// only after the wrapper has run, so a grant younger than [`CREATE_DEADLINE`] twice
    /// is kept even without it.
    #[serde(default)]
    pub at: u64,
}

/// Every live grant, by container id; and a counter that names the holds.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Grants {
    pub containers: std::collections::BTreeMap<String, Grant>,
    pub next_hold: u32,
}

impl Grants {
    fn load() -> Grants {
        std::fs::read_to_string(GRANTS)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    fn save(&self) -> Result<(), Error> {
        let dir = Path::new(GRANTS).parent().unwrap_or(Path::new("/run"));
        std::fs::create_dir_all(dir).map_err(|source| Error::File {
            verb: "create",
            path: dir.to_path_buf(),
            source,
        })?;
        let tmp = dir.join("grants.json.tmp");
        std::fs::write(&tmp, serde_json::to_string(self).unwrap_or_default())
            .and_then(|()| std::fs::rename(&tmp, GRANTS))
            .map_err(|source| Error::File {
                verb: "write",
                path: GRANTS.into(),
                source,
            })
    }

    /// Forget the containers that are gone (runc deleted them, or their pod's network
    /// namespace went).
    fn prune(&mut self) {
        let now = epoch_secs();
        self.containers.retain(|id, g| {
            let young = now.saturating_sub(g.at) < 2 * CREATE_DEADLINE.as_secs();
            (young || Path::new(&g.root).join(id).join("state.json").exists())
                && Path::new(&g.netns).exists()
        });
    }

    /// The numbers given to containers other than `me`.
    fn given(&self, me: &str) -> Vec<(u32, &Grant)> {
        self.containers
            .iter()
            .filter(|(id, _)| id.as_str() != me)
            .flat_map(|(_, g)| g.minors.iter().map(move |m| (*m, g)))
            .collect()
    }
}

fn epoch_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Does the node have a verbs device with this number (minor) now?
fn minor_in_use(minor: u32) -> bool {
    verbs_devices().iter().any(|(_, m)| *m == minor)
}

/// The kernel hands verbs device numbers out lowest-free first, and a container keeps the
/// device file and cgroup rule of the number it was given: if its pod deletes its own
/// device (the link under it), the next device made on the node would get that number,
/// and the first container could open it. So before a pod's devices are made, every such
/// freed number of a container that still exists is held by a device of that container's
/// own pod (`iblab-hold-N`, an rxe on a veth pair that the agent makes in that pod's
/// namespace, and that goes with it): what the first container can open stays its own
/// pod's. Holds that land on a number nobody was given are deleted again.
fn hold_freed_numbers(grants: &mut Grants, me: &str) -> Result<Vec<String>, Error> {
    let mut freed: Vec<(u32, String)> = grants
        .given(me)
        .into_iter()
        .filter(|(m, _)| !minor_in_use(*m))
        .map(|(m, g)| (m, g.netns.clone()))
        .collect();
    freed.sort();
    let mut held = Vec::new();
    for (minor, netns) in freed {
        let ns = PodNetns {
            path: netns,
            until: Instant::now() + COMMAND_DEADLINE * 4,
        };
        let mut extra = Vec::new();
        for _ in 0..=shape::MAX_DEVICES {
            if minor_in_use(minor) {
                break;
            }
            let n = grants.next_hold;
            grants.next_hold = grants.next_hold.wrapping_add(1);
            let (veth, device) = (format!("ibh{}", n % 100_000), format!("iblab-hold-{n}"));
            let peer = format!("{veth}p");
            ns.run(
                &[
                    "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
                ],
                None,
            )?;
            ns.run(
                &[
                    "rdma", "link", "add", &device, "type", "rxe", "netdev", &veth,
                ],
                None,
            )?;
            let got = uverbs_of(&device)?;
            if got.minor == minor {
                held.push(format!(
                    "{device} holds {} (freed by its pod) in {}",
                    got.path, ns.path
                ));
            } else {
                extra.push(veth);
            }
        }
        for veth in extra {
            ns.run(&["ip", "link", "delete", &veth], None)?;
        }
    }
    Ok(held)
}

/// The measuring container's devices: its links and rxe made in its pod's namespace (all
/// or nothing), within the node's cap, on a node whose RDMA devices every namespace sees,
/// with no number another container of the node was given; the device files to give it.
fn make_devices(t: &Target, call: &RuncCall, policy: &Policy) -> Result<Vec<DeviceFile>, Error> {
    let ns = PodNetns {
        path: t.netns.clone(),
        until: Instant::now() + CREATE_DEADLINE,
    };
    if t.spec.rxe.is_empty() {
        make(&t.spec, &ns)?;
        return Ok(vec![]);
    }
    let mode = netns_mode()?;
    if mode != "shared" {
        return Err(Error::NetnsMode(mode));
    }
    let id = call.id.clone().unwrap_or_default();
    let root = call
        .root
        .as_ref()
        .map(|r| r.display().to_string())
        .unwrap_or_default();
    let _held = lock()?;
    let mut grants = Grants::load();
    grants.prune();
    let holds = hold_freed_numbers(&mut grants, &id);
    // What the holds made is kept whatever happens next (each protects another pod).
    grants.save()?;
    for h in holds? {
        note(&h);
    }
    let taken: Vec<u32> = grants.given(&id).into_iter().map(|(m, _)| m).collect();
    let have = devices_on_node();
    if have + t.spec.rxe.len() > policy.max_devices {
        return Err(Error::TooManyDevices {
            have,
            asked: t.spec.rxe.len(),
            max: policy.max_devices,
        });
    }
    let made = make(&t.spec, &ns)?;
    let files = (|| {
        let mut files = Vec::new();
        for r in &t.spec.rxe {
            let f = uverbs_of(&r.device)?;
            if taken.contains(&f.minor) {
                return Err(Error::NumberTaken {
                    device: r.device.clone(),
                    minor: f.minor,
                });
            }
            files.push(f);
        }
        let cm = std::fs::read_to_string(RDMA_CM_SYSFS).map_err(Error::NoRdmaCm)?;
        files.push(DeviceFile::from_dev(RDMA_CM, &cm).ok_or_else(|| Error::RdmaCm(cm.clone()))?);
        Ok::<_, Error>(files)
    })();
    let undone = |e: Error| e.undone(undo(&made, &ns));
    let files = files.map_err(undone)?;
    grants.containers.insert(
        id,
        Grant {
            pod: t.pod.clone(),
            root,
            netns: t.netns.clone(),
            minors: files
                .iter()
                .filter(|f| f.path != RDMA_CM)
                .map(|f| f.minor)
                .collect(),
            at: epoch_secs(),
        },
    );
    grants.save().map_err(undone)?;
    Ok(files)
}

/// The verbs file of the device named `ibdev`, once it is there.
fn uverbs_of(ibdev: &str) -> Result<DeviceFile, Error> {
    let deadline = Instant::now() + APPEAR_WITHIN;
    loop {
        for e in std::fs::read_dir(UVERBS_CLASS)
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = e.path();
            let named = std::fs::read_to_string(dir.join("ibdev")).unwrap_or_default();
            if named.trim() != ibdev {
                continue;
            }
            let dev = std::fs::read_to_string(dir.join("dev")).unwrap_or_default();
            let file = format!("/dev/infiniband/{}", e.file_name().to_string_lossy());
            if let Some(d) = DeviceFile::from_dev(&file, &dev) {
                return Ok(d);
            }
        }
        if Instant::now() > deadline {
            return Err(Error::NoVerbsFile {
                device: ibdev.to_string(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The node's verbs devices now: name (empty where it could not be read) and number
/// (minor).
fn verbs_devices() -> Vec<(String, u32)> {
    std::fs::read_dir(UVERBS_CLASS)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = std::fs::read_to_string(e.path().join("ibdev")).unwrap_or_default();
            let dev = std::fs::read_to_string(e.path().join("dev")).ok()?;
            let minor = DeviceFile::from_dev("", &dev)?.minor;
            Some((name.trim().to_string(), minor))
        })
        .collect()
}

/// When runc deletes a container the agent gave devices to: its devices (its own rxe, and
/// any hold of a number it freed, which is its pod's too) are deleted now, and its grant
/// forgotten. Left to its pod's network namespace, they would go whenever the kernel frees
/// that namespace, which on a slow node was seen to take longer than 20 s after the pod
/// was gone. Errors are told, never kept from runc: the namespace takes the devices anyway.
fn release_devices(call: &RuncCall) -> Result<Vec<String>, Error> {
    let (Some("delete"), Some(id)) = (call.subcommand.as_deref(), call.id.as_deref()) else {
        return Ok(vec![]);
    };
    let _held = lock()?;
    let mut grants = Grants::load();
    let Some(grant) = grants.containers.remove(id) else {
        return Ok(vec![]);
    };
    grants.save()?;
    let rdma = program("rdma")?.display().to_string();
    let mut gone = Vec::new();
    for (name, minor) in verbs_devices() {
        if grant.minors.contains(&minor) && !name.is_empty() {
            run(
                &[rdma.clone(), "link".into(), "delete".into(), name.clone()],
                None,
                COMMAND_DEADLINE,
            )?;
            gone.push(name);
        }
    }
    Ok(gone)
}

/// `iblab node-runtime --runc RUNC [--max-devices N] [--image IMAGE]… -- ARGS…`: what
/// containerd's runtime handler runs in place of runc. Prepares a lab pod's container if
/// this call creates one, releases its devices if it deletes one the agent gave devices
/// to, then becomes runc with the same arguments; exit 1 (with the reason in runc's log)
/// if it must not be created.
pub fn main(runc: &Path, policy: &Policy, args: &[String]) -> i32 {
    use std::os::unix::process::CommandExt;
    let call = RuncCall::parse(args);
    match release_devices(&call) {
        Ok(gone) if !gone.is_empty() => note(&format!(
            "container {}: deleted its devices {}",
            call.id.unwrap_or_default(),
            gone.join(", ")
        )),
        Ok(_) => {}
        Err(e) => note(&format!("releasing a deleted container's devices: {e}")),
    }
    match before_runc(args, policy) {
        Ok(Done::Untouched) => {}
        Ok(Done::Prepared { pod, role, devices }) => {
            if role == Role::Node {
                note(&format!(
                    "pod {pod}: made its links and rxe, gave {}",
                    devices
                        .iter()
                        .map(|d| format!("{} ({}:{})", d.path, d.major, d.minor))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
        Err(e) => {
            note(&format!("refused: {e}"));
            eprintln!(
                "iblab node runtime: {}",
                clean(&e.to_string(), crate::log::LINE_CAP)
            );
            return 1;
        }
    }
    let e = Command::new(runc).args(args).exec();
    eprintln!("iblab node runtime: cannot run {}: {e}", runc.display());
    127
}

/// The script containerd's runtime handler names as its runc (`BinaryName`): it runs
/// `iblab` from `dir` (as the node sees it) as the wrapper around `runc`, with the node's
/// policy.
pub fn handler_script(dir: &str, runc: &str, policy: &Policy) -> String {
    let mut flags = format!("--max-devices {}", policy.max_devices);
    for i in &policy.images {
        flags.push_str(&format!(" --image '{}'", i.replace('\'', "")));
    }
    format!(
        "#!/bin/sh\n# containerd's runtime handler for path ②'s lab pods (iblab's node agent): \
         runc, with each lab pod's containers checked and its links and rxe made first.\n\
         exec {dir}/iblab node-runtime --runc {runc} {flags} -- \"$@\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A pod's namespace as a list of interfaces and devices; `fail_at`: the command that
    /// fails (by its first words).
    struct Fake {
        ifaces: RefCell<Vec<(String, String)>>,
        /// Every device the node has, and its netdev.
        devices: RefCell<Vec<(String, String)>>,
        ran: RefCell<Vec<String>>,
        fail_at: Option<&'static str>,
    }

    impl Fake {
        fn new(fail_at: Option<&'static str>) -> Fake {
            Fake {
                ifaces: RefCell::new(vec![
                    ("lo".into(), "".into()),
                    ("eth0".into(), "veth".into()),
                ]),
                devices: RefCell::default(),
                ran: RefCell::default(),
                fail_at,
            }
        }
    }

    impl Netns for Fake {
        fn run(&self, argv: &[&str], _stdin: Option<&str>) -> Result<String, Error> {
            let line = argv.join(" ");
            self.ran.borrow_mut().push(line.clone());
            if self.fail_at.is_some_and(|f| line.starts_with(f)) {
                return Err(Error::Failed {
                    shown: line,
                    said: "RTNETLINK answers: File exists".into(),
                });
            }
            let mut ifaces = self.ifaces.borrow_mut();
            match argv {
                ["ip", "-j", ..] => Ok(serde_json::to_string(
                    &ifaces
                        .iter()
                        .map(
                            |(n, k)| serde_json::json!({"ifname": n, "linkinfo": {"info_kind": k}}),
                        )
                        .collect::<Vec<_>>(),
                )
                .unwrap()),
                ["ip", "link", "add", name, ..] => {
                    if ifaces.iter().any(|(n, _)| n == name) {
                        return Err(Error::Failed {
                            shown: line.clone(),
                            said: "File exists".into(),
                        });
                    }
                    ifaces.push((name.to_string(), "vxlan".into()));
                    Ok(String::new())
                }
                ["ip", "link", "delete", name] => {
                    ifaces.retain(|(n, _)| n != name);
                    Ok(String::new())
                }
                ["rdma", "link", "add", dev, "type", "rxe", "netdev", nd] => {
                    if self.devices.borrow().iter().any(|(d, _)| d == dev) {
                        return Err(Error::Failed {
                            shown: line.clone(),
                            said: "File exists".into(),
                        });
                    }
                    self.devices
                        .borrow_mut()
                        .push((dev.to_string(), nd.to_string()));
                    Ok(String::new())
                }
                ["rdma", "link", "show", dev] => {
                    let dev = dev.trim_end_matches("/1");
                    self.devices
                        .borrow()
                        .iter()
                        .find(|(d, _)| d == dev)
                        .map(|(d, nd)| format!("link {d}/1 state ACTIVE netdev {nd}\n"))
                        .ok_or_else(|| Error::Failed {
                            shown: line.clone(),
                            said: format!("Wrong device name - {dev}"),
                        })
                }
                ["rdma", "link", "delete", dev] => {
                    let mut d = self.devices.borrow_mut();
                    let had = d.len();
                    d.retain(|(x, _)| x != dev);
                    if d.len() == had {
                        Err(Error::Failed {
                            shown: line.clone(),
                            said: "Wrong device name".into(),
                        })
                    } else {
                        Ok(String::new())
                    }
                }
                ["sh", "-c", script] => {
                    // The rename script: `ip link set FROM name TO`.
                    let words: Vec<&str> = script
                        .lines()
                        .find(|l| l.contains(" name "))
                        .unwrap()
                        .split_whitespace()
                        .collect();
                    let (from, to) = (words[3], words[5]);
                    for i in ifaces.iter_mut() {
                        if i.0 == from {
                            i.0 = to.to_string();
                        }
                    }
                    Ok(String::new())
                }
                _ => Err(Error::Failed {
                    shown: line.clone(),
                    said: "unexpected".into(),
                }),
            }
        }
    }

    fn spec(renamed: bool) -> RoceSpec {
        let (link, rename) = if renamed {
            ("eth0", r#","rename_underlay_to":"podnet0""#)
        } else {
            ("eth1", "")
        };
        RoceSpec::parse(&format!(
            r#"{{"underlay":"eth0"{rename},"links":[{{"name":"{link}","mtu":1500,"vni":4000,"port":4789}},{{"name":"eth2","mtu":1500,"vni":4001,"port":4789}}],"rxe":[{{"device":"a-rxe0-r1","netdev":"{link}"}},{{"device":"a-rxe1-r1","netdev":"eth2"}}]}}"#
        ))
        .unwrap()
    }

    fn names(f: &Fake) -> Vec<String> {
        f.ifaces.borrow().iter().map(|(n, _)| n.clone()).collect()
    }

    #[test]
    fn a_create_that_fails_half_way_leaves_the_pod_as_it_was_and_a_retry_succeeds() {
        for renamed in [false, true] {
            let s = spec(renamed);
            let f = Fake::new(Some("rdma link add a-rxe1-r1"));
            let e = make(&s, &f).unwrap_err().to_string();
            assert!(e.contains("File exists") && e.contains("undone"), "{e}");
            assert_eq!(names(&f), ["lo", "eth0"], "renamed={renamed}");
            assert!(f.devices.borrow().is_empty());
            // The retry, with nothing in the way: everything made.
            let retry = Fake { fail_at: None, ..f };
            let made = make(&s, &retry).unwrap();
            assert_eq!(made.len(), 4 + usize::from(renamed), "{made:?}");
            let names: Vec<String> = retry.devices.borrow().iter().map(|d| d.0.clone()).collect();
            assert_eq!(names, ["a-rxe0-r1", "a-rxe1-r1"]);
        }
    }

    #[test]
    fn what_a_killed_attempt_left_is_cleared_before_a_retry() {
        let s = spec(true);
        let f = Fake::new(None);
        // An attempt killed after it renamed, made one link and one device.
        f.run(&["sh", "-c", &rename_script("eth0", "podnet0")], None)
            .unwrap();
        f.run(&["ip", "link", "add", "eth0", "type", "vxlan"], None)
            .unwrap();
        f.run(
            &[
                "rdma",
                "link",
                "add",
                "a-rxe0-r1",
                "type",
                "rxe",
                "netdev",
                "eth0",
            ],
            None,
        )
        .unwrap();
        // A device of the name the pod asks for that is on another pod's link: not this
        // pod's to delete (every namespace sees every device).
        f.run(
            &[
                "rdma",
                "link",
                "add",
                "a-rxe1-r1",
                "type",
                "rxe",
                "netdev",
                "?",
            ],
            None,
        )
        .unwrap();
        let e = make(&s, &f).unwrap_err().to_string();
        assert!(e.contains("File exists"), "{e}");
        assert!(
            f.devices
                .borrow()
                .contains(&("a-rxe1-r1".into(), "?".into()))
        );
        f.devices.borrow_mut().retain(|d| d.0 != "a-rxe1-r1");
        make(&s, &f).unwrap();
        assert_eq!(names(&f), ["lo", "podnet0", "eth0", "eth2"]);
        assert_eq!(f.devices.borrow().len(), 2);
    }

    /// A grant lives while its container (runc's state) and its pod's namespace do, and
    /// while it is young enough that runc may not have written the state yet.
    #[test]
    fn grants_outlive_only_what_still_holds_their_numbers() {
        let dir = std::env::temp_dir().join(format!("iblab-grants-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("live")).unwrap();
        std::fs::write(dir.join("live/state.json"), "{}").unwrap();
        let netns = dir.join("netns");
        std::fs::write(&netns, "").unwrap();
        let grant = |at: u64, netns: &std::path::Path| Grant {
            pod: "ns/a".into(),
            root: dir.display().to_string(),
            netns: netns.display().to_string(),
            minors: vec![193],
            at,
        };
        let old = epoch_secs() - 3600;
        let mut g = Grants::default();
        g.containers.insert("live".into(), grant(old, &netns));
        g.containers.insert("deleted".into(), grant(old, &netns));
        g.containers
            .insert("creating".into(), grant(epoch_secs(), &netns));
        g.containers
            .insert("pod-gone".into(), grant(epoch_secs(), &dir.join("nothing")));
        g.prune();
        let kept: Vec<&String> = g.containers.keys().collect();
        assert_eq!(kept, ["creating", "live"]);
        assert_eq!(
            g.given("live").iter().map(|(m, _)| *m).collect::<Vec<_>>(),
            [193]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_nodes_mode_and_handler_read_as_written() {
        assert_eq!(
            mode_of("netns exclusive copy-on-fork on\n").as_deref(),
            Some("exclusive")
        );
        assert_eq!(mode_of("netns shared").as_deref(), Some("shared"));
        assert_eq!(mode_of("nothing"), None);
        let script = handler_script(
            "/opt/iblab/node",
            "runc",
            &Policy {
                images: vec!["iblab/lab:0.1.0".into()],
                max_devices: 8,
            },
        );
        assert!(
            script.contains(
                "exec /opt/iblab/node/iblab node-runtime --runc runc --max-devices 8 \
                 --image 'iblab/lab:0.1.0' -- \"$@\""
            ),
            "{script}"
        );
    }

    #[test]
    fn a_command_past_its_deadline_is_killed() {
        let t = Instant::now();
        let e = run(
            &["sleep".into(), "30".into()],
            None,
            Duration::from_millis(200),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("did not finish within"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let e = run(
            &["sh".into(), "-c".into(), "echo no >&2; exit 3".into()],
            None,
            Duration::from_secs(5),
        )
        .unwrap_err()
        .to_string();
        assert!(e.ends_with("failed: no"), "{e}");
        assert_eq!(
            run(&["cat".into()], Some("hi"), Duration::from_secs(5)).unwrap(),
            "hi"
        );
    }
}
