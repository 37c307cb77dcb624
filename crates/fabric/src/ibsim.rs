//! The ibsim fabric (path ③ ib, emulated): the lab topology as an ibsim subnet, managed
//! by real opensm and read by real infiniband-diags. ibsim carries management datagrams
//! only, so path ③'s data path is a verdict of the subnet: delivered when both ports are
//! ACTIVE with LIDs and the switches' forwarding tables route between them.
//!
//! ibsim, its SMs and every diagnostic run in a network namespace of their own
//! (`iblab-<run>-_ibsim`): ibsim's abstract unix sockets are per namespace, so runs never
//! see each other's subnet.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::Fabric;
use std::sync::Arc;

use crate::ctx::{StepCtx, excerpt};
use iblab_backend::{EnvError, Runner};
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::evidence::blank;
use iblab_core::evidence::detail::{Port, PortRead, PortsFacts};
use iblab_core::evidence::{Metric, Provenance, ProvenanceKind, StepRecord, Verdict};
use iblab_core::plan::{Action, Plan, PlannedStep, Probe, SmControl, Traffic};
use iblab_lab::names;
use iblab_lab::{FaultAction, PathKind, ProbeKind, SmAction};
use iblab_sys::pid::start_ticks_of;
use iblab_sys::process::{self, Background};
use iblab_sys::state::{PREFIX, Resource};
use iblab_tools::ibdiag::{self, IbLink, IbNode, IbTopology, LinkState};

/// The emulated fabric, its subnet managers, and the diagnostics read from it.
const IBSIM: &str = "ibsim";
const OPENSM: &str = "opensm";
const DIAGNOSTICS: &[&str] = &[
    "smpquery",
    "ibstat",
    "ibtracert",
    "ibnetdiscover",
    "ibroute",
    "sminfo",
    "saquery",
];
/// What runs them in a namespace of this host, and in a node of the run's own (a pod):
/// there a shell writes files and the console, `env` gives each tool its environment.
const ON_HOST: &[&str] = &["ip"];
const IN_NODE: &[&str] = &["sh", "cat", "mkdir", "mkfifo", "rm", "env"];

/// What path ③'s subnet starts where it runs (a namespace of this host, or a pod).
pub fn programs(
    plan: &Plan,
    backend: &dyn iblab_core::plan::backend::Backend,
    needs: &mut iblab_core::programs::Needs,
) {
    use iblab_core::programs::{Place, Provider};
    if !plan.paths.contains(&PathKind::Ib)
        || plan.hca.as_ref().is_some_and(|h| h.path == PathKind::Ib)
    {
        return;
    }
    let by = "fabric ibsim";
    needs.add_all(Place::Subnet, &[IBSIM, OPENSM], by);
    needs.add_all(Place::Subnet, DIAGNOSTICS, by);
    match backend.provider(Place::Subnet) {
        Provider::Image { .. } => needs.add_all(Place::Subnet, IN_NODE, by),
        _ => needs.add_all(Place::Subnet, ON_HOST, by),
    }
}

const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";
/// How long one diagnostic may take (a client with no ibsim behind it retries forever).
const DIAG_DEADLINE: Duration = Duration::from_secs(8);

/// opensm settings for a lab: standby SMs poll the master every second and give up
/// after two misses, so a failover shows in ~3 s instead of the default ~57 s.
const SM_CONF: &str = "sminfo_polling_timeout 1000\npolling_retry_number 2\n";

pub struct Ibsim {
    topo: IbTopology,
    /// Lab link name → the two (node, port) ends.
    links: BTreeMap<String, [(String, u8); 2]>,
    hcas: Vec<String>,
    sm_plan: Vec<iblab_core::plan::PlannedSm>,
    sim: Mutex<Option<Sim>>,
    /// Where the backend has verbs devices (rxe in the vm backend), path ③'s bytes ride
    /// them once the subnet admits the traffic: the same transport as ②.
    carrier: Option<Carrier>,
}

/// The verbs engine that carries path ③'s bytes, and whether this fabric must set it up
/// (when path ② is not in the run, nobody else does).
pub struct Carrier {
    pub engine: std::sync::Arc<super::softroce::SoftRoce>,
    pub set_up_here: bool,
}

/// Queue given to every rate-limited interface while path ③'s bytes flow: IB's
/// credit-based link layer never drops for congestion, the sender waits; modelled as a
/// queue deep enough that nothing overflows.
const CREDIT_QUEUE_BYTES: u64 = 64 << 20;
/// The QP retry timer of ③'s bytes through a modelled-lossless bottleneck: 4.096 µs ×
/// 2^20 ≈ 4.3 s.
const ACK_TIMEOUT_EXPONENT: u8 = 20;

/// Where the subnet runs.
enum Site {
    /// A network namespace of the run's own on this host (`ns`). `scratch` is the working
    /// folder of every IB client (libumad2sim writes a fake sysfs tree, `sys-<pid>/`, into
    /// its current folder and never removes it); `fifo` is ibsim's console.
    Host {
        ns: String,
        scratch: PathBuf,
        fifo: PathBuf,
    },
    /// A node of the run that the backend gave it (a pod on the kube backend): every file
    /// under [`POD_DIR`] there, every command through the backend.
    Node(Arc<dyn Runner>),
}

/// The subnet's folder inside its node: the net file, the SMs' folders, the console fifo,
/// and the clients' scratch folder.
const POD_DIR: &str = "/tmp/iblab-ib";

/// The running subnet.
struct Sim {
    site: Site,
    sock: String,
    /// The run's `logs/ib` folder on this host.
    dir: PathBuf,
    _ibsim: Background,
    sms: BTreeMap<String, Background>,
    /// Subnet managers that ended without a step of the lab stopping them (killed from
    /// outside, crashed), with how they ended: found before each step of path ③.
    lost: BTreeMap<String, String>,
}

const SUBNET_GONE: &str = "ibsim (the emulated subnet) is no longer running";

/// How a process that ended on its own ended, as [`Background::exited`] tells it.
fn how_it_ended(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit code {c}"),
        None => "killed by a signal".into(),
    }
}

impl Sim {
    /// Is ibsim still running (not ended, not a zombie awaiting its reaping)?
    fn ibsim_alive(&self) -> bool {
        match self.site {
            Site::Host { .. } => {
                matches!(self._ibsim.state_letter(), Some(c) if c != 'Z' && c != 'X')
            }
            // Not this host's process: its end shows as the pod's (the backend checks the
            // run's pods when a command fails).
            Site::Node(_) => true,
        }
    }

    /// Why no step of path ③ can run any more, if so: ibsim, which is the subnet, has
    /// ended without the run stopping it. Each diagnostic would otherwise wait out its own
    /// deadline and report a port that does not answer.
    fn subnet_gone(&mut self) -> Option<String> {
        let code = self._ibsim.exited()?;
        Some(format!(
            "{SUBNET_GONE}: it ended during the run without a step stopping it ({}); no step of path ③ can run",
            how_it_ended(code)
        ))
    }

