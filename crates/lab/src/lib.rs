//! The lab model: what a lab file says, typed (apiVersion iblab.dev/v1, kind Lab).

pub mod address;
pub mod builtin;
pub mod diag;
pub mod expr;
pub mod limits;
pub mod load;
pub mod locate;
pub mod names;
pub mod quantity;
pub mod text;
pub mod validate;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use quantity::{DurationSpec, Param};
pub use text::{Lang, Text};

/// A lab that parsed and validated, with its source kept for later diagnostics.
#[derive(Debug)]
pub struct LoadedLab {
    /// The lab as its file writes it.
    pub lab: Lab,
    /// Its steps, each resolved into its one kind by validation (`spec.steps`, in order).
    pub steps: Vec<Step>,
    pub source: diag::SourceFile,
    pub locator: locate::Locator,
}

/// The API version every lab file declares.
pub const API_VERSION: &str = "iblab.dev/v1";

/// A lab: one lesson's topology, steps and the evidence it must show.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Lab {
    /// Always `iblab.dev/v1`.
    pub api_version: String,
    /// Always `Lab`.
    pub kind: String,
    pub metadata: Metadata,
    pub spec: Spec,
}

/// Who the lab is and what it teaches.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    /// Short name, `[a-z0-9-]`, used on the command line and in run folders.
    pub name: String,
    /// One line a learner reads first.
    pub title: Text,
    /// The course lesson this lab belongs to (1..6), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lesson: Option<u8>,
    /// What the learner should understand after the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Text>,
    /// The language of the lab's texts written as plain strings (`en` unless it says);
    /// a text may also be written per language: `{zh-CN: …, en: …}`. A reader whose
    /// language a text lacks reads it in the language it has, with a note saying so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<Lang>,
}

/// The body of a lab.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    pub topology: Topology,
    /// The paths of the course's comparison this lab exercises: tcp (1), roce (2), ib (3).
    #[serde(default = "default_paths")]
    pub paths: Vec<PathKind>,
    /// Parameters steps and expectations can read as `params.NAME`; scenarios override them.
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
    /// Subnet managers (opensm) of the InfiniBand subnet on path ib.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_managers: Vec<SubnetManagerSpec>,
    /// Named variants of the lab; each overrides some parameters.
    #[serde(default)]
    pub scenarios: BTreeMap<String, Scenario>,
    /// What the run does, in order.
    pub steps: Vec<RawStep>,
    /// What the evidence must show, judged after the steps.
    #[serde(default)]
    pub expect: Vec<Expectation>,
    /// Rows of the comparison, beyond the measured metrics' own: each cell an expression
    /// over the evidence (what a probe observed, a metric), so rows are measured, never
    /// written into the lab.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compare: Vec<CompareSpec>,
}

/// A row of the comparison: the same question asked of each path.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CompareSpec {
    /// Identifier in evidence.json, the same in every language; `[a-z][a-z0-9_]*`.
    /// Defaults to `rowN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// What the row compares, e.g. `address`.
    pub row: Text,
    /// `host` (inside the host: verbs, copies, syscalls) or `network` (the network layer).
    pub group: CompareGroup,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Text>,
    /// Expression giving path ①'s value, e.g. `steps.dev_tcp.address`: one for every
    /// language, or one per language where the value is words (`{zh-CN: "'由 SM 分配'",
    /// en: "'given by the SM'"}`). Keep it short: the terminal shows it on one line;
    /// longer words go in `detail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ib: Option<Text>,
    /// Longer words behind a cell (expressions too, per path): shown in report.html and
    /// with `-v`, kept in evidence.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<PathTexts>,
    /// For numeric cells: how far apart (in percent of the larger) ② and ③ may be and
    /// still count as equal, with `why` that much spread is expected. Without it numeric
    /// cells are shown but ② = ③ is not decided; text cells are equal when identical.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
    /// Which way is a gain on this row (`lower` for a cost, `higher` for a rate): the
    /// row is then one of the gains ①→② and ②→③ that `iblab advise` sets side by side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub better: Option<Better>,
    /// `hardware`: the gain this row stands for shows only on real RDMA hardware; from
    /// soft, emulated or modelled figures it is printed as such, never as a gain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Needs>,
}

/// Which way a comparison row's figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// A cost: fewer syscalls, copies, CPU time per MiB.
    Lower,
    /// A rate or a share: throughput, retention.
    Higher,
}

