//! The guest agent (`iblab agent`, the VM's /init): mounts the basics, loads the image's
//! modules, then runs the host's commands arriving over a virtio-serial port.

pub mod proto;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::{Body, Op, Request, Response};

use iblab_sys::process::{self, Background};

/// Where the agent keeps the output of background processes.
const SPAWN_DIR: &str = "/tmp/iblab-agent";

/// Entry point of `iblab agent`. As PID 1 it first sets the guest up.
pub fn main() -> i32 {
    let started = Instant::now();
    let mut problems = Vec::new();
    let mut loaded = 0;
    let mut modules_s = 0.0;
    if std::process::id() == 1 {
        iblab_sys::interrupt::set_init_path("/usr/sbin:/usr/bin");
        problems.extend(init_system());
        let t = Instant::now();
        let (n, p) = load_modules(Path::new("/etc/iblab/modules"));
        modules_s = t.elapsed().as_secs_f64();
        loaded = n;
        problems.extend(p);
        let _ = std::process::Command::new("/usr/bin/ip")
            .args(["link", "set", "lo", "up"])
            .status();
        // Every node's rxe socket (one per namespace since Linux 7.1) and TCP socket shares
        // this kernel's CPUs: deeper default socket buffers keep a burst that arrives while
        // the receiver waits for a vCPU from being dropped at the socket.
        for (knob, value) in [
            ("/proc/sys/net/core/rmem_default", "4194304"),
            ("/proc/sys/net/core/rmem_max", "16777216"),
            ("/proc/sys/net/core/wmem_default", "4194304"),
            ("/proc/sys/net/core/wmem_max", "16777216"),
        ] {
            if let Err(e) = std::fs::write(knob, value) {
                problems.push(format!("{knob}: {e}"));
            }
        }
        // Verbs pin the memory they register; the kernel's default (8 MiB) is too small for
        // large registrations. Every tool the agent starts inherits this.
        use nix::sys::resource::{RLIM_INFINITY, Resource, setrlimit};
        if let Err(e) = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY) {
            problems.push(format!("cannot raise the memlock limit: {e}"));
        }
    }
    for p in &problems {
        eprintln!("iblab agent: {p}");
    }
    // The test of the host's retry of a failed boot: a guest that never says hello, or
    // whose init exits (the kernel panics, and qemu exits with it).
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if cmdline.contains("iblab.test.fail_boot=hang") {
        eprintln!("iblab agent: iblab.test.fail_boot=hang: parking without a hello");
        return park();
    }
    if cmdline.contains("iblab.test.fail_boot=crash") && std::process::id() == 1 {
        eprintln!("iblab agent: iblab.test.fail_boot=crash: init exits");
        return 1;
    }
    let port = match find_port(Duration::from_secs(20)) {
        Some(p) => p,
        None => {
            eprintln!(
                "iblab agent: no virtio-serial port named {}",
                proto::PORT_NAME
            );
            return park();
        }
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("iblab agent: cannot open {}: {e}", port.display());
            return park();
        }
    };
    let writer = match file.try_clone() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("iblab agent: {e}");
            return park();
        }
    };
    let hello = Body::Hello {
        uptime_s: uptime().unwrap_or(started.elapsed().as_secs_f64()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        modules_loaded: loaded,
        modules_s,
        problems,
    };
    serve(BufReader::new(file), writer, Some(hello), true);
    park()
}

