//! Is a container the agent was asked to create one of a lab pod's, as the kube backend
//! makes them; and what the agent takes away from it before runc creates it. Admission
//! (the chart's policy on the RuntimeClass) decides who may ask for the agent at all; this
//! is the node's own check of the container itself, which a pod's annotation cannot talk
//! its way past. Pure: the tests run on specs shaped like containerd's.

use serde_json::{Value, json};

use crate::oci::{self, Role, Target};

/// What the node's administrator allows (the handler script's flags).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// The images a lab pod's containers may run (the lab image, iblab's image); empty:
    /// any.
    pub images: Vec<String>,
    /// How many RDMA devices the node may have at most, counting the ones a pod asks for.
    pub max_devices: usize,
}

/// The most devices a node has when nobody said (a node holds a handful of lab pods,
/// each with a device or two).
pub const MAX_DEVICES: usize = 32;

/// The capabilities a lab pod's measuring container may hold (kube backend's
/// `manifest::CAPABILITIES` and `HCA_CAPABILITIES`); its other containers hold none.
pub const NODE_CAPABILITIES: &[&str] = &[
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_NET_BIND_SERVICE",
    "CAP_IPC_LOCK",
];

/// What each container runs (the kube backend's `manifest::IDLE`, and the init
/// container's `iblab bundle`).
const IDLE: &[&str] = &["sleep", "infinity"];
const BUNDLE: &[&str] = &["/usr/local/bin/iblab", "bundle", "/opt/iblab"];

/// The most processes (and threads) each container may have at once: a visitor's shell
/// cannot fork the node out of processes; iblab's tools and their samplers fit in the
/// measuring container's.
pub fn pids_limit(role: Role) -> i64 {
    match role {
        Role::Node => 1024,
        Role::Shell => 256,
        Role::Init => 64,
    }
}

/// An image name as containerd writes it (`docker.io/library/x:tag` for `x:tag`).
pub fn normalized(image: &str) -> String {
    let (first, _) = image.split_once('/').unwrap_or(("", image));
    let has_domain =
        !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost");
    match (image.contains('/'), has_domain) {
        (false, _) => format!("docker.io/library/{image}"),
        (true, false) => format!("docker.io/{image}"),
        (true, true) => image.to_string(),
    }
}

/// A container refused: its pod is not a lab pod as the kube backend makes it (`what`
/// says how it differs).
#[derive(Debug, thiserror::Error)]
#[error("pod {pod}: not a lab pod: {what}")]
pub struct NotALabPod {
    pub pod: String,
    pub what: String,
}