/// A declared tolerance for a numeric comparison row.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tolerance {
    /// Percent of the larger value (e.g. 25).
    pub percent: f64,
    /// Or this far apart in the row's unit, whatever the percentage (small counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absolute: Option<f64>,
    /// Why the measurement spreads that much (shown next to the row).
    pub why: Text,
}

/// An expression per path (for a comparison row's `detail`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PathTexts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce: Option<Text>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ib: Option<Text>,
}

impl PathTexts {
    /// The text of each path that has one.
    pub fn cells(&self) -> Vec<(PathKind, &Text)> {
        per_path([&self.tcp, &self.roce, &self.ib])
    }
}

/// The texts of ① ② ③ that are there, with their path.
fn per_path(texts: [&Option<Text>; 3]) -> Vec<(PathKind, &Text)> {
    PathKind::ALL
        .into_iter()
        .zip(texts)
        .filter_map(|(p, e)| e.as_ref().map(|e| (p, e)))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CompareGroup {
    Host,
    Network,
}

impl CompareSpec {
    /// The expression of each path that has one.
    pub fn cells(&self) -> Vec<(PathKind, &Text)> {
        per_path([&self.tcp, &self.roce, &self.ib])
    }
}

fn default_paths() -> Vec<PathKind> {
    vec![PathKind::Tcp]
}

/// The three ways of moving bytes the course compares.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PathKind {
    /// (1) Ethernet with plain kernel TCP sockets.
    Tcp,
    /// (2) RoCEv2: RDMA verbs over Ethernet (UDP port 4791).
    Roce,
    /// (3) InfiniBand: the same verbs over an IB subnet.
    Ib,
}

impl PathKind {
    pub const ALL: [PathKind; 3] = [PathKind::Tcp, PathKind::Roce, PathKind::Ib];

    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::Tcp => "tcp",
            PathKind::Roce => "roce",
            PathKind::Ib => "ib",
        }
    }

    /// The course's circled number for the path.
    pub fn mark(self) -> &'static str {
        match self {
            PathKind::Tcp => "①",
            PathKind::Roce => "②",
            PathKind::Ib => "③",
        }
    }

    pub fn parse(s: &str) -> Option<PathKind> {
        PathKind::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl std::fmt::Display for PathKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Nodes, switches and the links between them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Topology {
    /// Hosts. Each is its own network stack (a namespace, a container, a VM or a pod).
    pub nodes: Vec<String>,
    /// Switches: an Ethernet bridge (and, on path ib, an IB switch).
    #[serde(default)]
    pub switches: Vec<String>,
    /// Cables between two of the above.
    #[serde(default)]
    pub links: Vec<LinkSpec>,
    /// Address plan; defaults to 198.18.0.0/15, which never collides with a LAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addressing: Option<Addressing>,
}

/// A cable.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LinkSpec {
    /// The two ends: node or switch names.
    pub ends: Vec<String>,
    /// Name faults use to refer to the link; defaults to `END1-END2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Ethernet MTU of the link (default 1500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl LinkSpec {
    /// The link's name: given, or derived from its ends.
    pub fn id(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.ends.join("-"))
    }
}

/// Address plan of the lab's Ethernet segments.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Addressing {
    /// IPv4 prefix to carve /24 segments from, e.g. `198.18.0.0/15`.
    pub ipv4: String,
}

/// An opensm instance of the InfiniBand subnet, attached at a node's HCA.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SubnetManagerSpec {
    /// Name steps use (`sm: { name: sm1, action: stop }`).
    pub name: String,
    /// The node whose HCA port the SM runs on.
    pub on: String,
    /// SM priority 0..15; the highest becomes master, the others standby (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Start it at bring-up only when this expression holds (default: always),
    /// e.g. `scenario != 'sm-off'`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
}

/// A named variant of the lab.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    /// What this variant changes and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<Text>,
    /// Parameters this scenario overrides (each must exist in `spec.params`).
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
}

