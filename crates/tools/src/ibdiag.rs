//! InfiniBand diagnostics under ibsim: typed parsers for what `smpquery portinfo`, `ibnetdiscover`, `ibroute`, `ibtracert`, `sminfo`, `saquery` and `ibstat` print, and a renderer of ibsim net files.
//!
//! Every parser takes the text a tool printed, stdout and stderr together (the
//! `ibwarn:`/`iberror:`/`ibpanic:` lines of libibmad go to stderr and are what
//! explains a failure). When the text carries a tool failure the parsers answer
//! [`ParseError::ToolFailed`] with the tool's own message, except
//! [`parse_ibtracert`], whose failure is a result ([`PathTrace::failure`]).
//!
//! Facts this module relies on were measured on Debian 12 with ibsim 0.10,
//! OpenSM 3.3.23 and infiniband-diags from rdma-core 44; the fixtures under
//! `tests/fixtures/ib/` are real captures from the fabric of the tests'
//! `capture_topology()` (h1 = LID 1, sw1 = 2, sw2 = 3, h2 = 4; opensm master on
//! h1, standby on h2), before the SM, with it, after `Unlink`s and after the
//! master stopped.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::LazyLock;

use regex::Regex;
use serde::Serialize;

/// Why a tool's output could not be turned into a typed value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// The tool itself reported a failure (`iberror:` or `ibpanic:` line).
    #[error("{tool} failed: {message}")]
    ToolFailed { tool: &'static str, message: String },
    /// Something the output must contain is not there.
    #[error("{tool} output lacks {what}")]
    Missing {
        tool: &'static str,
        what: &'static str,
    },
    /// A field is there but its value cannot be read.
    #[error("{tool}: cannot read {what} from {value:?}")]
    BadValue {
        tool: &'static str,
        what: &'static str,
        value: String,
    },
    /// A line that this tool's format does not allow at that place.
    #[error("{tool}: unexpected line {line:?}")]
    UnexpectedLine { tool: &'static str, line: String },
}

/// Why an [`IbTopology`] cannot be simulated by ibsim.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    #[error("node name {0:?} is empty, too long (>63) or holds a quote, bracket or line break")]
    BadName(String),
    #[error("node name {0:?} is used twice")]
    DuplicateName(String),
    #[error("node {0:?} has no ports")]
    NoPorts(String),
    #[error("link end names unknown node {0:?}")]
    UnknownNode(String),
    #[error("port {port} of {node:?} is out of range 1..={max}")]
    PortOutOfRange { node: String, port: u8, max: u8 },
    #[error("port {port} of {node:?} is cabled twice")]
    PortUsedTwice { node: String, port: u8 },
}

// ---------------------------------------------------------------- shared types

/// Kind of an InfiniBand node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeType {
    Switch,
    Ca,
    Router,
}

/// Logical port state (PortInfo:LinkState). `Init` is printed `Initialize` by
/// smpquery, `Initializing` by ibstat and `Init` by the ibsim console.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    NoChange,
    Down,
    Init,
    Armed,
    Active,
    Other(String),
}

impl LinkState {
    fn from_text(s: &str) -> Self {
        match s.trim() {
            "Down" => Self::Down,
            "Initialize" | "Initializing" | "Init" => Self::Init,
            "Armed" => Self::Armed,
            "Active" => Self::Active,
            "NoChange" => Self::NoChange,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// Physical port state (PortInfo:PhysLinkState).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhysState {
    NoChange,
    Sleep,
    Polling,
    Disabled,
    Training,
    LinkUp,
    LinkErrorRecovery,
    PhyTest,
    Other(String),
}

impl PhysState {
    fn from_text(s: &str) -> Self {
        match s.trim() {
            "Sleep" => Self::Sleep,
            "Polling" => Self::Polling,
            "Disabled" => Self::Disabled,
            "PortConfigurationTraining" => Self::Training,
            "LinkUp" => Self::LinkUp,
            "LinkErrorRecovery" => Self::LinkErrorRecovery,
            "PhyTest" | "Phy Test" => Self::PhyTest,
            "NoChange" => Self::NoChange,
            other => Self::Other(other.to_owned()),
        }
    }
}

// ---------------------------------------------------------------- helpers

/// A hard-coded pattern, compiled once; every pattern is exercised by the tests.
macro_rules! static_regex {
    ($name:ident, $re:expr) => {
        static $name: LazyLock<Regex> =
            LazyLock::new(|| Regex::new($re).expect("hard-coded regex is valid"));
    };
}

static_regex!(DOTTED, r"^\s*([A-Za-z_][A-Za-z0-9_]*):?\.+(.*)$");

fn hex_u64(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u64::from_str_radix(t, 16).ok()
}

/// A number printed either as `0x…` (hex) or in decimal.
fn num_u64(s: &str) -> Option<u64> {
    let t = s.trim();
    if t.starts_with("0x") || t.starts_with("0X") {
        hex_u64(t)
    } else {
        t.parse().ok()
    }
}

fn num<T: TryFrom<u64>>(tool: &'static str, what: &'static str, s: &str) -> Result<T, ParseError> {
    num_u64(s)
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| ParseError::BadValue {
            tool,
            what,
            value: s.trim().to_owned(),
        })
}

fn hex<T: TryFrom<u64>>(tool: &'static str, what: &'static str, s: &str) -> Result<T, ParseError> {
    hex_u64(s)
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| ParseError::BadValue {
            tool,
            what,
            value: s.trim().to_owned(),
        })
}

/// Strips the `[pid] ` that libibmad puts after `ibwarn:`/`ibpanic:`.
fn strip_pid(s: &str) -> &str {
    let t = s.trim();
    match t.strip_prefix('[').and_then(|rest| rest.split_once(']')) {
        Some((pid, tail)) if pid.chars().all(|c| c.is_ascii_digit()) => tail.trim(),
        _ => t,
    }
}

/// The tool's own failure message: the text after `iberror:` (first such
/// line), else after `ibpanic:`.
fn failure_message(text: &str) -> Option<String> {
    let after = |marker: &str| {
        text.lines()
            .find_map(|l| l.split_once(marker).map(|(_, m)| strip_pid(m).to_owned()))
    };
    after("iberror:").or_else(|| after("ibpanic:"))
}

/// The messages of the `ibwarn:` lines, without their pid.
fn warnings(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("ibwarn:"))
        .map(|m| strip_pid(m).to_owned())
        .collect()
}

fn is_noise(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with("ibwarn:")
}

/// `Key:....value` (smpquery) and `key.....value` (saquery) lines, in order.
fn dotted_fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| DOTTED.captures(l))
        .map(|c| (c[1].to_owned(), c[2].trim().to_owned()))
        .collect()
}

fn node_type_word(s: &str) -> Option<NodeType> {
    match s.trim().to_ascii_lowercase().as_str() {
        "switch" => Some(NodeType::Switch),
        "ca" | "channel adapter" => Some(NodeType::Ca),
        "router" | "rt" => Some(NodeType::Router),
        _ => None,
    }
}

// ---------------------------------------------------------------- smpquery portinfo

/// One port's PortInfo as `smpquery portinfo` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortInfo {
    /// How the port was addressed, from the header: `Lid 4` or
    /// `DR path slid 65535; dlid 65535; 0,1`.
    pub target: String,
    /// Port number from the header (`… port 7`); 0 means "the port I came in on".
    pub port: Option<u8>,
    /// Base LID. Switch external ports always print 0 (only port 0 has one).
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub local_port: u8,
    pub link_state: LinkState,
    pub phys_state: PhysState,
    /// Active lanes (`4X` -> 4).
    pub link_width: Option<u8>,
    /// Active base speed per lane, Gb/s (`2.5 Gbps` -> 2.5).
    pub link_speed_gbps: Option<f64>,
    /// Active extended speed per lane (FDR and up); `None` for `No Extended Speed`.
    pub link_speed_ext_gbps: Option<f64>,
    pub capability_mask: Option<u32>,
}

impl PortInfo {
    /// Whether the port advertises an SM (CapabilityMask bit IsSM, set while an
    /// SM runs on it, master or standby).
    pub fn is_sm(&self) -> bool {
        self.capability_mask.is_some_and(|m| m & 0x2 != 0)
    }

