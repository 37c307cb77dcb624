//! The vm backend: one qemu microVM per node (a Debian kernel with rdma_rxe, so each node
//! has its own kernel and its rxe lives in that kernel's initial namespace), wired by taps
//! to bridges in host network namespaces. Switches are bridges in their own namespaces, as
//! on the local backend. No address, route or NAT on the host side: nothing leaves.

pub mod attach;
pub mod channel;
pub mod cpio;
pub mod image;
pub mod kmod;
pub mod qemu;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::local::ip_batch;
use super::{Backend, EnvError, Kind, Swept, Traits};
use crate::agent::proto::{Body, Op};
use crate::caps::HostCaps;
use crate::fault::{Cmd, LossMechanism};
use crate::lab::PathKind;
use crate::plan::{Plan, PlannedNode};
use crate::preflight::{Check, Mark};
use crate::run::process::{self, Background, ExecOutput, RemoteProcess, Stopped};
use crate::run::state::{PREFIX, Resource, StateFile, start_ticks_of};
use channel::Agent;

/// How long the VMs get to boot and say hello.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Vm {
    run_id: String,
    agents: Mutex<HashMap<String, Arc<Agent>>>,
    /// The qemu processes (killed by teardown through the state file; reaped when dropped).
    vms: Mutex<Vec<Background>>,
    /// Facts about the VMs for the evidence: accelerator, image, boot times.
    facts: Mutex<serde_json::Map<String, serde_json::Value>>,
}

fn env(msg: impl Into<String>) -> EnvError {
    EnvError::new(msg.into())
}

impl Vm {
    pub fn new(run_id: &str) -> Vm {
        Vm {
            run_id: run_id.to_string(),
            agents: Mutex::new(HashMap::new()),
            vms: Mutex::new(Vec::new()),
            facts: Mutex::new(serde_json::Map::new()),
        }
    }

    /// The host namespace of a node (its taps and bridges) or of a switch.
    pub fn namespace(&self, name: &str) -> String {
        format!("{PREFIX}{}-{name}", self.run_id)
    }

    /// The run's temporary folder: initrd, agent sockets.
    fn work_dir(&self) -> PathBuf {
        std::env::temp_dir().join(format!("{PREFIX}{}-vm", self.run_id))
    }

    fn agent(&self, node: &str) -> Option<Arc<Agent>> {
        self.agents.lock().ok().and_then(|m| m.get(node).cloned())
    }

    fn note(&self, key: &str, value: serde_json::Value) {
        if let Ok(mut f) = self.facts.lock() {
            f.insert(key.to_string(), value);
        }
    }
}

/// The vm backend, as registered in [`super::KINDS`].
pub struct VmKind;
pub static KIND: VmKind = VmKind;

