//! What iproute2 prints as JSON about what Ethernet learned by itself: a bridge's
//! forwarding database (`bridge -j fdb show br BR`), a host's neighbour table
//! (`ip -j neigh show`, filled by ARP) and an interface's burnt-in address
//! (`ip -j link show`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A MAC address the bridge learned from a frame it received on a port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Learned {
    pub mac: String,
    pub port: String,
}

/// A neighbour a host resolved by itself (ARP), in a state the kernel reached on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Neighbour {
    pub ip: String,
    pub mac: String,
    pub state: String,
}

/// What iproute2 printed is not the JSON list asked for (an error message, an old
/// version without `-j`).
#[derive(Debug, thiserror::Error)]
pub enum NotAList {
    #[error("not a JSON array")]
    NotArray,
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
}

fn array(text: &str) -> Result<Vec<Value>, NotAList> {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::Array(v)) => Ok(v),
        Ok(_) => Err(NotAList::NotArray),
        Err(e) => Err(NotAList::NotJson(e)),
    }
}

/// The entries of the bridge's own table (`master` set) that it learned: not permanent
/// (its ports' own addresses), not static (written by someone), not multicast.
pub fn fdb_learned(text: &str) -> Result<Vec<Learned>, NotAList> {
    Ok(array(text)?
        .iter()
        .filter(|e| e.get("master").is_some())
        .filter(|e| e["state"].as_str().unwrap_or("").is_empty())
        .filter_map(|e| {
            let mac = e["mac"].as_str()?.to_lowercase();
            let first = u8::from_str_radix(mac.get(0..2)?, 16).ok()?;
            (first & 1 == 0).then(|| Learned {
                mac,
                port: e["ifname"].as_str().unwrap_or("").to_string(),
            })
        })
        .collect())
}

/// Neighbours in a state ARP reaches by itself (REACHABLE, STALE, DELAY, PROBE); entries
/// someone wrote (PERMANENT, NOARP) and failed or unfinished resolutions are left out.
pub fn neighbours(text: &str) -> Result<Vec<Neighbour>, NotAList> {
    Ok(array(text)?
        .iter()
        .filter_map(|e| {
            let states: Vec<&str> = e["state"]
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let learned = states
                .iter()
                .any(|s| matches!(*s, "REACHABLE" | "STALE" | "DELAY" | "PROBE"))
                && !states.iter().any(|s| matches!(*s, "PERMANENT" | "NOARP"));
            learned.then(|| Neighbour {
                ip: e["dst"].as_str().unwrap_or("").to_string(),
                mac: e["lladdr"].as_str().unwrap_or("").to_lowercase(),
                state: states.join(","),
            })
        })
        .filter(|n| !n.ip.is_empty() && !n.mac.is_empty())
        .collect())
}

/// The MAC address of an interface, from `ip -j link show`.
pub fn link_mac(text: &str, ifname: &str) -> Option<String> {
    array(text)
        .ok()?
        .iter()
        .find(|l| l["ifname"] == ifname)
        .and_then(|l| l["address"].as_str())
        .map(str::to_lowercase)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FDB: &str = include_str!("../tests/fixtures/bridge_fdb_show.json");
    const NEIGH: &str = include_str!("../tests/fixtures/ip_neigh_show.json");
    const LINK: &str = include_str!("../tests/fixtures/ip_link_show_node.json");

    /// Captured on a switch of lesson 4 after a → b traffic: the two hosts' MACs learned
    /// on their ports; the ports' own (permanent) and multicast entries are not learned.
    #[test]
    fn the_bridge_learned_both_hosts() {
        let l = fdb_learned(FDB).unwrap();
        assert_eq!(
            l,
            vec![
                Learned {
                    mac: "ba:98:c6:ce:04:4e".into(),
                    port: "p1".into()
                },
                Learned {
                    mac: "f6:9d:48:d1:30:33".into(),
                    port: "p2".into()
                },
            ]
        );
        assert!(fdb_learned("[]").unwrap().is_empty());
        assert!(fdb_learned("Error: nope").is_err());
    }

    /// A static entry someone wrote is not learned.
    #[test]
    fn a_written_entry_is_not_learned() {
        let text = r#"[{"mac":"02:00:00:00:00:01","ifname":"p1","flags":[],"master":"br0","state":"static"}]"#;
        assert!(fdb_learned(text).unwrap().is_empty());
    }

    #[test]
    fn arp_resolved_the_peer() {
        let n = neighbours(NEIGH).unwrap();
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].ip, "198.18.0.2");
        assert_eq!(n[0].mac, "f6:9d:48:d1:30:33");
        assert_eq!(n[0].state, "REACHABLE");
        let written = r#"[{"dst":"198.18.0.9","dev":"eth0","lladdr":"02:00:00:00:00:09","state":["PERMANENT"]},
            {"dst":"198.18.0.8","dev":"eth0","state":["FAILED"]}]"#;
        assert!(neighbours(written).unwrap().is_empty());
    }

    #[test]
    fn reads_the_burnt_in_address() {
        assert_eq!(link_mac(LINK, "eth0").as_deref(), Some("ba:98:c6:ce:04:4e"));
        assert_eq!(link_mac(LINK, "eth9"), None);
    }
}
