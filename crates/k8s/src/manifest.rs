//! The objects a run applies, built from k8s-openapi types and nothing else: pure, so
//! `iblab render` writes exactly what `up --backend kube` applies, and golden files pin it.
//!
//! A run is one anchor ConfigMap (`iblab-<run>`: the lab, the plan of its links) that
//! owns every pod, so one deletion collects the run even in a namespace iblab did not
//! make; with no `--namespace`, the run also has a namespace of its own, and deleting that
//! removes everything.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, EmptyDirVolumeSource, Namespace, Pod, PodSecurityContext,
    PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Sysctl, Toleration, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::links;
use crate::settings::Settings;
use iblab_core::plan::{Plan, PlannedNode};
use iblab_node_agent::spec::{ANNOTATION, RoceSpec, RxeSpec};

/// Labels every object of a run carries.
pub mod label {
    pub const RUN: &str = "iblab.dev/run";
    /// Who started the run (a machine and its state folder, hashed): what `down --all`
    /// sweeps on a shared cluster.
    pub const OWNER: &str = "iblab.dev/owner";
    pub const LAB: &str = "iblab.dev/lab";
    pub const NODE: &str = "iblab.dev/node";
    pub const ROLE: &str = "iblab.dev/role";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// On a cluster node: its kernel gives rxe a socket per network namespace (Linux ≥
    /// 7.1) and rdma_rxe is loaded, so each pod there can have a Soft-RoCE device of its
    /// own (`true`). Set from what the node has (`kube/cluster vm-node` does; a platform
    /// team labels its nodes the same way); path ②'s pods are placed by it, and tolerate a
    /// taint of the same key (a team may keep other workloads off such nodes with it).
    pub const RXE_PER_NETNS: &str = "iblab.dev/rxe-per-netns";
}

/// The run id `iblab render` writes (a real run's is random).
pub const RENDER_RUN: &str = "render";

/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "iblab";
/// The container of a lab pod where iblab wires, injects faults and measures: root, with
/// [`CAPABILITIES`], the tools from the image's read-only root, its own `/tmp`.
pub const CONTAINER: &str = "node";
/// The container a visitor of a lab pod enters (`kubectl exec` without `-c` lands there,
/// and it is the only one a class's students may enter): the same image as an unprivileged
/// user with no capability at all and a `/tmp` of its own, in the pod's network namespace.
/// From it one can look (`ip`, `ss`, `rdma`, the counters in `/sys`, `ping`) and send
/// traffic over the lab's links, but neither change the network's configuration nor reach
/// a tool iblab runs, its output, its binary or its files: they are in [`CONTAINER`], whose
/// processes, filesystem and `/tmp` this one does not share.
pub const SHELL: &str = "shell";
/// The shell's user and group: `nobody`.
pub const SHELL_UID: i64 = 65534;
/// The shell's own `/tmp` (its root filesystem is read-only too).
pub const SHELL_TMP_VOLUME: &str = "shell-tmp";
pub const SHELL_TMP_LIMIT: &str = "64Mi";
/// What the shell asks for and may use: it idles, and what a visitor runs there is theirs.
pub const SHELL_CPU_REQUEST: &str = "10m";
pub const SHELL_MEMORY_REQUEST: &str = "16Mi";
pub const SHELL_CPU_LIMIT: &str = "1";
pub const SHELL_MEMORY_LIMIT: &str = "128Mi";
/// The annotation that makes `kubectl exec`, `logs` and `attach` pick a container when
/// none is named.
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// Who may open an ICMP echo socket without NET_RAW in a lab pod's network namespace: the
/// shell's group alone (the measuring container's root keeps its raw socket).
pub const PING_GROUP_RANGE: &str = "65534 65534";
/// The init container that brings iblab into a lab pod, and the volume it fills.
pub const IBLAB_INIT: &str = "iblab";