/// PID 1 must never exit (the kernel panics): wait forever.
fn park() -> i32 {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn uptime() -> Option<f64> {
    std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn init_system() -> Vec<String> {
    use nix::mount::{MsFlags, mount};
    let mut problems = Vec::new();
    for (src, target, fstype) in [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
        ("tmpfs", "/run", "tmpfs"),
    ] {
        if let Err(e) = mount(
            Some(src),
            target,
            Some(fstype),
            MsFlags::empty(),
            None::<&str>,
        ) {
            problems.push(format!("mount {target}: {e}"));
        }
    }
    if let Ok(cmdline) = std::fs::read_to_string("/proc/cmdline")
        && let Some(name) = cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix("iblab.node="))
        && let Err(e) = nix::unistd::sethostname(name)
    {
        problems.push(format!("hostname: {e}"));
    }
    problems
}

/// Load the image's modules (`list`: one path a line, dependencies first). Modules whose
/// dependencies are in are loaded side by side, a thread each: under TCG each load costs
/// tens of milliseconds of relocation and init, and the guest has a vCPU per host core.
fn load_modules(list: &Path) -> (usize, Vec<String>) {
    let Ok(text) = std::fs::read_to_string(list) else {
        return (0, vec![format!("no module list at {}", list.display())]);
    };
    let paths: Vec<PathBuf> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect();
    let deps: Vec<Vec<String>> = paths
        .iter()
        .map(|p| {
            std::fs::read(p)
                .ok()
                .and_then(|b| crate::kmod::depends(&b).ok())
                .unwrap_or_default()
        })
        .collect();
    let names: Vec<String> = paths.iter().map(|p| module_name(p)).collect();
    let mut n = 0;
    let mut problems = Vec::new();
    for round in load_rounds(&names, &deps) {
        let loads: Vec<_> = round
            .into_iter()
            .map(|i| {
                let path = paths[i].clone();
                std::thread::spawn(move || {
                    let r = std::fs::File::open(&path)
                        .map_err(ModuleLoad::Open)
                        .and_then(|f| {
                            nix::kmod::finit_module(&f, c"", nix::kmod::ModuleInitFlags::empty())
                                .map_err(ModuleLoad::Init)
                        });
                    (path, r)
                })
            })
            .collect();
        for l in loads {
            match l.join() {
                Ok((_, Ok(()))) => n += 1,
                // Already in: built in, or loaded as another module's dependency.
                Ok((_, Err(ModuleLoad::Init(nix::errno::Errno::EEXIST)))) => n += 1,
                Ok((path, Err(e))) => problems.push(format!("insmod {}: {e}", path.display())),
                Err(_) => problems.push("a module load panicked".into()),
            }
        }
    }
    (n, problems)
}

/// Why a module did not load.
#[derive(Debug, thiserror::Error)]
enum ModuleLoad {
    #[error("{0}")]
    Open(#[source] std::io::Error),
    #[error("{0}")]
    Init(#[source] nix::errno::Errno),
}

/// `/usr/lib/modules/ib_core.ko` → `ib_core` (as `depends=` spells it).
fn module_name(p: &Path) -> String {
    p.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .trim_end_matches(".xz")
        .trim_end_matches(".ko")
        .replace('-', "_")
}

/// The modules (by index) in rounds: each round holds those whose dependencies among
/// `names` are all in earlier rounds. A dependency outside the list is built in.
fn load_rounds(names: &[String], deps: &[Vec<String>]) -> Vec<Vec<usize>> {
    let mut level = vec![usize::MAX; names.len()];
    // The list is in dependency order, so one pass settles every level.
    for i in 0..names.len() {
        level[i] = deps[i]
            .iter()
            .filter_map(|d| names[..i].iter().position(|n| n == d))
            .map(|j| level[j] + 1)
            .max()
            .unwrap_or(0);
    }
    let top = level.iter().copied().max().map_or(0, |m| m + 1);
    (0..top)
        .map(|l| (0..names.len()).filter(|&i| level[i] == l).collect())
        .collect()
}

/// The device of the virtio-serial port named [`proto::PORT_NAME`].
fn find_port(wait: Duration) -> Option<PathBuf> {
    let deadline = Instant::now() + wait;
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in entries.flatten() {
                let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                if name.trim() == proto::PORT_NAME {
                    let dev = Path::new("/dev").join(e.file_name());
                    if dev.exists() {
                        return Some(dev);
                    }
                }
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Answer requests read from `input` on `output` until the input ends (or forever, with
/// `retry_eof`: a virtio port reads end-of-file while the host side is not connected).
pub fn serve<R, W>(mut input: R, output: W, hello: Option<Body>, retry_eof: bool)
where
    R: BufRead,
    W: Write + Send + 'static,
{
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("iblab agent: cannot start the runtime: {e}");
            return;
        }
    };
    let (tx, rx) = std::sync::mpsc::channel::<Response>();
    let writer = std::thread::spawn(move || {
        let mut out = output;
        for r in rx {
            let Ok(mut line) = serde_json::to_string(&r) else {
                continue;
            };
            line.push('\n');
            // A port without a host reader fails writes: retry a while.
            for _ in 0..100 {
                if out
                    .write_all(line.as_bytes())
                    .and_then(|_| out.flush())
                    .is_ok()
                {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    });
    if let Some(h) = hello {
        let _ = tx.send(Response { id: 0, body: h });
    }
    let spawned: Arc<Mutex<HashMap<u64, (Background, PathBuf)>>> = Arc::default();
    // `Exec` requests running now: request id → process group.
    let running: Running = Arc::default();
    let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let mut line = String::new();
    let mut in_flight: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) if retry_eof => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Ok(0) => break,
            Err(_) if retry_eof => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(_) => break,
            Ok(_) => {}
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let req: Request = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Response {
                    id: 0,
                    body: Body::Error {
                        message: format!("bad request: {e}"),
                    },
                });
                continue;
            }
        };
        let tx = tx.clone();
        let spawned = spawned.clone();
        let next = next.clone();
        let running = running.clone();
        in_flight.retain(|h| !h.is_finished());
        in_flight.push(rt.spawn(async move {
            let body = match req.op {
                Op::Exec {
                    argv,
                    stdin,
                    timeout_ms,
                    netns,
                } => {
                    let deadline = Duration::from_millis(timeout_ms);
                    let argv = in_netns(netns.as_deref(), &argv);
                    exec_streamed(req.id, &argv, stdin, deadline, &tx, &running).await
                }
                Op::Cancel { of } => {
                    let pgid = running.lock().ok().and_then(|m| m.get(&of).copied());
                    if let Some(pgid) = pgid {
                        use nix::sys::signal::{Signal, killpg};
                        let _ = killpg(nix::unistd::Pid::from_raw(pgid as i32), Signal::SIGKILL);
                    }
                    Body::Cancelled {
                        found: pgid.is_some(),
                    }
                }
                op => handle(op, &spawned, &next).await,
            };
            let _ = tx.send(Response { id: req.id, body });
        }));
    }
    // The input ended: let the answers in flight go out before the runtime stops.
    rt.block_on(async {
        for h in in_flight {
            let _ = h.await;
        }
    });
    rt.shutdown_timeout(Duration::from_secs(5));
    drop(tx);
    let _ = writer.join();
}

/// What `Exec` requests run now, by request id: their process groups (for `Cancel`).
type Running = Arc<Mutex<HashMap<u64, u32>>>;

/// The longest prefix of `buf` that is whole UTF-8 (a character cut between two reads
/// waits for the next one), taken out of it; invalid bytes are replaced.
fn take_text(buf: &mut Vec<u8>) -> String {
    let upto = match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => buf.len(),
    };
    let rest = buf.split_off(upto);
    let text = String::from_utf8_lossy(buf).into_owned();
    *buf = rest;
    text
}

/// `Exec`: run `argv` in its own process group, send its output as it comes, and answer
/// how it ended.
async fn exec_streamed(
    id: u64,
    argv: &[String],
    stdin: Option<String>,
    deadline: Duration,
    tx: &std::sync::mpsc::Sender<Response>,
    running: &Running,
) -> Body {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
    let Some((program, args)) = argv.split_first() else {
        return err("empty command".into());
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return err(format!("cannot run {}: {e}", argv.join(" "))),
    };
    let pgid = child.id();
    if let (Some(p), Ok(mut m)) = (pgid, running.lock()) {
        m.insert(id, p);
    }
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            let _ = pipe.write_all(text.as_bytes()).await;
        });
    }
    async fn pump(
        pipe: Option<impl AsyncRead + Unpin>,
        stream: &str,
        id: u64,
        tx: &std::sync::mpsc::Sender<Response>,
    ) {
        let Some(mut pipe) = pipe else { return };
        let mut pending = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let n = pipe.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&chunk[..n]);
            let data = take_text(&mut pending);
            if !data.is_empty() {
                let body = Body::Output {
                    stream: stream.into(),
                    data,
                };
                let _ = tx.send(Response { id, body });
            }
        }
        if !pending.is_empty() {
            let data = String::from_utf8_lossy(&pending).into_owned();
            let body = Body::Output {
                stream: stream.into(),
                data,
            };
            let _ = tx.send(Response { id, body });
        }
    }
    let (out, errs) = (child.stdout.take(), child.stderr.take());
    let work = async {
        tokio::join!(pump(out, "stdout", id, tx), pump(errs, "stderr", id, tx));
        child.wait().await
    };
    let ended = tokio::time::timeout(deadline, work).await;
    if let Ok(mut m) = running.lock() {
        m.remove(&id);
    }
    match ended {
        Ok(Ok(status)) => Body::Exited {
            exit_code: status.code(),
            signal: status.signal(),
            timed_out: false,
        },
        Ok(Err(e)) => err(format!("waiting for {}: {e}", argv.join(" "))),
        Err(_) => {
            if let Some(p) = pgid {
                use nix::sys::signal::{Signal, killpg};
                let _ = killpg(nix::unistd::Pid::from_raw(p as i32), Signal::SIGKILL);
            }
            Body::Exited {
                exit_code: None,
                signal: Some(nix::sys::signal::Signal::SIGKILL as i32),
                timed_out: true,
            }
        }
    }
}
/// `argv` run inside the guest network namespace `netns` (a node): busybox's `nsenter`
/// joins the namespace and execs the program in place (same pid: its counters are the
/// program's). Unlike `ip netns exec` it keeps the guest's own /sys: a namespace's sysfs
/// view holds only stand-ins of the RDMA devices, without their `hw_counters`. The program
/// is found on PATH here, by full path: busybox would run an applet of the same name.
fn in_netns(netns: Option<&str>, argv: &[String]) -> Vec<String> {
    let Some(ns) = netns else {
        return argv.to_vec();
    };
    let program = argv.first().map(String::as_str).unwrap_or_default();
    let resolved = if program.contains('/') {
        program.to_string()
    } else {
        std::env::var("PATH")
            .unwrap_or_else(|_| "/usr/sbin:/usr/bin".into())
            .split(':')
            .map(|d| Path::new(d).join(program))
            .find(|p| p.is_file())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| program.to_string())
    };
    let mut v: Vec<String> = vec![
        BUSYBOX.into(),
        "nsenter".into(),
        format!("--net=/run/netns/{ns}"),
        "--".into(),
        resolved,
    ];
    v.extend(argv.iter().skip(1).cloned());
    v
}

