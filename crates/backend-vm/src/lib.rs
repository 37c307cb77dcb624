//! The vm backend: one qemu microVM for the whole lab, booted from a Debian kernel ≥ 7.1
//! (whose rxe has a socket per network namespace). Inside it every node and switch is a
//! network namespace, links are veth pairs and switches bridges, wired exactly as the local
//! backend wires them on a host; the guest agent runs each node's commands in its
//! namespace. The VM has no NIC: nothing of the lab can leave it.

pub mod agent;
// The guest image is a crate of its own, under this one.
pub use iblab_vm_image::{self as image, cpio, kmod};
pub mod attach;
pub mod boot;
pub mod channel;
mod checks;
pub mod qemu;
pub mod qmp;
pub mod snapshot;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use iblab_core::plan::backend::{Backend, Unfit};

use crate::agent::proto::{Body, Op};
use channel::{Agent, AgentError};
use iblab_backend::{
    BackendError, BackendOps, Deployment, EnvError, EnvKind, NoWayIn, Scope, Spare, Swept,
};
use iblab_core::caps::HostCaps;
use iblab_core::caps::preflight::{Check, Mark};
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::fault::LossMechanism;
use iblab_core::plan::Plan;
use iblab_core::plan::backend::Traits;
use iblab_core::programs::{Needs, Place, Provider};
use iblab_lab::PathKind;
use iblab_sys::pid::start_ticks_of;
use iblab_sys::process::{Background, RemoteProcess, Stopped};
use iblab_sys::state::{PREFIX, Resource, StateFile};