/// What a lab pod's container runs while it is up: nothing, until iblab execs in it.
pub const IDLE: &str = "sleep";

/// The only capabilities a lab node's or switch's container has: every one of the
/// runtime's defaults is dropped (a student who enters the pod cannot chown, mknod, setuid
/// or kill past them), and these added back: NET_ADMIN for the VXLAN links, bridges,
/// addresses, tc and nftables inside the pod, NET_RAW for ping, NET_BIND_SERVICE for the
/// tools' servers and the VXLAN sockets, on ports below [`UNPRIVILEGED_PORT_START`].
pub const CAPABILITIES: &[&str] = &["NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE"];
/// Every port below this one needs NET_BIND_SERVICE in a lab pod's network namespace
/// (`net.ipv4.ip_unprivileged_port_start`, a namespaced sysctl Kubernetes counts as safe;
/// the kernel takes no value above the ephemeral range's start, 32768 by default): the
/// ports of iblab's servers (iperf3 5201, the ping-pong 5301, perftest's exchange 18515)
/// and VXLAN's 4789 are the measuring container's alone, and the shell (user nobody, no
/// capability), which shares the pod's network, cannot take one first and answer for a
/// tool (docs/kube.md).
pub const UNPRIVILEGED_PORT_START: &str = "32768";
/// What verbs need on a real adapter: pinning registered memory.
pub const HCA_CAPABILITIES: &[&str] = &["IPC_LOCK"];

/// What every lab pod asks for, so a class's ResourceQuota on cpu and memory admits it:
/// requests (what an idle node with its tools needs) and limits (two cores, though a step's
/// tools are single-threaded: at a one-core limit CFS bandwidth control throttles a single
/// busy thread now and then, measured on the VM node as 2 stops of ~48 ms in 10 s, and a
/// stop inside perftest's clock calibration fails it, r^2 < 0.9; memory for iperf3's and
/// perftest's buffers, ibsim and opensm in the subnet's pod). Stated in docs/kube.md.
pub const CPU_REQUEST: &str = "50m";
pub const MEMORY_REQUEST: &str = "64Mi";
pub const CPU_LIMIT: &str = "2";
pub const MEMORY_LIMIT: &str = "512Mi";
/// The volume iblab's bundle is written to (the binary and its libraries, ~150 MB for a
/// debug build): the kubelet evicts a pod that writes past it.
pub const IBLAB_VOLUME_LIMIT: &str = "512Mi";
/// A lab pod's root filesystem is read-only (a student who enters the pod cannot replace
/// `iperf3`, `ib_write_bw` or `timeout`, which iblab runs by their image paths); the only
/// place it writes is this emptyDir on `/tmp`: perftest's JSON, the sampler's fifos,
/// ibsim's and opensm's files in the subnet's pod, iperf3's scratch file.
pub const WORK_VOLUME: &str = "tmp";
pub const WORK_MOUNT: &str = "/tmp";
/// Its size limit: the kubelet evicts a pod that writes past it (a flooding tool cannot
/// fill the node's disk).
pub const WORK_VOLUME_LIMIT: &str = "256Mi";

/// Path ② in pods (Soft-RoCE, a device per pod): how each pod gets its device without
/// privilege. The node makes it: the pod runs under the RuntimeClass of the node agent's
/// wrapper around runc ([`Settings::runtime_class`]), which, before the pod's measuring
/// container is created, makes the pod's lab links (VXLAN, no peer yet) and its rxe
/// devices in the pod's network namespace, as the [`iblab_node_agent::spec::ANNOTATION`]
/// annotation asks, and adds exactly those devices' verbs files and `rdma_cm` to the
/// container (measured against the other ways in docs/kube.md). The container stays
/// unprivileged, with IPC_LOCK added for the memory verbs pin.
pub const ROCE_DEVICES_WHY: &str = "path ②'s lab pods are unprivileged: the node agent \
     (RuntimeClass iblab-rxe, a wrapper around runc) makes each pod's links and rxe devices \
     in the pod's network namespace before its container starts, and gives that container \
     exactly those devices' verbs files and rdma_cm; IPC_LOCK is added for the memory verbs \
     pin. The cost: the node must run the agent (docs/kube.md), and a shared node's kernel \
     does every pod's RoCE transport work";