/// The guest's busybox (the image puts it there).
const BUSYBOX: &str = "/usr/bin/busybox";

fn err(message: String) -> Body {
    Body::Error { message }
}

async fn handle(
    op: Op,
    spawned: &Mutex<HashMap<u64, (Background, PathBuf)>>,
    next: &std::sync::atomic::AtomicU64,
) -> Body {
    match op {
        Op::Run {
            argv,
            stdin,
            timeout_ms,
            netns,
        } => match process::run(
            &in_netns(netns.as_deref(), &argv),
            stdin.as_deref(),
            Duration::from_millis(timeout_ms),
        )
        .await
        {
            Ok(o) => Body::Done {
                exit_code: o.exit_code,
                stdout: o.stdout,
                stderr: o.stderr,
                duration_s: o.duration.as_secs_f64(),
                timed_out: o.timed_out,
                counters: o.counters,
            },
            Err(e) => err(format!("cannot run {}: {e}", argv.join(" "))),
        },
        Op::Spawn { argv, netns } => {
            let handle = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _ = std::fs::create_dir_all(SPAWN_DIR);
            let log = Path::new(SPAWN_DIR).join(format!("{handle}.log"));
            match Background::start(&in_netns(netns.as_deref(), &argv), &log) {
                Ok(bg) => {
                    if let Ok(mut m) = spawned.lock() {
                        m.insert(handle, (bg, log));
                    }
                    Body::Spawned { handle }
                }
                Err(e) => err(format!("cannot start {}: {e}", argv.join(" "))),
            }
        }
        Op::Exec { .. } | Op::Cancel { .. } => err("answered by the serving loop".into()),
        Op::Refresh {
            run,
            hostname,
            unix_s,
            unix_ns,
            seed,
        } => refresh(&run, &hostname, unix_s, unix_ns, &seed),
        Op::Stop { handle, grace_ms } => {
            let entry = spawned.lock().ok().and_then(|mut m| m.remove(&handle));
            match entry {
                Some((bg, log)) => {
                    let end = bg.finish(Duration::from_millis(grace_ms)).await;
                    let output = std::fs::read(&log)
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_default();
                    let _ = std::fs::remove_file(&log);
                    Body::Stopped {
                        exit_code: end.exit_code,
                        output,
                        counters: end.counters,
                    }
                }
                None => err(format!("no background process {handle}")),
            }
        }
    }
}