#[async_trait]
impl Kind for VmKind {
    fn name(&self) -> &'static str {
        "vm"
    }
    fn about(&self) -> &'static str {
        "one qemu microVM per node, a Debian kernel with rdma_rxe (needs root and qemu)"
    }
    fn traits(&self) -> Traits {
        Traits {
            auto: true,
            own_kernel: true,
            verbs_in_nodes: true,
            nic: "virtio-net",
            tcp_carrier: "the guest kernels' TCP stacks, virtio-net to taps on host bridges (emulated VMs, no NIC)",
        }
    }
    fn available(&self, caps: &HostCaps) -> Result<String, String> {
        match caps.has(qemu::QEMU) {
            true => Ok(String::new()),
            false => Err(format!(
                "the vm backend needs {}\n  fix: apt-get install qemu-system-x86",
                qemu::QEMU
            )),
        }
    }
    fn carries(&self, _path: PathKind, caps: &HostCaps) -> Result<(), String> {
        // Every path: tcp and roce in the guests; the emulated subnet runs in a host
        // namespace and its admitted bytes ride rxe in the VMs.
        match caps.has(qemu::QEMU) {
            true => Ok(()),
            false => Err(format!("{} is not installed", qemu::QEMU)),
        }
    }
    fn needs_root(&self) -> Option<&'static str> {
        Some("creates network namespaces and taps")
    }
    fn missing_programs(&self, _plan: &Plan, caps: &HostCaps) -> Vec<(String, &'static str)> {
        // Nodes run in guests; the host needs qemu and the packages the image copies from.
        let mut missing: Vec<(String, &'static str)> = image::missing_packages()
            .into_iter()
            .map(|p| (p.to_string(), p))
            .collect();
        if !caps.has(qemu::QEMU) {
            missing.push((qemu::QEMU.into(), "qemu-system-x86"));
        }
        missing
    }
    fn preflight(&self, _caps: &HostCaps) -> Vec<Check> {
        crate::preflight::softroce_in_vm()
    }
    fn doctor(&self, caps: &HostCaps) -> Vec<Check> {
        let mut rows = vec![crate::preflight::tool_check(caps, qemu::QEMU)];
        rows.extend(crate::preflight::softroce_in_vm());
        let missing = image::missing_packages();
        rows.push(Check {
            name: "image packages",
            mark: if missing.is_empty() {
                Mark::Ok
            } else {
                Mark::Fail
            },
            text: if missing.is_empty() {
                format!("installed: {}", image::PACKAGES.join(", "))
            } else {
                format!("missing → apt-get install {}", missing.join(" "))
            },
        });
        let cache = image::cache_dir();
        rows.push(match image::inputs() {
            Ok(i) => Check {
                name: "image",
                mark: Mark::Ok,
                text: match image::cached(&i) {
                    Some(img) => format!(
                        "cached: {} ({} {}) in {}",
                        img.key,
                        i.kernel_package,
                        i.kernel_version,
                        cache.display()
                    ),
                    None => format!(
                        "not built yet: the first vm run builds it from {} {} (a few seconds) into {}",
                        i.kernel_package,
                        i.kernel_version,
                        cache.display()
                    ),
                },
            },
            Err(e) => Check {
                name: "image",
                mark: Mark::Fail,
                text: e,
            },
        });
        rows.push(Check {
            name: "accelerator",
            mark: Mark::Ok,
            text: match qemu::known_accel() {
                Some(a) => format!("{} ({})", a.name, a.reason),
                None if Path::new("/dev/kvm").exists() => "/dev/kvm present; the first vm run boots the guest kernel under KVM to see whether it works (else TCG)".into(),
                None => "no /dev/kvm: TCG (software emulation)".into(),
            },
        });
        rows
    }
    fn iblab_path(&self) -> String {
        // The agent archive puts iblab itself at /init.
        "/init".into()
    }
    fn way_in(
        &self,
        run_id: &str,
        node: &str,
        argv: &[String],
        tty: bool,
    ) -> Result<Vec<String>, String> {
        let vm = Vm::new(run_id);
        let socket = vm.work_dir().join(format!("{node}.sock"));
        if socket.exists() {
            // A host: its guest agent, through `iblab attach` (a stream of lines, no pty: a
            // shell becomes a line shell that says so).
            let me = std::env::current_exe()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "iblab".into());
            let mut v = vec![me, "attach".into(), socket.to_string_lossy().into_owned()];
            if tty {
                v.extend([
                    "--lines".to_string(),
                    node.to_string(),
                    "--run".into(),
                    run_id.to_string(),
                ]);
            } else {
                v.push("--".into());
                v.extend(argv.iter().cloned());
            }
            return Ok(v);
        }
        // A switch: a bridge in a host namespace, entered as on the local backend.
        let ns = vm.namespace(node);
        if Path::new("/run/netns").join(&ns).exists() {
            let mut v = vec!["ip".to_string(), "netns".into(), "exec".into(), ns];
            v.extend(argv.iter().cloned());
            return Ok(v);
        }
        Err(format!(
            "{node} of run {run_id} has neither a VM nor a namespace on this host any more"
        ))
    }
    fn instantiate(&self, run_id: &str) -> Result<Box<dyn Backend>, EnvError> {
        Ok(Box::new(Vm::new(run_id)))
    }
    async fn sweep(&self, spare: &super::Spare<'_>) -> Swept {
        Swept {
            removed: remove_orphans(spare)
                .into_iter()
                .map(|p| format!("{p} (left by a vm run with no state file)"))
                .collect(),
            problems: vec![],
        }
    }
}