/// How long the VM gets to boot and say hello, over all its boots.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// A boot that has not reached the agent by then has hung (a warm boot takes ~9 s under
/// TCG on this project's machine, measured 2026-12-02): it is killed and tried again, verbosely (see
/// [`boot`]). `IBLAB_VM_HUNG_BOOT_S` shortens it for the test of that retry.
fn hung_boot() -> Duration {
    std::env::var("IBLAB_VM_HUNG_BOOT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(40))
}

pub struct Vm {
    run_id: String,
    /// The guest agent, once the VM has said hello.
    agent: Mutex<Option<Arc<Agent>>>,
    /// The qemu process (killed by teardown through the state file; reaped when dropped).
    vm: Mutex<Option<Background>>,
    /// Facts about the VMs for the evidence: accelerator, image, boot times.
    facts: Mutex<serde_json::Map<String, serde_json::Value>>,
}

fn env(msg: impl Into<String>) -> EnvError {
    EnvError::new(msg.into())
}

/// Why the lab's VM could not be booted, restored, saved or made this run's machine.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("{0}")]
    Agent(#[from] AgentError),
    #[error("{0}")]
    Qmp(#[from] qmp::QmpError),
    #[error("{0}")]
    Snapshot(#[from] snapshot::SnapshotError),
    /// qemu could not be started.
    #[error("{0}")]
    Start(#[from] EnvError),
    #[error("qemu exited before the guest agent answered")]
    QemuExited,
    #[error("cannot write the state file: {0}")]
    State(#[source] std::io::Error),
    #[error("cannot read a seed from /dev/urandom: {0}")]
    Seed(#[source] std::io::Error),
    #[error("the guest agent answered its refresh with {0:?}")]
    Refresh(Box<Body>),
}

impl BackendError for VmError {
    fn env_kind(&self) -> EnvKind {
        match self {
            VmError::Agent(e) => e.env_kind(),
            VmError::Qmp(qmp::QmpError::Unreachable(_) | qmp::QmpError::Timeout) => {
                EnvKind::Unreachable
            }
            VmError::Start(e) => e.kind(),
            VmError::QemuExited => EnvKind::NodeGone,
            VmError::State(_) => EnvKind::State,
            _ => EnvKind::Other,
        }
    }
}

/// `PREFIX: e` as an environment error of e's kind, with e as its cause.
fn env_of(prefix: impl std::fmt::Display, e: impl BackendError) -> EnvError {
    EnvError::of(e.env_kind(), format!("{prefix}: {e}")).because(e)
}

impl Vm {
    pub fn new(run_id: &str) -> Vm {
        Vm {
            run_id: run_id.to_string(),
            agent: Mutex::new(None),
            vm: Mutex::new(None),
            facts: Mutex::new(serde_json::Map::new()),
        }
    }

    /// The run's temporary folder: initrd, agent sockets.
    fn work_dir(&self) -> PathBuf {
        std::env::temp_dir().join(format!("{PREFIX}{}-vm", self.run_id))
    }

    fn agent(&self) -> Result<Arc<Agent>, EnvError> {
        self.agent
            .lock()
            .ok()
            .and_then(|a| a.clone())
            .ok_or_else(|| env("the lab's VM is not up"))
    }

    fn note(&self, key: &str, value: serde_json::Value) {
        if let Ok(mut f) = self.facts.lock() {
            f.insert(key.to_string(), value);
        }
    }
}

/// The vm backend, as registered in the binary's list of backends.
pub struct VmBackend;
pub static BACKEND: VmBackend = VmBackend;

impl Backend for VmBackend {
    fn name(&self) -> &'static str {
        "vm"
    }
    fn about(&self) -> &'static str {
        "one qemu microVM for the lab, nodes as network namespaces in a Debian kernel ≥ 7.1 with rdma_rxe (needs root and qemu)"
    }
    fn traits(&self) -> Traits {
        Traits {
            auto: true,
            own_kernel: true,
            verbs_in_nodes: true,
            nic: "veth",
            tcp_carrier: "the guest kernel's TCP stack on veth links between network namespaces inside one emulated VM (no NIC)",
            traffic_slack_s: 0,
        }
    }
    fn available(&self, caps: &HostCaps) -> Result<String, Unfit> {
        match caps.has(qemu::QEMU) {
            true => Ok(String::new()),
            false => Err(format!(
                "the vm backend needs {}\n  fix: apt-get install qemu-system-x86",
                qemu::QEMU
            )
            .into()),
        }
    }
    fn carries(&self, _path: PathKind, caps: &HostCaps) -> Result<(), Unfit> {
        // Every path: tcp and roce in the guest; the emulated subnet runs in a host
        // namespace and its admitted bytes ride rxe in the VM.
        match caps.has(qemu::QEMU) {
            true => Ok(()),
            false => Err(format!("{} is not installed", qemu::QEMU).into()),
        }
    }
    fn needs_root(&self) -> Option<&'static str> {
        Some("starts qemu and the emulated subnet's host namespace")
    }
    fn installable(&self) -> &'static [&'static str] {
        &[qemu::QEMU]
    }
    fn programs(&self, plan: &Plan, needs: &mut Needs) {
        iblab_wiring::programs(plan, needs, "the vm backend");
        // Nodes run in the guest, from its image; the host runs qemu.
        needs.add(Place::Host, qemu::QEMU, "the vm backend");
    }
    fn provider(&self, place: Place) -> Provider {
        match place {
            Place::Nodes => Provider::Image {
                what: "the vm backend's guest image",
                has: image::carries,
            },
            // The emulated subnet runs in a namespace of this host.
            Place::Host | Place::Subnet => Provider::Host,
        }
    }
    fn iblab_path(&self) -> String {
        // The agent archive puts iblab itself at /init.
        "/init".into()
    }
    fn rdma_device(&self, _run: Option<&str>, node: &str, index: usize) -> String {
        // The guest is the run's own: no other run's devices share its kernel.
        // Every node shares the guest kernel, and with it one set of RDMA device names.
        format!("{node}-rxe{index}")
    }
}

#[async_trait]
impl BackendOps for VmBackend {
    fn missing_packages(&self) -> Vec<&'static str> {
        // The packages the guest image copies its programs from.
        image::missing_packages()
    }
    fn preflight(&self, _caps: &HostCaps) -> Vec<Check> {
        checks::softroce_in_vm()
    }
    fn doctor(&self, caps: &HostCaps) -> Vec<Check> {
        let mut rows = vec![iblab_core::caps::preflight::tool_check(caps, qemu::QEMU)];
        rows.extend(checks::softroce_in_vm());
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
                        "cached: {} ({} {} from Debian {}) in {}",
                        img.key,
                        i.kernel_package,
                        i.kernel_version,
                        i.kernel_suite,
                        cache.display()
                    ),
                    None => format!(
                        "not built yet: the first vm run downloads {} {} from Debian {} and builds it (~10 s) into {}",
                        i.kernel_parts.join(" + "),
                        i.kernel_version,
                        i.kernel_suite,
                        cache.display()
                    ),
                },
            },
            Err(e) => Check {
                name: "image",
                mark: Mark::Fail,
                text: e.to_string(),
            },
        });
        rows.push(Check {
            name: "snapshot",
            mark: Mark::Ok,
            text: snapshot::summary(),
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
    fn way_in(
        &self,
        run_id: &str,
        node: &str,
        argv: &[String],
        tty: bool,
    ) -> Result<Vec<String>, NoWayIn> {
        let vm = Vm::new(run_id);
        let socket = vm.work_dir().join("agent.sock");
        if socket.exists() {
            // Every node and switch is a namespace in the lab's one VM: the guest agent,
            // through `iblab attach` (a stream of lines, no pty: a shell becomes a line
            // shell that says so), runs the command in the node's namespace.
            let me = std::env::current_exe()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "iblab".into());
            let mut v = vec![
                me,
                "attach".into(),
                socket.to_string_lossy().into_owned(),
                "--netns".into(),
                node.to_string(),
            ];
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
        Err(NoWayIn::Gone(format!(
            "run {run_id} has no VM on this host any more (its agent socket is gone)"
        )))
    }
    fn instantiate(&self, run_id: &str) -> Result<Box<dyn Deployment>, EnvError> {
        Ok(Box::new(Vm::new(run_id)))
    }
    async fn sweep(&self, scope: &Scope<'_>) -> Swept {
        Swept {
            removed: remove_orphans(scope.spare)
                .into_iter()
                .map(|p| format!("{p} (left by a vm run with no state file)"))
                .collect(),
            ..Swept::default()
        }
    }
}

/// Leftovers of vm runs that have no state file any more (after a crash and a lost state
/// folder): their temporary folders, and a build lock nobody holds. Removes them and says
/// what it removed.
pub fn remove_orphans(spare: &Spare<'_>) -> Vec<String> {
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
    removed.extend(snapshot::remove_partials());
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

/// What the lab's VM is started from: the lab, the image, the accelerator, the run's
/// initramfs (the image's and the agent's) and the guest's memory.
struct Machine<'a> {
    plan: &'a Plan,
    img: &'a image::Image,
    accel: &'a str,
    initrd: &'a Path,
    memory_mb: u32,
}

impl<'a> Machine<'a> {
    /// qemu's description of this VM with the given sockets, console and way of starting.
    fn spec(
        &self,
        socket: &'a Path,
        console_log: &'a Path,
        qmp: &'a Path,
        incoming: bool,
        attempt: usize,
    ) -> qemu::VmSpec<'a> {
        qemu::VmSpec {
            name: &self.plan.lab,
            accel: self.accel,
            image: self.img,
            initrd: self.initrd,
            socket,
            console_log,
            memory_mb: self.memory_mb,
            qmp,
            incoming,
            attempt,
        }
    }
}

