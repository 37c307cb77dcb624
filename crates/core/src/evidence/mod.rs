//! The evidence document of a run (`evidence.json`): steps, metrics with provenance,
//! expectations with verdicts, and the comparison of paths. Its shape is a contract.

pub mod detail;
pub mod host_counters;
pub mod judge;
pub mod topology;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::{Action, PlannedStep, Probe, Traffic, Wait};
use iblab_lab::{Lang, PathKind, StepKind};
use rust_i18n::t;

pub const SCHEMA: &str = "iblab.dev/evidence/v1";

/// What produced a figure. A report never passes one kind off as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProvenanceKind {
    /// A real HCA or NIC.
    Hardware,
    /// Software standing in for hardware with real kernel code: rxe (Soft-RoCE), veth links.
    Soft,
    /// An emulator: ibsim with opensm (real management traffic, no data path).
    Emulated,
    /// A stated model, not a measurement.
    Modelled,
}

impl ProvenanceKind {
    pub const ALL: [ProvenanceKind; 4] = [
        ProvenanceKind::Hardware,
        ProvenanceKind::Soft,
        ProvenanceKind::Emulated,
        ProvenanceKind::Modelled,
    ];

    /// The word evidence.json writes.
    pub fn as_str(self) -> &'static str {
        match self {
            ProvenanceKind::Hardware => "hardware",
            ProvenanceKind::Soft => "soft",
            ProvenanceKind::Emulated => "emulated",
            ProvenanceKind::Modelled => "modelled",
        }
    }

    /// The word a reader of `lang` reads.
    pub fn word(self, lang: Lang) -> String {
        t!(format!("provenance.{}", self.as_str()), locale = lang.tag()).into_owned()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub kind: ProvenanceKind,
    /// In words: which tool on which kind of link produced it.
    pub source: String,
}

/// A number with its unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    pub value: f64,
    pub unit: String,
}

impl Metric {
    pub fn new(value: f64, unit: &str) -> Metric {
        Metric {
            value,
            unit: unit.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Skipped,
    Error,
}

impl Verdict {
    pub fn symbol(self) -> &'static str {
        match self {
            Verdict::Pass => "✔",
            Verdict::Fail => "✘",
            Verdict::Skipped => "○",
            Verdict::Error => "!",
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Skipped => "skipped",
            Verdict::Error => "error",
        }
    }
}

/// The verdict of the whole run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunVerdict {
    /// Every step ran and every judged expectation held.
    Pass,
    /// A step or an expectation failed.
    Fail,
    /// The environment could not carry the run (provisioning, a missing tool).
    Error,
    /// Interrupted; torn down.
    Interrupted,
}

/// One step instance (traffic steps have one per path).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the step did, as its keyword in the lab file (`traffic`, `probe`, …).
    #[serde(with = "kind_word")]
    pub kind: StepKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub verdict: Verdict,
    /// Seconds since the run started.
    pub started_s: f64,
    pub duration_s: f64,
    pub metrics: BTreeMap<String, Metric>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// Log file, relative to the run folder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
    /// Why it failed or was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Step-specific facts: command, exit code, output excerpt, what a fault did.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
    /// The lab lets this step fail (`continueOnError`): its failure is evidence, not a
    /// failed run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allowed_to_fail: bool,
    /// The verbs devices the step ran on, and for which path (empty where it used none):
    /// where path ② and path ③ used the same device, what they measured agrees by
    /// construction (③'s bytes riding ②'s rxe), and no ② = ③ is judged from them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceUse>,
    /// A traffic step's throughput over time, from the sampled interface counters of the
    /// receiving node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<Series>,
    /// What the step was asked to observe and could not where it ran, by the name a lab
    /// reads (a metric or a fact), with why: lesson 3's cable, watched by tcpdump, which an
    /// unprivileged pod cannot start. Not a failure of any claim: an expectation that
    /// reads one is not judged in this run.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unobserved: BTreeMap<String, String>,
}

/// A verbs device a step used on behalf of a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceUse {
    pub path: PathKind,
    pub node: String,
    pub device: String,
}

impl DeviceUse {
    pub fn new(path: PathKind, node: &str, device: &str) -> DeviceUse {
        DeviceUse {
            path,
            node: node.to_string(),
            device: device.to_string(),
        }
    }

    /// `node/device`, as reports name it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.node, self.device)
    }
}

