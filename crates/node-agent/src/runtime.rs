//! The wrapper around runc, on the node: containerd's runtime handler for path ② lab pods
//! (a RuntimeClass) runs it instead of runc. On `create` of a lab pod's measuring
//! container it makes, in the pod's network namespace (which exists since the sandbox's
//! CNI setup), the pod's lab links and its own rxe devices, then adds exactly those
//! devices' verbs files (and `rdma_cm`) to the container's spec before runc creates it:
//! the container needs no privilege and sees no other device. Every other call goes to
//! runc untouched. The devices go with the pod: deleting the sandbox deletes its network
//! namespace, its interfaces, and the rxe devices on them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::oci::{self, DeviceFile, RuncCall, Target};

/// Where the node keeps a line per pod it prepared (and why one failed).
pub const LOG: &str = "/var/log/iblab-node-runtime.log";
/// The verbs files' class in sysfs: `uverbsN/ibdev` names the device, `uverbsN/dev` its
/// number.
const UVERBS_CLASS: &str = "/sys/class/infiniband_verbs";
/// The RDMA CM's file, which rping and perftest's `-R` open.
const RDMA_CM_SYSFS: &str = "/sys/class/misc/rdma_cm/dev";
const RDMA_CM: &str = "/dev/infiniband/rdma_cm";
/// How long a new device's verbs file may take to appear.
const APPEAR_WITHIN: Duration = Duration::from_secs(5);

/// What the wrapper did with a call, for its log.
pub enum Done {
    /// Not a lab pod's measuring container: runc goes on as asked.
    Untouched,
    /// Prepared: these devices were made and given.
    Prepared {
        pod: String,
        devices: Vec<DeviceFile>,
    },
}

/// Before runc runs: prepare a lab pod's measuring container if this call creates one.
/// `Err`: the reason the container must not be created (also written to runc's log file,
/// where the shim reads a failure's reason, so the pod's events say it).
pub fn before_runc(args: &[String]) -> Result<Done, String> {
    let call = RuncCall::parse(args);
    if call.subcommand.as_deref() != Some("create") {
        return Ok(Done::Untouched);
    }
    let bundle = call.bundle.clone().unwrap_or_else(|| PathBuf::from("."));
    let path = bundle.join("config.json");
    // runc says what is wrong with a bundle it cannot read.
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Done::Untouched);
    };
    let Ok(mut config) = serde_json::from_str::<Value>(&text) else {
        return Ok(Done::Untouched);
    };
    let Some(target) = oci::target(&config) else {
        return Ok(Done::Untouched);
    };
    let result = target.and_then(|t| {
        let devices = prepare(&t).map_err(|e| format!("pod {}: {e}", t.pod))?;
        oci::give(&mut config, &devices);
        let tmp = bundle.join("config.json.iblab");
        std::fs::write(&tmp, config.to_string())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(Done::Prepared {
            pod: t.pod,
            devices,
        })
    });
    if let Err(e) = &result
        && let Some(log) = &call.log
    {
        let msg = format!("iblab node runtime: {e}");
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(oci::log_line(call.log_json, &msg).as_bytes()));
    }
    result
}

/// Append a line to the node's log of what the wrapper did (best effort).
pub fn note(line: &str) {
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOG)
        .and_then(|mut f| writeln!(f, "{line}"));
}

/// A program of the node, by name: where PATH or the usual folders have it.
fn program(name: &str) -> Result<PathBuf, String> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("the node has no `{name}` (it is needed to make a pod's rxe)"))
}