impl Vm {
    /// Start the lab's VM; its agent socket.
    async fn start_vm(
        &self,
        m: &Machine<'_>,
        state: &StateFile,
        attempt: usize,
        incoming: Option<std::fs::File>,
    ) -> Result<PathBuf, EnvError> {
        let run_dir = state.snapshot().run_dir;
        let socket = self.work_dir().join("agent.sock");
        let qmp = self.work_dir().join("qmp.sock");
        // A socket left by an earlier qemu of this run (a failed restore or boot).
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&qmp);
        let console = run_dir.join("logs/vm.console.log");
        let argv = qemu::argv(&m.spec(&socket, &console, &qmp, incoming.is_some(), attempt));
        let log = run_dir.join("logs/vm.qemu.log");
        let bg = Background::start_with(&argv, &log, &[], incoming, None)
            .map_err(|e| EnvError::not_started(format!("cannot start {}: {e}", qemu::QEMU), e))?;
        if let Some(t) = start_ticks_of(bg.pid) {
            state
                .record(Resource::Process {
                    pid: bg.pid,
                    start_ticks: t,
                })
                .map_err(EnvError::state)?;
        }
        if let Ok(mut v) = self.vm.lock() {
            *v = Some(bg);
        }
        Ok(socket)
    }

    /// The guest agent's hello by `until`; a qemu that exits before it is noticed at once
    /// rather than at the deadline.
    async fn await_agent(&self, socket: &Path, until: Instant) -> Result<(Agent, Body), VmError> {
        self.unless_qemu_exits(Agent::connect(socket, until)).await
    }

    /// `work`, unless qemu exits first (noticed at once rather than at work's deadline).
    async fn unless_qemu_exits<T, E: Into<VmError>>(
        &self,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, VmError> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                r = &mut work => return r.map_err(Into::into),
                _ = tokio::time::sleep(Duration::from_millis(250)) => {
                    if self.vm_exited().is_some() {
                        return Err(VmError::QemuExited);
                    }
                }
            }
        }
    }

    /// Start the lab's VM from the booted-guest snapshot `file`: the agent, once the
    /// restored guest has answered its refresh, and the seconds that took.
    async fn restore(
        &self,
        m: &Machine<'_>,
        state: &StateFile,
        file: std::fs::File,
    ) -> Result<(Agent, Body, f64), VmError> {
        let t = Instant::now();
        let socket = self.start_vm(m, state, 1, Some(file)).await?;
        let until = Instant::now() + RESTORE_TIMEOUT;
        let qmp = self.work_dir().join("qmp.sock");
        self.unless_qemu_exits(async {
            qmp::Qmp::connect(&qmp, until)
                .await?
                .resume_after_incoming(until)
                .await
        })
        .await?;
        let agent = self
            .unless_qemu_exits(Agent::attach(&socket, until))
            .await?;
        let refreshed = self
            .unless_qemu_exits(refresh(&agent, &self.run_id, &m.plan.lab, RESTORE_TIMEOUT))
            .await?;
        Ok((agent, refreshed, t.elapsed().as_secs_f64()))
    }

    /// Kill the lab's qemu (a failed boot or restore) and keep its logs under `tag`.
    async fn discard_vm(&self, logs: &Path, tag: &str) -> String {
        let bg = self.vm.lock().ok().and_then(|mut v| v.take());
        if let Some(bg) = bg {
            let _ = bg.stop().await;
        }
        let kept = format!("vm.console.{tag}.log");
        let _ = std::fs::rename(logs.join("vm.console.log"), logs.join(&kept));
        let _ = std::fs::rename(
            logs.join("vm.qemu.log"),
            logs.join(format!("vm.qemu.{tag}.log")),
        );
        kept
    }

    /// Save the booted guest as the snapshot (it runs on as this run's VM).
    async fn save(
        &self,
        snap: &snapshot::Snapshot,
        state: &StateFile,
        meta: snapshot::Meta,
    ) -> Result<snapshot::Meta, VmError> {
        let partial = snap.partial();
        state
            .record(Resource::File {
                path: partial.clone(),
            })
            .map_err(VmError::State)?;
        let qmp = self.work_dir().join("qmp.sock");
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut q = qmp::Qmp::connect(&qmp, deadline).await?;
        let uri = format!("exec:cat > {}", shell_quote(&partial));
        let r = match q.save_and_continue(&uri, deadline).await {
            Ok(save_s) => snap
                .commit(&partial, snapshot::Meta { save_s, ..meta })
                .map_err(VmError::from),
            Err(e) => Err(e.into()),
        };
        if r.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        r
    }

    /// Whether qemu has exited (with its status).
    fn vm_exited(&self) -> Option<Option<i32>> {
        self.vm.lock().ok()?.as_mut()?.exited()
    }

    /// Boot the lab's VM (again after a hung or crashed boot, up to [`boot::ATTEMPTS`]):
    /// its agent, the agent's hello, and which boot reached it.
    async fn boot(
        &self,
        m: &Machine<'_>,
        state: &StateFile,
    ) -> Result<(Agent, Body, usize), EnvError> {
        let run_dir = state.snapshot().run_dir;
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let hung_after = hung_boot();
        let logs = run_dir.join("logs");
        let mut failed: Vec<String> = Vec::new();
        let mut attempt = 1;
        let r = loop {
            let socket = self.start_vm(m, state, attempt, None).await?;
            // Only the first boot is cut short by the hung-boot wait; a later one has until
            // the deadline, so a busy machine's slow boot is not taken for a hang.
            let last = attempt == boot::ATTEMPTS;
            let until = if attempt == 1 {
                Instant::now() + hung_after
            } else {
                deadline.max(Instant::now() + hung_after)
            };
            let r = self.await_agent(&socket, until).await;
            let Err(e) = &r else { break r };
            if last || Instant::now() >= deadline {
                break r;
            }
            let console = std::fs::read_to_string(logs.join("vm.console.log")).unwrap_or_default();
            let why = match boot::failure(self.vm_exited().is_none(), &console) {
                boot::Failure::Hung => format!(
                    "did not reach the guest agent within {} s ({e}); it was killed",
                    hung_after.as_secs()
                ),
                boot::Failure::Crashed(words) => format!("crashed: its kernel said `{words}`"),
                boot::Failure::Qemu => break r,
            };
            let kept = self.discard_vm(&logs, &format!("boot-{attempt}")).await;
            failed.push(format!(
                "boot {attempt} of the VM {why}, and the VM was booted once more with \
                 loglevel=7 (logs/{kept} is that boot's console)"
            ));
            self.note("failed_boots", serde_json::json!(failed));
            tracing::warn!("boot {attempt} of the VM failed; booting it once more");
            attempt += 1;
        };
        let (agent, hello) = r.map_err(|e| {
            let tail = |f: &str| {
                let text = std::fs::read_to_string(run_dir.join("logs").join(f))
                    .unwrap_or_default()
                    .replace('\r', "");
                let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                lines[lines.len().saturating_sub(3)..].join(" | ")
            };
            let said = format!(
                "the lab's VM: {e} (accelerator {}, {} MiB; qemu said: `{}`; console ended: `{}`)",
                m.accel,
                m.memory_mb,
                tail("vm.qemu.log"),
                tail("vm.console.log"),
            );
            EnvError::of(e.env_kind(), said).because(e)
        })?;
        Ok((agent, hello, attempt))
    }

    /// Save this run's freshly booted guest as the snapshot, unless another run is making
    /// it now; what happened, for the evidence.
    async fn make_snapshot(
        &self,
        snap: &snapshot::Snapshot,
        state: &StateFile,
        hello: &Body,
        accel: &str,
        memory: u32,
        boot_s: f64,
    ) -> String {
        let Some(_lock) = snap.try_lock() else {
            return "the VM was booted: another run is saving the booted-guest snapshot now".into();
        };
        let (kernel, modules_loaded, modules_s, problems) = match hello {
            Body::Hello {
                kernel,
                modules_loaded,
                modules_s,
                problems,
                ..
            } => (
                kernel.clone(),
                *modules_loaded,
                *modules_s,
                problems.clone(),
            ),
            _ => Default::default(),
        };
        let meta = snapshot::Meta {
            key: snap.key.clone(),
            bytes: 0,
            boot_s,
            save_s: 0.0,
            accel: accel.to_string(),
            memory_mb: memory,
            vcpus: qemu::vcpus(accel),
            kernel,
            modules_loaded,
            modules_s,
            problems,
        };
        iblab_sys::progress::detail("provisioning: saving the booted guest for later runs");
        match self.save(snap, state, meta).await {
            Ok(m) => format!(
                "the VM was booted ({boot_s:.1} s; the first run of this image, agent and qemu) and saved as the booted-guest snapshot {} ({} MB, the guest stopped {:.1} s): later runs restore it instead of booting",
                snap.key,
                m.bytes >> 20,
                m.save_s
            ),
            Err(e) => format!(
                "the VM was booted; saving it as the booted-guest snapshot failed ({e}), so the next run boots too"
            ),
        }
    }

    /// Inside the guest: a namespace per node and switch, veth cables made directly inside
    /// them, then loopback, bridges, ports and addresses: the local backend's wiring.
    async fn wire(&self, plan: &Plan) -> Result<(), EnvError> {
        let agent = self.agent()?;
        let mut lines: Vec<String> = plan
            .nodes
            .iter()
            .map(|n| format!("netns add {}", n.name))
            .collect();
        lines.extend(iblab_wiring::veth_lines(plan, |n| n.to_string()));
        guest_batch(&agent, None, &lines).await?;
        let each = plan.nodes.iter().map(|n| {
            let agent = agent.clone();
            async move { guest_batch(&agent, Some(&n.name), &iblab_wiring::node_lines(n)).await }
        });
        for r in futures_util::future::join_all(each).await {
            r?;
        }
        Ok(())
    }
}