/// Throughput over time of one traffic step: what the receiving node's interfaces took in,
/// sampled every 50 ms while the receiving tool ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// `[seconds since the step began, Mbit/s]`, one per interval between two samples:
    /// the bytes received in it (on the wire, headers included) over its length.
    pub points: Vec<[f64; 2]>,
    /// The transfer's provenance (a figure of ③'s modelled transfer is modelled), its
    /// source saying what was counted.
    pub provenance: Provenance,
}

impl Series {
    /// What the receiving tool's node received while it ran (`received`: seconds after
    /// the tool started and bytes, as [`crate::counters::ProcessCounters::received`]);
    /// `offset_s`: when the tool started, in seconds after the step began. `None` with
    /// fewer than two samples. Its provenance is a placeholder until the step's own is
    /// known ([`Series::of_step`]).
    pub fn from_received(received: &[(f64, u64)], offset_s: f64) -> Option<Series> {
        let points: Vec<[f64; 2]> = crate::counters::received_rate(received)
            .into_iter()
            .map(|[t, v]| [t + offset_s, v])
            .collect();
        (!points.is_empty()).then(|| Series {
            points,
            provenance: Provenance {
                kind: ProvenanceKind::Soft,
                source: SERIES_SOURCE.into(),
            },
        })
    }

    /// The series of a transfer whose receiving tool's counters these are (counted from
    /// its start, the step's first process).
    pub fn of_receiver(receiver: Option<&crate::counters::ProcessCounters>) -> Option<Series> {
        Series::from_received(&receiver?.received, 0.0)
    }

    /// The series takes the step's provenance (the bytes counted are its transfer's)
    /// and names the receiving node.
    pub fn of_step(&mut self, step: Option<&Provenance>, receiver: &str) {
        let kind = step.map_or(self.provenance.kind, |p| p.kind);
        let mut source = format!("{} (node {receiver})", self.provenance.source);
        if let Some(p) = step {
            source.push_str(&format!("; the transfer: {}", p.source));
        }
        self.provenance = Provenance { kind, source };
    }
}

/// What a series counts, in words.
pub const SERIES_SOURCE: &str = "bytes received by the receiving node's interfaces (all but loopback, headers included), read from /proc/PID/net/dev of the receiving tool every 50 ms";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExpectationRecord {
    pub id: String,
    pub verdict: Verdict,
    pub expression: String,
    /// Every value the expression read, as it was.
    pub observed: BTreeMap<String, serde_json::Value>,
    /// What the learner reads: the `because` on pass, `onFail` on failure, the reason when
    /// skipped; in the evidence's language.
    pub explanation: String,
    /// The explanation in English, where the evidence is in another language (JUnit is
    /// written in English).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation_en: Option<String>,
    pub because: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_fail: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub paths: Vec<PathKind>,
}

/// Which side of the course's one rule a comparison row is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    Host,
    Network,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    /// A number (a metric) or a text (what a probe observed, e.g. `LID 1`).
    pub value: serde_json::Value,
    pub provenance: ProvenanceKind,
    /// With `up --repeat N`: the lowest and highest value the cell's expression gives over
    /// the N runs (its value is the expression over the medians).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<[f64; 2]>,
    /// Longer words behind the value (the row's `detail`): the terminal shows them with
    /// `-v`, the report beside the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Cell {
    pub fn number(&self) -> Option<f64> {
        self.value.as_f64()
    }
}

