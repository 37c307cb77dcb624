//! The softroce fabric (path ② roce): an rxe device on every addressed interface of every
//! node (`rdma link add`), its IPv4-mapped RoCEv2 GID index found in `ibv_devinfo -v`, and
//! traffic measured with perftest (bandwidth, latency) and rping (RDMA CM connection).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;

use super::Fabric;
use crate::ctx::{StepCtx, excerpt, write_log};
use crate::rdma_counters;
use iblab_backend::EnvError;
use iblab_core::command::Cmd;
use iblab_core::command::ExecOutput;
use iblab_core::counters;
use iblab_core::evidence::blank;
use iblab_core::evidence::detail::Exchange as Exchanged;
use iblab_core::evidence::{DeviceUse, Metric, Provenance, ProvenanceKind, StepRecord, Verdict};
use iblab_core::plan::PlannedNode;
use iblab_core::plan::{Action, PlannedStep, Probe, Traffic};
use iblab_lab::names;
use iblab_lab::{Exchange, PathKind, ProbeKind, TrafficTest};
use iblab_sys::process::Stopped;
use iblab_tools::{ibv_devinfo, perftest};

mod adapter;
pub(crate) mod capture;

/// perftest's out-of-band port inside the lab.
const PERFTEST_PORT: u16 = 18515;
/// Retries of the RC transport before a completion error (perftest's default 7 is
/// "forever" on rxe: a cut link would hang the tool).
const RETRY_COUNT: &str = "3";

/// One verbs device of a node: an rxe the fabric made, or the adapter the node was given.
#[derive(Debug, Clone)]
struct Rxe {
    device: String,
    /// The address its RoCEv2 GID is derived from (empty on InfiniBand).
    ipv4: String,
    /// The GID perftest addresses with (`-x`); `None` on InfiniBand (a LID).
    gid_index: Option<u32>,
    port: u8,
    active_mtu: Option<u32>,
}

/// An adapter every node was given by its backend (a device plugin's resource in each
/// pod), which carries one path instead of an rxe per interface.
#[derive(Debug, Clone)]
pub struct Adapter {
    pub device: String,
    pub port: u8,
    pub path: PathKind,
}

/// What the adapter turned out to be, found in the first node at setup.
#[derive(Debug, Clone, Default)]
struct AdapterFacts {
    /// A software device (a Soft-RoCE stand-in for an adapter): its sysfs entry is
    /// virtual, not on a bus.
    software: bool,
    sysfs: String,
}

/// What the fabric starts in the nodes: `rdma` makes the devices, `ibv_devinfo` waits for
/// and describes them, `cat` and `grep` read limits, results and rxe's counters, a shell
/// reads the GIDs; then perftest's tools and rping.
const RDMA: &str = "rdma";
const IBV_DEVINFO: &str = "ibv_devinfo";
const CAT: &str = "cat";
const GREP: &str = "grep";
const SH: &str = "sh";
const RPING: &str = "rping";
/// What a `capture` step watches the sender's cable with.
const TCPDUMP: &str = "tcpdump";

/// What path ② starts in the nodes for this plan, and path ③ where its bytes ride the
/// same rxe devices (a backend whose nodes have verbs devices).
pub fn programs(plan: &iblab_core::plan::Plan, needs: &mut iblab_core::programs::Needs) {
    use iblab_core::programs::Place;
    let on_hca = |p: PathKind| plan.hca.as_ref().is_some_and(|h| h.path == p);
    let roce = plan.paths.contains(&PathKind::Roce) && !on_hca(PathKind::Roce);
    let ib = plan.paths.contains(&PathKind::Ib)
        && !on_hca(PathKind::Ib)
        && plan.backend_traits.verbs_in_nodes;
    if !roce && !ib {
        return;
    }
    let by = "fabric softroce";
    needs.add_all(Place::Nodes, &[RDMA, IBV_DEVINFO, CAT, GREP, SH], by);
    needs.add_all(Place::Nodes, crate::listener::PROGRAMS, by);
    for s in plan.steps.iter().filter(|s| s.skip.is_none()) {
        let ours = match s.path {
            Some(PathKind::Roce) => roce,
            Some(PathKind::Ib) => ib,
            _ => false,
        };
        if let Action::Probe(Probe {
            what: ProbeKind::Verbs,
            ..
        }) = &s.action
            && ours
        {
            needs.add(Place::Nodes, plan.backend_facts.iblab.as_str(), by);
        }
        if let Action::Traffic(t) = &s.action
            && ours
        {
            if t.capture {
                needs.add(Place::Nodes, TCPDUMP, by);
            }
            match t.test {
                TrafficTest::Connect => needs.add(Place::Nodes, RPING, by),
                test => needs.add(
                    Place::Nodes,
                    iblab_tools::perftest::program(t.verb.as_str(), test == TrafficTest::Bandwidth),
                    by,
                ),
            }
        }
    }
}