/// Leftovers of vm runs that have no state file any more (after a crash and a lost state
/// folder): their temporary folders, and a build lock nobody holds. Removes them and says
/// what it removed.
pub fn remove_orphans(spare: &super::Spare<'_>) -> Vec<String> {
    let mut removed = Vec::new();
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(run) = name
                .strip_prefix(PREFIX)
                .and_then(|r| r.strip_suffix("-vm"))
            else {
                continue;
            };
            if !spare(run) && std::fs::remove_dir_all(e.path()).is_ok() {
                removed.push(e.path().display().to_string());
            }
        }
    }
    let lock = image::cache_dir().join("build.lock");
    if let Ok(f) = std::fs::File::open(&lock)
        && let Ok(held) = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
    {
        // Nobody holds it: a crashed build left it.
        if std::fs::remove_file(&lock).is_ok() {
            removed.push(lock.display().to_string());
        }
        drop(held);
    }
    removed
}

fn mac(node_index: usize, iface_index: usize) -> String {
    format!(
        "52:54:00:1b:{:02x}:{:02x}",
        (node_index + 1) & 0xff,
        iface_index & 0xff
    )
}

/// Host-side names for a node interface: its tap, its bridge, and its veth end.
fn host_names(ifname: &str) -> (String, String, String) {
    (
        format!("tap-{ifname}"),
        format!("br-{ifname}"),
        format!("ln-{ifname}"),
    )
}

impl Vm {
    /// Namespaces, veth cables between them, bridges, taps. Nothing gets an address.
    async fn wire(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        let mut adds = Vec::new();
        for n in &plan.nodes {
            let ns = self.namespace(&n.name);
            state
                .record(Resource::Netns { name: ns.clone() })
                .map_err(|e| env(format!("cannot write the state file: {e}")))?;
            adds.push(format!("netns add {ns}"));
        }
        ip_batch(None, &adds).await?;
        let is_switch = |name: &str| plan.nodes.iter().any(|n| n.name == name && n.switch);
        // Each cable is a veth pair; a node's end is `ln-ethN`, a switch's end its port name.
        let mut veths = Vec::new();
        for (k, l) in plan.links.iter().enumerate() {
            let [(a, ia), (b, ib)] = &l.ends;
            let end = |node: &str, ifname: &str| {
                if is_switch(node) {
                    ifname.to_string()
                } else {
                    host_names(ifname).2
                }
            };
            veths.push(format!(
                "link add {} netns {} index {} mtu {m} type veth peer name {} netns {} index {} mtu {m}",
                end(a, ia),
                self.namespace(a),
                100 + 2 * k,
                end(b, ib),
                self.namespace(b),
                101 + 2 * k,
                m = l.mtu
            ));
        }
        ip_batch(None, &veths).await?;
        for n in &plan.nodes {
            // A switch is wired as on every namespace backend (spanning tree where its
            // segment has a loop).
            let mut lines = vec!["link set lo up".to_string()];
            if n.switch {
                lines = super::wiring::node_lines(n);
            } else {
                for i in &n.interfaces {
                    let (tap, br, ln) = host_names(&i.name);
                    lines.push(format!("tuntap add {tap} mode tap"));
                    lines.push(format!("link set {tap} mtu {}", i.mtu));
                    lines.push(format!("link add {br} type bridge"));
                    lines.push(format!("link set {tap} master {br}"));
                    lines.push(format!("link set {ln} master {br}"));
                    for d in [&br, &tap, &ln] {
                        lines.push(format!("link set {d} up"));
                    }
                }
            }
            ip_batch(Some(&self.namespace(&n.name)), &lines).await?;
        }
        Ok(())
    }

