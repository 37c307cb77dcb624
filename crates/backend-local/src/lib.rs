//! The local backend: every node and switch a network namespace on this host, links veth
//! pairs, switches Linux bridges. Nothing is created in the host's own namespace and no
//! lab namespace has a default route, so lab traffic cannot leave.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use iblab_core::plan::backend::{Backend, Unfit};

use iblab_backend::{BackendOps, Deployment, EnvError, NoWayIn};
use iblab_core::caps::HostCaps;
use iblab_core::caps::preflight::{Check, Mark};
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::plan::Plan;
use iblab_core::plan::backend::{Traits, rxe_per_namespace};
use iblab_core::programs::{Needs, Place};
use iblab_lab::PathKind;
use iblab_sys::pid::start_ticks_of;
use iblab_sys::process::{self, Background};
use iblab_sys::state::{PREFIX, Resource, StateFile};
use iblab_wiring::{self as wiring, IP, ip_batch};

/// The local backend, as registered in the binary's list of backends.
pub struct LocalBackend;
pub static BACKEND: LocalBackend = LocalBackend;

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }
    fn about(&self) -> &'static str {
        "network namespaces on this host (needs root)"
    }
    fn traits(&self) -> Traits {
        Traits {
            auto: true,
            own_kernel: false,
            verbs_in_nodes: false,
            nic: "veth",
            tcp_carrier: "the kernel TCP stack on veth links between network namespaces (no NIC)",
            traffic_slack_s: 0,
        }
    }
    fn available(&self, caps: &HostCaps) -> Result<String, Unfit> {
        match caps.netns {
            true => Ok(String::new()),
            false => {
                Err("the local backend needs network namespaces, which this kernel lacks".into())
            }
        }
    }
    fn carries(&self, path: PathKind, caps: &HostCaps) -> Result<(), Unfit> {
        match path {
            PathKind::Tcp | PathKind::Ib => Ok(()),
            // Natively where the host kernel's rxe serves every namespace (Linux ≥ 7.1).
            PathKind::Roce => rxe_per_namespace(caps, "the nodes (namespaces)"),
        }
    }
    fn needs_root(&self) -> Option<&'static str> {
        Some("creates network namespaces")
    }
    fn programs(&self, plan: &Plan, needs: &mut Needs) {
        // Namespaces, veth pairs and bridges, and every command on a node through
        // `ip netns exec`; teardown deletes the namespaces with it too.
        needs.add(Place::Host, IP, "the local backend");
        wiring::programs(plan, needs, "the local backend");
    }
    fn rdma_device(&self, run: Option<&str>, node: &str, index: usize) -> String {
        // Every namespace shares the host kernel, and with it one set of device names,
        // with every other run on this host.
        iblab_core::plan::backend::shared_kernel_rdma_device(run, node, index)
    }
}

#[async_trait]
impl BackendOps for LocalBackend {
    fn preflight(&self, caps: &HostCaps) -> Vec<Check> {
        iblab_sys::host::softroce_on_host(caps)
    }
    fn doctor(&self, caps: &HostCaps) -> Vec<Check> {
        let feature = |name: &'static str, f: iblab_core::caps::Feature, fix: &str| Check {
            name,
            mark: if f.usable() { Mark::Ok } else { Mark::Fail },
            text: if f.usable() {
                format!("{f:?}").to_lowercase()
            } else {
                format!("{f:?} → {fix}").to_lowercase()
            },
        };
        vec![
            Check {
                name: "netns",
                mark: if caps.netns { Mark::Ok } else { Mark::Fail },
                text: if caps.netns {
                    "present".into()
                } else {
                    "absent: the kernel lacks network namespaces".into()
                },
            },
            Check {
                name: "root",
                mark: if caps.root { Mark::Ok } else { Mark::Fail },
                text: if caps.root {
                    "yes".into()
                } else {
                    "no → run with sudo".into()
                },
            },
            feature("veth", caps.veth, "a kernel with CONFIG_VETH"),
            feature("bridge", caps.bridge, "a kernel with CONFIG_BRIDGE"),
            iblab_core::caps::preflight::tool_check(caps, IP),
        ]
    }
    fn instantiate(&self, run_id: &str) -> Result<Box<dyn Deployment>, EnvError> {
        Ok(Box::new(Local::new(run_id)))
    }
    fn way_in(
        &self,
        run_id: &str,
        node: &str,
        argv: &[String],
        _tty: bool,
    ) -> Result<Vec<String>, NoWayIn> {
        // The namespace is all a node is: the host's programs run inside it.
        Ok(Local::new(run_id).wrap(node, argv))
    }
}

