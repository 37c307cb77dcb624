//! The parts of a step's `detail` that the reports and the topology read, as types: the
//! fabric that writes one serialises its struct into `detail` (same keys, same shapes as
//! the evidence always had), and a report reads it back through [`StepRecord`]'s methods
//! here, never by key. The rest of `detail` (commands, exit codes, a probe's other facts,
//! the verbs probe's report) stays JSON: expressions read it as the lab writes them
//! (`steps.ID.facts.X`), and no report depends on its keys.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::StepRecord;

/// One HCA's first port, as a port probe of path ③ saw it (`detail.facts.ports.<node>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Port {
    /// The logical link state (`Active`, `Initialize`, …; `Unknown` when unread).
    #[serde(default = "unknown")]
    pub state: String,
    /// The port's LID (0: none assigned).
    #[serde(default)]
    pub lid: u16,
    /// The LID of the subnet manager the port knows (0: none).
    #[serde(default)]
    pub sm_lid: u16,
    #[serde(flatten)]
    pub read: PortRead,
}

fn unknown() -> String {
    "Unknown".into()
}

/// What else a port probe read of a port, or why it read nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortRead {
    /// smpquery answered.
    Answered {
        /// The physical link state.
        phys: String,
        /// The port is the subnet manager's.
        runs_sm: bool,
        /// Gbit/s per lane, where the port says.
        lane_gbps: Option<f64>,
    },
    /// smpquery's answer could not be read.
    Failed { error: String },
    /// An older record that said neither.
    Unsaid {},
}

/// What a port probe of path ③ found (`detail.facts` of a `ports` probe).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortsFacts {
    /// Node → its HCA's first port.
    pub ports: BTreeMap<String, Port>,
    pub active: usize,
    pub init: usize,
    pub all_active: bool,
    pub all_init: bool,
    pub lids_unique: bool,
}

/// What Ethernet learned by itself (`detail.facts` of a `learned` probe).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedFacts {
    /// Switch → what its bridge learned.
    pub switches: BTreeMap<String, SwitchLearned>,
    /// Host → its MAC and what its ARP resolved.
    #[serde(default)]
    pub nodes: BTreeMap<String, HostLearned>,
    /// Every node some bridge learned.
    pub nodes_learned: BTreeSet<String>,
    /// How many entries the bridges learned in all.
    #[serde(default)]
    pub learned_entries: usize,
}

/// What one bridge learned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchLearned {
    /// Its learned forwarding entries.
    #[serde(default)]
    pub learned: Vec<FdbEntry>,
    /// The nodes those entries belong to.
    #[serde(default)]
    pub nodes: BTreeSet<String>,
}

/// A learned forwarding entry, with the node whose MAC it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FdbEntry {
    pub mac: String,
    pub port: String,
    pub node: Option<String>,
}

/// A host's own MAC and its neighbour table.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct HostLearned {
    #[serde(default)]
    pub mac: Option<String>,
    /// Peer node → the MAC ARP resolved for its address (when `ip neigh` was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arp: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neighbours: Option<Vec<iblab_tools::iproute::Neighbour>>,
}

/// How a verbs transfer's two ends swapped their queue pairs (`detail.exchange`), in the
/// words the evidence gives: the passive side of the RDMA CM busy-polls, so its CPU time
/// is the tool's, not the transfer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// perftest `-R`.
    RdmaCm,
    /// perftest without `-R`: a TCP socket the passive side sleeps on.
    Tcp,
    /// Without `-R` on an adapter, whose RDMA CM cannot resolve the lab's addresses.
    TcpOnAdapter,
}

impl Exchange {
    /// The words of `detail.exchange`.
    pub fn words(self) -> &'static str {
        match self {
            Exchange::RdmaCm => {
                "RDMA CM (-R): the passive side busy-polls, its CPU time is the tool's"
            }
            Exchange::Tcp => "out of band over TCP (no -R): the passive side sleeps on a socket",
            Exchange::TcpOnAdapter => {
                "out of band over TCP (no -R) between the lab addresses: the RDMA CM cannot resolve them to the adapter"
            }
        }
    }

    /// The passive side busy-polls: its CPU time is not the transfer's.
    pub fn polls(self) -> bool {
        self == Exchange::RdmaCm
    }
}

impl Serialize for Exchange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.words())
    }
}

impl<'de> Deserialize<'de> for Exchange {
    /// By its words; older records worded them otherwise, and said the RDMA CM first.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Exchange, D::Error> {
        let words = String::deserialize(d)?;
        Ok([Exchange::RdmaCm, Exchange::Tcp, Exchange::TcpOnAdapter]
            .into_iter()
            .find(|e| e.words() == words)
            .unwrap_or(if words.starts_with("RDMA CM") {
                Exchange::RdmaCm
            } else {
                Exchange::Tcp
            }))
    }
}

/// What a fault step did to its link (`detail` of a `fault` step: `link`, `action`, and
/// the figures the action set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultDone {
    pub link: String,
    /// The fault's keyword (`loss`, `rate`, `down`, `up`, `clear`, `count`, …).
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub loss_percent: Option<f64>,
    #[serde(default)]
    pub rate_bps: Option<f64>,
}

