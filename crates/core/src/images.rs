//! Where iblab's images and iblab itself are, by name: the lab image and the operator's
//! (overridable by the environment), and the folder that carries iblab into a node.

/// The image labs run in: `$IBLAB_IMAGE`, else `iblab/lab:<iblab version>`.
pub fn lab() -> String {
    std::env::var("IBLAB_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("iblab/lab:{}", env!("CARGO_PKG_VERSION")))
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