/// A lab pod's requests and limits, with one device of `hca` where the node has one.
fn resources(hca: Option<&String>) -> ResourceRequirements {
    let mut r = limits((CPU_REQUEST, MEMORY_REQUEST), (CPU_LIMIT, MEMORY_LIMIT));
    if let Some(res) = hca {
        for m in [r.requests.as_mut(), r.limits.as_mut()]
            .into_iter()
            .flatten()
        {
            m.insert(res.clone(), Quantity("1".into()));
        }
    }
    r
}

/// The namespace a run's objects go to, and whether the run owns it.
pub fn namespace_of(run_id: &str, settings: &Settings) -> (String, bool) {
    match &settings.namespace {
        Some(ns) => (ns.clone(), false),
        None => (format!("{}{run_id}", iblab_sys::state::PREFIX), true),
    }
}

/// The anchor object's name (a ConfigMap), which owns the run's pods.
pub fn anchor_name(run_id: &str) -> String {
    format!("{}{run_id}", iblab_sys::state::PREFIX)
}

fn labels(run_id: &str, lab: &str, owner: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (label::RUN.into(), run_id.into()),
        (label::OWNER.into(), owner.into()),
        (label::LAB.into(), lab.into()),
        (label::MANAGED_BY.into(), "iblab".into()),
    ])
}

/// The PodSecurity level a lab namespace needs, and why (stated on the namespace).
pub const POD_SECURITY: &str = "privileged";
pub const POD_SECURITY_WHY: &str = "lab pods add NET_ADMIN (VXLAN links, bridges, tc faults \
                                    inside the pod) and NET_RAW (ping), which the baseline \
                                    and restricted levels forbid; they are not privileged \
                                    containers";

/// The run's own namespace, at the PodSecurity level its pods need (stated on it): on a
/// cluster that enforces `baseline` by default its lab pods would be refused.
pub fn namespace(run_id: &str, plan: &Plan, name: &str, settings: &Settings) -> Namespace {
    lab_namespace(name, labels(run_id, &plan.lab, &settings.owner))
}

/// The annotation that says why a lab namespace is at its PodSecurity level.
pub const POD_SECURITY_WHY_KEY: &str = "iblab.dev/pod-security-why";

/// A namespace lab pods can run in: its labels plus the PodSecurity level they need, with
/// the reason as an annotation.
pub fn lab_namespace(name: &str, mut labels: BTreeMap<String, String>) -> Namespace {
    for mode in ["enforce", "audit", "warn"] {
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}"),
            POD_SECURITY.into(),
        );
    }
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                POD_SECURITY_WHY_KEY.into(),
                POD_SECURITY_WHY.into(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The anchor: what the run is, readable with kubectl, and the owner of its pods.
/// `first_vni` is the run's first VXLAN id (drawn at random by each run).
pub fn anchor(
    run_id: &str,
    plan: &Plan,
    ns: &str,
    settings: &Settings,
    first_vni: u32,
) -> ConfigMap {
    let links: Vec<String> = plan
        .nodes
        .iter()
        .flat_map(|n| {
            links::vxlan_lines(plan, n, first_vni, |peer| format!("<pod IP of {peer}>"))
                .into_iter()
                .map(move |l| format!("{}: {l}", n.name))
        })
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(anchor_name(run_id)),
            namespace: Some(ns.into()),
            labels: Some(labels(run_id, &plan.lab, &settings.owner)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("lab".into(), plan.lab.clone()),
            ("scenario".into(), plan.scenario.clone()),
            (
                "paths".into(),
                plan.paths
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("links".into(), links.join("\n") + "\n"),
        ])),
        ..Default::default()
    }
}

