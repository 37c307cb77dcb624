//! What `tcpdump -n -tt -x` prints, packet by packet: the capture time and the IPv4
//! packet's bytes as far as the snapshot length took them (the hex dump, link-level header
//! left out). Two decodings a capture step reads from those bytes: a TCP segment's flags
//! and payload, and a RoCEv2 packet's Base Transport Header (UDP to port 4791: the IB
//! transport inside UDP/IP).

use std::fmt;

/// RoCEv2's UDP destination port (IANA).
pub const ROCEV2_PORT: u16 = 4791;

#[derive(Debug, Clone, PartialEq)]
pub struct Packet {
    /// Seconds since the epoch, as tcpdump's `-tt` prints them.
    pub time: f64,
    /// The IPv4 packet, from its header on (as much as was captured).
    pub bytes: Vec<u8>,
}

/// The IB Base Transport Header's fields a lesson reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
}

impl Bth {
    /// The opcode in words (the reliable-connection ones perftest and the CM use).
    pub fn opcode_name(&self) -> &'static str {
        match self.opcode {
            0x00 => "RC SEND First",
            0x01 => "RC SEND Middle",
            0x02 => "RC SEND Last",
            0x04 => "RC SEND Only",
            0x06 => "RC RDMA WRITE First",
            0x07 => "RC RDMA WRITE Middle",
            0x08 => "RC RDMA WRITE Last",
            0x0a => "RC RDMA WRITE Only",
            0x0c => "RC RDMA READ Request",
            0x10 => "RC RDMA READ Response Only",
            0x11 => "RC Acknowledge",
            0x64 => "UD SEND Only",
            _ => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tcpdump output: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

/// Every packet of `tcpdump -n -tt -x` output. Lines that are not packets (tcpdump's
/// "listening on …", its closing counts) are passed over; a hex line without a packet
/// line before it is an error.
pub fn parse(text: &str) -> Result<Vec<Packet>, ParseError> {
    let mut packets: Vec<Packet> = Vec::new();
    let mut open = false;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("0x") {
            if !open {
                return Err(ParseError(format!(
                    "line {}: hex dump without a packet line before it",
                    n + 1
                )));
            }
            let Some((_, hex)) = rest.split_once(':') else {
                return Err(ParseError(format!("line {}: no offset", n + 1)));
            };
            let p = packets.last_mut().expect("open implies a packet");
            for group in hex.split_whitespace() {
                if group.len() % 2 != 0 || !group.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(ParseError(format!("line {}: `{group}` is not hex", n + 1)));
                }
                for i in (0..group.len()).step_by(2) {
                    let b = u8::from_str_radix(&group[i..i + 2], 16)
                        .map_err(|e| ParseError(format!("line {}: {e}", n + 1)))?;
                    p.bytes.push(b);
                }
            }
            continue;
        }
        // A packet line starts with its time: `1765043212.123456 IP …`.
        let first = line.split_whitespace().next().unwrap_or("");
        match first.parse::<f64>() {
            Ok(time) if first.contains('.') && line.contains(" IP ") => {
                packets.push(Packet {
                    time,
                    bytes: Vec::new(),
                });
                open = true;
            }
            _ => open = false,
        }
    }
    Ok(packets)
}

impl Packet {
    fn ihl(&self) -> Option<usize> {
        let b = *self.bytes.first()?;
        (b >> 4 == 4).then_some(usize::from(b & 0x0f) * 4)
    }

    /// The IP protocol number (6 TCP, 17 UDP).
    pub fn protocol(&self) -> Option<u8> {
        self.ihl()?;
        self.bytes.get(9).copied()
    }