/// How long a restored guest gets to answer.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);

/// What `provision` restores from a booted-guest snapshot: the agent, the guest's refresh,
/// the snapshot's record, and the seconds the restore took.
type Restored = (Agent, Body, snapshot::Meta, f64);

impl Vm {
    /// The guest image (built or cached), this run's work folder, the initramfs with
    /// iblab in it, and the accelerator qemu will use.
    async fn prepare(
        &self,
        state: &StateFile,
    ) -> Result<(image::Image, PathBuf, qemu::Accel), EnvError> {
        let img = image::ensure(state, &self.run_id).await?;
        self.note(
            "image",
            serde_json::json!({
                "key": img.key,
                "cached": img.cached,
                "build_s": img.build_s,
                "kernel_suite": img.inputs.kernel_suite,
                "kernel": img.inputs.kernel_package,
                "kernel_version": img.inputs.kernel_version,
                "kernel_release": img.kernel_release,
                "path": img.base.parent(),
            }),
        );
        let work = self.work_dir();
        state
            .record(Resource::Dir { path: work.clone() })
            .map_err(EnvError::state)?;
        std::fs::create_dir_all(&work)
            .map_err(|e| EnvError::caused(format!("cannot create {}: {e}", work.display()), e))?;
        let initrd = image::combined_initrd(&img, &work).await?;
        iblab_sys::progress::detail("provisioning: booting one VM per node");
        let accel = qemu::choose_accel(&img, &work).await;
        self.note("accel", serde_json::json!(accel));
        self.note("vcpus", serde_json::json!(qemu::vcpus(&accel.name)));
        Ok((img, initrd, accel))
    }