    async fn start_vm(
        &self,
        idx: usize,
        node: &PlannedNode,
        boot: &BootWith<'_>,
        state: &StateFile,
    ) -> Result<PathBuf, EnvError> {
        let BootWith {
            image: img,
            accel,
            initrd,
            run_dir: plan_run_dir,
        } = *boot;
        let work = self.work_dir();
        let socket = work.join(format!("{}.sock", node.name));
        let console = plan_run_dir.join(format!("logs/vm-{}.console.log", node.name));
        let nics = node
            .interfaces
            .iter()
            .enumerate()
            .map(|(k, i)| qemu::Nic {
                tap: host_names(&i.name).0,
                mac: mac(idx, k),
            })
            .collect();
        let spec = qemu::VmSpec {
            node: &node.name,
            accel,
            image: img,
            initrd,
            socket: &socket,
            console_log: &console,
            nics,
        };
        let mut argv = vec![
            "ip".to_string(),
            "netns".into(),
            "exec".into(),
            self.namespace(&node.name),
        ];
        argv.extend(qemu::argv(&spec));
        let log = plan_run_dir.join(format!("logs/vm-{}.qemu.log", node.name));
        let bg = Background::start(&argv, &log)
            .map_err(|e| env(format!("cannot start {}: {e}", qemu::QEMU)))?;
        if let Some(t) = start_ticks_of(bg.pid) {
            state
                .record(Resource::Process {
                    pid: bg.pid,
                    start_ticks: t,
                })
                .map_err(|e| env(format!("cannot write the state file: {e}")))?;
        }
        if let Ok(mut v) = self.vms.lock() {
            v.push(bg);
        }
        Ok(socket)
    }

    /// The node whose qemu has exited, if any (`hosts` in the order the VMs started).
    fn exited_vm(&self, hosts: &[(usize, &PlannedNode)]) -> Option<String> {
        let mut vms = self.vms.lock().ok()?;
        for (bg, (_, n)) in vms.iter_mut().zip(hosts) {
            if bg.exited().is_some() {
                return Some(n.name.clone());
            }
        }
        None
    }

    /// Give each guest NIC its planned name, MTU and address (found by MAC).
    async fn configure_guest(&self, idx: usize, node: &PlannedNode) -> Result<(), EnvError> {
        let agent = self
            .agent(&node.name)
            .ok_or_else(|| env(format!("no agent for {}", node.name)))?;
        let show = run_on(&agent, &["ip", "-j", "link", "show"], None, 10).await?;
        let links: Vec<serde_json::Value> = serde_json::from_str(&show.stdout)
            .map_err(|e| env(format!("{}: `ip -j link` gave no JSON: {e}", node.name)))?;
        let mut first = Vec::new();
        let mut second = Vec::new();
        for (k, i) in node.interfaces.iter().enumerate() {
            let want = mac(idx, k);
            let cur = links
                .iter()
                .find(|l| l["address"] == want.as_str())
                .and_then(|l| l["ifname"].as_str())
                .ok_or_else(|| env(format!("{}: no guest NIC with MAC {want}", node.name)))?;
            first.push(format!("link set dev {cur} name iblabtmp{k}"));
            second.push(format!("link set dev iblabtmp{k} name {}", i.name));
            second.push(format!("link set dev {} mtu {}", i.name, i.mtu));
            if let Some(a) = &i.address {
                second.push(format!("addr add {a} dev {}", i.name));
            }
            second.push(format!("link set dev {} up", i.name));
        }
        first.extend(second);
        let script = first.join("\n") + "\n";
        let out = run_on(&agent, &["ip", "-batch", "-"], Some(script), 10).await?;
        if !out.success() {
            return Err(env(format!(
                "{}: configuring the guest NICs failed: {}",
                node.name,
                out.stderr.trim()
            )));
        }
        Ok(())
    }

