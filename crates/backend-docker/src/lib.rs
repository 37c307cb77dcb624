//! The docker backend: every node and switch a container of the lab image (network none,
//! unprivileged), links veth pairs made from the host between the containers' network
//! namespaces, switches Linux bridges inside switch containers. Commands go through the
//! Engine API's exec. Everything carries the run's labels and is in the state file.

mod checks;
pub mod container;
pub mod engine;
pub mod exec;
pub mod image;
pub mod labels;
pub mod sweep;

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;

use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::ListContainersOptions;
use iblab_core::plan::backend::{Backend, Unfit};

use engine::Engine;
use iblab_backend::{BackendOps, Deployment, EnvError, EnvKind, NoWayIn, Scope, Swept};
use iblab_core::caps::HostCaps;
use iblab_core::caps::preflight::{Check, Mark};
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::plan::Plan;
use iblab_core::plan::backend::{Traits, rxe_per_namespace};
use iblab_core::programs::{Needs, Place, Provider};
use iblab_lab::PathKind;
use iblab_sys::pid::start_ticks_of;
use iblab_sys::process::Background;
use iblab_sys::state::Owned;
use iblab_sys::state::{PREFIX, Resource, StateFile};
use iblab_wiring::{self as wiring, IP, ip_batch};

/// The docker backend, as registered in the binary's list of backends.
pub struct DockerBackend;
pub static BACKEND: DockerBackend = DockerBackend;

/// What the state file calls a container of this backend.
const CONTAINER: &str = "container";

impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }
    fn about(&self) -> &'static str {
        "containers through the Docker Engine API (a local engine; needs root for the links)"
    }
    fn traits(&self) -> Traits {
        Traits {
            auto: false,
            own_kernel: false,
            verbs_in_nodes: false,
            nic: "veth",
            tcp_carrier: "the kernel TCP stack on veth links between containers (no NIC)",
            traffic_slack_s: 0,
        }
    }
    fn available(&self, caps: &HostCaps) -> Result<String, Unfit> {
        match &caps.docker_socket {
            Some(socket) => Ok(format!(
                ": nodes and switches are containers of {} on the engine at {}, {}",
                iblab_core::images::lab(),
                socket.display(),
                container::privileges_in_words(&caps.rdma_device_files)
            )),
            None => Err(format!(
                "no Docker engine here (no socket at {})\n  fix: {}",
                engine::socket_path().display(),
                engine::FIX
            )
            .into()),
        }
    }
    fn carries(&self, path: PathKind, caps: &HostCaps) -> Result<(), Unfit> {
        match path {
            // The emulated subnet runs in a namespace of its own on the host, next to the
            // containers; only its data-path verdict concerns the nodes.
            PathKind::Tcp | PathKind::Ib => Ok(()),
            // Natively where the host kernel's rxe serves every namespace (Linux ≥ 7.1); the
            // containers get /dev/infiniband for their verbs.
            PathKind::Roce => rxe_per_namespace(caps, "containers"),
        }
    }
    fn needs_root(&self) -> Option<&'static str> {
        Some("links containers with veth pairs made from the host")
    }
    fn programs(&self, plan: &Plan, needs: &mut Needs) {
        wiring::programs(plan, needs, "the docker backend");
        // The host makes the veths; in the containers the tools come with the lab image,
        // `sleep` keeps each one up and `ip` wires it.
        needs.add(Place::Host, IP, "the docker backend");
        needs.add(Place::Nodes, IP, "the docker backend");
        needs.add(Place::Nodes, container::IDLE, "the docker backend");
    }
    fn provider(&self, place: Place) -> Provider {
        match place {
            Place::Nodes => crate::image::PROVIDER,
            // The emulated subnet runs in a namespace of this host, next to the containers.
            Place::Host | Place::Subnet => Provider::Host,
        }
    }
    fn iblab_path(&self) -> String {
        // This binary's folder, mounted into the containers of a lab that runs iblab.
        iblab_core::images::in_node_exe()
    }
    fn iblab_in_nodes(&self) -> Option<String> {
        Some(format!(
            "this binary with its libraries, from a folder in {} bind-mounted read-only at {}",
            crate::image::rootfs::cache_dir().display(),
            iblab_core::images::IN_NODE
        ))
    }
    fn rdma_device(&self, run: Option<&str>, node: &str, index: usize) -> String {
        // Containers share the host kernel, and with it one set of device names, with
        // every other run on this host.
        iblab_core::plan::backend::shared_kernel_rdma_device(run, node, index)
    }
}

