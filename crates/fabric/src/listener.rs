//! Is the server a step just started the one that listens on its port? Before a client
//! starts, the server's node is asked which sockets listen on the port (`/proc/net/tcp`,
//! `tcp6`) and which of its processes hold them (`/proc/PID/fd`): the step goes on only
//! when every listener there that the client could reach belongs to the tool it started.
//! A port taken first by someone else (a visitor's shell in a lab pod shares the pod's
//! network) would otherwise answer for the tool: iperf3's client takes its figures from
//! its server, the ping-pong times whoever echoes, and perftest's TCP exchange swaps queue
//! pairs with whoever listens. Where the node shows only the tool's own processes (a lab
//! pod's measuring container), a listener that none of them holds is someone else's.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use iblab_backend::{Deployment, EnvError};
use iblab_core::command::Cmd;

/// How long a server may take to listen after it was started (a pod's exec is slow).
pub const LISTEN_WITHIN: Duration = Duration::from_secs(15);

/// What the check runs in a server's node.
pub const PROGRAMS: &[&str] = &["sh", "cat", "ls"];

/// What the node shows: its listening TCP sockets (address, port, inode) and which
/// process holds each inode.
const SOCKETS: &str = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; echo @@fds; \
                       ls -l /proc/[0-9]*/fd/ 2>/dev/null";

/// A listening socket: its local address and inode.
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub addr: IpAddr,
    pub port: u16,
    pub inode: u64,
}

/// `/proc/net/tcp`'s address field (`0100007F:1451`, `000…0:1451` for tcp6): the kernel
/// prints each 32-bit word of the address as the host reads it from memory.
fn address(field: &str) -> Option<(IpAddr, u16)> {
    let (a, p) = field.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let words: Vec<u32> = (0..a.len() / 8)
        .map(|i| u32::from_str_radix(&a[i * 8..i * 8 + 8], 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some((ip, port))
}

/// The listening sockets (state `0A`) in `/proc/net/tcp` and `tcp6` text.
pub fn listeners(text: &str) -> Vec<Listener> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                return None;
            }
            let (addr, port) = address(f[1])?;
            Some(Listener {
                addr,
                port,
                inode: f[9].parse().ok()?,
            })
        })
        .collect()
}

/// `ls -l /proc/*/fd/` text: the pid holding each socket inode.
pub fn holders(text: &str) -> BTreeMap<u64, Vec<u32>> {
    let mut out: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let mut pid = None;
    for l in text.lines() {
        if let Some(dir) = l
            .strip_prefix("/proc/")
            .and_then(|r| r.strip_suffix(':'))
            // GNU ls heads each folder with the argument as given (`/proc/1/fd/:`).
            .map(|r| r.trim_end_matches('/'))
            .and_then(|r| r.strip_suffix("/fd"))
        {
            pid = dir.parse().ok();
            continue;
        }
        let Some(inode) = l
            .split("-> socket:[")
            .nth(1)
            .and_then(|r| r.strip_suffix(']'))
            .and_then(|i| i.parse().ok())
        else {
            continue;
        };
        if let Some(p) = pid {
            let v = out.entry(inode).or_default();
            if !v.contains(&p) {
                v.push(p);
            }
        }
    }
    out
}

/// Could a client that connects to `to:port` reach this listener? (Its address, or a
/// wildcard of either family; an IPv4-mapped address counts as the IPv4 one.)
fn reaches(l: &Listener, to: IpAddr, port: u16) -> bool {
    let plain = |a: IpAddr| match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(a),
        a => a,
    };
    l.port == port && (l.addr.is_unspecified() || plain(l.addr) == plain(to))
}