/// iproute2's `ip`: every namespace, veth and bridge, and the way into a node.
pub struct Local {
    run_id: String,
}

impl Local {
    pub fn new(run_id: &str) -> Local {
        Local {
            run_id: run_id.to_string(),
        }
    }

    /// The namespace a node or switch lives in.
    pub fn namespace(&self, node: &str) -> String {
        format!("{PREFIX}{}-{node}", self.run_id)
    }

    pub fn wrap(&self, node: &str, argv: &[String]) -> Vec<String> {
        let mut v = vec![
            IP.to_string(),
            "netns".into(),
            "exec".into(),
            self.namespace(node),
        ];
        v.extend(argv.iter().cloned());
        v
    }
}

/// Run `cmd` inside the host network namespace `ns` (where node `node` lives).
pub async fn exec_in_namespace(
    ns: &str,
    node: &str,
    cmd: &Cmd,
    timeout: Duration,
) -> Result<ExecOutput, EnvError> {
    let mut argv = vec![
        IP.to_string(),
        "netns".into(),
        "exec".into(),
        ns.to_string(),
    ];
    argv.extend(cmd.argv.iter().cloned());
    process::run(&argv, cmd.stdin.as_deref(), timeout)
        .await
        .map_err(|e| {
            EnvError::not_started(
                format!("cannot run `{}` on {node}: {e}", cmd.argv.join(" ")),
                e,
            )
        })
}

#[async_trait]
impl Deployment for Local {
    fn backend(&self) -> &'static dyn BackendOps {
        &BACKEND
    }

    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        let record = |r| state.record(r).map_err(EnvError::state);
        // 1. Namespaces, written down first.
        let mut adds = Vec::new();
        for n in &plan.nodes {
            let ns = self.namespace(&n.name);
            record(Resource::Netns { name: ns.clone() })?;
            adds.push(format!("netns add {ns}"));
        }
        ip_batch(None, &adds).await?;
        // 2. veth pairs, created directly inside their namespaces.
        let veths = wiring::veth_lines(plan, |n| self.namespace(n));
        ip_batch(None, &veths).await?;
        // 3. Inside each namespace: loopback, bridge, ports, addresses.
        for n in &plan.nodes {
            ip_batch(Some(&self.namespace(&n.name)), &wiring::node_lines(n)).await?;
        }
        wiring::wait_links_up(self, &plan.nodes.iter().collect::<Vec<_>>()).await
    }

    async fn exec(&self, node: &str, cmd: &Cmd, timeout: Duration) -> Result<ExecOutput, EnvError> {
        exec_in_namespace(&self.namespace(node), node, cmd, timeout).await
    }

    async fn spawn(
        &self,
        node: &str,
        argv: &[String],
        log: &Path,
        state: &StateFile,
    ) -> Result<Background, EnvError> {
        let bg = Background::start(&self.wrap(node, argv), log).map_err(|e| {
            EnvError::not_started(
                format!("cannot start `{}` on {node}: {e}", argv.join(" ")),
                e,
            )
        })?;
        if let Some(t) = start_ticks_of(bg.pid) {
            state
                .record(Resource::Process {
                    pid: bg.pid,
                    start_ticks: t,
                })
                .map_err(EnvError::state)?;
        }
        Ok(bg)
    }
}