    /// Wait until every host-side port is up, so no bridge drops the first frames.
    async fn wait_host_ports(&self, plan: &Plan) -> Result<(), EnvError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut down = Vec::new();
            for n in &plan.nodes {
                let argv: Vec<String> =
                    ["ip", "-n", &self.namespace(&n.name), "-j", "link", "show"]
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                let out = process::run(&argv, None, Duration::from_secs(5))
                    .await
                    .map_err(|e| env(format!("cannot run ip: {e}")))?;
                let links: Vec<serde_json::Value> =
                    serde_json::from_str(&out.stdout).unwrap_or_default();
                let names: Vec<String> = if n.switch {
                    n.interfaces.iter().map(|i| i.name.clone()).collect()
                } else {
                    n.interfaces
                        .iter()
                        .flat_map(|i| {
                            let (t, _, l) = host_names(&i.name);
                            [t, l]
                        })
                        .collect()
                };
                for name in names {
                    let up = links
                        .iter()
                        .any(|l| l["ifname"] == name.as_str() && l["operstate"] == "UP");
                    if !up {
                        down.push(format!("{}:{name}", n.name));
                    }
                }
            }
            if down.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(env(format!(
                    "host-side ports did not come up within 10s: {}",
                    down.join(", ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What every VM of a run boots with.
#[derive(Clone, Copy)]
struct BootWith<'a> {
    image: &'a image::Image,
    accel: &'a str,
    initrd: &'a Path,
    run_dir: &'a Path,
}

/// Run a command through an agent (host-side wait: the deadline plus a grace period).
async fn run_on(
    agent: &Agent,
    argv: &[&str],
    stdin: Option<String>,
    secs: u64,
) -> Result<ExecOutput, EnvError> {
    let op = Op::Run {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin,
        timeout_ms: secs * 1000,
    };
    answer(agent.call(op, Duration::from_secs(secs + 10)).await, argv)
}

fn answer<S: AsRef<str>>(r: Result<Body, String>, argv: &[S]) -> Result<ExecOutput, EnvError> {
    let shown = argv
        .iter()
        .map(|s| s.as_ref())
        .collect::<Vec<_>>()
        .join(" ");
    match r {
        Ok(Body::Done {
            exit_code,
            stdout,
            stderr,
            duration_s,
            timed_out,
            counters,
        }) => Ok(ExecOutput {
            exit_code,
            stdout,
            stderr,
            duration: Duration::from_secs_f64(duration_s.max(0.0)),
            timed_out,
            counters,
        }),
        // The program could not be started (not in the image): a failed command, not a lost VM.
        Ok(Body::Error { message }) => Ok(ExecOutput {
            exit_code: Some(127),
            stdout: String::new(),
            stderr: message,
            duration: Duration::ZERO,
            timed_out: false,
            counters: None,
        }),
        Ok(other) => Err(env(format!("`{shown}`: unexpected answer {other:?}"))),
        Err(e) => Err(env(format!("`{shown}`: {e}"))),
    }
}

/// A background process inside a guest.
struct GuestProcess {
    agent: Arc<Agent>,
    handle: u64,
    log: PathBuf,
}

#[async_trait]
impl RemoteProcess for GuestProcess {
    async fn stop(self: Box<Self>, grace: Duration) -> Stopped {
        match self
            .agent
            .call(
                Op::Stop {
                    handle: self.handle,
                    grace_ms: grace.as_millis() as u64,
                },
                Duration::from_secs(15) + grace,
            )
            .await
        {
            Ok(Body::Stopped {
                exit_code,
                output,
                counters,
            }) => {
                let _ = std::fs::write(&self.log, output);
                Stopped {
                    exit_code,
                    counters,
                }
            }
            Ok(other) => {
                let _ = std::fs::write(&self.log, format!("{other:?}\n"));
                Stopped::default()
            }
            Err(e) => {
                let _ = std::fs::write(&self.log, format!("{e}\n"));
                Stopped::default()
            }
        }
    }

    fn abandon(&mut self) {
        let agent = self.agent.clone();
        let handle = self.handle;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = agent
                    .call(
                        Op::Stop {
                            handle,
                            grace_ms: 0,
                        },
                        Duration::from_secs(15),
                    )
                    .await;
            });
        }
    }
}

#[async_trait]
impl Backend for Vm {
    fn kind(&self) -> &'static dyn Kind {
        &KIND
    }

