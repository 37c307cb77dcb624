//! qemu: the command line of one node's microVM, and whether KVM really works here
//! (decided by booting the guest kernel under KVM once, not by looking at /dev/kvm).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::image::{Image, cache_dir};
use crate::agent::proto::PORT_NAME;
use iblab_sys::process;

pub const QEMU: &str = "qemu-system-x86_64";

/// Guest memory in MiB for a lab of `nodes` nodes (`$IBLAB_VM_MEMORY_MB`, else 384 plus
/// 64 a node, rounded up to a size class of 1 GiB). The initramfs is unpacked into RAM;
/// the rest holds every node's tools and their registered buffers. Under TCG the host
/// commits only what the guest touches, and a snapshot holds only the pages the guest
/// wrote, so one class fits every lab of up to 10 nodes with one booted-guest snapshot.
pub fn memory_mb(nodes: usize) -> u32 {
    std::env::var("IBLAB_VM_MEMORY_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|m| *m >= 256)
        .unwrap_or_else(|| (384 + 64 * nodes.min(64) as u32).div_ceil(1024) * 1024)
}

/// Virtual CPUs (`$IBLAB_VM_CPUS`, else every host core, at most 2 under TCG and 4 under
/// KVM). Under TCG one vCPU carries both ends of every transfer, and on the 2-core machines
/// this is developed on that made RoCE ~10× slower than two (measured 2026-12-01: rxe
/// 7–8 Mbit/s with one vCPU, 73 with two, TCP 26 against 114), below lesson 5's
/// bottleneck. Two vCPUs under multi-threaded TCG once raced the guest kernel's live code
/// patching into its int3 ("Oops: int3" in crng_make_state, 1 run in 6 of lesson 5): the
/// static key flipped when the RNG became ready, at run time. The guest therefore gets an
/// emulated CPU with RDRAND (`-cpu max`) and `random.trust_cpu=on`, so its RNG is ready
/// during early boot, before the second vCPU starts.
pub fn vcpus(accel: &str) -> usize {
    if let Some(n) = std::env::var("IBLAB_VM_CPUS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..=16).contains(n))
    {
        return n;
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    match accel {
        "kvm" => cores.clamp(1, 4),
        _ => cores.clamp(1, 2),
    }
}

/// The `-accel` value: TCG multi-threaded (one host thread per vCPU).
fn accel_arg(accel: &str) -> String {
    match accel {
        "tcg" => "tcg,thread=multi".into(),
        a => a.to_string(),
    }
}

/// qemu option values escape commas by doubling them.
fn opt_path(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// What the lab's VM needs. It has no NIC: the lab's links are veth pairs inside it.
pub struct VmSpec<'a> {
    pub name: &'a str,
    pub accel: &'a str,
    pub image: &'a Image,
    pub initrd: &'a Path,
    pub socket: &'a Path,
    pub console_log: &'a Path,
    pub memory_mb: u32,
    /// qemu's QMP socket (to save the booted guest).
    pub qmp: &'a Path,
    /// Restore the guest from a snapshot given as qemu's stdin instead of booting it.
    pub incoming: bool,
    /// Which boot of the lab's VM this is (1 first). A boot after a failed one has the
    /// kernel say everything on the console (`loglevel=7`), to show how far it gets.
    pub attempt: usize,
}

/// How a test makes boot `attempt` fail on purpose (`$IBLAB_VM_TEST_FAIL_BOOTS`, e.g.
/// `hang,crash`: the first boot's agent parks without a hello, the second's exits, so
/// that its kernel panics): the kernel argument that tells the agent, if any.
fn test_failure(attempt: usize) -> Option<String> {
    let list = std::env::var("IBLAB_VM_TEST_FAIL_BOOTS").ok()?;
    let how = list.split(',').nth(attempt.checked_sub(1)?)?.trim();
    matches!(how, "hang" | "crash").then(|| format!(" iblab.test.fail_boot={how}"))
}

/// The qemu argument vector of the lab's VM.
pub fn argv(spec: &VmSpec<'_>) -> Vec<String> {
    let mut v: Vec<String> = [
        QEMU,
        "-name",
        spec.name,
        "-accel",
        &accel_arg(spec.accel),
        "-smp",
        &vcpus(spec.accel).to_string(),
        "-m",
        &spec.memory_mb.to_string(),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-monitor",
        "none",
        "-no-reboot",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if spec.accel == "tcg" {
        // RDRAND, so that `random.trust_cpu=on` readies the RNG before the second vCPU.
        v.extend(["-cpu".into(), "max".into()]);
    }
    v.push("-serial".into());
    v.push(format!("file:{}", opt_path(spec.console_log)));
    v.push("-kernel".into());
    v.push(spec.image.kernel.to_string_lossy().into_owned());
    v.push("-initrd".into());
    v.push(spec.initrd.to_string_lossy().into_owned());
    v.push("-append".into());
    v.push(kernel_cmdline(spec.attempt));
    v.push("-chardev".into());
    v.push(format!(
        "socket,id=agent,path={},server=on,wait=off",
        opt_path(spec.socket)
    ));
    v.push("-device".into());
    v.push("virtio-serial-pci".into());
    v.push("-device".into());
    v.push(format!("virtserialport,chardev=agent,name={PORT_NAME}"));
    v.push("-qmp".into());
    v.push(format!("unix:{},server=on,wait=off", opt_path(spec.qmp)));
    if spec.incoming {
        v.push("-incoming".into());
        v.push("fd:0".into());
    }
    v
}

/// Whether boot `attempt` is an ordinary boot, the same for every lab (so that it can be
/// saved as the booted-guest snapshot, or be replaced by restoring it): not a retry after
/// a failed boot, and no test asks it to fail.
pub fn ordinary_boot(attempt: usize) -> bool {
    attempt == 1 && test_failure(1).is_none()
}

/// The guest kernel's command line for boot `attempt`. It names no lab: the run's identity
/// reaches the guest through the agent after boot or restore.
pub fn kernel_cmdline(attempt: usize) -> String {
    format!(
        // mitigations=off: the guest is a disposable lab that runs only its own tools, and
        // page-table isolation on every kernel entry is costly under TCG.
        // `$IBLAB_VM_KERNEL_ARGS` adds to it (e.g. `loglevel=7` to see the boot in
        // logs/vm.console.log).
        // workqueue.unbound_cpus=0: rxe does its transport work in an unbound workqueue;
        // spread over two vCPUs its packets entered the veths from both CPUs' backlogs and
        // arrived out of order (out-of-sequence NAKs and retries through lesson 5's
        // lossless bottleneck, measured); on CPU 0 alone they keep their order.
        "console=ttyS0 quiet panic=-1 mitigations=off random.trust_cpu=on \
         workqueue.unbound_cpus=0{}{}{} -- agent",
        if attempt > 1 { " loglevel=7" } else { "" },
        test_failure(attempt).unwrap_or_default(),
        std::env::var("IBLAB_VM_KERNEL_ARGS")
            .map(|a| format!(" {}", a.trim()))
            .unwrap_or_default()
    )
}

/// Which accelerator to use, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Accel {
    pub name: String,
    pub reason: String,
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn probe_file() -> PathBuf {
    cache_dir().join(format!("accel-{}.json", boot_id()))
}

/// The verdict of an earlier probe since this host booted, if any.
pub fn known_accel() -> Option<Accel> {
    let text = std::fs::read_to_string(probe_file()).ok()?;
    serde_json::from_str(&text).ok()
}

/// KVM when booting the guest kernel under it reaches the kernel's first messages within
/// a few seconds; TCG otherwise. Cached per host boot. `work` holds the probe's console.
pub async fn choose_accel(image: &Image, work: &Path) -> Accel {
    if let Ok(v) = std::env::var("IBLAB_VM_ACCEL")
        && (v == "kvm" || v == "tcg")
    {
        return Accel {
            name: v,
            reason: "set by IBLAB_VM_ACCEL".into(),
        };
    }
    if let Some(a) = known_accel() {
        return a;
    }
    let accel = probe(image, work).await;
    if let Ok(text) = serde_json::to_string(&accel) {
        let _ = std::fs::create_dir_all(cache_dir());
        let _ = std::fs::write(probe_file(), text);
    }
    accel
}

async fn probe(image: &Image, work: &Path) -> Accel {
    let kvm = Path::new("/dev/kvm");
    if !kvm.exists() {
        return Accel {
            name: "tcg".into(),
            reason: "no /dev/kvm: software emulation (TCG)".into(),
        };
    }
    let console = work.join("kvm-probe.console");
    let argv: Vec<String> = vec![
        QEMU.into(),
        "-accel".into(),
        "kvm".into(),
        "-m".into(),
        "128".into(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-monitor".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!("file:{}", opt_path(&console)),
        "-kernel".into(),
        image.kernel.to_string_lossy().into_owned(),
        "-append".into(),
        "console=ttyS0 panic=-1".into(),
    ];
    // Without an initrd a working guest panics (no root) within a second and qemu exits.
    let out = process::run(&argv, None, Duration::from_secs(5)).await;
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let _ = std::fs::remove_file(&console);
    let booted = text.contains("Linux version") || text.contains("Kernel panic");
    match out {
        Ok(_) if booted => Accel {
            name: "kvm".into(),
            reason: "KVM works: the guest kernel booted under it".into(),
        },
        Ok(o) => Accel {
            name: "tcg".into(),
            reason: format!(
                "/dev/kvm is present but a guest does not boot under it ({}): software emulation (TCG)",
                if o.timed_out {
                    "no kernel output within 5s".to_string()
                } else {
                    o.stderr.lines().last().unwrap_or("qemu failed").to_string()
                }
            ),
        },
        Err(e) => Accel {
            name: "tcg".into(),
            reason: format!("cannot run {QEMU} to try KVM ({e}): software emulation (TCG)"),
        },
    }
}
