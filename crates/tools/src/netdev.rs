//! `/proc/net/dev`: each interface's received and sent bytes, as the network namespace that
//! reads the file sees them.

use std::collections::BTreeMap;

/// Bytes received and sent by one interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bytes {
    pub rx: u64,
    pub tx: u64,
}

/// Every interface of a `/proc/net/dev` text (loopback included), by name; `None` when a
/// line past the two header lines is not `NAME: COUNTERS…` with both byte counters.
pub fn parse(text: &str) -> Option<BTreeMap<String, Bytes>> {
    let mut out = BTreeMap::new();
    for line in text.lines().skip(2) {
        let (name, rest) = line.split_once(':')?;
        let fields: Vec<u64> = rest
            .split_whitespace()
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // Receive bytes is the first field, transmit bytes the ninth.
        let (rx, tx) = (*fields.first()?, *fields.get(8)?);
        out.insert(name.trim().to_string(), Bytes { rx, tx });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured on this machine in a lab namespace: a veth end with a long name and
    /// loopback.
    const TEXT: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0: 23562142   16095    0    0    0     0          0         0 1048726   15857    0    0    0     0       0          0
";

    #[test]
    fn every_interface_with_its_bytes() {
        let m = parse(TEXT).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            m["eth0"],
            Bytes {
                rx: 23_562_142,
                tx: 1_048_726
            }
        );
        assert_eq!(m["lo"], Bytes::default());
        assert!(parse("garbage").unwrap().is_empty());
        assert_eq!(parse("Inter-|\n face |\n  eth0: 1 2\n"), None);
    }
}