/// Soft-RoCE (rdma_rxe) on the lab's Ethernet interfaces; or, on an adapter the nodes
/// were given ([`SoftRoce::on_adapter`]), the same verbs traffic over it.
#[derive(Default)]
pub struct SoftRoce {
    devices: Mutex<HashMap<String, Vec<Rxe>>>,
    adapter: Option<Adapter>,
    facts: Mutex<Option<AdapterFacts>>,
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

fn cmd(argv: Vec<String>) -> Cmd {
    Cmd {
        argv,
        stdin: None,
        may_fail: false,
    }
}

impl SoftRoce {
    /// The verbs engine on an adapter each node was given, instead of rxe it makes.
    pub fn on_adapter(adapter: Adapter) -> SoftRoce {
        SoftRoce {
            adapter: Some(adapter),
            ..Default::default()
        }
    }

    /// Where a figure measured on this engine's devices comes from.
    fn provenance(&self, what: String, ctx: &StepCtx<'_>) -> Option<Provenance> {
        let Some(a) = &self.adapter else {
            return soft(format!(
                "{what} over rxe (Soft-RoCE, RoCEv2) on the {} backend: real verbs and RoCEv2 packets, but the kernel does the transport work a HCA would offload",
                ctx.plan.backend
            ));
        };
        let facts = self
            .facts
            .lock()
            .ok()
            .and_then(|f| f.clone())
            .unwrap_or_default();
        let given = format!(
            "{} port {}, the adapter each lab node was given on the {} backend",
            a.device, a.port, ctx.plan.backend
        );
        if facts.software {
            soft(format!(
                "{what} over {given}: a STAND-IN, a Soft-RoCE device in the node's own namespace ({}), not a real adapter; the kernel does the transport work a HCA would offload",
                facts.sysfs
            ))
        } else {
            Some(Provenance {
                kind: ProvenanceKind::Hardware,
                source: format!("{what} over {given} ({})", facts.sysfs),
            })
        }
    }

    /// What `ibv_devinfo -v` says of a node's first rxe device: transport, link layer,
    /// state, and the IPv4-mapped RoCEv2 GID (the address is derived from the IP).
    async fn device_probe(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        node: &str,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let mut rec = blank(step, at);
        rec.provenance = match &self.adapter {
            Some(_) => self.provenance(format!("ibv_devinfo -v on {node}"), ctx),
            None => soft(format!("ibv_devinfo -v on {node}'s rxe device (Soft-RoCE)")),
        };
        let Some(rxe) = self.device_of(node, |_| true) else {
            rec.detail = json!({"facts": {"device": "none"}});
            return Ok(rec);
        };
        let show = argv(&[IBV_DEVINFO, "-v", "-d", &rxe.device]);
        let out = ctx
            .backend
            .exec(node, &cmd(show.clone()), Duration::from_secs(10))
            .await?;
        let (rel, abs) = ctx.log_file(step, "ibv_devinfo");
        write_log(&abs, &show, &out);
        rec.log = Some(rel);
        let dev = ibv_devinfo::parse(&out.stdout)
            .ok()
            .and_then(|d| d.into_iter().next());
        let facts = match dev {
            None => {
                rec.verdict = Verdict::Fail;
                rec.reason = Some(format!(
                    "ibv_devinfo printed no device: {}",
                    excerpt(out.stderr.trim(), 200)
                ));
                json!({"device": "none"})
            }
            Some(d) => {
                let port = d
                    .ports
                    .iter()
                    .find(|p| p.number == u32::from(rxe.port))
                    .or(d.ports.first());
                let gid = port.and_then(|p| p.gids.iter().find(|g| Some(g.index) == rxe.gid_index));
                json!({
                    "device": d.name,
                    "transport": d.transport.split(" (").next().unwrap_or(&d.transport),
                    "link_layer": port.map(|p| p.link_layer.clone()),
                    "state": port.map(|p| p.state.clone()),
                    "gid": gid.map(|g| g.gid.clone()),
                    "gid_kind": gid.map(|g| g.kind.clone()),
                    "gid_index": rxe.gid_index,
                    "gid_ipv4": gid.and_then(|g| g.gid.strip_prefix("::ffff:").map(str::to_string)),
                    "lid": port.and_then(|p| p.lid).filter(|l| *l > 0),
                    "address": match (&self.adapter, port.and_then(|p| p.lid)) {
                        (Some(Adapter { path: PathKind::Ib, .. }), Some(l)) => Some(format!("LID {l}")),
                        _ => gid.map(|g| format!("GID {}", g.gid)),
                    },
                })
            }
        };
        rec.detail = json!({"facts": facts});
        Ok(rec)
    }

    /// The verbs probe (`iblab verbs-probe`) on a node's first device: each of lesson
    /// 3's mistakes made on real queue pairs of it, the report in `detail.json`. The step
    /// passes when the probe ran, whatever the mistakes showed: that is for the
    /// expectations to judge.
    pub async fn verbs_probe(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        node: &str,
        path: PathKind,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let mut rec = blank(step, at);
        let Some(dev) = self.device_of(node, |_| true) else {
            rec.verdict = Verdict::Error;
            rec.reason = Some(format!(
                "{node} has no verbs device (was the fabric set up?)"
            ));
            return Ok(rec);
        };
        let mut words = vec![
            ctx.plan.backend_facts.iblab.clone(),
            "verbs-probe".into(),
            "--device".into(),
            dev.device.clone(),
            "--port".into(),
            dev.port.to_string(),
        ];
        if let Some(g) = dev.gid_index {
            words.extend(["--gid-index".into(), g.to_string()]);
        }
        let out = ctx
            .backend
            .exec(node, &cmd(words.clone()), step.timeout)
            .await?;
        let (rel, abs) = ctx.log_file(step, "verbs-probe");
        write_log(&abs, &words, &out);
        rec.log = Some(rel);
        rec.devices = vec![DeviceUse::new(path, node, &dev.device)];
        rec.provenance = match &self.adapter {
            Some(_) => self.provenance(format!("iblab verbs-probe on {node}"), ctx),
            None => soft(format!(
                "iblab verbs-probe on {node}'s rxe device {} (Soft-RoCE): real queue pairs, real completions",
                dev.device
            )),
        };
        crate::ctx::verbs_report(&mut rec, json!(words), &out);
        Ok(rec)
    }