#[async_trait]
impl BackendOps for DockerBackend {
    fn preflight(&self, caps: &HostCaps) -> Vec<Check> {
        checks::softroce_in_docker(caps)
    }
    fn doctor(&self, caps: &HostCaps) -> Vec<Check> {
        doctor_rows(caps)
    }
    fn instantiate(&self, run_id: &str) -> Result<Box<dyn Deployment>, EnvError> {
        Ok(Box::new(Docker::new(run_id)))
    }
    fn way_in(
        &self,
        run_id: &str,
        node: &str,
        argv: &[String],
        tty: bool,
    ) -> Result<Vec<String>, NoWayIn> {
        // The engine's exec, through the docker CLI (it streams and gives a terminal).
        let Some(docker) = iblab_sys::host::which("docker") else {
            return Err(NoWayIn::ProgramMissing(
                "the docker CLI is not installed (apt-get install docker.io), or run the \
                 command through the Engine API yourself",
            ));
        };
        let mut v = vec![
            docker.to_string_lossy().into_owned(),
            "-H".into(),
            format!("unix://{}", engine::socket_path().display()),
            "exec".into(),
            if tty { "-it" } else { "-i" }.into(),
            Docker::new(run_id).container(node),
        ];
        v.extend(argv.iter().cloned());
        Ok(v)
    }
    async fn undo(&self, owned: &[Owned]) -> Vec<String> {
        let names: Vec<String> = owned
            .iter()
            .filter(|o| o.what == CONTAINER)
            .map(|o| o.name.clone())
            .collect();
        if names.is_empty() {
            return vec![];
        }
        match engine::connect().await {
            Ok(e) => sweep::remove(&e, &names).await,
            Err(err) => vec![format!(
                "cannot reach the Docker engine to remove container(s) {}: {err}",
                names.join(", ")
            )],
        }
    }
    async fn sweep(&self, scope: &Scope<'_>) -> Swept {
        // No engine here means nothing to sweep. The engine is this machine's own: its
        // crashed runs are swept whatever state folder started them.
        let Ok(engine) = engine::connect().await else {
            return Swept::default();
        };
        sweep::sweep_labelled(&engine, scope.spare).await
    }
}

pub struct Docker {
    run_id: String,
    engine: OnceLock<Engine>,
}

impl Docker {
    pub fn new(run_id: &str) -> Docker {
        Docker {
            run_id: run_id.to_string(),
            engine: OnceLock::new(),
        }
    }

    /// The container a node or switch is.
    pub fn container(&self, node: &str) -> String {
        format!("{PREFIX}{}-{node}", self.run_id)
    }

    fn engine(&self) -> Result<&Engine, EnvError> {
        self.engine
            .get()
            .ok_or_else(|| EnvError::new("the docker backend was used before provisioning"))
    }

    /// Containers of this run that are no longer running, with how they ended.
    async fn stopped_containers(&self, engine: &Engine) -> Vec<String> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{}={}", labels::RUN, self.run_id)],
        )]);
        let Ok(list) = engine
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
        else {
            return vec![];
        };
        list.iter()
            .filter(|c| !matches!(c.state, Some(ContainerSummaryStateEnum::RUNNING)))
            .map(|c| {
                let node = c
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::NODE))
                    .cloned()
                    .unwrap_or_default();
                format!(
                    "node {node} (container {}) {}",
                    c.names
                        .as_ref()
                        .and_then(|n| n.first())
                        .map(|n| n.trim_start_matches('/'))
                        .unwrap_or("?"),
                    c.status.as_deref().unwrap_or("is not running")
                )
            })
            .collect()
    }

    /// A failed command may mean a node died: then the run cannot go on (exit 3).
    async fn check_alive(&self, engine: &Engine) -> Result<(), EnvError> {
        let stopped = self.stopped_containers(engine).await;
        if stopped.is_empty() {
            Ok(())
        } else {
            Err(EnvError::of(
                EnvKind::NodeGone,
                format!(
                    "a lab container stopped during the run: {}",
                    stopped.join("; ")
                ),
            ))
        }
    }
}

