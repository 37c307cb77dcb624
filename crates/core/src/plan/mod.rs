//! Lab + scenario + what the backend can do → a concrete, ordered Plan. No side effects.

pub mod backend;
pub mod hca;
pub mod steps;

use std::collections::BTreeMap;

use iblab_lab::address;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::caps::HostCaps;
use crate::fault::LossMechanism;
use crate::plan::backend::Backend;
use iblab_lab::expr;
use iblab_lab::limits;
use iblab_lab::load::LoadedLab;
use iblab_lab::{
    FaultAction, Lab, Lang, PathKind, ProbeKind, SmAction, Text, TrafficTest, Verb, expectation_id,
};
use rust_i18n::t;

/// Why planning stopped: bad input (exit 2) or an environment that cannot carry the lab (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    Environment(String),
}

/// What the user asked for on the command line.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub scenario: Option<String>,
    pub backend: String,
    /// `--paths`: a subset of the lab's paths.
    pub paths: Option<Vec<PathKind>>,
    /// `--hca DEVICE[:PORT]`: a real adapter of this host carries the path of its link layer.
    pub hca: Option<String>,
    /// The id of the run this plan is for, where it is made for one (`up`): names that must
    /// differ between runs sharing a kernel (a kube node's Soft-RoCE devices) carry it.
    /// `None`: a plan only (`plan`, `render`).
    pub run: Option<String>,
    /// The language the run speaks to its learner (`--lang`, else the locale): the lab's
    /// texts are taken in it, and the evidence is written in it.
    pub lang: Lang,
}

/// A real adapter's port carrying one path (`--hca`).
#[derive(Debug, Clone, Serialize)]
pub struct PlannedHca {
    pub device: String,
    pub port: u8,
    pub link_layer: String,
    pub path: PathKind,
    /// The adapter is in the lab's nodes, given to each by the backend (a device plugin's
    /// resource in every pod), not on this host: its link layer is the one `path` needs,
    /// checked in the nodes at bring-up.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub in_nodes: bool,
}

/// `--hca DEVICE[:PORT]`, split.
fn hca_spec(spec: &str) -> Result<(&str, u8), PlanError> {
    let device = spec.split(':').next().unwrap_or_default();
    if device.is_empty()
        || !device
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(PlanError::BadInput(format!(
            "--hca {spec}: `{device}` is not an RDMA device name (letters, digits, `_`, `-`, `.`; e.g. mlx5_0)"
        )));
    }
    match spec.split_once(':') {
        Some((d, p)) => Ok((
            d,
            p.parse::<u8>().map_err(|_| {
                PlanError::BadInput(format!(
                    "--hca {spec}: `{p}` is not a port number (write DEVICE or DEVICE:PORT, e.g. mlx5_0:1)"
                ))
            })?,
        )),
        None => Ok((spec, 1)),
    }
}

/// Resolve `--hca DEVICE[:PORT]` for a backend whose nodes are given the adapter: its link
/// layer cannot be read from here, so it carries the lab's RoCE path where the run has one
/// (the usual adapter on a cluster), else its InfiniBand path; the fabric checks the port's
/// real link layer in the nodes before any step, and says which `--paths` fits if it
/// differs.
fn resolve_hca_in_nodes(
    spec: &str,
    lab_paths: &[PathKind],
    selected: Option<&[PathKind]>,
) -> Result<PlannedHca, PlanError> {
    let (device, port) = hca_spec(spec)?;
    let runs = |p: &PathKind| lab_paths.contains(p) && selected.is_none_or(|s| s.contains(p));
    let path = [PathKind::Roce, PathKind::Ib]
        .into_iter()
        .find(runs)
        .ok_or_else(|| {
            PlanError::BadInput(format!(
                "--hca {spec}: this run has neither path ② roce nor ③ ib for an adapter to carry"
            ))
        })?;
    Ok(PlannedHca {
        device: device.to_string(),
        port,
        link_layer: match path {
            PathKind::Ib => "InfiniBand",
            _ => "Ethernet",
        }
        .to_string(),
        path,
        in_nodes: true,
    })
}

/// Resolve `--hca DEVICE[:PORT]` against this host's RDMA devices (sysfs).
fn resolve_hca(spec: &str, ports: &BTreeMap<String, String>) -> Result<PlannedHca, PlanError> {
    let (device, port) = hca_spec(spec)?;
    let link_layer = ports
        .get(&format!("{device}:{port}"))
        .cloned()
        .ok_or_else(|| {
            PlanError::Environment(format!(
                "--hca {spec}: this host has no RDMA device {device} with a port {port} \
                 (`iblab doctor` lists the devices it has)"
            ))
        })?;
    if hca::is_software(device) {
        return Err(PlanError::BadInput(format!(
            "--hca {spec}: {device} is a software device, not a real adapter; Soft-RoCE is \
             the softroce fabric, which iblab sets up itself"
        )));
    }
    let path = hca::path_of(&link_layer).ok_or_else(|| {
        PlanError::Environment(format!(
            "--hca {spec}: link layer `{link_layer}` carries none of iblab's paths"
        ))
    })?;
    Ok(PlannedHca {
        device: device.to_string(),
        port,
        link_layer,
        path,
        in_nodes: false,
    })
}

