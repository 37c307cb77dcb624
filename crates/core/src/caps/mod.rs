//! What this host offers: tools on PATH, kernel features, root. Read-only probing.

pub mod preflight;

use std::collections::BTreeMap;
use std::path::PathBuf;

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
        program: "tcpdump",
        package: "tcpdump",
        purpose: "what a verbs test's cable carried (its TCP exchange, its RoCEv2 packets)",
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
        program: "apt-get",
        package: "apt",
        purpose: "fetching the vm guest's Debian kernel (first use)",
    },
    Tool {
        program: "dpkg-deb",
        package: "dpkg",
        purpose: "unpacking the vm guest's kernel and programs (first use)",
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
        program: "ls",
        package: "coreutils",
        purpose: "which process holds a tool server's port",
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
        program: "ibv_devices",
        package: "ibverbs-utils",
        purpose: "listing verbs devices (the vm guest)",
    },
    Tool {
        program: "ibv_rc_pingpong",
        package: "ibverbs-utils",
        purpose: "a verbs ping-pong (the vm guest)",
    },
    Tool {
        program: "busybox",
        package: "busybox-static",
        purpose: "the vm guest's shell and small tools",
    },
    Tool {
        program: "xz",
        package: "xz-utils",
        purpose: "unpacking the vm guest kernel's modules (first use)",
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

/// Packages whose programs are of no use without a package they only recommend: the verbs
/// tools without the user-space drivers (rxe's among them). iblab installs without
/// recommendations (a headless lab needs no qemu GUI), so it names these itself.
const COMPANIONS: &[(&str, &str)] = &[
    ("perftest", "ibverbs-providers"),
    ("ibverbs-utils", "ibverbs-providers"),
    ("rdmacm-utils", "ibverbs-providers"),
];

/// `packages` with the companions they need ([`COMPANIONS`]), sorted, each once.
pub fn with_companions<'a>(packages: &[&'a str]) -> Vec<&'a str> {
    let mut out: Vec<&str> = packages.to_vec();
    for (pkg, companion) in COMPANIONS {
        if packages.contains(pkg) {
            out.push(companion);
        }
    }
    out.sort();
    out.dedup();
    out
}

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
    pub rxe_netns: crate::caps::preflight::RxeNetns,
    pub docker_socket: Option<PathBuf>,
    /// RDMA ports under /sys/class/infiniband: `device:port` → link layer.
    pub rdma_ports: BTreeMap<String, String>,
    /// Device files under /dev/infiniband (what a container or pod would be given).
    pub rdma_device_files: Vec<String>,
    /// Soft-RoCE preflight per backend, taken by `backend::with_preflight` for the
    /// backends a plan may choose (so that planning itself reads nothing).
    pub preflight: BTreeMap<String, Vec<crate::caps::preflight::Check>>,
}

impl HostCaps {
    /// A host with nothing on it, for tests to fill in.
    #[cfg_attr(not(test), allow(dead_code))]
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
            rxe_netns: crate::caps::preflight::RxeNetns::Unknown("no rdma_rxe on this host".into()),
            docker_socket: None,
            rdma_ports: BTreeMap::new(),
            rdma_device_files: vec![],
            preflight: BTreeMap::new(),
        }
    }

    pub fn has(&self, program: &str) -> bool {
        self.tools.get(program).is_some_and(Option::is_some)
    }

    /// This host as it would be with `programs` installed (at a path named after each):
    /// for planning a backend that `--yes` makes runnable, never for running it.
    pub fn assuming(&self, programs: &[&str]) -> HostCaps {
        let mut c = self.clone();
        for p in programs {
            if !c.has(p) {
                c.tools.insert(p.to_string(), Some(PathBuf::from(p)));
            }
        }
        c
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
