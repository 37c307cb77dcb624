//! The guest image: a Debian kernel and an initramfs (modules with rdma_rxe, busybox,
//! iproute2, perftest, rdmacm-utils, iperf3, libibverbs with the rxe provider) built from
//! Debian packages on first use, cached by a hash of its inputs, built under a lock.
//! The `iblab` binary rides in a small second archive made per run (see [`agent_archive`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cpio::Cpio;
use super::kmod;
use crate::caps::which;
use crate::run::progress;
use crate::run::state::{Resource, StateFile};

/// Bump when the layout of the image changes, so caches are rebuilt.
const FORMAT: u32 = 2;

/// Modules the guest loads at boot (their dependencies come along).
pub const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "virtio_console",
    "crc32_generic",
    "rdma_rxe",
    "rdma_ucm",
    "sch_netem",
    "sch_tbf",
];

/// Programs copied into the guest with their shared libraries.
pub const PROGRAMS: &[&str] = &[
    "ip",
    "rdma",
    "tc",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_write_lat",
    "ib_read_lat",
    "ib_send_lat",
    "ibv_devinfo",
    "ibv_devices",
    "ibv_rc_pingpong",
    "rping",
    "iperf3",
];

/// Debian packages whose files go into the image (their versions key the cache).
pub const PACKAGES: &[&str] = &[
    "busybox-static",
    "iproute2",
    "perftest",
    "ibverbs-utils",
    "rdmacm-utils",
    "ibverbs-providers",
    "libibverbs1",
    "librdmacm1",
    "iperf3",
];

/// busybox applets linked into /usr/bin (never ones a real program above provides).
const APPLETS: &[&str] = &[
    "sh", "cat", "ls", "sleep", "ping", "dmesg", "echo", "ps", "kill", "uname", "mkdir", "rm",
    "grep", "head", "tail", "wc", "mount", "free", "true", "false", "ethtool", "ss", "netstat",
];

/// The cache folder: `$IBLAB_CACHE_DIR`, else `$XDG_CACHE_HOME/iblab/vm`, else `~/.cache/iblab/vm`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("IBLAB_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("iblab").join("vm")
}

/// What the image is made of; its hash names the cache entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Inputs {
    pub format: u32,
    pub kernel_package: String,
    pub kernel_version: String,
    pub packages: BTreeMap<String, String>,
    pub modules: Vec<String>,
    pub programs: Vec<String>,
}

impl Inputs {
    pub fn key(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        format!("{:016x}", fnv1a(text.as_bytes()))
    }
}

/// FNV-1a, 64 bit: stable across builds and toolchains (std's hasher is not).
pub fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A built, cached image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Image {
    pub key: String,
    pub kernel: PathBuf,
    pub base: PathBuf,
    pub kernel_release: String,
    pub inputs: Inputs,
    /// Seconds the build took (0 when it came from the cache).
    #[serde(default)]
    pub build_s: f64,
    #[serde(default)]
    pub cached: bool,
}

fn run(argv: &[&str], cwd: Option<&Path>) -> Result<String, String> {
    let mut c = std::process::Command::new(argv[0]);
    c.args(&argv[1..]).stdin(std::process::Stdio::null());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c
        .output()
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`run`] without blocking the runtime, in a process group of its own that is killed
/// whole if the future is dropped (the run was interrupted): dpkg-deb's decompressor and
/// apt's download methods go with it.
async fn run_async(argv: &[&str], cwd: Option<&Path>) -> Result<String, String> {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let out = crate::run::process::run_env(&argv, None, Duration::from_secs(1800), &[], cwd)
        .await
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    if !out.success() {
        return Err(format!(
            "`{}` failed: {}",
            argv.join(" "),
            out.stderr.trim()
        ));
    }
    Ok(out.stdout)
}

