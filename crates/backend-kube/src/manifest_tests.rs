//! The objects a kube run applies, rendered for the real kube backend: golden files, iblab
//! in the nodes, labels and owners.

use iblab_core::caps::HostCaps;
use iblab_core::plan::{Plan, Request, plan};
use iblab_k8s::manifest::*;
use iblab_k8s::settings::Settings;
use iblab_lab::PathKind;

/// A plan for a cluster none of whose nodes can give pods Soft-RoCE devices.
fn planned(lab: &str, scenario: Option<&str>, paths: &[PathKind]) -> Plan {
    planned_on(false, lab, scenario, paths)
}

/// A plan for a cluster whose preflight found a node with rxe per namespace.
fn planned_rxe(lab: &str, scenario: Option<&str>, paths: &[PathKind]) -> Plan {
    planned_on(true, lab, scenario, paths)
}

fn planned_on(rxe: bool, lab: &str, scenario: Option<&str>, paths: &[PathKind]) -> Plan {
    let lab = iblab_lab::load::resolve(lab).unwrap();
    let req = Request {
        scenario: scenario.map(str::to_string),
        backend: "kube".into(),
        paths: Some(paths.to_vec()),
        hca: None,
        run: Some("0123456789abcdef".into()),
        lang: Default::default(),
    };
    let mut caps = HostCaps::for_tests();
    caps.preflight.insert(
        "kube".into(),
        super::roce::rows(
            &[iblab_k8s::cluster::NodeFacts {
                name: "n7".into(),
                kernel: "7.2.12".into(),
                ready: true,
                labels: if rxe {
                    [(label::RXE_PER_NETNS.to_string(), "true".to_string())].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            }],
            Some(&["iblab-rxe".to_string()]),
            "iblab-rxe",
        ),
    );
    plan(
        &lab,
        &req,
        &caps,
        &[&crate::BACKEND as &dyn iblab_core::plan::backend::Backend],
    )
    .unwrap()
}

/// Compare with this crate's `tests/fixtures/kube/NAME.yaml`; `IBLAB_BLESS=1` writes it instead.
fn golden(name: &str, text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kube")
        .join(format!("{name}.yaml"));
    if std::env::var_os("IBLAB_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (IBLAB_BLESS=1 writes it)", path.display()));
    assert_eq!(
        text,
        want,
        "rendering of {name} changed; if on purpose, IBLAB_BLESS=1 cargo test rewrites {}",
        path.display()
    );
}

#[test]
fn renders_as_the_golden_files_say() {
    let s = Settings::for_tests();
    let p = planned("tcp-loss", None, &[PathKind::Tcp]);
    golden("tcp-loss", &render(RENDER_RUN, &p, &s).unwrap());
    let p = planned("lesson4", None, &[PathKind::Tcp, PathKind::Ib]);
    golden("lesson4", &render(RENDER_RUN, &p, &s).unwrap());
    // A lab that runs iblab in its nodes (path ①'s ping-pong) brings it in.
    let p = planned("lesson2", None, &[PathKind::Tcp, PathKind::Ib]);
    golden("lesson2", &render(RENDER_RUN, &p, &s).unwrap());
    // In a given namespace, with a real adapter through a device plugin.
    let given = Settings {
        namespace: Some("class-a".into()),
        rdma_resource: Some("rdma/hca_shared_devices_a".into()),
        image: "registry.example/iblab/lab:0.1.0".into(),
        pull_policy: "IfNotPresent".into(),
        ..Settings::for_tests()
    };
    let p = planned("tcp-loss", None, &[PathKind::Tcp]);
    golden(
        "tcp-loss-given-namespace-hca",
        &render(RENDER_RUN, &p, &given).unwrap(),
    );
    // Path ② in pods (Soft-RoCE), one node pinned with --place.
    let placed = Settings {
        placement: [("b".to_string(), "worker-2".to_string())].into(),
        ..Settings::for_tests()
    };
    let p = planned_rxe(
        "lesson3",
        Some("forgot-register-memory"),
        &[PathKind::Tcp, PathKind::Roce],
    );
    golden(
        "lesson3-roce-placed",
        &render(RENDER_RUN, &p, &placed).unwrap(),
    );
}