    /// Per-lane data rate actually in use: the extended speed when there is one.
    pub fn lane_gbps(&self) -> Option<f64> {
        self.link_speed_ext_gbps.or(self.link_speed_gbps)
    }
}

static_regex!(PORTINFO_HEADER, r"^# Port info: (.*?) port (\d+)\s*$");

fn gbps(s: &str) -> Option<f64> {
    s.trim().strip_suffix("Gbps")?.trim().parse().ok()
}

/// Parses `smpquery portinfo <lid> <port>` / `smpquery -D portinfo <path> [port]`.
pub fn parse_portinfo(text: &str) -> Result<PortInfo, ParseError> {
    const T: &str = "smpquery portinfo";
    let fields: HashMap<String, String> =
        dotted_fields(text)
            .into_iter()
            .fold(HashMap::new(), |mut m, (k, v)| {
                m.entry(k).or_insert(v);
                m
            });
    let Some(lid) = fields.get("Lid") else {
        return Err(match failure_message(text) {
            Some(message) => ParseError::ToolFailed { tool: T, message },
            None => ParseError::Missing {
                tool: T,
                what: "the Lid field",
            },
        });
    };
    let get = |k: &'static str| {
        fields
            .get(k)
            .map(String::as_str)
            .ok_or(ParseError::Missing { tool: T, what: k })
    };
    let (target, port) = match text.lines().find_map(|l| PORTINFO_HEADER.captures(l)) {
        Some(c) => (c[1].to_owned(), Some(num(T, "header port", &c[2])?)),
        None => (String::new(), None),
    };
    let width = match fields.get("LinkWidthActive") {
        Some(w) => Some(num(T, "LinkWidthActive", w.trim_end_matches(['X', 'x']))?),
        None => None,
    };
    let speed = match fields.get("LinkSpeedActive") {
        Some(s) => Some(gbps(s).ok_or_else(|| ParseError::BadValue {
            tool: T,
            what: "LinkSpeedActive",
            value: s.clone(),
        })?),
        None => None,
    };
    let capability_mask = match fields.get("CapMask") {
        Some(m) => Some(num(T, "CapMask", m)?),
        None => None,
    };
    Ok(PortInfo {
        target,
        port,
        lid: num(T, "Lid", lid)?,
        sm_lid: num(T, "SMLid", get("SMLid")?)?,
        lmc: num(T, "LMC", get("LMC")?)?,
        local_port: num(T, "LocalPort", get("LocalPort")?)?,
        link_state: LinkState::from_text(get("LinkState")?),
        phys_state: PhysState::from_text(get("PhysLinkState")?),
        link_width: width,
        link_speed_gbps: speed,
        link_speed_ext_gbps: fields.get("LinkSpeedExtActive").and_then(|s| gbps(s)),
        capability_mask,
    })
}

// ---------------------------------------------------------------- ibnetdiscover

/// One node of `ibnetdiscover`'s topology dump.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiscoveredNode {
    pub node_type: NodeType,
    /// Node GUID (from `switchguid=`/`caguid=`, else from the node id).
    pub guid: u64,
    /// ibnetdiscover's node id, e.g. `S-0000000000200000`.
    pub id: String,
    /// NodeDescription; under ibsim this is the net-file name (`sw1`, `h2`).
    pub description: String,
    pub num_ports: u8,
    /// Switch: the LID of port 0. CA: the LID of its first listed port.
    pub lid: Option<u16>,
    /// Connected ports only (ibnetdiscover lists no others).
    pub ports: Vec<DiscoveredPort>,
}

/// A connected port and what is on its other end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiscoveredPort {
    pub port: u8,
    /// CA ports only (switch ports share the node GUID).
    pub port_guid: Option<u64>,
    /// CA ports only (switch external ports have no LID of their own).
    pub lid: Option<u16>,
    pub peer: PortPeer,
}

/// The far end of a link as ibnetdiscover prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortPeer {
    pub id: String,
    pub port: u8,
    /// Printed for CA peers of a switch port.
    pub port_guid: Option<u64>,
    pub description: Option<String>,
    pub lid: Option<u16>,
    /// Link width and speed, e.g. `4xSDR`.
    pub link: Option<String>,
}

impl DiscoveredNode {
    /// The port cabled at `port`, if any.
    #[cfg(test)]
    pub fn port(&self, port: u8) -> Option<&DiscoveredPort> {
        self.ports.iter().find(|p| p.port == port)
    }
}

static_regex!(
    ND_HEADER,
    r#"^(Switch|Ca|Rt)\s+(\d+)\s+"([^"]*)"\s*(?:#\s*(.*))?$"#
);
static_regex!(ND_SWITCH_LID, r"port 0 lid (\d+) lmc (\d+)");
static_regex!(
    ND_PORT,
    r#"^\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s+"([^"]*)"\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s*(?:#\s*(.*))?$"#
);
static_regex!(
    ND_PORT_COMMENT,
    r#"^(?:lid (\d+) lmc (\d+)\s+)?"(.*)"\s+lid (\d+)\s+(\S+)"#
);
static_regex!(
    ND_GUID_LINE,
    r"^(?:switchguid|caguid|rtguid)=0x([0-9a-fA-F]+)"
);

/// The text between the first and the last double quote.
fn quoted(s: &str) -> Option<&str> {
    let start = s.find('"')?;
    let end = s.rfind('"')?;
    (end > start).then(|| &s[start + 1..end])
}

/// Parses `ibnetdiscover` (default format) into its nodes, in printed order.
pub fn parse_ibnetdiscover(text: &str) -> Result<Vec<DiscoveredNode>, ParseError> {
    const T: &str = "ibnetdiscover";
    let mut nodes: Vec<DiscoveredNode> = Vec::new();
    let mut pending_guid: Option<u64> = None;
    for line in text.lines() {
        let l = line.trim();
        if is_noise(l) || l.starts_with('#') {
            continue;
        }
        if let Some(c) = ND_GUID_LINE.captures(l) {
            pending_guid = Some(hex(T, "node guid", &c[1])?);
            continue;
        }
        if l.starts_with("vendid=")
            || l.starts_with("devid=")
            || l.starts_with("sysimgguid=")
            || failure_message(l).is_some()
        {
            continue;
        }
        if let Some(c) = ND_HEADER.captures(l) {
            let node_type = match &c[1] {
                "Switch" => NodeType::Switch,
                "Ca" => NodeType::Ca,
                _ => NodeType::Router,
            };
            let id = c[3].to_owned();
            let guid = match pending_guid.take() {
                Some(g) => g,
                None => hex(T, "node guid", id.get(2..).unwrap_or_default())?,
            };
            let comment = c.get(4).map_or("", |m| m.as_str());
            let lid = match ND_SWITCH_LID.captures(comment) {
                Some(s) => Some(num(T, "switch lid", &s[1])?),
                None => None,
            };
            nodes.push(DiscoveredNode {
                node_type,
                guid,
                id,
                description: quoted(comment).unwrap_or_default().to_owned(),
                num_ports: num(T, "port count", &c[2])?,
                lid,
                ports: Vec::new(),
            });
            continue;
        }
        if let Some(c) = ND_PORT.captures(l) {
            let Some(node) = nodes.last_mut() else {
                return Err(ParseError::UnexpectedLine {
                    tool: T,
                    line: l.to_owned(),
                });
            };
            let comment = c.get(6).map_or("", |m| m.as_str());
            let cc = ND_PORT_COMMENT.captures(comment);
            let own_lid = match cc.as_ref().and_then(|cc| cc.get(1)) {
                Some(m) => Some(num(T, "port lid", m.as_str())?),
                None => None,
            };
            let peer_lid = match cc.as_ref().and_then(|cc| cc.get(4)) {
                Some(m) => Some(num(T, "peer lid", m.as_str())?),
                None => None,
            };
            let port = DiscoveredPort {
                port: num(T, "port number", &c[1])?,
                port_guid: match c.get(2) {
                    Some(m) => Some(hex(T, "port guid", m.as_str())?),
                    None => None,
                },
                lid: own_lid,
                peer: PortPeer {
                    id: c[3].to_owned(),
                    port: num(T, "peer port", &c[4])?,
                    port_guid: match c.get(5) {
                        Some(m) => Some(hex(T, "peer port guid", m.as_str())?),
                        None => None,
                    },
                    description: cc.as_ref().map(|cc| cc[3].to_owned()),
                    lid: peer_lid,
                    link: cc.as_ref().map(|cc| cc[5].to_owned()),
                },
            };
            if node.node_type != NodeType::Switch && node.lid.is_none() {
                node.lid = port.lid;
            }
            node.ports.push(port);
            continue;
        }
        return Err(ParseError::UnexpectedLine {
            tool: T,
            line: l.to_owned(),
        });
    }
    if nodes.is_empty() {
        return Err(match failure_message(text) {
            Some(message) => ParseError::ToolFailed { tool: T, message },
            None => ParseError::Missing {
                tool: T,
                what: "node records",
            },
        });
    }
    Ok(nodes)
}

