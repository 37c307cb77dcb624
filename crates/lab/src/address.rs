//! The address plan: Ethernet segments of a topology, their /24s, and each node's address.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use crate::Lab;

/// The default prefix: 198.18.0.0/15 is reserved for benchmarking and never a user's LAN.
pub const DEFAULT_PREFIX: &str = "198.18.0.0/15";

/// An IPv4 prefix segments are carved from.
#[derive(Debug, Clone, Copy)]
pub struct Prefix {
    pub base: Ipv4Addr,
    pub len: u8,
}

/// Why a lab's `addressing.ipv4` is not a prefix iblab can carve segments from.
#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    #[error("`{0}` has no /length")]
    NoLength(String),
    #[error("`{text}` is not an IPv4 address")]
    Address {
        text: String,
        source: std::net::AddrParseError,
    },
    #[error("`/{text}` is not a prefix length")]
    Length {
        text: String,
        source: std::num::ParseIntError,
    },
    #[error("/{0} is out of range: segments are /24s, so use /8 to /22")]
    OutOfRange(u8),
    #[error("`{text}` has host bits set; write {network}/{len}")]
    HostBits {
        text: String,
        network: Ipv4Addr,
        len: u8,
    },
}

impl Prefix {
    pub fn parse(text: &str) -> Result<Prefix, PrefixError> {
        let (addr, len_text) = text
            .split_once('/')
            .ok_or_else(|| PrefixError::NoLength(text.to_string()))?;
        let base: Ipv4Addr = addr.parse().map_err(|source| PrefixError::Address {
            text: addr.to_string(),
            source,
        })?;
        let len: u8 = len_text.parse().map_err(|source| PrefixError::Length {
            text: len_text.to_string(),
            source,
        })?;
        if !(8..=22).contains(&len) {
            return Err(PrefixError::OutOfRange(len));
        }
        let mask = u32::MAX << (32 - len);
        if u32::from(base) & !mask != 0 {
            return Err(PrefixError::HostBits {
                text: text.to_string(),
                network: Ipv4Addr::from(u32::from(base) & mask),
                len,
            });
        }
        Ok(Prefix { base, len })
    }

    /// How many /24 segments fit.
    pub fn segments(&self) -> usize {
        1usize << (24 - self.len)
    }

    /// Address `host` in segment `k`.
    pub fn addr(&self, k: usize, host: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + (k as u32) * 256 + host as u32)
    }
}

/// An Ethernet broadcast domain: links that meet at switches, or one direct node-to-node link.
#[derive(Debug, Clone)]
pub struct Segment {
    pub index: usize,
    /// Indexes into `topology.links`.
    pub links: Vec<usize>,
    pub nodes: BTreeSet<String>,
}