/// The kernel package `linux-image-amd64` points at (or `$IBLAB_VM_KERNEL_PACKAGE`), and its
/// version: one `apt-cache show` (each costs about half a second).
fn kernel_package() -> Result<(String, String), String> {
    let requested = std::env::var("IBLAB_VM_KERNEL_PACKAGE")
        .ok()
        .filter(|n| !n.is_empty());
    let asked = requested.as_deref().unwrap_or("linux-image-amd64");
    let show = run(&["apt-cache", "show", "--no-all-versions", asked], None).map_err(|e| {
        format!("{e}\n  apt knows no {asked} (a Debian kernel): run `apt-get update`, or set IBLAB_VM_KERNEL_PACKAGE")
    })?;
    let field = |name: &str| {
        show.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let version = field("Version:").ok_or_else(|| format!("apt has no version of {asked}"))?;
    if requested.is_some() {
        return Ok((asked.to_string(), version));
    }
    // `Depends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)`
    parse_depends(&field("Depends:").unwrap_or_default()).ok_or_else(|| {
        "linux-image-amd64 depends on no linux-image package; set IBLAB_VM_KERNEL_PACKAGE".into()
    })
}

/// The kernel package and exact version out of the metapackage's `Depends:` field.
fn parse_depends(depends: &str) -> Option<(String, String)> {
    depends.split(',').map(str::trim).find_map(|d| {
        let (name, rest) = d.split_once(' ').unwrap_or((d, ""));
        let version = rest
            .trim()
            .strip_prefix("(=")
            .and_then(|v| v.strip_suffix(')'))
            .map(|v| v.trim().to_string())?;
        name.starts_with("linux-image-")
            .then(|| (name.to_string(), version))
    })
}

/// Packages the image copies from that are not installed here.
pub fn missing_packages() -> Vec<&'static str> {
    let have = installed();
    PACKAGES
        .iter()
        .filter(|p| !have.contains_key(**p))
        .copied()
        .collect()
}

/// Installed versions of [`PACKAGES`] (empty when dpkg-query is missing).
fn installed() -> BTreeMap<String, String> {
    let mut argv = vec![
        "dpkg-query",
        "-W",
        "-f",
        "${Package}\t${Version}\t${db:Status-Abbrev}\n",
    ];
    argv.extend_from_slice(PACKAGES);
    let Ok(out) = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
    else {
        return BTreeMap::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = BTreeMap::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        if f.len() == 3 && f[2].starts_with("ii") {
            found.insert(f[0].to_string(), f[1].to_string());
        }
    }
    found
}

/// Installed versions of the packages the image copies from; an error names the missing.
fn package_versions() -> Result<BTreeMap<String, String>, String> {
    let found = installed();
    let missing = missing_packages();
    if !missing.is_empty() {
        return Err(format!(
            "the vm image is built from Debian packages that are not installed here: {}\n  fix: apt-get install {}",
            missing.join(", "),
            missing.join(" ")
        ));
    }
    Ok(found)
}

/// Everything the image is built from, as of now.
pub fn inputs() -> Result<Inputs, String> {
    let (kernel_package, kernel_version) = kernel_package()?;
    Ok(Inputs {
        format: FORMAT,
        kernel_package,
        kernel_version,
        packages: package_versions()?,
        modules: MODULES.iter().map(|s| s.to_string()).collect(),
        programs: PROGRAMS.iter().map(|s| s.to_string()).collect(),
    })
}

/// The cached image for these inputs, if complete.
pub fn cached(inputs: &Inputs) -> Option<Image> {
    let dir = cache_dir().join(format!("img-{}", inputs.key()));
    let text = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
    let mut img: Image = serde_json::from_str(&text).ok()?;
    if img.inputs != *inputs || !img.kernel.exists() || !img.base.exists() {
        return None;
    }
    img.cached = true;
    img.build_s = 0.0;
    Some(img)
}

/// An exclusive lock on the cache folder, released and removed on drop. It belongs to no
/// run: only its holder removes it (a run that waited for it, or gave up, must not), and a
/// crashed holder's flock dies with it, so a stale file without a holder blocks nobody.
pub struct BuildLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
    path: PathBuf,
}