impl StepRecord {
    /// The part of `detail` at a JSON pointer, read as `T` (`None`: absent or another shape).
    fn part<T: DeserializeOwned>(&self, pointer: &str) -> Option<T> {
        T::deserialize(self.detail.pointer(pointer)?).ok()
    }

    /// The ports a port probe of path ③ saw (node → its first port), if it is one.
    pub fn ports(&self) -> Option<BTreeMap<String, Port>> {
        self.part("/facts/ports")
    }

    /// What a `learned` probe found on the bridges and hosts, if it is one.
    pub fn learned(&self) -> Option<LearnedFacts> {
        self.part("/facts")
    }

    /// How a verbs transfer's ends swapped their queue pairs, where it says.
    pub fn exchange(&self) -> Option<Exchange> {
        self.part("/exchange")
    }

    /// What a fault step did to which link, where it says.
    pub fn fault_done(&self) -> Option<FaultDone> {
        self.part("")
    }

    /// Write a typed part into `detail` at a key of its top level, `detail` becoming an
    /// object if it was none.
    pub fn put_detail<T: Serialize>(&mut self, key: &str, part: &T) {
        if !self.detail.is_object() {
            self.detail = serde_json::json!({});
        }
        self.detail[key] = serde_json::to_value(part).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::Evidence;

    /// Every kept run's steps read back as the same JSON they were written as: the typed
    /// step kind and the typed parts of `detail` change no key and no shape.
    #[test]
    fn kept_runs_steps_read_and_write_as_the_same_json() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/evidence");
        let mut seen = 0;
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let e: Evidence = serde_json::from_str(&text).unwrap();
            let was: serde_json::Value = serde_json::from_str(&text).unwrap();
            let again = serde_json::to_value(&e).unwrap();
            let steps = was["steps"].as_array().unwrap();
            assert_eq!(steps.len(), e.steps.len());
            for (i, s) in steps.iter().enumerate() {
                for key in ["kind", "detail"] {
                    assert_eq!(
                        again["steps"][i].get(key),
                        s.get(key),
                        "{} step {i} {key}",
                        f.display()
                    );
                }
                seen += 1;
            }
        }
        assert!(seen >= 50, "kept steps read: {seen}");
    }

    /// The typed parts read what the kept runs' fabrics wrote: every port probe's ports,
    /// every fault's link, every perftest transfer's exchange; and a typed part written
    /// back is the JSON it was read from.
    #[test]
    fn the_typed_parts_read_the_kept_runs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/evidence");
        let (mut ports, mut faults, mut exchanges, mut learned) = (0, 0, 0, 0);
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let e: Evidence = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
            for s in &e.steps {
                if s.detail.pointer("/facts/ports").is_some() {
                    let p = s.ports().expect("ports read");
                    assert_eq!(
                        serde_json::to_value(&p).unwrap(),
                        s.detail["facts"]["ports"],
                        "{} {}",
                        f.display(),
                        s.id
                    );
                    if s.detail["facts"].get("lids_unique").is_some() {
                        let all: PortsFacts =
                            serde_json::from_value(s.detail["facts"].clone()).unwrap();
                        assert_eq!(all.ports, p);
                    }
                    ports += 1;
                }
                if s.kind == iblab_lab::StepKind::Fault && s.detail.get("link").is_some() {
                    let d = s.fault_done().expect("fault read");
                    assert_eq!(Some(d.link.as_str()), s.detail["link"].as_str());
                    faults += 1;
                }
                if let Some(words) = s.detail.get("exchange") {
                    let x = s.exchange().expect("exchange read");
                    assert_eq!(serde_json::to_value(x).unwrap(), *words);
                    exchanges += 1;
                }
                if let Some(l) = s.learned() {
                    assert_eq!(
                        serde_json::to_value(&l).unwrap()["switches"],
                        s.detail["facts"]["switches"]
                    );
                    learned += 1;
                }
            }
        }
        assert!(
            ports > 0 && faults > 0 && exchanges > 0,
            "{ports} {faults} {exchanges}"
        );
        let _ = learned;
    }

    /// A port whose smpquery answer could not be read keeps its error, and an older
    /// record with only a state and a LID is still read.
    #[test]
    fn a_port_unread_or_older_is_read() {
        let failed: Port = serde_json::from_value(
            serde_json::json!({"state": "Unknown", "error": "no answer", "lid": 0, "sm_lid": 0}),
        )
        .unwrap();
        assert_eq!(
            failed.read,
            PortRead::Failed {
                error: "no answer".into()
            }
        );
        let older: Port =
            serde_json::from_value(serde_json::json!({"state": "Initialize", "lid": 0})).unwrap();
        assert_eq!((older.state.as_str(), older.lid), ("Initialize", 0));
        assert_eq!(older.read, PortRead::Unsaid {});
    }

    /// Older words for the exchange are still told apart by what the RDMA CM does.
    #[test]
    fn an_exchange_in_older_words_is_read() {
        let x: Exchange = serde_json::from_value(serde_json::json!("RDMA CM (-R)")).unwrap();
        assert!(x.polls());
        let x: Exchange = serde_json::from_value(serde_json::json!("tcp")).unwrap();
        assert!(!x.polls());
    }
}