    /// The lab's VM up, its agent answering and the guest made this run's machine:
    /// restored from the booted-guest snapshot of its shape where one is usable and worth
    /// it, else booted (and a snapshot saved when snapshots are on and none was usable).
    /// The agent and the guest's hello.
    async fn bring_up(
        &self,
        machine: &Machine<'_>,
        state: &StateFile,
        logs: &Path,
    ) -> Result<(Agent, Body), EnvError> {
        let snap = snapshot_of(machine);
        let snapshots = snapshot::enabled() && qemu::ordinary_boot(1);
        let mut snap_notes: Vec<String> = Vec::new();
        let (restored, make_snapshot) = if snapshots {
            self.try_restore(machine, state, logs, &snap, &mut snap_notes)
                .await
        } else {
            (None, false)
        };
        let (agent, hello, refreshed) = match restored {
            Some((agent, refreshed, meta, secs)) => {
                snap_notes.push(format!(
                    "the VM was restored in {secs:.2} s from the booted-guest snapshot {} ({} MB, saved after a {:.1} s boot) instead of booted",
                    snap.key,
                    meta.bytes >> 20,
                    meta.boot_s
                ));
                let hello = Body::Hello {
                    uptime_s: 0.0,
                    kernel: meta.kernel,
                    modules_loaded: meta.modules_loaded,
                    modules_s: meta.modules_s,
                    problems: meta.problems,
                };
                (agent, hello, Some(refreshed))
            }
            None => {
                let t = Instant::now();
                let (agent, hello, attempt) = self.boot(machine, state).await?;
                if make_snapshot && attempt == 1 {
                    let boot_s = t.elapsed().as_secs_f64();
                    let (accel, memory) = (machine.accel, machine.memory_mb);
                    snap_notes.push(
                        self.make_snapshot(&snap, state, &hello, accel, memory, boot_s)
                            .await,
                    );
                }
                (agent, hello, None)
            }
        };
        let refreshed = match refreshed {
            Some(r) => r,
            None => refresh(
                &agent,
                &self.run_id,
                &machine.plan.lab,
                Duration::from_secs(30),
            )
            .await
            .map_err(|e| env_of("the lab's VM", e))?,
        };
        if let Body::Refreshed {
            clock_was_off_s,
            reseeded,
            problems,
            ..
        } = &refreshed
        {
            self.note(
                "refresh",
                serde_json::json!({"clock_was_off_s": clock_was_off_s, "reseeded": reseeded, "problems": problems}),
            );
        }
        self.note("snapshot", serde_json::json!(snap_notes));
        Ok((agent, hello))
    }