/// `Refresh`: the host's clock, a reseeded RNG, the run's identity.
fn refresh(run: &str, hostname: &str, unix_s: i64, unix_ns: u32, seed: &str) -> Body {
    use nix::sys::time::TimeSpec;
    use nix::time::{ClockId, clock_gettime, clock_settime};
    let mut problems = Vec::new();
    let host = TimeSpec::new(unix_s, unix_ns.min(999_999_999) as i64);
    let was = clock_gettime(ClockId::CLOCK_REALTIME)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
        .unwrap_or(0.0);
    let clock_was_off_s = was - (unix_s as f64 + unix_ns as f64 * 1e-9);
    if let Err(e) = clock_settime(ClockId::CLOCK_REALTIME, host) {
        problems.push(format!("cannot set the clock: {e}"));
    }
    let reseeded = match reseed(seed) {
        Ok(()) => true,
        Err(e) => {
            problems.push(e.to_string());
            false
        }
    };
    if let Err(e) = nix::unistd::sethostname(hostname) {
        problems.push(format!("hostname: {e}"));
    }
    let _ = std::fs::create_dir_all("/run/iblab");
    if let Err(e) = std::fs::write("/run/iblab/run", format!("{run}\n")) {
        problems.push(format!("/run/iblab/run: {e}"));
    }
    Body::Refreshed {
        uptime_s: uptime().unwrap_or(0.0),
        clock_was_off_s,
        reseeded,
        problems,
    }
}

