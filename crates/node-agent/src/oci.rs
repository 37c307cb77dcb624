//! What the wrapper reads of a runc call and changes in its bundle: runc's command line
//! (global flags, the subcommand, `create`'s bundle and log file) and the OCI
//! `config.json` (which container of which pod, its network namespace, its devices).
//! Pure: the tests run on a runc command line and a `config.json` captured from the test
//! cluster's node.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::spec::{ANNOTATION, RoceSpec};

/// The container of a lab pod that is given the devices (iblab's measuring container,
/// `iblab_k8s::manifest::CONTAINER`).
pub const LAB_CONTAINER: &str = "node";

/// containerd's CRI annotations on every container's spec.
pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";

/// runc's global flags that take a value (the rest are booleans).
const GLOBAL_WITH_VALUE: &[&str] = &["--log", "--log-format", "--root", "--criu", "--rootless"];
/// `create`'s flags that take a value.
const CREATE_WITH_VALUE: &[&str] = &[
    "--bundle",
    "-b",
    "--console-socket",
    "--pidfd-socket",
    "--pid-file",
    "--preserve-fds",
];

/// A runc command line, as far as the wrapper cares.
#[derive(Debug, Default, PartialEq)]
pub struct RuncCall {
    pub subcommand: Option<String>,
    /// `create`'s bundle (runc's default: the working directory).
    pub bundle: Option<PathBuf>,
    /// Where runc writes its log; the shim reads a failure's reason from it.
    pub log: Option<PathBuf>,
    pub log_json: bool,
    /// runc's state folder (`--root`): `<root>/<id>/state.json` while a container exists.
    pub root: Option<PathBuf>,
    /// The container's id (the subcommand's last word that is not a flag).
    pub id: Option<String>,
}

/// `--flag value` or `--flag=value`: the value of `flag` at `args[i]`, and how many words
/// it took.
fn value_at(args: &[String], i: usize, flag: &str) -> Option<(String, usize)> {
    let a = &args[i];
    if a == flag {
        return args.get(i + 1).map(|v| (v.clone(), 2));
    }
    a.strip_prefix(flag)
        .and_then(|rest| rest.strip_prefix('='))
        .map(|v| (v.to_string(), 1))
}

impl RuncCall {
    pub fn parse(args: &[String]) -> RuncCall {
        let mut call = RuncCall::default();
        let mut i = 0;
        while i < args.len() {
            let a = &args[i];
            if call.subcommand.is_none() {
                if let Some(flag) = GLOBAL_WITH_VALUE
                    .iter()
                    .find(|f| a == *f || a.starts_with(&format!("{f}=")))
                {
                    let (v, n) = value_at(args, i, flag).unwrap_or_default();
                    match *flag {
                        "--log" => call.log = Some(PathBuf::from(v)),
                        "--log-format" => call.log_json = v == "json",
                        "--root" => call.root = Some(PathBuf::from(v)),
                        _ => {}
                    }
                    i += n.max(1);
                    continue;
                }
                if !a.starts_with('-') {
                    call.subcommand = Some(a.clone());
                }
                i += 1;
                continue;
            }
            if call.subcommand.as_deref() == Some("create")
                && let Some(flag) = CREATE_WITH_VALUE
                    .iter()
                    .find(|f| a == *f || a.starts_with(&format!("{f}=")))
            {
                let (v, n) = value_at(args, i, flag).unwrap_or_default();
                if matches!(*flag, "--bundle" | "-b") {
                    call.bundle = Some(PathBuf::from(v));
                }
                i += n.max(1);
                continue;
            }
            if !a.starts_with('-') {
                call.id = Some(a.clone());
            }
            i += 1;
        }
        call
    }
}

/// Which container of a lab pod a spec is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Role {
    /// iblab's measuring container ([`LAB_CONTAINER`]): given the pod's devices.
    Node,
    /// The container a visitor enters (`shell`): nothing given, its processes bounded.
    Shell,
    /// The init container that brings iblab into the pod (`iblab`).
    Init,
}

/// The container a visitor of a lab pod enters.
pub const SHELL_CONTAINER: &str = "shell";
/// The init container that brings iblab into a lab pod.
pub const INIT_CONTAINER: &str = "iblab";

/// A container of a lab pod (one whose pod carries the annotation), about to be created:
/// which one, where its network namespace is, and what its pod asked for.
#[derive(Debug, PartialEq)]
pub struct Target {
    /// `namespace/name` of the pod, for messages.
    pub pod: String,
    pub role: Role,
    pub netns: String,
    pub spec: RoceSpec,
}

/// The value of a CRI annotation, or `?`.
pub fn annotation<'a>(config: &'a Value, key: &str) -> &'a str {
    config["annotations"][key].as_str().unwrap_or("?")
}