    /// The VM restored from `snap` if it is usable and worth restoring; otherwise `None`,
    /// and whether the boot that follows should save a snapshot (none was usable, or the
    /// one there failed to restore and was removed). What happened goes into `notes`.
    async fn try_restore(
        &self,
        machine: &Machine<'_>,
        state: &StateFile,
        logs: &Path,
        snap: &snapshot::Snapshot,
        notes: &mut Vec<String>,
    ) -> (Option<Restored>, bool) {
        let (file, meta) = match snap.usable() {
            Ok(usable) => usable,
            Err(snapshot::Unusable::Missing) => return (None, true),
            Err(snapshot::Unusable::Damaged(why)) => {
                snap.discard();
                notes.push(format!(
                    "the booted-guest snapshot {} was damaged ({why}): it was removed, and the VM was booted instead",
                    snap.key
                ));
                return (None, true);
            }
        };
        if let Err(why) = snap.worth_restoring(&meta) {
            notes.push(format!(
                "the VM was booted rather than restored from snapshot {}: {why}",
                snap.key
            ));
            return (None, false);
        }
        match self.restore(machine, state, file).await {
            Ok((agent, refreshed, secs)) => {
                snap.record_restore(secs);
                (Some((agent, refreshed, meta, secs)), false)
            }
            Err(e) => {
                let kept = self.discard_vm(logs, "restore").await;
                snap.discard();
                notes.push(format!(
                    "the booted-guest snapshot {} could not be restored ({e}; logs/{kept} is its console): it was removed, and the VM was booted instead",
                    snap.key
                ));
                (None, true)
            }
        }
    }

    /// The guest's boot, for the evidence; the guest's uptime at its hello.
    fn note_boot(&self, hello: &Body, ready_s: f64) -> f64 {
        let Body::Hello {
            uptime_s,
            problems,
            modules_loaded,
            modules_s,
            kernel,
        } = hello
        else {
            return 0.0;
        };
        self.note(
            "boot",
            serde_json::json!({"ready_s": ready_s, "guest_uptime_s": uptime_s, "modules_loaded": modules_loaded, "modules_s": modules_s, "kernel": kernel, "problems": problems}),
        );
        *uptime_s
    }

