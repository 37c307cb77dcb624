//! What this host offers: tools on PATH, kernel features, root. Read-only probing.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::fault::LossMechanism;

/// A kernel feature: built in, a loadable module, absent, or not knowable here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Feature {
    Builtin,
    Module,
    Absent,
    Unknown,
}

impl Feature {
    pub fn usable(self) -> bool {
        matches!(self, Feature::Builtin | Feature::Module)
    }
}

/// A program iblab drives and the Debian/Ubuntu package that brings it.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    pub program: &'static str,
    pub package: &'static str,
    pub purpose: &'static str,
}

pub const TOOLS: &[Tool] = &[
    Tool {
        program: "ip",
        package: "iproute2",
        purpose: "namespaces, veth, bridges, addresses",
    },
    Tool {
        program: "tc",
        package: "iproute2",
        purpose: "rate limits (tbf), netem loss",
    },
    Tool {
        program: "nft",
        package: "nftables",
        purpose: "random loss where the kernel has no netem",
    },
    Tool {
        program: "iperf3",
        package: "iperf3",
        purpose: "TCP throughput on path tcp",
    },
    Tool {
        program: "ping",
        package: "iputils-ping",
        purpose: "reachability probes",
    },
    Tool {
        program: "rdma",
        package: "iproute2",
        purpose: "creating rxe devices (Soft-RoCE)",
    },
    Tool {
        program: "ib_write_bw",
        package: "perftest",
        purpose: "verbs bandwidth/latency on roce and ib",
    },
    Tool {
        program: "rping",
        package: "rdmacm-utils",
        purpose: "RDMA CM connection test",
    },
    Tool {
        program: "ibv_devinfo",
        package: "ibverbs-utils",
        purpose: "verbs device inventory",
    },
    Tool {
        program: "ibsim",
        package: "ibsim-utils",
        purpose: "emulated InfiniBand fabric",
    },
    Tool {
        program: "opensm",
        package: "opensm",
        purpose: "the subnet manager",
    },
    Tool {
        program: "smpquery",
        package: "infiniband-diags",
        purpose: "IB port, LID and LFT probes",
    },
    Tool {
        program: "ibtracert",
        package: "infiniband-diags",
        purpose: "IB path traces",
    },
    Tool {
        program: "ibroute",
        package: "infiniband-diags",
        purpose: "IB switch forwarding tables",
    },
    Tool {
        program: "sminfo",
        package: "infiniband-diags",
        purpose: "the master subnet manager, as a node sees it",
    },
    Tool {
        program: "saquery",
        package: "infiniband-diags",
        purpose: "whether the subnet administrator answers",
    },
    Tool {
        program: "ibnetdiscover",
        package: "infiniband-diags",
        purpose: "the nodes an IB fabric holds",
    },
    Tool {
        program: "ibstat",
        package: "infiniband-diags",
        purpose: "an IB HCA's ports",
    },
    Tool {
        program: "bridge",
        package: "iproute2",
        purpose: "what a Linux bridge learned (fdb)",
    },
    Tool {
        program: "ib_read_bw",
        package: "perftest",
        purpose: "verbs bandwidth (RDMA READ)",
    },
    Tool {
        program: "ib_send_bw",
        package: "perftest",
        purpose: "verbs bandwidth (SEND)",
    },
    Tool {
        program: "ib_write_lat",
        package: "perftest",
        purpose: "verbs latency (RDMA WRITE)",
    },
    Tool {
        program: "ib_read_lat",
        package: "perftest",
        purpose: "verbs latency (RDMA READ)",
    },
    Tool {
        program: "ib_send_lat",
        package: "perftest",
        purpose: "verbs latency (SEND)",
    },
    Tool {
        program: "sh",
        package: "dash",
        purpose: "small scripts in the nodes",
    },
    Tool {
        program: "cat",
        package: "coreutils",
        purpose: "reading files in the nodes",
    },
    Tool {
        program: "grep",
        package: "grep",
        purpose: "reading rxe's counters",
    },
    Tool {
        program: "timeout",
        package: "coreutils",
        purpose: "deadlines for commands in pods",
    },
    Tool {
        program: "mkdir",
        package: "coreutils",
        purpose: "folders in the nodes",
    },
    Tool {
        program: "mkfifo",
        package: "coreutils",
        purpose: "the subnet's console and the pod sampler",
    },
    Tool {
        program: "mktemp",
        package: "coreutils",
        purpose: "the pod sampler's folder",
    },
    Tool {
        program: "sleep",
        package: "coreutils",
        purpose: "the pod sampler's pace; a container's idle process",
    },
    Tool {
        program: "rm",
        package: "coreutils",
        purpose: "the pod sampler's clean-up",
    },
    Tool {
        program: "env",
        package: "coreutils",
        purpose: "the subnet's tools with their environment",
    },
    Tool {
        program: "getconf",
        package: "libc-bin",
        purpose: "the clock tick, for the pod sampler",
    },
    Tool {
        program: "qemu-system-x86_64",
        package: "qemu-system-x86",
        purpose: "the vm backend",
    },
    Tool {
        program: "dockerd",
        package: "docker.io",
        purpose: "the docker backend's engine",
    },
    Tool {
        program: "debootstrap",
        package: "debootstrap",
        purpose: "building the docker backend's lab image",
    },
];