#[async_trait]
impl Deployment for Docker {
    fn backend(&self) -> &'static dyn BackendOps {
        &BACKEND
    }

    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        let engine = engine::connect().await?;
        let engine = self.engine.get_or_init(|| engine);
        eprintln!(
            "docker engine {} (API {}) at {}",
            engine.version,
            engine.api,
            engine.socket.display()
        );
        // On a terminal every word of a first-use build shows (the spinner says what runs
        // now); elsewhere its first line only: which image, and that it is being built.
        let first = std::sync::atomic::AtomicBool::new(true);
        let say = |m: &str| {
            if iblab_sys::progress::on_terminal() {
                iblab_sys::progress::say(m);
                iblab_sys::progress::detail(m);
            } else if first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                eprintln!("{m}");
            }
        };
        let image = crate::image::ensure(engine, &say).await?;
        let devices = container::rdma_devices();
        let bundle = if plan.runs_iblab_in_nodes(&iblab_core::images::in_node_exe()) {
            let cache = crate::image::rootfs::cache_dir();
            std::fs::create_dir_all(&cache)
                .map_err(|e| EnvError::caused(format!("cannot create {}", cache.display()), e))?;
            Some(iblab_wiring::bundle::cached(&cache).map_err(|e| {
                EnvError::caused(format!("cannot bring iblab into the containers: {e}"), e)
            })?)
        } else {
            None
        };
        // 1. Containers, each written down before it is created.
        for n in &plan.nodes {
            state
                .record(Resource::Owned(Owned {
                    backend: BACKEND.name().into(),
                    what: CONTAINER.into(),
                    name: self.container(&n.name),
                }))
                .map_err(EnvError::state)?;
        }
        let names: Vec<String> = plan.nodes.iter().map(|n| self.container(&n.name)).collect();
        let created =
            futures_util::future::join_all(plan.nodes.iter().zip(&names).map(|(n, name)| {
                let spec = container::Spec {
                    name,
                    node: &n.name,
                    switch: n.switch,
                    image: &image.reference,
                    run_id: &self.run_id,
                    lab: &plan.lab,
                    devices: &devices,
                    iblab: bundle.as_deref(),
                };
                async move { container::create_and_start(&engine.docker, &spec).await }
            }))
            .await;
        let mut problems: Vec<container::ContainerError> =
            created.into_iter().filter_map(Result::err).collect();
        if !problems.is_empty() {
            let said: Vec<String> = problems.iter().map(|e| e.to_string()).collect();
            let first = problems.swap_remove(0);
            return Err(
                EnvError::new(format!("provisioning failed: {}", said.join("; "))).because(first),
            );
        }
        // 2. veth pairs from the host, each end made inside its container's namespace.
        let mut pids = HashMap::new();
        for (n, name) in plan.nodes.iter().zip(&names) {
            let pid = container::pid(&engine.docker, name).await?;
            pids.insert(n.name.clone(), pid);
        }
        let pid_of = |node: &str| pids.get(node).map(u32::to_string).unwrap_or_default();
        ip_batch(None, &wiring::veth_lines(plan, pid_of)).await?;
        // 3. Inside each container: loopback, bridge, ports, addresses (ip -batch on stdin).
        let configured = futures_util::future::join_all(plan.nodes.iter().map(|n| async move {
            let script = wiring::node_lines(n).join("\n") + "\n";
            let cmd = Cmd {
                argv: vec![IP.into(), "-batch".into(), "-".into()],
                stdin: Some(script),
                may_fail: false,
            };
            match self.exec(&n.name, &cmd, Duration::from_secs(30)).await {
                Ok(o) if o.success() => Ok(()),
                Ok(o) => Err(EnvError::new(format!(
                    "provisioning failed: `ip -batch -` in {} said: {}",
                    n.name,
                    o.stderr.trim()
                ))),
                Err(e) => Err(e),
            }
        }))
        .await;
        configured.into_iter().collect::<Result<Vec<()>, _>>()?;
        wiring::wait_links_up(self, &plan.nodes.iter().collect::<Vec<_>>()).await
    }

    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        let engine = self.engine()?;
        let container = self.container(node);
        match exec::run(&engine.docker, &container, cmd, timeout).await {
            Ok(out) => {
                if !out.success() {
                    self.check_alive(engine).await?;
                }
                Ok(out)
            }
            Err(e) => {
                self.check_alive(engine).await?;
                Err(EnvError::caused(
                    format!(
                        "cannot run `{}` on {node} (container {container}): {e}",
                        cmd.argv.join(" ")
                    ),
                    e,
                ))
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
        let engine = self.engine()?;
        let container = self.container(node);
        let (pid, pump) = match exec::spawn(&engine.docker, &container, argv, log).await {
            Ok(started) => started,
            Err(e) => {
                self.check_alive(engine).await?;
                return Err(EnvError::caused(
                    format!(
                        "cannot start `{}` on {node} (container {container}): {e}",
                        argv.join(" ")
                    ),
                    e,
                ));
            }
        };
        // Its host pid, so teardown can stop it even if the container outlives the run.
        if let Some(t) = start_ticks_of(pid) {
            state
                .record(Resource::Process {
                    pid,
                    start_ticks: t,
                })
                .map_err(EnvError::state)?;
        }
        Ok(Background::adopt(pid, Some(pump)))
    }
}