/// Split the topology's links into segments.
pub fn segments(lab: &Lab) -> Vec<Segment> {
    let t = &lab.spec.topology;
    let switches: BTreeSet<&str> = t.switches.iter().map(String::as_str).collect();
    let n = t.links.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], i: usize) -> usize {
        let mut i = i;
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    let mut by_switch: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, l) in t.links.iter().enumerate() {
        for e in &l.ends {
            if switches.contains(e.as_str()) {
                if let Some(&j) = by_switch.get(e.as_str()) {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                    parent[a] = b;
                } else {
                    by_switch.insert(e, i);
                }
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        let r = find(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    let mut out: Vec<Segment> = groups
        .into_values()
        .map(|links| {
            let nodes = links
                .iter()
                .flat_map(|&i| t.links[i].ends.iter())
                .filter(|e| !switches.contains(e.as_str()))
                .cloned()
                .collect();
            Segment {
                index: 0,
                links,
                nodes,
            }
        })
        .collect();
    out.sort_by_key(|s| s.links[0]);
    for (k, s) in out.iter_mut().enumerate() {
        s.index = k;
    }
    out
}

/// The first segment two nodes share.
pub fn shared_segment(lab: &Lab, a: &str, b: &str) -> Option<usize> {
    segments(lab)
        .into_iter()
        .find(|s| s.nodes.contains(a) && s.nodes.contains(b))
        .map(|s| s.index)
}

/// The most nodes a v1 lab may have: a node's address in each /24 segment is its
/// position in `nodes` plus one, and the top of the /24 is kept free.
pub const MAX_NODES: usize = 250;

/// A shape v1 cannot wire: where it is in the lab (a path the locator knows), what is
/// wrong as a sentence, and how to fix it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unsupported {
    pub at: String,
    pub message: String,
    pub hint: String,
}

/// Shapes v1 cannot wire: too many nodes, a node twice on one segment, too many segments.
pub fn unsupported_shapes(lab: &Lab) -> Vec<Unsupported> {
    let t = &lab.spec.topology;
    let mut out = Vec::new();
    if t.nodes.len() > MAX_NODES {
        out.push(Unsupported {
            at: "spec.topology.nodes".into(),
            message: format!(
                "the topology has {} nodes; a lab has at most {MAX_NODES}",
                t.nodes.len()
            ),
            hint: format!(
                "use at most {MAX_NODES} nodes: each node's address is its place in `nodes` within a /24 per Ethernet segment"
            ),
        });
        return out;
    }
    let segs = segments(lab);
    for s in &segs {
        // The first link that attaches each node to this segment.
        let mut first: BTreeMap<&str, usize> = BTreeMap::new();
        for &i in &s.links {
            for e in &t.links[i].ends {
                if !t.nodes.contains(e) {
                    continue;
                }
                match first.get(e.as_str()) {
                    None => {
                        first.insert(e, i);
                    }
                    Some(&f) => out.push(Unsupported {
                        at: format!("spec.topology.links[{i}]"),
                        message: format!(
                            "node `{e}` is attached to the same Ethernet segment twice, by links `{}` and `{}`",
                            t.links[f].id(),
                            t.links[i].id()
                        ),
                        hint: "give a node one link into each segment (both would share one /24): remove one link, or connect the other through a separate switch".into(),
                    }),
                }
            }
        }
    }
    let given = t.addressing.as_ref().map(|a| a.ipv4.as_str());
    let prefix = given
        .and_then(|a| Prefix::parse(a).ok())
        .unwrap_or_else(default_prefix);
    if segs.len() > prefix.segments() {
        out.push(Unsupported {
            at: if given.is_some() {
                "spec.topology.addressing.ipv4".into()
            } else {
                "spec.topology.links".into()
            },
            message: format!(
                "the topology needs {} Ethernet segments but the prefix {} holds {} (one /24 each)",
                segs.len(),
                given.unwrap_or(DEFAULT_PREFIX),
                prefix.segments()
            ),
            hint: "give `spec.topology.addressing.ipv4` a shorter prefix (a /15 holds 512 segments), or join links at switches".into(),
        });
    }
    out
}

/// Switches of segments whose switch graph has a loop: their bridges run spanning tree,
/// or the segment would flood forever (IB, next to it, is routed by its SM instead).
pub fn looped_switches(lab: &Lab) -> BTreeSet<String> {
    let t = &lab.spec.topology;
    let mut out = BTreeSet::new();
    for s in segments(lab) {
        let sw: BTreeSet<&str> = s
            .links
            .iter()
            .flat_map(|&i| t.links[i].ends.iter())
            .filter(|e| t.switches.contains(*e))
            .map(String::as_str)
            .collect();
        // A connected graph with at least as many edges as vertices has a cycle.
        let sw_links = s
            .links
            .iter()
            .filter(|&&i| t.links[i].ends.iter().all(|e| t.switches.contains(e)))
            .count();
        if !sw.is_empty() && sw_links >= sw.len() {
            out.extend(sw.into_iter().map(String::from));
        }
    }
    out
}

pub fn default_prefix() -> Prefix {
    Prefix::parse(DEFAULT_PREFIX).unwrap_or(Prefix {
        base: Ipv4Addr::new(198, 18, 0, 0),
        len: 15,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let p = Prefix::parse("198.18.0.0/15").unwrap();
        assert_eq!(p.segments(), 512);
        assert_eq!(p.addr(1, 2), Ipv4Addr::new(198, 18, 1, 2));
        assert!(Prefix::parse("198.18.0.1/15").is_err());
        assert!(Prefix::parse("10.0.0.0/24").is_err());
        assert!(Prefix::parse("nonsense").is_err());
    }
}
