//! The ethernet fabric (path ① tcp): kernel TCP between nodes, measured with iperf3
//! (server on the receiver, client on the sender, JSON parsed) for bandwidth, and with
//! iblab's own TCP ping-pong of small messages for latency and connection tests.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use async_trait::async_trait;

use super::Fabric;
use crate::ctx::{StepCtx, excerpt, write_log};
use iblab_backend::EnvError;
use iblab_core::command::{Cmd, ExecOutput};
use iblab_core::evidence::blank;
use iblab_core::evidence::detail::{FdbEntry, HostLearned, LearnedFacts, SwitchLearned};
use iblab_core::evidence::{Metric, Provenance, ProvenanceKind, StepRecord, Verdict};
use iblab_core::plan::{Action, PlannedStep, Probe, Traffic};
use iblab_lab::names;
use iblab_lab::{PathKind, TrafficTest};
use iblab_tools::iperf3;

/// iperf3's port inside the lab (each node has its own stack, so no clash with the host).
const PORT: u16 = 5201;

/// The TCP traffic tool.
const IPERF3: &str = "iperf3";
/// What reads what Ethernet learned: hosts' links and neighbours, bridges' fdb.
const IP: &str = "ip";
const BRIDGE: &str = "bridge";

/// What path ① starts in the nodes for this plan: iperf3 for bandwidth, iblab's own
/// ping-pong for latency and connection tests, `ip` and `bridge` for what Ethernet learned
/// (on path ② too: it rides the same bridges).
pub fn programs(
    plan: &iblab_core::plan::Plan,
    backend: &dyn iblab_core::plan::backend::Backend,
    needs: &mut iblab_core::programs::Needs,
) {
    use iblab_core::programs::Place;
    let by = "fabric ethernet";
    for s in plan.steps.iter().filter(|s| s.skip.is_none()) {
        match &s.action {
            Action::Traffic(t) if s.path == Some(PathKind::Tcp) => {
                match t.test {
                    TrafficTest::Bandwidth => needs.add(Place::Nodes, IPERF3, by),
                    TrafficTest::Latency | TrafficTest::Connect => {
                        needs.add(Place::Nodes, backend.iblab_path(), by)
                    }
                }
                // Who holds the server's port (crate::listener).
                needs.add_all(Place::Nodes, crate::listener::PROGRAMS, by);
            }
            Action::Probe(Probe {
                what: iblab_lab::ProbeKind::Learned,
                ..
            }) => needs.add_all(Place::Nodes, &[IP, BRIDGE], by),
            _ => {}
        }
    }
}

/// Plain Ethernet: addresses are configured by the backend, nothing more to set up.
pub struct Ethernet;

#[async_trait]
impl Fabric for Ethernet {
    fn name(&self) -> &'static str {
        "ethernet"
    }
    fn path(&self) -> PathKind {
        PathKind::Tcp
    }
    /// Path ① has no RDMA device: its bytes go through the kernel's sockets on the
    /// node's Ethernet interface.
    async fn control(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Option<Result<StepRecord, EnvError>> {
        if let Action::Probe(Probe {
            what: iblab_lab::ProbeKind::Learned,
            path: PathKind::Tcp,
            ..
        }) = &step.action
        {
            return Some(learned(step, ctx, at).await);
        }
        let Action::Probe(Probe {
            what: iblab_lab::ProbeKind::Device,
            path: PathKind::Tcp,
            node,
            ..
        }) = &step.action
        else {
            return None;
        };
        let mut rec = blank(step, at);
        let iface = ctx
            .plan
            .nodes
            .iter()
            .find(|n| &n.name == node)
            .and_then(|n| n.interfaces.first());
        rec.provenance = Some(Provenance {
            kind: ProvenanceKind::Modelled,
            source: "stated by the lab's plan, not measured: path tcp uses kernel sockets on the node's Ethernet interface (what a transfer of ① does to the nodes' RDMA devices is measured by its traffic step: `rdma_packets`)"
                .into(),
        });
        rec.detail = json!({"facts": {
            "device": "none",
            "transport": "TCP/IP in the kernel (sockets)",
            "link_layer": "Ethernet",
            "interface": iface.map(|i| i.name.clone()),
            "address": iface.and_then(|i| i.address.clone()).map(|a| format!("IP {a}")),
        }});
        Some(Ok(rec))
    }

    async fn traffic(
        &self,
        step: &PlannedStep,
        t: &Traffic,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        match t.test {
            TrafficTest::Latency | TrafficTest::Connect => pingpong(step, t, ctx, at).await,
            TrafficTest::Bandwidth => tcp(step, t, ctx, at).await,
        }
    }
}

