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

fn check(name: &'static str, mark: Mark, text: impl Into<String>) -> Check {
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

/// Memory verbs may pin, in bytes (`None`: unlimited).
fn memlock_now() -> Option<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .unwrap_or((0, 0));
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

fn memlock_check(limit: Option<u64>, fix: &str) -> Check {
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

/// The host's RDMA subsystem mode, by running `rdma system show`.
fn host_rdma_system(caps: &HostCaps) -> Check {
    if !caps.has("rdma") {
        return check(
            "netns mode",
            Mark::Info,
            "not known: no `rdma` tool (apt-get install iproute2)",
        );
    }
    let out = crate::run::process::output_within(
        std::process::Command::new("rdma").args(["system", "show"]),
        std::time::Duration::from_secs(10),
    );
    match out {
        Ok(o) if o.status.success() => {
            match parse_rdma_system(&String::from_utf8_lossy(&o.stdout)) {
                Some((mode, _)) => check(
                    "netns mode",
                    Mark::Info,
                    format!(
                        "{mode} (`rdma system show`){}",
                        if mode == "shared" {
                            ": every namespace sees every RDMA device"
                        } else {
                            ": a device belongs to one namespace"
                        }
                    ),
                ),
                None => check(
                    "netns mode",
                    Mark::Info,
                    "`rdma system show` printed no mode",
                ),
            }
        }
        _ => check(
            "netns mode",
            Mark::Info,
            "no RDMA subsystem loaded on this host (`rdma system show`: no NETLINK_RDMA socket)",
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

impl RxeNetns {
    /// Probe this host (reads /proc/kallsyms or the module file: only where rxe exists).
    pub fn probe(kernel: &str, rxe: crate::caps::Feature) -> RxeNetns {
        if !rxe.usable() {
            return RxeNetns::Unknown("no rdma_rxe on this host".into());
        }
        let verdict = |has: bool, source: &str| {
            if has {
                RxeNetns::Yes(source.into())
            } else {
                RxeNetns::No(source.into())
            }
        };
        let loaded = std::path::Path::new("/sys/module/rdma_rxe").exists();
        if (loaded || rxe == crate::caps::Feature::Builtin)
            && let Ok(syms) = std::fs::read("/proc/kallsyms")
        {
            return verdict(has_per_netns_sockets(&syms), "the running kernel's symbols");
        }
        let dir = format!("/lib/modules/{kernel}");
        match find_file(std::path::Path::new(&dir), "rdma_rxe.ko") {
            Some(p) if p.extension().is_some_and(|e| e == "ko") => match std::fs::read(&p) {
                Ok(b) => verdict(has_per_netns_sockets(&b), "rdma_rxe.ko"),
                Err(e) => RxeNetns::Unknown(format!("{}: {e}", p.display())),
            },
            Some(p) => RxeNetns::Unknown(format!(
                "{} is compressed; load it (modprobe rdma_rxe) and ask again",
                p.display()
            )),
            None => RxeNetns::Unknown("no rdma_rxe module file found".into()),
        }
    }
}

/// The host kernel's rxe and namespaces, as the snapshot found it.
fn host_rxe_per_netns(caps: &HostCaps) -> Check {
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

fn find_file(dir: &std::path::Path, prefix: &str) -> Option<std::path::PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        // An unreadable folder is passed over; symlinks (build/, source/) are not followed.
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(e.path());
            } else if kind.is_file() && e.file_name().to_string_lossy().starts_with(prefix) {
                return Some(e.path());
            }
        }
    }
    None
}

/// Soft-RoCE on this host itself (the local backend's view; `doctor`).
pub fn softroce_on_host(caps: &HostCaps) -> Vec<Check> {
    vec![
        check(
            "rdma_rxe",
            if caps.rdma_rxe.usable() {
                Mark::Ok
            } else {
                Mark::Info
            },
            match caps.rdma_rxe {
                crate::caps::Feature::Builtin => "built into the kernel".to_string(),
                crate::caps::Feature::Module => "a loadable module".to_string(),
                _ => format!(
                    "not in this kernel ({}): not needed, the vm backend brings a kernel with it",
                    caps.kernel
                ),
            },
        ),
        host_rdma_system(caps),
        host_rxe_per_netns(caps),
        memlock_check(memlock_now(), "ulimit -l unlimited"),
    ]
}

/// Soft-RoCE in the vm backend's guest: which kernel, from where, and why; once the image
/// is built, whether its rxe really has per-namespace sockets.
pub fn softroce_in_vm() -> Vec<Check> {
    use crate::backend::vm::image;
    let mut v = Vec::new();
    match image::inputs() {
        Ok(i) => {
            v.push(check(
                "guest kernel",
                Mark::Ok,
                format!(
                    "{} {} from Debian {} (pinned; IBLAB_VM_KERNEL_PACKAGE and IBLAB_VM_KERNEL_SUITE change it): Linux ≥ {}.{} gives rxe a socket per network namespace, so one VM holds every node as a namespace{}",
                    i.kernel_package,
                    i.kernel_version,
                    i.kernel_suite,
                    image::MIN_KERNEL.0,
                    image::MIN_KERNEL.1,
                    if i.kernel_package == image::DEFAULT_KERNEL_PACKAGE {
                        "; a 7.2 kernel, not the newest: 7.3's rxe panicked the guest on lesson 3 and retried through lesson 5's lossless bottleneck"
                    } else {
                        ""
                    }
                ),
            ));
            v.push(check(
                "rdma_rxe",
                if i.modules.iter().any(|m| m == "rdma_rxe") {
                    Mark::Ok
                } else {
                    Mark::Fail
                },
                "a module of the guest kernel, loaded by the agent at boot".to_string(),
            ));
            if let Some(img) = image::cached(&i) {
                let module = std::fs::read(&img.base).map(|b| {
                    crate::backend::vm::cpio::find(&b, "/rdma_rxe.ko").map(has_per_netns_sockets)
                });
                let (mark, text) = match module {
                    Ok(None) => (Mark::Fail, "not known: the image holds no rdma_rxe.ko".to_string()),
                    Ok(Some(true)) => (
                        Mark::Ok,
                        "the guest kernel's rxe has per-namespace sockets: every node gets its own rxe in its namespace".to_string(),
                    ),
                    Ok(Some(false)) => (
                        Mark::Fail,
                        "the guest kernel's rxe has one socket, in the initial namespace: RDMA between the nodes' namespaces fails".to_string(),
                    ),
                    Err(e) => (Mark::Info, format!("not known: {e}")),
                };
                v.push(check("rxe per namespace", mark, text));
            }
        }
        Err(e) => v.push(check("guest kernel", Mark::Fail, format!("none: {e}"))),
    }
    v.push(check(
        "netns mode",
        Mark::Info,
        "shared in the guest (every namespace lists every node's rxe; each is bound to its own node's netdev); `rdma system show` is kept in the run's logs",
    ));
    v.push(check(
        "memlock",
        Mark::Ok,
        "unlimited in the guest (the agent raises it as init)",
    ));
    v
}

/// Soft-RoCE in containers: the host's RDMA devices passed through, the containers' limit.
pub fn softroce_in_docker(caps: &HostCaps) -> Vec<Check> {
    let devices = &caps.rdma_device_files;
    let memlock = crate::backend::docker::container::memlock();
    vec![
        check(
            "rdma devices",
            if devices.is_empty() {
                Mark::Fail
            } else {
                Mark::Ok
            },
            if devices.is_empty() {
                "none under /dev/infiniband: containers share the host's kernel, so roce needs rdma_rxe or an RDMA NIC on the host".to_string()
            } else {
                format!("passed through: {}", devices.join(", "))
            },
        ),
        host_rdma_system(caps),
        memlock_check(
            (memlock >= 0).then_some(memlock as u64),
            "run dockerd with CAP_SYS_RESOURCE",
        ),
    ]
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
