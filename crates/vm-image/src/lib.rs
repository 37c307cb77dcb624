//! The guest image: a Debian kernel and an initramfs (modules with rdma_rxe, busybox,
//! iproute2, perftest, rdmacm-utils, iperf3, libibverbs with the rxe provider) built from
//! Debian packages on first use, cached by a hash of its inputs, built under a lock.
//! The `iblab` binary rides in a small second archive made per run (see [`agent_archive`]).
//! The vm backend boots it; the archives are written by [`cpio`], the modules' order read by
//! [`kmod`].

pub mod cpio;
mod error;
pub mod kmod;

pub use error::{ImageError, NoPvh};

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use cpio::Cpio;
use iblab_sys::fs::PathError;
use iblab_sys::host::which;
use iblab_sys::progress;
use iblab_sys::state::{Resource, StateFile};

/// Bump when the layout of the image changes, so caches are rebuilt.
const FORMAT: u32 = 5;

/// Modules the guest loads at boot (their dependencies come along).
pub const MODULES: &[&str] = &[
    "veth",
    "bridge",
    "rdma_rxe",
    "rdma_ucm",
    "sch_netem",
    "sch_tbf",
    "nf_tables",
];

/// Modules loaded when the kernel has them as modules (7.x builds them in).
pub const MODULES_IF_PRESENT: &[&str] = &["virtio_pci", "virtio_console"];

/// Programs copied into the guest with their shared libraries.
pub const PROGRAMS: &[&str] = &[
    "ip",
    "rdma",
    "tc",
    "bridge",
    "nft",
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
    "tcpdump",
];

/// Debian packages the image is built from (their versions key the cache): those whose
/// files go into it ([`PROGRAMS`] with their libraries, busybox, the rxe provider), and
/// xz-utils, which unpacks the kernel's compressed modules (`.ko.xz`) as it is built.
pub const PACKAGES: &[&str] = &[
    "busybox-static",
    "iproute2",
    "nftables",
    "perftest",
    "ibverbs-utils",
    "rdmacm-utils",
    "ibverbs-providers",
    "libibverbs1",
    "librdmacm1",
    "iperf3",
    "tcpdump",
    "xz-utils",
];

/// busybox applets linked into /usr/bin (never ones a real program above provides).
const APPLETS: &[&str] = &[
    "sh", "cat", "ls", "sleep", "ping", "dmesg", "echo", "ps", "kill", "uname", "mkdir", "rm",
    "grep", "head", "tail", "wc", "mount", "free", "true", "false", "ethtool", "ss", "netstat",
];

/// Does the guest image carry `program` (one of its programs, or a busybox applet)?
pub fn carries(program: &str) -> bool {
    program == "busybox" || PROGRAMS.contains(&program) || APPLETS.contains(&program)
}

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
    /// The Debian suite the kernel was taken from (pinned: a run is repeatable).
    pub kernel_suite: String,
    pub kernel_package: String,
    pub kernel_version: String,
    /// The packages downloaded for it (the kernel image and its modules).
    pub kernel_parts: Vec<String>,
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

