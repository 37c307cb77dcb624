//! Benchmark (not a test): `iblab up` against a hand-written script doing the same work,
//! run alternately in one process so that both see the same machine. The work: two nodes
//! on one switch, wired, addressed, one ping from a to b, everything removed again.
//!
//! - `cargo bench --bench versus_script` (local): the script is shell with `ip netns`,
//!   veth pairs and a bridge, as anyone would write it.
//! - `IBLAB_BENCH_BACKEND=vm cargo bench --bench versus_script`: the script boots the very
//!   kernel and initramfs of iblab's cached VM image with a shell as init, loads the same
//!   modules with insmod, wires the same namespaces and pings; iblab boots its agent
//!   instead and drives the guest from the host.
//!
//! `IBLAB_BENCH_REPEAT` sets the pairs of runs (10 local, 5 vm). Prints the median, the
//! spread (min–max) and the ratio of the medians. Needs root. BENCHMARKS.md keeps the
//! figures and the method.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");

const LAB: &str = r#"apiVersion: iblab.dev/v1
kind: Lab
metadata: { name: bench-ping, title: "two nodes, one switch, one ping" }
spec:
  topology:
    nodes: [a, b]
    switches: [sw1]
    links:
      - { ends: [a, sw1] }
      - { ends: [b, sw1] }
  paths: [tcp]
  steps:
    - id: ping
      exec: { node: a, command: [ping, -c1, -W2, "{{ nodes.b.ip }}"] }
"#;

/// The local work by hand: namespaces, two veth pairs into a bridge, addresses, a ping,
/// and teardown (deleting a namespace takes its veths with it).
fn local_script(tag: &str) -> String {
    format!(
        r#"set -e
a={tag}a; b={tag}b; s={tag}s
trap 'ip netns del $a 2>/dev/null; ip netns del $b 2>/dev/null; ip netns del $s 2>/dev/null' EXIT
ip netns add $a; ip netns add $b; ip netns add $s
ip -n $s link add br0 type bridge
ip link add eth0 netns $a type veth peer p1 netns $s
ip link add eth0 netns $b type veth peer p2 netns $s
ip -n $s link set p1 master br0 up
ip -n $s link set p2 master br0 up
ip -n $s link set br0 up
ip -n $a addr add 198.18.0.1/24 dev eth0; ip -n $a link set eth0 up; ip -n $a link set lo up
ip -n $b addr add 198.18.0.2/24 dev eth0; ip -n $b link set eth0 up; ip -n $b link set lo up
ip netns exec $a ping -c1 -W2 198.18.0.2 >/dev/null
echo PINGED
"#
    )
}

/// The same work inside one VM, as the guest's init: a shell given on the kernel command
/// line (so nothing but the cached image is needed).
const VM_SCRIPT: &str = "busybox mount -t proc p /proc; busybox mount -t sysfs s /sys; \
for m in $(busybox cat /etc/iblab/modules); do busybox insmod $m; done; I=/usr/bin/ip; \
$I link set lo up; for n in a b sw1; do $I netns add $n; done; \
$I link add eth0 netns a type veth peer p1 netns sw1; $I link add eth0 netns b type veth peer p2 netns sw1; \
$I -n sw1 link add br0 type bridge; $I -n sw1 link set p1 master br0 up; \
$I -n sw1 link set p2 master br0 up; $I -n sw1 link set br0 up; \
$I -n a addr add 198.18.0.1/24 dev eth0; $I -n a link set eth0 up; \
$I -n b addr add 198.18.0.2/24 dev eth0; $I -n b link set eth0 up; \
$I netns exec a busybox ping -c1 -W5 198.18.0.2 >/dev/null && echo PINGED; busybox poweroff -f";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (min, max)
}

/// One `iblab up`: its wall time and its time from start to the first step.
fn iblab(lab: &Path, backend: &str, out: &Path, state: &Path) -> (f64, f64) {
    let t = Instant::now();
    let st = Command::new(BIN)
        .arg("up")
        .arg(lab)
        .args(["--backend", backend, "--out"])
        .arg(out)
        .env("IBLAB_STATE_DIR", state)
        .output()
        .unwrap();
    let wall = t.elapsed().as_secs_f64();
    assert!(
        st.status.success(),
        "iblab up failed: {}{}",
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("evidence.json")).unwrap()).unwrap();
    let first_step = e["steps"][0]["started_s"].as_f64().unwrap_or(f64::NAN);
    let _ = std::fs::remove_dir_all(out);
    (wall, first_step)
}