/// The kinds of step, each as the keyword a lab file sets on a step (the field of
/// [`RawStep`] of that name) and the spec it takes; the one list of them, from which
/// [`StepKind::ALL`], the keywords, [`StepAction`], a raw step's resolution and "exactly
/// one of" messages come.
macro_rules! step_kinds {
    ($($kind:ident($spec:ty) = $field:ident),+ $(,)?) => {
        /// What a step does: the one keyword of [`StepKind::ALL`] a step sets.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum StepKind {
            $($kind),+
        }

        impl StepKind {
            /// Every kind, in the order the format documents them.
            pub const ALL: &[StepKind] = &[$(StepKind::$kind),+];

            /// The kind's keyword in a lab file (and in the evidence's `kind`).
            pub fn word(self) -> &'static str {
                match self {
                    $(StepKind::$kind => stringify!($field)),+
                }
            }
        }

        /// What a resolved step does: its one kind, with that kind's spec.
        #[derive(Debug, Clone)]
        pub enum StepAction {
            $($kind($spec)),+
        }

        impl StepAction {
            /// The kind of this action.
            pub fn kind(&self) -> StepKind {
                match self {
                    $(StepAction::$kind(_) => StepKind::$kind),+
                }
            }
        }

        impl RawStep {
            /// Whether this step sets the keyword of `kind`.
            pub fn is(&self, kind: StepKind) -> bool {
                match kind {
                    $(StepKind::$kind => self.$field.is_some()),+
                }
            }

            /// The action of every kind keyword set on this step, in [`StepKind::ALL`]'s order.
            fn actions(&self) -> Vec<StepAction> {
                let mut out = Vec::new();
                $(
                    if let Some(spec) = &self.$field {
                        out.push(StepAction::$kind(spec.clone()));
                    }
                )+
                out
            }
        }
    };
}

step_kinds! {
    Exec(ExecSpec) = exec,
    Traffic(TrafficSpec) = traffic,
    Fault(FaultSpec) = fault,
    Wait(WaitSpec) = wait,
    Sleep(DurationSpec) = sleep,
    Probe(ProbeSpec) = probe,
    Sm(SmControlSpec) = sm,
}

impl StepKind {
    /// Every kind's keyword, `exec, traffic, …`, for messages.
    pub fn words() -> String {
        Self::ALL
            .iter()
            .map(|k| k.word())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

// The step as the lab file writes it (what serde reads and `iblab schema` describes, as
// `Step`); validation resolves it into a [`Step`] of one [`StepAction`] (parse raw, then
// resolve). Its doc line below is the schema's description.
/// One thing the run does. Exactly one of `exec`, `traffic`, `fault`, `wait`, `sleep`,
/// `probe`, `sm`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(rename = "Step")]
pub struct RawStep {
    /// Identifier expressions use (`steps.ID`); `[a-z][a-z0-9_]*`. Defaults to `stepN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// What the step is for, in a learner's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Text>,
    /// Run the step only when this expression holds (e.g. `params.loss > 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Deadline for the step; it is killed and fails past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationSpec>,
    /// Run this step whatever happened before (cleanup), like `finally`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finally: bool,
    /// A failing step does not stop the run (its failure is still evidence).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continue_on_error: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<TrafficSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitSpec>,
    /// Pause, e.g. `2s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<DurationSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm: Option<SmControlSpec>,
}

/// Read the state of the InfiniBand subnet (path ib) with infiniband-diags.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProbeSpec {
    pub what: ProbeKind,
    /// For `trace`: the source node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// For `trace`: the destination node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The node whose HCA asks (default: the first node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The path whose device a `device` or `verbs` probe reads (default ib; the other
    /// probes read the IB subnet and take ib only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathKind>,
}

impl ProbeSpec {
    /// The path it reads when the lab names none: a `learned` probe reads Ethernet
    /// bridges (path ① tcp), every other probe the IB subnet (path ③ ib).
    pub fn path_or_default(&self) -> PathKind {
        self.path.unwrap_or(if self.what == ProbeKind::Learned {
            PathKind::Tcp
        } else {
            PathKind::Ib
        })
    }
}

/// What a probe reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// Every HCA port: state, physical state, LID, SM LID (smpquery portinfo).
    Ports,
    /// Every switch's linear forwarding table (ibroute).
    Routes,
    /// The path between two HCAs through the switches (ibtracert).
    Trace,
    /// The master subnet manager as a node sees it (sminfo).
    Sm,
    /// Whether the subnet administrator answers (saquery): the node's own record, and
    /// with `to`, the path record from `node` to `to` (how IB finds a peer: the SA tells
    /// the source the destination's LID and the path's properties).
    Sa,
    /// The nodes the fabric holds (ibnetdiscover).
    Nodes,
    /// The device a path uses on a node: none for tcp, the rxe device for roce
    /// (ibv_devinfo), the HCA for ib (ibstat): transport, link layer, address.
    Device,
    /// What Ethernet learned by itself (path tcp or roce): every bridge's learned
    /// forwarding entries (`bridge fdb`) and every host's neighbour table (`ip neigh`,
    /// filled by ARP), against the hosts' burnt-in MACs.
    Learned,
    /// The costs verbs impose, made as mistakes on real queue pairs of the node's device
    /// on path roce or ib (`iblab verbs-probe`: unregistered memory, a SEND without a
    /// RECV, posting before RTS): `steps.ID.PATH.json`. On ib the node's port must be
    /// admitted by the subnet (ACTIVE, with a LID) first.
    Verbs,
}