/// The reference that makes the run's anchor (uid `uid`) own an object: deleting the
/// anchor collects it.
fn owned_by_anchor(run_id: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: anchor_name(run_id),
        uid: uid.into(),
        block_owner_deletion: Some(true),
        controller: Some(true),
    }
}

/// The run's pods exchange traffic only with one another, both ways: their VXLAN links are
/// UDP between pod IPs, and without this any pod of the cluster (another student's) could
/// send frames into the lab, and a student in a lab pod could reach every pod of the
/// cluster and beyond it. Enforced by the cluster's network plugin where it implements
/// NetworkPolicy (Calico, Cilium, kube-router as on the project's test cluster, …); a
/// plain bridge plugin alone accepts the object and enforces nothing. Named like the
/// anchor, which owns it.
pub fn network_policy(
    run_id: &str,
    plan: &Plan,
    ns: &str,
    settings: &Settings,
    owner_uid: Option<&str>,
) -> NetworkPolicy {
    let the_run = || LabelSelector {
        match_labels: Some(BTreeMap::from([(label::RUN.into(), run_id.into())])),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(anchor_name(run_id)),
            namespace: Some(ns.into()),
            labels: Some(labels(run_id, &plan.lab, &settings.owner)),
            owner_references: owner_uid.map(|uid| vec![owned_by_anchor(run_id, uid)]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(the_run()),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(the_run()),
                    ..Default::default()
                }]),
                ..Default::default()
            }]),
            // Out only to the run's own pods (the links' VXLAN, the emulated subnet): no
            // other pod, no DNS service, nothing beyond the cluster (a pod's traffic to its
            // own node is the plugin's business: kube-router lets it through).
            egress: Some(vec![NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(the_run()),
                    ..Default::default()
                }]),
                ..Default::default()
            }]),
        }),
    }
}

/// The pod path ③'s emulated subnet (ibsim, opensm, the diagnostics) runs in: longer
/// than any lab node's name may be, so it never collides with one.
pub const SUBNET_POD: &str = "iblab-ib-subnet";

/// One node or switch as a pod of the lab image. `owner_uid` is the anchor's uid once it
/// exists (rendering without a cluster leaves the reference out).
pub fn pod(
    run_id: &str,
    plan: &Plan,
    n: &PlannedNode,
    ns: &str,
    settings: &Settings,
    owner_uid: Option<&str>,
    first_vni: u32,
) -> Pod {
    let hca = settings.rdma_resource.as_ref().filter(|_| !n.switch);
    let mut caps: Vec<String> = CAPABILITIES.iter().map(|c| c.to_string()).collect();
    if hca.is_some() {
        caps.extend(HCA_CAPABILITIES.iter().map(|c| c.to_string()));
    }
    let resources = resources(hca);
    let role = if n.switch { "switch" } else { "node" };
    let mut pod = lab_pod(
        run_id, plan, &n.name, role, ns, settings, owner_uid, caps, resources,
    );
    if !n.switch && plan.runs_iblab_in_nodes(&iblab_core::images::in_node_exe()) {
        bring_iblab(&mut pod, settings);
    }
    if !n.switch && soft_roce(plan, settings) {
        roce_in_pod(&mut pod, plan, n, first_vni, settings);
    }
    if hca.is_some()
        && let Some(spec) = pod.spec.as_mut()
    {
        // The scheduler puts it where the resource is; a node that also has rxe per
        // namespace keeps other workloads off with a taint, which a lab pod may cross.
        tolerate_rxe(spec);
    }
    if let Some(on) = settings.placement.get(&n.name) {
        place(&mut pod, on);
    }
    pod
}