/// What Ethernet learned by itself, read from the run's switches and hosts: each bridge's
/// learned forwarding entries, each host's neighbour table (ARP), and the hosts' own MACs
/// to tell whose entries they are. Facts: `switches.<sw>.learned` (entries, each with the
/// node it belongs to), `switches.<sw>.nodes`, `nodes.<n>.mac`, `nodes.<n>.arp.<peer>`
/// (the MAC ARP resolved for a peer's IP), `nodes_learned` (every node some bridge
/// learned), `learned_entries` (how many in all).
pub async fn learned(
    step: &PlannedStep,
    ctx: &mut StepCtx<'_>,
    at: f64,
) -> Result<StepRecord, EnvError> {
    let mut rec = blank(step, at);
    let (rel, abs) = ctx.log_file(step, "learned");
    let plan = ctx.plan;
    let mut problems = Vec::new();
    let (mut nodes, macs, ips) = hosts_macs(ctx, &abs, &mut problems).await?;
    for n in plan.nodes.iter().filter(|n| !n.switch) {
        let out = read_on(ctx, &n.name, &[IP, "-j", "neigh", "show"], &abs).await?;
        match iblab_tools::iproute::neighbours(&out.stdout) {
            Ok(list) => {
                let host = nodes.entry(n.name.clone()).or_default();
                host.arp = Some(
                    list.iter()
                        .filter_map(|nb| Some((ips.get(&nb.ip)?.clone(), nb.mac.clone())))
                        .collect(),
                );
                host.neighbours = Some(list);
            }
            Err(e) => problems.push(format!("{}: ip neigh: {e}", n.name)),
        }
    }
    let switches = bridges_learned(ctx, &macs, &abs, &mut problems).await?;
    rec.log = Some(rel);
    rec.provenance = Some(Provenance {
        kind: ProvenanceKind::Soft,
        source: format!(
            "the lab's Linux bridges (`bridge fdb`) and the hosts' kernels (`ip neigh`, `ip link`) on the {} backend: real flood-and-learn and ARP, software switches",
            plan.backend
        ),
    });
    if !problems.is_empty() {
        rec.verdict = Verdict::Fail;
        rec.reason = Some(problems.join("; "));
    }
    rec.put_detail(
        "facts",
        &LearnedFacts {
            nodes_learned: switches.values().flat_map(|s| s.nodes.clone()).collect(),
            learned_entries: switches.values().map(|s| s.learned.len()).sum(),
            switches,
            nodes,
        },
    );
    Ok(rec)
}

/// A command that may fail, run on a node, its output appended to the probe's log.
async fn read_on(
    ctx: &mut StepCtx<'_>,
    node: &str,
    argv: &[&str],
    log: &std::path::Path,
) -> Result<ExecOutput, EnvError> {
    let c = Cmd {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        may_fail: true,
    };
    let out = ctx.backend.exec(node, &c, Duration::from_secs(10)).await?;
    write_log(log, &c.argv, &out);
    Ok(out)
}

/// Node → what it learned; MAC → node; IP → node: each host's own MACs (of its addressed
/// interfaces) and addresses, to tell whose entries the bridges and ARP learned.
type HostsMacs = (
    BTreeMap<String, HostLearned>,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
);