impl ProbeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Ports => "ports",
            ProbeKind::Routes => "routes",
            ProbeKind::Trace => "trace",
            ProbeKind::Sm => "sm",
            ProbeKind::Sa => "sa",
            ProbeKind::Nodes => "nodes",
            ProbeKind::Device => "device",
            ProbeKind::Learned => "learned",
            ProbeKind::Verbs => "verbs",
        }
    }
}

/// Start, stop or kill a subnet manager.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SmControlSpec {
    /// A name from `spec.subnetManagers`.
    pub name: String,
    pub action: SmAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SmAction {
    Start,
    /// SIGTERM: opensm says goodbye.
    Stop,
    /// SIGKILL: the SM vanishes (a crashed host).
    Kill,
}

impl SmAction {
    pub fn as_str(self) -> &'static str {
        match self {
            SmAction::Start => "start",
            SmAction::Stop => "stop",
            SmAction::Kill => "kill",
        }
    }
}

/// Run a command on a node (argument vector, no shell).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecSpec {
    pub node: String,
    /// Program and arguments; each may use templates such as `{{ nodes.a.ip }}`.
    pub command: Vec<String>,
    /// Exit code that counts as success (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_exit: Option<i32>,
}

/// Move data between two nodes on one or more paths and measure it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TrafficSpec {
    /// What to measure.
    #[serde(default)]
    pub test: TrafficTest,
    /// Sending node (the client).
    pub from: String,
    /// Receiving node (the server).
    pub to: String,
    /// Paths to run it on; default: every path of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<PathKind>>,
    /// Duration of the measurement in seconds (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<Param<f64>>,
    /// Parallel streams (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<Param<u32>>,
    /// RDMA operation on verbs paths (default: write for bandwidth, send for latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verb: Option<Verb>,
    /// Message size in bytes for verbs tests (default 65536 for bandwidth, 2 for latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    /// How the two ends of a soft verbs test (paths roce and ib) swap their QP numbers
    /// and addresses: `rdma_cm` (the default) or `tcp`, an ordinary TCP connection, whose
    /// passive side then sleeps on that socket instead of busy-polling: the one to use
    /// when the passive side's CPU time is to mean the transfer's, not the tool's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<Exchange>,
    /// Count what each link and switch carried during each path's measurement (each
    /// node's interface byte counters before and after it), so an expectation can read
    /// which links the path crossed: `steps.ID.PATH.links_crossed`, `wire_switches`, `link_bytes`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub count_links: bool,
    /// Capture what the sender's cable carries during a verbs test (tcpdump on the
    /// sender's interface): the TCP connection of an `exchange: tcp` (the QP numbers it
    /// carried) and the RoCEv2 packets (the QP they were addressed to), in order, so an
    /// expectation can read `steps.ID.PATH.exchange_tcp_packets`,
    /// `exchange_before_rdma`, `exchange_qpn_matches`. Paths roce and ib only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capture: bool,
    /// Run each path's measurement this many times (1–20) and judge the median of each
    /// figure, with the spread in the step's `detail.repeat`: for a claim about the typical
    /// case that one run on a busy machine does not show. `up --repeat N` raises it to N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
}

/// How a verbs test's two ends find each other (see [`TrafficSpec::exchange`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Exchange {
    /// perftest `-R`: the RDMA connection manager, by IP (its passive side busy-polls).
    #[default]
    RdmaCm,
    /// perftest without `-R`: an out-of-band TCP connection (its passive side sleeps).
    Tcp,
}