/// Path ②'s lab pods go to nodes whose rxe serves every namespace, under the node agent's
/// RuntimeClass, asking it (an annotation) for their links and an rxe on each addressed
/// interface; unprivileged, no host path, IPC_LOCK added. Switches and the subnet's pod
/// stay as they are. A pinned pod goes to its node by hostname, whatever that node's taint.
#[test]
fn roce_pods_go_to_rxe_nodes_and_ask_the_node_for_their_devices() {
    let s = Settings {
        placement: [("sw1".to_string(), "worker-2".to_string())].into(),
        ..Settings::for_tests()
    };
    let p = planned_rxe(
        "lesson3",
        Some("forgot-register-memory"),
        &[PathKind::Tcp, PathKind::Roce, PathKind::Ib],
    );
    for n in &p.nodes {
        let pod = pod("r", &p, n, "ns", &s, None, 4000);
        let asked = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(iblab_node_agent::spec::ANNOTATION))
            .map(|t| iblab_node_agent::spec::RoceSpec::parse(t).unwrap());
        let spec = pod.spec.unwrap();
        let sc = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(sc.privileged, Some(false), "{}", n.name);
        assert!(
            spec.volumes.iter().flatten().all(|v| v.host_path.is_none()),
            "{}: no host path",
            n.name
        );
        let selector = spec.node_selector.clone().unwrap_or_default();
        let tolerates = spec
            .tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some(label::RXE_PER_NETNS));
        let caps = sc.capabilities.unwrap().add.unwrap_or_default();
        if n.switch {
            assert!(asked.is_none() && spec.runtime_class_name.is_none());
            assert!(!caps.contains(&"IPC_LOCK".to_string()));
            assert_eq!(
                selector.get(HOSTNAME_LABEL).map(String::as_str),
                Some("worker-2")
            );
            assert!(tolerates, "a pinned pod tolerates the rxe nodes' taint");
            assert!(!selector.contains_key(label::RXE_PER_NETNS));
        } else {
            assert_eq!(spec.runtime_class_name.as_deref(), Some("iblab-rxe"));
            assert_eq!(
                caps,
                ["NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE", "IPC_LOCK"],
                "{}",
                n.name
            );
            let asked = asked.unwrap();
            // Every link end of the node, each with the run's VNI for its link; an rxe
            // on each addressed interface, named as the plan names it.
            let ends: Vec<_> = p
                .links
                .iter()
                .flat_map(|l| l.ends.iter())
                .filter(|(node, _)| node == &n.name)
                .map(|(_, i)| i.clone())
                .collect();
            assert_eq!(
                asked
                    .links
                    .iter()
                    .map(|l| l.name.clone())
                    .collect::<Vec<_>>(),
                ends
            );
            assert!(asked.links.iter().all(|l| l.vni >= 4000 && l.port == 4789));
            assert_eq!(
                asked
                    .rxe
                    .iter()
                    .map(|r| r.device.clone())
                    .collect::<Vec<_>>(),
                p.backend_facts.rdma_devices[&n.name]
            );
            assert_eq!(
                selector.get(label::RXE_PER_NETNS).map(String::as_str),
                Some("true")
            );
            assert!(tolerates);
            assert!(!selector.contains_key(HOSTNAME_LABEL));
        }
    }
    let subnet = subnet_pod("r", &p, "ns", &s, None).spec.unwrap();
    assert!(subnet.node_selector.is_none() && subnet.tolerations.is_none());
    // Path ③ alone rides the pods' own rxe too where the cluster can give them one (its
    // admitted bytes, as on the vm backend); path ① alone needs none.
    let ib = planned_rxe("lesson3", None, &[PathKind::Tcp, PathKind::Ib]);
    assert!(ib.backend_traits.verbs_in_nodes);
    let a = ib.nodes.iter().find(|n| n.name == "a").unwrap();
    let spec = pod("r", &ib, a, "ns", &Settings::for_tests(), None, 4000)
        .spec
        .unwrap();
    assert_eq!(spec.runtime_class_name.as_deref(), Some("iblab-rxe"));
    let q = planned("lesson3", None, &[PathKind::Tcp]);
    assert!(!q.backend_traits.verbs_in_nodes);
    for n in &q.nodes {
        let spec = pod("r", &q, n, "ns", &Settings::for_tests(), None, 4000)
            .spec
            .unwrap();
        assert!(spec.node_selector.is_none(), "{}", n.name);
        assert!(spec.runtime_class_name.is_none(), "{}", n.name);
        assert_eq!(
            spec.containers[0]
                .security_context
                .as_ref()
                .unwrap()
                .privileged,
            Some(false)
        );
    }
    // Each run names its devices apart: pods of several runs share a node's kernel; the
    // name begins with `rxe` (libibverbs finds the provider by it without netlink).
    assert_eq!(
        p.backend_facts.rdma_devices["a"],
        vec!["rxe0-a-0123456789abcdef".to_string()]
    );
    let long = super::pod_rdma_device(Some("0123456789abcdef"), &"n".repeat(80), 3);
    assert!(
        long.len() <= 63 && long.starts_with("rxe3-n") && long.ends_with("-0123456789abcdef"),
        "{long}"
    );
    assert_eq!(super::pod_rdma_device(None, "b", 0), "rxe0-b");
}