/// Each host's MACs (of its addressed interfaces) and IPs.
async fn hosts_macs(
    ctx: &mut StepCtx<'_>,
    log: &std::path::Path,
    problems: &mut Vec<String>,
) -> Result<HostsMacs, EnvError> {
    let (mut nodes, mut macs, mut ips) = HostsMacs::default();
    let plan = ctx.plan;
    for n in plan.nodes.iter().filter(|n| !n.switch) {
        let out = read_on(ctx, &n.name, &[IP, "-j", "link", "show"], log).await?;
        let mut mac = None;
        for i in n.interfaces.iter().filter(|i| i.address.is_some()) {
            if let Some(m) = iblab_tools::iproute::link_mac(&out.stdout, &i.name) {
                macs.insert(m.clone(), n.name.clone());
                mac.get_or_insert(m);
            }
            if let Some(a) = &i.address {
                let ip = a.split('/').next().unwrap_or(a).to_string();
                ips.insert(ip, n.name.clone());
            }
        }
        if mac.is_none() {
            problems.push(format!("no MAC read on {}", n.name));
        }
        nodes.insert(
            n.name.clone(),
            HostLearned {
                mac,
                ..HostLearned::default()
            },
        );
    }
    Ok((nodes, macs, ips))
}

/// What each switch's bridge learned by itself, each entry with the node whose MAC it is.
async fn bridges_learned(
    ctx: &mut StepCtx<'_>,
    macs: &BTreeMap<String, String>,
    log: &std::path::Path,
    problems: &mut Vec<String>,
) -> Result<BTreeMap<String, SwitchLearned>, EnvError> {
    let mut switches = BTreeMap::new();
    let plan = ctx.plan;
    for s in plan.nodes.iter().filter(|n| n.switch) {
        let out = read_on(
            ctx,
            &s.name,
            &[BRIDGE, "-j", "fdb", "show", "br", "br0"],
            log,
        )
        .await?;
        match iblab_tools::iproute::fdb_learned(&out.stdout) {
            Ok(list) => {
                let learned: Vec<FdbEntry> = list
                    .into_iter()
                    .map(|l| FdbEntry {
                        node: macs.get(&l.mac).cloned(),
                        mac: l.mac,
                        port: l.port,
                    })
                    .collect();
                let nodes = learned.iter().filter_map(|l| l.node.clone()).collect();
                switches.insert(s.name.clone(), SwitchLearned { learned, nodes });
            }
            Err(e) => problems.push(format!("{}: bridge fdb: {e}", s.name)),
        }
    }
    Ok(switches)
}

/// Port of the ping-pong inside the lab.
const PINGPONG_PORT: u16 = 5301;

/// Round trips of small TCP messages: `iblab pingpong` on both ends, JSON parsed.
async fn pingpong(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    at: f64,
) -> Result<StepRecord, EnvError> {
    let Traffic {
        test,
        size,
        from,
        to,
        to_address,
        ..
    } = t;
    let count = if *test == TrafficTest::Connect {
        3
    } else {
        1000
    };
    let wait = step.timeout.as_secs_f64().max(1.0);
    let exe = ctx.backend.iblab_path();
    let common = |role: &str, addr: String| -> Vec<String> {
        vec![
            exe.clone(),
            "pingpong".into(),
            role.into(),
            addr,
            "--count".into(),
            count.to_string(),
            "--size".into(),
            size.to_string(),
            "--wait".into(),
            format!("{wait}"),
        ]
    };
    let addr = format!("{to_address}:{PINGPONG_PORT}");
    let mut rec = blank(step, at);
    let server_argv = common("--listen", addr.clone());
    let (server_rel, server_log) = ctx.log_file(step, "pingpong-server");
    let server = ctx
        .backend
        .spawn(to, &server_argv, &server_log, ctx.state)
        .await?;
    // Only iblab's own server may answer: whoever else holds the port would be timed.
    if let Err(e) =
        crate::listener::held_by(ctx.backend, to, to_address, PINGPONG_PORT, "pingpong").await
    {
        let _ = server.stop().await;
        return Err(e);
    }
    let client_argv = common("--connect", addr);
    let cmd = Cmd {
        argv: client_argv.clone(),
        stdin: None,
        may_fail: false,
    };
    let out = ctx.backend.exec(from, &cmd, step.timeout).await?;
    let _ = server.stop().await;
    let (rel, abs) = ctx.log_file(step, "pingpong-client");
    write_log(&abs, &client_argv, &out);
    rec.log = Some(rel);
    rec.detail = json!({
        "client": client_argv,
        "server": server_argv,
        "server_log": server_rel,
        "exit_code": out.exit_code,
    });
    rec.provenance = Some(Provenance {
        kind: ProvenanceKind::Soft,
        source: "iblab pingpong: TCP_NODELAY send/recv round trips through the kernel stacks of both nodes (no NIC)".into(),
    });
    match serde_json::from_str::<crate::pingpong::Stats>(out.stdout.trim()) {
        Ok(s) if out.success() => {
            crate::Latency {
                min: s.t_min,
                typical: s.t_typical,
                avg: s.t_avg,
                max: s.t_max,
                stdev: s.t_stdev,
                p99: s.p99,
                p99_9: s.p99_9,
                round_trips: s.iterations as u64,
            }
            .record(&mut rec);
        }
        _ => {
            rec.verdict = Verdict::Fail;
            rec.reason = Some(if out.timed_out {
                format!(
                    "the ping-pong did not finish within {:.0}s",
                    step.timeout.as_secs_f64()
                )
            } else {
                format!("ping-pong failed: {}", excerpt(out.stderr.trim(), 200))
            });
        }
    }
    Ok(rec)
}

