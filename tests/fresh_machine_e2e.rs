//! The newcomer's machine: a minimal Debian 12 root filesystem (`debootstrap
//! --variant=minbase bookworm`, from the archive, no registry) with nothing but the iblab
//! binary copied in. It runs in a chroot with mount and pid namespaces of its own and this
//! host's network, so that its apt reaches the archive; every lab node is a network
//! namespace of its own with no route out, as on any host. There:
//! - lesson 4's local form (`iblab up lesson4 --paths tcp,ib --backend local --yes`) and
//!   `iblab up tcp-loss --yes` pass from nothing, installing only what their own `--yes`
//!   installs;
//! - each package they installed, taken away in turn, is named before anything is
//!   deployed (exit 3, no run folder, nothing provisioned);
//! - the README's first command (`iblab up lesson5 --yes`) and `iblab up lesson1 --yes`
//!   (path ② in the vm backend:
//!   qemu and the guest image's packages installed by `--yes`) pass from nothing, each on a
//!   machine of its own, and each vm-side package taken away is named before anything is
//!   deployed or built;
//! - a program that is there but cannot be started (its interpreter missing) stops the
//!   run as an environment error naming it, not as a silent link;
//! - `--yes` says what it installs and one line while apt runs, apt's output in a log;
//!   without nftables, a run that may make loss with it (lesson 5 on path ① alone, local
//!   backend) is refused naming it; without qemu and nftables, lesson 5 names both at once.
//!
//! The binary is the one `cargo test` built (debug); the README's command builds a release
//! binary of the same code. The root filesystem is cached as a tarball under
//! `/var/cache/iblab/fresh` (written aside, then renamed); each test unpacks its own copy.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Mounts the root needs, then the command, inside the new mount namespace: the root is
/// made a mount point of its own (iproute2's `ip netns` remounts `/` as a slave), and
/// /proc, /sys, /dev, a fresh /run and /tmp.
const ENTER: &str = r#"set -e
root=$1; shift
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
mount -t tmpfs tmpfs "$root/tmp"
exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
"#;

/// The archive this host's apt uses (its deb822 or one-line sources), else Debian's.
fn mirror() -> String {
    if let Ok(m) = std::env::var("IBLAB_TEST_MIRROR") {
        return m;
    }
    let mut texts = vec![std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default()];
    if let Ok(d) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for e in d.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "sources" || x == "list") {
                texts.push(std::fs::read_to_string(p).unwrap_or_default());
            }
        }
    }
    for t in texts {
        for l in t.lines().map(str::trim) {
            let uri = l.strip_prefix("URIs:").map(str::trim).or_else(|| {
                l.strip_prefix("deb ")
                    .map(|r| r.split_whitespace().next().unwrap_or(""))
            });
            if let Some(u) = uri.and_then(|u| u.split_whitespace().next())
                && u.starts_with("http")
                && u.trim_end_matches('/').ends_with("/debian")
            {
                return u.to_string();
            }
        }
    }
    "http://deb.debian.org/debian".into()
}