/// A file's path, length and modification time: it changes when the file is replaced
/// (what keys the per-binary initramfs and the booted-guest snapshot).
pub fn file_stamp(p: &Path) -> String {
    match std::fs::metadata(p) {
        Ok(m) => format!("{}:{}:{:?}", p.display(), m.len(), m.modified().ok()),
        Err(_) => format!("{}:?", p.display()),
    }
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

/// The host programs a build of the image starts through iblab's process layer (checked
/// by [`missing_packages`] and doctor, not part of a lab's program list: the build runs
/// allowing only these, [`iblab_sys::process::allowing`]).
pub const BUILD_PROGRAMS: &[&str] = &["apt-get", "dpkg-deb"];

fn run(argv: &[&str], cwd: Option<&Path>) -> Result<String, ImageError> {
    let mut c = std::process::Command::new(argv[0]);
    c.args(&argv[1..]).stdin(std::process::Stdio::null());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let out = c.output().map_err(|source| ImageError::Run {
        program: argv[0].to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(ImageError::Failed {
            command: argv.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`run`] without blocking the runtime, in a process group of its own that is killed
/// whole if the future is dropped (the run was interrupted): dpkg-deb's decompressor and
/// apt's download methods go with it.
async fn run_async(argv: &[&str], cwd: Option<&Path>) -> Result<String, ImageError> {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let out = iblab_sys::process::run_env(&argv, None, Duration::from_secs(1800), &[], cwd)
        .await
        .map_err(|source| ImageError::Run {
            program: argv[0].clone(),
            source,
        })?;
    if !out.success() {
        return Err(ImageError::Failed {
            command: argv.join(" "),
            stderr: out.stderr.trim().to_string(),
        });
    }
    Ok(out.stdout)
}

/// The Debian suite the guest kernel comes from (`$IBLAB_VM_KERNEL_SUITE`): it must serve a
/// kernel ≥ 7.1, whose rxe has a socket per network namespace, so one VM holds every node.
pub const DEFAULT_SUITE: &str = "trixie-backports";
/// The kernel taken from [`DEFAULT_SUITE`] unless `$IBLAB_VM_KERNEL_PACKAGE` names another
/// (`latest`: whatever the suite's `linux-image-amd64` points at). A package named by its
/// ABI, which the suite keeps after newer ones arrive: the same kernel on every run.
/// Why 7.2 and not the newest: on Debian's 7.3.4 the guest's rxe panicked the kernel on
/// lesson 3's write from unregistered memory ("Fatal exception in interrupt"), and 7.3
/// kernels showed go-back-N retries through lesson 5's lossless bottleneck; 7.2 kernels
/// passed both (measured on 7.2.12 and 7.2.13).
pub const DEFAULT_KERNEL_PACKAGE: &str = "linux-image-7.2.12+deb13-amd64";
/// Where that suite is fetched from (`$IBLAB_VM_KERNEL_MIRROR`).
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// The oldest kernel whose rxe works inside a network namespace.
pub const MIN_KERNEL: (u32, u32) = (7, 1);
/// How old the private package lists may get before the next run refreshes them.
const LISTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The suite and mirror the guest kernel is fetched from.
pub fn kernel_source() -> (String, String) {
    let var = |k: &str, d: &str| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| d.to_string())
    };
    (
        var("IBLAB_VM_KERNEL_SUITE", DEFAULT_SUITE),
        var("IBLAB_VM_KERNEL_MIRROR", DEFAULT_MIRROR),
    )
}

/// The private apt configuration (its own sources, lists and cache under the image cache):
/// the host's apt sources, lists and /boot are never touched.
fn apt_options() -> Vec<String> {
    let d = cache_dir().join("apt");
    let o = |k: &str, v: &Path| format!("-oDir::{k}={}", v.display());
    vec![
        o("Etc::sourcelist", &d.join("sources.list")),
        o("Etc::sourceparts", &d.join("sources.list.d")),
        o("State::Lists", &d.join("lists")),
        o("State::status", Path::new("/dev/null")),
        o("Cache", &d.join("cache")),
        // Plain lists, read here without apt (a host may keep its own compressed).
        "-oAcquire::GzipIndexes=false".into(),
        "-oAPT::Sandbox::User=root".into(),
        "-oDebug::NoLocking=1".into(),
        "-q".into(),
    ]
}

/// The private package lists of the kernel's suite, refreshed (`apt-get update`) when
/// missing, older than a week, or for another suite or mirror.
fn private_lists(suite: &str, mirror: &str) -> Result<PathBuf, ImageError> {
    let d = cache_dir().join("apt");
    let lists = d.join("lists");
    let line = format!(
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {suite} main\n"
    );
    let sources = d.join("sources.list");
    let same = std::fs::read_to_string(&sources).is_ok_and(|t| t == line);
    let fresh = std::fs::metadata(lists.join("stamp"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < LISTS_MAX_AGE);
    let plain = std::fs::read_dir(&lists).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
    });
    if same && fresh && plain {
        return Ok(lists);
    }
    if !plain {
        // Lists kept compressed (by an older configuration): fetch them again, plain.
        let _ = std::fs::remove_dir_all(&lists);
    }
    for sub in ["lists/partial", "cache/archives/partial", "sources.list.d"] {
        std::fs::create_dir_all(d.join(sub)).map_err(PathError::of("create", d.join(sub)))?;
    }
    std::fs::write(&sources, &line).map_err(PathError::at(&sources))?;
    let mut argv = vec!["apt-get".to_string()];
    argv.extend(apt_options());
    argv.push("update".into());
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run(&argv, None).map_err(|e| ImageError::Lists {
        suite: suite.to_string(),
        mirror: mirror.to_string(),
        source: Box::new(e),
    })?;
    let _ = std::fs::write(lists.join("stamp"), suite);
    Ok(lists)
}

/// One package's stanza fields from apt's `*_Packages` lists (the highest version).
fn find_stanza(lists: &Path, package: &str) -> Option<BTreeMap<String, String>> {
    let mut best: Option<BTreeMap<String, String>> = None;
    for e in std::fs::read_dir(lists).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with("_Packages") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for stanza in text.split("\n\n") {
            let fields: BTreeMap<String, String> = stanza
                .lines()
                .filter(|l| !l.starts_with(' '))
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect();
            if fields.get("Package").map(String::as_str) != Some(package) {
                continue;
            }
            let Some(version) = fields.get("Version") else {
                continue;
            };
            let newer = match best.as_ref().and_then(|b| b.get("Version")) {
                None => true,
                Some(b) => version_key(version) > version_key(b),
            };
            if newer {
                best = Some(fields);
            }
        }
    }
    best
}

/// A rough ordering key for Debian versions of one package in one suite (numbers compare
/// as numbers): enough to pick the newest of a few.
fn version_key(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0))
        .collect()
}