/// The cached image iblab's run used (its key is in the run's notes).
fn image_of(evidence: &Path) -> PathBuf {
    let text = std::fs::read_to_string(evidence).unwrap();
    let key = text
        .split("image ")
        .filter_map(|s| s.split_whitespace().next())
        .find(|k| k.len() == 16 && k.chars().all(|c| c.is_ascii_hexdigit()))
        .expect("the vm run names its image");
    let cache = std::env::var_os("IBLAB_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("iblab/vm")))
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/iblab/vm")
        });
    cache.join(format!("img-{key}"))
}

fn vm_script(img: &Path, console: &Path) -> f64 {
    let _ = std::fs::remove_file(console);
    // As iblab's VM under TCG: a vCPU per host core, at most 2 (`IBLAB_VM_CPUS` for both),
    // an emulated CPU with RDRAND and the RNG trusted in early boot.
    let cpus = std::env::var("IBLAB_VM_CPUS").unwrap_or_else(|_| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 2)
            .to_string()
    });
    let t = Instant::now();
    let st = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg,thread=multi", "-smp", &cpus, "-m", "512"])
        .args(["-cpu", "max"])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-monitor", "none", "-no-reboot", "-serial"])
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(img.join("vmlinux"))
        .arg("-initrd")
        .arg(img.join("base.cpio"))
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet panic=-1 mitigations=off random.trust_cpu=on \
             workqueue.unbound_cpus=0 rdinit=/usr/bin/sh -- -c \"{VM_SCRIPT}\""
        ))
        .output()
        .unwrap();
    let wall = t.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(console).unwrap_or_default();
    assert!(
        st.status.success() && text.contains("PINGED"),
        "the VM script did not ping: {text}"
    );
    wall
}

fn main() {
    if !is_root() {
        eprintln!("this benchmark needs root (it creates namespaces)");
        return;
    }
    let backend = std::env::var("IBLAB_BENCH_BACKEND").unwrap_or_else(|_| "local".into());
    let repeat: usize = std::env::var("IBLAB_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if backend == "vm" { 5 } else { 10 });
    let dir = std::env::temp_dir().join(format!("iblab-vs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lab = dir.join("bench-ping.yaml");
    std::fs::write(&lab, LAB).unwrap();
    let state = dir.join("state");

    // A first run that is not counted: it builds what a warm run finds cached.
    let warm = dir.join("warm");
    let st = Command::new(BIN)
        .arg("up")
        .arg(&lab)
        .args(["--backend", &backend, "--out"])
        .arg(&warm)
        .env("IBLAB_STATE_DIR", &state)
        .status()
        .unwrap();
    assert!(st.success(), "the warm-up run failed");
    let img = (backend == "vm").then(|| image_of(&warm.join("evidence.json")));

    let (mut ours, mut first, mut theirs) = (vec![], vec![], vec![]);
    for i in 0..repeat {
        let run_script = || match &img {
            Some(img) => vm_script(img, &dir.join("console.log")),
            None => {
                let t = Instant::now();
                let out = Command::new("bash")
                    .arg("-c")
                    .arg(local_script(&format!("ibs{}-", std::process::id())))
                    .output()
                    .unwrap();
                let wall = t.elapsed().as_secs_f64();
                assert!(
                    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("PINGED"),
                    "the script failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                wall
            }
        };
        // Alternate which goes first, so neither always runs on a warmer machine.
        let out = dir.join(format!("run{i}"));
        if i % 2 == 0 {
            let (w, f) = iblab(&lab, &backend, &out, &state);
            ours.push(w);
            first.push(f);
            theirs.push(run_script());
        } else {
            theirs.push(run_script());
            let (w, f) = iblab(&lab, &backend, &out, &state);
            ours.push(w);
            first.push(f);
        }
    }
    let (o, t) = (median(ours.clone()), median(theirs.clone()));
    let (omin, omax) = spread(&ours);
    let (tmin, tmax) = spread(&theirs);
    let (fmin, fmax) = spread(&first);
    println!("backend {backend}: 2 nodes, 1 switch, one ping; {repeat} pairs, median (min–max)");
    println!(
        "  iblab up          {:>8.3} s ({omin:.3}–{omax:.3})   first step at {:.3} s ({fmin:.3}–{fmax:.3})",
        o,
        median(first)
    );
    println!("  hand-written      {t:>8.3} s ({tmin:.3}–{tmax:.3})");
    println!("  ratio iblab/script {:>6.2}", o / t);
    let _ = std::fs::remove_dir_all(&dir);
}