    /// Source and destination IPv4 addresses.
    pub fn addresses(&self) -> Option<(String, String)> {
        self.ihl()?;
        let a = self.bytes.get(12..16)?;
        let b = self.bytes.get(16..20)?;
        Some((
            format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]),
            format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]),
        ))
    }

    /// Source and destination ports (TCP or UDP).
    pub fn ports(&self) -> Option<(u16, u16)> {
        let at = self.ihl()?;
        let p = self.bytes.get(at..at + 4)?;
        Some((
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ))
    }

    /// A TCP segment's flags byte (FIN 0x01, SYN 0x02, PSH 0x08, ACK 0x10).
    pub fn tcp_flags(&self) -> Option<u8> {
        (self.protocol()? == 6).then_some(())?;
        self.bytes.get(self.ihl()? + 13).copied()
    }

    /// A TCP segment's payload, as far as it was captured.
    pub fn tcp_payload(&self) -> Option<&[u8]> {
        (self.protocol()? == 6).then_some(())?;
        let at = self.ihl()?;
        let off = usize::from(*self.bytes.get(at + 12)? >> 4) * 4;
        let total = usize::from(u16::from_be_bytes([
            *self.bytes.get(2)?,
            *self.bytes.get(3)?,
        ]));
        let start = at + off;
        let end = total.min(self.bytes.len());
        self.bytes.get(start..end.max(start))
    }

    /// A RoCEv2 packet's Base Transport Header (UDP to 4791).
    pub fn bth(&self) -> Option<Bth> {
        (self.protocol()? == 17).then_some(())?;
        if self.ports()?.1 != ROCEV2_PORT {
            return None;
        }
        let at = self.ihl()? + 8;
        let h = self.bytes.get(at..at + 12)?;
        Some(Bth {
            opcode: h[0],
            dest_qp: u32::from_be_bytes([0, h[5], h[6], h[7]]),
            psn: u32::from_be_bytes([0, h[9], h[10], h[11]]),
        })
    }
}

/// Why tcpdump never captured, from its log: it says `listening on IFACE` once it does;
/// before that it names what stopped it (in an unprivileged pod: it may not change to
/// the user it runs as, without CAP_SETUID and CAP_SETGID).
pub fn never_listened(log: &str) -> Option<String> {
    if log.lines().any(|l| l.starts_with("listening on ")) {
        return None;
    }
    let said = log
        .lines()
        .filter_map(|l| l.strip_prefix("tcpdump: "))
        .rfind(|l| !l.starts_with("verbose output suppressed"))
        .unwrap_or("it printed nothing");
    Some(said.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SYN and a RoCEv2 RDMA WRITE, as tcpdump 4.99 prints them with `-n -tt -x`.
    const TWO: &str = "tcpdump: verbose output suppressed, use -v[v]... for full protocol decode
listening on a0, link-type EN10MB (Ethernet), snapshot length 256 bytes
1765043212.100001 IP 198.18.0.1.43210 > 198.18.0.2.18515: Flags [S], seq 1, win 64240, length 0
\t0x0000:  4500 003c 1c46 4000 4006 0000 c612 0001
\t0x0010:  c612 0002 a8ca 4853 0000 0001 0000 0000
\t0x0020:  a002 faf0 0000 0000 0204 05b4 0402 080a
\t0x0030:  0000 0001 0000 0000 0103 0307
1765043212.300002 IP 198.18.0.1.52133 > 198.18.0.2.4791: UDP, length 48
\t0x0000:  4500 004c 0001 4000 4011 0000 c612 0001
\t0x0010:  c612 0002 cba5 12b7 0038 0000 0a40 ffff
\t0x0020:  0000 0011 8000 0005
2 packets captured
";

    #[test]
    fn reads_packets_and_their_headers() {
        let p = parse(TWO).unwrap();
        assert_eq!(p.len(), 2);
        assert!((p[0].time - 1765043212.100001).abs() < 1e-6);
        assert_eq!(p[0].protocol(), Some(6));
        assert_eq!(p[0].ports(), Some((43210, 18515)));
        assert_eq!(p[0].tcp_flags(), Some(0x02));
        assert_eq!(p[0].tcp_payload(), Some(&[][..]));
        assert_eq!(
            p[0].addresses(),
            Some(("198.18.0.1".into(), "198.18.0.2".into()))
        );
        let bth = p[1].bth().unwrap();
        assert_eq!(bth.opcode, 0x0a);
        assert_eq!(bth.opcode_name(), "RC RDMA WRITE Only");
        assert_eq!(bth.dest_qp, 0x11);
        assert_eq!(bth.psn, 5);
        assert_eq!(p[0].bth(), None);
    }

    #[test]
    fn a_stray_hex_line_is_an_error() {
        assert!(parse("\t0x0000:  4500 003c\n").is_err());
        assert!(parse("1.5 IP x > y: UDP\n\t0x0000:  45g0\n").is_err());
    }

    #[test]
    fn a_tcpdump_that_never_listened_says_why() {
        let refused = include_str!("../../../tests/fixtures/tools/tcpdump_unprivileged_pod.txt");
        assert_eq!(
            never_listened(refused).as_deref(),
            Some("Couldn't change to 'root' uid=0 gid=0: Operation not permitted")
        );
        let watched =
            include_str!("../../../tests/fixtures/tools/tcpdump_send_lat_tcp_exchange.txt");
        assert_eq!(never_listened(watched), None);
        assert_eq!(never_listened("").as_deref(), Some("it printed nothing"));
    }
}