    /// Move subnet managers that ended on their own from `sms` to `lost`.
    fn notice_lost_sms(&mut self) {
        let ended: Vec<(String, Option<i32>)> = self
            .sms
            .iter_mut()
            .filter_map(|(n, bg)| bg.exited().map(|c| (n.clone(), c)))
            .collect();
        for (name, code) in ended {
            self.sms.remove(&name);
            self.lost.insert(name, how_it_ended(code));
        }
    }

    /// Why a step that needs the subnet managers the lab started cannot trust them.
    fn sms_lost(&self) -> Option<String> {
        if self.lost.is_empty() {
            return None;
        }
        let each: Vec<String> = self
            .lost
            .iter()
            .map(|(n, how)| format!("`{n}` ({how})"))
            .collect();
        Some(format!(
            "subnet manager {} ended during the run without a step of the lab stopping it: the subnet is no longer managed as the lab set it up",
            each.join(", ")
        ))
    }
}

/// A step of path ③ refused before it ran, with the reason.
fn refused(step: &PlannedStep, at: f64, why: String) -> StepRecord {
    let mut rec = blank(step, at);
    rec.provenance = Some(provenance());
    rec.verdict = Verdict::Fail;
    rec.reason = Some(why);
    rec
}

fn provenance() -> Provenance {
    Provenance {
        kind: ProvenanceKind::Emulated,
        source: "ibsim simulates the IB fabric (management datagrams only); opensm and infiniband-diags are the real tools".into(),
    }
}

impl Ibsim {
    pub fn new(plan: &Plan, carrier: Option<Carrier>) -> Ibsim {
        let mut hcas = Vec::new();
        let mut switches = Vec::new();
        for n in &plan.nodes {
            let node = IbNode {
                name: n.name.clone(),
                ports: n.interfaces.len().clamp(1, 36) as u8,
            };
            if n.switch {
                switches.push(node)
            } else {
                hcas.push(node)
            }
        }
        let port_of = |node: &str, ifname: &str| -> u8 {
            plan.nodes
                .iter()
                .find(|n| n.name == node)
                .and_then(|n| n.interfaces.iter().position(|i| i.name == ifname))
                .map(|p| p as u8 + 1)
                .unwrap_or(1)
        };
        let mut links = BTreeMap::new();
        let mut ib_links = Vec::new();
        for l in &plan.links {
            let [(a, ia), (b, ib)] = &l.ends;
            let ends = [(a.clone(), port_of(a, ia)), (b.clone(), port_of(b, ib))];
            ib_links.push(IbLink {
                a: ends[0].clone(),
                b: ends[1].clone(),
            });
            links.insert(l.name.clone(), ends);
        }
        Ibsim {
            hcas: hcas.iter().map(|h| h.name.clone()).collect(),
            topo: IbTopology {
                switches,
                hcas,
                links: ib_links,
            },
            links,
            sm_plan: plan.subnet_managers.clone(),
            sim: Mutex::new(None),
            carrier,
        }
    }

    /// Start ibsim in a network namespace of the run's own on this host.
    async fn start_on_host(
        &self,
        ctx: &StepCtx<'_>,
        run: &str,
        sock: &str,
        dir: &Path,
    ) -> Result<(Site, Background), EnvError> {
        let ns = format!("{PREFIX}{run}-_ibsim");
        let fifo = iblab_sys::state::state_dir().join(format!("{run}-ibsim.fifo"));
        let rec = |r| ctx.state.record(r).map_err(EnvError::state);
        rec(Resource::Netns { name: ns.clone() })?;
        let add = ["ip", "netns", "add", &ns].map(String::from);
        let out = process::run(&add, None, Duration::from_secs(10))
            .await
            .map_err(|e| EnvError::caused(format!("cannot run ip: {e}"), e))?;
        if !out.success() {
            return Err(EnvError::new(format!(
                "cannot create namespace {ns}: {}",
                out.stderr.trim()
            )));
        }
        rec(Resource::File { path: fifo.clone() })?;
        let scratch = iblab_sys::state::state_dir().join(format!("{run}-ibsim.d"));
        rec(Resource::Dir {
            path: scratch.clone(),
        })?;
        std::fs::create_dir_all(&scratch).map_err(|e| {
            EnvError::caused(format!("cannot create {}: {e}", scratch.display()), e)
        })?;
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| EnvError::caused(format!("cannot create {}: {e}", fifo.display()), e))?;
        let net = dir.join("fabric.net");

