//! Where iblab's images and iblab itself are, by name: the lab image and the operator's
//! (overridable by the environment), what the lab image holds, and the folder that carries
//! iblab into a node.

/// The image labs run in: `$IBLAB_IMAGE`, else `iblab/lab:<iblab version>`.
pub fn lab() -> String {
    std::env::var("IBLAB_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("iblab/lab:{}", env!("CARGO_PKG_VERSION")))
}

/// The lab image's packages (debootstrap's recipe): the tools every fabric needs.
pub const LAB_PACKAGES: &[&str] = &[
    "iproute2",
    "iperf3",
    "iputils-ping",
    "nftables",
    "rdma-core",
    "ibverbs-utils",
    "perftest",
    "rdmacm-utils",
    "opensm",
    "infiniband-diags",
    "ibsim-utils",
    "tcpdump",
];

/// Packages of priority `required` that `debootstrap --variant=minbase` always installs
/// and whose programs iblab starts in the nodes (a shell, coreutils, grep, getconf).
pub const LAB_MINBASE: &[&str] = &["dash", "coreutils", "grep", "libc-bin"];

/// Who provides the programs of a run's nodes where they run from the lab image (the docker
/// and kube backends).
pub const LAB_PROVIDER: crate::programs::Provider = crate::programs::Provider::Image {
    what: "the lab image",
    has: lab_carries,
};

/// Does the lab image (the complete one, debootstrap's) carry `program`? Yes when the
/// package that brings it is one of the recipe's, or one every minbase system has.
pub fn lab_carries(program: &str) -> bool {
    crate::caps::package_of(program)
        .is_some_and(|pkg| LAB_PACKAGES.contains(&pkg) || LAB_MINBASE.contains(&pkg))
}

/// The operator image: `$IBLAB_OPERATOR_IMAGE`, else `iblab/operator:<iblab version>`.
pub fn operator() -> String {
    std::env::var("IBLAB_OPERATOR_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("iblab/operator:{}", env!("CARGO_PKG_VERSION")))
}

/// Where the folder that carries iblab is in a node (a read-only bind mount, or a pod's
/// volume).
pub const IN_NODE: &str = "/opt/iblab";

/// The command that runs iblab in a node.
pub fn in_node_exe() -> String {
    format!("{IN_NODE}/iblab")
}

/// The user the operator runs as (the chart's `runAsUser`).
pub const OPERATOR_UID: u32 = 65532;
