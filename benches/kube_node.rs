//! Benchmark (not a test): the test cluster's second node, the qemu guest on Linux 7.2
//! that `kube/cluster vm-node` starts (needs root, the cluster up with `kube/cluster up`,
//! and the lab and iblab images built: `iblab image build`, `iblab image build --operator`).
//! Run: `cargo bench --bench kube_node` (prints tables; BENCHMARKS.md keeps the numbers).
//!
//! - lesson 3 (`forgot-register-memory`, all three paths) on the kube backend, its pods on
//!   the VM node, against the same lab on the vm backend, alternating;
//! - a lab pod's start on the VM node (created to Ready, by the API's own timestamps);
//! - the VM node's boot: `vm-node down` then `vm-node up`, to Ready (as the script says),
//!   then the images into its containerd.
//!
//! `IBLAB_BENCH_REPEAT` sets the number of runs of each (default 3).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_iblab");

fn repeat() -> usize {
    std::env::var("IBLAB_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

fn script(args: &[&str]) -> String {
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("kube/cluster"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kube/cluster {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubeconfig() -> (String, String) {
    let env = script(&["env"]);
    let var = |k: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("export {k}=")))
            .unwrap_or_else(|| panic!("kube/cluster env has no {k}"))
            .to_string()
    };
    (var("KUBECONFIG"), var("IBLAB_KUBE_BIN"))
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "{:.1} s ({:.1}–{:.1})",
        v[v.len() / 2],
        v[0],
        v[v.len() - 1]
    )
}

/// One `iblab up` that must pass: its wall time, and the time to its first step.
fn up(args: &[&str], dir: &Path, kube: &(String, String)) -> (f64, f64) {
    let out = dir.join(format!("run-{}", rand_tag()));
    let t = Instant::now();
    let o = Command::new(BIN)
        .arg("up")
        .args(args)
        .arg("--out")
        .arg(&out)
        .env("IBLAB_STATE_DIR", dir.join("state"))
        .env("KUBECONFIG", &kube.0)
        .env("IBLAB_KUBE_BIN", &kube.1)
        .output()
        .unwrap();
    let wall = t.elapsed().as_secs_f64();
    assert!(
        o.status.success(),
        "iblab up {args:?}: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("evidence.json")).unwrap()).unwrap();
    let t = &e["timings"];
    let first = [
        "provision_s",
        "link_check_s",
        "setup_softroce_s",
        "setup_ibsim_s",
    ]
    .iter()
    .filter_map(|k| t[*k].as_f64())
    .sum();
    let _ = std::fs::remove_dir_all(&out);
    (wall, first)
}

fn rand_tag() -> String {
    format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// A pod of the lab image on the VM node, created to Ready by the API server's own
/// timestamps (creation, and the Ready condition's transition), deleted after.
fn pod_start(kube: &(String, String)) -> f64 {
    let kubectl = |args: &[&str]| {
        let o = Command::new(Path::new(&kube.1).join("kubectl"))
            .args(args)
            .env("KUBECONFIG", &kube.0)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let name = format!("bench-{}", rand_tag());
    let spec = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "iblab-vmnode"},
            "tolerations": [{"key": "iblab.dev/rxe-per-netns", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "node", "image": format!("iblab/lab:{}", env!("CARGO_PKG_VERSION")),
                "imagePullPolicy": "Never", "command": ["sleep", "infinity"]}]
        }
    });
    let file = std::env::temp_dir().join(format!("{name}.json"));
    std::fs::write(&file, spec.to_string()).unwrap();
    kubectl(&["create", "-f", file.to_str().unwrap()]);
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        &format!("pod/{name}"),
        "--timeout=300s",
    ]);
    let p: serde_json::Value =
        serde_json::from_str(&kubectl(&["get", "pod", &name, "-o", "json"])).unwrap();
    kubectl(&["delete", "pod", &name, "--wait=false"]);
    let _ = std::fs::remove_file(&file);
    let ts = |s: &str| humantime::parse_rfc3339(s).unwrap();
    let created = ts(p["metadata"]["creationTimestamp"].as_str().unwrap());
    let ready = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .map(ts)
        .unwrap();
    ready.duration_since(created).unwrap().as_secs_f64()
}

fn main() {
    let dir = std::env::temp_dir().join(format!("iblab-bench-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kube = kubeconfig();
    let n = repeat();
    println!("{}", script(&["vm-node", "up"]).trim());

    // lesson 3 on kube (pods on the VM node) against the vm backend, alternating.
    let lab = ["lesson3", "--scenario", "forgot-register-memory"];
    let (mut kw, mut kf, mut vw, mut vf) = (vec![], vec![], vec![], vec![]);
    for _ in 0..n {
        let mut a = lab.to_vec();
        a.extend(["--backend", "kube"]);
        let (w, f) = up(&a, &dir, &kube);
        kw.push(w);
        kf.push(f);
        let mut a = lab.to_vec();
        a.extend(["--backend", "vm"]);
        let (w, f) = up(&a, &dir, &kube);
        vw.push(w);
        vf.push(f);
    }
    println!("lesson3 forgot-register-memory, all paths, {n} runs each, median (range):");
    println!(
        "  kube (pods on the VM node): to first step {}, whole run {}",
        stats(kf),
        stats(kw)
    );
    println!(
        "  vm backend:                 to first step {}, whole run {}",
        stats(vf),
        stats(vw)
    );

    let starts: Vec<f64> = (0..n).map(|_| pod_start(&kube)).collect();
    println!(
        "a lab-image pod on the VM node, created to Ready: {}",
        stats(starts)
    );

    let version = env!("CARGO_PKG_VERSION");
    let (mut ready, mut images) = (vec![], vec![]);
    for _ in 0..n {
        script(&["vm-node", "down"]);
        let t = Instant::now();
        script(&["vm-node", "up"]);
        ready.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for image in [
            format!("iblab/lab:{version}"),
            format!("iblab/operator:{version}"),
        ] {
            let tar = dir.join("image.tar");
            let st = Command::new("docker")
                .args(["save", &image, "-o"])
                .arg(&tar)
                .status()
                .unwrap();
            assert!(st.success(), "docker save {image}");
            script(&["vm-node", "import", tar.to_str().unwrap()]);
            let _ = std::fs::remove_file(&tar);
        }
        images.push(t.elapsed().as_secs_f64());
    }
    println!("the VM node, down then up to Ready: {}", stats(ready));
    println!(
        "  then the lab and iblab images into its containerd: {}",
        stats(images)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