    fn device_of(&self, node: &str, pick: impl Fn(&Rxe) -> bool) -> Option<Rxe> {
        self.devices
            .lock()
            .ok()?
            .get(node)?
            .iter()
            .find(|r| pick(r))
            .cloned()
    }
}

/// Same /24 (the planner gives every segment a /24).
fn same_segment(a: &str, b: &str) -> bool {
    a.rsplit_once('.').map(|x| x.0) == b.rsplit_once('.').map(|x| x.0)
}

#[async_trait]
impl Fabric for SoftRoce {
    fn name(&self) -> &'static str {
        "softroce"
    }
    fn path(&self) -> PathKind {
        self.adapter.as_ref().map_or(PathKind::Roce, |a| a.path)
    }

    async fn setup(&self, ctx: &mut StepCtx<'_>) -> Result<(), EnvError> {
        // Every node at once: where nodes share a kernel (the vm backend) each one's
        // round trips overlap, and bring-up stays about flat in the node count.
        let (backend, run_dir) = (ctx.backend, ctx.run_dir.clone());
        let nodes: Vec<&PlannedNode> = ctx.plan.nodes.iter().filter(|n| !n.switch).collect();
        if let Some(a) = &self.adapter {
            let facts = adapter::what_it_is(backend, &nodes, a).await?;
            if let Ok(mut f) = self.facts.lock() {
                *f = Some(facts);
            }
        }
        let found = futures_util::future::join_all(nodes.iter().map(|node| async {
            match &self.adapter {
                Some(a) => adapter::examine_in(backend, node, a, &run_dir)
                    .await
                    .map(|r| vec![r]),
                None => setup_node(backend, ctx.plan.run_id.as_deref(), node, &run_dir).await,
            }
        }))
        .await;
        for (node, f) in nodes.iter().zip(found) {
            let f = f?;
            if let Ok(mut d) = self.devices.lock() {
                d.insert(node.name.clone(), f);
            }
        }
        Ok(())
    }