/// Is `config` (the container `t` of a pod that asked for the agent) a lab pod's container
/// as the kube backend makes it? Each `Err` says what is not, for the pod's events and
/// the node's log.
pub fn check(config: &Value, t: &Target, policy: &Policy) -> Result<(), NotALabPod> {
    let not = |what: String| {
        Err(NotALabPod {
            pod: t.pod.clone(),
            what,
        })
    };
    let process = &config["process"];
    let args: Vec<&str> = process["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let want = if t.role == Role::Init { BUNDLE } else { IDLE };
    if args != want {
        return not(format!(
            "its container runs `{}`, not `{}`",
            crate::log::clean(&args.join(" "), 120),
            want.join(" ")
        ));
    }
    if !policy.images.is_empty() {
        let image = oci::annotation(config, oci::IMAGE_NAME);
        if !policy.images.iter().any(|i| normalized(i) == image) {
            return not(format!(
                "its image is {}, not one of {}",
                crate::log::clean(image, 120),
                policy.images.join(", ")
            ));
        }
    }
    if process["noNewPrivileges"] != true {
        return not("its container may gain privileges (allowPrivilegeEscalation)".into());
    }
    if config["root"]["readonly"] != true {
        return not("its root filesystem is writable".into());
    }
    let allowed: &[&str] = if t.role == Role::Node {
        NODE_CAPABILITIES
    } else {
        &[]
    };
    for set in [
        "bounding",
        "effective",
        "permitted",
        "inheritable",
        "ambient",
    ] {
        for cap in process["capabilities"][set]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !allowed.contains(&cap) {
                return not(format!(
                    "its container holds {} ({set})",
                    crate::log::clean(cap, 40)
                ));
            }
        }
    }
    if t.role != Role::Node && process["user"]["uid"].as_u64().unwrap_or(0) == 0 {
        return not("a container other than the measuring one runs as root".into());
    }
    if config["linux"]["devices"]
        .as_array()
        .is_some_and(|d| !d.is_empty())
    {
        return not("its container is given device files already".into());
    }
    let seccomp = &config["linux"]["seccomp"];
    if !seccomp.is_object() || seccomp["defaultAction"] == "SCMP_ACT_ALLOW" {
        return not("it runs without the runtime's seccomp profile".into());
    }
    let namespaces: Vec<&str> = config["linux"]["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["type"].as_str())
        .collect();
    for ns in ["pid", "ipc", "uts", "mount", "network"] {
        if !namespaces.contains(&ns) {
            return not(format!("it shares the node's {ns} namespace"));
        }
    }
    // Every file the container gets from the node is its pod's own: the kubelet's folder
    // of the pod (its volumes, /etc/hosts, the termination log) or containerd's of its
    // sandbox (hostname, resolv.conf, /dev/shm). A hostPath volume is neither.
    let uid = oci::annotation(config, oci::SANDBOX_UID);
    let sandbox = oci::annotation(config, oci::SANDBOX_ID);
    let own = [format!("/pods/{uid}/"), format!("/sandboxes/{sandbox}/")];
    for m in config["mounts"].as_array().into_iter().flatten() {
        let bind = m["type"] == "bind"
            || m["options"]
                .as_array()
                .is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"));
        if !bind {
            continue;
        }
        let source = m["source"].as_str().unwrap_or("");
        if uid == "?" || sandbox == "?" || !own.iter().any(|o| source.contains(o.as_str())) {
            return not(format!(
                "it mounts {} from the node at {}, which is not its pod's own",
                crate::log::clean(source, 120),
                crate::log::clean(m["destination"].as_str().unwrap_or("?"), 120)
            ));
        }
    }
    Ok(())
}

/// `socket(2)`'s `domain` and `protocol` that open the RDMA subsystem's netlink (RDMA
/// device administration: `rdma link add/delete`, `rdma dev set … name`).
const AF_NETLINK: u64 = 16;
const NETLINK_RDMA: u64 = 20;
const EPERM: u64 = 1;
/// System calls a container of a lab pod never needs that would reach around the rule
/// below: `socketcall` (i386's multiplexer, whose arguments sit in memory seccomp cannot
/// read) and io_uring (whose socket operation is no system call at all).
const TAKEN: &[&str] = &[
    "socketcall",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

/// Seccomp conditions that hold when the low 32 bits of argument `index` are not `value`
/// (the kernel reads `socket`'s arguments as `int`: a plain "not equal" on the whole
/// register would let `value + 2^32` through): one condition per bit, each alone enough.
fn differs(index: u64, value: u64) -> Vec<Value> {
    (0..32)
        .map(|bit| {
            let mask = 1u64 << bit;
            json!({"index": index, "value": mask, "valueTwo": (value & mask) ^ mask,
                   "op": "SCMP_CMP_MASKED_EQ"})
        })
        .collect()
}

fn is32(index: u64, value: u64) -> Value {
    json!({"index": index, "value": 0xffff_ffffu64, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"})
}

/// Take the RDMA subsystem's netlink away from the container: a lab step with NET_ADMIN
/// (the node's, in a pod without a user namespace) could otherwise add, delete or rename
/// RDMA devices of the whole node. `socket` stays for every other family and protocol
/// (`ip`, `tc`, `nft`, `ss`, verbs' own files); libibverbs finds its devices in sysfs when
/// it cannot open that netlink. What the runtime's profile allowed of [`TAKEN`] goes too.
pub fn deny_rdma_netlink(config: &mut Value) {
    let Some(rules) = config["linux"]["seccomp"]["syscalls"].as_array_mut() else {
        return;
    };
    for r in rules.iter_mut() {
        if let Some(names) = r["names"].as_array_mut() {
            names.retain(|n| n != "socket" && !TAKEN.iter().any(|t| n == *t));
        }
    }
    rules.retain(|r| r["names"].as_array().is_some_and(|n| !n.is_empty()));
    let allow =
        |args: Vec<Value>| json!({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": args});
    for c in differs(0, AF_NETLINK) {
        rules.push(allow(vec![c]));
    }
    for c in differs(2, NETLINK_RDMA) {
        rules.push(allow(vec![is32(0, AF_NETLINK), c]));
    }
    rules.push(json!({
        "names": ["socket"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": EPERM,
        "args": [is32(0, AF_NETLINK), is32(2, NETLINK_RDMA)],
    }));
}

/// At most `limit` processes in the container (its own pids cgroup).
pub fn limit_pids(config: &mut Value, limit: i64) {
    let linux = &mut config["linux"];
    if !linux["resources"].is_object() {
        linux["resources"] = json!({});
    }
    let now = linux["resources"]["pids"]["limit"].as_i64();
    if now.is_none_or(|n| n <= 0 || n > limit) {
        linux["resources"]["pids"] = json!({"limit": limit});
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RoceSpec;

    fn spec(role: Role) -> Value {
        let (name, args, uid, caps) = match role {
            Role::Node => (
                "node",
                json!(["sleep", "infinity"]),
                0,
                json!(["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK"]),
            ),
            Role::Shell => ("shell", json!(["sleep", "infinity"]), 65534, json!([])),
            Role::Init => (
                "iblab",
                json!(["/usr/local/bin/iblab", "bundle", "/opt/iblab"]),
                65532,
                json!([]),
            ),
        };
        json!({
            "process": {
                "args": args,
                "user": {"uid": uid, "gid": uid},
                "noNewPrivileges": true,
                "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            },
            "root": {"path": "rootfs", "readonly": true},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/tmp", "type": "bind", "options": ["rbind", "rprivate", "rw"],
                 "source": "/var/lib/kubelet/pods/u-1/volumes/kubernetes.io~empty-dir/tmp"},
                {"destination": "/etc/hostname", "type": "bind", "options": ["rbind", "ro"],
                 "source": "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/s1/hostname"},
            ],
            "annotations": {
                oci::CONTAINER_TYPE: "container",
                oci::CONTAINER_NAME: name,
                oci::SANDBOX_NAME: "a",
                oci::SANDBOX_NAMESPACE: "iblab-r1",
                oci::SANDBOX_UID: "u-1",
                oci::SANDBOX_ID: "s1",
                oci::IMAGE_NAME: "docker.io/iblab/lab:0.1.0",
            },
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "ipc", "path": "/proc/9/ns/ipc"},
                               {"type": "uts"}, {"type": "mount"},
                               {"type": "network", "path": "/var/run/netns/cni-1"}],
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
                    {"names": ["read", "socket", "socketcall", "io_uring_setup", "write"],
                     "action": "SCMP_ACT_ALLOW"},
                    {"names": ["io_uring_enter"], "action": "SCMP_ACT_ALLOW"},
                ]},
            },
        })
    }

    fn target(role: Role) -> Target {
        Target {
            pod: "iblab-r1/a".into(),
            role,
            netns: "/var/run/netns/cni-1".into(),
            spec: RoceSpec::parse(r#"{"underlay":"eth0","links":[],"rxe":[]}"#).unwrap(),
        }
    }

    fn policy() -> Policy {
        Policy {
            images: vec!["iblab/lab:0.1.0".into(), "iblab/operator:0.1.0".into()],
            max_devices: MAX_DEVICES,
        }
    }

    #[test]
    fn a_lab_pods_containers_pass() {
        for role in [Role::Node, Role::Shell, Role::Init] {
            check(&spec(role), &target(role), &policy()).unwrap();
        }
        check(&spec(Role::Node), &target(Role::Node), &Policy::default()).unwrap();
        assert_eq!(normalized("busybox"), "docker.io/library/busybox");
        assert_eq!(normalized("reg.io:5000/x/y:1"), "reg.io:5000/x/y:1");
        assert_eq!(
            normalized("localhost/iblab/pause:1.0"),
            "localhost/iblab/pause:1.0"
        );
    }

    /// What a pod that is not a lab pod looks like to the node, each refused saying why.
    #[test]
    fn any_other_container_is_refused_saying_why() {
        let refused = |role: Role, edit: &dyn Fn(&mut Value), says: &str| {
            let mut c = spec(role);
            edit(&mut c);
            let e = check(&c, &target(role), &policy()).unwrap_err().to_string();
            assert!(
                e.contains("not a lab pod") && e.contains(says),
                "{says}: {e}"
            );
        };
        refused(
            Role::Node,
            &|c| c["process"]["args"] = json!(["sh"]),
            "runs `sh`",
        );
        refused(
            Role::Node,
            &|c| c["annotations"][oci::IMAGE_NAME] = json!("docker.io/library/alpine:3"),
            "its image is docker.io/library/alpine:3",
        );
        refused(
            Role::Node,
            &|c| c["process"]["noNewPrivileges"] = json!(false),
            "gain privileges",
        );
        refused(
            Role::Node,
            &|c| c["root"]["readonly"] = json!(false),
            "writable",
        );
        refused(
            Role::Node,
            &|c| c["process"]["capabilities"]["bounding"] = json!(["CAP_SYS_ADMIN"]),
            "CAP_SYS_ADMIN",
        );
        refused(
            Role::Shell,
            &|c| c["process"]["capabilities"]["effective"] = json!(["CAP_NET_RAW"]),
            "CAP_NET_RAW",
        );
        refused(
            Role::Shell,
            &|c| c["process"]["user"]["uid"] = json!(0),
            "as root",
        );
        refused(
            Role::Node,
            &|c| c["linux"]["devices"] = json!([{"path": "/dev/mem"}]),
            "device files",
        );
        refused(
            Role::Node,
            &|c| c["linux"]["seccomp"] = Value::Null,
            "seccomp",
        );
        refused(
            Role::Node,
            &|c| c["linux"]["namespaces"] = json!([{"type": "network", "path": "/x"}]),
            "pid namespace",
        );
        refused(
            Role::Node,
            &|c| {
                c["mounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"destination": "/host", "type": "bind", "source": "/"}))
            },
            "mounts / from the node at /host",
        );
        refused(
            Role::Node,
            &|c| {
                c["mounts"].as_array_mut().unwrap().push(json!({
                    "destination": "/other", "type": "bind",
                    "source": "/var/lib/kubelet/pods/u-2/volumes/kubernetes.io~empty-dir/tmp"}))
            },
            "not its pod's own",
        );
    }

    #[test]
    fn the_measuring_container_loses_rdma_netlink_and_every_container_gets_a_pids_cap() {
        let mut c = spec(Role::Node);
        deny_rdma_netlink(&mut c);
        limit_pids(&mut c, pids_limit(Role::Shell));
        let rules = c["linux"]["seccomp"]["syscalls"].as_array().unwrap();
        // Nothing allows socket, socketcall or io_uring unconditionally any more.
        for r in rules {
            let names = r["names"].as_array().unwrap();
            assert!(!names.is_empty());
            if r["args"].as_array().is_none_or(|a| a.is_empty()) {
                assert!(
                    !names
                        .iter()
                        .any(|n| n == "socket" || TAKEN.iter().any(|t| n == *t)),
                    "{r}"
                );
            }
        }
        assert!(
            rules[0]["names"]
                .as_array()
                .unwrap()
                .contains(&json!("read"))
        );
        // Evaluate the socket rules as the kernel's filter would, on 64-bit registers.
        let verdict = |domain: u64, protocol: u64| -> &str {
            let matches = |r: &Value| {
                r["names"] == json!(["socket"])
                    && r["args"].as_array().unwrap().iter().all(|a| {
                        let v = if a["index"] == 0 { domain } else { protocol };
                        v & a["value"].as_u64().unwrap() == a["valueTwo"].as_u64().unwrap()
                    })
            };
            let hits: Vec<&str> = rules
                .iter()
                .filter(|r| matches(r))
                .map(|r| r["action"].as_str().unwrap())
                .collect();
            assert!(
                hits.iter().all(|h| *h == hits[0]),
                "rules of different actions overlap at ({domain}, {protocol}): {hits:?}"
            );
            hits.first().copied().unwrap_or("default")
        };
        assert_eq!(verdict(2, 6), "SCMP_ACT_ALLOW"); // AF_INET, TCP
        assert_eq!(verdict(16, 0), "SCMP_ACT_ALLOW"); // NETLINK_ROUTE (ip, tc)
        assert_eq!(verdict(16, 12), "SCMP_ACT_ALLOW"); // NETLINK_NETFILTER (nft)
        assert_eq!(verdict(16, 20), "SCMP_ACT_ERRNO"); // NETLINK_RDMA
        // The kernel reads `int`s: high bits do not get around the rule.
        assert_eq!(verdict(16 | 1 << 32, 20), "SCMP_ACT_ERRNO");
        assert_eq!(verdict(16, 20 | 1 << 40), "SCMP_ACT_ERRNO");
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 256);
        limit_pids(&mut c, 1024);
        assert_eq!(
            c["linux"]["resources"]["pids"]["limit"], 256,
            "a lower limit stays"
        );
    }
}