// ---------------------------------------------------------------- ibroute

/// A switch's unicast linear forwarding table as `ibroute` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lft {
    /// How the switch was addressed: `Lid 2` or `DR path slid 65535; dlid 65535; 0,1`.
    pub target: String,
    /// The switch LID when it was addressed by LID.
    pub switch_lid: Option<u16>,
    pub switch_guid: u64,
    /// NodeDescription (the net-file name under ibsim).
    pub switch_name: String,
    /// The LID range that was dumped (`[0x0-0x4]`).
    pub lid_range: (u16, u16),
    /// Valid entries only; LIDs without a route are absent.
    pub entries: Vec<LftEntry>,
}

/// One LFT entry: traffic to `lid` leaves by `port` (0 = the switch itself).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LftEntry {
    pub lid: u16,
    pub port: u8,
    pub dest: Option<LftDest>,
}

/// What ibroute says is at the destination LID.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LftDest {
    pub node_type: NodeType,
    pub port_guid: u64,
    pub name: String,
}

impl Lft {
    /// The output port for `lid`, `None` when the LFT has no valid entry.
    pub fn port_for(&self, lid: u16) -> Option<u8> {
        self.entries.iter().find(|e| e.lid == lid).map(|e| e.port)
    }
}

static_regex!(
    RT_HEADER,
    r"^Unicast lids \[0x([0-9a-fA-F]+)-0x([0-9a-fA-F]+)\] of switch (.*?) guid 0x([0-9a-fA-F]+) \((.*)\):\s*$"
);
static_regex!(RT_ENTRY, r"^0x([0-9a-fA-F]+)\s+(\d+)\s*(?::\s*(.*))?$");
static_regex!(
    RT_DEST,
    r"^\((Channel Adapter|Switch|Router) portguid 0x([0-9a-fA-F]+): '(.*)'\)$"
);
static_regex!(RT_FOOTER, r"^(\d+) valid lids dumped");

/// Parses `ibroute <lid>` / `ibroute -D <path>` (unicast tables).
pub fn parse_ibroute(text: &str) -> Result<Lft, ParseError> {
    const T: &str = "ibroute";
    let mut lft: Option<Lft> = None;
    let mut dumped: Option<usize> = None;
    for line in text.lines() {
        let l = line.trim();
        if is_noise(l) || l.starts_with("Lid ") || l.starts_with("Port ") {
            continue;
        }
        if let Some(c) = RT_HEADER.captures(l) {
            let target = c[3].to_owned();
            let switch_lid = match target.strip_prefix("Lid ") {
                Some(n) => Some(num(T, "switch lid", n)?),
                None => None,
            };
            lft = Some(Lft {
                switch_lid,
                target,
                switch_guid: hex(T, "switch guid", &c[4])?,
                switch_name: c[5].to_owned(),
                lid_range: (hex(T, "lid range", &c[1])?, hex(T, "lid range", &c[2])?),
                entries: Vec::new(),
            });
            continue;
        }
        if let Some(c) = RT_FOOTER.captures(l) {
            dumped = Some(num(T, "valid lid count", &c[1])?);
            continue;
        }
        if let (Some(c), Some(t)) = (RT_ENTRY.captures(l), lft.as_mut()) {
            let dest = match c.get(3).and_then(|m| RT_DEST.captures(m.as_str())) {
                Some(d) => Some(LftDest {
                    node_type: node_type_word(&d[1]).unwrap_or(NodeType::Ca),
                    port_guid: hex(T, "destination guid", &d[2])?,
                    name: d[3].to_owned(),
                }),
                None => None,
            };
            t.entries.push(LftEntry {
                lid: hex(T, "lid", &c[1])?,
                port: num(T, "output port", &c[2])?,
                dest,
            });
            continue;
        }
        if failure_message(l).is_some() {
            continue;
        }
        return Err(ParseError::UnexpectedLine {
            tool: T,
            line: l.to_owned(),
        });
    }
    let Some(lft) = lft else {
        return Err(match failure_message(text) {
            Some(message) => ParseError::ToolFailed { tool: T, message },
            None => ParseError::Missing {
                tool: T,
                what: "the `Unicast lids` header",
            },
        });
    };
    match dumped {
        Some(n) if n == lft.entries.len() => Ok(lft),
        Some(n) => Err(ParseError::BadValue {
            tool: T,
            what: "valid lid count",
            value: format!("{n} announced, {} listed", lft.entries.len()),
        }),
        None => Err(ParseError::Missing {
            tool: T,
            what: "the `valid lids dumped` footer",
        }),
    }
}

// ---------------------------------------------------------------- ibtracert

/// Result of `ibtracert <src> <dst>`: the hops, or why there is no path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathTrace {
    pub from: Option<TraceEnd>,
    pub to: Option<TraceEnd>,
    pub hops: Vec<TraceHop>,
    pub failure: Option<TraceFailure>,
}

impl PathTrace {
    /// True when the trace reached its destination.
    pub fn reached(&self) -> bool {
        self.failure.is_none() && self.to.is_some()
    }

    /// Output ports taken, in order (the first is the source's own port).
    pub fn out_ports(&self) -> Vec<u8> {
        self.hops.iter().map(|h| h.out_port).collect()
    }
}

/// Source (`From …`) or destination (`To …`) of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEnd {
    pub node_type: NodeType,
    pub node_guid: u64,
    pub port: u8,
    pub lid: u16,
    pub name: String,
}

/// `[out] -> <type> port {guid}[in] lid a-b "name"`: leaving the previous node by
/// `out_port`, entering this node by `in_port`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceHop {
    pub out_port: u8,
    pub node_type: NodeType,
    pub port_guid: u64,
    pub in_port: u8,
    pub lid: u16,
    pub name: String,
}

/// Why ibtracert found no path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFailureKind {
    /// `can't find a route from src to dest`: the destination is unreachable
    /// (LFT lacks the LID or the link is down).
    NoRouteToDestination,
    /// `can't find a route to the src port`: the source is unreachable, e.g.
    /// before any SM assigned LIDs.
    NoRouteToSource,
    Other,
}

/// The failure as the tool explained it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceFailure {
    pub kind: TraceFailureKind,
    /// The `iberror:` message, e.g. `failed: Failed to get route information`.
    pub message: String,
    /// The `ibwarn:` messages, in order, without pid.
    pub details: Vec<String>,
}

static_regex!(
    TR_END,
    r#"^(From|To) (ca|switch|router) \{0x([0-9a-fA-F]+)\} portnum (\d+) lid (\d+)-(\d+) "(.*)"$"#
);
static_regex!(
    TR_HOP,
    r#"^\[(\d+)\] -> (ca|switch|router) port \{0x([0-9a-fA-F]+)\}\[(\d+)\] lid (\d+)-(\d+) "(.*)"$"#
);