    async fn control(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Option<Result<StepRecord, EnvError>> {
        match &step.action {
            Action::Probe(Probe {
                what: ProbeKind::Device,
                path: PathKind::Roce,
                node,
                ..
            }) => Some(self.device_probe(step, ctx, node, at).await),
            Action::Probe(Probe {
                what: ProbeKind::Verbs,
                path,
                node,
                ..
            }) if *path == self.path() => Some(self.verbs_probe(step, ctx, node, *path, at).await),
            // ② rides the same Ethernet bridges as ①: what they learned is read alike.
            Action::Probe(Probe {
                what: ProbeKind::Learned,
                path: PathKind::Roce,
                ..
            }) => Some(super::ethernet::learned(step, ctx, at).await),
            _ => None,
        }
    }

    async fn traffic(
        &self,
        step: &PlannedStep,
        t: &Traffic,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let Traffic {
            test,
            from,
            to,
            to_address,
            ..
        } = t;
        let mut rec = blank(step, at);
        // An adapter is each node's one device, whatever lab address the step names.
        let on_adapter = self.adapter.is_some();
        let (Some(client_dev), Some(server_dev)) = (
            self.device_of(from, |r| on_adapter || same_segment(&r.ipv4, to_address)),
            self.device_of(to, |r| on_adapter || r.ipv4 == *to_address),
        ) else {
            rec.verdict = Verdict::Error;
            rec.reason = Some(format!(
                "no rxe device links {from} and {to} (was the softroce fabric set up?)"
            ));
            return Ok(rec);
        };
        if on_adapter && *test == TrafficTest::Connect {
            rec.verdict = Verdict::Skipped;
            rec.reason = Some(adapter::NO_RDMA_CM.into());
            return Ok(rec);
        }
        let mut rec = match test {
            TrafficTest::Connect => rping(step, t, ctx, rec, &client_dev, &server_dev).await?,
            _ => perftest_run(step, t, ctx, rec, &client_dev, &server_dev, on_adapter).await?,
        };
        let path = step.path.unwrap_or(self.path());
        rec.devices = vec![
            DeviceUse::new(path, from, &client_dev.device),
            DeviceUse::new(path, to, &server_dev.device),
        ];
        if on_adapter {
            let tool =
                iblab_tools::perftest::program(t.verb.as_str(), *test == TrafficTest::Bandwidth);
            rec.provenance = self.provenance(format!("perftest {tool}"), ctx);
        }
        Ok(rec)
    }
}

/// Did the client fail only because the server was not listening yet?
fn not_listening_yet(out: &ExecOutput) -> bool {
    let text = format!("{}{}", out.stdout, out.stderr);
    !out.success()
        && !out.timed_out
        && (text.contains("Couldn't connect")
            || text.contains("Unable to init the socket connection")
            || text.contains("Failed to connect")
            || text.contains("REJECTED")
            || text.contains("Connection refused")
            || text.contains("rdma_connect"))
}

/// Start the server, run the client (retrying while the server comes up), stop the server.
/// The TCP port perftest is told (`-p`).
fn port_of(argv: &[String]) -> Option<u16> {
    argv.iter()
        .position(|a| a == "-p")
        .and_then(|i| argv.get(i + 1))
        .and_then(|p| p.parse().ok())
}

async fn client_server(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    tool: &str,
    server_argv: &[String],
    client_argv: &[String],
) -> Result<(ExecOutput, Stopped, u32, String, String), EnvError> {
    let Traffic { from, to, .. } = t;
    let deadline = Instant::now() + step.timeout;
    let (server_rel, server_log) = ctx.log_file(step, &format!("{tool}-server"));
    let mut retries = 0u32;
    let out = loop {
        let server = ctx
            .backend
            .spawn_measured(to, server_argv, &server_log, ctx.state)
            .await?;
        // The server needs a moment to listen (longer under emulation).
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Without the RDMA CM the two ends swap queue pairs over TCP: only the server
        // started here may answer on its port (crate::listener).
        if !server_argv.iter().any(|a| a == "-R")
            && let Some(port) = port_of(server_argv)
            && let Err(e) =
                crate::listener::held_by(ctx.backend, to, &t.to_address, port, tool).await
        {
            let _ = server.stop().await;
            return Err(e);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let out = ctx
            .backend
            .exec_measured(
                from,
                &cmd(client_argv.to_vec()),
                left.max(Duration::from_secs(1)),
            )
            .await?;
        if not_listening_yet(&out)
            && retries < 10
            && Instant::now() + Duration::from_secs(2) < deadline
        {
            let _ = server.stop().await;
            retries += 1;
            continue;
        }
        // Did the server go away under the client (killed, crashed, stopped)?
        let mut server = server;
        let fate = if out.success() {
            String::new()
        } else {
            let ended = server.exited();
            super::peer_fate(tool, to, ended, server.state_letter())
        };
        // The server ends after its one test: let it, and read it before it is reaped.
        // A client that failed leaves it nothing to finish: stop it at once.
        let grace = if out.success() {
            Duration::from_secs(3)
        } else {
            Duration::ZERO
        };
        let end = server.finish(grace).await;
        break (out, end, fate);
    };
    Ok((out.0, out.1, retries, server_rel, out.2))
}

fn soft(source: String) -> Option<Provenance> {
    Some(Provenance {
        kind: ProvenanceKind::Soft,
        source,
    })
}

async fn perftest_run(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    mut rec: StepRecord,
    client: &Rxe,
    server: &Rxe,
    on_adapter: bool,
) -> Result<StepRecord, EnvError> {
    let bandwidth = t.test == TrafficTest::Bandwidth;
    let tool = iblab_tools::perftest::program(t.verb.as_str(), bandwidth);
    // Path ③ rides the same devices: its own port, so a server of ②'s that is still
    // going away cannot answer ③'s client.
    let port = PERFTEST_PORT + u16::from(step.path == Some(PathKind::Ib));
    let ends = PerftestEnds::of(step, t, &tool, port, (client, server), on_adapter);
    // The cable watched from before the exchange to the end (`capture`).
    let watch = match t.capture && !on_adapter {
        true => Some(capture::start(step, t, ctx, port).await?),
        false => None,
    };
    let m = perftest_measure(step, t, ctx, &tool, &ends, (client, server)).await?;
    transport_metrics(&mut rec, &m.before, &m.after);
    let (rel, abs) = ctx.log_file(step, &format!("{tool}-client"));
    write_log(&abs, &ends.client, &m.out);
    rec.log = Some(rel);
    rec.detail = perftest_detail(t, &ends, &m, (client, server), on_adapter);
    rec.provenance = soft(format!(
        "perftest {tool} over rxe (Soft-RoCE, RoCEv2) on the {} backend: real verbs and RoCEv2 packets, but the kernel does the transport work a HCA would offload",
        ctx.plan.backend
    ));
    if let Some(w) = watch {
        capture::finish(w, &mut rec, &m.out.stdout, &client.ipv4).await?;
    }
    if !m.out.success() {
        perftest_failed(step, &mut rec, &tool, &m);
        return Ok(rec);
    }
    let json_text = if bandwidth {
        ctx.backend
            .exec(
                &t.from,
                &cmd(argv(&[CAT, &ends.json_file])),
                Duration::from_secs(10),
            )
            .await?
            .stdout
    } else {
        String::new()
    };
    super::perftest_results(
        &mut rec,
        bandwidth,
        &m.out.stdout,
        &json_text,
        m.out.counters,
        m.server_end.counters,
        &format!(
            "sender = the client, which posts the {} operations; receiver = the server, the passive side; {}",
            t.verb.as_str(),
            counters::RXE_NOTE
        ),
    );
    if let Some(mtu) = client.active_mtu {
        rec.metrics
            .insert(names::ACTIVE_MTU.into(), Metric::new(mtu as f64, "B"));
    }
    Ok(rec)
}

/// The command lines of a perftest run's two ends, and where the client leaves its JSON.
struct PerftestEnds {
    server: Vec<String>,
    client: Vec<String>,
    json_file: String,
}

impl PerftestEnds {
    /// `exchange: tcp` runs perftest without `-R`: the two ends swap QP numbers and
    /// addresses over an ordinary TCP connection and the passive side of a WRITE blocks on
    /// that socket until the end. With `-R` (RDMA CM, the default) the passive side
    /// busy-polls a whole CPU for the test's length: its CPU time is the tool's polling,
    /// not the transfer's (measured here: 100 ticks of user time in a 2 s stream with `-R`,
    /// 0 without). The RDMA CM stays the default: through lesson 5's deep modelled queue
    /// the TCP exchange's end of test, queued behind seconds of RDMA data, showed
    /// retries the CM's did not.
    fn of(
        step: &PlannedStep,
        t: &Traffic,
        tool: &str,
        port: u16,
        (client, server): (&Rxe, &Rxe),
        on_adapter: bool,
    ) -> PerftestEnds {
        let bandwidth = t.test == TrafficTest::Bandwidth;
        let side = |r: &Rxe| -> Vec<String> {
            let mut v = argv(&[
                tool,
                "-d",
                &r.device,
                "-i",
                &r.port.to_string(),
                "-s",
                &t.size.to_string(),
                "-p",
                &port.to_string(),
                "-F",
                "--retry_count",
                RETRY_COUNT,
            ]);
            if let Some(g) = r.gid_index {
                v.extend(argv(&["-x", &g.to_string()]));
            }
            match t.ack_timeout {
                // A timer of our own: the RDMA CM picks the QP's timer itself and
                // perftest's -u does not reach it (measured: -u 10 with -R gave no retry
                // where without -R it gave twenty), so the exchange goes out of band.
                Some(u) => v.extend(argv(&["-u", &u.to_string()])),
                // On an adapter the lab's addresses are not the device's: the RDMA CM
                // would resolve them to the pod's lab interface, which has no verbs device.
                None if t.exchange == Exchange::RdmaCm && !on_adapter => v.push("-R".into()),
                None => {}
            }
            if bandwidth {
                v.extend(argv(&[
                    "-D",
                    &format!("{}", t.seconds.ceil().max(1.0)),
                    "--report_gbits",
                ]));
            } else {
                v.extend(argv(&["-n", "1000"]));
            }
            v
        };
        let json_file = format!("/tmp/iblab-{}.json", step.id);
        let mut client_argv = side(client);
        if bandwidth {
            client_argv.extend([
                "--out_json".to_string(),
                format!("--out_json_file={json_file}"),
            ]);
        }
        client_argv.push(t.to_address.clone());
        PerftestEnds {
            server: side(server),
            client: client_argv,
            json_file,
        }
    }
}

/// One perftest measurement as taken: the devices' counters around it, the client's
/// output, the server's end, and how often it was tried again.
struct PerftestMeasured {
    before: (HashMap<String, u64>, HashMap<String, u64>),
    after: (HashMap<String, u64>, HashMap<String, u64>),
    out: ExecOutput,
    server_end: Stopped,
    connect_retries: u32,
    server_log: String,
    fate: String,
    calibration_retries: u32,
}

/// Take the measurement, again while perftest's clock would not calibrate.
///
/// perftest times itself in CPU cycles and, to report, calibrates them against the
/// clock; on a busy (emulated) CPU that calibration can fail ("Correlation coefficient
/// r^2 < 0.9"), and then it reports 0 for every rate and `inf` for every time. That is
/// the tool's clock, not the network: the whole measurement is taken again, up to four
/// more times, each after a longer pause, and the evidence says how often. Measured: on
/// the test cluster's emulated node (every command a round trip to a node that also runs
/// its kubelet and the pods' runtime), roce-basics on its stand-in adapter, 4 runs: the
/// first step's first try failed in 3, all three tries in 1; on the vm backend with two
/// busy loops beside it, one CI run's lesson-2 check had all three tries of one latency
/// run fail (its `inf` then passed as a figure: a time that is not finite is now a failed
/// run, never a measurement).
async fn perftest_measure(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    tool: &str,
    ends: &PerftestEnds,
    (client, server): (&Rxe, &Rxe),
) -> Result<PerftestMeasured, EnvError> {
    let max_calibration_retries = 4;
    let mut calibration_retries: u32 = 0;
    let (from, to) = (&t.from, &t.to);
    loop {
        let before = (
            rdma_counters::rxe_counters(ctx, from, &client.device).await?,
            rdma_counters::rxe_counters(ctx, to, &server.device).await?,
        );
        let (out, server_end, connect_retries, server_log, fate) =
            client_server(step, t, ctx, tool, &ends.server, &ends.client).await?;
        let after = (
            rdma_counters::rxe_counters(ctx, from, &client.device).await?,
            rdma_counters::rxe_counters(ctx, to, &server.device).await?,
        );
        if perftest::clock_uncalibrated(&out.stdout, &out.stderr)
            && calibration_retries < max_calibration_retries
        {
            calibration_retries += 1;
            // Let what disturbed the calibration pass (a node busy with pods starting).
            tokio::time::sleep(Duration::from_millis(500 * u64::from(calibration_retries))).await;
            continue;
        }
        return Ok(PerftestMeasured {
            before,
            after,
            out,
            server_end,
            connect_retries,
            server_log,
            fate,
            calibration_retries,
        });
    }
}

/// What a perftest step's `detail` says: its commands, retries, devices, perftest's own
/// settings and how the ends swapped their queue pairs.
fn perftest_detail(
    t: &Traffic,
    ends: &PerftestEnds,
    m: &PerftestMeasured,
    (client, server): (&Rxe, &Rxe),
    on_adapter: bool,
) -> serde_json::Value {
    json!({
        "client": ends.client,
        "server": ends.server,
        "server_log": m.server_log,
        "exit_code": m.out.exit_code,
        "connect_retries": m.connect_retries,
        "clock_calibration_retries": m.calibration_retries,
        "client_device": client.device,
        "client_gid_index": client.gid_index,
        "server_gid_index": server.gid_index,
        "active_mtu": client.active_mtu,
        "perftest_settings": perftest::settings(&m.out.stdout),
        "gids": perftest::gids(&m.out.stdout),
        "exchange": match (t.exchange, t.ack_timeout) {
            _ if on_adapter => Exchanged::TcpOnAdapter,
            (_, Some(_)) | (Exchange::Tcp, _) => Exchanged::Tcp,
            (Exchange::RdmaCm, None) => Exchanged::RdmaCm,
        },
        "ack_timeout": t.ack_timeout.map(|u| json!({
            "exponent": u,
            "seconds": 4.096e-6 * f64::from(1u32 << u),
            "why": "a link that waits for credit instead of dropping: a wait in its queue is not a loss, so the transport's retry timer is set past any wait the model makes",
        })),
    })
}

/// A perftest run that did not finish: what arrived before it failed (a collapse) is
/// drawn all the same, and the step says why.
fn perftest_failed(step: &PlannedStep, rec: &mut StepRecord, tool: &str, m: &PerftestMeasured) {
    let (out, fate) = (&m.out, &m.fate);
    rec.series = iblab_core::evidence::Series::of_receiver(m.server_end.counters.as_ref());
    rec.verdict = Verdict::Fail;
    rec.reason = Some(if out.timed_out {
        format!(
            "{tool} did not finish within {:.0}s (killed at the step's deadline){fate}",
            step.timeout.as_secs_f64()
        )
    } else {
        format!(
            "{tool} exited with {:?}: {}{fate}",
            out.exit_code,
            perftest::error_line(&format!("{}\n{}", out.stdout, out.stderr))
                .unwrap_or_else(|| excerpt(out.stderr.trim(), 200))
        )
    });
}

/// What the transport did during the run, from the counters' differences: the receiver's
/// out-of-sequence packets and duplicates are go-back-N at work; the sender's retries are
/// its timers firing.
fn transport_metrics(
    rec: &mut StepRecord,
    before: &(HashMap<String, u64>, HashMap<String, u64>),
    after: &(HashMap<String, u64>, HashMap<String, u64>),
) {
    let delta = |side: usize, names: &[&str]| -> Option<f64> {
        let (b, a) = if side == 0 {
            (&before.0, &after.0)
        } else {
            (&before.1, &after.1)
        };
        let present: Vec<&&str> = names.iter().filter(|n| a.contains_key(**n)).collect();
        if present.is_empty() {
            return None;
        }
        Some(
            present
                .iter()
                .map(|n| a[**n].saturating_sub(b.get(**n).copied().unwrap_or(0)) as f64)
                .sum(),
        )
    };
    for (metric, side, names, unit) in [
        (
            names::RECEIVER_OUT_OF_SEQUENCE,
            1,
            &["rcvd_seq_err", "out_of_seq_request"][..],
            "packets",
        ),
        (
            names::RECEIVER_DUPLICATES,
            1,
            &["duplicate_request"][..],
            "packets",
        ),
        (
            names::SENDER_RETRIES,
            0,
            &["completer_retry_err"][..],
            "events",
        ),
        (
            names::SENDER_RETRY_EXCEEDED,
            0,
            &["retry_exceeded_err"][..],
            "events",
        ),
    ] {
        if let Some(v) = delta(side, names) {
            rec.metrics.insert(metric.into(), Metric::new(v, unit));
        }
    }
}

async fn rping(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    mut rec: StepRecord,
    client: &Rxe,
    server: &Rxe,
) -> Result<StepRecord, EnvError> {
    let count = "3";
    let server_argv = argv(&[RPING, "-s", "-v", "-C", count, "-a", &server.ipv4]);
    let client_argv = argv(&[RPING, "-c", "-v", "-C", count, "-a", &server.ipv4]);
    let (out, _, retries, server_rel, fate) =
        client_server(step, t, ctx, "rping", &server_argv, &client_argv).await?;
    let (rel, abs) = ctx.log_file(step, "rping-client");
    write_log(&abs, &client_argv, &out);
    rec.log = Some(rel);
    let pings = out
        .stdout
        .lines()
        .filter(|l| l.contains("ping data"))
        .count();
    rec.detail = json!({
        "client": client_argv,
        "server": server_argv,
        "server_log": server_rel,
        "exit_code": out.exit_code,
        "connect_retries": retries,
        "client_device": client.device,
    });
    rec.provenance = soft(format!(
        "rping (RDMA CM connection, SEND/RECV and RDMA READ/WRITE) over rxe on the {} backend",
        ctx.plan.backend
    ));
    rec.metrics.insert(
        names::RPING_MESSAGES.into(),
        Metric::new(pings as f64, "count"),
    );
    // Every message made it: the connection worked. rping sometimes exits non-zero while
    // tearing down a finished connection (seen: 255 after all messages); that stays in
    // the detail but does not fail the step.
    let wanted: usize = count.parse().unwrap_or(1);
    if !out.success() && pings >= wanted {
        rec.detail["teardown_note"] = json!("rping exited non-zero after exchanging every message");
    } else if !out.success() || pings == 0 {
        rec.verdict = Verdict::Fail;
        rec.reason = Some(if out.timed_out {
            format!(
                "rping did not finish within {:.0}s (killed at the step's deadline){fate}",
                step.timeout.as_secs_f64()
            )
        } else {
            format!(
                "rping exited with {:?} after {pings} messages: {}{fate}",
                out.exit_code,
                excerpt(format!("{}{}", out.stdout, out.stderr).trim(), 200)
            )
        });
    }
    Ok(rec)
}

/// What lists the RoCEv2 GIDs of a node's kernel: `DEVICE/ports/PORT INDEX GID` a line,
/// read from sysfs (what `rdma` and `ibv_devinfo` read too). POSIX sh with builtins only
/// (busybox's in a VM, where every fork is slow): the first 16 table entries, which hold
/// the link-local and the addresses' GIDs (rxe's table has hundreds, mostly empty).
const GID_SCRIPT: &str = r#"for d in /sys/class/infiniband/*/ports/*; do
for i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
v=; read -r v 2>/dev/null < "$d/gid_attrs/types/$i"
[ "$v" = "RoCE v2" ] || continue
g=; read -r g 2>/dev/null < "$d/gids/$i"
echo "${d#/sys/class/infiniband/} $i $g"
done
done"#;

/// The RoCEv2 GIDs of `devices` in `GID_SCRIPT`'s output, as `DEVICE GID` (compact form):
/// the IPv4-mapped ones (derived from the interface's address, what path ② connects
/// with), else every other that is set.
pub fn parse_gids(text: &str, devices: &[String]) -> Vec<String> {
    let mut mapped = Vec::new();
    let mut other = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some(place), Some(_index), Some(gid)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let device = place.split('/').next().unwrap_or_default();
        if !devices.iter().any(|d| d == device) {
            continue;
        }
        let Ok(addr) = gid.parse::<std::net::Ipv6Addr>() else {
            continue;
        };
        if addr.is_unspecified() {
            continue;
        }
        let entry = format!("{device} {addr}");
        let list = if addr.to_ipv4_mapped().is_some() {
            &mut mapped
        } else {
            &mut other
        };
        if !list.contains(&entry) {
            list.push(entry);
        }
    }
    if mapped.is_empty() { other } else { mapped }
}

/// Every host node's RoCEv2 GIDs, read from its rxe devices (for the node table of a kept
/// lab). A node that cannot be asked is left out.
pub async fn node_gids(
    plan: &iblab_core::plan::Plan,
    backend: &dyn iblab_backend::Deployment,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out = std::collections::BTreeMap::new();
    for n in plan.nodes.iter().filter(|n| !n.switch) {
        let devices: Vec<String> = (0..n.interfaces.len())
            .map(|i| {
                backend
                    .backend()
                    .rdma_device(plan.run_id.as_deref(), &n.name, i)
            })
            .collect();
        let c = cmd(argv(&[SH, "-c", GID_SCRIPT]));
        match backend.exec(&n.name, &c, Duration::from_secs(10)).await {
            Ok(o) if o.success() => {
                let gids = parse_gids(&o.stdout, &devices);
                if !gids.is_empty() {
                    out.insert(n.name.clone(), gids);
                }
            }
            Ok(o) => tracing::info!(node = %n.name, "reading GIDs failed: {}", o.stderr),
            Err(e) => tracing::info!(node = %n.name, "reading GIDs failed: {e}"),
        }
    }
    out
}

/// Path ②'s devices on one node: an rxe on every addressed interface, each waited for
/// until ACTIVE with its IPv4-mapped RoCEv2 GID; what was run goes to the node's log.
async fn setup_node(
    backend: &dyn iblab_backend::Deployment,
    run: Option<&str>,
    node: &PlannedNode,
    run_dir: &std::path::Path,
) -> Result<Vec<Rxe>, EnvError> {
    let mut log = String::new();
    // The RDMA subsystem's namespace mode and the locked-memory limit verbs work
    // under, as this node sees them (preflight facts, kept in the log).
    for facts in [
        argv(&[RDMA, "system", "show"]),
        argv(&[CAT, "/proc/self/limits"]),
    ] {
        let mut c = cmd(facts.clone());
        c.may_fail = true;
        if let Ok(out) = backend.exec(&node.name, &c, Duration::from_secs(10)).await {
            log.push_str(&format!(
                "$ {}\n{}{}\n",
                facts.join(" "),
                out.stdout,
                out.stderr
            ));
        }
    }
    let mut found = Vec::new();
    for (k, iface) in node.interfaces.iter().enumerate() {
        let Some(ipv4) = iface.address.as_deref().and_then(|a| a.split('/').next()) else {
            continue;
        };
        let device = backend.backend().rdma_device(run, &node.name, k);
        if backend.rdma_made_by_node(&node.name) {
            // Made with the pod, before its container started (unprivileged pods).
            log.push_str(&format!(
                "# {device} on {}: made by the cluster node's agent with the pod\n",
                iface.name
            ));
        } else {
            let add = argv(&[
                RDMA,
                "link",
                "add",
                &device,
                "type",
                "rxe",
                "netdev",
                &iface.name,
            ]);
            let out = backend
                .exec(&node.name, &cmd(add.clone()), Duration::from_secs(20))
                .await?;
            log.push_str(&format!(
                "$ {}\n{}{}\n",
                add.join(" "),
                out.stdout,
                out.stderr
            ));
            if !out.success() {
                return Err(EnvError::new(format!(
                    "{}: `{}` failed: {}",
                    node.name,
                    add.join(" "),
                    out.stderr.trim()
                )));
            }
        }
        // Wait for the port to be ACTIVE with its IPv4-mapped RoCEv2 GID.
        let show = argv(&[IBV_DEVINFO, "-v", "-d", &device]);
        let deadline = Instant::now() + Duration::from_secs(20);
        let rxe = loop {
            let out = backend
                .exec(&node.name, &cmd(show.clone()), Duration::from_secs(10))
                .await?;
            let port = ibv_devinfo::parse(&out.stdout)
                .ok()
                .and_then(|d| d.into_iter().next())
                .and_then(|d| d.ports.into_iter().next());
            if let Some(p) = &port
                && p.active()
                && let Some(gid_index) = p.roce_v2_ipv4_gid(ipv4)
            {
                log.push_str(&format!("$ {}\n{}\n", show.join(" "), out.stdout));
                break Rxe {
                    device: device.clone(),
                    ipv4: ipv4.to_string(),
                    gid_index: Some(gid_index),
                    port: 1,
                    active_mtu: p.active_mtu,
                };
            }
            if Instant::now() > deadline {
                return Err(EnvError::new(format!(
                    "{}: {device} did not become ACTIVE with a RoCEv2 GID for {ipv4} within 20s (state: {})",
                    node.name,
                    port.map(|p| p.state).unwrap_or_else(|| "no port".into())
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        found.push(rxe);
    }
    let path = run_dir.join(format!("logs/softroce-setup.{}.log", node.name));
    let _ = std::fs::write(path, log);
    Ok(found)
}

#[cfg(test)]
mod hw_counter_tests {
    use super::*;

    #[test]
    fn gids_come_from_the_nodes_own_devices_ipv4_mapped_first() {
        let text = "rxe0/ports/1 0 fe80:0000:0000:0000:5054:00ff:fe1b:0100\n\
                    rxe0/ports/1 1 0000:0000:0000:0000:0000:ffff:c612:0001\n\
                    rxe0/ports/1 2 0000:0000:0000:0000:0000:0000:0000:0000\n\
                    b-rxe0/ports/1 1 0000:0000:0000:0000:0000:ffff:c612:0002\n\
                    garbage\n";
        assert_eq!(
            parse_gids(text, &["rxe0".into()]),
            vec!["rxe0 ::ffff:198.18.0.1".to_string()]
        );
        assert_eq!(
            parse_gids(text, &["b-rxe0".into()]),
            vec!["b-rxe0 ::ffff:198.18.0.2".to_string()]
        );
        // No IPv4-mapped GID (no address yet): the others that are set.
        let only_ll = "rxe0/ports/1 0 fe80:0000:0000:0000:5054:00ff:fe1b:0100\n";
        assert_eq!(
            parse_gids(only_ll, &["rxe0".into()]),
            vec!["rxe0 fe80::5054:ff:fe1b:100".to_string()]
        );
        assert!(parse_gids(text, &["mlx5_0".into()]).is_empty());
    }

    #[test]
    fn reads_grep_r_output_of_hw_counters() {
        let text = "/sys/class/infiniband/rxe0/ports/1/hw_counters/rcvd_seq_err:17\n/sys/class/infiniband/rxe0/ports/1/hw_counters/duplicate_request:4\n/sys/class/infiniband/rxe0/ports/1/hw_counters/lifespan:10\n";
        let c = crate::rdma_counters::parse_hw_counters(text);
        assert_eq!(c["rcvd_seq_err"], 17);
        assert_eq!(c["duplicate_request"], 4);
        let before = (
            HashMap::new(),
            HashMap::from([("rcvd_seq_err".to_string(), 10u64)]),
        );
        let after = (HashMap::new(), c);
        let mut rec = blank(
            &iblab_core::plan::PlannedStep {
                id: "x".into(),
                name: None,
                path: None,
                action: iblab_core::plan::Action::Sleep {
                    duration: Duration::ZERO,
                },
                timeout: Duration::ZERO,
                finally: false,
                continue_on_error: false,
                when: None,
                skip: None,
            },
            0.0,
        );
        transport_metrics(&mut rec, &before, &after);
        assert_eq!(rec.metrics["receiver_out_of_sequence"].value, 7.0);
        assert_eq!(rec.metrics["receiver_duplicates"].value, 4.0);
        assert!(!rec.metrics.contains_key("sender_retries"));
    }
}
