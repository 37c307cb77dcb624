//! Benchmark (not a test): does the page watching a run slow its steps? A lesson run, its
//! steps timed (`timings.steps_s` of its evidence), alternately
//! started by `iblab up` alone and from `iblab ui` with a browser's live stream open
//! (a client reading `/api/live`, the server-sent events the page follows). Needs root.
//! Run: `cargo bench --bench ui_watch` (prints a table; BENCHMARKS.md keeps the numbers).
//! `IBLAB_BENCH_LAB` (default lesson4), `IBLAB_BENCH_BACKEND` (default local; lesson5
//! needs vm here) and `IBLAB_BENCH_REPEAT` (default 5 each way).

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iblab");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn range(v: &[f64]) -> (f64, f64) {
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

fn steps_s(dir: &Path) -> f64 {
    let text = std::fs::read_to_string(dir.join("evidence.json")).expect("evidence.json");
    let e: serde_json::Value = serde_json::from_str(&text).unwrap();
    // A soft figure judged otherwise on a busy machine still timed every step.
    assert!(
        matches!(e["verdict"].as_str(), Some("pass" | "fail")),
        "{}: {}",
        dir.display(),
        e["verdict"]
    );
    e["timings"]["steps_s"].as_f64().unwrap()
}

fn request(port: u16, token: &str, method: &str, path: &str, body: &str) -> String {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Iblab-Token: {token}\r\nOrigin: http://127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out.split("\r\n\r\n").nth(1).unwrap_or("").to_string()
}

/// `iblab ui` on a free port of localhost, writing its runs into `runs`: the process, its
/// port and its token.
fn start_ui(runs: &Path, state: &Path) -> (std::process::Child, u16, String) {
    let mut ui = Command::new(BIN)
        .args([
            "ui",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "local",
            "--runs",
        ])
        .arg(runs)
        .env("IBLAB_STATE_DIR", state)
        .stdout(Stdio::piped())
        .spawn()
        .expect("iblab ui");
    let mut lines = std::io::BufReader::new(ui.stdout.take().unwrap()).lines();
    let url = loop {
        let l = lines.next().unwrap().unwrap();
        if let Some(at) = l.find("http://") {
            break l[at..].trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let port: u16 = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let token = url.split("token=").nth(1).unwrap().to_string();
    (ui, port, token)
}

/// The page's live stream, read to its end by a watcher, as a browser tab would: the
/// bytes read so far.
fn watch(port: u16, token: &str) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let watched = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (token, counted) = (token.to_string(), watched.clone());
    std::thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            c,
            "GET /api/live HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Iblab-Token: {token}\r\n\r\n"
        )
        .unwrap();
        let mut buf = [0u8; 65536];
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    });
    watched
}

/// Where the runs go and how they are run.
struct Bench {
    lab: String,
    backend: String,
    dir: std::path::PathBuf,
    runs: std::path::PathBuf,
    state: std::path::PathBuf,
    port: u16,
    token: String,
}

impl Bench {
    /// Run `k` by `iblab up` alone, as from a terminal: its steps' seconds.
    fn alone(&self, k: usize) -> f64 {
        let out = self.dir.join(format!("alone-{k}"));
        let st = Command::new(BIN)
            .args(["up", &self.lab, "--backend", &self.backend, "--out"])
            .arg(&out)
            .env("IBLAB_STATE_DIR", &self.state)
            .output()
            .unwrap();
        assert!(
            matches!(st.status.code(), Some(0 | 1)),
            "{}",
            String::from_utf8_lossy(&st.stdout)
        );
        steps_s(&out)
    }

    /// A run started from the page, watched, to its end: its steps' seconds.
    fn started_from_the_page(&self) -> f64 {
        let (port, token) = (self.port, self.token.as_str());
        let started = request(
            port,
            token,
            "POST",
            "/api/run",
            &format!(r#"{{"lab":"{}","backend":"{}"}}"#, self.lab, self.backend),
        );
        let v: serde_json::Value = serde_json::from_str(&started).expect(&started);
        let name = v["started"].as_str().expect("started").to_string();
        let t = Instant::now();
        loop {
            let cur: serde_json::Value =
                serde_json::from_str(&request(port, token, "GET", "/api/current", ""))
                    .unwrap_or_default();
            let verdict = cur["verdict"].as_str().unwrap_or("");
            if cur["name"] == name.as_str() && !matches!(verdict, "running" | "stopping" | "") {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(600),
                "the page's run did not end"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        steps_s(&self.runs.join(&name))
    }
}

/// The table BENCHMARKS.md keeps: median and range each way, and whether they overlap.
fn table(b: &Bench, alone: &[f64], with_page: &[f64], watched_bytes: usize) {
    let (lab, backend, repeat) = (&b.lab, &b.backend, alone.len());
    let (a_lo, a_hi) = range(alone);
    let (p_lo, p_hi) = range(with_page);
    println!("\n{lab} on {backend}, steps_s over {repeat} runs each way (alternating)");
    println!("| way | median s | range s |");
    println!("|---|---|---|");
    println!(
        "| `iblab up` alone | {:.2} | {a_lo:.2}–{a_hi:.2} |",
        median(alone.to_vec())
    );
    println!(
        "| from `iblab ui`, live stream read ({} KiB) | {:.2} | {p_lo:.2}–{p_hi:.2} |",
        watched_bytes / 1024,
        median(with_page.to_vec())
    );
    let overlap = p_lo <= a_hi && a_lo <= p_hi;
    println!(
        "ranges {}: the page's median {} within the spread of `up` alone ({a_lo:.2}–{a_hi:.2})",
        if overlap { "overlap" } else { "do not overlap" },
        if (a_lo..=a_hi).contains(&median(with_page.to_vec())) {
            "is"
        } else {
            "is not"
        }
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let repeat: usize = std::env::var("IBLAB_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = std::env::temp_dir().join(format!("iblab-bench-ui-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (runs, state) = (dir.join("runs"), dir.join("state"));
    std::fs::create_dir_all(&runs).unwrap();
    let (mut ui, port, token) = start_ui(&runs, &state);
    let watched = watch(port, &token);
    let b = Bench {
        lab: std::env::var("IBLAB_BENCH_LAB").unwrap_or_else(|_| "lesson4".into()),
        backend: std::env::var("IBLAB_BENCH_BACKEND").unwrap_or_else(|_| "local".into()),
        dir: dir.clone(),
        runs,
        state: state.clone(),
        port,
        token,
    };
    let (mut alone, mut with_page) = (vec![], vec![]);
    for k in 0..repeat {
        alone.push(b.alone(k));
        with_page.push(b.started_from_the_page());
        eprintln!(
            "run {}: alone {:.2} s, from the page {:.2} s",
            k + 1,
            alone[k],
            with_page[k]
        );
    }
    let _ = Command::new("kill")
        .args(["-INT", &ui.id().to_string()])
        .status();
    let _ = ui.wait();
    table(
        &b,
        &alone,
        &with_page,
        watched.load(std::sync::atomic::Ordering::Relaxed),
    );
    let _ = Command::new(BIN)
        .args(["down", "--all"])
        .env("IBLAB_STATE_DIR", &state)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
}