/// Parses `ibtracert <slid> <dlid>` output (stdout and stderr together);
/// `exit_ok` is whether the tool exited 0. A missing path is `Ok` with
/// [`PathTrace::failure`] set; only unreadable output is an `Err`.
pub fn parse_ibtracert(text: &str, exit_ok: bool) -> Result<PathTrace, ParseError> {
    const T: &str = "ibtracert";
    let mut trace = PathTrace {
        from: None,
        to: None,
        hops: Vec::new(),
        failure: None,
    };
    for line in text.lines() {
        let l = line.trim();
        if let Some(c) = TR_END.captures(l) {
            let end = TraceEnd {
                node_type: node_type_word(&c[2]).unwrap_or(NodeType::Ca),
                node_guid: hex(T, "node guid", &c[3])?,
                port: num(T, "port", &c[4])?,
                lid: num(T, "lid", &c[5])?,
                name: c[7].to_owned(),
            };
            if &c[1] == "From" {
                trace.from = Some(end);
            } else {
                trace.to = Some(end);
            }
        } else if let Some(c) = TR_HOP.captures(l) {
            trace.hops.push(TraceHop {
                out_port: num(T, "out port", &c[1])?,
                node_type: node_type_word(&c[2]).unwrap_or(NodeType::Ca),
                port_guid: hex(T, "port guid", &c[3])?,
                in_port: num(T, "in port", &c[4])?,
                lid: num(T, "lid", &c[5])?,
                name: c[7].to_owned(),
            });
        }
    }
    let message = failure_message(text);
    if exit_ok && message.is_none() {
        if trace.from.is_none() || trace.to.is_none() {
            return Err(ParseError::Missing {
                tool: T,
                what: "the From/To lines of a successful trace",
            });
        }
        return Ok(trace);
    }
    let details = warnings(text);
    let kind = if details
        .iter()
        .any(|d| d.contains("can't find a route from src to dest"))
    {
        TraceFailureKind::NoRouteToDestination
    } else if details
        .iter()
        .any(|d| d.contains("can't find a route to the src port"))
    {
        TraceFailureKind::NoRouteToSource
    } else {
        TraceFailureKind::Other
    };
    trace.to = None;
    trace.failure = Some(TraceFailure {
        kind,
        message: message.unwrap_or_else(|| "exited with a failure status".to_owned()),
        details,
    });
    Ok(trace)
}

// ---------------------------------------------------------------- sminfo

/// SMInfo state of a subnet manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SmState {
    NotActive,
    Discovering,
    Standby,
    Master,
    Unknown(u8),
}

/// What `sminfo [lid]` printed about the SM it asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SmInfo {
    pub sm_lid: u16,
    pub sm_guid: u64,
    pub activity_count: u64,
    pub priority: u8,
    pub state: SmState,
}

static_regex!(
    SMINFO,
    r"sminfo: sm lid (\d+) sm guid 0x([0-9a-fA-F]+), activity count (\d+) priority (\d+) state (\d+)"
);

/// Parses `sminfo` / `sminfo <lid>`. With no SM answering, sminfo prints
/// `sminfo: iberror: failed: query` (exit 255): that is
/// [`ParseError::ToolFailed`].
pub fn parse_sminfo(text: &str) -> Result<SmInfo, ParseError> {
    const T: &str = "sminfo";
    let Some(c) = text.lines().find_map(|l| SMINFO.captures(l)) else {
        return Err(match failure_message(text) {
            Some(message) => ParseError::ToolFailed { tool: T, message },
            None => ParseError::Missing {
                tool: T,
                what: "the `sminfo: sm lid …` line",
            },
        });
    };
    let state_num: u8 = num(T, "state", &c[5])?;
    Ok(SmInfo {
        sm_lid: num(T, "sm lid", &c[1])?,
        sm_guid: hex(T, "sm guid", &c[2])?,
        activity_count: num(T, "activity count", &c[3])?,
        priority: num(T, "priority", &c[4])?,
        state: match state_num {
            0 => SmState::NotActive,
            1 => SmState::Discovering,
            2 => SmState::Standby,
            3 => SmState::Master,
            n => SmState::Unknown(n),
        },
    })
}

// ---------------------------------------------------------------- saquery

/// One SA NodeRecord (`saquery` / `saquery <lid>`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaNodeRecord {
    pub lid: u16,
    pub node_type: NodeType,
    pub num_ports: u8,
    pub sys_guid: u64,
    pub node_guid: u64,
    pub port_guid: u64,
    pub port_num: u8,
    pub description: String,
}

/// Parses the NodeRecord dumps of `saquery [lid]`. The SA answering at all is
/// the proof that an SM/SA is up; without one saquery prints
/// `ibpanic: … Failed to bind to the SA …` ([`ParseError::ToolFailed`]).
/// An empty output is an empty list (what `saquery <unknown lid>` prints).
///
/// Under ibsim a multi-record answer is cut to its first record (no RMPP), so
/// ask for one LID at a time.
pub fn parse_saquery_nodes(text: &str) -> Result<Vec<SaNodeRecord>, ParseError> {
    const T: &str = "saquery";
    if let Some(message) = failure_message(text) {
        return Err(ParseError::ToolFailed { tool: T, message });
    }
    let mut blocks: Vec<Vec<(String, String)>> = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if is_noise(l) {
            continue;
        }
        if l == "NodeRecord dump:" {
            blocks.push(Vec::new());
            continue;
        }
        match (DOTTED.captures(l), blocks.last_mut()) {
            (Some(c), Some(b)) => b.push((c[1].to_owned(), c[2].trim().to_owned())),
            _ => {
                return Err(ParseError::UnexpectedLine {
                    tool: T,
                    line: l.to_owned(),
                });
            }
        }
    }
    blocks
        .into_iter()
        .map(|fields| {
            let get = |k: &'static str| {
                fields
                    .iter()
                    .find(|(name, _)| name == k)
                    .map(|(_, v)| v.as_str())
                    .ok_or(ParseError::Missing { tool: T, what: k })
            };
            let nt = get("node_type")?;
            Ok(SaNodeRecord {
                lid: num(T, "lid", get("lid")?)?,
                node_type: node_type_word(nt).ok_or_else(|| ParseError::BadValue {
                    tool: T,
                    what: "node_type",
                    value: nt.to_owned(),
                })?,
                num_ports: num(T, "num_ports", get("num_ports")?)?,
                sys_guid: hex(T, "sys_guid", get("sys_guid")?)?,
                node_guid: hex(T, "node_guid", get("node_guid")?)?,
                port_guid: hex(T, "port_guid", get("port_guid")?)?,
                port_num: num(T, "port_num", get("port_num")?)?,
                description: get("NodeDescription")?.to_owned(),
            })
        })
        .collect()
}

/// The path record the SA gave for a source and destination LID (`saquery PR
/// --src-to-dst SLID:DLID`): how an IB node finds its peer, from the SM's subnet
/// administrator, not from the network itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaPathRecord {
    pub slid: u16,
    pub dlid: u16,
    pub sgid: String,
    pub dgid: String,
    pub pkey: u16,
    pub sl: u8,
    /// The encoded MTU and rate selectors as the SA gives them (`0x84`: exactly 2048).
    pub mtu: u8,
    pub rate: u8,
}

/// Parse `saquery PR --src-to-dst SLID:DLID`. With no SM to answer, saquery prints `Query
/// SA failed: …` ([`ParseError::ToolFailed`]); an empty output is no record.
pub fn parse_saquery_path(text: &str) -> Result<Option<SaPathRecord>, ParseError> {
    const T: &str = "saquery";
    if let Some(message) = failure_message(text).or_else(|| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix("Query SA failed:"))
            .map(|m| m.trim().to_owned())
    }) {
        return Err(ParseError::ToolFailed { tool: T, message });
    }
    if !text.lines().any(|l| l.trim() == "PathRecord dump:") {
        return Ok(None);
    }
    let fields = dotted_fields(text);
    let get = |k: &'static str| {
        fields
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.as_str())
            .ok_or(ParseError::Missing { tool: T, what: k })
    };
    Ok(Some(SaPathRecord {
        slid: num(T, "slid", get("slid")?)?,
        dlid: num(T, "dlid", get("dlid")?)?,
        sgid: get("sgid")?.to_owned(),
        dgid: get("dgid")?.to_owned(),
        pkey: hex(T, "pkey", get("pkey")?)?,
        sl: num(T, "sl", get("sl")?)?,
        mtu: hex(T, "mtu", get("mtu")?)?,
        rate: hex(T, "rate", get("rate")?)?,
    }))
}

// ---------------------------------------------------------------- ibstat

/// One CA of `ibstat` (under umad2sim there is one, named `ibsim0`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IbstatCa {
    pub name: String,
    pub ca_type: String,
    pub node_guid: u64,
    pub ports: Vec<IbstatPort>,
}

