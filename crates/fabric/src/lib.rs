//! Fabrics: what carries a path. Each sets itself up on the provisioned nodes and moves
//! the data of traffic steps on its path; the step context they run in (`ctx`), and the
//! ping-pong iblab itself runs in nodes for path ①'s latency (`pingpong`). Adding a
//! fabric touches this crate only.

pub mod ctx;
pub mod ethernet;
pub mod hca;
pub mod ibsim;
pub mod listener;
pub mod pingpong;
mod rdma_counters;
pub mod softroce;

use async_trait::async_trait;

use crate::ctx::StepCtx;
use iblab_backend::EnvError;
use iblab_core::evidence::StepRecord;
use iblab_core::plan::{Plan, PlannedStep, Traffic};
use iblab_lab::names;
use iblab_lab::{FaultAction, PathKind};

/// The fabric under one path of the comparison.
#[async_trait]
pub trait Fabric: Send + Sync {
    /// Short name in plans and evidence: `ethernet`, `softroce`, `ibsim`, `hca`.
    fn name(&self) -> &'static str;
    fn path(&self) -> PathKind;
    /// Prepare the fabric on provisioned nodes (devices, a subnet manager, …). Resources
    /// it creates are recorded in the run's state file first.
    async fn setup(&self, _ctx: &mut StepCtx<'_>) -> Result<(), EnvError> {
        Ok(())
    }
    /// Run one traffic step instance on this path.
    async fn traffic(
        &self,
        step: &PlannedStep,
        t: &Traffic,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError>;
    /// Run a step only this fabric knows (a probe, SM control); `None` when not ours.
    async fn control(
        &self,
        _step: &PlannedStep,
        _ctx: &mut StepCtx<'_>,
        _at: f64,
    ) -> Option<Result<StepRecord, EnvError>> {
        None
    }
    /// The lab is kept (`up --keep`): leave every process of this fabric running (they
    /// stay in the state file for `iblab down`).
    async fn keep(&self) {}
    /// A fault on a cable: the fabric applies its side of it (e.g. ibsim Unlink for
    /// `down`). Returns what it did, for the evidence.
    async fn link_fault(
        &self,
        _link: &str,
        _action: FaultAction,
        _percent: Option<f64>,
        _ctx: &mut StepCtx<'_>,
    ) -> Result<Vec<serde_json::Value>, EnvError> {
        Ok(vec![])
    }
}

/// Round-trip latency figures of a step, whichever tool measured them (µs).
pub struct Latency {
    pub min: f64,
    pub typical: f64,
    pub avg: f64,
    pub max: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub round_trips: u64,
}

impl Latency {
    /// Put the figures into a step record under the names every path uses.
    pub fn record(&self, rec: &mut StepRecord) {
        use iblab_core::evidence::Metric;
        for (k, v) in [
            (names::LATENCY_MIN_US, self.min),
            (names::LATENCY_TYPICAL_US, self.typical),
            (names::LATENCY_AVG_US, self.avg),
            (names::LATENCY_MAX_US, self.max),
            (names::LATENCY_STDEV_US, self.stdev),
            (names::LATENCY_P99_US, self.p99),
            (names::LATENCY_P99_9_US, self.p99_9),
        ] {
            rec.metrics.insert(k.into(), Metric::new(v, "us"));
        }
        rec.metrics.insert(
            names::ROUND_TRIPS.into(),
            Metric::new(self.round_trips as f64, "count"),
        );
    }
}

/// What perftest measured, into a step record: bandwidth (the JSON file, else the
/// table) with both sides' host counters per MiB the tool moved, or latency. A run that
/// measured nothing fails the step with the reason.
pub fn perftest_results(
    rec: &mut StepRecord,
    bandwidth: bool,
    stdout: &str,
    json_text: &str,
    sender: Option<iblab_core::counters::ProcessCounters>,
    receiver: Option<iblab_core::counters::ProcessCounters>,
    counters_note: &str,
) {
    use iblab_core::evidence::{Metric, Verdict};
    use iblab_tools::perftest;
    if !bandwidth {
        match perftest::parse_latency(stdout) {
            Ok(l) => Latency {
                min: l.t_min,
                typical: l.t_typical,
                avg: l.t_avg,
                max: l.t_max,
                stdev: l.t_stdev,
                p99: l.p99,
                p99_9: l.p99_9,
                round_trips: l.iterations,
            }
            .record(rec),
            Err(e) => {
                rec.verdict = Verdict::Fail;
                rec.reason = Some(e.to_string());
            }
        }
        return;
    }
    let table = perftest::parse_bw_table(stdout);
    let unit = table
        .as_ref()
        .map(|t| t.unit)
        .unwrap_or(perftest::BwUnit::Gbps);
    match perftest::parse_bw_json(json_text, unit).or(table) {
        Ok(b) => {
            let gbps = match b.unit {
                perftest::BwUnit::Gbps => b.bw_average,
                perftest::BwUnit::MBps => b.bw_average * 8.0 / 1000.0,
            };
            rec.metrics.insert(
                names::THROUGHPUT_MBPS.into(),
                Metric::new(gbps * 1000.0, "Mbit/s"),
            );
            rec.metrics.insert(
                names::MSG_RATE_MPPS.into(),
                Metric::new(b.msg_rate_mpps, "Mpps"),
            );
            rec.metrics.insert(
                names::ITERATIONS.into(),
                Metric::new(b.iterations as f64, "count"),
            );
            rec.metrics
                .insert(names::MSG_SIZE.into(), Metric::new(b.msg_size as f64, "B"));
            // Bytes moved, by the tool's own count: iterations × message size.
            let bytes = b.iterations * b.msg_size;
            iblab_core::evidence::host_counters::record(
                rec,
                sender,
                bytes,
                receiver,
                bytes,
                counters_note,
            );
            if gbps <= 0.0 {
                rec.verdict = Verdict::Fail;
                rec.reason = Some("no bandwidth measured".into());
            }
        }
        Err(e) => {
            rec.verdict = Verdict::Fail;
            rec.reason = Some(e.to_string());
        }
    }
}

/// What the fabrics of a plan start, each where it runs (the run's list gathers them).
pub fn programs(
    plan: &Plan,
    backend: &dyn iblab_core::plan::backend::Backend,
    needs: &mut iblab_core::programs::Needs,
) {
    ethernet::programs(plan, backend, needs);
    softroce::programs(plan, needs);
    ibsim::programs(plan, backend, needs);
    hca::programs(plan, needs);
}

/// The fabrics for the paths a plan runs, in path order. Where the backend's nodes have
/// verbs devices, path ③ shares path ②'s engine to carry its bytes.
pub fn for_plan(plan: &Plan) -> Result<Vec<Box<dyn Fabric>>, EnvError> {
    let verbs = plan.backend_traits.verbs_in_nodes;
    let engine = std::sync::Arc::new(softroce::SoftRoce::default());
    Ok(plan
        .paths
        .iter()
        .map(|p| match (p, plan.hca.as_ref().filter(|h| h.path == *p)) {
            // An adapter the backend gave every node: the verbs engine runs in the nodes.
            (_, Some(h)) if h.in_nodes => {
                Box::new(softroce::SoftRoce::on_adapter(softroce::Adapter {
                    device: h.device.clone(),
                    port: h.port,
                    path: h.path,
                })) as Box<dyn Fabric>
            }
            (_, Some(h)) => Box::new(hca::Hca::new(&h.device, h.port, h.path)) as Box<dyn Fabric>,
            (PathKind::Tcp, _) => Box::new(ethernet::Ethernet) as Box<dyn Fabric>,
            (PathKind::Roce, _) => Box::new(Shared(engine.clone())) as Box<dyn Fabric>,
            (PathKind::Ib, _) => {
                let roce_on_rxe = plan.paths.contains(&PathKind::Roce)
                    && plan.hca.as_ref().is_none_or(|h| h.path != PathKind::Roce);
                let carrier = verbs.then(|| ibsim::Carrier {
                    engine: engine.clone(),
                    set_up_here: !roce_on_rxe,
                });
                Box::new(ibsim::Ibsim::new(plan, carrier)) as Box<dyn Fabric>
            }
        })
        .collect())
}

/// Path ②'s fabric when its engine is shared with path ③.
struct Shared(std::sync::Arc<softroce::SoftRoce>);

#[async_trait]
impl Fabric for Shared {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn path(&self) -> PathKind {
        self.0.path()
    }
    async fn setup(&self, ctx: &mut StepCtx<'_>) -> Result<(), EnvError> {
        self.0.setup(ctx).await
    }
    async fn traffic(
        &self,
        step: &PlannedStep,
        t: &Traffic,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        self.0.traffic(step, t, ctx, at).await
    }
    async fn control(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Option<Result<StepRecord, EnvError>> {
        self.0.control(step, ctx, at).await
    }
    async fn link_fault(
        &self,
        link: &str,
        action: FaultAction,
        percent: Option<f64>,
        ctx: &mut StepCtx<'_>,
    ) -> Result<Vec<serde_json::Value>, EnvError> {
        self.0.link_fault(link, action, percent, ctx).await
    }
    async fn keep(&self) {
        self.0.keep().await
    }
}

/// What became of the server side of a transfer whose client failed, for the step's
/// reason (empty when nothing is known, as for a process inside a guest): a peer that
/// vanished (killed, crashed) or stopped answering (stopped) is named as such, so the
/// failure does not read as a network fault. `ended` and `state` are the server's
/// [`Background::exited`](iblab_sys::process::Background::exited) and state letter, read
/// when the client returned.
pub fn peer_fate(
    tool: &str,
    node: &str,
    ended: Option<Option<i32>>,
    state: Option<char>,
) -> String {
    match (ended, state) {
        (Some(None), _) => {
            format!("; the {tool} server on {node} ended during the transfer (killed by a signal)")
        }
        (Some(Some(c)), _) if c != 0 => {
            format!("; the {tool} server on {node} ended during the transfer (exit code {c})")
        }
        (None, Some('T' | 't')) => {
            format!("; the {tool} server on {node} was stopped (it no longer answered)")
        }
        (None, Some(_)) => format!("; the {tool} server on {node} was still running"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod peer_tests {
    use super::peer_fate;

    #[test]
    fn a_vanished_or_stopped_peer_is_named() {
        let f = |e, s| peer_fate("iperf3", "a", e, s);
        assert!(
            f(Some(None), None)
                .contains("iperf3 server on a ended during the transfer (killed by a signal)")
        );
        assert!(f(Some(Some(1)), None).contains("exit code 1"));
        assert!(f(None, Some('T')).contains("was stopped"));
        assert!(f(None, Some('S')).contains("was still running"));
        assert_eq!(f(Some(Some(0)), None), "");
        assert_eq!(f(None, None), "");
    }
}