/// The host's `seed` (hex) into the kernel's generator: without it every guest restored
/// from one snapshot would draw the same bytes.
fn reseed(seed: &str) -> Result<(), SeedError> {
    let bytes: Vec<u8> = (0..seed.len() / 2)
        .filter_map(|i| u8::from_str_radix(seed.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    if bytes.len() < 16 {
        return Err(SeedError::TooShort);
    }
    Ok(iblab_sys::rng::reseed(&bytes)?)
}

/// Why the guest's generator was not reseeded.
#[derive(Debug, thiserror::Error)]
enum SeedError {
    #[error("the host's seed is too short")]
    TooShort,
    #[error("{0}")]
    Reseed(#[from] iblab_sys::rng::ReseedError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_load_in_rounds_after_their_dependencies() {
        let names: Vec<String> = ["ib_core", "udp_tunnel", "bridge", "rdma_rxe", "rdma_ucm"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let deps: Vec<Vec<String>> = vec![
            vec![],
            vec![],
            vec!["stp".into()], // built in: not waited for
            vec!["ib_core".into(), "udp_tunnel".into()],
            vec!["ib_core".into(), "rdma_rxe".into()],
        ];
        assert_eq!(
            load_rounds(&names, &deps),
            vec![vec![0, 1, 2], vec![3], vec![4]]
        );
        assert_eq!(
            module_name(Path::new("/usr/lib/modules/udp-tunnel.ko")),
            "udp_tunnel"
        );
        assert!(load_rounds(&[], &[]).is_empty());
    }
    use std::io::Read;

    #[test]
    fn a_node_command_enters_its_namespace_by_full_path() {
        let argv: Vec<String> = vec!["sh".into(), "-c".into(), "true".into()];
        assert_eq!(in_netns(None, &argv), argv);
        let v = in_netns(Some("a"), &argv);
        assert_eq!(&v[..4], &[BUSYBOX, "nsenter", "--net=/run/netns/a", "--"]);
        assert!(v[4].ends_with("/sh"), "{v:?}");
        assert_eq!(&v[5..], &["-c", "true"]);
        let v = in_netns(Some("b"), &["/init".to_string()]);
        assert_eq!(v[4], "/init");
    }

    fn exchange(requests: &[Request]) -> Vec<Response> {
        let mut input = String::new();
        for r in requests {
            input.push_str(&serde_json::to_string(r).unwrap());
            input.push('\n');
        }
        let (mut rd, wr) = std::io::pipe().unwrap();
        let t = std::thread::spawn(move || {
            serve(std::io::Cursor::new(input.into_bytes()), wr, None, false);
        });
        let mut out = String::new();
        rd.read_to_string(&mut out).unwrap();
        t.join().unwrap();
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn runs_commands_with_stdin_and_deadlines() {
        let mut r = exchange(&[
            Request {
                id: 1,
                op: Op::Run {
                    argv: vec!["cat".into()],
                    stdin: Some("through the port\n".into()),
                    timeout_ms: 5000,
                    netns: None,
                },
            },
            Request {
                id: 2,
                op: Op::Run {
                    argv: vec!["sleep".into(), "5".into()],
                    stdin: None,
                    timeout_ms: 200,
                    netns: None,
                },
            },
            Request {
                id: 3,
                op: Op::Run {
                    argv: vec!["/nonexistent/program".into()],
                    stdin: None,
                    timeout_ms: 200,
                    netns: None,
                },
            },
        ]);
        r.sort_by_key(|x| x.id);
        assert_eq!(r.len(), 3);
        match &r[0].body {
            Body::Done {
                exit_code, stdout, ..
            } => {
                assert_eq!(*exit_code, Some(0));
                assert_eq!(stdout, "through the port\n");
            }
            other => panic!("{other:?}"),
        }
        match &r[1].body {
            Body::Done {
                timed_out,
                exit_code,
                duration_s,
                ..
            } => {
                assert!(*timed_out);
                assert_eq!(*exit_code, None);
                assert!(*duration_s < 2.0);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(r[2].body, Body::Error { .. }), "{:?}", r[2]);
    }

    #[test]
    fn exec_streams_output_then_how_it_ended() {
        let r = exchange(&[
            Request {
                id: 5,
                op: Op::Exec {
                    argv: vec![
                        "sh".into(),
                        "-c".into(),
                        "read x; echo out-$x; echo err >&2; exit 7".into(),
                    ],
                    stdin: Some("in\n".into()),
                    timeout_ms: 5000,
                    netns: None,
                },
            },
            Request {
                id: 6,
                op: Op::Exec {
                    argv: vec!["sleep".into(), "5".into()],
                    stdin: None,
                    timeout_ms: 200,
                    netns: None,
                },
            },
        ]);
        let of = |id: u64| r.iter().filter(|x| x.id == id).collect::<Vec<_>>();
        let five = of(5);
        let out: String = five
            .iter()
            .filter_map(|x| match &x.body {
                Body::Output { stream, data } if stream == "stdout" => Some(data.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(out, "out-in\n");
        assert!(five.iter().any(
            |x| matches!(&x.body, Body::Output { stream, data } if stream == "stderr" && data == "err\n")
        ));
        // The end comes last, after every output.
        assert_eq!(
            five.last().unwrap().body,
            Body::Exited {
                exit_code: Some(7),
                signal: None,
                timed_out: false
            }
        );
        assert!(matches!(
            of(6).last().unwrap().body,
            Body::Exited {
                exit_code: None,
                signal: Some(9),
                timed_out: true
            }
        ));
    }

    #[test]
    fn output_is_cut_between_whole_characters() {
        let mut buf = "ab→".as_bytes().to_vec();
        buf.pop();
        assert_eq!(take_text(&mut buf), "ab");
        assert_eq!(buf.len(), 2);
        buf.push("→".as_bytes()[2]);
        assert_eq!(take_text(&mut buf), "→");
        assert!(buf.is_empty());
        let mut bad = vec![b'x', 0xff, b'y'];
        assert_eq!(take_text(&mut bad), "x\u{fffd}y");
    }

    #[test]
    fn unknown_background_handle_is_an_error() {
        let r = exchange(&[Request {
            id: 9,
            op: Op::Stop {
                handle: 42,
                grace_ms: 0,
            },
        }]);
        assert!(matches!(r[0].body, Body::Error { .. }));
    }
}
