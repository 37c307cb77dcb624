//! This host, read: the snapshot planning works from (programs on PATH, kernel features
//! from its config and modules, root, RDMA ports and device files, whether its rxe has
//! a socket per namespace), and the Soft-RoCE preflight of this host itself. Read-only:
//! nothing is loaded or created to find out.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use iblab_core::caps::preflight::{
    Check, Mark, RxeNetns, check, has_per_netns_sockets, host_rxe_per_netns, memlock_check,
    parse_rdma_system,
};
use iblab_core::caps::{Feature, HostCaps, TOOLS};

/// A snapshot of this host: its programs, kernel features, root, RDMA ports and devices.
pub fn probe() -> HostCaps {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let config = KernelConfig::read(&kernel);
    let tools = TOOLS
        .iter()
        .map(|t| (t.program.to_string(), which(t.program)))
        .collect();
    let nft_egress = match (
        config.get("CONFIG_NETFILTER_EGRESS"),
        config.get("CONFIG_NF_TABLES_NETDEV"),
    ) {
        (Feature::Absent, _) | (_, Feature::Absent) => Feature::Absent,
        (Feature::Unknown, _) | (_, Feature::Unknown) => Feature::Unknown,
        (_, nd) => nd,
    };
    let rdma_rxe = config.feature("CONFIG_RDMA_RXE", "rdma_rxe");
    HostCaps {
        root: nix::unistd::geteuid().is_root(),
        tools,
        netns: Path::new("/proc/self/ns/net").exists(),
        veth: config.feature("CONFIG_VETH", "veth"),
        bridge: config.feature("CONFIG_BRIDGE", "bridge"),
        tbf: config.feature("CONFIG_NET_SCH_TBF", "sch_tbf"),
        netem: config.feature("CONFIG_NET_SCH_NETEM", "sch_netem"),
        nft_egress,
        rdma_rxe,
        rxe_netns: rxe_netns(&kernel, rdma_rxe),
        docker_socket: Some(docker_socket()).filter(|p| p.exists()),
        rdma_ports: rdma_ports(Path::new("/sys/class/infiniband")),
        rdma_device_files: rdma_devices(),
        preflight: BTreeMap::new(),
        kernel,
    }
}

/// The Docker engine's socket: `$DOCKER_HOST` when it names a unix socket, else the default.
pub fn docker_socket() -> PathBuf {
    match std::env::var("DOCKER_HOST") {
        Ok(h) if h.starts_with("unix://") => PathBuf::from(h.trim_start_matches("unix://")),
        _ => PathBuf::from("/var/run/docker.sock"),
    }
}

/// The device files under /dev/infiniband (what a container or pod would be given).
pub fn rdma_devices() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/dev/infiniband") else {
        return vec![];
    };
    let mut v: Vec<String> = entries
        .flatten()
        .map(|e| e.path().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Probe this host (reads /proc/kallsyms or the module file: only where rxe exists).
pub fn rxe_netns(kernel: &str, rxe: iblab_core::caps::Feature) -> RxeNetns {
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
    if (loaded || rxe == iblab_core::caps::Feature::Builtin)
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

/// Memory verbs may pin, in bytes (`None`: unlimited).
fn memlock_now() -> Option<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .unwrap_or((0, 0));
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

/// The host's RDMA subsystem mode, by running `rdma system show`.
pub fn host_rdma_system(caps: &HostCaps) -> Check {
    if !caps.has("rdma") {
        return check(
            "netns mode",
            Mark::Info,
            "not known: no `rdma` tool (apt-get install iproute2)",
        );
    }
    let out = crate::process::output_within(
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
                iblab_core::caps::Feature::Builtin => "built into the kernel".to_string(),
                iblab_core::caps::Feature::Module => "a loadable module".to_string(),
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

/// Every RDMA port in a sysfs tree shaped like /sys/class/infiniband, with its link layer.
pub fn rdma_ports(sysfs: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(devices) = std::fs::read_dir(sysfs) else {
        return out;
    };
    for d in devices.flatten() {
        let dev = d.file_name().to_string_lossy().into_owned();
        let Ok(ports) = std::fs::read_dir(d.path().join("ports")) else {
            continue;
        };
        for p in ports.flatten() {
            if let Ok(ll) = std::fs::read_to_string(p.path().join("link_layer")) {
                out.insert(
                    format!("{dev}:{}", p.file_name().to_string_lossy()),
                    ll.trim().to_string(),
                );
            }
        }
    }
    out
}

/// Find a program on PATH (and the sbin folders, which a non-login root shell may lack).
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"])
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The running kernel's build configuration and module list.
struct KernelConfig {
    options: Option<BTreeMap<String, String>>,
    modules: Option<String>,
}

impl KernelConfig {
    fn read(release: &str) -> KernelConfig {
        let text = read_gz("/proc/config.gz")
            .or_else(|| std::fs::read_to_string(format!("/boot/config-{release}")).ok());
        let options = text.map(|t| {
            t.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
        let modules = std::fs::read_to_string(format!("/lib/modules/{release}/modules.dep")).ok();
        KernelConfig { options, modules }
    }

    fn get(&self, option: &str) -> Feature {
        match &self.options {
            None => Feature::Unknown,
            Some(o) => match o.get(option).map(String::as_str) {
                Some("y") => Feature::Builtin,
                Some("m") => Feature::Module,
                _ => Feature::Absent,
            },
        }
    }

    fn feature(&self, option: &str, module: &str) -> Feature {
        let loaded = Path::new("/sys/module").join(module).exists();
        match self.get(option) {
            Feature::Builtin => Feature::Builtin,
            _ if loaded => Feature::Module,
            Feature::Module => match &self.modules {
                Some(dep) if dep.contains(&format!("/{module}.ko")) => Feature::Module,
                Some(_) => Feature::Absent,
                None => Feature::Unknown,
            },
            other => match (&self.modules, other) {
                (Some(dep), Feature::Unknown) if dep.contains(&format!("/{module}.ko")) => {
                    Feature::Module
                }
                _ => other,
            },
        }
    }
}

fn read_gz(path: &str) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut out = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut out)
        .ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysfs() -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("iblab-sysfs-{}", std::process::id()));
        for (dev, port, ll) in [
            ("mlx5_0", 1, "Ethernet"),
            ("mlx5_1", 1, "InfiniBand"),
            ("mlx5_1", 2, "InfiniBand"),
            ("rxe0", 1, "Ethernet"),
        ] {
            let d = root.join(dev).join("ports").join(port.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("link_layer"), format!("{ll}\n")).unwrap();
        }
        root
    }

    #[test]
    fn rdma_ports_are_read_from_sysfs() {
        let dir = sysfs();
        let ports = rdma_ports(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(ports.len(), 4);
        assert_eq!(ports["mlx5_1:2"], "InfiniBand");
        assert_eq!(ports["rxe0:1"], "Ethernet");
    }
}