/// The kernel `linux-image-amd64` of the pinned suite points at (or
/// `$IBLAB_VM_KERNEL_PACKAGE` there), its version, and the packages that hold the kernel
/// and its modules (`linux-binary-…` and `linux-modules-…` since 7.x; the image package
/// itself before).
fn kernel_package() -> Result<Kernel, ImageError> {
    let (suite, mirror) = kernel_source();
    let lists = private_lists(&suite, &mirror)?;
    let requested = requested_package(
        std::env::var("IBLAB_VM_KERNEL_PACKAGE").ok().as_deref(),
        &suite,
    );
    let image = match requested {
        Some(p) => p,
        None => {
            let meta = find_stanza(&lists, "linux-image-amd64").ok_or_else(|| {
                ImageError::NoMetapackage {
                    suite: suite.clone(),
                }
            })?;
            parse_depends(meta.get("Depends").map(String::as_str).unwrap_or(""))
                .map(|(name, _)| name)
                .ok_or_else(|| ImageError::NoKernelDependency {
                    suite: suite.clone(),
                })?
        }
    };
    let stanza = find_stanza(&lists, &image).ok_or_else(|| ImageError::NoPackage {
        suite: suite.clone(),
        package: image.clone(),
    })?;
    let version = stanza.get("Version").cloned().unwrap_or_default();
    let depends = stanza.get("Depends").cloned().unwrap_or_default();
    let mut parts: Vec<String> = depends
        .split(',')
        .filter_map(|d| d.split_whitespace().next())
        .filter(|n| n.starts_with("linux-binary-") || n.starts_with("linux-modules-"))
        .map(str::to_string)
        .collect();
    if parts.is_empty() {
        parts.push(image.clone());
    }
    let release = kernel_release_of(&image);
    Ok(Kernel {
        suite,
        package: image,
        version,
        parts,
        release,
    })
}

/// The kernel package asked for: `$IBLAB_VM_KERNEL_PACKAGE` (`latest`: none, follow the
/// suite's `linux-image-amd64`), else the pinned one where the suite is the default one
/// (another suite has its own package names: it is followed).
fn requested_package(var: Option<&str>, suite: &str) -> Option<String> {
    match var.map(str::trim).filter(|v| !v.is_empty()) {
        Some("latest") => None,
        Some(p) => Some(p.to_string()),
        None if suite == DEFAULT_SUITE => Some(DEFAULT_KERNEL_PACKAGE.to_string()),
        None => None,
    }
}

/// `linux-image-7.3.4+deb13-amd64` → `7.3.4+deb13-amd64`.
fn kernel_release_of(package: &str) -> String {
    package
        .strip_prefix("linux-image-")
        .unwrap_or(package)
        .to_string()
}

