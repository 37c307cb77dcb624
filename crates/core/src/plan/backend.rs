//! Where a lab's nodes can live, as planning sees it: each backend's traits, whether it can
//! run here and which paths it carries (answered from a snapshot of the host), the names
//! of its verbs devices, where iblab is in its nodes, the programs it starts and who
//! provides them. The backends answer; planning asks, given the backends as a list.

use crate::caps::HostCaps;
use crate::plan::Plan;
use crate::programs::{Needs, Place, Provider};
use iblab_lab::PathKind;

/// What a kind of backend is like, for the parts of iblab that adapt to it.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Traits {
    /// Considered by `--backend auto`.
    pub auto: bool,
    /// Every node runs its own kernel (a guest): its own rxe, its own qdiscs.
    pub own_kernel: bool,
    /// Nodes have verbs devices of their own, so path ③'s admitted bytes ride them.
    pub verbs_in_nodes: bool,
    /// What a node's Ethernet interface is, in a stage diagram's words.
    pub nic: &'static str,
    /// How path ① travels here, for the provenance of its figures.
    pub tcp_carrier: &'static str,
    /// Seconds a traffic step's deadline gets here beyond the usual (its seconds + 20 s):
    /// where every command is a round trip through an API server to a node, a perftest
    /// measurement taken again after a failed clock calibration needs more than that.
    pub traffic_slack_s: u32,
}

/// Why a backend cannot run here, carry a path or take an adapter: a reason written for the
/// person who reads it (what is missing, and how to get it), which planning shows as it is
/// and never matches on. Its own type, so that no other text passes for one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unfit(pub String);

impl From<String> for Unfit {
    fn from(why: String) -> Unfit {
        Unfit(why)
    }
}

impl From<&str> for Unfit {
    fn from(why: &str) -> Unfit {
        Unfit(why.to_string())
    }
}

/// A backend for a lab's nodes, as planning sees it. The backends implement it (and more:
/// how to create, drive, undo and sweep their resources).
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// One line for `--help` and `doctor`.
    fn about(&self) -> &'static str;
    fn traits(&self) -> Traits;
    /// Can `--backend NAME` run here? `Ok` says how, `Err` why not and the fix.
    fn available(&self, caps: &HostCaps) -> Result<String, Unfit>;
    /// Can it carry this path here? `Err` says why not.
    fn carries(&self, path: PathKind, caps: &HostCaps) -> Result<(), Unfit>;
    /// Do its lab nodes have verbs devices of their own for a plan of these paths here
    /// (so that path ③'s admitted bytes ride them)? As its traits say, unless that depends
    /// on where it runs (a cluster whose nodes can give pods Soft-RoCE devices).
    fn verbs_in_nodes(&self, _paths: &[PathKind], _caps: &HostCaps) -> bool {
        self.traits().verbs_in_nodes
    }
    /// Where `--hca` finds a real adapter on this backend: `Ok(false)` on this host (resolved
    /// against its devices), `Ok(true)` in the lab's nodes (the backend gives each one, as a
    /// cluster's device plugin does), `Err` why this backend takes none.
    fn hca_in_nodes(&self) -> Result<bool, Unfit> {
        Ok(false)
    }
    /// Why it needs root, if it does.
    fn needs_root(&self) -> Option<&'static str> {
        None
    }
    /// Programs of this host it needs in order to run here at all that iblab can install
    /// (each one has a package in [`crate::caps::TOOLS`]): where none of the backends that run
    /// here carries every path of a lab, `auto` chooses one that would once they are
    /// installed, and `up` names them (and installs them with `--yes`) before anything is
    /// deployed.
    fn installable(&self) -> &'static [&'static str] {
        &[]
    }
    /// The programs this backend itself starts for a plan (its `ip`, qemu, a wrapper around
    /// the nodes' commands), added to the run's list ([`crate::programs`]).
    fn programs(&self, _plan: &Plan, _needs: &mut Needs) {}
    /// Who provides the programs run at `place`: this host, or an image of iblab's.
    fn provider(&self, _place: Place) -> Provider {
        Provider::Host
    }
    /// The `iblab` binary as a node sees it (`{{ iblab }}` in lab files).
    fn iblab_path(&self) -> String {
        std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "iblab".into())
    }
    /// How iblab itself reaches nodes that do not share this host's files, for a lab that
    /// runs it there (path ①'s ping-pong, `{{ iblab }}`); `None`: they share them.
    fn iblab_in_nodes(&self) -> Option<String> {
        None
    }
    /// The name of the Soft-RoCE device path ② makes on a node's `index`-th interface
    /// (`{{ nodes.NAME.rdma_devices }}` in lab files). RDMA device names are one namespace
    /// per kernel: where nodes share a kernel, they must differ between nodes, and where
    /// runs share one (pods of several runs on a cluster node), between runs: `run` is the
    /// run's id (`None` for a plan only).
    fn rdma_device(&self, _run: Option<&str>, _node: &str, index: usize) -> String {
        format!("rxe{index}")
    }
}