/// The package that brings a program, if iblab knows it.
pub fn package_of(program: &str) -> Option<&'static str> {
    TOOLS
        .iter()
        .find(|t| t.program == program)
        .map(|t| t.package)
}

/// The host, as far as iblab needs to know it.
#[derive(Debug, Clone, Serialize)]
pub struct HostCaps {
    pub root: bool,
    pub kernel: String,
    pub tools: BTreeMap<String, Option<PathBuf>>,
    pub netns: bool,
    pub veth: Feature,
    pub bridge: Feature,
    pub tbf: Feature,
    pub netem: Feature,
    pub nft_egress: Feature,
    pub rdma_rxe: Feature,
    /// Whether that rxe has a socket per network namespace (Linux ≥ 7.1).
    pub rxe_netns: crate::preflight::RxeNetns,
    pub docker_socket: Option<PathBuf>,
    /// RDMA ports under /sys/class/infiniband: `device:port` → link layer.
    pub rdma_ports: BTreeMap<String, String>,
    /// Device files under /dev/infiniband (what a container or pod would be given).
    pub rdma_device_files: Vec<String>,
    /// Soft-RoCE preflight per backend, taken by [`HostCaps::with_preflight`] for the
    /// backends a plan may choose (so that planning itself reads nothing).
    pub preflight: BTreeMap<String, Vec<crate::preflight::Check>>,
}

impl HostCaps {
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
            rxe_netns: crate::preflight::RxeNetns::probe(&kernel, rdma_rxe),
            docker_socket: Some(crate::backend::docker::engine::socket_path())
                .filter(|p| p.exists()),
            rdma_ports: rdma_ports(Path::new("/sys/class/infiniband")),
            rdma_device_files: crate::backend::docker::container::rdma_devices(),
            preflight: BTreeMap::new(),
            kernel,
        }
    }

    /// Add the Soft-RoCE preflight of the backends `requested` may resolve to (`auto`:
    /// every kind auto considers). Read-only, but it runs `rdma system show` and looks at
    /// kernel modules: done once, before planning.
    pub fn with_preflight(mut self, requested: &str) -> HostCaps {
        for k in crate::backend::KINDS {
            let wanted = if requested == "auto" || requested.is_empty() {
                k.traits().auto
            } else {
                k.name() == requested
            };
            if wanted {
                let checks = k.preflight(&self);
                self.preflight.insert(k.name().to_string(), checks);
            }
        }
        self
    }

    /// A host with nothing on it, for tests to fill in.
    #[cfg(test)]
    pub fn for_tests() -> HostCaps {
        HostCaps {
            root: true,
            kernel: "6.18.0-test".into(),
            tools: BTreeMap::new(),
            netns: true,
            veth: Feature::Builtin,
            bridge: Feature::Builtin,
            tbf: Feature::Builtin,
            netem: Feature::Absent,
            nft_egress: Feature::Builtin,
            rdma_rxe: Feature::Absent,
            rxe_netns: crate::preflight::RxeNetns::Unknown("no rdma_rxe on this host".into()),
            docker_socket: None,
            rdma_ports: BTreeMap::new(),
            rdma_device_files: vec![],
            preflight: BTreeMap::new(),
        }
    }

    pub fn has(&self, program: &str) -> bool {
        self.tools.get(program).is_some_and(Option::is_some)
    }

    /// How loss faults are made here: netem where the kernel has it, else nftables.
    pub fn loss_mechanism(&self) -> LossMechanism {
        if self.netem.usable() {
            LossMechanism::Netem
        } else {
            LossMechanism::NftRandomDrop
        }
    }
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