/// A pod pinned to a cluster node (`--place`): by its hostname label, through the
/// scheduler (so the node's resources still count), tolerating the taint that keeps other
/// workloads off nodes with rxe per namespace (pinning is asking for that node).
fn place(pod: &mut Pod, on: &str) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.node_selector
        .get_or_insert_with(BTreeMap::new)
        .insert(HOSTNAME_LABEL.into(), on.into());
    tolerate_rxe(spec);
}

/// Tolerate the taint of nodes with rxe per namespace (once).
fn tolerate_rxe(spec: &mut k8s_openapi::api::core::v1::PodSpec) {
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations
        .iter()
        .any(|t| t.key.as_deref() == Some(label::RXE_PER_NETNS))
    {
        tolerations.push(rxe_toleration());
    }
}

/// The label every node carries with its own name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

fn rxe_toleration() -> Toleration {
    Toleration {
        key: Some(label::RXE_PER_NETNS.into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }
}

/// Do this run's lab pods make Soft-RoCE devices of their own: path ② (not on an adapter a
/// device plugin gives), or path ③'s bytes, where the cluster can give pods rxe devices?
pub fn soft_roce(plan: &Plan, settings: &Settings) -> bool {
    plan.backend_traits.verbs_in_nodes && settings.rdma_resource.is_none() && plan.hca.is_none()
}

/// What a path ② pod asks its node for: its links (without peers) and an rxe device on
/// each addressed interface, named as the plan names them.
pub fn roce_spec(plan: &Plan, n: &PlannedNode, first_vni: u32) -> RoceSpec {
    let links = links::link_specs(plan, n, first_vni);
    let devices = plan
        .backend_facts
        .rdma_devices
        .get(&n.name)
        .cloned()
        .unwrap_or_default();
    let rxe = n
        .interfaces
        .iter()
        .filter(|i| i.address.is_some())
        .zip(devices)
        .map(|(i, device)| RxeSpec {
            device,
            netdev: i.name.clone(),
        })
        .collect();
    RoceSpec {
        underlay: links::POD_INTERFACE.into(),
        rename_underlay_to: (links::underlay(n) != links::POD_INTERFACE)
            .then(|| links::underlay(n).to_string()),
        links,
        rxe,
    }
}

/// A lab node's pod on path ②: on a node whose rxe has a socket per namespace (by its
/// label, tolerating a taint of that key), under the node agent's RuntimeClass, asking for
/// its links and devices (see [`ROCE_DEVICES_WHY`]); unprivileged, IPC_LOCK added.
fn roce_in_pod(pod: &mut Pod, plan: &Plan, n: &PlannedNode, first_vni: u32, settings: &Settings) {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION.into(), roce_spec(plan, n, first_vni).to_text());
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.node_selector = Some(BTreeMap::from([(
        label::RXE_PER_NETNS.to_string(),
        "true".to_string(),
    )]));
    spec.tolerations = Some(vec![rxe_toleration()]);
    spec.runtime_class_name = Some(settings.runtime_class.clone());
    for c in spec.containers.iter_mut().filter(|c| c.name == CONTAINER) {
        if let Some(caps) = c
            .security_context
            .as_mut()
            .and_then(|sc| sc.capabilities.as_mut())
        {
            let add = caps.add.get_or_insert_with(Vec::new);
            for cap in HCA_CAPABILITIES {
                if !add.iter().any(|a| a == cap) {
                    add.push(cap.to_string());
                }
            }
        }
    }
}

