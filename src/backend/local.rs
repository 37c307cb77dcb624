//! The local backend: every node and switch a network namespace on this host, links veth
//! pairs, switches Linux bridges. Nothing is created in the host's own namespace and no
//! lab namespace has a default route, so lab traffic cannot leave.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use super::{Backend, EnvError, wiring};
use crate::fault::Cmd;
use crate::plan::Plan;
use crate::run::process::{self, Background, ExecOutput};
use crate::run::state::{PREFIX, Resource, StateFile, start_ticks_of};

pub struct Local {
    run_id: String,
}

impl Local {
    /// Wait until every lab interface reports carrier (operstate UP), so the first step
    /// never meets a link that is still coming up.
    async fn wait_links_up(&self, plan: &Plan) -> Result<(), EnvError> {
        // Spanning tree needs two forward delays (listening, learning) before it forwards.
        let limit = if plan.nodes.iter().any(|n| n.stp) {
            20
        } else {
            5
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(limit);
        loop {
            let mut down = Vec::new();
            for n in &plan.nodes {
                let ns = self.namespace(&n.name);
                let out = run_tool(&["ip", "-n", &ns, "-j", "link", "show"]).await?;
                down.extend(wiring::links_down(n, &out));
                if n.stp {
                    let out = run_tool(&["bridge", "-n", &ns, "-j", "link", "show"]).await?;
                    down.extend(wiring::stp_unsettled(n, &out));
                }
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

    pub fn new(run_id: &str) -> Local {
        Local {
            run_id: run_id.to_string(),
        }
    }

    /// The namespace a node or switch lives in.
    pub fn namespace(&self, node: &str) -> String {
        format!("{PREFIX}{}-{node}", self.run_id)
    }

    fn wrap(&self, node: &str, argv: &[String]) -> Vec<String> {
        let mut v = vec![
            "ip".to_string(),
            "netns".into(),
            "exec".into(),
            self.namespace(node),
        ];
        v.extend(argv.iter().cloned());
        v
    }
}

/// Run `cmd` inside the host network namespace `ns` (node `node`'s home).
pub async fn exec_in_namespace(
    ns: &str,
    node: &str,
    cmd: &Cmd,
    timeout: Duration,
) -> Result<ExecOutput, EnvError> {
    let mut argv = vec![
        "ip".to_string(),
        "netns".into(),
        "exec".into(),
        ns.to_string(),
    ];
    argv.extend(cmd.argv.iter().cloned());
    process::run(&argv, cmd.stdin.as_deref(), timeout)
        .await
        .map_err(|e| {
            EnvError(format!(
                "cannot run `{}` on {node}: {e}",
                cmd.argv.join(" ")
            ))
        })
}

/// Run a host tool briefly and return what it printed.
async fn run_tool(argv: &[&str]) -> Result<String, EnvError> {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let out = process::run(&argv, None, Duration::from_secs(5))
        .await
        .map_err(|e| EnvError(format!("cannot run {}: {e}", argv[0])))?;
    Ok(out.stdout)
}

/// Run `ip -batch -` with the given lines (in namespace `ns` when given).
pub async fn ip_batch(ns: Option<&str>, lines: &[String]) -> Result<(), EnvError> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut argv: Vec<String> = vec!["ip".into()];
    if let Some(ns) = ns {
        argv.extend(["-n".into(), ns.to_string()]);
    }
    argv.extend(["-batch".into(), "-".into()]);
    let script = lines.join("\n") + "\n";
    let out = process::run(&argv, Some(&script), Duration::from_secs(30))
        .await
        .map_err(|e| EnvError(format!("cannot run ip (iproute2): {e}")))?;
    if !out.success() {
        return Err(EnvError(format!(
            "provisioning failed: `{}` said: {}",
            argv.join(" "),
            out.stderr.trim()
        )));
    }
    Ok(())
}

#[async_trait]
impl Backend for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn provision(&self, plan: &Plan, state: &StateFile) -> Result<(), EnvError> {
        let record = |r| {
            state
                .record(r)
                .map_err(|e| EnvError(format!("cannot write the state file: {e}")))
        };
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
        self.wait_links_up(plan).await
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
        let bg = Background::start(&self.wrap(node, argv), log)
            .map_err(|e| EnvError(format!("cannot start `{}` on {node}: {e}", argv.join(" "))))?;
        if let Some(t) = start_ticks_of(bg.pid) {
            state
                .record(Resource::Process {
                    pid: bg.pid,
                    start_ticks: t,
                })
                .map_err(|e| EnvError(format!("cannot write the state file: {e}")))?;
        }
        Ok(bg)
    }
}
