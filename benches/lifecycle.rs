//! Benchmark (not a test): bring-up, teardown and the orchestrator's own overhead of
//! `iblab up` on the local backend, for labs of growing size. Needs root.
//! Run: `cargo bench --bench lifecycle` (prints a table; BENCHMARKS.md keeps the numbers).
//! `IBLAB_BENCH_BACKEND=kube` measures the kube backend instead (KUBECONFIG pointing at a
//! cluster with the lab image, e.g. the one `kube/cluster up` starts), for 2 and 8 nodes.
//! `IBLAB_BENCH_BACKEND=vm` measures the vm backend instead (paths tcp and roce, so the
//! time to the first step includes every node's rxe), for 2, 4 and 8 nodes, with the
//! spread: runs restored from the booted-guest snapshot alternate with cold boots
//! (`IBLAB_VM_SNAPSHOT=0`); `IBLAB_BENCH_REPEAT` sets the number of runs per size and way.

use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");
const REPEAT: usize = 5;

fn lab(nodes: usize, roce: bool) -> String {
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    let links: Vec<String> = names
        .iter()
        .map(|n| format!("      - {{ ends: [{n}, sw1] }}"))
        .collect();
    format!(
        "apiVersion: iblab.dev/v1\nkind: Lab\nmetadata: {{ name: bench{nodes}, title: lifecycle benchmark }}\nspec:\n  topology:\n    nodes: [{}]\n    switches: [sw1]\n    links:\n{}\n{}  steps:\n    - id: probe\n      exec: {{ node: n0, command: [ping, -c1, -W1, \"{{{{ nodes.n{}.ip }}}}\"] }}\n",
        names.join(", "),
        links.join("\n"),
        if roce { "  paths: [tcp, roce]\n" } else { "" },
        nodes - 1
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// One `iblab up LAB --backend B --out OUT`, which must pass: its wall time and evidence.
fn up(
    lab: &std::path::Path,
    backend: &str,
    out: &std::path::Path,
    state: &std::path::Path,
    env: &[(&str, &str)],
) -> (f64, serde_json::Value) {
    let t = Instant::now();
    let st = Command::new(BIN)
        .arg("up")
        .arg(lab)
        .args(["--backend", backend, "--out"])
        .arg(out)
        .env("IBLAB_STATE_DIR", state)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let wall = t.elapsed().as_secs_f64();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stdout)
    );
    let text = std::fs::read_to_string(out.join("evidence.json")).unwrap();
    (wall, serde_json::from_str(&text).unwrap())
}

/// The vm backend: time from `iblab up` to its first step (provision, link check, fabric
/// setup: every node's rxe), per lab size and way (restored from the snapshot, or booted),
/// alternating, median and range. One unmeasured run first makes the snapshot (the image
/// is cached by then: run the bench once before to warm it).
fn vm(dir: &std::path::Path) {
    let repeat: usize = std::env::var("IBLAB_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REPEAT);
    println!(
        "{:>6} {:>9} {:>22} {:>22} {:>12} {:>12}",
        "nodes", "VM", "to first step (range)", "vm start (range)", "wire", "rxe setup"
    );
    for nodes in [2usize, 4, 8] {
        let file = dir.join(format!("vm{nodes}.yaml"));
        std::fs::write(&file, lab(nodes, true)).unwrap();
        let _ = up(
            &file,
            "vm",
            &dir.join(format!("vm{nodes}-warm")),
            &dir.join("state"),
            &[],
        );
        let ways = [("restored", "1"), ("booted", "0")];
        let mut rows: Vec<[Vec<f64>; 4]> = vec![Default::default(), Default::default()];
        for i in 0..repeat {
            for (w, (_, flag)) in ways.iter().enumerate() {
                let out = dir.join(format!("vm{nodes}-{i}-{flag}"));
                let (_, e) = up(
                    &file,
                    "vm",
                    &out,
                    &dir.join("state"),
                    &[("IBLAB_VM_SNAPSHOT", flag)],
                );
                let t = &e["timings"];
                let f = |k: &str| t[k].as_f64().unwrap_or(0.0);
                let r = &mut rows[w];
                r[0].push(
                    f("provision_s")
                        + f("link_check_s")
                        + f("setup_ethernet_s")
                        + f("setup_softroce_s"),
                );
                r[1].push(f("vm_boot_s"));
                r[2].push(f("vm_wire_s"));
                r[3].push(f("setup_softroce_s"));
            }
        }
        for ((way, _), [first, boot, wire, rxe]) in ways.iter().zip(rows) {
            let (fl, fh) = spread(&first);
            let (bl, bh) = spread(&boot);
            println!(
                "{nodes:>6} {way:>9} {:>7.2} s ({fl:.2}–{fh:.2}) {:>7.2} s ({bl:.2}–{bh:.2}) {:>10.2} s {:>10.2} s",
                median(first.clone()),
                median(boot.clone()),
                median(wire),
                median(rxe)
            );
        }
    }
}

fn main() {
    if !std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    {
        eprintln!("the lifecycle benchmark needs root (it creates namespaces)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("iblab-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if std::env::var("IBLAB_BENCH_BACKEND").as_deref() == Ok("vm") {
        vm(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let backend = std::env::var("IBLAB_BENCH_BACKEND").unwrap_or_else(|_| "local".into());
    let sizes: &[usize] = if backend == "local" {
        &[2, 8, 32]
    } else {
        &[2, 8]
    };
    println!("backend {backend}, median of {REPEAT}");
    println!(
        "{:>6} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "nodes", "provision", "steps", "teardown", "overhead", "wall"
    );
    for &nodes in sizes {
        let file = dir.join(format!("bench{nodes}.yaml"));
        std::fs::write(&file, lab(nodes, false)).unwrap();
        let (mut prov, mut steps, mut down, mut over, mut wall) =
            (vec![], vec![], vec![], vec![], vec![]);
        for i in 0..REPEAT {
            let out = dir.join(format!("run{nodes}-{i}"));
            let (w, e) = up(&file, &backend, &out, &dir.join("state"), &[]);
            let t = &e["timings"];
            let (p, s, d) = (
                t["provision_s"].as_f64().unwrap(),
                t["steps_s"].as_f64().unwrap(),
                t["teardown_s"].as_f64().unwrap(),
            );
            prov.push(p);
            steps.push(s);
            down.push(d);
            // Everything the binary spent that was not the lab's own work or its bring-up/teardown.
            over.push(w - p - s - d);
            wall.push(w);
        }
        println!(
            "{nodes:>6} {:>10.3} s {:>10.3} s {:>10.3} s {:>10.3} s {:>10.3} s",
            median(prov),
            median(steps),
            median(down),
            median(over),
            median(wall)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