/// A lab whose steps run iblab in its nodes: an init container of the iblab image writes
/// the binary with its libraries (`iblab bundle`) into a volume the lab container mounts
/// read-only at [`iblab_core::images::IN_NODE`]; it runs as the image's non-root user with no
/// capability.
fn bring_iblab(pod: &mut Pod, settings: &Settings) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let mount = |read_only: bool| VolumeMount {
        name: IBLAB_INIT.into(),
        mount_path: iblab_core::images::IN_NODE.into(),
        read_only: Some(read_only),
        ..Default::default()
    };
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: IBLAB_INIT.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(IBLAB_VOLUME_LIMIT.into())),
            ..Default::default()
        }),
        ..Default::default()
    });
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .push(Container {
            name: IBLAB_INIT.into(),
            image: Some(settings.iblab_image.clone()),
            image_pull_policy: Some(settings.iblab_pull_policy.clone()),
            command: Some(vec![
                "/usr/local/bin/iblab".into(),
                "bundle".into(),
                iblab_core::images::IN_NODE.into(),
            ]),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                run_as_non_root: Some(true),
                run_as_user: Some(iblab_core::images::OPERATOR_UID.into()),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    add: None,
                    drop: Some(vec!["ALL".into()]),
                }),
                ..Default::default()
            }),
            volume_mounts: Some(vec![mount(false)]),
            // A quota on requests.cpu/memory asks them of init containers too.
            resources: Some(resources(None)),
            // `iblab bundle`'s complaint, if any, becomes the reason the pod is refused with.
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Default::default()
        });
    for c in spec.containers.iter_mut().filter(|c| c.name == CONTAINER) {
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(true));
    }
}

/// The subnet's pod: the lab image with no capability added (ibsim and its clients talk
/// over abstract unix sockets in the pod's own network namespace), and no shell: an
/// abstract socket name belongs to whoever binds it first in a network namespace, and
/// anyone there can talk to ibsim as a client (`LD_PRELOAD=umad2sim` sends SMP Sets), so
/// no visitor shares that namespace. What the subnet shows, iblab's diagnostics keep in
/// the run's evidence.
pub fn subnet_pod(
    run_id: &str,
    plan: &Plan,
    ns: &str,
    settings: &Settings,
    owner_uid: Option<&str>,
) -> Pod {
    let mut pod = lab_pod(
        run_id,
        plan,
        SUBNET_POD,
        "subnet",
        ns,
        settings,
        owner_uid,
        vec![],
        resources(None),
    );
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.retain(|c| c.name != SHELL);
        if let Some(v) = spec.volumes.as_mut() {
            v.retain(|v| v.name != SHELL_TMP_VOLUME);
        }
    }
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(DEFAULT_CONTAINER_ANNOTATION);
    }
    if pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.is_empty())
    {
        pod.metadata.annotations = None;
    }
    pod
}

