//! Preflight of the Soft-RoCE fabric for a backend, read-only: is rdma_rxe there, in which
//! network-namespace mode is the RDMA subsystem, does the kernel's rxe have a socket per
//! namespace, how much memory may verbs pin. `plan` and `doctor` print these; nothing is
//! loaded or created to find out.

use serde::Serialize;

use crate::caps::HostCaps;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mark {
    Ok,
    /// Works, with a limit worth knowing.
    Warn,
    /// The fabric cannot work this way.
    Fail,
    /// A fact, neither good nor bad here.
    Info,
}

impl Mark {
    pub fn symbol(self) -> &'static str {
        match self {
            Mark::Ok => "✔",
            Mark::Warn => "!",
            Mark::Fail => "✘",
            Mark::Info => "·",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub mark: Mark,
    pub text: String,
}

pub fn check(name: &'static str, mark: Mark, text: impl Into<String>) -> Check {
    Check {
        name,
        mark,
        text: text.into(),
    }
}

/// A program's presence as a check, with the package that brings it when it is missing.
pub fn tool_check(caps: &HostCaps, program: &'static str) -> Check {
    let tool = crate::caps::TOOLS.iter().find(|t| t.program == program);
    let purpose = tool.map(|t| t.purpose).unwrap_or("");
    if caps.has(program) {
        check(program, Mark::Ok, purpose)
    } else {
        check(
            program,
            Mark::Fail,
            format!(
                "{purpose}  → apt-get install {}",
                tool.map(|t| t.package).unwrap_or("?")
            ),
        )
    }
}

/// The RDMA subsystem's namespace mode, from `rdma system show`
/// (`netns shared copy-on-fork on`): (mode, copy-on-fork).
pub fn parse_rdma_system(text: &str) -> Option<(String, Option<bool>)> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
            .map(|s| s.to_string())
    };
    let mode = after("netns")?;
    let cof = after("copy-on-fork").map(|v| v == "on");
    Some((mode, cof))
}

/// Does a kernel (its `rdma_rxe.ko` or its symbol table) carry rxe's per-namespace
/// sockets? Kernels that have them name per-net socket helpers `rxe_ns_pernet_*`.
pub fn has_per_netns_sockets(bytes: &[u8]) -> bool {
    const NEEDLE: &[u8] = b"rxe_ns_pernet";
    bytes.windows(NEEDLE.len()).any(|w| w == NEEDLE)
}

pub fn memlock_check(limit: Option<u64>, fix: &str) -> Check {
    match limit {
        None => check("memlock", Mark::Ok, "unlimited"),
        Some(b) if b >= 64 << 20 => check("memlock", Mark::Ok, format!("{} MiB", b >> 20)),
        Some(b) => check(
            "memlock",
            Mark::Warn,
            format!(
                "{} KiB: enough for perftest's default buffers, not for large registrations → {fix}",
                b >> 10
            ),
        ),
    }
}

/// Does the host kernel's rxe open a socket per network namespace (Linux ≥ 7.1)? Read
/// from the kernel's symbols when the module is loaded or built in, else from the module
/// file; where that cannot be read, why not.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "answer", content = "source", rename_all = "lowercase")]
pub enum RxeNetns {
    Yes(String),
    No(String),
    Unknown(String),
}

/// The host kernel's rxe and namespaces, as the snapshot found it.
pub fn host_rxe_per_netns(caps: &HostCaps) -> Check {
    match &caps.rxe_netns {
        RxeNetns::Yes(source) => check(
            "rxe per namespace",
            Mark::Ok,
            format!(
                "{source}: per-namespace sockets (rxe_ns_pernet_*, Linux ≥ 7.1): the local and \
                 docker backends carry roce natively, an rxe on each node's own interface"
            ),
        ),
        RxeNetns::No(source) => check(
            "rxe per namespace",
            Mark::Warn,
            format!(
                "no: {source} has one UDP socket, in the initial namespace; rxe then serves \
                 only that namespace (measured on 6.1 and 6.12), so roce runs on the vm backend"
            ),
        ),
        RxeNetns::Unknown(why) => {
            check("rxe per namespace", Mark::Info, format!("not known: {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured in the vm backend's guest (Debian 6.1 kernel, iproute2 6.1).
    const RDMA_SYSTEM_SHOW: &str = "netns shared copy-on-fork on\n";

    #[test]
    fn parses_rdma_system_show() {
        assert_eq!(
            parse_rdma_system(RDMA_SYSTEM_SHOW),
            Some(("shared".to_string(), Some(true)))
        );
        assert_eq!(
            parse_rdma_system("netns exclusive\n"),
            Some(("exclusive".to_string(), None))
        );
        assert_eq!(
            parse_rdma_system("Failed to open NETLINK_RDMA socket"),
            None
        );
    }

    #[test]
    fn per_namespace_sockets_by_symbol() {
        assert!(has_per_netns_sockets(
            b"\0rxe_net_add\0rxe_ns_pernet_sk4\0rxe_ns_pernet_set_sk4\0"
        ));
        assert!(!has_per_netns_sockets(b"\0rxe_net_add\0rxe_net_del\0"));
    }

    #[test]
    fn memlock_levels() {
        assert_eq!(memlock_check(None, "x").mark, Mark::Ok);
        assert_eq!(memlock_check(Some(1 << 30), "x").mark, Mark::Ok);
        let low = memlock_check(Some(8 << 20), "ulimit -l unlimited");
        assert_eq!(low.mark, Mark::Warn);
        assert!(low.text.contains("8192 KiB") && low.text.contains("ulimit"));
    }
}