/// Only a lab that runs iblab in its nodes gets the init container, and only on its
/// nodes: the binary comes read-only, from a non-root container with no capability.
#[test]
fn iblab_comes_into_the_nodes_of_labs_that_run_it() {
    let s = Settings::for_tests();
    let with = planned("lesson2", None, &[PathKind::Tcp, PathKind::Ib]);
    let without = planned("tcp-loss", None, &[PathKind::Tcp]);
    for n in &with.nodes {
        let spec = pod("r", &with, n, "ns", &s, None, 4000).spec.unwrap();
        let init = spec.init_containers.unwrap_or_default();
        if n.switch {
            assert!(init.is_empty(), "{}: a switch runs no iblab", n.name);
            continue;
        }
        assert_eq!(init[0].image.as_deref(), Some("iblab/operator:test"));
        let sc = init[0].security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        let mounts = spec.containers[0].volume_mounts.as_ref().unwrap();
        let m = mounts
            .iter()
            .find(|m| m.mount_path == iblab_core::images::IN_NODE)
            .unwrap();
        assert_eq!(m.read_only, Some(true));
    }
    for n in &without.nodes {
        let spec = pod("r", &without, n, "ns", &s, None, 4000).spec.unwrap();
        assert!(spec.init_containers.is_none());
        let volumes: Vec<_> = spec.volumes.iter().flatten().map(|v| &v.name).collect();
        assert_eq!(
            volumes,
            [WORK_VOLUME, SHELL_TMP_VOLUME],
            "only the two /tmp volumes"
        );
    }
    // Left out with --paths, the ping-pong brings nothing.
    let ib_only = planned("lesson2", None, &[PathKind::Ib]);
    assert!(!ib_only.runs_iblab_in_nodes(&iblab_core::images::in_node_exe()));
}

#[test]
fn every_object_carries_the_run_and_the_pods_are_owned() {
    let s = Settings::for_tests();
    let p = planned("lesson4", None, &[PathKind::Tcp, PathKind::Ib]);
    for n in &p.nodes {
        let pod = pod("abc123", &p, n, "iblab-abc123", &s, Some("uid-1"), 4000);
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels[label::RUN], "abc123");
        assert_eq!(labels[label::NODE], n.name);
        let owner = &pod.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ConfigMap", "uid-1")
        );
        assert_eq!(labels[label::OWNER], "test-owner");
        let spec = pod.spec.unwrap();
        let seccomp = spec
            .security_context
            .as_ref()
            .unwrap()
            .seccomp_profile
            .as_ref();
        assert_eq!(seccomp.unwrap().type_, "RuntimeDefault");
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, Some(false), "no privileged pod");
        // Every default capability dropped; only what the links, ping and the tools'
        // servers need added.
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!(
            caps.add.as_deref(),
            Some(
                &[
                    "NET_ADMIN".to_string(),
                    "NET_RAW".to_string(),
                    "NET_BIND_SERVICE".to_string()
                ][..]
            )
        );
        // Requests and limits, so a class quota admits the pod; no device unless asked.
        let r = c.resources.as_ref().unwrap();
        let (req, lim) = (r.requests.as_ref().unwrap(), r.limits.as_ref().unwrap());
        assert_eq!(req.keys().collect::<Vec<_>>(), ["cpu", "memory"]);
        assert_eq!(lim.keys().collect::<Vec<_>>(), ["cpu", "memory"]);
        // A read-only root (the tools cannot be replaced), writable /tmp only, bounded.
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        let mounts = c.volume_mounts.as_ref().unwrap();
        let tmp = mounts.iter().find(|m| m.mount_path == "/tmp").unwrap();
        assert_ne!(tmp.read_only, Some(true));
        assert!(
            mounts
                .iter()
                .filter(|m| m.read_only != Some(true))
                .all(|m| m.mount_path == "/tmp"),
            "{mounts:?}"
        );
        let vol = spec.volumes.as_ref().unwrap();
        let tmp = vol.iter().find(|v| v.name == tmp.name).unwrap();
        assert!(tmp.empty_dir.as_ref().unwrap().size_limit.is_some());
    }
    let (ns, own) = namespace_of("abc123", &s);
    assert_eq!((ns.as_str(), own), ("iblab-abc123", true));
}