#[allow(clippy::too_many_arguments)]
fn lab_pod(
    run_id: &str,
    plan: &Plan,
    name: &str,
    role: &str,
    ns: &str,
    settings: &Settings,
    owner_uid: Option<&str>,
    caps: Vec<String>,
    resources: ResourceRequirements,
) -> Pod {
    let mut labels = labels(run_id, &plan.lab, &settings.owner);
    labels.insert(label::NODE.into(), name.to_string());
    labels.insert(label::ROLE.into(), role.into());
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.into()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                DEFAULT_CONTAINER_ANNOTATION.into(),
                SHELL.into(),
            )])),
            owner_references: owner_uid.map(|uid| vec![owned_by_anchor(run_id, uid)]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            hostname: Some(name.to_string()),
            restart_policy: Some("Never".into()),
            // `sleep` as PID 1 ignores SIGTERM: there is nothing to shut down gracefully.
            termination_grace_period_seconds: Some(0),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            // The runtime's default seccomp profile, which the kubelet does not apply
            // unless asked.
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                sysctls: Some(vec![
                    Sysctl {
                        name: "net.ipv4.ping_group_range".into(),
                        value: PING_GROUP_RANGE.into(),
                    },
                    Sysctl {
                        name: "net.ipv4.ip_unprivileged_port_start".into(),
                        value: UNPRIVILEGED_PORT_START.into(),
                    },
                ]),
                ..Default::default()
            }),
            containers: vec![
                idle(
                    CONTAINER,
                    settings,
                    SecurityContext {
                        capabilities: Some(Capabilities {
                            add: (!caps.is_empty()).then_some(caps),
                            drop: Some(vec!["ALL".into()]),
                        }),
                        ..unprivileged()
                    },
                    resources,
                    WORK_VOLUME,
                ),
                idle(
                    SHELL,
                    settings,
                    SecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(SHELL_UID),
                        run_as_group: Some(SHELL_UID),
                        ..unprivileged()
                    },
                    limits(
                        (SHELL_CPU_REQUEST, SHELL_MEMORY_REQUEST),
                        (SHELL_CPU_LIMIT, SHELL_MEMORY_LIMIT),
                    ),
                    SHELL_TMP_VOLUME,
                ),
            ],
            volumes: Some(vec![
                empty_dir(WORK_VOLUME, WORK_VOLUME_LIMIT),
                empty_dir(SHELL_TMP_VOLUME, SHELL_TMP_LIMIT),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container of the lab image that idles until iblab (or a visitor) execs in it, with
/// its own `/tmp` (the volume `tmp`).
fn idle(
    name: &str,
    settings: &Settings,
    security_context: SecurityContext,
    resources: ResourceRequirements,
    tmp: &str,
) -> Container {
    Container {
        name: name.into(),
        image: Some(settings.image.clone()),
        image_pull_policy: Some(settings.pull_policy.clone()),
        command: Some(vec![IDLE.into(), "infinity".into()]),
        security_context: Some(security_context),
        resources: Some(resources),
        volume_mounts: Some(vec![VolumeMount {
            name: tmp.into(),
            mount_path: WORK_MOUNT.into(),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// Unprivileged, no escalation, a read-only root, every capability dropped.
pub(crate) fn unprivileged() -> SecurityContext {
    SecurityContext {
        privileged: Some(false),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        ..Default::default()
    }
}

/// Requests and limits of cpu and memory.
fn limits(
    (cpu, memory): (&str, &str),
    (cpu_max, memory_max): (&str, &str),
) -> ResourceRequirements {
    let q = |v: &str| Quantity(v.into());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), q(cpu)),
            ("memory".to_string(), q(memory)),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".to_string(), q(cpu_max)),
            ("memory".to_string(), q(memory_max)),
        ])),
        ..Default::default()
    }
}

/// An emptyDir volume limited to `limit`.
fn empty_dir(name: &str, limit: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(limit.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pods of a run: every node and switch, and the subnet's where path ③ runs.
pub fn pods(
    run_id: &str,
    plan: &Plan,
    ns: &str,
    settings: &Settings,
    owner_uid: Option<&str>,
    first_vni: u32,
) -> Vec<Pod> {
    let mut v: Vec<Pod> = plan
        .nodes
        .iter()
        .map(|n| pod(run_id, plan, n, ns, settings, owner_uid, first_vni))
        .collect();
    if plan.paths.contains(&iblab_lab::PathKind::Ib) {
        v.push(subnet_pod(run_id, plan, ns, settings, owner_uid));
    }
    v
}

/// Every object of a run, in the order they are applied, as YAML documents.
pub fn render(run_id: &str, plan: &Plan, settings: &Settings) -> Result<String, String> {
    let (ns, own) = namespace_of(run_id, settings);
    let mut values = Vec::new();
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| e.to_string());
    if own {
        values.push(json(serde_json::to_value(namespace(
            run_id, plan, &ns, settings,
        )))?);
    }
    values.push(json(serde_json::to_value(anchor(
        run_id,
        plan,
        &ns,
        settings,
        links::FIRST_VNI,
    )))?);
    values.push(json(serde_json::to_value(network_policy(
        run_id, plan, &ns, settings, None,
    )))?);
    for p in pods(run_id, plan, &ns, settings, None, links::FIRST_VNI) {
        values.push(json(serde_json::to_value(p))?);
    }
    let mut out = String::new();
    for v in values {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&v).map_err(|e| e.to_string())?);
    }
    Ok(out)
}