        // ibsim reads its console on stdin: the fifo, held open read-write so it never sees EOF.
        let stdin = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .map_err(|e| EnvError::caused(format!("cannot open {}: {e}", fifo.display()), e))?;
        let argv: Vec<String> = [
            "ip",
            "netns",
            "exec",
            &ns,
            IBSIM,
            "-s",
            &net.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let env = vec![("IBSIM_SOCKNAME".to_string(), sock.to_string())];
        let ibsim = Background::start_with(
            &argv,
            &dir.join("ibsim.log"),
            &env,
            Some(stdin),
            Some(&scratch),
        )
        .map_err(|e| EnvError::caused(format!("cannot start ibsim: {e}"), e))?;
        record(ctx, ibsim.pid)?;
        // Ready when its control socket exists (abstract, in its namespace) and is ibsim's.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ibsim = ibsim;
        loop {
            let sockets = std::fs::read_to_string(format!("/proc/{}/net/unix", ibsim.pid))
                .unwrap_or_default();
            if let Some(inode) = ctl_inode(&sockets, sock) {
                let held = std::fs::read_dir(format!("/proc/{}/fd", ibsim.pid))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| std::fs::read_link(e.path()).ok())
                    .any(|l| l.to_string_lossy() == format!("socket:[{inode}]"));
                if held {
                    break;
                }
                return Err(EnvError::new(format!(
                    "ibsim's control socket @{sock}:ctl in namespace {ns} is held by another \
                     process: the subnet would not be iblab's, so the run stops"
                )));
            }
            if let Some(code) = ibsim.exited() {
                return Err(EnvError::new(format!(
                    "ibsim ended at start ({}); see {}",
                    how_it_ended(code),
                    dir.join("ibsim.log").display()
                )));
            }
            if Instant::now() > deadline {
                return Err(EnvError::new("ibsim did not open its socket within 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok((Site::Host { ns, scratch, fifo }, ibsim))
    }

    /// Start ibsim in the node the backend gave the subnet: its files under [`POD_DIR`],
    /// its console a fifo there that it holds open read-write.
    async fn start_in_node(
        &self,
        r: Arc<dyn Runner>,
        sock: &str,
        net_text: &str,
        dir: &Path,
    ) -> Result<(Site, Background), EnvError> {
        let write = |path: String, text: &str| Cmd {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\"".into(),
                "write".into(),
                path,
            ],
            stdin: Some(text.to_string()),
            may_fail: false,
        };
        for (path, text) in [
            (format!("{POD_DIR}/fabric.net"), net_text),
            (format!("{POD_DIR}/sm.conf"), SM_CONF),
            (format!("{POD_DIR}/scratch/.keep"), ""),
        ] {
            let out = r.exec(&write(path.clone(), text), DIAG_DEADLINE).await?;
            if !out.success() {
                return Err(EnvError::new(format!(
                    "cannot write {path} in {}: {}",
                    r.describe(),
                    out.stderr.trim()
                )));
            }
        }
        let script = format!(
            "cd {POD_DIR}/scratch && rm -f {POD_DIR}/console && mkfifo {POD_DIR}/console && \
             exec 3<>{POD_DIR}/console && IBSIM_SOCKNAME={sock} exec ibsim -s {POD_DIR}/fabric.net <&3"
        );
        let log = dir.join("ibsim.log");
        let ibsim = r.spawn(&["sh".into(), "-c".into(), script], &log).await?;
        // Ready when its control socket exists (abstract, in the node's namespace) and is
        // ibsim's own: an abstract name is whoever's binds it first there, and a subnet
        // answered by another process would answer every diagnostic.
        let deadline = Instant::now() + Duration::from_secs(20);
        let unix = cmd(vec![
            "sh".into(),
            "-c".into(),
            format!(
                "cat /proc/net/unix; echo @@fds; ls -l /proc/{}/fd/",
                ibsim.pid
            ),
        ]);
        loop {
            let out = r.exec(&unix, DIAG_DEADLINE).await?;
            let (sockets, fds) = out.stdout.split_once("@@fds").unwrap_or((&out.stdout, ""));
            if let Some(inode) = ctl_inode(sockets, sock) {
                if fds.contains(&format!("socket:[{inode}]")) {
                    break;
                }
                return Err(EnvError::new(format!(
                    "ibsim's control socket @{sock}:ctl in {} is held by another process \
                     (ibsim, pid {}, does not hold it): the subnet would not be iblab's, so \
                     the run stops",
                    r.describe(),
                    ibsim.pid
                )));
            }
            if Instant::now() > deadline {
                return Err(EnvError::new(format!(
                    "ibsim did not open its socket within 20 s in {}; see {}",
                    r.describe(),
                    log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok((Site::Node(r), ibsim))
    }

    fn env(&self, sim: &Sim, node: &str) -> Vec<(String, String)> {
        vec![
            ("IBSIM_SOCKNAME".into(), sim.sock.clone()),
            ("SIM_HOST".into(), node.into()),
            ("LD_PRELOAD".into(), UMAD2SIM.into()),
        ]
    }

    /// Run a diagnostic tool as seen from `node`'s HCA.
    async fn diag(&self, sim: &Sim, node: &str, argv: &[&str]) -> Result<ExecOutput, EnvError> {
        let out = match &sim.site {
            Site::Host { ns, scratch, .. } => {
                let mut full: Vec<String> =
                    vec!["ip".into(), "netns".into(), "exec".into(), ns.clone()];
                full.extend(argv.iter().map(|s| s.to_string()));
                // A diagnostic waits for ibsim's answer until its own deadline: if ibsim
                // dies under it, stop waiting (the diagnostic is killed as the future is
                // dropped).
                let watch = async {
                    while sim.ibsim_alive() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                };
                let env = self.env(sim, node);
                tokio::select! {
                    r = process::run_env(&full, None, DIAG_DEADLINE, &env, Some(scratch)) => r
                        .map_err(|e| EnvError::caused(format!("cannot run {}: {e}", argv[0]), e))?,
                    _ = watch => return Err(EnvError::new(format!(
                        "{SUBNET_GONE}; it ended while {} waited for its answer",
                        argv[0]
                    ))),
                }
            }
            Site::Node(r) => {
                let full = in_pod(&self.env(sim, node), argv.iter().map(|s| s.to_string()));
                r.exec(&cmd(full), DIAG_DEADLINE).await?
            }
        };
        let line = format!(
            "$ SIM_HOST={node} {}\n# exit {:?}\n{}{}\n",
            argv.join(" "),
            out.exit_code,
            out.stdout,
            out.stderr
        );
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(sim.dir.join("diags.log"))
            .and_then(|mut f| f.write_all(line.as_bytes()));
        Ok(out)
    }

    /// Write a command to ibsim's console (the fifo it reads; opened read-write so the
    /// write never blocks even if ibsim is gone).
    async fn console(&self, sim: &Sim, command: &str) -> Result<(), EnvError> {
        match &sim.site {
            Site::Host { fifo, .. } => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(fifo)
                .and_then(|mut f| f.write_all(format!("{command}\n").as_bytes()))
                .map_err(|e| EnvError::caused(format!("cannot talk to ibsim's console: {e}"), e)),
            Site::Node(r) => {
                // ibsim holds its console fifo open read-write: the write never blocks.
                let out = r
                    .exec(
                        &cmd(vec![
                            "sh".into(),
                            "-c".into(),
                            format!("printf '%s\\n' \"$1\" > {POD_DIR}/console"),
                            "console".into(),
                            command.into(),
                        ]),
                        DIAG_DEADLINE,
                    )
                    .await?;
                if out.success() {
                    Ok(())
                } else {
                    Err(EnvError::new(format!(
                        "cannot talk to ibsim's console in {}: {}",
                        r.describe(),
                        out.stderr.trim()
                    )))
                }
            }
        }
    }

    async fn start_sm(
        &self,
        sim: &mut Sim,
        name: &str,
        ctx: &StepCtx<'_>,
    ) -> Result<String, EnvError> {
        let Some(m) = self.sm_plan.iter().find(|m| m.name == name) else {
            return Err(EnvError::new(format!("no subnet manager `{name}`")));
        };
        if let Some(bg) = sim.sms.get_mut(name)
            && bg.exited().is_none()
        {
            return Err(EnvError::new(format!(
                "subnet manager {name} is already running"
            )));
        }
        let guid = self.topo.port_guid(&m.node, 1).unwrap_or(0);
        let dir = sim.dir.join(format!("sm-{name}"));
        // Its own folders where it runs: on this host, or in the subnet's node.
        let at = match &sim.site {
            Site::Host { .. } => dir.clone(),
            Site::Node(_) => Path::new(POD_DIR).join(format!("sm-{name}")),
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| EnvError::caused(format!("cannot create {}: {e}", dir.display()), e))?;
        let s = |p: &Path| p.display().to_string();
        let opensm: Vec<String> = vec![
            OPENSM.into(),
            "-F".into(),
            s(&at.parent().unwrap_or(&at).join("sm.conf")),
            "-f".into(),
            s(&at.join("opensm.log")),
            "-p".into(),
            m.priority.to_string(),
            "-g".into(),
            format!("0x{guid:x}"),
            "--dump_files_dir".into(),
            s(&at.join("tmp")),
        ];
        let mut env = self.env(sim, &m.node);
        env.push(("OSM_CACHE_DIR".into(), s(&at.join("cache"))));
        env.push(("OSM_TMP_DIR".into(), s(&at.join("tmp"))));
        let out = dir.join("stdout.log");
        let bg = match &sim.site {
            Site::Host { ns, scratch, .. } => {
                for d in ["cache", "tmp"] {
                    std::fs::create_dir_all(dir.join(d)).map_err(|e| {
                        EnvError::caused(format!("cannot create {}: {e}", dir.display()), e)
                    })?;
                }
                let mut argv: Vec<String> =
                    vec!["ip".into(), "netns".into(), "exec".into(), ns.clone()];
                argv.extend(opensm);
                let bg = Background::start_with(&argv, &out, &env, None, Some(scratch))
                    .map_err(|e| EnvError::caused(format!("cannot start opensm: {e}"), e))?;
                record(ctx, bg.pid)?;
                bg
            }
            Site::Node(r) => {
                let mk = cmd(vec![
                    "mkdir".into(),
                    "-p".into(),
                    s(&at.join("cache")),
                    s(&at.join("tmp")),
                ]);
                r.exec(&mk, DIAG_DEADLINE).await?;
                // Its pid is the node's, not this host's: the node's end takes it along.
                r.spawn(&in_pod(&env, opensm), &out).await?
            }
        };
        sim.lost.remove(name);
        sim.sms.insert(name.to_string(), bg);
        // opensm says which role it took on stdout.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if let Some(role) = ["MASTER", "STANDBY"]
                .iter()
                .find(|r| text.contains(&format!("Entering {r} state")))
            {
                return Ok(role.to_lowercase());
            }
            // An SM cannot take a role in a subnet whose ibsim is gone.
            if let Some(why) = sim.subnet_gone() {
                return Err(EnvError::new(why));
            }
            if let Some(bg) = sim.sms.get_mut(name)
                && let Some(code) = bg.exited()
            {
                return Err(EnvError::new(format!(
                    "opensm {name} ended before taking a role ({}); see {}",
                    how_it_ended(code),
                    out.display()
                )));
            }
            if Instant::now() > deadline {
                return Err(EnvError::new(format!(
                    "opensm {name} took no role within 15 s; see {}",
                    out.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Port facts of every HCA, as each HCA sees its own first port.
    async fn ports(&self, sim: &Sim) -> Result<PortsFacts, EnvError> {
        let mut ports = BTreeMap::new();
        let mut lids = Vec::new();
        let (mut active, mut init) = (0, 0);
        for h in &self.hcas {
            let out = self
                .diag(sim, h, &["smpquery", "-D", "portinfo", "0", "1"])
                .await?;
            let text = format!("{}{}", out.stdout, out.stderr);
            let port = match ibdiag::parse_portinfo(&text) {
                Ok(p) => {
                    if p.link_state == LinkState::Active {
                        active += 1;
                    }
                    if p.link_state == LinkState::Init {
                        init += 1;
                    }
                    if p.lid != 0 {
                        lids.push(p.lid);
                    }
                    Port {
                        state: format!("{:?}", p.link_state),
                        lid: p.lid,
                        sm_lid: p.sm_lid,
                        read: PortRead::Answered {
                            phys: format!("{:?}", p.phys_state),
                            runs_sm: p.is_sm(),
                            lane_gbps: p.lane_gbps(),
                        },
                    }
                }
                Err(e) => Port {
                    state: "Unknown".into(),
                    lid: 0,
                    sm_lid: 0,
                    read: PortRead::Failed {
                        error: e.to_string(),
                    },
                },
            };
            ports.insert(h.clone(), port);
        }
        let n = self.hcas.len();
        let mut unique = lids.clone();
        unique.sort();
        unique.dedup();
        Ok(PortsFacts {
            ports,
            active,
            init,
            all_active: active == n,
            all_init: init == n,
            lids_unique: unique.len() == lids.len() && lids.len() == n,
        })
    }

    /// The LID of a node's port, or why it has none usable (not ACTIVE, or no answer).
    /// The HCA a node has on path ③, as ibstat reports it.
    async fn device(&self, sim: &Sim, node: &str) -> Result<Value, EnvError> {
        let out = self.diag(sim, node, &["ibstat"]).await?;
        Ok(
            match ibdiag::parse_ibstat(&format!("{}{}", out.stdout, out.stderr)) {
                Ok(cas) if !cas.is_empty() => {
                    let ca = &cas[0];
                    let port = ca.ports.first();
                    json!({
                        "device": ca.name,
                        "ca_type": ca.ca_type,
                        // No `transport`: ibstat does not print it, and the emulated CA has no
                        // verbs device to ask (a real HCA's ibv_devinfo says "InfiniBand").
                        "link_layer": port.map(|p| if p.link_layer == "IB" { "InfiniBand".to_string() } else { p.link_layer.clone() }),
                        "state": port.map(|p| format!("{:?}", p.state)),
                        "lid": port.map(|p| p.base_lid),
                        "sm_lid": port.map(|p| p.sm_lid),
                        "address": port.map(|p| format!("LID {}", p.base_lid)),
                    })
                }
                Ok(_) => json!({"device": "none"}),
                Err(e) => json!({"device": "none", "error": e.to_string()}),
            },
        )
    }

    async fn lid_of(&self, sim: &Sim, node: &str) -> Result<Result<u16, NoLid>, EnvError> {
        let out = self
            .diag(sim, node, &["smpquery", "-D", "portinfo", "0", "1"])
            .await?;
        Ok(
            match ibdiag::parse_portinfo(&format!("{}{}", out.stdout, out.stderr)) {
                Ok(p) if p.link_state == LinkState::Active && p.lid != 0 => Ok(p.lid),
                Ok(p) => Err(NoLid::NotActive {
                    node: node.into(),
                    state: p.link_state,
                    lid: p.lid,
                }),
                Err(source) => Err(NoLid::NoAnswer {
                    node: node.into(),
                    source,
                }),
            },
        )
    }

    async fn trace(&self, sim: &Sim, from: &str, to: &str) -> Result<Value, EnvError> {
        let (a, b) = match (self.lid_of(sim, from).await?, self.lid_of(sim, to).await?) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(why), _) | (_, Err(why)) => {
                return Ok(json!({"reached": false, "switches": 0, "failure": why.to_string()}));
            }
        };
        let out = self
            .diag(sim, from, &["ibtracert", &a.to_string(), &b.to_string()])
            .await?;
        let text = format!("{}{}", out.stdout, out.stderr);
        match ibdiag::parse_ibtracert(&text, out.success()) {
            Ok(t) => Ok(json!({
                "reached": t.reached(),
                "switches": t.hops.iter().filter(|h| h.node_type == ibdiag::NodeType::Switch).count(),
                "path": t.hops.iter().map(|h| h.name.clone()).collect::<Vec<_>>(),
                "from_lid": a,
                "to_lid": b,
                "out_ports": t.out_ports(),
                "failure": t.failure.as_ref().map(|f| f.message.clone()),
            })),
            Err(e) => Ok(json!({"reached": false, "switches": 0, "failure": e.to_string()})),
        }
    }

    async fn routes(&self, sim: &Sim, node: &str) -> Result<Value, EnvError> {
        let out = self.diag(sim, node, &["ibnetdiscover"]).await?;
        let nodes = ibdiag::parse_ibnetdiscover(&format!("{}{}", out.stdout, out.stderr))
            .unwrap_or_default();
        let all_lids: Vec<u16> = nodes
            .iter()
            .filter_map(|n| n.lid)
            .filter(|l| *l != 0)
            .collect();
        let mut switches = serde_json::Map::new();
        let mut complete = !nodes.is_empty();
        for n in nodes
            .iter()
            .filter(|n| n.node_type == ibdiag::NodeType::Switch)
        {
            let name = n.description.clone();
            let lid = n.lid.unwrap_or(0);
            if lid == 0 {
                complete = false;
                switches.insert(name, json!({"lid": 0, "entries": 0, "routes": {}}));
                continue;
            }
            let out = self.diag(sim, node, &["ibroute", &lid.to_string()]).await?;
            match ibdiag::parse_ibroute(&format!("{}{}", out.stdout, out.stderr)) {
                Ok(lft) => {
                    let routes: serde_json::Map<String, Value> = lft
                        .entries
                        .iter()
                        .map(|e| (e.lid.to_string(), json!(e.port)))
                        .collect();
                    if !all_lids.iter().all(|l| lft.port_for(*l).is_some()) {
                        complete = false;
                    }
                    switches.insert(
                        name,
                        json!({"lid": lid, "entries": lft.entries.len(), "routes": routes}),
                    );
                }
                Err(e) => {
                    complete = false;
                    switches.insert(
                        name,
                        json!({"lid": lid, "entries": 0, "routes": {}, "error": e.to_string()}),
                    );
                }
            }
        }
        Ok(json!({"switches": switches, "lids": all_lids, "complete": complete}))
    }

    async fn sminfo(&self, sim: &Sim, node: &str) -> Result<Value, EnvError> {
        let out = self.diag(sim, node, &["sminfo"]).await?;
        Ok(
            match ibdiag::parse_sminfo(&format!("{}{}", out.stdout, out.stderr)) {
                Ok(s) => {
                    json!({"answered": true, "state": format!("{:?}", s.state).to_lowercase(), "sm_lid": s.sm_lid, "priority": s.priority, "sm_guid": format!("0x{:x}", s.sm_guid)})
                }
                Err(e) => {
                    json!({"answered": false, "state": "none", "sm_lid": 0, "error": e.to_string()})
                }
            },
        )
    }

    /// Whether the SA answers `node` about itself, and with `to`, the path record from
    /// `node` to `to`: what an IB node asks before it connects (the peer's LID and the
    /// path's properties come from the SM's subnet administrator).
    async fn sa(&self, sim: &Sim, node: &str, to: Option<&str>) -> Result<Value, EnvError> {
        let lid = match self.lid_of(sim, node).await? {
            Ok(lid) => lid,
            Err(why) => return Ok(json!({"answered": false, "error": why.to_string()})),
        };
        let out = self.diag(sim, node, &["saquery", &lid.to_string()]).await?;
        let mut facts = match ibdiag::parse_saquery_nodes(&format!("{}{}", out.stdout, out.stderr))
        {
            Ok(records) if !records.is_empty() => {
                json!({"answered": true, "records": records.len()})
            }
            Ok(_) => json!({"answered": false, "error": "no record"}),
            Err(e) => json!({"answered": false, "error": e.to_string()}),
        };
        let Some(peer) = to else {
            return Ok(facts);
        };
        let path = match self.lid_of(sim, peer).await? {
            Err(why) => json!({"answered": false, "error": why.to_string()}),
            Ok(dlid) => {
                let pair = format!("{lid}:{dlid}");
                let out = self
                    .diag(sim, node, &["saquery", "PR", "--src-to-dst", &pair])
                    .await?;
                match ibdiag::parse_saquery_path(&format!("{}{}", out.stdout, out.stderr)) {
                    Ok(Some(r)) => json!({
                        "answered": true,
                        "to": peer,
                        "slid": r.slid,
                        "dlid": r.dlid,
                        "peer_lid": dlid,
                        "sgid": r.sgid,
                        "dgid": r.dgid,
                        "sl": r.sl,
                        "pkey": r.pkey,
                    }),
                    Ok(None) => json!({"answered": false, "to": peer, "error": "no path record"}),
                    Err(e) => json!({"answered": false, "to": peer, "error": e.to_string()}),
                }
            }
        };
        facts["path_answered"] = path["answered"].clone();
        facts["path"] = path;
        Ok(facts)
    }

    /// The verbs probe on path ③: its queue pairs on a node the subnet admitted (its
    /// port ACTIVE, with a LID), made on the device that carries ③'s bytes here.
    async fn verbs(
        &self,
        step: &PlannedStep,
        probe: &Probe,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let node = &probe.node;
        let admitted = {
            let mut guard = self.sim.lock().await;
            let sim = guard
                .as_mut()
                .ok_or_else(|| EnvError::new("the ibsim fabric is not up"))?;
            if let Some(why) = sim.subnet_gone() {
                return Ok(refused(step, at, why));
            }
            let sim = &*sim;
            match self.lid_of(sim, node).await {
                Err(e) if !sim.ibsim_alive() => return Ok(refused(step, at, e.message)),
                other => other?,
            }
        };
        let lid = match admitted {
            Ok(lid) => lid,
            Err(why) => return Ok(refused(step, at, format!("refused by the subnet: {why}"))),
        };
        let Some(c) = &self.carrier else {
            return Ok(refused(
                step,
                at,
                "path ③ has no verbs device on this backend: ibsim has no data path, and the nodes have no rxe to carry ③".into(),
            ));
        };
        let mut rec = c
            .engine
            .verbs_probe(step, ctx, node, PathKind::Ib, at)
            .await?;
        let used: Vec<String> = rec.devices.iter().map(|d| d.name()).collect();
        rec.provenance = Some(Provenance {
            kind: ProvenanceKind::Modelled,
            source: format!(
                "③'s own run of the verbs probe, admitted by the emulated subnet ({node}'s port ACTIVE with LID {lid}); its queue pairs are on {}, the rxe device that also carries ②: this machine has no IB HCA, so what it shows is that device's, the same as ②'s by construction; on hardware an IB HCA's",
                used.join(", ")
            ),
        });
        crate::ctx::merge_facts(&mut rec, json!({"admitted_lid": lid}));
        Ok(rec)
    }

    async fn nodes(&self, sim: &Sim, node: &str) -> Result<Value, EnvError> {
        let out = self.diag(sim, node, &["ibnetdiscover"]).await?;
        let nodes = ibdiag::parse_ibnetdiscover(&format!("{}{}", out.stdout, out.stderr))
            .unwrap_or_default();
        let list: Vec<Value> = nodes.iter().map(|n| json!({"name": n.description, "type": format!("{:?}", n.node_type).to_lowercase(), "lid": n.lid})).collect();
        Ok(json!({
            "switches": nodes.iter().filter(|n| n.node_type == ibdiag::NodeType::Switch).count(),
            "hcas": nodes.iter().filter(|n| n.node_type == ibdiag::NodeType::Ca).count(),
            "nodes": list,
        }))
    }

    async fn probe(
        &self,
        step: &PlannedStep,
        probe: &Probe,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let Probe {
            what,
            node,
            from,
            to,
            ..
        } = probe;
        let mut guard = self.sim.lock().await;
        let sim = guard
            .as_mut()
            .ok_or_else(|| EnvError::new("the ibsim fabric is not up"))?;
        if let Some(why) = sim.subnet_gone() {
            return Ok(refused(step, at, why));
        }
        sim.notice_lost_sms();
        // The SM and SA probes ask the subnet manager the lab started: one that died
        // under the run would read as "no SM", a different lesson than the lab's.
        if matches!(what, ProbeKind::Sm | ProbeKind::Sa)
            && let Some(why) = sim.sms_lost()
        {
            return Ok(refused(step, at, why));
        }
        let sim = &*sim;
        let mut rec = blank(step, at);
        rec.provenance = Some(provenance());
        rec.log = Some("logs/ib/diags.log".to_string());
        let facts = match what {
            ProbeKind::Device => self.device(sim, node).await,
            ProbeKind::Ports => self.ports(sim).await.map(|f| json!(f)),
            ProbeKind::Trace => {
                self.trace(
                    sim,
                    from.as_deref().unwrap_or(node),
                    to.as_deref().unwrap_or(node),
                )
                .await
            }
            ProbeKind::Routes => self.routes(sim, node).await,
            ProbeKind::Sm => self.sminfo(sim, node).await,
            ProbeKind::Sa => self.sa(sim, node, to.as_deref()).await,
            ProbeKind::Nodes => self.nodes(sim, node).await,
            ProbeKind::Learned => Err(EnvError::new(
                "a `learned` probe reads Ethernet bridges, not the IB subnet",
            )),
            ProbeKind::Verbs => Err(EnvError::new(
                "the verbs probe on path ③ is run by its own method, not as a subnet probe",
            )),
        };
        // ibsim dying under the probe fails this step (as the next one would), not the run.
        let facts = match facts {
            Err(e) if !sim.ibsim_alive() => return Ok(refused(step, at, e.message)),
            other => other?,
        };
        // A diagnostic that failed fast because ibsim was dying (its socket closed) reads
        // as "no answer": facts of a subnet that is gone are not evidence.
        if !sim.ibsim_alive() {
            let why = format!("{SUBNET_GONE}: it ended while this probe ran");
            return Ok(refused(step, at, why));
        }
        for &key in names::PROBE_COUNTS {
            if let Some(v) = facts.get(key).and_then(Value::as_f64) {
                let unit = match (what, key) {
                    (ProbeKind::Trace, _) => "switches crossed",
                    (_, "switches" | "hcas") => "nodes",
                    _ => "ports",
                };
                rec.metrics.insert(key.to_string(), Metric::new(v, unit));
            }
        }
        let _ = ctx;
        rec.detail = json!({"probe": what.as_str(), "node": node, "facts": facts});
        Ok(rec)
    }

    async fn sm_control(
        &self,
        step: &PlannedStep,
        sm: &SmControl,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let SmControl { name, action } = sm;
        let mut guard = self.sim.lock().await;
        let sim = guard
            .as_mut()
            .ok_or_else(|| EnvError::new("the ibsim fabric is not up"))?;
        if let Some(why) = sim.subnet_gone() {
            return Ok(refused(step, at, why));
        }
        sim.notice_lost_sms();
        if matches!(action, SmAction::Stop | SmAction::Kill)
            && let Some(how) = sim.lost.get(name)
        {
            let why = format!(
                "subnet manager `{name}` ended during the run without a step stopping it ({how}): there is nothing left to {}",
                action.as_str()
            );
            return Ok(refused(step, at, why));
        }
        let mut rec = blank(step, at);
        rec.provenance = Some(provenance());
        let t = Instant::now();
        match action {
            SmAction::Start => match self.start_sm(sim, name, ctx).await {
                Ok(role) => {
                    rec.detail = json!({"sm": name, "action": "start", "facts": {"role": role, "running": true}})
                }
                Err(e) => {
                    rec.verdict = Verdict::Fail;
                    rec.reason = Some(e.message);
                }
            },
            SmAction::Stop | SmAction::Kill => match sim.sms.remove(name) {
                None => {
                    rec.verdict = Verdict::Fail;
                    rec.reason = Some(format!("subnet manager {name} is not running"));
                }
                Some(bg) => {
                    if *action == SmAction::Kill {
                        match &sim.site {
                            Site::Host { .. } => {
                                let _ = nix::sys::signal::killpg(
                                    nix::unistd::Pid::from_raw(bg.pid as i32),
                                    nix::sys::signal::Signal::SIGKILL,
                                );
                            }
                            Site::Node(r) => {
                                // The shell's kill: a minimal image has no kill(1).
                                let kill = cmd(vec![
                                    "sh".into(),
                                    "-c".into(),
                                    format!("kill -KILL {}", bg.pid),
                                ]);
                                let _ = r.exec(&kill, DIAG_DEADLINE).await;
                            }
                        }
                    }
                    let code = bg.stop().await;
                    rec.detail = json!({"sm": name, "action": action.as_str(), "exit_code": code, "facts": {"running": false}});
                }
            },
        }
        rec.log = Some(format!("logs/ib/sm-{name}/opensm.log"));
        rec.metrics.insert(
            names::TOOK.into(),
            Metric::new(t.elapsed().as_secs_f64(), "s"),
        );
        Ok(rec)
    }
}

impl Ibsim {
    /// Carry the bytes of an admitted ③ step over the verbs engine, with every bottleneck
    /// made lossless for its duration (the credit-based model), then restore the queues.
    async fn carry(
        &self,
        c: &Carrier,
        step: &PlannedStep,
        t: &Traffic,
        ctx: &mut StepCtx<'_>,
        gate: StepRecord,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let shaped: Vec<((String, String), iblab_core::fault::Shaping)> = ctx
            .shaping
            .iter()
            .filter(|(_, s)| s.rate.is_some())
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        let mut modelled = Vec::new();
        for ((node, iface), s) in &shaped {
            crate::ctx::harvest_drops(ctx, node, iface).await?;
            let mech = ctx.backend.loss_mechanism(node, ctx.plan.loss_mechanism);
            let mut deep = s.clone();
            if let Some((rate, queue)) = s.rate {
                deep.rate = Some((rate, queue.max(CREDIT_QUEUE_BYTES)));
                modelled.push(json!({"node": node, "interface": iface, "queue_bytes": queue, "credit_model_queue_bytes": CREDIT_QUEUE_BYTES}));
            }
            for cmd in iblab_core::fault::apply(iface, &deep, mech) {
                ctx.backend
                    .exec(node, &cmd, Duration::from_secs(10))
                    .await?;
            }
        }
        // In a credit-based fabric a packet waits for credit before the wire, where the
        // sender's retry timer does not see it; here it waits in the deep queue after the
        // wire, so the timer is set past the longest such wait (4.3 s) instead of the
        // tools' 67 ms–0.5 s, which a queue of a few hundred KB at a slow bottleneck, on a
        // busy emulated CPU, can outlast with nothing lost (measured: retries and
        // duplicates with every packet counted through on every interface).
        let mut t = t.clone();
        if !shaped.is_empty() {
            t.ack_timeout = Some(ACK_TIMEOUT_EXPONENT);
        }
        let dropped = |ctx: &StepCtx<'_>| -> u64 {
            shaped
                .iter()
                .map(|(k, _)| ctx.drops.get(k).copied().unwrap_or(0))
                .sum()
        };
        let before = dropped(ctx);
        let carried = c.engine.traffic(step, &t, ctx, at).await;
        for ((node, iface), s) in &shaped {
            crate::ctx::harvest_drops(ctx, node, iface).await?;
            let mech = ctx.backend.loss_mechanism(node, ctx.plan.loss_mechanism);
            for cmd in iblab_core::fault::apply(iface, s, mech) {
                ctx.backend
                    .exec(node, &cmd, Duration::from_secs(10))
                    .await?;
            }
        }
        let mut rec = carried?;
        rec.metrics.extend(gate.metrics);
        if !shaped.is_empty() {
            // What the deepened queues dropped while they carried this step's bytes: the
            // credit model's own check (none, or it did not model a lossless link).
            rec.metrics.insert(
                names::BOTTLENECK_DROPS.into(),
                Metric::new(dropped(ctx).saturating_sub(before) as f64, "packets"),
            );
        }
        let mut facts = gate.detail["facts"].clone();
        facts["credit_model"] = json!(modelled);
        crate::ctx::merge_facts(&mut rec, facts);
        // What ③'s run changed from ②'s settings: only what the model itself changes.
        let mut differences = Vec::new();
        if !shaped.is_empty() {
            differences.push(format!(
                "bottleneck queue {} MiB instead of the lab's (credit-based flow control: a link that waits, never drops)",
                CREDIT_QUEUE_BYTES >> 20
            ));
            differences.push(format!(
                "QP transport timer 4.096 µs × 2^{ACK_TIMEOUT_EXPONENT} ≈ 4.3 s instead of the tools' default (a wait for credit is not a loss)"
            ));
            if t.exchange == iblab_lab::Exchange::RdmaCm {
                differences.push(
                    "the QP numbers swapped over TCP instead of the RDMA CM: perftest gives a QP its own timer only without the CM".into(),
                );
            }
        }
        rec.detail["differs_from_roce"] = json!(differences);
        rec.provenance = Some(Provenance {
            kind: ProvenanceKind::Modelled,
            source: format!(
                "admitted by the emulated subnet (ibsim + opensm: ports ACTIVE, an LFT route); the bytes ride rxe (Soft-RoCE, the same IB transport and verbs as ②) over the lab's Ethernet links standing in for the IB wire{}",
                if modelled.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", with {} bottleneck queue(s) made deep enough never to drop: IB's credit-based flow control, modelled",
                        modelled.len()
                    )
                }
            ),
        });
        Ok(rec)
    }
}

/// Why a node's port has no LID a diagnostic can use.
#[derive(Debug, thiserror::Error)]
enum NoLid {
    #[error(
        "{node}'s port is {state:?} with LID {lid}: no subnet manager has brought it to ACTIVE"
    )]
    NotActive {
        node: String,
        state: LinkState,
        lid: u16,
    },
    #[error("{node}'s port did not answer a query ({source})")]
    NoAnswer {
        node: String,
        source: ibdiag::ParseError,
    },
}

/// A command with no standard input that must succeed.
/// The inode of ibsim's control socket (`@NAME:ctl`) in `/proc/net/unix` text.
fn ctl_inode(unix: &str, sock: &str) -> Option<u64> {
    let name = format!("@{sock}:ctl");
    unix.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // ibsim binds the name with its terminating NUL, which the kernel shows as a
        // trailing `@` (`@NAME:ctl@`); a name without it (anyone else's) is the same
        // name only if it matches after that.
        (f.len() >= 8 && f[7].trim_end_matches('@') == name)
            .then(|| f[6].parse().ok())
            .flatten()
    })
}

fn cmd(argv: Vec<String>) -> Cmd {
    Cmd {
        argv,
        stdin: None,
        may_fail: false,
    }
}

/// `argv` run in the subnet's node with `env` set and the clients' scratch folder as the
/// working folder (coreutils `env -C`).
fn in_pod(env: &[(String, String)], argv: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v = vec!["env".to_string(), "-C".into(), format!("{POD_DIR}/scratch")];
    v.extend(env.iter().map(|(k, val)| format!("{k}={val}")));
    v.extend(argv);
    v
}

fn record(ctx: &StepCtx<'_>, pid: u32) -> Result<(), EnvError> {
    if let Some(t) = start_ticks_of(pid) {
        ctx.state
            .record(Resource::Process {
                pid,
                start_ticks: t,
            })
            .map_err(EnvError::state)?;
    }
    Ok(())
}

#[async_trait]
impl Fabric for Ibsim {
    fn name(&self) -> &'static str {
        "ibsim"
    }

    fn path(&self) -> PathKind {
        PathKind::Ib
    }

    async fn setup(&self, ctx: &mut StepCtx<'_>) -> Result<(), EnvError> {
        if let Some(c) = &self.carrier
            && c.set_up_here
        {
            c.engine.setup(ctx).await?;
        }
        self.topo.validate().map_err(|e| {
            EnvError::new(format!("the topology cannot be simulated by ibsim: {e}"))
        })?;
        let run = ctx.state.snapshot().run_id;
        let sock = format!("iblab-{run}");
        let dir = ctx.run_dir.join("logs/ib");
        std::fs::create_dir_all(&dir)
            .map_err(|e| EnvError::caused(format!("cannot create {}: {e}", dir.display()), e))?;
        // The net file and the SMs' settings, kept with the run's logs either way.
        let net_text = ibdiag::render_netfile(&self.topo);
        let net = dir.join("fabric.net");
        std::fs::write(&net, &net_text)
            .map_err(|e| EnvError::caused(format!("cannot write {}: {e}", net.display()), e))?;
        std::fs::write(dir.join("sm.conf"), SM_CONF)
            .map_err(|e| EnvError::caused(format!("cannot write sm.conf: {e}"), e))?;
        let (site, ibsim) = match ctx.backend.subnet_site() {
            None => self.start_on_host(ctx, &run, &sock, &dir).await?,
            Some(r) => self.start_in_node(r, &sock, &net_text, &dir).await?,
        };
        let mut sim = Sim {
            site,
            sock,
            dir,
            _ibsim: ibsim,
            sms: BTreeMap::new(),
            lost: BTreeMap::new(),
        };
        let to_start: Vec<String> = self
            .sm_plan
            .iter()
            .filter(|m| m.start)
            .map(|m| m.name.clone())
            .collect();
        for name in &to_start {
            self.start_sm(&mut sim, name, ctx).await?;
        }
        if !to_start.is_empty() {
            // The first sweep: every HCA port ACTIVE with a LID.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                // A subnet whose ibsim or SM died during setup never comes up: say so now.
                if let Some(why) = sim.subnet_gone() {
                    return Err(EnvError::new(why));
                }
                sim.notice_lost_sms();
                if let Some(why) = sim.sms_lost() {
                    return Err(EnvError::new(why));
                }
                let f = self.ports(&sim).await?;
                if f.all_active {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(EnvError::new(format!(
                        "the subnet manager did not bring every port to ACTIVE within 20 s: {}",
                        json!(f.ports)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        *self.sim.lock().await = Some(sim);
        Ok(())
    }

    async fn traffic(
        &self,
        step: &PlannedStep,
        t: &Traffic,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let Traffic { from, to, .. } = t;
        let mut guard = self.sim.lock().await;
        let sim = guard
            .as_mut()
            .ok_or_else(|| EnvError::new("the ibsim fabric is not up"))?;
        if let Some(why) = sim.subnet_gone() {
            return Ok(refused(step, at, why));
        }
        sim.notice_lost_sms();
        let sim = &*sim;
        let mut rec = blank(step, at);
        rec.log = Some("logs/ib/diags.log".into());
        rec.provenance = Some(Provenance {
            kind: ProvenanceKind::Emulated,
            source: "delivery decided by the emulated subnet (port state, LIDs, the switches' forwarding tables via ibtracert); no bytes are carried: ibsim has no data path and this backend has no verbs device for path ib".into(),
        });
        let trace = match self.trace(sim, from, to).await {
            Err(e) if !sim.ibsim_alive() => return Ok(refused(step, at, e.message)),
            other => other?,
        };
        if !sim.ibsim_alive() {
            let why = format!("{SUBNET_GONE}: it ended while the route was traced");
            return Ok(refused(step, at, why));
        }
        let delivered = trace["reached"] == true;
        rec.metrics.insert(
            names::DELIVERED.into(),
            Metric::new(if delivered { 1.0 } else { 0.0 }, "bool"),
        );
        if let Some(h) = trace["switches"].as_f64() {
            rec.metrics
                .insert(names::SWITCHES_CROSSED.into(), Metric::new(h, "switches"));
        }
        if !delivered {
            rec.verdict = Verdict::Fail;
            rec.reason = Some(format!(
                "refused by the subnet: {}",
                trace["failure"]
                    .as_str()
                    .map(|s| excerpt(s, 200))
                    .unwrap_or_default()
            ));
        }
        // `carried`: whether the subnet's admission is followed by bytes on the lab's
        // links (rxe in the nodes) or is all this path does here (ibsim has no data path).
        let carried = delivered && self.carrier.is_some();
        rec.detail = json!({"facts": {
            "delivered": delivered,
            "trace": trace,
            names::CARRIED: carried,
            names::CARRIER: self.carrier.is_some(),
        }});
        drop(guard);
        match &self.carrier {
            Some(c) if delivered => self.carry(c, step, t, ctx, rec, at).await,
            _ => Ok(rec),
        }
    }

    async fn keep(&self) {
        if let Some(sim) = self.sim.lock().await.take() {
            sim._ibsim.leave_running();
            for (_, sm) in sim.sms {
                sm.leave_running();
            }
        }
    }

    async fn control(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Option<Result<StepRecord, EnvError>> {
        match &step.action {
            Action::Probe(p) if p.path == PathKind::Ib && p.what == ProbeKind::Verbs => {
                Some(self.verbs(step, p, ctx, at).await)
            }
            Action::Probe(p) if p.path == PathKind::Ib => Some(self.probe(step, p, ctx, at).await),
            Action::Sm(sm) => Some(self.sm_control(step, sm, ctx, at).await),
            _ => None,
        }
    }

    async fn link_fault(
        &self,
        link: &str,
        action: FaultAction,
        percent: Option<f64>,
        _ctx: &mut StepCtx<'_>,
    ) -> Result<Vec<Value>, EnvError> {
        let guard = self.sim.lock().await;
        let Some(sim) = guard.as_ref() else {
            return Ok(vec![]);
        };
        let Some(ends) = self.links.get(link) else {
            return Ok(vec![]);
        };
        let commands: Vec<String> = match action {
            FaultAction::Down => vec![format!("Unlink \"{}\"[{}]", ends[0].0, ends[0].1)],
            FaultAction::Up => vec![format!("ReLink \"{}\"[{}]", ends[0].0, ends[0].1)],
            FaultAction::MadErrors => ends
                .iter()
                .map(|(n, p)| {
                    format!(
                        "Error \"{n}\"[{p}] {}",
                        percent.unwrap_or(0.0).round() as u32
                    )
                })
                .collect(),
            _ => vec![],
        };
        // ibsim acts on its console asynchronously, and the SM re-sweeps when the switches'
        // traps reach it: a lab that wants the healed subnet waits for it (and measures it).
        for c in &commands {
            self.console(sim, c).await?;
        }
        Ok(commands
            .into_iter()
            .map(|c| json!({"fabric": "ibsim", "console": c}))
            .collect())
    }
}

#[cfg(test)]
mod socket_tests {
    /// `/proc/net/unix` as a subnet pod showed it with ibsim and one client up.
    #[test]
    fn finds_the_control_sockets_inode_by_its_exact_name() {
        let unix = "Num       RefCount Protocol Flags    Type St Inode Path\n\
                    0000000000000000: 00000002 00000000 00000000 0002 01 40123 @iblab-r1:ctl\n\
                    0000000000000000: 00000002 00000000 00000000 0002 01 40124 @iblab-r1:in0\n\
                    0000000000000000: 00000002 00000000 00000000 0002 01 40200 @iblab-r1:ctlx\n";
        assert_eq!(super::ctl_inode(unix, "iblab-r1"), Some(40123));
        // As ibsim 0.10 bound them (IBSIM_SOCKNAME=t46, in a network namespace of this
        // host): the NUL it binds with shows as a trailing `@`.
        let captured = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            00000000b6e1b5a6: 00000002 00000000 00000000 0002 01 1603462 @t46:out1@\n\
            00000000a73a9893: 00000002 00000000 00000000 0002 01 1603460 @t46:ctl@\n";
        assert_eq!(super::ctl_inode(captured, "t46"), Some(1603460));
        assert_eq!(super::ctl_inode(captured, "t4"), None);
        assert_eq!(super::ctl_inode(unix, "iblab-r2"), None);
        assert_eq!(super::ctl_inode("", "iblab-r1"), None);
    }
}