/// Kinds of traffic measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrafficTest {
    /// Throughput (iperf3 on tcp; ib_write_bw on roce and ib).
    #[default]
    Bandwidth,
    /// Round-trip latency of small messages (a TCP ping-pong on tcp; ib_send_lat on roce).
    Latency,
    /// Connection setup and a few messages (rping, over the RDMA CM, on roce).
    Connect,
}

impl TrafficTest {
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficTest::Bandwidth => "bandwidth",
            TrafficTest::Latency => "latency",
            TrafficTest::Connect => "connect",
        }
    }
}

/// Which RDMA operation a verbs test uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// One-sided RDMA WRITE: the peer CPU is not involved.
    Write,
    /// One-sided RDMA READ.
    Read,
    /// Two-sided SEND/RECV: the receiver posts a RECV first.
    Send,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Write => "write",
            Verb::Read => "read",
            Verb::Send => "send",
        }
    }
}

/// Break or shape a link.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FaultSpec {
    /// Link name (see `topology.links[].name`).
    pub link: String,
    pub action: FaultAction,
    /// Percentage of frames dropped, for `loss` (0 < p <= 100); of MADs, for `mad-errors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<Param<f64>>,
    /// Rate for `rate`, in tc units: `100mbit`, `1gbit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Queue size for `rate`, in tc units (default `64kb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Only frames travelling toward this end are affected (default: both directions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toward: Option<String>,
}

/// What a fault does to a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FaultAction {
    /// Drop a random share of frames.
    Loss,
    /// Limit the rate with a token bucket and a bounded queue.
    Rate,
    /// Take the link down.
    Down,
    /// Bring the link up again.
    Up,
    /// Remove every loss and rate fault from the link (counting what was dropped).
    Clear,
    /// Count what crosses the link (UDP to 4791, i.e. RoCEv2, and TCP) until `clear`.
    Count,
    /// On path ib: make a share of the management datagrams on a port fail (ibsim Error).
    #[serde(rename = "mad-errors")]
    MadErrors,
}

impl FaultAction {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultAction::Loss => "loss",
            FaultAction::Rate => "rate",
            FaultAction::Down => "down",
            FaultAction::Up => "up",
            FaultAction::Clear => "clear",
            FaultAction::Count => "count",
            FaultAction::MadErrors => "mad-errors",
        }
    }
}

/// Repeat a command or a probe until an expression over its result holds, or fail at the deadline.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WaitSpec {
    /// Expression over `result` (the last attempt: `result.exit_code`, `result.stdout`,
    /// or a probe's fields) and the evidence so far.
    pub until: String,
    /// The command to repeat (or give `probe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecSpec>,
    /// The probe to repeat (or give `exec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeSpec>,
    /// Pause between attempts (default 500ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<DurationSpec>,
}

/// A claim the evidence must support.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expectation {
    /// Identifier in reports and JUnit; `[a-z][a-z0-9_]*`. Defaults to `expectN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Expression over the evidence that must be true, e.g.
    /// `steps.lossy.tcp.throughput_mbps < steps.clean.tcp.throughput_mbps`.
    pub that: String,
    /// Why it holds: what the learner reads when it passes.
    pub because: Text,
    /// What the learner reads when it fails (default: a generic line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_fail: Option<Text>,
    /// Judge only when this expression holds (e.g. `scenario == 'loss'`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// Paths the claim is about; skipped (never passed) when one is left out of the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathKind>,
    /// A claim that holds only on some fabric: `hardware` skips it (never passes it) when
    /// any step it reads has a provenance other than hardware (soft, emulated, modelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Needs>,
}

/// What an expectation needs to be judged at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Needs {
    /// Real RDMA hardware (an HCA or RDMA NIC) under every step it reads.
    Hardware,
    /// Paths ② and ③ measured on verbs devices of their own: a claim that compares them is
    /// skipped (never passed) where a step it reads on ② and one on ③ ran on the same
    /// device, since there the two figures agree by construction (③'s bytes riding ②'s
    /// rxe, as on a machine without an IB HCA).
    #[serde(rename = "separate-devices")]
    SeparateDevices,
}

/// Why a raw step resolves to no [`Step`]: it sets no kind keyword, or several.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepKindError {
    #[error("this step does nothing")]
    Nothing,
    #[error("this step is several things at once: {}", words(.0))]
    Several(Vec<StepKind>),
}

