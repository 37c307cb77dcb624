//! Benchmark (not a test): bring-up, teardown and the orchestrator's own overhead of
//! `iblab up` on the local backend, for labs of growing size. Needs root.
//! Run: `cargo bench --bench lifecycle` (prints a table; BENCHMARKS.md keeps the numbers).
//! `IBLAB_BENCH_BACKEND=kube` measures the kube backend instead (KUBECONFIG pointing at a
//! cluster with the lab image, e.g. the one `kube/cluster up` starts), for 2 and 8 nodes.

use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");
const REPEAT: usize = 5;

fn lab(nodes: usize) -> String {
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    let links: Vec<String> = names
        .iter()
        .map(|n| format!("      - {{ ends: [{n}, sw1] }}"))
        .collect();
    format!(
        "apiVersion: iblab.dev/v1\nkind: Lab\nmetadata: {{ name: bench{nodes}, title: lifecycle benchmark }}\nspec:\n  topology:\n    nodes: [{}]\n    switches: [sw1]\n    links:\n{}\n  steps:\n    - id: probe\n      exec: {{ node: n0, command: [ping, -c1, -W1, \"{{{{ nodes.n{}.ip }}}}\"] }}\n",
        names.join(", "),
        links.join("\n"),
        nodes - 1
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
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
        std::fs::write(&file, lab(nodes)).unwrap();
        let (mut prov, mut steps, mut down, mut over, mut wall) =
            (vec![], vec![], vec![], vec![], vec![]);
        for i in 0..REPEAT {
            let out = dir.join(format!("run{nodes}-{i}"));
            let t = Instant::now();
            let st = Command::new(BIN)
                .arg("up")
                .arg(&file)
                .arg("--out")
                .arg(&out)
                .args(["--backend", &backend])
                .env("IBLAB_STATE_DIR", dir.join("state"))
                .output()
                .unwrap();
            let w = t.elapsed().as_secs_f64();
            assert!(
                st.status.success(),
                "{}",
                String::from_utf8_lossy(&st.stdout)
            );
            let e: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(out.join("evidence.json")).unwrap())
                    .unwrap();
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