/// A Soft-RoCE device's name where several runs share one kernel (namespaces of this
/// host, containers, pods on a cluster node): RDMA device names are one namespace per
/// kernel, so the run's id goes into it (at most 63 characters, the kernel's limit: a long
/// node name is cut). A plan made for no run names the device without it.
pub fn shared_kernel_rdma_device(run: Option<&str>, node: &str, index: usize) -> String {
    match run {
        Some(r) => {
            let tail = format!("-rxe{index}-{r}");
            let keep = node
                .char_indices()
                .map(|(i, c)| i + c.len_utf8())
                .take_while(|end| *end + tail.len() <= 63)
                .last()
                .unwrap_or(0);
            format!("{}{tail}", &node[..keep])
        }
        None => format!("{node}-rxe{index}"),
    }
}

/// The backend with this name among `backends`.
pub fn find<'a>(backends: &[&'a dyn Backend], name: &str) -> Option<&'a dyn Backend> {
    backends.iter().copied().find(|k| k.name() == name)
}

pub enum ChooseError {
    Unknown(String),
    Unavailable(Unfit),
}

/// What `--backend` resolved to, and why.
pub struct Choice<'a> {
    pub backend: &'a dyn Backend,
    pub reason: String,
    /// Programs this host lacks that the choice assumes installed ([`Backend::installable`]):
    /// the plan is made as if they were, and `up` installs them (or names them) first.
    pub assumes: Vec<&'static str>,
}