fn words(kinds: &[StepKind]) -> String {
    kinds
        .iter()
        .map(|k| k.word())
        .collect::<Vec<_>>()
        .join(", ")
}

impl StepKindError {
    /// How to fix it: the one list of kinds.
    pub fn hint(&self) -> String {
        format!("give each step exactly one of: {}", StepKind::words())
    }
}

impl RawStep {
    /// The kind keyword of this step (`exec`, `traffic`, …), if exactly one is set.
    pub fn kind(&self) -> Option<&'static str> {
        let kinds = self.kinds();
        if kinds.len() == 1 {
            Some(kinds[0])
        } else {
            None
        }
    }

    /// Every kind keyword set on this step.
    pub fn kinds(&self) -> Vec<&'static str> {
        StepKind::ALL
            .iter()
            .filter(|k| self.is(**k))
            .map(|k| k.word())
            .collect()
    }

    /// This step (the `index`th of its lab) with its one action: the only way to a
    /// [`Step`], and the one place "exactly one kind" is decided.
    pub fn resolve(&self, index: usize) -> Result<Step, StepKindError> {
        let mut actions = self.actions();
        let action = match actions.len() {
            0 => return Err(StepKindError::Nothing),
            1 => actions.remove(0),
            _ => {
                return Err(StepKindError::Several(
                    actions.iter().map(StepAction::kind).collect(),
                ));
            }
        };
        Ok(Step {
            id: step_id(self, index),
            name: self.name.clone(),
            when: self.when.clone(),
            timeout: self.timeout,
            finally: self.finally,
            continue_on_error: self.continue_on_error,
            action,
        })
    }
}

/// A step resolved from its [`RawStep`]: what every step has, and its one action.
#[derive(Debug, Clone)]
pub struct Step {
    /// Given, or `stepN`.
    pub id: String,
    pub name: Option<Text>,
    pub when: Option<String>,
    pub timeout: Option<DurationSpec>,
    pub finally: bool,
    pub continue_on_error: bool,
    pub action: StepAction,
}

impl Step {
    /// The kind of this step.
    pub fn kind(&self) -> StepKind {
        self.action.kind()
    }
}

/// A step's id: given, or `stepN` (1-based).
pub fn step_id(step: &RawStep, index: usize) -> String {
    step.id
        .clone()
        .unwrap_or_else(|| format!("step{}", index + 1))
}

/// An expectation's id: given, or `expectN` (1-based).
pub fn expectation_id(e: &Expectation, index: usize) -> String {
    e.id.clone()
        .unwrap_or_else(|| format!("expect{}", index + 1))
}

/// A comparison row's id: given, or `rowN` (1-based).
pub fn compare_id(r: &CompareSpec, index: usize) -> String {
    r.id.clone().unwrap_or_else(|| format!("row{}", index + 1))
}

/// What a text of a lab is: words a learner reads, or an expression whose value is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    /// Words: written in the lab's language unless written per language.
    Words,
    /// An expression (a comparison cell): one for every language unless written per
    /// language.
    Expression,
    /// A unit (`ms/MiB`): the same in every language unless written per language.
    Unit,
}

impl Lab {
    /// The language of the lab's plain strings.
    pub fn language(&self) -> Lang {
        self.metadata.language.unwrap_or_default()
    }

    /// Every text of the lab a learner reads (or reads the value of), with its path in the
    /// file (`spec.expect[2].because`) and what it is.
    pub fn texts(&self) -> Vec<(String, &Text, TextKind)> {
        use TextKind::{Expression, Unit, Words};
        let mut out = vec![("metadata.title".to_string(), &self.metadata.title, Words)];
        if let Some(g) = &self.metadata.goal {
            out.push(("metadata.goal".into(), g, Words));
        }
        for (name, sc) in &self.spec.scenarios {
            if let Some(d) = &sc.description {
                out.push((format!("spec.scenarios.{name}.description"), d, Words));
            }
        }
        for (i, s) in self.spec.steps.iter().enumerate() {
            if let Some(n) = &s.name {
                out.push((format!("spec.steps[{i}].name"), n, Words));
            }
        }
        for (i, e) in self.spec.expect.iter().enumerate() {
            out.push((format!("spec.expect[{i}].because"), &e.because, Words));
            if let Some(f) = &e.on_fail {
                out.push((format!("spec.expect[{i}].onFail"), f, Words));
            }
        }
        for (i, r) in self.spec.compare.iter().enumerate() {
            let at = format!("spec.compare[{i}]");
            out.push((format!("{at}.row"), &r.row, Words));
            if let Some(u) = &r.unit {
                out.push((format!("{at}.unit"), u, Unit));
            }
            if let Some(t) = &r.tolerance {
                out.push((format!("{at}.tolerance.why"), &t.why, Words));
            }
            for (p, e) in r.cells() {
                out.push((format!("{at}.{p}"), e, Expression));
            }
            for (p, e) in r.detail.iter().flat_map(|d| d.cells()) {
                out.push((format!("{at}.detail.{p}"), e, Expression));
            }
        }
        out
    }