/// Do ② and ③ agree on a row, by the rule it states: text equal when identical, numbers
/// within a declared tolerance (percent of the larger, or an absolute distance). `None`
/// with its rule when the row declares no way to decide (numbers without a tolerance).
/// The rule is said in `lang`.
pub fn agree(
    a: &serde_json::Value,
    b: &serde_json::Value,
    tolerance: Option<&iblab_lab::Tolerance>,
    lang: Lang,
) -> (Option<bool>, String) {
    let l = lang.tag();
    match (a.as_f64(), b.as_f64(), tolerance) {
        (Some(x), Some(y), Some(tol)) => {
            let apart = (x - y).abs();
            let relative = apart / x.abs().max(y.abs()).max(f64::EPSILON) * 100.0;
            let near = tol.absolute.is_some_and(|d| apart <= d);
            (
                Some(near || relative <= tol.percent),
                match tol.absolute {
                    Some(d) => t!(
                        "rule.within_both",
                        locale = l,
                        absolute = d,
                        percent = tol.percent
                    )
                    .into_owned(),
                    None => {
                        t!("rule.within_percent", locale = l, percent = tol.percent).into_owned()
                    }
                },
            )
        }
        (Some(_), Some(_), None) => (None, t!("rule.undecided", locale = l).into_owned()),
        _ => (Some(a == b), t!("rule.identical", locale = l).into_owned()),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ComparisonRow {
    /// The row's id, the same in every language (the lab's `id`, else `rowN`); empty for
    /// a row of raw measurements (its name is the metric and the step).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    pub group: Group,
    /// What the row compares, in the evidence's language.
    pub name: String,
    pub unit: String,
    pub values: BTreeMap<PathKind, Cell>,
    /// Whether ② and ③ agree by `rule`; absent when either is missing, the rule cannot
    /// decide, or both were measured on one device (`same_device`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roce_equals_ib: Option<bool>,
    /// The verbs devices ②'s and ③'s cells were both measured on, where they share one:
    /// the row's ② = ③ then holds by construction here, is not decided, and is judged
    /// where each path has a device of its own (hardware).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_device: Vec<String>,
    /// How ② = ③ is decided on this row, in words (and why, for a tolerance).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rule: String,
    /// Which way is a gain (declared rows that stand for a gain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub better: Option<iblab_lab::Better>,
    /// The gain shows only on hardware.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_hardware: bool,
    /// The absolute tolerance the row declares: below it a figure is noise (a stray
    /// clock tick, the tool's own setup), so no gain is computed against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Comparison {
    pub rows: Vec<ComparisonRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostInfo {
    pub kernel: String,
    pub loss_mechanism: String,
}

/// The whole evidence document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Evidence {
    pub schema: String,
    /// The language the evidence's words are in (the lab's texts, the explanations, the
    /// notes); ids, expressions and metric names are the same in every language.
    #[serde(default)]
    pub lang: Lang,
    pub lab: String,
    pub title: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lesson: Option<u8>,
    pub scenario: String,
    pub backend: String,
    pub backend_reason: String,
    /// What a node's Ethernet interface is on that backend (`veth`, `virtio-net`, …): no
    /// NIC hardware, whatever the path.
    #[serde(default)]
    pub nic: String,
    pub run_id: String,
    pub started: String,
    pub duration_s: f64,
    pub verdict: RunVerdict,
    pub paths: Vec<PathKind>,
    pub excluded_paths: BTreeMap<PathKind, String>,
    pub params: BTreeMap<String, serde_json::Value>,
    pub host: HostInfo,
    pub steps: Vec<StepRecord>,
    pub expectations: Vec<ExpectationRecord>,
    /// The lab's nodes, switches and cables, for the drawing in the report.
    #[serde(default)]
    pub topology: topology::Topology,
    /// The rows the lab declares, in the course's grouping: the table a learner reads.
    pub comparison: Comparison,
    /// Every raw figure of every step, one row per metric and step (no ② = ③ verdict).
    #[serde(default)]
    pub measurements: Comparison,
    /// Setup and teardown timings, for the orchestrator's own overhead.
    pub timings: BTreeMap<String, f64>,
    /// Things a reader must know: environment errors, teardown problems, honesty notes.
    pub notes: Vec<String>,
    #[serde(skip)]
    pub run_dir: PathBuf,
}

/// Metric names that describe the host side (copies, syscalls, CPU) rather than the network.
pub fn group_of(metric: &str) -> Group {
    if metric.contains("cpu")
        || metric.contains("syscall")
        || metric.contains("copies")
        || metric.contains("copied")
        || metric.contains("context_switch")
    {
        Group::Host
    } else {
        Group::Network
    }
}

impl Evidence {
    /// All measurements: a row for every metric of every step id, its value per path.
    pub fn build_measurements(&mut self) {
        let mut rows: BTreeMap<(String, String), ComparisonRow> = BTreeMap::new();
        for s in &self.steps {
            let (Some(path), Some(prov)) = (s.path, &s.provenance) else {
                continue;
            };
            // A failed measurement is evidence too (a collapse measures 0); skipped and
            // errored steps measured nothing.
            if !matches!(s.verdict, Verdict::Pass | Verdict::Fail) {
                continue;
            }
            for (name, m) in &s.metrics {
                let key = (s.id.clone(), name.clone());
                let row = rows.entry(key).or_insert_with(|| ComparisonRow {
                    id: String::new(),
                    group: group_of(name),
                    name: format!("{name} ({})", s.id),
                    unit: m.unit.clone(),
                    values: BTreeMap::new(),
                    roce_equals_ib: None,
                    same_device: Vec::new(),
                    rule: String::new(),
                    better: None,
                    needs_hardware: false,
                    floor: None,
                });
                row.values.insert(
                    path,
                    Cell {
                        value: serde_json::json!(m.value),
                        provenance: prov.kind,
                        range: None,
                        detail: None,
                    },
                );
            }
        }
        let mut rows: Vec<ComparisonRow> = rows.into_values().collect();
        rows.sort_by_key(|r| (r.group == Group::Network, r.name.clone()));
        self.measurements = Comparison { rows };
    }
}

/// A record with nothing measured yet.
pub fn blank(step: &PlannedStep, at: f64) -> StepRecord {
    let (kind, node) = match &step.action {
        Action::Exec { node, .. } => (StepKind::Exec, Some(node.clone())),
        Action::Traffic(Traffic { from, .. }) => (StepKind::Traffic, Some(from.clone())),
        Action::Fault(_) => (StepKind::Fault, None),
        Action::Wait(Wait { inner, .. }) => match inner.as_ref() {
            Action::Exec { node, .. } | Action::Probe(Probe { node, .. }) => {
                (StepKind::Wait, Some(node.clone()))
            }
            _ => (StepKind::Wait, None),
        },
        Action::Sleep { .. } => (StepKind::Sleep, None),
        Action::Probe(Probe { node, .. }) => (StepKind::Probe, Some(node.clone())),
        Action::Sm(_) => (StepKind::Sm, None),
    };
    StepRecord {
        id: step.id.clone(),
        name: step.name.clone(),
        kind,
        path: step.path,
        node,
        verdict: Verdict::Pass,
        started_s: at,
        duration_s: 0.0,
        metrics: BTreeMap::new(),
        provenance: None,
        log: None,
        reason: None,
        detail: serde_json::Value::Null,
        allowed_to_fail: step.continue_on_error,
        devices: Vec::new(),
        series: None,
        unobserved: BTreeMap::new(),
    }
}

/// A step's kind in the evidence: its keyword, as in the lab file (`"traffic"`), so the
/// document reads the same whichever enum carries it.
mod kind_word {
    use iblab_lab::StepKind;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(kind: &StepKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.word())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<StepKind, D::Error> {
        let word = String::deserialize(d)?;
        StepKind::ALL
            .iter()
            .copied()
            .find(|k| k.word() == word)
            .ok_or_else(|| {
                D::Error::custom(format!(
                    "unknown step kind `{word}` (one of: {})",
                    StepKind::words()
                ))
            })
    }
}

#[cfg(test)]
mod agree_tests {
    use super::agree;
    use iblab_lab::{Lang, Tolerance};
    use serde_json::json;

    /// ② = ③ is decided by the row's own rule, and the rule is said.
    #[test]
    fn each_row_decides_by_its_rule() {
        assert_eq!(
            agree(&json!("LID 1"), &json!("LID 1"), None, Lang::En).0,
            Some(true)
        );
        assert_eq!(
            agree(&json!("LID 1"), &json!("GID"), None, Lang::En).0,
            Some(false)
        );
        // Numbers without a declared tolerance are shown, not decided.
        let (d, rule) = agree(&json!(8.0), &json!(6.0), None, Lang::En);
        assert_eq!(d, None);
        assert!(rule.contains("no tolerance"));
        let t = Tolerance {
            percent: 50.0,
            absolute: Some(10.0),
            why: "small counts".into(),
        };
        assert_eq!(
            agree(&json!(0.0), &json!(3.0), Some(&t), Lang::En).0,
            Some(true)
        );
        assert_eq!(
            agree(&json!(100.0), &json!(60.0), Some(&t), Lang::En).0,
            Some(true)
        );
        assert_eq!(
            agree(&json!(100.0), &json!(40.0), Some(&t), Lang::En).0,
            Some(false)
        );
        let strict = Tolerance {
            percent: 10.0,
            absolute: None,
            why: String::new().into(),
        };
        let (d, rule) = agree(&json!(0.0), &json!(3.0), Some(&strict), Lang::En);
        assert_eq!(d, Some(false));
        assert_eq!(rule, "equal within 10% of the larger");
    }
}
