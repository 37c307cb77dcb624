//! What a path ② lab pod asks of its node, as the pod annotation [`ANNOTATION`] carries it:
//! the pod's lab links (VXLAN interfaces over the pod network, their peers set later by
//! iblab from inside the pod) and the Soft-RoCE devices to make on them. Written by the
//! kube backend when it renders the pod, read by the runtime wrapper on the node; checked
//! strictly on both sides, since whoever may create a pod may write it.

use serde::{Deserialize, Serialize};

/// The pod annotation that asks the node for links and rxe devices.
pub const ANNOTATION: &str = "iblab.dev/roce";

/// How many links one pod may ask for (a lab node has a handful).
pub const MAX_LINKS: usize = 16;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoceSpec {
    /// The pod network's interface as the CNI made it (`eth0`).
    pub underlay: String,
    /// Renamed to this first, where a lab interface needs the underlay's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_underlay_to: Option<String>,
    pub links: Vec<LinkSpec>,
    pub rxe: Vec<RxeSpec>,
}

/// One lab link's end in the pod: a VXLAN interface with no peer yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub name: String,
    pub mtu: u32,
    pub vni: u32,
    pub port: u16,
}

/// A Soft-RoCE device on one of the pod's lab interfaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RxeSpec {
    pub device: String,
    pub netdev: String,
}

/// What is wrong with an annotation: whoever may create a pod may write it, so what it
/// carries is escaped ([`crate::log::clean`]) before it is said.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(
        "the {ANNOTATION} annotation is not what iblab writes: {}",
        crate::log::clean(&.0.to_string(), 300)
    )]
    NotJson(#[source] serde_json::Error),
    #[error(
        "{what} `{}` is not a name of at most {max} letters, digits, '-', '_' or '.' that \
         begins with a letter or a digit",
        crate::log::clean(name, 80)
    )]
    NotAName {
        what: &'static str,
        name: String,
        max: usize,
    },
    #[error("{0} links asked for, at most {MAX_LINKS}")]
    TooManyLinks(usize),
    #[error("interface {0} is named twice")]
    InterfaceTwice(String),
    #[error("link {link}: MTU {mtu} is not in 68..=65535")]
    Mtu { link: String, mtu: u32 },
    #[error("link {link}: VNI {vni} is not in 1..2^24")]
    Vni { link: String, vni: u32 },
    #[error("link {0}: UDP port 0")]
    PortZero(String),
    #[error("more rxe devices than links")]
    MoreRxeThanLinks,
    #[error("rxe device {0} is named twice")]
    DeviceTwice(String),
    #[error(
        "rxe device {device} is on {}, which is not one of the pod's links",
        crate::log::clean(netdev, 80)
    )]
    NotOnALink { device: String, netdev: String },
}

/// A name the kernel and the tools take as one word and never as an option: a letter or a
/// digit first, then letters, digits, `-`, `_`, `.`; at most `max` bytes. (`rdma` and `ip`
/// read a word that begins with `-` as an option.)
fn word(what: &'static str, s: &str, max: usize) -> Result<(), SpecError> {
    let ok = s.len() <= max
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(SpecError::NotAName {
            what,
            name: s.to_string(),
            max,
        })
    }
}

/// An interface name (IFNAMSIZ − 1).
fn ifname(what: &'static str, s: &str) -> Result<(), SpecError> {
    word(what, s, 15)
}

impl RoceSpec {
    /// The annotation's text, checked.
    pub fn parse(text: &str) -> Result<RoceSpec, SpecError> {
        let s: RoceSpec = serde_json::from_str(text).map_err(SpecError::NotJson)?;
        s.check()?;
        Ok(s)
    }

    /// The annotation's text.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Every name a plain word, every number in range, every rxe on one of the links, no
    /// name twice.
    pub fn check(&self) -> Result<(), SpecError> {
        ifname("the underlay", &self.underlay)?;
        if let Some(r) = &self.rename_underlay_to {
            ifname("the underlay's new name", r)?;
        }
        if self.links.len() > MAX_LINKS {
            return Err(SpecError::TooManyLinks(self.links.len()));
        }
        let mut names = vec![self.rename_underlay_to.as_deref().unwrap_or(&self.underlay)];
        for l in &self.links {
            ifname("a link", &l.name)?;
            if names.contains(&l.name.as_str()) {
                return Err(SpecError::InterfaceTwice(l.name.clone()));
            }
            names.push(&l.name);
            if !(68..=65535).contains(&l.mtu) {
                return Err(SpecError::Mtu {
                    link: l.name.clone(),
                    mtu: l.mtu,
                });
            }
            if !(1..1 << 24).contains(&l.vni) {
                return Err(SpecError::Vni {
                    link: l.name.clone(),
                    vni: l.vni,
                });
            }
            if l.port == 0 {
                return Err(SpecError::PortZero(l.name.clone()));
            }
        }
        if self.rxe.len() > self.links.len() {
            return Err(SpecError::MoreRxeThanLinks);
        }
        let mut devices = Vec::new();
        for r in &self.rxe {
            word("an rxe device", &r.device, 63)?;
            if devices.contains(&r.device.as_str()) {
                return Err(SpecError::DeviceTwice(r.device.clone()));
            }
            devices.push(&r.device);
            if !self.links.iter().any(|l| l.name == r.netdev) {
                return Err(SpecError::NotOnALink {
                    device: r.device.clone(),
                    netdev: r.netdev.clone(),
                });
            }
        }
        Ok(())
    }