    /// Every plain string of words becomes words in the lab's language (see
    /// [`Metadata::language`]); expressions written once stay one for every language.
    pub fn settle_language(&mut self) {
        let lang = self.language();
        self.metadata.title.settle(lang);
        if let Some(g) = &mut self.metadata.goal {
            g.settle(lang);
        }
        for sc in self.spec.scenarios.values_mut() {
            if let Some(d) = &mut sc.description {
                d.settle(lang);
            }
        }
        for s in &mut self.spec.steps {
            if let Some(n) = &mut s.name {
                n.settle(lang);
            }
        }
        for e in &mut self.spec.expect {
            e.because.settle(lang);
            if let Some(f) = &mut e.on_fail {
                f.settle(lang);
            }
        }
        for r in &mut self.spec.compare {
            r.row.settle(lang);
            if let Some(t) = &mut r.tolerance {
                t.why.settle(lang);
            }
        }
    }

    /// The languages some learner text of the lab lacks `lang` in (and is read in another
    /// language, see [`Text::resolve`]).
    pub fn falls_back(&self, lang: Lang) -> Vec<Lang> {
        let mut used = Vec::new();
        for (_, t, _) in self.texts() {
            if let (_, Some(other)) = t.resolve(lang)
                && !used.contains(&other)
            {
                used.push(other);
            }
        }
        used
    }
}

#[cfg(test)]
mod tests {
    use super::{RawStep, StepKind, StepKindError};

    /// A step of `kind` as a lab file writes it, with nothing else set. The match has an
    /// arm per kind, so a new kind cannot be left out of the test below.
    fn sample(kind: StepKind) -> &'static str {
        match kind {
            StepKind::Exec => "exec: { node: a, command: [\"true\"] }",
            StepKind::Traffic => "traffic: { from: a, to: b }",
            StepKind::Fault => "fault: { link: a-b, action: down }",
            StepKind::Wait => "wait: { until: 'true', exec: { node: a, command: [\"true\"] } }",
            StepKind::Sleep => "sleep: 1s",
            StepKind::Probe => "probe: { what: ports }",
            StepKind::Sm => "sm: { name: sm1, action: stop }",
        }
    }

    /// The walk-through "Adding a step kind" (docs/architecture.md): each kind of
    /// `StepKind::ALL` is a field of the raw step that the schema describes (as `Step`),
    /// and a raw step setting it alone resolves into the `StepAction` of that kind; one
    /// setting two is refused naming both.
    #[test]
    fn every_step_kind_resolves_to_its_own_action_and_is_in_the_schema() {
        let schema = serde_json::to_value(schemars::schema_for!(RawStep)).unwrap();
        assert_eq!(schema["title"], "Step", "the schema's name of a step");
        for k in StepKind::ALL {
            assert!(
                schema["properties"].get(k.word()).is_some(),
                "the lab schema has no step field `{}`",
                k.word()
            );
            let raw: RawStep = serde_saphyr::from_str(sample(*k)).unwrap();
            assert!(raw.is(*k), "{}", sample(*k));
            let step = raw.resolve(0).unwrap();
            assert_eq!(step.kind(), *k, "{}", sample(*k));
            assert_eq!(step.id, "step1");
        }
        let two: RawStep = serde_saphyr::from_str(&format!(
            "{}\n{}",
            sample(StepKind::Sleep),
            sample(StepKind::Exec)
        ))
        .unwrap();
        assert_eq!(
            two.resolve(0).unwrap_err(),
            StepKindError::Several(vec![StepKind::Exec, StepKind::Sleep])
        );
        assert_eq!(
            RawStep::default().resolve(0).unwrap_err(),
            StepKindError::Nothing
        );
    }
}