/// One port of an `ibstat` CA.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IbstatPort {
    pub port: u8,
    pub state: LinkState,
    pub phys_state: PhysState,
    /// Gb/s as printed (`Rate: 10`).
    pub rate: Option<u32>,
    pub base_lid: u16,
    pub lmc: u8,
    pub sm_lid: u16,
    pub port_guid: u64,
    pub link_layer: String,
}

static_regex!(IBSTAT_CA, r"^CA '([^']*)'$");
static_regex!(IBSTAT_PORT, r"^Port (\d+):$");

/// Parses plain `ibstat`.
pub fn parse_ibstat(text: &str) -> Result<Vec<IbstatCa>, ParseError> {
    const T: &str = "ibstat";
    struct Ca {
        name: String,
        fields: Vec<(String, String)>,
        ports: Vec<(u8, Vec<(String, String)>)>,
    }
    let mut cas: Vec<Ca> = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if is_noise(l) {
            continue;
        }
        if let Some(c) = IBSTAT_CA.captures(l) {
            cas.push(Ca {
                name: c[1].to_owned(),
                fields: Vec::new(),
                ports: Vec::new(),
            });
            continue;
        }
        let Some(ca) = cas.last_mut() else {
            return Err(match failure_message(text) {
                Some(message) => ParseError::ToolFailed { tool: T, message },
                None => ParseError::UnexpectedLine {
                    tool: T,
                    line: l.to_owned(),
                },
            });
        };
        if let Some(c) = IBSTAT_PORT.captures(l) {
            ca.ports.push((num(T, "port number", &c[1])?, Vec::new()));
            continue;
        }
        let Some((k, v)) = l.split_once(':') else {
            return Err(ParseError::UnexpectedLine {
                tool: T,
                line: l.to_owned(),
            });
        };
        let kv = (k.trim().to_owned(), v.trim().to_owned());
        match ca.ports.last_mut() {
            Some((_, f)) => f.push(kv),
            None => ca.fields.push(kv),
        }
    }
    if cas.is_empty() {
        return Err(ParseError::Missing {
            tool: T,
            what: "a `CA '…'` line",
        });
    }
    fn get<'a>(f: &'a [(String, String)], k: &'static str) -> Result<&'a str, ParseError> {
        f.iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.as_str())
            .ok_or(ParseError::Missing {
                tool: "ibstat",
                what: k,
            })
    }
    cas.into_iter()
        .map(|ca| {
            let ports = ca
                .ports
                .iter()
                .map(|(port, f)| {
                    Ok(IbstatPort {
                        port: *port,
                        state: LinkState::from_text(get(f, "State")?),
                        phys_state: PhysState::from_text(get(f, "Physical state")?),
                        rate: get(f, "Rate").ok().and_then(|r| r.parse().ok()),
                        base_lid: num(T, "Base lid", get(f, "Base lid")?)?,
                        lmc: num(T, "LMC", get(f, "LMC")?)?,
                        sm_lid: num(T, "SM lid", get(f, "SM lid")?)?,
                        port_guid: hex(T, "Port GUID", get(f, "Port GUID")?)?,
                        link_layer: get(f, "Link layer").unwrap_or_default().to_owned(),
                    })
                })
                .collect::<Result<Vec<_>, ParseError>>()?;
            Ok(IbstatCa {
                ca_type: get(&ca.fields, "CA type").unwrap_or_default().to_owned(),
                node_guid: hex(T, "Node GUID", get(&ca.fields, "Node GUID")?)?,
                name: ca.name,
                ports,
            })
        })
        .collect()
}

// ---------------------------------------------------------------- net file

/// A fabric to simulate: switches, HCAs and the cables between their ports.
///
/// ibsim conventions that [`render_netfile`] follows:
/// - Ports are numbered from 1. A switch's management port 0 exists implicitly
///   and is never cabled or listed; switch port GUID = node GUID.
/// - Every link is written on both of its ends (ibsim refuses one-sided links).
/// - A client (diag tool or opensm) picks its node with `SIM_HOST=<name>` and
///   always attaches at the node's first port: HCA port 1 (even if uncabled, so
///   cable port 1 of any HCA that runs an SM or tools), switch port 0. Without
///   `SIM_HOST` it attaches to the first node of the file; HCAs are rendered
///   first so that default is an HCA.
/// - GUIDs are written explicitly (`caguid=`/`switchguid=`) using ibsim's own
///   default numbering, see [`IbTopology::node_guid`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IbTopology {
    pub switches: Vec<IbNode>,
    pub hcas: Vec<IbNode>,
    pub links: Vec<IbLink>,
}

/// A switch or HCA: a unique name (ibsim's node id and NodeDescription) and its
/// number of ports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IbNode {
    pub name: String,
    pub ports: u8,
}

/// A cable between `(node name, port)` and `(node name, port)`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IbLink {
    pub a: (String, u8),
    pub b: (String, u8),
}

/// First HCA node GUID that ibsim hands out.
pub const IBSIM_HCA_GUID_BASE: u64 = 0x10_0000;
/// First switch node GUID that ibsim hands out.
pub const IBSIM_SWITCH_GUID_BASE: u64 = 0x20_0000;

impl IbTopology {
    /// Node GUID as ibsim numbers nodes (and as `render_netfile` writes it):
    /// switches `0x200000 + index`; HCAs from `0x100000`, each taking its node
    /// GUID plus one GUID per port, in list order.
    pub fn node_guid(&self, name: &str) -> Option<u64> {
        if let Some(i) = self.switches.iter().position(|n| n.name == name) {
            return Some(IBSIM_SWITCH_GUID_BASE + i as u64);
        }
        let mut next = IBSIM_HCA_GUID_BASE;
        for h in &self.hcas {
            if h.name == name {
                return Some(next);
            }
            next += u64::from(h.ports) + 1;
        }
        None
    }

    /// Port GUID (what `opensm -g` wants): HCA node GUID + port; for a switch
    /// the node GUID (port 0).
    pub fn port_guid(&self, name: &str, port: u8) -> Option<u64> {
        let guid = self.node_guid(name)?;
        if self.switches.iter().any(|n| n.name == name) {
            return Some(guid);
        }
        let node = self.hcas.iter().find(|n| n.name == name)?;
        (1..=node.ports)
            .contains(&port)
            .then_some(guid + u64::from(port))
    }

