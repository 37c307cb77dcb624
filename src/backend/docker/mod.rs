//! The docker backend: every node and switch a container of the lab image (network none,
//! unprivileged), links veth pairs made from the host between the containers' network
//! namespaces, switches Linux bridges inside switch containers. Commands go through the
//! Engine API's exec. Everything carries the run's labels and is in the state file.

pub mod container;
pub mod engine;
pub mod exec;
pub mod labels;
pub mod sweep;

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::ListContainersOptions;

use super::{Backend, EnvError, local::ip_batch, wiring};
use crate::fault::Cmd;
use crate::plan::Plan;
use crate::run::process::{Background, ExecOutput};
use crate::run::state::{PREFIX, Resource, StateFile, start_ticks_of};
use engine::Engine;

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
            .ok_or_else(|| EnvError("the docker backend was used before provisioning".into()))
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

    /// Wait until every lab interface has carrier (and spanning tree, where a segment has
    /// a loop, has settled), so the first step meets live links.
    async fn wait_links_up(&self, plan: &Plan) -> Result<(), EnvError> {
        let limit = if plan.nodes.iter().any(|n| n.stp) {
            20
        } else {
            5
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(limit);
        let cmd = |argv: &[&str]| Cmd {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdin: None,
            may_fail: false,
        };
        let (ip, bridge) = (
            cmd(&["ip", "-j", "link", "show"]),
            cmd(&["bridge", "-j", "link", "show"]),
        );
        loop {
            let shown = futures_util::future::join_all(plan.nodes.iter().map(|n| {
                let (ip, bridge) = (&ip, &bridge);
                async move {
                    let out = self.exec(&n.name, ip, Duration::from_secs(5)).await?;
                    let mut down = wiring::links_down(n, &out.stdout);
                    if n.stp {
                        let out = self.exec(&n.name, bridge, Duration::from_secs(5)).await?;
                        down.extend(wiring::stp_unsettled(n, &out.stdout));
                    }
                    Ok::<_, EnvError>(down)
                }
            }))
            .await;
            let mut down = Vec::new();
            for s in shown {
                down.extend(s?);
            }
            if down.is_empty() {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(EnvError(format!(
                    "links did not come up within {limit}s: {}",
                    down.join(", ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A failed command may mean a node died: then the run cannot go on (exit 3).
    async fn check_alive(&self, engine: &Engine) -> Result<(), EnvError> {
        let stopped = self.stopped_containers(engine).await;
        if stopped.is_empty() {
            Ok(())
        } else {
            Err(EnvError(format!(
                "a lab container stopped during the run: {}",
                stopped.join("; ")
            )))
        }
    }
}

#[async_trait]
impl Backend for Docker {
    fn name(&self) -> &'static str {
        "docker"
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
        let image = crate::image::ensure(engine, &|m| eprintln!("{m}")).await?;
        let devices = container::rdma_devices();
        // 1. Containers, each written down before it is created.
        for n in &plan.nodes {
            state
                .record(Resource::Container {
                    name: self.container(&n.name),
                })
                .map_err(|e| EnvError(format!("cannot write the state file: {e}")))?;
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
                };
                async move { container::create_and_start(&engine.docker, &spec).await }
            }))
            .await;
        let problems: Vec<String> = created.into_iter().filter_map(Result::err).collect();
        if !problems.is_empty() {
            return Err(EnvError(format!(
                "provisioning failed: {}",
                problems.join("; ")
            )));
        }
        // 2. veth pairs from the host, each end made inside its container's namespace.
        let mut pids = HashMap::new();
        for (n, name) in plan.nodes.iter().zip(&names) {
            let pid = container::pid(&engine.docker, name)
                .await
                .map_err(EnvError)?;
            pids.insert(n.name.clone(), pid);
        }
        let pid_of = |node: &str| pids.get(node).map(u32::to_string).unwrap_or_default();
        ip_batch(None, &wiring::veth_lines(plan, pid_of)).await?;
        // 3. Inside each container: loopback, bridge, ports, addresses (ip -batch on stdin).
        let configured = futures_util::future::join_all(plan.nodes.iter().map(|n| async move {
            let script = wiring::node_lines(n).join("\n") + "\n";
            let cmd = Cmd {
                argv: vec!["ip".into(), "-batch".into(), "-".into()],
                stdin: Some(script),
                may_fail: false,
            };
            match self.exec(&n.name, &cmd, Duration::from_secs(30)).await {
                Ok(o) if o.success() => Ok(()),
                Ok(o) => Err(EnvError(format!(
                    "provisioning failed: `ip -batch -` in {} said: {}",
                    n.name,
                    o.stderr.trim()
                ))),
                Err(e) => Err(e),
            }
        }))
        .await;
        configured.into_iter().collect::<Result<Vec<()>, _>>()?;
        self.wait_links_up(plan).await
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
                Err(EnvError(format!(
                    "cannot run `{}` on {node} (container {container}): {e}",
                    cmd.argv.join(" ")
                )))
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
                return Err(EnvError(format!(
                    "cannot start `{}` on {node} (container {container}): {e}",
                    argv.join(" ")
                )));
            }
        };
        // Its host pid, so teardown can stop it even if the container outlives the run.
        if let Some(t) = start_ticks_of(pid) {
            state
                .record(Resource::Process {
                    pid,
                    start_ticks: t,
                })
                .map_err(|e| EnvError(format!("cannot write the state file: {e}")))?;
        }
        Ok(Background::adopt(pid, Some(pump)))
    }
}