/// The run, concretely.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub lab: String,
    /// The language of the run: the lab's texts below are in it where the lab has them.
    pub lang: Lang,
    pub title: String,
    pub lesson: Option<u8>,
    pub scenario: String,
    pub backend: String,
    pub backend_reason: String,
    /// What the chosen backend is like (its kernel, its links), for the fabrics and the
    /// evidence.
    pub backend_traits: crate::plan::backend::Traits,
    /// What the plan knows of its backend (device names, where iblab is in the nodes).
    /// Its JSON key (`plan --json`) is `home`, as it always was.
    #[serde(rename = "home")]
    pub backend_facts: BackendFacts,
    pub paths: Vec<PathKind>,
    /// Paths of the lab left out of this run, with the reason.
    pub excluded: BTreeMap<PathKind, String>,
    pub params: BTreeMap<String, serde_json::Value>,
    pub loss_mechanism: LossMechanism,
    pub nodes: Vec<PlannedNode>,
    pub links: Vec<PlannedLink>,
    pub steps: Vec<PlannedStep>,
    pub expectations: Vec<PlannedExpectation>,
    /// Subnet managers of path ib and whether each starts at bring-up.
    pub subnet_managers: Vec<PlannedSm>,
    /// Comparison rows the lab declares (judged from the evidence after the run).
    pub compare: Vec<iblab_lab::CompareSpec>,
    /// The path a real adapter carries (`--hca`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hca: Option<PlannedHca>,
    /// What the fabrics need from the chosen backend, checked read-only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preflight: Vec<crate::caps::preflight::Check>,
    /// How many times each traffic step instance runs (`up --repeat N`); its verdict and
    /// metrics are then the median's, the spread kept in the evidence.
    pub repeat: u32,
    /// The run this plan was made for ([`Request::run`]); `None`: a plan only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// What the reader must know of the plan, in its language (texts of the lab that
    /// lack it): the run's evidence starts its notes with them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Plan {
    /// Does a step run iblab itself on a node: path ①'s ping-pong, the verbs probe, or
    /// `iblab` (the path `{{ iblab }}` gave) in a command? Backends whose nodes do not
    /// share this host's files bring it there only then.
    pub fn runs_iblab_in_nodes(&self, iblab: &str) -> bool {
        self.steps
            .iter()
            .filter(|s| s.skip.is_none())
            .any(|s| s.action.runs_iblab(s.path, iblab))
    }

    /// Run every traffic step instance `n` times (at least once), each within its own
    /// deadline: the step's deadline grows with it.
    pub fn with_repeat(mut self, n: u32) -> Plan {
        let n = n.max(1);
        for s in self.steps.iter_mut() {
            if let Action::Traffic(t) = &s.action {
                // The deadline already covers the step's own runs; the executor runs the
                // larger count.
                let own = t.repeat.max(1);
                s.timeout = s.timeout / own * own.max(n);
            }
        }
        self.repeat = n;
        self
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PlannedSm {
    pub name: String,
    pub node: String,
    pub priority: u8,
    /// Started at bring-up (its `when` held, or it has none).
    pub start: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlannedNode {
    pub name: String,
    pub switch: bool,
    pub interfaces: Vec<Interface>,
    /// A switch whose bridge runs spanning tree (its segment has a loop).
    pub stp: bool,
}

impl PlannedNode {
    /// `interface address/prefix`, one per addressed interface (switch ports have none).
    pub fn addresses(&self) -> Vec<String> {
        self.interfaces
            .iter()
            .filter_map(|i| i.address.as_ref().map(|a| format!("{} {a}", i.name)))
            .collect()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Interface {
    pub name: String,
    pub link: String,
    /// `198.18.0.1/24`; switches' ports have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub mtu: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlannedLink {
    pub name: String,
    /// (node, interface) at each end.
    pub ends: [(String, String); 2],
    pub mtu: u32,
    pub segment: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlannedStep {
    pub id: String,
    pub name: Option<String>,
    /// The path this instance runs on (traffic steps are one instance per path).
    pub path: Option<PathKind>,
    pub action: Action,
    #[serde(with = "secs")]
    pub timeout: Duration,
    pub finally: bool,
    pub continue_on_error: bool,
    /// A `when` that depends on earlier results, judged when the step comes up.
    pub when: Option<String>,
    /// Set when planning already decided the step does not run, with the reason.
    pub skip: Option<String>,
}

/// What a step does, resolved. Each kind of step carries its own type, so the part of
/// iblab that runs it takes exactly what it needs.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Action {
    Exec {
        node: String,
        argv: Vec<String>,
        expect_exit: i32,
    },
    Traffic(Traffic),
    Fault(Fault),
    /// Repeat `inner` (an exec or a probe) until `until` holds.
    Wait(Wait),
    /// Read the InfiniBand subnet from `node`'s HCA, or a path's device on a node.
    Probe(Probe),
    /// Start, stop or kill a subnet manager.
    Sm(SmControl),
    Sleep {
        #[serde(with = "secs")]
        duration: Duration,
    },
}

impl Action {
    /// Does this action run iblab on a node (its step on `path`): path ①'s ping-pong, the
    /// verbs probe, or a command naming `iblab` (the binary's path in the nodes), also as a
    /// wait's attempt. Every kind answers, so a new one must decide.
    pub fn runs_iblab(&self, path: Option<PathKind>, iblab: &str) -> bool {
        match self {
            Action::Traffic(t) => {
                path == Some(PathKind::Tcp)
                    && matches!(t.test, TrafficTest::Latency | TrafficTest::Connect)
            }
            Action::Probe(p) => p.what == ProbeKind::Verbs,
            Action::Exec { argv, .. } => argv.iter().any(|a| a.contains(iblab)),
            Action::Wait(w) => w.inner.runs_iblab(path, iblab),
            Action::Fault(_) | Action::Sm(_) | Action::Sleep { .. } => false,
        }
    }
}

#[cfg(test)]
mod runs_iblab_tests {
    use super::*;

    /// A command naming the binary runs it, in a wait too; a sleep, or a command that
    /// names another program, does not.
    #[test]
    fn a_command_naming_iblab_runs_it_in_the_node() {
        let exec = |argv: &[&str]| Action::Exec {
            node: "a".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            expect_exit: 0,
        };
        let iblab = "/opt/iblab/bin/iblab";
        assert!(exec(&["sh", "-c", "/opt/iblab/bin/iblab verbs-probe"]).runs_iblab(None, iblab));
        assert!(!exec(&["ip", "link"]).runs_iblab(None, iblab));
        let wait = Action::Wait(Wait {
            inner: Box::new(exec(&[iblab, "pingpong"])),
            until: "true".into(),
            interval: Duration::from_secs(1),
        });
        assert!(wait.runs_iblab(None, iblab));
        let sleep = Action::Sleep {
            duration: Duration::from_secs(1),
        };
        assert!(!sleep.runs_iblab(Some(PathKind::Tcp), iblab));
    }
}

/// A traffic step on one path: `from` sends to `to` (at `to_address`).
#[derive(Debug, Clone, Serialize)]
pub struct Traffic {
    pub test: TrafficTest,
    pub verb: Verb,
    pub size: u32,
    pub from: String,
    pub to: String,
    pub to_address: String,
    pub seconds: f64,
    pub streams: u32,
    pub exchange: iblab_lab::Exchange,
    /// The QP's local ACK timeout exponent (4.096 µs × 2^N) where a fabric models a link
    /// that waits rather than drops (③'s credit model); `None`: the tools' default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_timeout: Option<u8>,
    /// Count what each link carried during the measurement (see the lab's `countLinks`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub count_links: bool,
    /// Capture the sender's cable during the test (the lab's `capture`): the exchange's
    /// TCP packets and the RoCEv2 packets, in order.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub capture: bool,
    /// Runs of each path's measurement the lab asks for (the lab's `repeat`, else 1); the
    /// executor runs the larger of this and the plan's `repeat`.
    #[serde(skip_serializing_if = "is_one")]
    pub repeat: u32,
}

fn is_one(n: &u32) -> bool {
    *n <= 1
}

/// A fault on a link, applied at its `targets` (node, interface).
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub link: String,
    pub action: FaultAction,
    pub targets: Vec<(String, String)>,
    pub loss_percent: Option<f64>,
    pub rate_bps: Option<u64>,
    pub queue_bytes: Option<u64>,
}

/// Repeat `inner` until `until` holds.
#[derive(Debug, Clone, Serialize)]
pub struct Wait {
    pub inner: Box<Action>,
    pub until: String,
    #[serde(with = "secs")]
    pub interval: Duration,
}

/// What a probe reads, on which path and node.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub what: ProbeKind,
    pub path: PathKind,
    pub node: String,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// Start, stop or kill a subnet manager.
#[derive(Debug, Clone, Serialize)]
pub struct SmControl {
    pub name: String,
    pub action: SmAction,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlannedExpectation {
    pub id: String,
    pub that: String,
    /// The lab's words, in every language it has them (the judge writes the run's
    /// language, and English for JUnit).
    pub because: Text,
    pub on_fail: Option<Text>,
    pub when: Option<String>,
    pub paths: Vec<PathKind>,
    pub needs: Option<iblab_lab::Needs>,
}

mod secs {
    use serde::Serializer;
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// What a plan knows of the backend it was made for: its name, the names of the Soft-RoCE
/// devices path ② makes on each host node (one per addressed interface), and the iblab
/// binary as the nodes see it.
#[derive(Debug, Clone, Serialize)]
pub struct BackendFacts {
    pub name: String,
    pub rdma_devices: BTreeMap<String, Vec<String>>,
    pub iblab: String,
}

impl BackendFacts {
    /// The facts of `backend` for these nodes, in run `run` (`None`: a plan only); where the
    /// backend gives every node an adapter (`adapter`), that is each node's one device.
    pub fn of(
        backend: &dyn Backend,
        run: Option<&str>,
        nodes: &[PlannedNode],
        adapter: Option<&str>,
    ) -> BackendFacts {
        BackendFacts {
            name: backend.name().to_string(),
            rdma_devices: nodes
                .iter()
                .filter(|n| !n.switch)
                .map(|n| {
                    if let Some(a) = adapter {
                        return (n.name.clone(), vec![a.to_string()]);
                    }
                    let devices = n
                        .interfaces
                        .iter()
                        .enumerate()
                        .filter(|(_, i)| i.address.is_some())
                        .map(|(x, _)| backend.rdma_device(run, &n.name, x))
                        .collect();
                    (n.name.clone(), devices)
                })
                .collect(),
            iblab: backend.iblab_path(),
        }
    }
}

/// What templates and plan-time conditions read (the names [`expr::ROOTS`] gives
/// [`expr::Phase::Plan`]). Expressions judged during and after the run read the same, plus
/// `steps` (see `evidence::judge::context`): one shape for both.
pub fn context(
    scenario: &str,
    params: &BTreeMap<String, serde_json::Value>,
    paths: &[PathKind],
    nodes: &[PlannedNode],
    backend: &BackendFacts,
) -> serde_json::Map<String, serde_json::Value> {
    let nodes: serde_json::Map<String, serde_json::Value> = nodes
        .iter()
        .filter(|n| !n.switch)
        .map(|n| {
            let ip = n
                .interfaces
                .first()
                .and_then(|i| i.address.as_deref())
                .and_then(|a| a.split('/').next())
                .unwrap_or("");
            let interfaces: Vec<&str> = n.interfaces.iter().map(|i| i.name.as_str()).collect();
            let rdma_devices = backend
                .rdma_devices
                .get(&n.name)
                .cloned()
                .unwrap_or_default();
            (
                n.name.clone(),
                json!({"ip": ip, "interfaces": interfaces, "rdma_devices": rdma_devices}),
            )
        })
        .collect();
    let ctx = json!({
        "scenario": scenario,
        "params": params,
        "paths": paths.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
        "nodes": nodes,
        "backend": backend.name,
        // The iblab binary as the nodes see it, for `exec` steps that run its probes.
        "iblab": backend.iblab,
    });
    match ctx {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// Build the plan for one of `backends` (in the order `--backend auto`
/// considers them), against a snapshot of this host.
pub fn plan(
    loaded: &LoadedLab,
    req: &Request,
    caps: &HostCaps,
    backends: &[&dyn Backend],
) -> Result<Plan, PlanError> {
    let lab = &loaded.lab;
    let (scenario, params) = scenario_params(lab, req)?;
    let hca = adapter(lab, req, caps, backends)?;
    let on_hca = |p: &PathKind| hca.as_ref().is_some_and(|h| h.path == *p);
    // The backend is chosen for the paths the adapter does not carry.
    let wanted: Vec<PathKind> = lab
        .spec
        .paths
        .iter()
        .filter(|p| req.paths.as_ref().is_none_or(|s| s.contains(p)))
        .filter(|p| !on_hca(p))
        .copied()
        .collect();
    let choice = crate::plan::backend::choose(backends, &req.backend, &wanted, caps).map_err(
        |e| match e {
            crate::plan::backend::ChooseError::Unknown(m) => PlanError::BadInput(m),
            crate::plan::backend::ChooseError::Unavailable(m) => PlanError::Environment(m.0),
        },
    )?;
    let (chosen, backend_reason) = (choice.backend, choice.reason);
    // Planned as the host will be once the choice's programs are installed (`up` installs
    // or names them before anything runs).
    let assumed = caps.assuming(&choice.assumes);
    let caps = &assumed;
    let backend = chosen.name().to_string();
    let (paths, excluded) = run_paths(lab, req, chosen, caps, &on_hca)?;
    // The paths the backend's own devices carry (not an adapter's).
    let verbs_in_nodes = chosen.verbs_in_nodes(
        &paths
            .iter()
            .filter(|p| !on_hca(p))
            .copied()
            .collect::<Vec<_>>(),
        caps,
    );

    let (nodes, links) = wire(lab);
    let facts = BackendFacts::of(
        chosen,
        req.run.as_deref(),
        &nodes,
        hca.as_ref()
            .filter(|h| h.in_nodes)
            .map(|h| h.device.as_str()),
    );
    let ctx = serde_json::Value::Object(context(&scenario, &params, &paths, &nodes, &facts));
    let planning = steps::Planning {
        lab,
        scenario: &scenario,
        lang: req.lang,
        ctx: &ctx,
        nodes: &nodes,
        links: &links,
        paths: &paths,
        excluded: &excluded,
        backend: chosen,
        hca: hca.as_ref(),
        verbs_in_nodes,
    };
    let mut steps = Vec::new();
    for s in &loaded.steps {
        let planned = steps::plan_step(&planning, s)
            .map_err(|e| PlanError::BadInput(format!("step `{}`: {e}", s.id)))?;
        steps.extend(planned);
    }
    let subnet_managers = subnet_managers(lab, &paths, &ctx)?;

    // Soft-RoCE's preflight, from the snapshot taken before planning.
    let preflight = if paths.contains(&PathKind::Roce) && !on_hca(&PathKind::Roce) {
        caps.preflight.get(&backend).cloned().unwrap_or_default()
    } else {
        vec![]
    };
    if let Some(h) = &hca {
        skip_subnet_steps(&mut steps, h);
    }
    within_a_run(&steps)?;
    Ok(Plan {
        lab: lab.metadata.name.clone(),
        lang: req.lang,
        title: lab.metadata.title.get(req.lang).to_string(),
        lesson: lab.metadata.lesson,
        scenario,
        backend,
        backend_reason,
        backend_traits: crate::plan::backend::Traits {
            // The paths the backend's own devices carry (not an adapter's).
            verbs_in_nodes,
            ..chosen.traits()
        },
        backend_facts: facts,
        paths,
        excluded,
        params,
        loss_mechanism: caps.loss_mechanism(),
        nodes,
        links,
        steps,
        expectations: expectations(lab),
        subnet_managers,
        compare: lab.spec.compare.clone(),
        hca,
        preflight,
        repeat: 1,
        run_id: req.run.clone(),
        notes: notes(lab, req.lang),
    })
}

/// The scenario the run is (`default` unless asked) and the parameters it has.
fn scenario_params(
    lab: &Lab,
    req: &Request,
) -> Result<(String, BTreeMap<String, serde_json::Value>), PlanError> {
    let scenario = req.scenario.clone().unwrap_or_else(|| "default".into());
    let mut params = lab.spec.params.clone();
    if scenario != "default" {
        let Some(sc) = lab.spec.scenarios.get(&scenario) else {
            let known: Vec<&str> = std::iter::once("default")
                .chain(lab.spec.scenarios.keys().map(String::as_str))
                .collect();
            return Err(PlanError::BadInput(format!(
                "lab `{}` has no scenario `{scenario}`; its scenarios are: {}",
                lab.metadata.name,
                known.join(", ")
            )));
        };
        params.extend(sc.params.clone());
    }
    Ok((scenario, params))
}

/// The real adapter `--hca` names, resolved where the backend asked for has it (in its
/// nodes, or on this host), and the path it carries, which the lab must use.
fn adapter(
    lab: &Lab,
    req: &Request,
    caps: &HostCaps,
    backends: &[&dyn Backend],
) -> Result<Option<PlannedHca>, PlanError> {
    let Some(spec) = &req.hca else {
        return Ok(None);
    };
    // A backend that gives its nodes the adapter takes `--hca` there; the others resolve it
    // against this host's devices.
    let named = backends.iter().find(|h| h.name() == req.backend);
    let in_nodes = match named.map(|h| h.hca_in_nodes()) {
        Some(Err(why)) => return Err(PlanError::BadInput(format!("--hca {spec}: {why}"))),
        Some(Ok(b)) => b,
        None => false,
    };
    let h = if in_nodes {
        resolve_hca_in_nodes(spec, &lab.spec.paths, req.paths.as_deref())?
    } else {
        resolve_hca(spec, &caps.rdma_ports)?
    };
    if !lab.spec.paths.contains(&h.path) {
        return Err(PlanError::BadInput(format!(
            "--hca {spec}: its link layer ({}) carries path {}, which lab `{}` does not use",
            h.link_layer, h.path, lab.metadata.name
        )));
    }
    Ok(Some(h))
}

/// The lab's paths narrowed by `--paths` (each of which the lab must use), every one the
/// backend must carry unless the adapter does; and those left out, with the reason.
fn run_paths(
    lab: &Lab,
    req: &Request,
    backend: &dyn Backend,
    caps: &HostCaps,
    on_hca: &dyn Fn(&PathKind) -> bool,
) -> Result<(Vec<PathKind>, BTreeMap<PathKind, String>), PlanError> {
    let lab_paths = || {
        lab.spec
            .paths
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    if let Some(p) = req
        .paths
        .iter()
        .flatten()
        .find(|p| !lab.spec.paths.contains(p))
    {
        return Err(PlanError::BadInput(format!(
            "--paths names `{p}`, which lab `{}` does not use (its paths: {})",
            lab.metadata.name,
            lab_paths()
        )));
    }
    let mut excluded = BTreeMap::new();
    let mut paths = Vec::new();
    for p in &lab.spec.paths {
        if let Some(sel) = &req.paths
            && !sel.contains(p)
        {
            excluded.insert(*p, "left out with --paths".to_string());
            continue;
        }
        if !on_hca(p)
            && let Err(why) = backend.carries(*p, caps)
        {
            return Err(PlanError::Environment(format!(
                "path {} {p} cannot run on the {} backend here: {why}\n  fix: {}, or leave the path out with --paths {}",
                p.mark(),
                backend.name(),
                crate::plan::backend::fix_for(*p),
                lab.spec
                    .paths
                    .iter()
                    .filter(|q| *q != p && req.paths.as_ref().is_none_or(|s| s.contains(q)))
                    .map(|q| q.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            )));
        }
        paths.push(*p);
    }
    Ok((paths, excluded))
}

/// The subnet managers of path ③, each started at bring-up where its `when` holds.
fn subnet_managers(
    lab: &Lab,
    paths: &[PathKind],
    ctx: &serde_json::Value,
) -> Result<Vec<PlannedSm>, PlanError> {
    if !paths.contains(&PathKind::Ib) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for m in &lab.spec.subnet_managers {
        let start = match &m.when {
            None => true,
            Some(w) => expr::eval_bool(w, ctx).map_err(|e| {
                PlanError::BadInput(format!("subnet manager `{}`: when: {e}", m.name))
            })?,
        };
        out.push(PlannedSm {
            name: m.name.clone(),
            node: m.on.clone(),
            priority: m.priority.unwrap_or(10),
            start,
        });
    }
    Ok(out)
}

fn expectations(lab: &Lab) -> Vec<PlannedExpectation> {
    lab.spec
        .expect
        .iter()
        .enumerate()
        .map(|(i, e)| PlannedExpectation {
            id: expectation_id(e, i),
            that: e.that.clone(),
            because: e.because.clone(),
            on_fail: e.on_fail.clone(),
            when: e.when.clone(),
            paths: e.paths.clone(),
            needs: e.needs,
        })
        .collect()
}

/// The steps' deadlines, added up, within one run's.
fn within_a_run(steps: &[PlannedStep]) -> Result<(), PlanError> {
    let longest: Duration = steps.iter().map(|s| s.timeout).sum();
    if longest > limits::MAX_RUN {
        return Err(PlanError::BadInput(format!(
            "the steps' time limits add up to {:.0} s after templating; one run of a lab takes at most {} s (6h)\n  fix: shorten the steps (`seconds`, `timeout`) or split the lab",
            longest.as_secs_f64(),
            limits::MAX_RUN.as_secs()
        )));
    }
    Ok(())
}

/// A text of the lab that lacks the run's language is read in another: said once.
fn notes(lab: &Lab, lang: Lang) -> Vec<String> {
    lab.falls_back(lang)
        .into_iter()
        .map(|other| {
            t!(
                "plan.text_falls_back",
                locale = lang.tag(),
                lab = lab.metadata.name,
                lang = lang.name(),
                other = other.name()
            )
            .into_owned()
        })
        .collect()
}

/// On a real adapter (`--hca`) iblab measures traffic; it does not drive a real subnet:
/// SM control and subnet probes on that path (also inside a `wait`) are skipped.
fn skip_subnet_steps(steps: &mut [PlannedStep], h: &PlannedHca) {
    fn drives_subnet(a: &Action, on: PathKind) -> bool {
        match a {
            Action::Probe(Probe { what, path, .. }) => {
                *path == on
                    && !matches!(
                        what,
                        iblab_lab::ProbeKind::Device | iblab_lab::ProbeKind::Verbs
                    )
            }
            Action::Sm(SmControl { .. }) => on == PathKind::Ib,
            Action::Wait(Wait { inner, .. }) => drives_subnet(inner, on),
            _ => false,
        }
    }
    let connects = |a: &Action| {
        matches!(
            a,
            Action::Traffic(Traffic {
                test: iblab_lab::TrafficTest::Connect,
                ..
            })
        )
    };
    for st in steps.iter_mut().filter(|st| st.skip.is_none()) {
        if drives_subnet(&st.action, h.path) {
            st.skip = Some(format!(
                "path {} {} is on {} (--hca {}): iblab does not drive a real subnet (SM, LIDs, LFTs){}",
                h.path.mark(),
                h.path,
                if h.in_nodes {
                    "the adapter the nodes were given"
                } else {
                    "a real adapter"
                },
                h.device,
                if h.in_nodes && h.path == PathKind::Roce {
                    ", and its traffic does not ride the lab's bridges"
                } else {
                    ""
                }
            ));
        } else if h.in_nodes && st.path == Some(h.path) && connects(&st.action) {
            st.skip = Some(hca::NO_RDMA_CM.to_string());
        }
    }
}

/// Interfaces, addresses and veth ends for every node, switch and link.
/// The lab's nodes with their interfaces and addresses, and its cables (no host facts).
pub fn wire(lab: &Lab) -> (Vec<PlannedNode>, Vec<PlannedLink>) {
    let t = &lab.spec.topology;
    let prefix = t
        .addressing
        .as_ref()
        .and_then(|a| address::Prefix::parse(&a.ipv4).ok())
        .unwrap_or_else(address::default_prefix);
    let segments = address::segments(lab);
    let seg_of: BTreeMap<usize, usize> = segments
        .iter()
        .flat_map(|s| s.links.iter().map(move |&l| (l, s.index)))
        .collect();
    let looped = address::looped_switches(lab);
    let mut nodes: Vec<PlannedNode> = t
        .nodes
        .iter()
        .map(|n| PlannedNode {
            name: n.clone(),
            switch: false,
            interfaces: vec![],
            stp: false,
        })
        .chain(t.switches.iter().map(|n| PlannedNode {
            name: n.clone(),
            switch: true,
            interfaces: vec![],
            stp: looped.contains(n),
        }))
        .collect();
    let mut links = Vec::new();
    for (li, l) in t.links.iter().enumerate() {
        let seg = seg_of.get(&li).copied().unwrap_or(0);
        let mtu = l.mtu.unwrap_or(1500);
        let mut ends: Vec<(String, String)> = Vec::new();
        for e in &l.ends {
            let Some(node) = nodes.iter_mut().find(|n| &n.name == e) else {
                continue;
            };
            let ifname = if node.switch {
                format!("p{}", node.interfaces.len() + 1)
            } else {
                format!("eth{}", node.interfaces.len())
            };
            let address = if node.switch {
                None
            } else {
                let host = t.nodes.iter().position(|n| n == e).unwrap_or(0) + 1;
                Some(format!("{}/24", prefix.addr(seg, host)))
            };
            node.interfaces.push(Interface {
                name: ifname.clone(),
                link: l.id(),
                address,
                mtu,
            });
            ends.push((e.clone(), ifname));
        }
        if ends.len() == 2 {
            let b = ends.pop().unwrap_or_default();
            let a = ends.pop().unwrap_or_default();
            links.push(PlannedLink {
                name: l.id(),
                ends: [a, b],
                mtu,
                segment: seg,
            });
        }
    }
    (nodes, links)
}

/// The address of `to` on a segment it shares with `from`.
fn address_toward(lab: &Lab, nodes: &[PlannedNode], from: &str, to: &str) -> Option<String> {
    let seg = address::shared_segment(lab, from, to)?;
    let seg_links: Vec<String> = address::segments(lab)[seg]
        .links
        .iter()
        .map(|&i| lab.spec.topology.links[i].id())
        .collect();
    let node = nodes.iter().find(|n| n.name == to)?;
    node.interfaces
        .iter()
        .find(|i| seg_links.contains(&i.link))
        .and_then(|i| i.address.as_deref())
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step kind of the lab model (`iblab_lab::StepKind::ALL`) has its arm in the
    /// planner and is recorded in the evidence under its own keyword (the docs and the
    /// schema: the binary's `src/cli/info.rs`). A step of each kind is taken from the built-in labs (none
    /// uses `sleep`: one is added).
    #[test]
    fn every_step_kind_is_planned_and_recorded_as_itself() {
        use iblab_lab::{RawStep, StepKind, quantity::DurationSpec};
        let backends = crate::plan::backend::testing::backends();
        // The guest brings its kernel's rdma_rxe: every path runs there.
        let caps = HostCaps::for_tests().assuming(&["qemu-system-x86_64"]);
        let mut planned: Vec<&str> = Vec::new();
        let mut refused = Vec::new();
        for b in iblab_lab::builtin::all() {
            let mut lab = iblab_lab::load::resolve(b.name).unwrap();
            if b.name == "tcp-loss" {
                let pause = RawStep {
                    id: Some("pause".into()),
                    sleep: Some(DurationSpec(Duration::from_millis(10))),
                    ..Default::default()
                };
                lab.steps
                    .push(pause.resolve(lab.lab.spec.steps.len()).unwrap());
                lab.lab.spec.steps.push(pause);
            }
            for backend in ["local", "vm"] {
                let req = Request {
                    scenario: None,
                    backend: backend.into(),
                    paths: None,
                    hca: None,
                    run: None,
                    lang: Default::default(),
                };
                let p = match plan(&lab, &req, &caps, &backends) {
                    Ok(p) => p,
                    Err(e) => {
                        refused.push(format!("{} on {backend}: {e}", b.name));
                        continue;
                    }
                };
                for s in &lab.steps {
                    let word = s.kind().word();
                    for ps in p.steps.iter().filter(|ps| ps.id == s.id) {
                        let kind = crate::evidence::blank(ps, 0.0).kind;
                        assert_eq!(kind.word(), word, "{} step {}", b.name, s.id);
                        if !planned.contains(&word) {
                            planned.push(word);
                        }
                    }
                }
            }
        }
        for k in StepKind::ALL {
            assert!(
                planned.contains(&k.word()),
                "no step of kind {} was planned (refused: {refused:?}; planned: {planned:?})",
                k.word()
            );
        }
    }

    /// A sysfs tree shaped like /sys/class/infiniband: an RDMA NIC, an IB HCA and rxe.
    /// A probe reads the path its kind belongs to when the lab names none: leaving ③ out
    /// skips lesson 4's subnet probes, not the Ethernet `learned` probe that ① is judged on.
    #[test]
    fn a_learned_probe_belongs_to_path_tcp() {
        let lab = iblab_lab::load::resolve("lesson4").unwrap();
        let req = Request {
            scenario: None,
            backend: "local".into(),
            paths: Some(vec![PathKind::Tcp]),
            hca: None,
            run: None,
            lang: Default::default(),
        };
        let p = plan(
            &lab,
            &req,
            &HostCaps::for_tests(),
            &crate::plan::backend::testing::backends(),
        )
        .unwrap();
        let step = |id: &str| p.steps.iter().find(|s| s.id == id).unwrap();
        assert!(step("learned").skip.is_none(), "{:?}", step("learned").skip);
        assert!(step("ports").skip.is_some());
    }

    /// A step's own `repeat: N` gives it N runs' deadline, and `--repeat` raises the
    /// count, not both multiplied.
    #[test]
    fn a_repeated_steps_deadline_covers_its_runs() {
        let lab = iblab_lab::load::resolve("lesson2").unwrap();
        let req = Request {
            scenario: None,
            backend: "local".into(),
            paths: Some(vec![PathKind::Tcp]),
            hca: None,
            run: None,
            lang: Default::default(),
        };
        let backends = crate::plan::backend::testing::backends();
        let p = plan(&lab, &req, &HostCaps::for_tests(), &backends).unwrap();
        let deadline = |p: &Plan, id: &str| p.steps.iter().find(|s| s.id == id).unwrap().timeout;
        let (bw, lat) = (deadline(&p, "bandwidth"), deadline(&p, "latency"));
        // Lesson 2's latency step runs three times; its bandwidth step once.
        assert!(lat >= 3 * Duration::from_secs(20), "{lat:?}");
        let p3 = p.clone().with_repeat(3);
        assert_eq!(deadline(&p3, "latency"), lat);
        assert_eq!(deadline(&p3, "bandwidth"), bw * 3);
        let p5 = p.with_repeat(5);
        assert_eq!(deadline(&p5, "latency"), lat / 3 * 5);
    }

    /// With ③ on a real IB adapter, lesson 4's SM control and subnet probes (also those
    /// inside a `wait`) are skipped with the reason; its traffic is not.
    #[test]
    fn subnet_steps_are_skipped_on_a_real_ib_adapter() {
        let lab = iblab_lab::load::resolve("lesson4").unwrap();
        let req = Request {
            scenario: None,
            backend: "local".into(),
            // Lesson 4's local form: ② needs rxe, which these namespaces lack.
            paths: Some(vec![PathKind::Tcp, PathKind::Ib]),
            hca: None,
            run: None,
            lang: Default::default(),
        };
        let mut plan = plan(
            &lab,
            &req,
            &HostCaps::for_tests(),
            &crate::plan::backend::testing::backends(),
        )
        .unwrap();
        let h = PlannedHca {
            device: "mlx5_1".into(),
            port: 1,
            link_layer: "InfiniBand".into(),
            path: PathKind::Ib,
            in_nodes: false,
        };
        skip_subnet_steps(&mut plan.steps, &h);
        let skipped = |id: &str| {
            plan.steps.iter().filter(|s| s.id == id).all(|s| {
                s.skip
                    .as_deref()
                    .is_some_and(|w| w.contains("real adapter"))
            })
        };
        for id in [
            "ports",
            "routes",
            "trace",
            "sm",
            "kill_master",
            "failover",
            "sa_back",
        ] {
            assert!(skipped(id), "{id} not skipped");
        }
        let traffic = plan
            .steps
            .iter()
            .filter(|s| matches!(s.action, Action::Traffic(Traffic { .. })))
            .collect::<Vec<_>>();
        assert!(!traffic.is_empty());
        assert!(
            traffic
                .iter()
                .filter(|s| s.path != Some(PathKind::Roce))
                .all(|s| s.skip.is_none())
        );
    }

    /// Planning reads nothing of this host: a snapshot of another machine (qemu there,
    /// its own preflight) gives a plan for that machine.
    #[test]
    fn a_plan_is_made_from_the_snapshot_alone() {
        let lab = iblab_lab::load::resolve("lesson2").unwrap();
        let mut snap = HostCaps::for_tests();
        snap.tools
            .insert("qemu-system-x86_64".into(), Some("/elsewhere/qemu".into()));
        snap.preflight.insert(
            "vm".into(),
            vec![crate::caps::preflight::Check {
                name: "rdma_rxe",
                mark: crate::caps::preflight::Mark::Ok,
                text: "from the snapshot".into(),
            }],
        );
        let req = Request {
            scenario: None,
            backend: "auto".into(),
            paths: None,
            hca: None,
            run: None,
            lang: Default::default(),
        };
        let p = plan(
            &lab,
            &req,
            &snap,
            &crate::plan::backend::testing::backends(),
        )
        .unwrap();
        assert_eq!(p.backend, "vm", "{}", p.backend_reason);
        assert!(p.backend_traits.own_kernel);
        assert_eq!(p.preflight.len(), 1);
        assert_eq!(p.preflight[0].text, "from the snapshot");
        // The same lab on a snapshot without qemu: still the guest, planned as the host will
        // be once qemu is installed (`up` installs or names it before anything runs), and
        // the snapshot itself is left as it was.
        snap.tools.clear();
        let p = plan(
            &lab,
            &req,
            &snap,
            &crate::plan::backend::testing::backends(),
        )
        .unwrap();
        assert_eq!(p.backend, "vm", "{}", p.backend_reason);
        assert!(
            p.backend_reason
                .contains("once qemu-system-x86 is installed"),
            "{}",
            p.backend_reason
        );
        assert!(!snap.has("qemu-system-x86_64"));
        // Asked for a backend that cannot carry roce here: the plan says so.
        let local = Request {
            backend: "local".into(),
            ..req
        };
        assert!(matches!(
            plan(&lab, &local, &snap, &crate::plan::backend::testing::backends()),
            Err(PlanError::Environment(m)) if m.contains("roce")
        ));
    }

    /// Where the backend gives the nodes the adapter, `--hca` is not looked for on this host:
    /// it carries the run's RoCE path, else its InfiniBand path, each node's device is the
    /// adapter, and a name that is no device name is refused.
    #[test]
    fn an_adapter_in_the_nodes_carries_the_runs_roce_path_else_ib() {
        use PathKind::*;
        let h = resolve_hca_in_nodes("rxe0", &[Tcp, Roce, Ib], None).unwrap();
        assert_eq!((h.path, h.port, h.in_nodes), (Roce, 1, true));
        assert_eq!(h.link_layer, "Ethernet");
        let h = resolve_hca_in_nodes("mlx5_1:2", &[Tcp, Roce, Ib], Some(&[Tcp, Ib])).unwrap();
        assert_eq!(
            (h.path, h.port, h.link_layer.as_str()),
            (Ib, 2, "InfiniBand")
        );
        assert!(matches!(
            resolve_hca_in_nodes("mlx5_0", &[Tcp], None),
            Err(PlanError::BadInput(m)) if m.contains("neither")
        ));
        for bad in ["mlx5_0;reboot", "", ":1", "a b"] {
            assert!(
                matches!(hca_spec(bad), Err(PlanError::BadInput(_))),
                "{bad:?} accepted"
            );
        }
        // The plan's nodes name the adapter as their device (`{{ nodes.a.rdma_devices }}`).
        let lab = iblab_lab::load::resolve("lesson3").unwrap();
        let backends = crate::plan::backend::testing::backends();
        let (nodes, _) = wire(&lab.lab);
        let b = BackendFacts::of(backends[0], Some("r1"), &nodes, Some("rxe0"));
        assert_eq!(b.rdma_devices["a"], vec!["rxe0".to_string()]);
    }

    #[test]
    fn hca_resolves_to_the_path_of_its_link_layer() {
        // As `host::rdma_ports` reads /sys/class/infiniband: device:port → link layer.
        let root: BTreeMap<String, String> = [
            ("mlx5_0:1", "Ethernet"),
            ("mlx5_1:1", "InfiniBand"),
            ("mlx5_1:2", "InfiniBand"),
            ("rxe0:1", "Ethernet"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let h = resolve_hca("mlx5_0", &root).unwrap();
        assert_eq!(
            (h.port, h.path, h.link_layer.as_str()),
            (1, PathKind::Roce, "Ethernet")
        );
        let h = resolve_hca("mlx5_1:2", &root).unwrap();
        assert_eq!((h.port, h.path), (2, PathKind::Ib));
        assert!(matches!(
            resolve_hca("mlx5_1:x", &root),
            Err(PlanError::BadInput(m)) if m.contains("not a port number")
        ));
        assert!(matches!(
            resolve_hca("mlx5_7", &root),
            Err(PlanError::Environment(m)) if m.contains("no RDMA device mlx5_7")
        ));
        assert!(matches!(
            resolve_hca("rxe0", &root),
            Err(PlanError::BadInput(m)) if m.contains("software device")
        ));
    }
}