impl BuildLock {
    /// Wait (up to `wait`) for the lock `build.lock` in `dir`, polling without blocking
    /// the runtime (an interrupt is seen while another run builds).
    pub async fn take(dir: &Path, wait: Duration) -> Result<BuildLock, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("build.lock");
        let deadline = Instant::now() + wait;
        loop {
            if let Some(lock) = BuildLock::try_take(&path)? {
                return Ok(lock);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "another iblab has been building the vm image for {}s (lock {}); try again later",
                    wait.as_secs(),
                    path.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The lock if nobody holds it; never waits.
    fn try_take(path: &Path) -> Result<Option<BuildLock>, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let Ok(lock) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        else {
            return Ok(None);
        };
        // The holder removes the file when done: a lock on a removed file is no lock.
        let same = match (lock.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.ino() == b.ino(),
            _ => false,
        };
        if !same {
            return Ok(None);
        }
        let _ = writeln!(&*lock, "{}", std::process::id());
        Ok(Some(BuildLock {
            _lock: lock,
            path: path.to_path_buf(),
        }))
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        // Remove first, then the lock goes with the file handle.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Blocking work (processes waited for, files read and written) on tokio's blocking
/// threads, so the runtime keeps seeing Ctrl-C and SIGTERM meanwhile.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("the vm image work stopped: {e}"))?
}

/// The image for the current inputs: from the cache, or built now (under the lock).
/// Nothing here blocks the runtime: an interrupt is seen at once, the download is killed,
/// and what runs on a blocking thread still holds the lock until it ends.
pub async fn ensure(state: &StateFile, run_id: &str) -> Result<Image, String> {
    let (inputs, hit) = off_runtime(|| {
        let inputs = inputs()?;
        let hit = cached(&inputs);
        Ok((inputs, hit))
    })
    .await?;
    if let Some(img) = hit {
        return Ok(img);
    }
    progress::detail("vm image: waiting for the image build lock");
    let lock = Arc::new(BuildLock::take(&cache_dir(), Duration::from_secs(600)).await?);
    let again = inputs.clone();
    if let Some(img) = off_runtime(move || Ok(cached(&again))).await? {
        return Ok(img);
    }
    // The first run with an empty cache (or after an upgrade) spends a while here: say what
    // and why, instead of a silent pause.
    progress::stage(
        &format!(
            "building the vm image: none cached for {} {} in {} (first use only; about 15s, \
         later runs boot from the cache)",
            inputs.kernel_package,
            inputs.kernel_version,
            cache_dir().display()
        ),
        "building the vm image",
    );
    let t = Instant::now();
    let work = cache_dir().join(format!("build-{run_id}"));
    state
        .record(Resource::Dir { path: work.clone() })
        .map_err(|e| format!("cannot write the state file: {e}"))?;
    let out = match fetch_kernel(&inputs, &work).await {
        Ok(root) => {
            let (held, work) = (lock.clone(), work.clone());
            off_runtime(move || {
                let _held = held;
                let img = assemble(&inputs, &work, &root)?;
                install(img, &inputs, &work, t)
            })
            .await
        }
        Err(e) => Err(e),
    };
    off_runtime(move || {
        let _ = std::fs::remove_dir_all(&work);
        Ok(())
    })
    .await?;
    if let Ok(img) = &out
        && progress::on_terminal()
    {
        progress::say(&format!(
            "built the vm image {} in {:.1}s",
            img.key, img.build_s
        ));
    }
    out
}

/// Move a built image into the cache, write its manifest, remove older images.
fn install(mut img: Image, inputs: &Inputs, work: &Path, t: Instant) -> Result<Image, String> {
    let dir = cache_dir().join(format!("img-{}", inputs.key()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(work.join("img"), &dir)
        .map_err(|e| format!("cannot move the image into {}: {e}", dir.display()))?;
    img.kernel = dir.join("vmlinuz");
    img.base = dir.join("base.cpio");
    img.build_s = t.elapsed().as_secs_f64();
    let text = serde_json::to_string_pretty(&img).unwrap_or_default();
    std::fs::write(dir.join("manifest.json"), text)
        .map_err(|e| format!("cannot write the image manifest: {e}"))?;
    prune(&dir);
    Ok(img)
}

/// Remove images built from older inputs.
fn prune(keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let stale = p != keep
            && p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("img-"));
        if stale {
            let _ = std::fs::remove_dir_all(&p);
        }
    }
}

/// The kernel package, downloaded into `work` and unpacked there (never installed); its
/// root folder. The programs run as killable child processes, the file work off the runtime.
async fn fetch_kernel(inputs: &Inputs, work: &Path) -> Result<PathBuf, String> {
    let dir = work.to_path_buf();
    off_runtime(move || {
        let _ = std::fs::remove_dir_all(&dir);
        let img_dir = dir.join("img");
        std::fs::create_dir_all(&img_dir)
            .map_err(|e| format!("cannot create {}: {e}", img_dir.display()))
    })
    .await?;
    let pkg = format!("{}={}", inputs.kernel_package, inputs.kernel_version);
    progress::detail(&format!("vm image: downloading {pkg} (apt-get download)"));
    run_async(&["apt-get", "download", "-q", &pkg], Some(work)).await?;
    let dir = work.to_path_buf();
    let deb = off_runtime(move || {
        std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| "apt-get download left no .deb".to_string())
    })
    .await?;
    let root = work.join("kernel");
    progress::detail("vm image: unpacking the kernel, assembling modules and programs");
    let (deb_s, root_s) = (deb.to_string_lossy(), root.to_string_lossy());
    run_async(&["dpkg-deb", "-x", &deb_s, &root_s], None).await?;
    let _ = tokio::fs::remove_file(&deb).await;
    Ok(root)
}

/// The image out of the unpacked kernel at `root` and this host's packages, in `work/img`.
fn assemble(inputs: &Inputs, work: &Path, root: &Path) -> Result<Image, String> {
    let img_dir = work.join("img");
    let modroot = root.join("lib/modules");
    let release = std::fs::read_dir(&modroot)
        .map_err(|e| format!("{}: {e}", modroot.display()))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .next()
        .ok_or("the kernel package has no modules folder")?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    std::fs::copy(&vmlinuz, img_dir.join("vmlinuz"))
        .map_err(|e| format!("{}: {e}", vmlinuz.display()))?;
    let index = kmod::Index::scan(&modroot.join(&release)).map_err(|e| e.to_string())?;
    let modules = index.load_order(MODULES)?;

    // 2. The archive.
    let file = std::fs::File::create(img_dir.join("base.cpio")).map_err(|e| e.to_string())?;
    let mut a = Archive::new(std::io::BufWriter::new(file));
    a.skeleton().map_err(|e| e.to_string())?;
    let mut order = String::new();
    for m in &modules {
        let name = m.file_name().and_then(|n| n.to_str()).unwrap_or("x.ko");
        a.copy(m, &format!("usr/lib/modules/{name}"))?;
        order.push_str(&format!("/usr/lib/modules/{name}\n"));
    }
    a.data("etc/iblab/modules", 0o644, order.as_bytes())?;
    a.data("etc/iblab/release", 0o644, release.as_bytes())?;
    let busybox =
        which("busybox").ok_or("busybox is not installed (apt-get install busybox-static)")?;
    a.copy(&busybox, "usr/bin/busybox")?;
    let mut programs = Vec::new();
    for p in PROGRAMS {
        let path = which(p).ok_or_else(|| format!("{p} is not installed here"))?;
        programs.push(std::fs::canonicalize(&path).unwrap_or(path));
    }
    // The rxe provider and its driver file, found next to libibverbs.
    let libdir = ldd(&programs[PROGRAMS
        .iter()
        .position(|p| *p == "ibv_devinfo")
        .unwrap_or(0)])?
    .into_iter()
    .find(|l| {
        l.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libibverbs.so"))
    })
    .and_then(|l| l.parent().map(Path::to_path_buf))
    .ok_or("ibv_devinfo does not link libibverbs")?;
    let provider = std::fs::read_dir(libdir.join("libibverbs"))
        .map_err(|e| format!("no rxe provider ({e}): apt-get install ibverbs-providers"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("librxe-"))
        })
        .ok_or("no rxe provider: apt-get install ibverbs-providers")?;
    let mut files: BTreeSet<PathBuf> = programs.iter().cloned().collect();
    files.insert(provider.clone());
    files.insert(libdir.join("libgcc_s.so.1"));
    for f in files.clone() {
        files.extend(ldd(&f)?);
    }
    for f in &files {
        let canon = std::fs::canonicalize(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let dest = merged(f);
        a.copy(&canon, &dest)?;
    }
    let driver = Path::new("/etc/libibverbs.d/rxe.driver");
    a.copy(driver, "etc/libibverbs.d/rxe.driver")?;
    let have: BTreeSet<String> = programs
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for app in APPLETS.iter().filter(|a| !have.contains(**a)) {
        a.cpio
            .symlink(&format!("usr/bin/{app}"), "busybox")
            .map_err(|e| e.to_string())?;
    }
    a.cpio.finish().map_err(|e| e.to_string())?;
    Ok(Image {
        key: inputs.key(),
        kernel: img_dir.join("vmlinuz"),
        base: img_dir.join("base.cpio"),
        kernel_release: release,
        inputs: inputs.clone(),
        build_s: 0.0,
        cached: false,
    })
}

/// Where a host file goes in the merged-/usr guest (`/lib/x/y` → `usr/lib/x/y`).
fn merged(p: &Path) -> String {
    let s = p.to_string_lossy();
    let s = s.trim_start_matches('/');
    for top in ["lib64/", "lib/", "bin/", "sbin/"] {
        if s.starts_with(top) {
            return format!("usr/{s}");
        }
    }
    s.to_string()
}

/// Shared objects a program loads, as `ldd` lists them (the loader included).
fn ldd(program: &Path) -> Result<Vec<PathBuf>, String> {
    let text = run(&["ldd", &program.to_string_lossy()], None).unwrap_or_default();
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The cpio writer plus the folders made so far.
struct Archive<W: Write> {
    cpio: Cpio<W>,
    dirs: BTreeSet<String>,
}

impl<W: Write> Archive<W> {
    fn new(out: W) -> Archive<W> {
        Archive {
            cpio: Cpio::new(out),
            dirs: BTreeSet::new(),
        }
    }

    fn skeleton(&mut self) -> std::io::Result<()> {
        for d in [
            "usr",
            "usr/bin",
            "usr/sbin",
            "usr/lib",
            "usr/lib64",
            "etc",
            "proc",
            "sys",
            "dev",
            "tmp",
            "run",
            "root",
        ] {
            self.mkdir(d)?;
        }
        for (l, t) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            self.cpio.symlink(l, t)?;
        }
        Ok(())
    }

    fn mkdir(&mut self, d: &str) -> std::io::Result<()> {
        if d.is_empty() || self.dirs.contains(d) {
            return Ok(());
        }
        if let Some((parent, _)) = d.rsplit_once('/') {
            self.mkdir(parent)?;
        }
        self.dirs.insert(d.to_string());
        self.cpio.dir(d)
    }

    fn copy(&mut self, from: &Path, to: &str) -> Result<(), String> {
        let data = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
        let mode = std::fs::metadata(from)
            .map(|m| m.mode() & 0o777)
            .unwrap_or(0o644);
        self.data(to, mode, &data)
    }

    /// A file with its parent folders (`to` is under usr/ or etc/, never via a top symlink).
    fn data(&mut self, to: &str, mode: u32, data: &[u8]) -> Result<(), String> {
        if let Some((parent, _)) = to.rsplit_once('/') {
            self.mkdir(parent).map_err(|e| e.to_string())?;
        }
        self.cpio.file(to, mode, data).map_err(|e| e.to_string())
    }
}

/// The per-run archive holding the agent: this very `iblab` binary as `/init`, stripped
/// of debug sections when `strip` is installed (the guest unpacks it into RAM).
pub fn agent_archive(work: &Path) -> Result<Vec<u8>, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find the iblab binary: {e}"))?;
    let stripped = work.join("iblab.stripped");
    let data = match which("strip") {
        Some(strip) => {
            let ok = std::process::Command::new(strip)
                .arg("-o")
                .arg(&stripped)
                .arg(&me)
                .stderr(std::process::Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            let d = if ok {
                std::fs::read(&stripped).ok()
            } else {
                None
            };
            let _ = std::fs::remove_file(&stripped);
            d
        }
        None => None,
    };
    let data = match data {
        Some(d) => d,
        None => std::fs::read(&me).map_err(|e| format!("{}: {e}", me.display()))?,
    };
    let mut c = Cpio::new(Vec::new());
    c.file("init", 0o755, &data).map_err(|e| e.to_string())?;
    c.finish().map_err(|e| e.to_string())
}

/// Write base image + agent archive into one initrd for qemu's `-initrd` (off the runtime:
/// it copies the image and runs `strip`).
pub async fn combined_initrd(img: &Image, work: &Path) -> Result<PathBuf, String> {
    let (base, work) = (img.base.clone(), work.to_path_buf());
    off_runtime(move || {
        let path = work.join("initrd.cpio");
        let agent = agent_archive(&work)?;
        let mut out =
            std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut base =
            std::fs::File::open(&base).map_err(|e| format!("{}: {e}", base.display()))?;
        std::io::copy(&mut base, &mut out).map_err(|e| e.to_string())?;
        out.write_all(&agent).map_err(|e| e.to_string())?;
        Ok(path)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_kernel_behind_the_metapackage() {
        assert_eq!(
            parse_depends("linux-image-6.1.0-56-amd64 (= 6.1.192-2)"),
            Some(("linux-image-6.1.0-56-amd64".into(), "6.1.192-2".into()))
        );
        assert_eq!(parse_depends("linux-base, initramfs-tools"), None);
    }

    #[test]
    fn host_paths_land_in_merged_usr() {
        assert_eq!(
            merged(Path::new("/lib/x86_64-linux-gnu/libc.so.6")),
            "usr/lib/x86_64-linux-gnu/libc.so.6"
        );
        assert_eq!(
            merged(Path::new("/lib64/ld-linux-x86-64.so.2")),
            "usr/lib64/ld-linux-x86-64.so.2"
        );
        assert_eq!(merged(Path::new("/usr/bin/ip")), "usr/bin/ip");
    }

    #[test]
    fn the_key_follows_the_inputs() {
        let a = Inputs {
            format: FORMAT,
            kernel_package: "linux-image-6.1.0-56-amd64".into(),
            kernel_version: "6.1.192-2".into(),
            packages: BTreeMap::from([("perftest".into(), "4.5+0.17-1".into())]),
            modules: vec!["rdma_rxe".into()],
            programs: vec!["ip".into()],
        };
        let mut b = a.clone();
        assert_eq!(a.key(), b.key());
        b.packages.insert("perftest".into(), "4.5+0.18-1".into());
        assert_ne!(a.key(), b.key());
        assert_eq!(a.key().len(), 16);
    }

    /// A scratch folder of this test process, empty.
    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("iblab-image-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A run's state file kept in `dir` (opened, not created: no live marker).
    fn run_state(dir: &Path) -> StateFile {
        let path = dir.join("run.json");
        let state = crate::run::state::RunState {
            run_id: "test".into(),
            lab: "lab".into(),
            scenario: "default".into(),
            backend: "vm".into(),
            owner_pid: std::process::id(),
            started: String::new(),
            run_dir: dir.to_path_buf(),
            resources: vec![],
            nodes: vec![],
            kept: false,
        };
        std::fs::write(&path, serde_json::to_string(&state).unwrap()).unwrap();
        StateFile::open(&path).unwrap()
    }

    /// A run that waited for another's build and gave up tears down what it recorded:
    /// the holder's lock must survive that, and still hold.
    #[tokio::test(flavor = "current_thread")]
    async fn a_run_that_waited_leaves_the_holders_lock() {
        let dir = scratch("waited");
        let holder = BuildLock::take(&dir, Duration::from_secs(1)).await.unwrap();
        // What the waiting run recorded (the lock itself, before the lock was no resource).
        let waiter = run_state(&dir);
        let err = BuildLock::take(&dir, Duration::from_millis(300))
            .await
            .err()
            .expect("the lock is held");
        assert!(err.contains("another iblab"), "{err}");
        let problems = crate::run::state::undo(&waiter.snapshot().resources).await;
        assert!(problems.is_empty(), "{problems:?}");
        assert!(
            dir.join("build.lock").exists(),
            "the waiting run's teardown removed the holder's lock"
        );
        assert!(
            BuildLock::take(&dir, Duration::from_millis(100))
                .await
                .is_err(),
            "the lock no longer holds while its holder builds"
        );
        drop(holder);
        assert!(!dir.join("build.lock").exists(), "the holder removes it");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A build that crashed left its lock file behind, but its flock died with it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stale_lock_file_does_not_block_the_next_build() {
        let dir = scratch("stale");
        std::fs::write(dir.join("build.lock"), "4242\n").unwrap();
        let lock = BuildLock::take(&dir, Duration::from_millis(500)).await;
        assert!(lock.is_ok(), "{:?}", lock.err());
        drop(lock);
        assert!(!dir.join("build.lock").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Waiting for another run's build must leave the runtime free: a signal (here a
    /// timer) is seen while the lock is still held.
    #[tokio::test(flavor = "current_thread")]
    async fn waiting_for_the_lock_leaves_the_runtime_free() {
        let dir = scratch("async-wait");
        let holder = BuildLock::take(&dir, Duration::from_secs(1)).await.unwrap();
        let started = Instant::now();
        tokio::select! {
            biased;
            r = BuildLock::take(&dir, Duration::from_secs(3)) => {
                panic!("the wait ended before the timer, after {:?}: {:?}", started.elapsed(), r.err())
            }
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        drop(holder);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Dropping a build step (Ctrl-C, SIGTERM) kills the program it runs and every
    /// process that program started (as dpkg-deb starts its decompressor).
    #[tokio::test(flavor = "current_thread")]
    async fn an_interrupted_step_kills_its_program_and_its_children() {
        let dir = scratch("killed");
        let mark = dir.join("finished");
        let script = format!("(sleep 1; touch {}) & wait", mark.display());
        let argv = ["sh", "-c", script.as_str()];
        let step = run_async(&argv, None);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), step)
                .await
                .is_err()
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !mark.exists(),
            "a process went on after its step was dropped"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cache_dir_honours_the_override() {
        // Only reads the environment; the variable is not set in tests unless CI sets it.
        let d = cache_dir();
        assert!(d.is_absolute() || std::env::var_os("IBLAB_CACHE_DIR").is_some());
    }
}