/// Run `argv` in the network namespace at `netns` (nsenter), with `stdin`.
fn in_netns(netns: &str, argv: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let nsenter = program("nsenter")?;
    let prog = program(argv[0])?;
    let mut child = Command::new(&nsenter)
        .arg(format!("--net={netns}"))
        .arg("--")
        .arg(&prog)
        .args(&argv[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", nsenter.display()))?;
    if let (Some(text), Some(mut w)) = (stdin, child.stdin.take()) {
        let _ = w.write_all(text.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", argv.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` in the pod's network namespace failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The verbs file of the device named `ibdev`, once it is there.
fn uverbs_of(ibdev: &str) -> Result<DeviceFile, String> {
    let deadline = Instant::now() + APPEAR_WITHIN;
    loop {
        for e in std::fs::read_dir(UVERBS_CLASS)
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = e.path();
            let named = std::fs::read_to_string(dir.join("ibdev")).unwrap_or_default();
            if named.trim() != ibdev {
                continue;
            }
            let dev = std::fs::read_to_string(dir.join("dev")).unwrap_or_default();
            let file = format!("/dev/infiniband/{}", e.file_name().to_string_lossy());
            if let Some(d) = DeviceFile::from_dev(&file, &dev) {
                return Ok(d);
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no verbs file for {ibdev} appeared in {UVERBS_CLASS} within {} s",
                APPEAR_WITHIN.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Make the pod's links and rxe devices in its network namespace; the device files to
/// give its container.
fn prepare(t: &Target) -> Result<Vec<DeviceFile>, String> {
    let ns = t.netns.as_str();
    if let Some(script) = t.spec.rename() {
        in_netns(ns, &["sh", "-c", &script], None)?;
    }
    let lines = t.spec.link_lines();
    if !lines.is_empty() {
        in_netns(ns, &["ip", "-batch", "-"], Some(&(lines.join("\n") + "\n")))?;
    }
    let mut files = Vec::new();
    for r in &t.spec.rxe {
        // A name that exists is refused by the kernel: a pod never gets a device it did
        // not make here.
        in_netns(
            ns,
            &[
                "rdma", "link", "add", &r.device, "type", "rxe", "netdev", &r.netdev,
            ],
            None,
        )?;
        files.push(uverbs_of(&r.device)?);
    }
    if !t.spec.rxe.is_empty() {
        let cm = std::fs::read_to_string(RDMA_CM_SYSFS).map_err(|e| {
            format!("the node has no RDMA CM ({RDMA_CM_SYSFS}: {e}; modprobe rdma_ucm)")
        })?;
        files.push(
            DeviceFile::from_dev(RDMA_CM, &cm)
                .ok_or_else(|| format!("{RDMA_CM_SYSFS} says {cm:?}"))?,
        );
    }
    Ok(files)
}

/// `iblab node-runtime --runc RUNC -- ARGS…`: what containerd's runtime handler runs in
/// place of runc. Prepares a lab pod's measuring container if this call creates one, then
/// becomes runc with the same arguments; exit 1 (with the reason in runc's log) if the
/// pod's devices cannot be made.
pub fn main(runc: &Path, args: &[String]) -> i32 {
    use std::os::unix::process::CommandExt;
    match before_runc(args) {
        Ok(Done::Untouched) => {}
        Ok(Done::Prepared { pod, devices }) => note(&format!(
            "pod {pod}: made its links and rxe, gave {}",
            devices
                .iter()
                .map(|d| format!("{} ({}:{})", d.path, d.major, d.minor))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Err(e) => {
            note(&format!("refused: {e}"));
            eprintln!("iblab node runtime: {e}");
            return 1;
        }
    }
    let e = Command::new(runc).args(args).exec();
    eprintln!("iblab node runtime: cannot run {}: {e}", runc.display());
    127
}

/// The script containerd's runtime handler names as its runc (`BinaryName`): it runs
/// `iblab` from `dir` (as the node sees it) as the wrapper around `runc`.
pub fn handler_script(dir: &str, runc: &str) -> String {
    format!(
        "#!/bin/sh\n# containerd's runtime handler for path ②'s lab pods (iblab's node agent): \
         runc, with each lab pod's links and rxe made first.\nexec {dir}/iblab node-runtime --runc {runc} -- \"$@\"\n"
    )
}