/// Why a container of a pod that asked for the agent is not one of a lab pod's.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(
        "pod {pod}: not a lab pod: it has a container `{}`, and a lab pod has only \
         `{LAB_CONTAINER}`, `{SHELL_CONTAINER}` and the init container `{INIT_CONTAINER}`",
        crate::log::clean(container, 80)
    )]
    OtherContainer { pod: String, container: String },
    #[error("pod {pod}: {source}")]
    Spec {
        pod: String,
        #[source]
        source: crate::spec::SpecError,
    },
    #[error(
        "pod {0}: not a lab pod: its container has no network namespace of its own (the \
         node's network?)"
    )]
    NoNetns(String),
}

/// Is this spec a container of a pod that asks for links and rxe (the annotation)?
/// `None`: not one of ours (a pod without it, or a pod's sandbox: runc goes on
/// untouched). `Err`: ours, but the annotation or the spec is not as it must be (the
/// container is not created), a container a lab pod does not have among them.
pub fn target(config: &Value) -> Option<Result<Target, TargetError>> {
    let ann = &config["annotations"];
    let text = ann[ANNOTATION].as_str()?;
    if ann[CONTAINER_TYPE] != "container" {
        return None;
    }
    let pod = format!(
        "{}/{}",
        crate::log::clean(annotation(config, SANDBOX_NAMESPACE), 80),
        crate::log::clean(annotation(config, SANDBOX_NAME), 80)
    );
    let netns = config["linux"]["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .filter(|p| !p.is_empty());
    Some((|| {
        let name = annotation(config, CONTAINER_NAME);
        let role = match name {
            LAB_CONTAINER => Role::Node,
            SHELL_CONTAINER => Role::Shell,
            INIT_CONTAINER => Role::Init,
            other => {
                return Err(TargetError::OtherContainer {
                    pod,
                    container: other.to_string(),
                });
            }
        };
        let spec = match RoceSpec::parse(text) {
            Ok(spec) => spec,
            Err(source) => return Err(TargetError::Spec { pod, source }),
        };
        let Some(netns) = netns else {
            return Err(TargetError::NoNetns(pod));
        };
        let netns = netns.to_string();
        Ok(Target {
            pod,
            role,
            netns,
            spec,
        })
    })())
}

/// A character device a container is given: its path there (the same as the node's,
/// since libibverbs finds `/dev/infiniband/uverbsN` from sysfs, which the container
/// shares) and its number.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFile {
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

impl DeviceFile {
    /// From a sysfs `dev` file's text (`231:193`).
    pub fn from_dev(path: &str, dev: &str) -> Option<DeviceFile> {
        let (major, minor) = dev.trim().split_once(':')?;
        Some(DeviceFile {
            path: path.into(),
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }
}

/// Give the container these device files: made in its /dev (read-write for its users)
/// and allowed by its device cgroup, each one alone.
pub fn give(config: &mut Value, devices: &[DeviceFile]) {
    let linux = &mut config["linux"];
    if !linux["devices"].is_array() {
        linux["devices"] = json!([]);
    }
    if !linux["resources"].is_object() {
        linux["resources"] = json!({});
    }
    if !linux["resources"]["devices"].is_array() {
        linux["resources"]["devices"] = json!([]);
    }
    for d in devices {
        if let Some(v) = linux["devices"].as_array_mut() {
            v.retain(|e| e["path"] != d.path.as_str());
            v.push(json!({
                "path": d.path,
                "type": "c",
                "major": d.major,
                "minor": d.minor,
                "fileMode": 0o666,
                "uid": 0,
                "gid": 0,
            }));
        }
        if let Some(v) = linux["resources"]["devices"].as_array_mut() {
            v.push(json!({
                "allow": true,
                "type": "c",
                "major": d.major,
                "minor": d.minor,
                "access": "rwm",
            }));
        }
    }
}

/// Where a pod's measuring container finds its rxe devices' transport counters: its
/// sysfs (in the pod's network namespace) shows a device of the node's only as a compat
/// entry without `hw_counters`, and the RDMA netlink that `rdma statistic` reads is taken
/// from it ([`crate::shape::deny_rdma_netlink`]); the agent binds each device's
/// `hw_counters` there, read-only (`<COUNTERS_IN_POD>/<device>`).
pub const COUNTERS_IN_POD: &str = "/run/iblab/hw_counters";

/// Bind `device`'s transport counters (the node's `hw_counters` folder) read-only into the
/// container at [`COUNTERS_IN_POD`].
pub fn give_counters(config: &mut Value, device: &str, source: &str) {
    if !config["mounts"].is_array() {
        config["mounts"] = json!([]);
    }
    if let Some(m) = config["mounts"].as_array_mut() {
        m.push(json!({
            "destination": format!("{COUNTERS_IN_POD}/{device}"),
            "type": "bind",
            "source": source,
            "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
        }));
    }
}

/// One line for runc's log in its format, which the shim reads a failure's reason from.
pub fn log_line(json_format: bool, msg: &str) -> String {
    if json_format {
        format!(
            "{}\n",
            json!({"level": "error", "msg": msg, "time": "1970-01-01T00:00:00Z"})
        )
    } else {
        format!("level=error msg={msg:?}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn reads_the_shims_create_call() {
        let c = RuncCall::parse(&words(
            "--root /run/containerd/runc/k8s.io --log /run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/log.json \
             --log-format json create --bundle /run/containerd/io.containerd.runtime.v2.task/k8s.io/abc \
             --pid-file /run/x/init.pid abc",
        ));
        assert_eq!(c.subcommand.as_deref(), Some("create"));
        assert_eq!(
            c.bundle.unwrap().to_str(),
            Some("/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc")
        );
        assert!(c.log_json);
        assert!(c.log.unwrap().ends_with("log.json"));
        assert_eq!(c.id.as_deref(), Some("abc"));
        assert_eq!(
            c.root.unwrap().to_str(),
            Some("/run/containerd/runc/k8s.io")
        );
        let c = RuncCall::parse(&words("--root=/r --debug create -b=/b --no-pivot x"));
        assert_eq!(c.bundle.unwrap().to_str(), Some("/b"));
        let c = RuncCall::parse(&words("--root /r state abc"));
        assert_eq!(c.subcommand.as_deref(), Some("state"));
        assert!(c.bundle.is_none());
        // `--log` is a global flag's value, never the subcommand.
        let c = RuncCall::parse(&words("--log create start abc"));
        assert_eq!(c.subcommand.as_deref(), Some("start"));
    }

    fn config(name: &str, roce: Option<&str>) -> Value {
        let mut ann = json!({
            CONTAINER_TYPE: "container",
            CONTAINER_NAME: name,
            SANDBOX_NAME: "a",
            SANDBOX_NAMESPACE: "iblab-r1",
        });
        if let Some(r) = roce {
            ann[ANNOTATION] = json!(r);
        }
        json!({
            "annotations": ann,
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "network", "path": "/proc/42/ns/net"}],
                "resources": {"devices": [{"allow": false, "access": "rwm"}]}
            }
        })
    }

    const ROCE: &str = r#"{"underlay":"eth0","links":[{"name":"eth1","mtu":1500,"vni":4000,"port":4789}],"rxe":[{"device":"a-rxe0-r1","netdev":"eth1"}]}"#;

    #[test]
    fn every_container_of_a_pod_that_asks_is_ours_and_only_a_lab_pods() {
        assert!(target(&config("node", None)).is_none());
        let mut sandbox = config("node", Some(ROCE));
        sandbox["annotations"][CONTAINER_TYPE] = json!("sandbox");
        assert!(target(&sandbox).is_none());
        let t = target(&config("node", Some(ROCE))).unwrap().unwrap();
        assert_eq!((t.pod.as_str(), t.role), ("iblab-r1/a", Role::Node));
        assert_eq!(t.netns, "/proc/42/ns/net");
        assert_eq!(t.spec.rxe[0].device, "a-rxe0-r1");
        let shell = target(&config("shell", Some(ROCE))).unwrap().unwrap();
        assert_eq!(shell.role, Role::Shell);
        let bad = target(&config("node", Some("{}")))
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(bad.contains("iblab-r1/a"), "{bad}");
        let other = target(&config("miner", Some(ROCE)))
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            other.contains("not a lab pod") && other.contains("`miner`"),
            "{other}"
        );
        let mut host_net = config("node", Some(ROCE));
        host_net["linux"]["namespaces"] = json!([{"type": "pid"}]);
        let e = target(&host_net).unwrap().unwrap_err().to_string();
        assert!(e.contains("no network namespace of its own"), "{e}");
    }

    #[test]
    fn gives_each_device_alone_after_the_runtimes_deny_all() {
        let mut c = config("node", Some(ROCE));
        let uverbs = DeviceFile::from_dev("/dev/infiniband/uverbs1", "231:193\n").unwrap();
        let cm = DeviceFile::from_dev("/dev/infiniband/rdma_cm", "10:58").unwrap();
        give(&mut c, &[uverbs.clone(), cm]);
        let devices = c["linux"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0]["major"], 231);
        assert_eq!(devices[0]["minor"], 193);
        assert_eq!(devices[0]["type"], "c");
        let rules = c["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules[0]["allow"], false, "the deny-all stays first");
        assert_eq!(
            rules[1],
            json!({"allow": true, "type": "c", "major": 231, "minor": 193, "access": "rwm"})
        );
        // Given twice (a retried create), the file is listed once.
        give(&mut c, &[uverbs]);
        assert_eq!(c["linux"]["devices"].as_array().unwrap().len(), 2);
        assert!(DeviceFile::from_dev("x", "231").is_none());
    }

    #[test]
    fn a_failure_reads_as_runc_writes_it() {
        let l = log_line(true, "no rxe");
        let v: Value = serde_json::from_str(l.trim()).unwrap();
        assert_eq!(
            (v["level"].as_str(), v["msg"].as_str()),
            (Some("error"), Some("no rxe"))
        );
    }
}