/// Every lab node's and switch's pod, on every path, has a shell beside its measuring
/// container: a non-root user with no capability, no device, no host path and a /tmp of
/// its own, the container `kubectl exec` enters unless told otherwise; the measuring
/// container's volumes are not mounted there. The subnet's pod has none: nobody shares
/// ibsim's network namespace (its abstract sockets). In every pod, ports below 32768 need
/// NET_BIND_SERVICE, which only the measuring container holds.
#[test]
fn a_visitor_enters_a_shell_that_shares_nothing_with_what_measures() {
    let s = Settings::for_tests();
    let roce = planned_rxe(
        "lesson3",
        Some("forgot-register-memory"),
        &[PathKind::Tcp, PathKind::Roce, PathKind::Ib],
    );
    let pods = roce
        .nodes
        .iter()
        .map(|n| pod("r", &roce, n, "ns", &s, None, 4000))
        .collect::<Vec<_>>();
    let subnet = subnet_pod("r", &roce, "ns", &s, None);
    assert!(
        subnet
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(DEFAULT_CONTAINER_ANNOTATION))
    );
    let spec = subnet.spec.unwrap();
    let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [CONTAINER], "no visitor in the subnet's namespace");
    assert!(
        spec.volumes
            .iter()
            .flatten()
            .all(|v| v.name != SHELL_TMP_VOLUME)
    );
    for p in pods {
        let name = p.metadata.name.clone().unwrap();
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[DEFAULT_CONTAINER_ANNOTATION],
            SHELL,
            "{name}"
        );
        let spec = p.spec.unwrap();
        let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [CONTAINER, SHELL], "{name}");
        let shell = &spec.containers[1];
        let sc = shell.security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, Some(false), "{name}");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(SHELL_UID));
        let caps = sc.capabilities.as_ref().unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(caps.add.is_none(), "{name}: the shell has no capability");
        let mounts: Vec<_> = shell
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(mounts, [(SHELL_TMP_VOLUME, "/tmp")], "{name}");
        let measuring = &spec.containers[0];
        assert!(
            measuring
                .volume_mounts
                .iter()
                .flatten()
                .all(|m| m.name != SHELL_TMP_VOLUME),
            "{name}"
        );
        // Unprivileged ping for the shell's group only; no port of a tool for the shell.
        let sysctls = spec.security_context.as_ref().unwrap().sysctls.clone();
        let sysctls = sysctls.unwrap();
        assert_eq!(
            sysctls[0].value, PING_GROUP_RANGE,
            "{name}: the measuring container's root keeps its raw socket"
        );
        assert_eq!(
            (sysctls[1].name.as_str(), sysctls[1].value.as_str()),
            ("net.ipv4.ip_unprivileged_port_start", "32768"),
            "{name}"
        );
        let node_caps = measuring.security_context.as_ref().unwrap();
        assert!(
            node_caps
                .capabilities
                .as_ref()
                .unwrap()
                .add
                .as_ref()
                .unwrap()
                .contains(&"NET_BIND_SERVICE".to_string()),
            "{name}: the tools' servers bind below 32768"
        );
    }
}

#[test]
fn only_labs_that_shape_a_link_have_their_nodes_kernels_asked_for_netem() {
    assert!(super::shapes_links(&planned(
        "tcp-loss",
        None,
        &[PathKind::Tcp]
    )));
    assert!(!super::shapes_links(&planned(
        "lesson4",
        None,
        &[PathKind::Tcp]
    )));
}