    async fn host_side_diagnostics(&self, plan: &Plan) -> String {
        let mut text = String::new();
        for n in &plan.nodes {
            let ns = self.namespace(&n.name);
            let argv: Vec<String> = ["ip", "-n", &ns, "-s", "link", "show"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            text.push_str(&process::transcript(
                &format!("host side of {}: {}", n.name, argv.join(" ")),
                process::run(&argv, None, Duration::from_secs(5)).await,
            ));
        }
        if let Ok(mut vms) = self.vms.lock() {
            for bg in vms.iter_mut() {
                if let Some(code) = bg.exited() {
                    text.push_str(&format!("qemu pid {} has exited ({code:?})\n", bg.pid));
                }
            }
        }
        text
    }

    fn keep(&self) {
        // A kept lab's VMs run on after this process: their handles must neither kill nor
        // reap them. The state file names each qemu, so `iblab down` stops it.
        if let Ok(mut vms) = self.vms.lock() {
            for bg in vms.drain(..) {
                bg.leave_running();
            }
        }
    }

    fn loss_mechanism(&self, node: &str, plan: LossMechanism) -> LossMechanism {
        // Guests run a Debian kernel, which has sch_netem; switches are host namespaces.
        if self.agent(node).is_some() {
            LossMechanism::Netem
        } else {
            plan
        }
    }

    fn report(&self) -> (Vec<String>, Vec<(String, f64)>) {
        let f = self.facts.lock().map(|f| f.clone()).unwrap_or_default();
        let mut notes = Vec::new();
        let mut timings = Vec::new();
        if let Some(a) = f.get("accel") {
            notes.push(format!(
                "vm backend: accelerator {} ({})",
                a["name"].as_str().unwrap_or("?"),
                a["reason"].as_str().unwrap_or("")
            ));
        }
        if let Some(i) = f.get("image") {
            notes.push(format!(
                "vm backend: guest kernel {} ({} {}), image {} {}",
                i["kernel_release"].as_str().unwrap_or("?"),
                i["kernel"].as_str().unwrap_or("?"),
                i["kernel_version"].as_str().unwrap_or("?"),
                i["key"].as_str().unwrap_or("?"),
                if i["cached"].as_bool().unwrap_or(false) {
                    "from the cache".to_string()
                } else {
                    format!("built in {:.1}s", i["build_s"].as_f64().unwrap_or(0.0))
                }
            ));
            timings.push((
                "vm_image_build_s".into(),
                i["build_s"].as_f64().unwrap_or(0.0),
            ));
        }
        if let Some(b) = f.get("boot").and_then(|b| b.as_object()) {
            for (node, v) in b {
                if let Some(s) = v["ready_s"].as_f64() {
                    timings.push((format!("vm_ready_{node}_s"), s));
                }
                if let Some(p) = v["problems"].as_array().filter(|p| !p.is_empty()) {
                    notes.push(format!("vm {node}: {p:?}"));
                }
            }
        }
        if let Some(t) = f.get("timings").and_then(|t| t.as_object()) {
            for (k, v) in t {
                if let Some(x) = v.as_f64() {
                    timings.push((format!("vm_{k}"), x));
                }
            }
        }
        (notes, timings)
    }

    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        let t0 = Instant::now();
        let img = image::ensure(state, &self.run_id)
            .await
            .map_err(EnvError::new)?;
        self.note(
            "image",
            serde_json::json!({
                "key": img.key,
                "cached": img.cached,
                "build_s": img.build_s,
                "kernel": img.inputs.kernel_package,
                "kernel_version": img.inputs.kernel_version,
                "kernel_release": img.kernel_release,
                "path": img.base.parent(),
            }),
        );
        let work = self.work_dir();
        state
            .record(Resource::Dir { path: work.clone() })
            .map_err(|e| env(format!("cannot write the state file: {e}")))?;
        std::fs::create_dir_all(&work)
            .map_err(|e| env(format!("cannot create {}: {e}", work.display())))?;
        let initrd = image::combined_initrd(&img, &work)
            .await
            .map_err(EnvError::new)?;
        crate::run::progress::detail("provisioning: booting one VM per node");
        let accel = qemu::choose_accel(&img, &work).await;
        self.note("accel", serde_json::json!(accel));
        let image_s = t0.elapsed().as_secs_f64();

        self.wire(plan, state).await?;
        let run_dir = state.snapshot().run_dir;
        let t_boot = Instant::now();
        let mut joins = tokio::task::JoinSet::new();
        let hosts: Vec<(usize, &PlannedNode)> = plan
            .nodes
            .iter()
            .filter(|n| !n.switch)
            .enumerate()
            .collect();
        for (idx, node) in &hosts {
            let socket = self
                .start_vm(
                    *idx,
                    node,
                    &BootWith {
                        image: &img,
                        accel: &accel.name,
                        initrd: &initrd,
                        run_dir: &run_dir,
                    },
                    state,
                )
                .await?;
            let name = node.name.clone();
            let deadline = Instant::now() + BOOT_TIMEOUT;
            joins.spawn(async move { (name, Agent::connect(&socket, deadline).await) });
        }
        let mut boots = serde_json::Map::new();
        loop {
            let j = tokio::select! {
                j = joins.join_next() => match j {
                    Some(j) => j,
                    None => break,
                },
                // A qemu that exits before its agent says hello would otherwise be
                // noticed only at the boot deadline.
                _ = tokio::time::sleep(Duration::from_millis(250)) => {
                    if let Some(node) = self.exited_vm(&hosts) {
                        Ok((node, Err("qemu exited before the guest agent started".to_string())))
                    } else {
                        continue;
                    }
                }
            };
            let (name, r) = j.map_err(|e| env(format!("agent task failed: {e}")))?;
            let (agent, hello) = r.map_err(|e| {
                let tail = |f: &str| {
                    let text = std::fs::read_to_string(run_dir.join("logs").join(f))
                        .unwrap_or_default()
                        .replace('\r', "");
                    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                    lines[lines.len().saturating_sub(3)..].join(" | ")
                };
                env(format!(
                    "VM {name}: {e} (accelerator {}, {} MiB; qemu said: `{}`; console ended: `{}`)",
                    accel.name,
                    qemu::memory_mb(),
                    tail(&format!("vm-{name}.qemu.log")),
                    tail(&format!("vm-{name}.console.log")),
                ))
            })?;
            if let Body::Hello {
                uptime_s,
                problems,
                modules_loaded,
                ..
            } = &hello
            {
                boots.insert(
                    name.clone(),
                    serde_json::json!({"ready_s": t_boot.elapsed().as_secs_f64(), "guest_uptime_s": uptime_s, "modules_loaded": modules_loaded, "problems": problems}),
                );
            }
            if let Ok(mut m) = self.agents.lock() {
                m.insert(name, Arc::new(agent));
            }
        }
        for (idx, node) in &hosts {
            self.configure_guest(*idx, node).await?;
        }
        self.wait_host_ports(plan).await?;
        // Spanning tree on looped segments settles in the switches' host namespaces.
        let looped: Vec<&PlannedNode> = plan.nodes.iter().filter(|n| n.stp).collect();
        super::wiring::wait_links_up(self, &looped).await?;
        self.note("boot", serde_json::Value::Object(boots));
        self.note(
            "timings",
            serde_json::json!({"image_and_accel_s": image_s, "boot_and_configure_s": t_boot.elapsed().as_secs_f64()}),
        );
        Ok(())
    }

    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        match self.agent(node) {
            Some(agent) => {
                let op = Op::Run {
                    argv: cmd.argv.clone(),
                    stdin: cmd.stdin.clone(),
                    timeout_ms: timeout.as_millis() as u64,
                };
                answer(
                    agent.call(op, timeout + Duration::from_secs(10)).await,
                    &cmd.argv,
                )
            }
            None => {
                // A switch: its bridge lives in a host namespace.
                super::local::exec_in_namespace(&self.namespace(node), node, cmd, timeout).await
            }
        }
    }

    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError> {
        match self.agent(node) {
            Some(agent) => {
                let r = agent
                    .call(
                        Op::Spawn {
                            argv: argv.to_vec(),
                        },
                        Duration::from_secs(15),
                    )
                    .await;
                match r {
                    Ok(Body::Spawned { handle }) => Ok(Background::remote(
                        handle as u32,
                        Box::new(GuestProcess {
                            agent,
                            handle,
                            log: log.to_path_buf(),
                        }),
                    )),
                    Ok(Body::Error { message }) => Err(env(format!("{node}: {message}"))),
                    Ok(other) => Err(env(format!("{node}: unexpected answer {other:?}"))),
                    Err(e) => Err(env(format!("{node}: {e}"))),
                }
            }
            None => {
                let mut full = vec![
                    "ip".to_string(),
                    "netns".into(),
                    "exec".into(),
                    self.namespace(node),
                ];
                full.extend(argv.iter().cloned());
                let bg = Background::start(&full, log).map_err(|e| {
                    env(format!("cannot start `{}` on {node}: {e}", argv.join(" ")))
                })?;
                if let Some(t) = start_ticks_of(bg.pid) {
                    state
                        .record(Resource::Process {
                            pid: bg.pid,
                            start_ticks: t,
                        })
                        .map_err(|e| env(format!("cannot write the state file: {e}")))?;
                }
                Ok(bg)
            }
        }
    }
}