/// Who holds what the client would reach on `to:port`, as the node shows it: `Ok(None)`
/// while nothing listens there; `Ok(Some(pids))` for the processes that hold every such
/// listener; `Err`: a listener no process shown there holds.
pub fn who_listens(text: &str, to: IpAddr, port: u16) -> Result<Option<Vec<u32>>, String> {
    let (tcp, fds) = text.split_once("@@fds").unwrap_or((text, ""));
    let held = holders(fds);
    let mine: Vec<Listener> = listeners(tcp)
        .into_iter()
        .filter(|l| reaches(l, to, port))
        .collect();
    if mine.is_empty() {
        return Ok(None);
    }
    let mut pids = Vec::new();
    for l in &mine {
        match held.get(&l.inode) {
            Some(p) => pids.extend(p.iter().copied()),
            None => {
                return Err(format!(
                    "a socket listening on {}:{port} is held by no process where the tool \
                     runs (another container of the pod, which shares its network?)",
                    l.addr
                ));
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(Some(pids))
}

/// Wait until something listens on `to:port` in `node`, then make sure it is only `tool`
/// (a process whose command line names it). `Err` names what is in the way, or that the
/// tool never listened.
pub async fn held_by(
    backend: &dyn Deployment,
    node: &str,
    to: &str,
    port: u16,
    tool: &str,
) -> Result<(), EnvError> {
    let Ok(to_ip) = to.parse::<IpAddr>() else {
        return Ok(());
    };
    let sh = |script: String| Cmd {
        argv: vec!["sh".into(), "-c".into(), script],
        stdin: None,
        may_fail: true,
    };
    let until = Instant::now() + LISTEN_WITHIN;
    let pids = loop {
        let out = backend
            .exec(node, &sh(SOCKETS.into()), Duration::from_secs(10))
            .await?;
        match who_listens(&out.stdout, to_ip, port) {
            Ok(Some(p)) => break p,
            Ok(None) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(None) => {
                return Err(EnvError::new(format!(
                    "{tool} on {node} did not listen on {to}:{port} within {} s (see its log)",
                    LISTEN_WITHIN.as_secs()
                )));
            }
            Err(e) => {
                return Err(EnvError::new(format!(
                    "port {port} on {node} is not {tool}'s: {e}; the step's figures would \
                     not be the tool's, so it is not run"
                )));
            }
        }
    };
    let script = format!(
        "for p in {}; do echo \"@@pid $p\"; cat /proc/$p/cmdline; echo; done",
        pids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = backend
        .exec(node, &sh(script), Duration::from_secs(10))
        .await?;
    for part in out.stdout.split("@@pid ").skip(1) {
        let (pid, cmdline) = part.split_once('\n').unwrap_or((part, ""));
        let words: Vec<&str> = cmdline.trim_end().split('\0').collect();
        if !words.iter().any(|w| w.rsplit('/').next() == Some(tool)) {
            return Err(EnvError::new(format!(
                "port {port} on {node} is held by process {} (`{}`), not by {tool}; the \
                 step's figures would not be the tool's, so it is not run",
                pid.trim(),
                crate::ctx::excerpt(words.join(" ").trim(), 120)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured in a lab pod's measuring container while `iperf3 -s -1 -B 198.18.0.2 -p
    /// 5201` ran there and a perl one-liner in the pod's shell held 5301 on every address.
    const POD: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 020012C6:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 811437 1 0000000000000000 100 0 0 10 0
   1: 00000000:14B5 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 811502 1 0000000000000000 100 0 0 10 0
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
@@fds
/proc/1/fd:
total 0
lrwx------ 1 root root 64 Dec  9 10:00 0 -> /dev/null
/proc/57/fd:
total 0
lrwx------ 1 root root 64 Dec  9 10:00 3 -> socket:[811437]
lrwx------ 1 root root 64 Dec  9 10:00 4 -> anon_inode:[eventpoll]
";

    #[test]
    fn reads_the_nodes_listeners_and_their_holders() {
        let (tcp, fds) = POD.split_once("@@fds").unwrap();
        let l = listeners(tcp);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].addr, "198.18.0.2".parse::<IpAddr>().unwrap());
        assert_eq!((l[0].port, l[0].inode), (5201, 811437));
        assert!(l[1].addr.is_unspecified() && l[1].port == 5301);
        assert_eq!(holders(fds)[&811437], [57]);
        // GNU coreutils' ls (this host, the local backend) heads a folder as it was given.
        let gnu = "/proc/4242/fd/:\ntotal 0\n\
                   lrwx------ 1 root root 64 Dec  7 01:40 3 -> socket:[1603460]\n";
        assert_eq!(holders(gnu)[&1603460], [4242]);
        let v6 = address("0000000000000000FFFF0000020012C6:1451").unwrap();
        assert_eq!(v6.0.to_string(), "::ffff:198.18.0.2");
    }

    #[test]
    fn a_port_the_tool_does_not_hold_is_refused() {
        let to: IpAddr = "198.18.0.2".parse().unwrap();
        assert_eq!(who_listens(POD, to, 5201), Ok(Some(vec![57])));
        let e = who_listens(POD, to, 5301).unwrap_err();
        assert!(e.contains("held by no process"), "{e}");
        assert_eq!(who_listens(POD, to, 18515), Ok(None));
        // Another address of the node is not what the client reaches.
        assert_eq!(
            who_listens(POD, "198.18.0.9".parse().unwrap(), 5201),
            Ok(None)
        );
    }
}
