//! `ibv_devinfo` (and `-v`) output: verbs devices, their ports, state, link layer,
//! active MTU, LIDs and, with `-v`, the GID table.

use serde::Serialize;

/// One verbs device (`hca_id`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Device {
    pub name: String,
    /// `InfiniBand (0)` for IB and RoCE alike: both carry the IB transport.
    pub transport: String,
    pub node_guid: Option<String>,
    pub ports: Vec<Port>,
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Port {
    pub number: u32,
    /// `PORT_ACTIVE`, `PORT_INIT`, `PORT_DOWN`, … (the name without the number).
    pub state: String,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
    /// Active MTU in bytes.
    pub active_mtu: Option<u32>,
    pub max_mtu: Option<u32>,
    pub lid: Option<u32>,
    pub sm_lid: Option<u32>,
    /// `4X`, `1X` (with `-v`).
    pub active_width: Option<String>,
    /// `2.5 Gbps`, `25.0 Gbps` (with `-v`).
    pub active_speed: Option<String>,
    pub gids: Vec<Gid>,
}

/// A GID table entry (with `-v`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gid {
    pub index: u32,
    /// As printed: `::ffff:198.18.0.2` or `fe80::5054:ff:fe00:2`.
    pub gid: String,
    /// `RoCE v2`, `RoCE v1`, or empty on InfiniBand.
    pub kind: String,
}

impl Port {
    pub fn active(&self) -> bool {
        self.state == "PORT_ACTIVE"
    }

    /// The RoCEv2 GID index derived from an IPv4 address (`::ffff:a.b.c.d`), if present.
    pub fn roce_v2_ipv4_gid(&self, ipv4: &str) -> Option<u32> {
        let want = format!("::ffff:{ipv4}");
        self.gids
            .iter()
            .find(|g| g.gid == want && g.kind == "RoCE v2")
            .map(|g| g.index)
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DevinfoError {
    #[error("ibv_devinfo printed no device block: {0}")]
    Unrecognised(String),
}

fn number_in(text: &str) -> Option<u32> {
    let t = text.trim();
    let first = t.split_whitespace().next()?;
    first
        .strip_prefix("0x")
        .map(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| first.parse().ok())
}

/// Parse `ibv_devinfo [-v]`. "No IB devices found" is an empty list, not an error.
pub fn parse(output: &str) -> Result<Vec<Device>, DevinfoError> {
    if output.contains("No IB devices found") {
        return Ok(vec![]);
    }
    let mut devices: Vec<Device> = Vec::new();
    for raw in output.lines() {
        let line = raw.trim();
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if key == "hca_id" {
            devices.push(Device {
                name: value.to_string(),
                transport: String::new(),
                node_guid: None,
                ports: vec![],
            });
            continue;
        }
        let Some(dev) = devices.last_mut() else {
            continue;
        };
        match key {
            "transport" => dev.transport = value.to_string(),
            "node_guid" => dev.node_guid = Some(value.to_string()),
            "port" => dev.ports.push(Port {
                number: number_in(value).unwrap_or(0),
                state: String::new(),
                link_layer: String::new(),
                active_mtu: None,
                max_mtu: None,
                lid: None,
                sm_lid: None,
                active_width: None,
                active_speed: None,
                gids: vec![],
            }),
            _ => {
                let Some(port) = dev.ports.last_mut() else {
                    continue;
                };
                match key {
                    "state" => {
                        port.state = value.split_whitespace().next().unwrap_or("").to_string()
                    }
                    "link_layer" => port.link_layer = value.to_string(),
                    "active_mtu" => port.active_mtu = number_in(value),
                    "max_mtu" => port.max_mtu = number_in(value),
                    "port_lid" => port.lid = number_in(value),
                    "sm_lid" => port.sm_lid = number_in(value),
                    "active_width" => {
                        port.active_width = value.split_whitespace().next().map(str::to_string)
                    }
                    "active_speed" => {
                        port.active_speed = Some(
                            value
                                .split_once('(')
                                .map(|(s, _)| s.trim())
                                .unwrap_or(value)
                                .to_string(),
                        )
                    }
                    k if k.starts_with("GID[") => {
                        let index = k
                            .trim_start_matches("GID[")
                            .trim_end_matches(']')
                            .trim()
                            .parse()
                            .unwrap_or(0);
                        // `GID[  1]:  ::ffff:198.18.0.2, RoCE v2` (the GID itself has colons).
                        let rest = line.split_once("]:").map(|(_, r)| r.trim()).unwrap_or("");
                        let (gid, kind) = rest.split_once(',').unwrap_or((rest, ""));
                        port.gids.push(Gid {
                            index,
                            gid: gid.trim().to_string(),
                            kind: kind.trim().to_string(),
                        });
                    }
                    _ => {}
                }
            }
        }
    }
    if devices.is_empty() {
        let head: String = output.chars().take(120).collect();
        return Err(DevinfoError::Unrecognised(head));
    }
    Ok(devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_rxe_device() {
        let d = parse(include_str!("../tests/fixtures/ibv_devinfo_rxe.txt")).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].name, "rxe0");
        assert_eq!(d[0].transport, "InfiniBand (0)");
        assert_eq!(d[0].node_guid.as_deref(), Some("5054:00ff:fe00:0002"));
        let p = &d[0].ports[0];
        assert_eq!(p.number, 1);
        assert!(p.active());
        assert_eq!(p.link_layer, "Ethernet");
        assert_eq!(p.active_mtu, Some(1024));
        assert_eq!(p.max_mtu, Some(4096));
        assert_eq!(p.lid, Some(0));
        assert!(p.gids.is_empty());
    }

    #[test]
    fn verbose_output_has_the_gid_table() {
        let d = parse(include_str!("../tests/fixtures/ibv_devinfo_v_rxe.txt")).unwrap();
        let p = &d[0].ports[0];
        assert_eq!(p.gids.len(), 2);
        assert_eq!(p.gids[0].gid, "fe80::5054:ff:fe00:2");
        assert_eq!(p.gids[1].gid, "::ffff:198.18.0.2");
        assert_eq!(p.gids[1].kind, "RoCE v2");
        assert_eq!(p.roce_v2_ipv4_gid("198.18.0.2"), Some(1));
        assert_eq!(p.roce_v2_ipv4_gid("198.18.0.9"), None);
        assert_eq!(p.active_width.as_deref(), Some("1X"));
        assert_eq!(p.active_speed.as_deref(), Some("2.5 Gbps"));
        assert_eq!(p.active_mtu, Some(1024));
    }

    #[test]
    fn no_device_is_an_empty_list() {
        let d = parse(include_str!("../tests/fixtures/ibv_devinfo_none.txt")).unwrap();
        assert!(d.is_empty());
        assert!(parse("garbage").is_err());
    }
}