async fn tcp(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
    at: f64,
) -> Result<StepRecord, EnvError> {
    let (from, to) = (&t.from, &t.to);
    let mut rec = blank(step, at);
    // The RDMA devices of both ends, if the lab made any: ① moves its bytes without them.
    let rdma_before = crate::rdma_counters::rdma_packets(ctx, &[from, to]).await?;
    let (server_rel, server_log) = ctx.log_file(step, "iperf3-server");
    let server_argv: Vec<String> = [
        IPERF3,
        "-s",
        "-1",
        "-B",
        &t.to_address,
        "-p",
        &PORT.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut server = ctx
        .backend
        .spawn_measured(to, &server_argv, &server_log, ctx.state)
        .await?;
    // iperf3's client takes its figures from whoever answers on the port: only the server
    // started here may.
    if let Err(e) = crate::listener::held_by(ctx.backend, to, &t.to_address, PORT, IPERF3).await {
        let _ = server.stop().await;
        return Err(e);
    }
    let (client_argv, out, connect_retries) = iperf3_client(step, t, ctx).await?;
    // Did the server end before the client did (killed, crashed: a peer that vanished)?
    let server_ended = server.exited();
    let server_state = server.state_letter();
    // `iperf3 -s -1` ends after the one test: let it, and read it before it is reaped. A
    // client that failed has no test for it to finish: stop it at once.
    let grace = if out.success() {
        Duration::from_secs(3)
    } else {
        Duration::ZERO
    };
    let server_end = server.finish(grace).await;
    let rdma_after = crate::rdma_counters::rdma_packets(ctx, &[from, to]).await?;
    rdma_figures(&mut rec, &rdma_before, &rdma_after);
    let (rel, abs) = ctx.log_file(step, "iperf3-client");
    write_log(&abs, &client_argv, &out);
    rec.log = Some(rel);
    rec.provenance = Some(Provenance {
        kind: ProvenanceKind::Soft,
        source: format!("iperf3 over {}", ctx.plan.backend_traits.tcp_carrier),
    });
    rec.detail = json!({
        "client": client_argv,
        "server": server_argv,
        "server_log": server_rel,
        "exit_code": out.exit_code,
        "connect_retries": connect_retries,
    });
    match iperf3::parse(&out.stdout) {
        Ok(r) => iperf3_figures(&mut rec, &r, out.counters, server_end.counters),
        Err(e) => {
            // What arrived before it failed is drawn all the same.
            rec.series = iblab_core::evidence::Series::of_receiver(server_end.counters.as_ref());
            rec.verdict = Verdict::Fail;
            let peer = super::peer_fate("iperf3", to, server_ended, server_state);
            rec.reason = Some(if out.timed_out {
                format!(
                    "iperf3 did not finish within {:.0}s and was stopped at the step's deadline{peer}",
                    step.timeout.as_secs_f64()
                )
            } else {
                format!("{e} {}{peer}", excerpt(out.stderr.trim(), 200))
            });
        }
    }
    Ok(rec)
}

/// Run iperf3's client against the server, retrying a refused connection for up to 5 s
/// (the server needs a moment to listen): its command line, its output, the retries.
async fn iperf3_client(
    step: &PlannedStep,
    t: &Traffic,
    ctx: &mut StepCtx<'_>,
) -> Result<(Vec<String>, ExecOutput, u32), EnvError> {
    let client_argv: Vec<String> = vec![
        IPERF3.into(),
        "-c".into(),
        t.to_address.clone(),
        "-p".into(),
        PORT.to_string(),
        "-t".into(),
        format!("{}", t.seconds),
        "-P".into(),
        t.streams.to_string(),
        "-J".into(),
    ];
    let cmd = Cmd {
        argv: client_argv.clone(),
        stdin: None,
        may_fail: false,
    };
    let listen_deadline = Instant::now() + Duration::from_secs(5);
    let deadline = Instant::now() + step.timeout;
    let mut connect_retries = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let out = ctx
            .backend
            .exec_measured(&t.from, &cmd, left.max(Duration::from_millis(100)))
            .await?;
        let refused =
            out.stdout.contains("Connection refused") || out.stderr.contains("Connection refused");
        if refused && Instant::now() < listen_deadline {
            connect_retries += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        return Ok((client_argv, out, connect_retries));
    }
}

/// What path ②'s devices carried while ① moved its bytes, where the lab made any.
fn rdma_figures(
    rec: &mut StepRecord,
    before: &crate::rdma_counters::RdmaPackets,
    after: &crate::rdma_counters::RdmaPackets,
) {
    if before.devices > 0 {
        rec.metrics.insert(
            names::RDMA_PACKETS.into(),
            Metric::new(
                after.packets.saturating_sub(before.packets) as f64,
                "packets",
            ),
        );
        rec.metrics.insert(
            names::RDMA_DEVICES_WATCHED.into(),
            Metric::new(before.devices as f64, "devices"),
        );
    }
}

/// The figures of an iperf3 run that reported: throughput, bytes, retransmits, both ends'
/// CPU, and what each end's process did on its host.
fn iperf3_figures(
    rec: &mut StepRecord,
    r: &iperf3::Iperf3Result,
    sender: Option<iblab_core::counters::ProcessCounters>,
    receiver: Option<iblab_core::counters::ProcessCounters>,
) {
    rec.metrics.insert(
        names::THROUGHPUT_MBPS.into(),
        Metric::new(r.received_bps / 1e6, "Mbit/s"),
    );
    rec.metrics.insert(
        names::BYTES_RECEIVED.into(),
        Metric::new(r.bytes_received as f64, "B"),
    );
    if let Some(rt) = r.retransmits {
        rec.metrics.insert(
            names::RETRANSMITS.into(),
            Metric::new(rt as f64, "segments"),
        );
    }
    rec.metrics.insert(
        names::SENDER_CPU_PCT.into(),
        Metric::new(r.sender_cpu_pct, "%"),
    );
    rec.metrics.insert(
        names::RECEIVER_CPU_PCT.into(),
        Metric::new(r.receiver_cpu_pct, "%"),
    );
    iblab_core::evidence::host_counters::record(
        rec,
        sender,
        r.bytes_sent,
        receiver,
        r.bytes_received,
        "TCP: every byte crosses write() on the sender and read() on the receiver (a copy each) through both kernels' stacks",
    );
    if r.received_bps <= 0.0 {
        rec.verdict = Verdict::Fail;
        rec.reason = Some("no bytes arrived".into());
    }
}