/// The docker backend's rows: socket, engine and API versions, the lab image and its labels.
pub fn doctor_rows(c: &HostCaps) -> Vec<Check> {
    use crate::image::{self, label};
    let socket = engine::socket_path();
    let mut rows = vec![row(
        c.docker_socket.is_some(),
        "docker socket",
        match &c.docker_socket {
            Some(p) => p.display().to_string(),
            None => format!("none at {} → {}", socket.display(), engine::FIX),
        },
    )];
    if c.docker_socket.is_none() {
        return rows;
    }
    let probed = engine::blocking(|| async {
        let e = engine::connect().await?;
        let img = image::find(&e.docker, &iblab_core::images::lab()).await?;
        Ok::<_, EnvError>((e, img))
    });
    match probed {
        Ok(Ok((e, img))) => {
            rows.push(row(
                true,
                "engine",
                format!("Docker {} at {}", e.version, e.socket.display()),
            ));
            let negotiated = e.docker.client_version();
            rows.push(row(
                true,
                "API version",
                format!(
                    "{} (engine's; iblab speaks {}.{}, needs {}.{}+)",
                    e.api,
                    negotiated.major_version,
                    negotiated.minor_version,
                    engine::MIN_API.0,
                    engine::MIN_API.1
                ),
            ));
            match img {
                Some(i) => {
                    rows.push(row(true, "lab image", i.summary()));
                    for k in [label::PACKAGES, label::CONTENT, label::SUITE, label::MISSING] {
                        if let Some(v) = i.labels.get(k) {
                            rows.push(row(true, "", format!("{k}={v}")));
                        }
                    }
                }
                None => rows.push(row(
                    false,
                    "lab image",
                    format!(
                        "{} not built → `sudo iblab image build` (or the first `up --backend docker` builds it)",
                        iblab_core::images::lab()
                    ),
                )),
            }
        }
        Ok(Err(e)) => rows.push(row(false, "engine", e.to_string())),
        Err(e) => rows.push(row(false, "engine", e.to_string())),
    }
    rows.push(row(
        c.has("debootstrap"),
        "debootstrap",
        if c.has("debootstrap") {
            "present (builds the lab image)".to_string()
        } else {
            "missing → apt-get install debootstrap (or `iblab image build --from host`)".to_string()
        },
    ));
    rows
}

fn row(ok: bool, name: &'static str, text: impl Into<String>) -> Check {
    Check {
        name,
        mark: if ok { Mark::Ok } else { Mark::Fail },
        text: text.into(),
    }
}