    /// The interface the links ride once the rename is done.
    pub fn underlay_now(&self) -> &str {
        self.rename_underlay_to.as_deref().unwrap_or(&self.underlay)
    }

    /// `ip -batch` lines that make the links, with no peer: iblab sets each one's remote
    /// from inside the pod once it knows the peer pod's IP.
    pub fn link_lines(&self) -> Vec<String> {
        self.links
            .iter()
            .map(|l| {
                format!(
                    "link add {} mtu {} gso_max_segs 1 type vxlan id {} dstport {} dev {}",
                    l.name,
                    l.mtu,
                    l.vni,
                    l.port,
                    self.underlay_now()
                )
            })
            .collect()
    }

    /// The shell script that renames the underlay, if one is asked for.
    pub fn rename(&self) -> Option<String> {
        self.rename_underlay_to
            .as_deref()
            .map(|to| rename_script(&self.underlay, to))
    }
}

/// A shell script, run in a pod's network namespace, that renames its pod network
/// interface `from` to `to`, keeping the pod's routes (the kernel brings back the
/// connected one).
pub fn rename_script(from: &str, to: &str) -> String {
    format!(
        "set -e\n\
         routes=$(ip -4 route show dev {from} | grep -v 'proto kernel' || true)\n\
         ip link set {from} down\n\
         ip link set {from} name {to}\n\
         ip link set {to} up\n\
         printf '%s\\n' \"$routes\" | while read -r r; do\n\
         \x20 if [ -n \"$r\" ]; then ip route replace $r dev {to}; fi\n\
         done\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RoceSpec {
        RoceSpec {
            underlay: "eth0".into(),
            rename_underlay_to: None,
            links: vec![LinkSpec {
                name: "eth1".into(),
                mtu: 1500,
                vni: 4000,
                port: 4789,
            }],
            rxe: vec![RxeSpec {
                device: "a-rxe0-0123456789abcdef".into(),
                netdev: "eth1".into(),
            }],
        }
    }

    #[test]
    fn what_the_backend_writes_the_node_reads() {
        let s = spec();
        assert_eq!(RoceSpec::parse(&s.to_text()).unwrap(), s);
        assert_eq!(
            s.link_lines(),
            ["link add eth1 mtu 1500 gso_max_segs 1 type vxlan id 4000 dstport 4789 dev eth0"]
        );
        assert!(s.rename().is_none());
        let renamed = RoceSpec {
            rename_underlay_to: Some("podnet0".into()),
            links: vec![LinkSpec {
                name: "eth0".into(),
                ..s.links[0].clone()
            }],
            rxe: vec![RxeSpec {
                netdev: "eth0".into(),
                ..s.rxe[0].clone()
            }],
            ..s.clone()
        };
        renamed.check().unwrap();
        assert!(renamed.link_lines()[0].ends_with("dev podnet0"));
        assert!(
            renamed
                .rename()
                .unwrap()
                .contains("ip link set eth0 name podnet0")
        );
    }

    /// Whoever may create a pod may write the annotation: nothing in it reaches a shell or
    /// a path unchecked.
    #[test]
    fn an_annotation_iblab_did_not_write_is_refused_saying_why() {
        let refused = |edit: &dyn Fn(&mut RoceSpec), says: &str| {
            let mut s = spec();
            edit(&mut s);
            let e = RoceSpec::parse(&s.to_text()).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        };
        refused(
            &|s| s.links[0].name = "eth1;reboot".into(),
            "a link `eth1;reboot`",
        );
        refused(
            &|s| s.links[0].name = "a-very-long-interface".into(),
            "at most 15",
        );
        refused(&|s| s.underlay = "..".into(), "the underlay");
        refused(&|s| s.rxe[0].device = "../x".into(), "an rxe device");
        // A name `rdma` or `ip` would read as an option.
        refused(
            &|s| s.rxe[0].device = "-j".into(),
            "begins with a letter or a digit",
        );
        refused(&|s| s.links[0].name = "-force".into(), "a link `-force`");
        refused(&|s| s.underlay = ".x".into(), "the underlay");
        // What a pod wrote comes back escaped, never raw.
        let e = RoceSpec::parse(&{
            let mut s = spec();
            s.links[0].name = "e\u{1b}[2J".into();
            s.to_text()
        })
        .unwrap_err()
        .to_string();
        assert!(!e.contains('\u{1b}'), "{e}");
        refused(
            &|s| s.rxe[0].netdev = "eth0".into(),
            "not one of the pod's links",
        );
        refused(&|s| s.links[0].vni = 0, "VNI 0");
        refused(&|s| s.links[0].mtu = 10, "MTU 10");
        refused(
            &|s| s.links = vec![s.links[0].clone(); MAX_LINKS + 1],
            "at most 16",
        );
        refused(&|s| s.links.push(s.links[0].clone()), "named twice");
        refused(&|s| s.links[0].name = "eth0".into(), "named twice");
        let e = RoceSpec::parse(r#"{"underlay":"eth0","links":[],"rxe":[],"x":1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
    }
}