/// The cached tarball of a minbase Debian 12, made with debootstrap when missing.
fn rootfs_tarball() -> PathBuf {
    let dir = PathBuf::from("/var/cache/iblab/fresh");
    let tar = dir.join("debian12-minbase.tar");
    if tar.exists() {
        return tar;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let work = dir.join(format!("build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let mirror = mirror();
    let out = Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(&work)
        .arg(&mirror)
        .output()
        .expect("debootstrap runs");
    assert!(
        out.status.success(),
        "debootstrap bookworm from {mirror} failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let tmp = dir.join(format!("debian12-minbase.tar.{}", std::process::id()));
    let packed = Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(&work)
        .arg("-cf")
        .arg(&tmp)
        .arg(".")
        .status()
        .unwrap();
    let _ = std::fs::remove_dir_all(&work);
    assert!(packed.success(), "tar of the root filesystem failed");
    std::fs::rename(&tmp, &tar).unwrap();
    tar
}

/// One newcomer's machine: an unpacked root with the iblab binary in /usr/local/bin.
struct Fresh {
    root: PathBuf,
}

impl Fresh {
    fn new(tag: &str) -> Fresh {
        let root = PathBuf::from(format!(
            "/var/tmp/iblab-e2e-fresh-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let ok = Command::new("tar")
            .args(["--numeric-owner", "-C"])
            .arg(&root)
            .arg("-xf")
            .arg(rootfs_tarball())
            .status()
            .unwrap();
        assert!(ok.success(), "unpacking the root filesystem failed");
        std::fs::copy(common::BIN, root.join("usr/local/bin/iblab")).unwrap();
        // The machine's own network settings: its resolver, and apt's settings for its
        // archive (a proxy, a snapshot's validity), as a newcomer's machine has them.
        let _ = std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"));
        if let Ok(d) = std::fs::read_dir("/etc/apt/apt.conf.d") {
            for e in d.flatten() {
                let _ = std::fs::copy(
                    e.path(),
                    root.join("etc/apt/apt.conf.d").join(e.file_name()),
                );
            }
        }
        Fresh { root }
    }

    /// Run `argv` in the machine, as root, with no terminal.
    fn run(&self, argv: &[&str]) -> Output {
        Command::new("unshare")
            .args([
                "--mount",
                "--pid",
                "--fork",
                "--propagation",
                "private",
                "sh",
                "-c",
                ENTER,
                "enter",
            ])
            .arg(&self.root)
            .args(["sh", "-c", "cd /root && exec \"$@\"", "in-root"])
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .expect("unshare runs")
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    fn run_folders(&self) -> usize {
        std::fs::read_dir(self.path("/root/iblab-runs"))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        // Its mounts lived in a mount namespace that ended with the command.
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The packages an `up --yes` installed, from its `installing: apt-get install -y …` line.
fn installed_by(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .filter_map(|l| l.strip_prefix("installing: apt-get install -y --no-install-recommends "))
        .flat_map(|l| l.split_whitespace().map(str::to_string))
        .collect()
}

fn prerequisites() -> bool {
    if !common::root() {
        return false;
    }
    for (tool, package) in [
        ("debootstrap", "debootstrap"),
        ("unshare", "util-linux"),
        ("chroot", "coreutils"),
    ] {
        if !common::installed(tool) {
            common::missing(&format!("{tool} (apt-get install {package})"));
            return false;
        }
    }
    true
}

/// The README's first command and `tcp-loss` pass on a bare Debian 12 with nothing but
/// their own `--yes`; every package that installed is then named, when taken away, before
/// anything is deployed; a program that cannot start is an environment error.
#[test]
fn a_newcomers_bare_machine_runs_the_labs_and_names_what_it_lacks() {
    if !prerequisites() {
        return;
    }
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = Fresh::new("newcomer");
    // A bare minbase system lacks even ping and ip.
    for p in ["ping", "ip", "iperf3"] {
        let o = m.run(&["sh", "-c", &format!("command -v {p}")]);
        assert!(
            !o.status.success(),
            "{p} is already there: not a bare machine"
        );
    }

    let mut needed: Vec<(String, &str)> = Vec::new();
    // Lesson 4's local form (① and ③ in this host's namespaces) and tcp-loss: the host-side
    // packages; lesson 5 and lesson 1 below bring the vm backend's.
    let up = |lab: &str, yes: bool| -> Vec<String> {
        let mut a: Vec<String> = ["iblab", "up", lab].map(String::from).to_vec();
        if lab == "lesson4" {
            a.extend(["--paths", "tcp,ib", "--backend", "local"].map(String::from));
        }
        if yes {
            a.push("--yes".into());
        }
        a
    };
    for lab in ["lesson4", "tcp-loss"] {
        let a = up(lab, true);
        let o = m.run(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let t = text(&o);
        assert_eq!(
            o.status.code(),
            Some(0),
            "iblab up {lab} --yes on a bare machine:\n{t}"
        );
        assert!(t.contains("PASS"), "{lab}:\n{t}");
        quiet_install(&m, &o);
        for p in installed_by(&o) {
            needed.push((p, lab));
        }
    }
    let names: Vec<&str> = needed.iter().map(|(p, _)| p.as_str()).collect();
    for p in [
        "iproute2",
        "iputils-ping",
        "iperf3",
        "opensm",
        "infiniband-diags",
        "ibsim-utils",
        "nftables",
    ] {
        assert!(
            names.contains(&p),
            "{p} was not installed by --yes: {names:?}"
        );
    }

    // Each package taken away in turn: the lab that needed it names it and deploys nothing.
    for (pkg, lab) in &needed {
        let a = up(lab, false);
        let args: Vec<&str> = a[2..].iter().map(String::as_str).collect();
        refused_without(&m, &[pkg], &args);
        let back = m.run(&["apt-get", "install", "-y", "-q", pkg]);
        assert!(back.status.success(), "reinstalling {pkg}: {}", text(&back));
    }

    // A fault a run may make with nftables (where the kernel has no netem) needs it on
    // the local backend too, for a subset of the paths: named before anything is deployed.
    refused_without(
        &m,
        &["nftables"],
        &["lesson5", "--paths", "tcp", "--backend", "local"],
    );
    let back = m.run(&["apt-get", "install", "-y", "-q", "nftables"]);
    assert!(
        back.status.success(),
        "reinstalling nftables: {}",
        text(&back)
    );

    // ping is there but cannot be started (its interpreter is missing, as after a broken
    // install): the link check says so, instead of blaming a silent cable.
    let ping = m.path("/usr/bin/ping");
    std::fs::remove_file(&ping).unwrap();
    std::fs::write(&ping, "#!/nonexistent/interpreter\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ping, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = m.run(&["iblab", "up", "tcp-loss"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "a ping that cannot start:\n{t}");
    assert!(t.contains("could not start `ping` on node"), "{t}");
    assert!(t.contains("apt-get install iputils-ping"), "{t}");
    assert!(
        !t.contains("carry no frames"),
        "a ping that could not start was read as a silent link:\n{t}"
    );
    // That run was torn down by iblab itself (what its own teardown could not remove it
    // says in a `teardown:` note; the pid namespace would end any process all the same).
    assert!(!t.contains("teardown:"), "{t}");
}

/// The packages the vm backend takes from a host whose kernel has no rxe: qemu, and every
/// package its guest image is built from.
const VM_SIDE: &[&str] = &[
    "qemu-system-x86",
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
    "xz-utils",
];

/// The command the project is known by, and lesson 1, on a bare Debian 12 whose kernel has
/// no rxe (this host's): `--yes` names and installs qemu and everything the vm backend's
/// guest image is built from, builds the image, boots the guest and passes, each lesson on
/// a machine of its own. Then each of those packages, taken away in turn, is named before
/// anything is deployed or built (exit 3, no run folder, no image build).
#[test]
fn a_bare_machine_runs_the_roce_lessons_in_a_vm_and_names_what_it_lacks() {
    if !prerequisites() {
        return;
    }
    let _serial = common::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut last = None;
    let mut installed = Vec::new();
    for lab in ["lesson5", "lesson1"] {
        let m = Fresh::new(&format!("vm-{lab}"));
        for p in ["qemu-system-x86_64", "nft", "busybox", "ib_write_bw", "xz"] {
            let o = m.run(&["sh", "-c", &format!("command -v {p}")]);
            assert!(
                !o.status.success(),
                "{p} is already there: not a bare machine"
            );
        }
        let o = m.run(&["iblab", "up", lab, "--yes"]);
        let t = text(&o);
        assert_eq!(
            o.status.code(),
            Some(0),
            "iblab up {lab} --yes on a bare machine:\n{t}"
        );
        assert!(t.contains("PASS"), "{lab}:\n{t}");
        assert!(
            t.contains("backend vm"),
            "{lab} did not run on the vm backend:\n{t}"
        );
        // One install, named before it ran, and nothing missing found after it.
        let lines = t.lines().filter(|l| l.starts_with("installing: ")).count();
        assert_eq!(lines, 1, "{lab} installed in {lines} rounds:\n{t}");
        quiet_install(&m, &o);
        installed = installed_by(&o);
        for p in VM_SIDE {
            assert!(
                installed.iter().any(|i| i == p),
                "{lab}: --yes did not install {p}: {installed:?}"
            );
        }
        last = Some((m, lab));
    }
    let (m, lab) = last.unwrap();

    // Each package taken away in turn, on lesson 1's machine (its image is cached there):
    // named with its package before anything is deployed, nothing built or booted.
    let mut named = Vec::new();
    for pkg in &installed {
        refused_without(&m, &[pkg], &[lab]);
        named.push(pkg.as_str());
        let back = m.run(&[
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            pkg,
        ]);
        assert!(back.status.success(), "reinstalling {pkg}: {}", text(&back));
    }
    for p in VM_SIDE {
        assert!(named.contains(p), "{p} was never taken away: {named:?}");
    }

    // Neither qemu nor nftables: both named at once, before anything is deployed or built.
    refused_without(&m, &["qemu-system-x86", "nftables"], &["lesson5"]);
}

/// With `packages` taken away, `iblab up ARGS` exits 3 naming every one of them on its
/// `missing on this host` line, and deploys, builds and writes nothing.
fn refused_without(m: &Fresh, packages: &[&str], args: &[&str]) {
    for pkg in packages {
        let gone = m.run(&["dpkg", "--remove", "--force-depends", pkg]);
        assert!(
            gone.status.success(),
            "dpkg --remove {pkg}: {}",
            text(&gone)
        );
    }
    let before = m.run_folders();
    let mut argv = vec!["iblab", "up"];
    argv.extend_from_slice(args);
    let o = m.run(&argv);
    let t = text(&o);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{args:?} without {packages:?}:\n{t}"
    );
    let line = t
        .lines()
        .find(|l| l.contains("missing on this host"))
        .unwrap_or_else(|| panic!("{args:?} without {packages:?} names nothing missing:\n{t}"));
    for pkg in packages {
        assert!(
            line.contains(&format!("(package {pkg})")),
            "{args:?} without {pkg} does not name it:\n{t}"
        );
    }
    for not in ["provisioned", "building the vm image"] {
        assert!(
            !t.contains(not),
            "{args:?} without {packages:?} went on ({not}):\n{t}"
        );
    }
    assert_eq!(
        m.run_folders(),
        before,
        "{args:?} without {packages:?} wrote a run folder"
    );
}

/// An `up --yes` that installed something said so in one line of packages and one line
/// standing for apt while it ran (with the path of apt's log), and none of apt's own
/// lines; the log holds them.
fn quiet_install(m: &Fresh, o: &Output) {
    let t = text(o);
    if installed_by(o).is_empty() {
        return;
    }
    for chatter in [
        "Unpacking ",
        "Setting up ",
        "Selecting previously unselected",
    ] {
        assert!(!t.contains(chatter), "apt's output on the terminal:\n{t}");
    }
    let log = t
        .lines()
        .find_map(|l| l.split("its output goes to ").nth(1))
        .unwrap_or_else(|| panic!("no line names apt's log:\n{t}"))
        .trim();
    let written = std::fs::read_to_string(m.path(log)).unwrap_or_default();
    assert!(written.contains("Setting up "), "{log} lacks apt's output");
}