    /// The looped switches' bridges as the guest sees them (spanning tree state), for the
    /// evidence (logs/vm-bridges.log): nothing of the wiring is visible from the host.
    async fn show_bridges(&self, plan: &Plan, run_dir: &Path) {
        let mut shown = String::new();
        for n in plan.nodes.iter().filter(|n| n.stp) {
            let cmd = Cmd {
                argv: ["ip", "-d", "-j", "link", "show", "br0"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                stdin: None,
                may_fail: true,
            };
            if let Ok(o) = self.exec(&n.name, &cmd, Duration::from_secs(10)).await {
                shown.push_str(&format!("{}: {}\n", n.name, o.stdout.trim()));
            }
        }
        if !shown.is_empty() {
            let _ = std::fs::write(run_dir.join("logs/vm-bridges.log"), shown);
        }
    }
}

/// The booted-guest snapshot of this VM's shape (see [`snapshot`]): its argument vector
/// without the run's own paths and name.
fn snapshot_of(m: &Machine<'_>) -> snapshot::Snapshot {
    let mut shape = qemu::argv(&m.spec(
        Path::new("/agent.sock"),
        Path::new("/console.log"),
        Path::new("/qmp.sock"),
        false,
        1,
    ));
    if let Some(i) = shape.iter().position(|a| a == "-name") {
        shape.drain(i..i + 2);
    }
    snapshot::Snapshot::of(&shape, &m.img.kernel, m.initrd)
}

/// `'…'` for `sh -c` (qemu runs an `exec:` migration through the shell).
fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', "'\\''"))
}

/// Make the guest this run's machine (see [`Op::Refresh`]): its answer.
async fn refresh(agent: &Agent, run: &str, lab: &str, wait: Duration) -> Result<Body, VmError> {
    use std::io::Read;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(VmError::Seed)?;
    let hostname: String = lab
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let op = Op::Refresh {
        run: run.to_string(),
        hostname,
        unix_s: now.as_secs() as i64,
        unix_ns: now.subsec_nanos(),
        seed: seed.iter().map(|b| format!("{b:02x}")).collect(),
    };
    match agent.call(op, wait).await? {
        b @ Body::Refreshed { .. } => Ok(b),
        other => Err(VmError::Refresh(Box::new(other))),
    }
}

/// `ip -batch -` inside the guest (in a node's namespace when given).
async fn guest_batch(agent: &Agent, netns: Option<&str>, lines: &[String]) -> Result<(), EnvError> {
    if lines.is_empty() {
        return Ok(());
    }
    let script = lines.join("\n") + "\n";
    let argv = ["ip", "-batch", "-"];
    let op = Op::Run {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin: Some(script),
        timeout_ms: 30_000,
        netns: netns.map(str::to_string),
    };
    let out = answer(agent.call(op, Duration::from_secs(40)).await, &argv)?;
    if !out.success() {
        return Err(env(format!(
            "provisioning in the VM failed{}: `ip -batch` said: {}",
            netns.map(|n| format!(" ({n})")).unwrap_or_default(),
            out.stderr.trim()
        )));
    }
    Ok(())
}