    /// Checks what ibsim would reject or silently mis-wire: names, duplicate
    /// nodes, unknown link ends, port ranges, ports cabled twice.
    pub fn validate(&self) -> Result<(), TopologyError> {
        let mut ports: HashMap<&str, u8> = HashMap::new();
        for n in self.hcas.iter().chain(&self.switches) {
            let bad = n.name.is_empty()
                || n.name.len() > 63
                || n.name.contains(['"', '[', ']', '\n', '\r']);
            if bad {
                return Err(TopologyError::BadName(n.name.clone()));
            }
            if n.ports == 0 {
                return Err(TopologyError::NoPorts(n.name.clone()));
            }
            if ports.insert(n.name.as_str(), n.ports).is_some() {
                return Err(TopologyError::DuplicateName(n.name.clone()));
            }
        }
        let mut used: HashSet<(&str, u8)> = HashSet::new();
        for l in &self.links {
            for (node, port) in [&l.a, &l.b] {
                let max = *ports
                    .get(node.as_str())
                    .ok_or_else(|| TopologyError::UnknownNode(node.clone()))?;
                if *port == 0 || *port > max {
                    return Err(TopologyError::PortOutOfRange {
                        node: node.clone(),
                        port: *port,
                        max,
                    });
                }
                if !used.insert((node.as_str(), *port)) {
                    return Err(TopologyError::PortUsedTwice {
                        node: node.clone(),
                        port: *port,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Renders an ibsim net file (`ibsim -s FILE`). Call [`IbTopology::validate`]
/// first: this writes whatever it is given.
///
/// Each port line carries the ibnetdiscover-style comment `# "peer" lid 0 4xSDR`,
/// which sets the link to 4x SDR (ibsim's default) and keeps ibsim from warning
/// `cannot parse remote lid and connection type` for every port.
pub fn render_netfile(topo: &IbTopology) -> String {
    let mut out = String::from("# ibsim net file rendered by iblab\n");
    let mut emit = |kind: &str, guid_key: &str, node: &IbNode| {
        out.push('\n');
        if let Some(guid) = topo.node_guid(&node.name) {
            let _ = writeln!(out, "{guid_key}=0x{guid:016x}");
        }
        let _ = writeln!(out, "{kind} {} \"{}\"", node.ports, node.name);
        let mut ends: Vec<(u8, &str, u8)> = topo
            .links
            .iter()
            .flat_map(|l| [(&l.a, &l.b), (&l.b, &l.a)])
            .filter(|(me, _)| me.0 == node.name)
            .map(|(me, peer)| (me.1, peer.0.as_str(), peer.1))
            .collect();
        ends.sort_unstable();
        for (port, peer, peer_port) in ends {
            let _ = writeln!(
                out,
                "[{port}] \"{peer}\"[{peer_port}]\t# \"{peer}\" lid 0 4xSDR"
            );
        }
    };
    for h in &topo.hcas {
        emit("Hca", "caguid", h);
    }
    for s in &topo.switches {
        emit("Switch", "switchguid", s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fabric the fixtures were captured on (h1-sw1 cabled 4xEDR in the capture).
    fn capture_topology() -> IbTopology {
        let node = |name: &str, ports| IbNode {
            name: name.into(),
            ports,
        };
        let link = |a: &str, pa, b: &str, pb| IbLink {
            a: (a.into(), pa),
            b: (b.into(), pb),
        };
        IbTopology {
            switches: vec![node("sw1", 8), node("sw2", 8)],
            hcas: vec![node("h1", 1), node("h2", 1)],
            links: vec![
                link("h1", 1, "sw1", 1),
                link("h2", 1, "sw2", 1),
                link("sw1", 7, "sw2", 7),
                link("sw1", 8, "sw2", 8),
            ],
        }
    }

    // ---- smpquery portinfo

    #[test]
    fn portinfo_before_any_sm_is_init_with_lid_0() {
        let p = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_init.txt"
        ))
        .unwrap();
        assert_eq!(p.lid, 0);
        assert_eq!(p.sm_lid, 0);
        assert_eq!(p.link_state, LinkState::Init);
        assert_eq!(p.phys_state, PhysState::LinkUp);
        assert_eq!(p.target, "DR path slid 65535; dlid 65535; 0");
        assert_eq!(p.port, Some(0));
        assert_eq!(p.local_port, 1);
        assert_eq!(p.link_width, Some(4));
        assert_eq!(p.link_speed_gbps, Some(2.5));
        assert_eq!(p.link_speed_ext_gbps, None);
        assert!(!p.is_sm());
    }

    #[test]
    fn portinfo_with_sm_is_active_with_assigned_lids() {
        let p = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_active.txt"
        ))
        .unwrap();
        assert_eq!((p.lid, p.sm_lid, p.lmc), (4, 1, 0));
        assert_eq!(p.link_state, LinkState::Active);
        assert_eq!(p.target, "Lid 4");
        assert_eq!(p.capability_mask, Some(0x50c04a));
        // the standby opensm runs on this port
        assert!(p.is_sm());
    }

    #[test]
    fn portinfo_reads_extended_speed() {
        let p = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_edr_active.txt"
        ))
        .unwrap();
        assert_eq!(p.lid, 1);
        assert_eq!(p.link_speed_gbps, Some(10.0));
        assert_eq!(p.link_speed_ext_gbps, Some(25.78125));
        assert_eq!(p.lane_gbps(), Some(25.78125));
    }

    #[test]
    fn portinfo_of_switch_ports_follows_unlink() {
        let up = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_sw_active.txt"
        ))
        .unwrap();
        assert_eq!(up.port, Some(7));
        assert_eq!(up.link_state, LinkState::Active);
        assert_eq!(up.lid, 0, "switch external ports carry no LID");
        let down = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_sw_down.txt"
        ))
        .unwrap();
        assert_eq!(down.link_state, LinkState::Down);
        assert_eq!(down.phys_state, PhysState::Polling);
        let init = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_sw_init.txt"
        ))
        .unwrap();
        assert_eq!(init.target, "DR path slid 65535; dlid 65535; 0,1");
        assert_eq!(init.link_state, LinkState::Init);
    }

    #[test]
    fn unlinked_hca_port_is_down_but_keeps_its_lid() {
        let p = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_down.txt"
        ))
        .unwrap();
        assert_eq!(p.link_state, LinkState::Down);
        assert_eq!(p.phys_state, PhysState::Polling);
        assert_eq!(p.lid, 4);
    }

    #[test]
    fn portinfo_sm_lid_moves_to_the_new_master() {
        let p = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_h1_after_takeover.txt"
        ))
        .unwrap();
        assert_eq!((p.lid, p.sm_lid), (1, 4));
        assert!(!p.is_sm(), "the master on h1 was stopped");
    }

    #[test]
    fn portinfo_failure_carries_the_tools_message() {
        let e = parse_portinfo(include_str!(
            "../../../tests/fixtures/ib/smpquery_portinfo_fail.txt"
        ))
        .unwrap_err();
        assert_eq!(
            e,
            ParseError::ToolFailed {
                tool: "smpquery portinfo",
                message: "failed: operation portinfo: port info query failed".into()
            }
        );
        assert!(matches!(
            parse_portinfo("nothing here"),
            Err(ParseError::Missing { .. })
        ));
    }

    // ---- ibnetdiscover

    #[test]
    fn ibnetdiscover_active_fabric() {
        let nodes = parse_ibnetdiscover(include_str!(
            "../../../tests/fixtures/ib/ibnetdiscover_active.txt"
        ))
        .unwrap();
        assert_eq!(nodes.len(), 4);
        let by = |d: &str| nodes.iter().find(|n| n.description == d).unwrap();
        let sw1 = by("sw1");
        assert_eq!(sw1.node_type, NodeType::Switch);
        assert_eq!(sw1.guid, 0x200000);
        assert_eq!(sw1.id, "S-0000000000200000");
        assert_eq!(sw1.num_ports, 8);
        assert_eq!(sw1.lid, Some(2));
        assert_eq!(
            sw1.ports.iter().map(|p| p.port).collect::<Vec<_>>(),
            vec![1, 7, 8]
        );
        let p1 = sw1.port(1).unwrap();
        assert_eq!(p1.peer.description.as_deref(), Some("h1"));
        assert_eq!(p1.peer.port_guid, Some(0x100001));
        assert_eq!(p1.peer.lid, Some(1));
        assert_eq!(p1.peer.link.as_deref(), Some("4xEDR"));
        let p7 = sw1.port(7).unwrap();
        assert_eq!(
            (p7.peer.id.as_str(), p7.peer.port),
            ("S-0000000000200001", 7)
        );
        let h2 = by("h2");
        assert_eq!(h2.node_type, NodeType::Ca);
        assert_eq!(h2.guid, 0x100002);
        assert_eq!(h2.lid, Some(4));
        let hp = h2.port(1).unwrap();
        assert_eq!(hp.port_guid, Some(0x100003));
        assert_eq!(hp.lid, Some(4));
        assert_eq!(hp.peer.description.as_deref(), Some("sw2"));
        assert_eq!((hp.peer.lid, hp.peer.port), (Some(3), 1));
    }

    #[test]
    fn ibnetdiscover_before_sm_has_lid_zero_everywhere() {
        let nodes = parse_ibnetdiscover(include_str!(
            "../../../tests/fixtures/ib/ibnetdiscover_init.txt"
        ))
        .unwrap();
        assert_eq!(nodes.len(), 4);
        assert!(nodes.iter().all(|n| n.lid == Some(0)));
        assert!(
            nodes
                .iter()
                .flat_map(|n| &n.ports)
                .all(|p| p.peer.lid == Some(0))
        );
    }

    #[test]
    fn ibnetdiscover_two_port_hcas_get_a_lid_per_port() {
        let nodes = parse_ibnetdiscover(include_str!(
            "../../../tests/fixtures/ib/ibnetdiscover_2port_hca.txt"
        ))
        .unwrap();
        let hca1 = nodes.iter().find(|n| n.description == "Hca1").unwrap();
        assert_eq!(hca1.num_ports, 2);
        let lids: Vec<_> = hca1.ports.iter().map(|p| (p.port, p.lid)).collect();
        assert_eq!(lids, vec![(1, Some(2)), (2, Some(4))]);
        assert_eq!(hca1.port(2).unwrap().port_guid, Some(0x100002));
    }

    #[test]
    fn ibnetdiscover_rejects_foreign_text() {
        assert!(matches!(
            parse_ibnetdiscover("Switch 8 \"S-1\"\nnot a port line"),
            Err(ParseError::UnexpectedLine { .. })
        ));
        assert_eq!(
            parse_ibnetdiscover("ibwarn: [9] x\nibnetdiscover: iberror: failed: discover failed"),
            Err(ParseError::ToolFailed {
                tool: "ibnetdiscover",
                message: "failed: discover failed".into()
            })
        );
        assert!(matches!(
            parse_ibnetdiscover("ibwarn: [1] x\n"),
            Err(ParseError::Missing { .. })
        ));
    }

    // ---- ibroute

    #[test]
    fn ibroute_lft_of_sw1() {
        let t = parse_ibroute(include_str!("../../../tests/fixtures/ib/ibroute_sw1.txt")).unwrap();
        assert_eq!(t.switch_lid, Some(2));
        assert_eq!(t.switch_guid, 0x200000);
        assert_eq!(t.switch_name, "sw1");
        assert_eq!(t.lid_range, (0, 4));
        assert_eq!(t.entries.len(), 4);
        assert_eq!(t.port_for(1), Some(1));
        assert_eq!(t.port_for(2), Some(0));
        assert_eq!(t.port_for(3), Some(8));
        assert_eq!(t.port_for(4), Some(7));
        let dest = t.entries[3].dest.as_ref().unwrap();
        assert_eq!(dest.node_type, NodeType::Ca);
        assert_eq!(dest.port_guid, 0x100003);
        assert_eq!(dest.name, "h2");
        let sw2 =
            parse_ibroute(include_str!("../../../tests/fixtures/ib/ibroute_sw2.txt")).unwrap();
        assert_eq!(sw2.port_for(1), Some(7));
        assert_eq!(sw2.port_for(4), Some(1));
    }

    #[test]
    fn ibroute_shows_reroute_and_partition() {
        let rerouted = parse_ibroute(include_str!(
            "../../../tests/fixtures/ib/ibroute_sw1_rerouted.txt"
        ))
        .unwrap();
        assert_eq!(rerouted.port_for(4), Some(8));
        let cut = parse_ibroute(include_str!(
            "../../../tests/fixtures/ib/ibroute_sw1_partitioned.txt"
        ))
        .unwrap();
        assert_eq!(cut.entries.len(), 2);
        assert_eq!(cut.port_for(3), None);
        assert_eq!(cut.port_for(4), None);
    }

    #[test]
    fn ibroute_before_sm_is_empty_and_addressed_by_dr_path() {
        let t = parse_ibroute(include_str!("../../../tests/fixtures/ib/ibroute_init.txt")).unwrap();
        assert!(t.entries.is_empty());
        assert_eq!(t.switch_lid, None);
        assert_eq!(t.target, "DR path slid 65535; dlid 65535; 0,1");
        assert_eq!(t.switch_name, "sw2");
    }

    #[test]
    fn ibroute_errors() {
        let e = parse_ibroute("ibroute: iberror: failed: can't resolve destination port 0,9")
            .unwrap_err();
        assert!(
            matches!(e, ParseError::ToolFailed { message, .. } if message.contains("can't resolve"))
        );
        let truncated = include_str!("../../../tests/fixtures/ib/ibroute_sw1.txt")
            .replace("4 valid lids dumped", "5 valid lids dumped");
        assert!(matches!(
            parse_ibroute(&truncated),
            Err(ParseError::BadValue { .. })
        ));
    }

    // ---- ibtracert

    #[test]
    fn ibtracert_ok_walks_sw1_port_7() {
        let t = parse_ibtracert(
            include_str!("../../../tests/fixtures/ib/ibtracert_ok.txt"),
            true,
        )
        .unwrap();
        assert!(t.reached());
        let from = t.from.as_ref().unwrap();
        assert_eq!(
            (from.lid, from.name.as_str(), from.node_guid),
            (1, "h1", 0x100000)
        );
        let to = t.to.as_ref().unwrap();
        assert_eq!((to.lid, to.name.as_str(), to.port), (4, "h2", 1));
        assert_eq!(t.hops.len(), 3);
        assert_eq!(t.out_ports(), vec![1, 7, 1]);
        assert_eq!(t.hops[1].name, "sw2");
        assert_eq!(t.hops[1].in_port, 7);
        assert_eq!(t.hops[1].node_type, NodeType::Switch);
        assert_eq!(t.hops[2].port_guid, 0x100003);
    }

    #[test]
    fn ibtracert_after_unlink_takes_the_other_isl() {
        let t = parse_ibtracert(
            include_str!("../../../tests/fixtures/ib/ibtracert_rerouted.txt"),
            true,
        )
        .unwrap();
        assert!(t.reached());
        assert_eq!(t.out_ports(), vec![1, 8, 1]);
    }

    #[test]
    fn ibtracert_without_path_is_a_failed_trace() {
        let t = parse_ibtracert(
            include_str!("../../../tests/fixtures/ib/ibtracert_fail.txt"),
            false,
        )
        .unwrap();
        assert!(!t.reached());
        let f = t.failure.unwrap();
        assert_eq!(f.kind, TraceFailureKind::NoRouteToDestination);
        assert_eq!(f.message, "failed: Failed to get route information");
        assert_eq!(f.details.len(), 3);
        assert_eq!(f.details[0], "mad_rpc: _do_madrpc failed; dport (Lid 4)");
        let sw = parse_ibtracert(
            include_str!("../../../tests/fixtures/ib/ibtracert_fail_switch.txt"),
            false,
        )
        .unwrap();
        assert_eq!(
            sw.failure.unwrap().kind,
            TraceFailureKind::NoRouteToDestination
        );
    }

    #[test]
    fn ibtracert_before_sm_cannot_reach_the_source() {
        let t = parse_ibtracert(
            include_str!("../../../tests/fixtures/ib/ibtracert_init.txt"),
            false,
        )
        .unwrap();
        assert_eq!(t.failure.unwrap().kind, TraceFailureKind::NoRouteToSource);
    }

    #[test]
    fn ibtracert_exit_status_and_garbage() {
        // a non-zero exit is a failure even when the text looks complete
        let t = parse_ibtracert(
            include_str!("../../../tests/fixtures/ib/ibtracert_ok.txt"),
            false,
        )
        .unwrap();
        assert!(!t.reached());
        assert_eq!(t.failure.unwrap().kind, TraceFailureKind::Other);
        assert!(matches!(
            parse_ibtracert("something else", true),
            Err(ParseError::Missing { .. })
        ));
    }

    // ---- sminfo

    #[test]
    fn sminfo_master_and_standby() {
        let m = parse_sminfo(include_str!("../../../tests/fixtures/ib/sminfo_master.txt")).unwrap();
        assert_eq!(
            m,
            SmInfo {
                sm_lid: 1,
                sm_guid: 0x100001,
                activity_count: 136,
                priority: 10,
                state: SmState::Master
            }
        );
        let s = parse_sminfo(include_str!(
            "../../../tests/fixtures/ib/sminfo_standby.txt"
        ))
        .unwrap();
        assert_eq!((s.sm_lid, s.priority), (4, 5));
        assert_eq!(s.state, SmState::Standby);
    }

    #[test]
    fn sminfo_after_takeover_names_the_former_standby() {
        let m = parse_sminfo(include_str!(
            "../../../tests/fixtures/ib/sminfo_after_takeover.txt"
        ))
        .unwrap();
        assert_eq!((m.sm_lid, m.sm_guid), (4, 0x100003));
        assert_eq!(m.state, SmState::Master);
    }

    #[test]
    fn sminfo_without_sm_is_a_tool_failure() {
        for text in [
            include_str!("../../../tests/fixtures/ib/sminfo_nosm.txt"),
            include_str!("../../../tests/fixtures/ib/sminfo_nosm_after_stop.txt"),
        ] {
            assert_eq!(
                parse_sminfo(text),
                Err(ParseError::ToolFailed {
                    tool: "sminfo",
                    message: "failed: query".into()
                })
            );
        }
    }

    // ---- saquery

    #[test]
    fn saquery_node_record_by_lid() {
        let r = parse_saquery_nodes(include_str!(
            "../../../tests/fixtures/ib/saquery_node_lid4.txt"
        ))
        .unwrap();
        assert_eq!(
            r,
            vec![SaNodeRecord {
                lid: 4,
                node_type: NodeType::Ca,
                num_ports: 1,
                sys_guid: 0x100002,
                node_guid: 0x100002,
                port_guid: 0x100003,
                port_num: 1,
                description: "h2".into(),
            }]
        );
    }

    #[test]
    fn saquery_all_nodes_is_cut_to_one_record_under_ibsim() {
        let r = parse_saquery_nodes(include_str!("../../../tests/fixtures/ib/saquery_nodes.txt"))
            .unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].lid, r[0].description.as_str()), (1, "h1"));
    }

    /// `saquery PR --src-to-dst 1:3` under ibsim with opensm up; then with opensm gone.
    #[test]
    fn saquery_path_record_between_two_lids() {
        let r = parse_saquery_path(include_str!(
            "../../../tests/fixtures/ib/saquery_pr_1_to_3.txt"
        ))
        .unwrap()
        .unwrap();
        assert_eq!((r.slid, r.dlid, r.pkey, r.sl), (1, 3, 0xffff, 0));
        assert_eq!(
            (r.sgid.as_str(), r.dgid.as_str()),
            ("fe80::10:1", "fe80::10:3")
        );
        assert_eq!((r.mtu, r.rate), (0x84, 0x83));
        let e = parse_saquery_path(include_str!(
            "../../../tests/fixtures/ib/saquery_pr_no_sm.txt"
        ))
        .unwrap_err();
        assert!(
            matches!(&e, ParseError::ToolFailed { message, .. } if message.contains("timed out")),
            "{e:?}"
        );
        assert_eq!(parse_saquery_path(""), Ok(None));
    }

    #[test]
    fn saquery_unknown_lid_and_no_sa() {
        assert_eq!(
            parse_saquery_nodes(include_str!(
                "../../../tests/fixtures/ib/saquery_node_nolid.txt"
            )),
            Ok(vec![])
        );
        let e = parse_saquery_nodes(include_str!("../../../tests/fixtures/ib/saquery_nosm.txt"))
            .unwrap_err();
        assert!(
            matches!(&e, ParseError::ToolFailed { message, .. } if message.contains("Failed to bind to the SA")),
            "{e:?}"
        );
        // another record type is not mistaken for NodeRecords
        assert!(matches!(
            parse_saquery_nodes(include_str!("../../../tests/fixtures/ib/saquery_ismsm.txt")),
            Err(ParseError::UnexpectedLine { .. })
        ));
    }

    // ---- ibstat

    #[test]
    fn ibstat_before_and_after_sm() {
        let init =
            parse_ibstat(include_str!("../../../tests/fixtures/ib/ibstat_init.txt")).unwrap();
        assert_eq!(init.len(), 1);
        assert_eq!(init[0].name, "ibsim0");
        assert_eq!(init[0].ca_type, "simulator");
        assert_eq!(init[0].node_guid, 0x100002);
        let p = &init[0].ports[0];
        assert_eq!(p.state, LinkState::Init);
        assert_eq!((p.base_lid, p.sm_lid), (0, 0));
        let active =
            parse_ibstat(include_str!("../../../tests/fixtures/ib/ibstat_active.txt")).unwrap();
        let p = &active[0].ports[0];
        assert_eq!(p.port, 1);
        assert_eq!(p.state, LinkState::Active);
        assert_eq!(p.phys_state, PhysState::LinkUp);
        assert_eq!((p.base_lid, p.sm_lid, p.lmc), (4, 1, 0));
        assert_eq!(p.rate, Some(10));
        assert_eq!(p.port_guid, 0x100003);
        assert_eq!(p.link_layer, "IB");
    }

    // ---- net file

    #[test]
    fn netfile_lists_each_link_on_both_ends_with_ibsim_guids() {
        let topo = capture_topology();
        assert_eq!(topo.validate(), Ok(()));
        let expected = "# ibsim net file rendered by iblab\n\
\n\
caguid=0x0000000000100000\n\
Hca 1 \"h1\"\n\
[1] \"sw1\"[1]\t# \"sw1\" lid 0 4xSDR\n\
\n\
caguid=0x0000000000100002\n\
Hca 1 \"h2\"\n\
[1] \"sw2\"[1]\t# \"sw2\" lid 0 4xSDR\n\
\n\
switchguid=0x0000000000200000\n\
Switch 8 \"sw1\"\n\
[1] \"h1\"[1]\t# \"h1\" lid 0 4xSDR\n\
[7] \"sw2\"[7]\t# \"sw2\" lid 0 4xSDR\n\
[8] \"sw2\"[8]\t# \"sw2\" lid 0 4xSDR\n\
\n\
switchguid=0x0000000000200001\n\
Switch 8 \"sw2\"\n\
[1] \"h2\"[1]\t# \"h2\" lid 0 4xSDR\n\
[7] \"sw1\"[7]\t# \"sw1\" lid 0 4xSDR\n\
[8] \"sw1\"[8]\t# \"sw1\" lid 0 4xSDR\n";
        assert_eq!(render_netfile(&topo), expected);
    }

    #[test]
    fn topology_guids_match_what_ibsim_reported() {
        let topo = capture_topology();
        let nodes = parse_ibnetdiscover(include_str!(
            "../../../tests/fixtures/ib/ibnetdiscover_active.txt"
        ))
        .unwrap();
        for n in &nodes {
            assert_eq!(
                topo.node_guid(&n.description),
                Some(n.guid),
                "{}",
                n.description
            );
            for p in n.ports.iter().filter(|p| p.port_guid.is_some()) {
                assert_eq!(topo.port_guid(&n.description, p.port), p.port_guid);
            }
        }
        assert_eq!(topo.port_guid("sw2", 0), Some(0x200001));
        assert_eq!(topo.port_guid("h1", 2), None);
        assert_eq!(topo.node_guid("nope"), None);
        // multi-port HCAs take one GUID per port (ibnetdiscover_2port_hca: Hca2 = 0x100003)
        let two = IbTopology {
            switches: vec![],
            hcas: vec![
                IbNode {
                    name: "Hca1".into(),
                    ports: 2,
                },
                IbNode {
                    name: "Hca2".into(),
                    ports: 2,
                },
            ],
            links: vec![],
        };
        assert_eq!(two.node_guid("Hca2"), Some(0x100003));
        assert_eq!(two.port_guid("Hca2", 2), Some(0x100005));
    }

    #[test]
    fn validate_rejects_what_ibsim_cannot_wire() {
        let base = capture_topology();
        let mut t = base.clone();
        t.links.push(IbLink {
            a: ("sw1".into(), 7),
            b: ("sw2".into(), 6),
        });
        assert_eq!(
            t.validate(),
            Err(TopologyError::PortUsedTwice {
                node: "sw1".into(),
                port: 7
            })
        );
        let mut t = base.clone();
        t.links[0].a.1 = 2;
        assert_eq!(
            t.validate(),
            Err(TopologyError::PortOutOfRange {
                node: "h1".into(),
                port: 2,
                max: 1
            })
        );
        let mut t = base.clone();
        t.links[0].b.1 = 0;
        assert!(matches!(
            t.validate(),
            Err(TopologyError::PortOutOfRange { port: 0, .. })
        ));
        let mut t = base.clone();
        t.links[0].b.0 = "sw9".into();
        assert_eq!(t.validate(), Err(TopologyError::UnknownNode("sw9".into())));
        let mut t = base.clone();
        t.hcas.push(IbNode {
            name: "sw1".into(),
            ports: 1,
        });
        assert_eq!(
            t.validate(),
            Err(TopologyError::DuplicateName("sw1".into()))
        );
        let mut t = base.clone();
        t.hcas[0].name = "h\"1".into();
        assert!(matches!(t.validate(), Err(TopologyError::BadName(_))));
        let mut t = base;
        t.switches[0].ports = 0;
        assert_eq!(t.validate(), Err(TopologyError::NoPorts("sw1".into())));
    }
}