impl<'a> Choice<'a> {
    fn of(backend: &'a dyn Backend, reason: String) -> Choice<'a> {
        Choice {
            backend,
            reason,
            assumes: vec![],
        }
    }
}

/// Names `--backend` accepts, with a line each, for help texts.
pub fn choices(backends: &[&dyn Backend]) -> Vec<(&'static str, &'static str)> {
    std::iter::once(("auto", "pick the best backend this host can run"))
        .chain(backends.iter().map(|k| (k.name(), k.about())))
        .collect()
}

/// Resolve `--backend` to one of `backends` (in the order `auto` considers them) for these
/// paths, with the reason for the choice.
pub fn choose<'a>(
    backends: &[&'a dyn Backend],
    requested: &str,
    paths: &[PathKind],
    caps: &HostCaps,
) -> Result<Choice<'a>, ChooseError> {
    if requested != "auto" && !requested.is_empty() {
        let Some(k) = find(backends, requested) else {
            return Err(ChooseError::Unknown(format!(
                "unknown backend `{requested}`; choose one of: {}",
                choices(backends)
                    .iter()
                    .map(|c| c.0)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        return k
            .available(caps)
            .map(|how| Choice::of(k, format!("requested with --backend {requested}{how}")))
            .map_err(ChooseError::Unavailable);
    }
    let names = paths
        .iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let usable: Vec<&dyn Backend> = backends
        .iter()
        .copied()
        .filter(|k| k.traits().auto && k.available(caps).is_ok())
        .collect();
    let mut refusals = Vec::new();
    for k in &usable {
        match paths.iter().try_for_each(|p| k.carries(*p, caps)) {
            Ok(()) if refusals.is_empty() => {
                return Ok(Choice::of(
                    *k,
                    format!(
                        "auto: this host carries paths {names} on the {} backend",
                        k.name()
                    ),
                ));
            }
            Ok(()) => {
                return Ok(Choice::of(
                    *k,
                    format!(
                        "auto: not on the {} ({}), so the {} backend",
                        refusals.join("; "),
                        k.about(),
                        k.name()
                    ),
                ));
            }
            Err(why) => refusals.push(format!("{} backend: {why}", k.name())),
        }
    }
    // None that runs here carries every path: the first that would once the programs it
    // lacks are installed (qemu for the vm backend), planned as if they were.
    for k in backends.iter().copied().filter(|k| k.traits().auto) {
        let lacking: Vec<&'static str> = k
            .installable()
            .iter()
            .copied()
            .filter(|p| !caps.has(p))
            .collect();
        if lacking.is_empty() {
            continue;
        }
        let then = caps.assuming(&lacking);
        if k.available(&then).is_ok() && paths.iter().all(|p| k.carries(*p, &then).is_ok()) {
            let packages: Vec<&str> = lacking
                .iter()
                .map(|p| crate::caps::package_of(p).unwrap_or(p))
                .collect();
            let why = match refusals.is_empty() {
                true => String::new(),
                false => format!("not on the {}; ", refusals.join("; ")),
            };
            return Ok(Choice {
                backend: k,
                reason: format!(
                    "auto: {why}the {} backend ({}), once {} is installed",
                    k.name(),
                    k.about(),
                    packages.join(" and ")
                ),
                assumes: lacking,
            });
        }
    }
    // None carries every path: the first usable one, and the planner names each missing
    // path with its fix and the --paths way out.
    match usable.first() {
        Some(k) => Ok(Choice::of(
            *k,
            format!(
                "auto: no backend carries every path here ({})",
                refusals.join("; ")
            ),
        )),
        None => Err(ChooseError::Unavailable(
            "auto: no backend can run here: the kernel has no network namespaces".into(),
        )),
    }
}

/// Can nodes that share this host's kernel, each in its own network namespace, each have
/// a Soft-RoCE device of their own? Only where the kernel's rxe has a socket per namespace
/// (Linux ≥ 7.1); `Err` says why not.
pub fn rxe_per_namespace(caps: &HostCaps, who: &str) -> Result<(), Unfit> {
    use crate::caps::preflight::RxeNetns;
    if !caps.rdma_rxe.usable() {
        return Err(format!(
            "{who} share the host's kernel, and it ({}) has no rdma_rxe (Soft-RoCE)",
            caps.kernel
        )
        .into());
    }
    match &caps.rxe_netns {
        RxeNetns::Yes(_) => Ok(()),
        RxeNetns::No(source) => Err(format!(
            "{who} share the host's kernel, whose rxe binds to the initial network namespace \
             only ({source}: no per-namespace sockets, which came with Linux 7.1), so they \
             cannot each have a device of their own; the vm backend brings a kernel that can"
        )
        .into()),
        RxeNetns::Unknown(why) => Err(format!(
            "whether the host kernel's rxe serves every network namespace is not known ({why})"
        )
        .into()),
    }
}

/// What a user can do to get a path.
pub fn fix_for(path: PathKind) -> &'static str {
    match path {
        PathKind::Tcp => "install iproute2 and iperf3",
        PathKind::Roce => {
            "install qemu-system-x86 so the vm backend can bring a kernel with rdma_rxe"
        }
        PathKind::Ib => "install ibsim-utils, opensm and infiniband-diags",
    }
}

/// Two backends shaped like the local and vm ones, answering from the snapshot alone:
/// for the tests of planning and judging, which must not depend on the real backends (nor
/// on this host).
#[doc(hidden)]
#[cfg_attr(not(test), allow(dead_code))]
pub mod testing {
    use super::*;

    /// Nodes as namespaces of this host's kernel.
    pub struct Namespaces;
    /// Nodes as namespaces of a guest kernel of their own (needs qemu).
    pub struct Guest;

    impl Backend for Namespaces {
        fn name(&self) -> &'static str {
            "local"
        }
        fn about(&self) -> &'static str {
            "network namespaces (a stand-in for tests)"
        }
        fn traits(&self) -> Traits {
            Traits {
                auto: true,
                own_kernel: false,
                verbs_in_nodes: false,
                nic: "veth",
                tcp_carrier: "veth links between namespaces",
                traffic_slack_s: 0,
            }
        }
        fn available(&self, caps: &HostCaps) -> Result<String, Unfit> {
            caps.netns
                .then(String::new)
                .ok_or_else(|| "no network namespaces".into())
        }
        fn carries(&self, path: PathKind, caps: &HostCaps) -> Result<(), Unfit> {
            match path {
                PathKind::Tcp | PathKind::Ib => Ok(()),
                PathKind::Roce => rxe_per_namespace(caps, "the nodes"),
            }
        }
        fn iblab_path(&self) -> String {
            "/usr/bin/iblab".into()
        }
        fn rdma_device(&self, _run: Option<&str>, node: &str, index: usize) -> String {
            format!("{node}-rxe{index}")
        }
    }

    impl Backend for Guest {
        fn name(&self) -> &'static str {
            "vm"
        }
        fn about(&self) -> &'static str {
            "a guest kernel (a stand-in for tests)"
        }
        fn traits(&self) -> Traits {
            Traits {
                auto: true,
                own_kernel: true,
                verbs_in_nodes: true,
                nic: "veth",
                tcp_carrier: "veth links in a guest",
                traffic_slack_s: 0,
            }
        }
        fn available(&self, caps: &HostCaps) -> Result<String, Unfit> {
            caps.has("qemu-system-x86_64")
                .then(String::new)
                .ok_or_else(|| "no qemu".into())
        }
        fn installable(&self) -> &'static [&'static str] {
            &["qemu-system-x86_64"]
        }
        fn carries(&self, path: PathKind, caps: &HostCaps) -> Result<(), Unfit> {
            let _ = path;
            self.available(caps).map(|_| ())
        }
        fn iblab_path(&self) -> String {
            "/init".into()
        }
    }

    /// Both, in the order `auto` considers them.
    pub fn backends() -> Vec<&'static dyn Backend> {
        vec![&Namespaces, &Guest]
    }
}