fn answer<S: AsRef<str>>(r: Result<Body, AgentError>, argv: &[S]) -> Result<ExecOutput, EnvError> {
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
        Err(e) => Err(env_of(format_args!("`{shown}`"), e)),
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
impl Deployment for Vm {
    fn backend(&self) -> &'static dyn BackendOps {
        &BACKEND
    }

    async fn host_side_diagnostics(&self, plan: &Plan) -> String {
        let mut text = String::new();
        if let Some(code) = self.vm_exited() {
            text.push_str(&format!("qemu has exited ({code:?})\n"));
            return text;
        }
        for n in &plan.nodes {
            let argv = ["ip", "-s", "link", "show"];
            let cmd = Cmd {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                stdin: None,
                may_fail: true,
            };
            let out = self.exec(&n.name, &cmd, Duration::from_secs(5)).await;
            let shown = match out {
                Ok(o) => format!("{}{}", o.stdout, o.stderr),
                Err(e) => format!("{e}\n"),
            };
            text.push_str(&format!(
                "--- {} (its namespace in the VM): {}\n{shown}",
                n.name,
                argv.join(" ")
            ));
        }
        text
    }

    fn keep(&self) {
        // A kept lab's VMs run on after this process: their handles must neither kill nor
        // reap them. The state file names each qemu, so `iblab down` stops it.
        if let Ok(mut vm) = self.vm.lock()
            && let Some(bg) = vm.take()
        {
            bg.leave_running();
        }
    }

    fn loss_mechanism(&self, _node: &str, _plan: LossMechanism) -> LossMechanism {
        // The guest runs a Debian kernel, which has sch_netem; every node is in the guest.
        LossMechanism::Netem
    }

    fn report(&self) -> (Vec<String>, Vec<(String, f64)>) {
        let f = self.facts.lock().map(|f| f.clone()).unwrap_or_default();
        let mut notes = Vec::new();
        let mut timings = Vec::new();
        if let Some(a) = f.get("accel") {
            notes.push(format!(
                "vm backend: accelerator {} ({}), {} vCPU, {} MiB, one VM for every node",
                a["name"].as_str().unwrap_or("?"),
                a["reason"].as_str().unwrap_or(""),
                f.get("vcpus").and_then(|v| v.as_u64()).unwrap_or(0),
                f.get("memory_mb").and_then(|v| v.as_u64()).unwrap_or(0),
            ));
        }
        if let Some(i) = f.get("image") {
            notes.push(format!(
                "vm backend: guest kernel {} ({} {} from Debian {}), image {} {}",
                i["kernel_release"].as_str().unwrap_or("?"),
                i["kernel"].as_str().unwrap_or("?"),
                i["kernel_version"].as_str().unwrap_or("?"),
                i["kernel_suite"].as_str().unwrap_or("?"),
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
        if let Some(p) = f
            .get("boot")
            .and_then(|b| b["problems"].as_array())
            .filter(|p| !p.is_empty())
        {
            notes.push(format!("vm: {p:?}"));
        }
        // A list of notes kept under `key`, each as the evidence says it.
        let listed = |key: &str| -> Vec<String> {
            f.get(key)
                .and_then(|b| b.as_array())
                .into_iter()
                .flatten()
                .filter_map(|b| b.as_str())
                .map(|b| format!("vm backend: {b}"))
                .collect()
        };
        notes.extend(listed("snapshot"));
        if let Some(r) = f.get("refresh") {
            let problems = r["problems"].as_array().cloned().unwrap_or_default();
            notes.push(format!(
                "vm backend: the guest was made this run's machine: its clock set from the host's (it was {:+.1} s off), its RNG {}, its hostname and /run/iblab/run the run's{}",
                r["clock_was_off_s"].as_f64().unwrap_or(0.0),
                if r["reseeded"].as_bool().unwrap_or(false) {
                    "reseeded from the host"
                } else {
                    "NOT reseeded"
                },
                if problems.is_empty() {
                    String::new()
                } else {
                    format!(" (problems: {problems:?})")
                }
            ));
        }
        notes.extend(listed("failed_boots"));
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
        let (img, initrd, accel) = self.prepare(state).await?;
        let memory = qemu::memory_mb(plan.nodes.len());
        self.note("memory_mb", serde_json::json!(memory));
        let image_s = t0.elapsed().as_secs_f64();

        let t_boot = Instant::now();
        let run_dir = state.snapshot().run_dir;
        let machine = Machine {
            plan,
            img: &img,
            accel: &accel.name,
            initrd: &initrd,
            memory_mb: memory,
        };
        let (agent, hello) = self
            .bring_up(&machine, state, &run_dir.join("logs"))
            .await?;
        let ready_s = t_boot.elapsed().as_secs_f64();
        let guest_uptime = self.note_boot(&hello, ready_s);
        if let Ok(mut a) = self.agent.lock() {
            *a = Some(Arc::new(agent));
        }
        let t_wire = Instant::now();
        self.wire(plan).await?;
        // Carrier on every link, and spanning tree settled on looped segments.
        iblab_wiring::wait_links_up(self, &plan.nodes.iter().collect::<Vec<_>>()).await?;
        self.show_bridges(plan, &run_dir).await;
        self.note(
            "timings",
            serde_json::json!({
                "image_and_accel_s": image_s,
                "boot_s": ready_s,
                // The guest's own clock at the agent's hello: the rest of boot_s is qemu
                // starting and loading the kernel and initramfs.
                "guest_uptime_at_hello_s": guest_uptime,
                "wire_s": t_wire.elapsed().as_secs_f64(),
                "boot_and_configure_s": t_boot.elapsed().as_secs_f64(),
            }),
        );
        Ok(())
    }

    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        let agent = self.agent()?;
        let op = Op::Run {
            argv: cmd.argv.clone(),
            stdin: cmd.stdin.clone(),
            timeout_ms: timeout.as_millis() as u64,
            netns: Some(node.to_string()),
        };
        answer(
            agent.call(op, timeout + Duration::from_secs(10)).await,
            &cmd.argv,
        )
    }

    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        _state: &StateFile,
    ) -> Result<Background, EnvError> {
        let agent = self.agent()?;
        let r = agent
            .call(
                Op::Spawn {
                    argv: argv.to_vec(),
                    netns: Some(node.to_string()),
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
            Err(e) => Err(env_of(node, e)),
        }
    }
}