/// Major and minor of a kernel release (`7.3.4+deb13-amd64` → (7, 3)).
pub fn major_minor(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The guest kernel the image is built from.
struct Kernel {
    suite: String,
    package: String,
    version: String,
    parts: Vec<String>,
    release: String,
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
fn package_versions() -> Result<BTreeMap<String, String>, ImageError> {
    let found = installed();
    let missing = missing_packages();
    if !missing.is_empty() {
        return Err(ImageError::PackagesMissing(missing));
    }
    Ok(found)
}

/// Everything the image is built from, as of now.
pub fn inputs() -> Result<Inputs, ImageError> {
    let k = kernel_package()?;
    match major_minor(&k.release) {
        Some(v) if v >= MIN_KERNEL => {}
        _ => {
            return Err(ImageError::OldKernel {
                suite: k.suite,
                release: k.release,
                version: k.version,
            });
        }
    }
    Ok(Inputs {
        format: FORMAT,
        kernel_suite: k.suite,
        kernel_package: k.package,
        kernel_version: k.version,
        kernel_parts: k.parts,
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
    pub async fn take(dir: &Path, wait: Duration) -> Result<BuildLock, ImageError> {
        std::fs::create_dir_all(dir).map_err(PathError::of("create", dir))?;
        let path = dir.join("build.lock");
        let deadline = Instant::now() + wait;
        loop {
            if let Some(lock) = BuildLock::try_take(&path)? {
                return Ok(lock);
            }
            if Instant::now() > deadline {
                return Err(ImageError::LockBusy {
                    waited_s: wait.as_secs(),
                    lock: path,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The lock if nobody holds it; never waits.
    fn try_take(path: &Path) -> Result<Option<BuildLock>, ImageError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(PathError::of("open", path))?;
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
    work: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(ImageError::Stopped)?
}

/// The image for the current inputs: from the cache, or built now (under the lock).
/// Nothing here blocks the runtime: an interrupt is seen at once, the download is killed,
/// and what runs on a blocking thread still holds the lock until it ends.
pub async fn ensure(state: &StateFile, run_id: &str) -> Result<Image, ImageError> {
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
        .map_err(ImageError::State)?;
    let fetched = iblab_sys::process::allowing(
        "building the vm image",
        BUILD_PROGRAMS,
        fetch_kernel(&inputs, &work),
    )
    .await;
    let out = match fetched {
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
fn install(mut img: Image, inputs: &Inputs, work: &Path, t: Instant) -> Result<Image, ImageError> {
    let dir = cache_dir().join(format!("img-{}", inputs.key()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(work.join("img"), &dir).map_err(PathError::of("move the image into", &dir))?;
    img.kernel = dir.join(
        img.kernel
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| "vmlinuz".into()),
    );
    img.base = dir.join("base.cpio");
    img.build_s = t.elapsed().as_secs_f64();
    let text = serde_json::to_string_pretty(&img).unwrap_or_default();
    std::fs::write(dir.join("manifest.json"), text).map_err(ImageError::Manifest)?;
    prune(&dir);
    Ok(img)
}

/// Remove images built from other inputs once nothing has touched them for a day: iblab
/// builds of another version sharing this cache (each makes its own initrd in its image's
/// folder) must not remove each other's image on every run.
fn prune(keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let unused = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(24 * 3600));
        let stale = p != keep
            && unused
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
async fn fetch_kernel(inputs: &Inputs, work: &Path) -> Result<PathBuf, ImageError> {
    let dir = work.to_path_buf();
    off_runtime(move || {
        let _ = std::fs::remove_dir_all(&dir);
        let img_dir = dir.join("img");
        Ok(std::fs::create_dir_all(&img_dir).map_err(PathError::of("create", &img_dir))?)
    })
    .await?;
    let mut argv = vec!["apt-get".to_string()];
    argv.extend(apt_options());
    argv.push("download".into());
    for part in &inputs.kernel_parts {
        argv.push(format!("{part}={}", inputs.kernel_version));
    }
    progress::detail(&format!(
        "vm image: downloading {} (apt-get download)",
        argv[argv.len() - inputs.kernel_parts.len()..].join(" ")
    ));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run_async(&argv, Some(work)).await?;
    let dir = work.to_path_buf();
    let debs = off_runtime(move || {
        let debs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(ImageError::Io)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .collect();
        match debs.is_empty() {
            true => Err(ImageError::NoDeb),
            false => Ok(debs),
        }
    })
    .await?;
    let root = work.join("kernel");
    progress::detail("vm image: unpacking the kernel, assembling modules and programs");
    let root_s = root.to_string_lossy();
    for deb in debs {
        let deb_s = deb.to_string_lossy();
        run_async(&["dpkg-deb", "-x", &deb_s, &root_s], None).await?;
        let _ = tokio::fs::remove_file(&deb).await;
    }
    Ok(root)
}

/// The image out of the unpacked kernel at `root` and this host's packages, in `work/img`.
fn assemble(inputs: &Inputs, work: &Path, root: &Path) -> Result<Image, ImageError> {
    let img_dir = work.join("img");
    // Merged /usr (7.x packages) or not (older ones).
    let modroot = ["usr/lib/modules", "lib/modules"]
        .iter()
        .map(|d| root.join(d))
        .find(|d| d.is_dir())
        .ok_or(ImageError::NoModules)?;
    let release = std::fs::read_dir(&modroot)
        .map_err(PathError::at(&modroot))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .next()
        .ok_or(ImageError::NoModules)?;
    let vmlinuz = [
        modroot.join(&release).join("vmlinuz"),
        root.join("boot").join(format!("vmlinuz-{release}")),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .ok_or_else(|| ImageError::NoVmlinuz(release.clone()))?;
    std::fs::copy(&vmlinuz, img_dir.join("vmlinuz")).map_err(PathError::at(&vmlinuz))?;
    // The uncompressed kernel, booted through its PVH entry: no decompression and no
    // real-mode setup under TCG (measured: 1.3–2 s less per boot). Else the bzImage.
    let kernel_file = match pvh_vmlinux(&vmlinuz, &img_dir.join("vmlinux")) {
        Ok(()) => "vmlinux",
        Err(e) => {
            tracing::info!("booting the compressed kernel: {e}");
            "vmlinuz"
        }
    };
    let index = kmod::Index::scan(&modroot.join(&release)).map_err(ImageError::Io)?;
    let wanted: Vec<&str> = MODULES_IF_PRESENT
        .iter()
        .copied()
        .filter(|m| index.has(m))
        .chain(MODULES.iter().copied())
        .collect();
    let modules = index.load_order(&wanted)?;

    // 2. The archive.
    let file = std::fs::File::create(img_dir.join("base.cpio")).map_err(ImageError::Io)?;
    let mut a = Archive::new(std::io::BufWriter::new(file));
    a.skeleton().map_err(ImageError::Io)?;
    let mut order = String::new();
    for m in &modules {
        // Compressed modules (`.ko.xz`) go in decompressed: the agent loads them as is.
        let name = m
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("x.ko")
            .trim_end_matches(".xz")
            .to_string();
        let data = kmod::read(m)?;
        a.data(&format!("usr/lib/modules/{name}"), 0o644, &data)?;
        order.push_str(&format!("/usr/lib/modules/{name}\n"));
    }
    a.data("etc/iblab/modules", 0o644, order.as_bytes())?;
    a.data("etc/iblab/release", 0o644, release.as_bytes())?;
    let busybox = which("busybox").ok_or(ImageError::NoBusybox)?;
    a.copy(&busybox, "usr/bin/busybox")?;
    let (programs, files) = programs_and_libraries()?;
    for f in &files {
        let canon = std::fs::canonicalize(f).map_err(PathError::at(f))?;
        let dest = merged(f);
        a.copy(&canon, &dest)?;
    }
    let driver = Path::new("/etc/libibverbs.d/rxe.driver");
    a.copy(driver, "etc/libibverbs.d/rxe.driver")?;
    // root by name: tcpdump looks its user up (`-Z root`) before it captures.
    a.data("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n")?;
    a.data("etc/group", 0o644, b"root:x:0:\n")?;
    let have: BTreeSet<String> = programs
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for app in APPLETS.iter().filter(|a| !have.contains(**a)) {
        a.cpio
            .symlink(&format!("usr/bin/{app}"), "busybox")
            .map_err(ImageError::Io)?;
    }
    a.cpio.finish().map_err(ImageError::Io)?;
    Ok(Image {
        key: inputs.key(),
        kernel: img_dir.join(kernel_file),
        base: img_dir.join("base.cpio"),
        kernel_release: release,
        inputs: inputs.clone(),
        build_s: 0.0,
        cached: false,
    })
}

/// The programs the guest runs (canonical paths) and every file they need: the programs,
/// the rxe provider found next to libibverbs, libgcc_s, and the libraries of each.
fn programs_and_libraries() -> Result<(Vec<PathBuf>, BTreeSet<PathBuf>), ImageError> {
    let mut programs = Vec::new();
    for p in PROGRAMS {
        let path = which(p).ok_or(ImageError::NotInstalled(p))?;
        programs.push(std::fs::canonicalize(&path).unwrap_or(path));
    }
    // The rxe provider and its driver file, found next to libibverbs.
    let libdir = ldd(&programs[PROGRAMS
        .iter()
        .position(|p| *p == "ibv_devinfo")
        .unwrap_or(0)])
    .into_iter()
    .find(|l| {
        l.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("libibverbs.so"))
    })
    .and_then(|l| l.parent().map(Path::to_path_buf))
    .ok_or(ImageError::NoLibibverbs)?;
    let provider = std::fs::read_dir(libdir.join("libibverbs"))
        .map_err(ImageError::RxeProviderFolder)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("librxe-"))
        })
        .ok_or(ImageError::NoRxeProvider)?;
    let mut files: BTreeSet<PathBuf> = programs.iter().cloned().collect();
    files.insert(provider.clone());
    files.insert(libdir.join("libgcc_s.so.1"));
    for f in files.clone() {
        files.extend(ldd(&f));
    }
    Ok((programs, files))
}

/// Extract the ELF kernel from a bzImage (its payload, compressed with zstd, xz or gzip,
/// found by magic and decompressed by that tool) when it has a PVH entry point (a Xen ELF
/// note of type 18, `XEN_ELFNOTE_PHYS32_ENTRY`), which qemu boots directly.
fn pvh_vmlinux(bzimage: &Path, out: &Path) -> Result<(), NoPvh> {
    let data = std::fs::read(bzimage).map_err(|source| NoPvh::Read {
        path: bzimage.to_path_buf(),
        source,
    })?;
    let formats: [(&[u8], &str); 3] = [
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\xfd7zXZ\x00", "xz"),
        (b"\x1f\x8b\x08", "gzip"),
    ];
    for (magic, tool) in formats {
        let Some(at) = data.windows(magic.len()).position(|w| w == magic) else {
            continue;
        };
        let mut child = std::process::Command::new(tool)
            .args(["-dc"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|source| NoPvh::Run { tool, source })?;
        let mut stdin = child.stdin.take().ok_or(NoPvh::NoStdin)?;
        let payload = data[at..].to_vec();
        // The payload is followed by the bzImage's trailer: the tool ends with an error
        // after writing everything, so its status is not looked at.
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(&payload);
        });
        let output = child
            .wait_with_output()
            .map_err(|source| NoPvh::Tool { tool, source })?;
        let _ = feeder.join();
        let elf = output.stdout;
        if elf.get(..4) != Some(b"\x7fELF") {
            continue;
        }
        if !has_pvh_note(&elf) {
            return Err(NoPvh::NoEntry);
        }
        return std::fs::write(out, &elf).map_err(|source| NoPvh::Write {
            path: out.to_path_buf(),
            source,
        });
    }
    Err(NoPvh::NoPayload)
}

/// Whether an ELF64 image has a `Xen` note of type 18 (PVH entry) in a PT_NOTE segment.
fn has_pvh_note(elf: &[u8]) -> bool {
    let u16_at = |o: usize| {
        elf.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a) as usize
        })
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    for i in 0..phnum {
        let h = phoff + i * phentsize;
        if u32_at(h) != Some(4) {
            continue; // not PT_NOTE
        }
        let (Some(off), Some(size)) = (u64_at(h + 8), u64_at(h + 32)) else {
            continue;
        };
        let mut at = off;
        let end = off.saturating_add(size).min(elf.len());
        while at + 12 <= end {
            let (Some(namesz), Some(descsz), Some(kind)) =
                (u32_at(at), u32_at(at + 4), u32_at(at + 8))
            else {
                break;
            };
            let name = elf.get(at + 12..at + 12 + namesz).unwrap_or_default();
            if name.starts_with(b"Xen") && kind == 18 {
                return true;
            }
            at += 12 + namesz.div_ceil(4) * 4 + descsz.div_ceil(4) * 4;
        }
    }
    false
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

/// Shared objects a program loads, as `ldd` lists them (the loader included); none when
/// ldd cannot say (a static program).
fn ldd(program: &Path) -> Vec<PathBuf> {
    let text = run(&["ldd", &program.to_string_lossy()], None).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
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

    fn copy(&mut self, from: &Path, to: &str) -> Result<(), ImageError> {
        let data = std::fs::read(from).map_err(PathError::at(from))?;
        let mode = std::fs::metadata(from)
            .map(|m| m.mode() & 0o777)
            .unwrap_or(0o644);
        self.data(to, mode, &data)
    }

    /// A file with its parent folders (`to` is under usr/ or etc/, never via a top symlink).
    fn data(&mut self, to: &str, mode: u32, data: &[u8]) -> Result<(), ImageError> {
        if let Some((parent, _)) = to.rsplit_once('/') {
            self.mkdir(parent).map_err(ImageError::Io)?;
        }
        self.cpio.file(to, mode, data).map_err(ImageError::Io)
    }
}

/// The per-run archive holding the agent: this very `iblab` binary as `/init`, stripped
/// of debug sections when `strip` is installed (the guest unpacks it into RAM).
pub fn agent_archive(work: &Path) -> Result<Vec<u8>, ImageError> {
    let me = std::env::current_exe().map_err(ImageError::Exe)?;
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
        None => std::fs::read(&me).map_err(PathError::at(&me))?,
    };
    let mut c = Cpio::new(Vec::new());
    c.file("init", 0o755, &data).map_err(ImageError::Io)?;
    c.finish().map_err(ImageError::Io)
}

/// Base image + agent archive as one initrd for qemu's `-initrd`, kept beside the image
/// for this very iblab binary (keyed by its path, size and modification time): a warm run
/// neither strips nor copies anything. Off the runtime (it may run `strip`).
pub async fn combined_initrd(img: &Image, work: &Path) -> Result<PathBuf, ImageError> {
    let (base, work) = (img.base.clone(), work.to_path_buf());
    off_runtime(move || {
        let me = std::env::current_exe().map_err(ImageError::Exe)?;
        std::fs::metadata(&me).map_err(PathError::at(&me))?;
        let stamp = file_stamp(&me);
        let dir = base
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| work.clone());
        let path = dir.join(format!("initrd-{:016x}.cpio", fnv1a(stamp.as_bytes())));
        if path.exists() {
            // Mark the image as in use (its folder's time): see prune.
            let mark = dir.join(format!("used-{}", std::process::id()));
            if std::fs::write(&mark, b"").is_ok() {
                let _ = std::fs::remove_file(&mark);
            }
            return Ok(path);
        }
        let agent = agent_archive(&work)?;
        let tmp = dir.join(format!("initrd-{}.tmp", std::process::id()));
        let mut out = std::fs::File::create(&tmp).map_err(PathError::at(&tmp))?;
        let mut from = std::fs::File::open(&base).map_err(PathError::at(&base))?;
        std::io::copy(&mut from, &mut out).map_err(ImageError::Io)?;
        out.write_all(&agent).map_err(ImageError::Io)?;
        drop(out);
        std::fs::rename(&tmp, &path).map_err(PathError::at(&path))?;
        prune_initrds(&dir, &path);
        Ok(path)
    })
    .await
}

/// Remove initrds made for other iblab binaries, once they are an hour old (a run that
/// just made one may still be about to boot it).
fn prune_initrds(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(3600));
        if p != keep && name.starts_with("initrd-") && old {
            let _ = std::fs::remove_file(&p);
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_kernel_is_pinned_by_package_in_the_default_suite_and_followed_elsewhere() {
        let pinned = Some(DEFAULT_KERNEL_PACKAGE.to_string());
        assert_eq!(requested_package(None, DEFAULT_SUITE), pinned);
        assert_eq!(requested_package(Some(" "), DEFAULT_SUITE), pinned);
        assert_eq!(requested_package(Some("latest"), DEFAULT_SUITE), None);
        assert_eq!(requested_package(None, "sid"), None);
        assert_eq!(
            requested_package(Some("linux-image-7.2.13+deb14-amd64"), "sid").as_deref(),
            Some("linux-image-7.2.13+deb14-amd64")
        );
        // The pin is a kernel the one-VM backend can use.
        let release = kernel_release_of(DEFAULT_KERNEL_PACKAGE);
        assert!(
            major_minor(&release).is_some_and(|v| v >= MIN_KERNEL),
            "{release}"
        );
    }

    use super::*;

    /// The one list `up` installs from names the package of every program the image copies
    /// from this host, and of busybox and xz, which its build takes too: a package missing
    /// here would be found only when the build fails (as nftables once was).
    #[test]
    fn every_program_the_image_takes_from_the_host_has_its_package_listed() {
        for p in PROGRAMS.iter().chain(&["busybox", "xz"]) {
            let pkg = iblab_core::caps::package_of(p)
                .unwrap_or_else(|| panic!("iblab knows no package of {p}"));
            assert!(
                PACKAGES.contains(&pkg),
                "{p} comes from {pkg}, which the image's PACKAGES do not list"
            );
        }
    }

    #[test]
    fn finds_the_kernel_behind_the_metapackage() {
        assert_eq!(
            parse_depends("linux-image-6.1.0-56-amd64 (= 6.1.192-2)"),
            Some(("linux-image-6.1.0-56-amd64".into(), "6.1.192-2".into()))
        );
        assert_eq!(parse_depends("linux-base, initramfs-tools"), None);
    }

    #[test]
    fn reads_the_kernel_release_and_picks_the_newest_stanza() {
        assert_eq!(
            kernel_release_of("linux-image-7.3.4+deb13-amd64"),
            "7.3.4+deb13-amd64"
        );
        assert_eq!(major_minor("7.3.4+deb13-amd64"), Some((7, 3)));
        assert_eq!(major_minor("6.1.0-56-amd64"), Some((6, 1)));
        assert!(major_minor("7.3.4+deb13-amd64").unwrap() >= MIN_KERNEL);
        assert!(major_minor("6.12.117-amd64").unwrap() < MIN_KERNEL);
        let dir = scratch("lists");
        std::fs::write(
            dir.join("x_main_binary-amd64_Packages"),
            "Package: linux-image-amd64\nVersion: 7.2.9-1~bpo13+1\nDepends: linux-image-7.2.9+deb13-amd64 (= 7.2.9-1~bpo13+1)\n\nPackage: linux-image-amd64\nVersion: 7.3.4-1~bpo13+1\nDepends: linux-base-amd64 (= 7.3.4-1~bpo13+1), linux-image-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1)\nDescription: x\n more\n",
        )
        .unwrap();
        let s = find_stanza(&dir, "linux-image-amd64").unwrap();
        assert_eq!(s["Version"], "7.3.4-1~bpo13+1");
        assert_eq!(
            parse_depends(&s["Depends"]).map(|d| d.0),
            Some("linux-image-7.3.4+deb13-amd64".to_string())
        );
        assert!(find_stanza(&dir, "linux-image-cloud-amd64").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An ELF64 header with one PT_NOTE segment holding the given notes.
    fn elf_with_notes(notes: &[(&[u8], u32)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, kind) in notes {
            let mut n = name.to_vec();
            n.push(0);
            body.extend_from_slice(&(n.len() as u32).to_le_bytes());
            body.extend_from_slice(&4u32.to_le_bytes());
            body.extend_from_slice(&kind.to_le_bytes());
            n.resize(n.len().div_ceil(4) * 4, 0);
            body.extend_from_slice(&n);
            body.extend_from_slice(&[0u8; 4]);
        }
        let mut elf = vec![0u8; 64 + 56];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let ph = 64;
        elf[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes());
        elf[ph + 8..ph + 16].copy_from_slice(&(120u64).to_le_bytes());
        elf[ph + 32..ph + 40].copy_from_slice(&(body.len() as u64).to_le_bytes());
        elf.extend_from_slice(&body);
        elf
    }

    #[test]
    fn finds_the_pvh_entry_note() {
        assert!(has_pvh_note(&elf_with_notes(&[
            (b"Linux", 18),
            (b"Xen", 18)
        ])));
        assert!(!has_pvh_note(&elf_with_notes(&[
            (b"Xen", 6),
            (b"Linux", 18)
        ])));
        assert!(!has_pvh_note(b"\x7fELF short"));
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
            kernel_suite: "trixie-backports".into(),
            kernel_package: "linux-image-7.3.4+deb13-amd64".into(),
            kernel_version: "7.3.4-1~bpo13+1".into(),
            kernel_parts: vec![
                "linux-binary-7.3.4+deb13-amd64".into(),
                "linux-modules-7.3.4+deb13-amd64".into(),
            ],
            packages: BTreeMap::from([("perftest".into(), "4.5+0.17-1".into())]),
            modules: vec!["rdma_rxe".into()],
            programs: vec!["ip".into()],
        };
        let mut b = a.clone();
        assert_eq!(a.key(), b.key());
        b.packages.insert("perftest".into(), "4.5+0.18-1".into());
        assert_ne!(a.key(), b.key());
        let mut c = a.clone();
        c.kernel_suite = "sid".into();
        assert_ne!(a.key(), c.key(), "the suite is part of the key");
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
        let state = iblab_sys::state::RunState {
            run_id: "test".into(),
            lab: "lab".into(),
            scenario: "default".into(),
            backend: "vm".into(),
            owner_pid: std::process::id(),
            owner_start_ticks: iblab_sys::state::this_owner().1,
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
        assert!(
            matches!(err, ImageError::LockBusy { .. }) && err.to_string().contains("another iblab"),
            "{err}"
        );
        let problems =
            iblab_sys::state::undo(&waiter.snapshot().resources, &iblab_backend::Backends(&[]))
                .await;
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
