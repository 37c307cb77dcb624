//! The quick lab image: this host's own tool binaries, the libraries they load (their ldd
//! closure) and the verbs/umad2sim plugins, packed in under a second. It carries only the
//! tools the host has installed; the debootstrap image is the complete one.

use iblab_sys::fs::PathError;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ImageError;
use super::rootfs::{Tarball, cache_dir, remove_tree, sha256_file};
use iblab_sys::host::which;
use iblab_sys::process;
use iblab_tools::ldd;

/// Programs copied when the host has them.
pub const PROGRAMS: &[&str] = &[
    // A shell, so `iblab shell` and `iblab exec … sh -c` work in its containers.
    "sh",
    "sleep",
    "cat",
    // Which process holds a tool server's port (fabric::listener).
    "ls",
    "grep",
    "ip",
    "bridge",
    "tc",
    "nft",
    "ping",
    "iperf3",
    "rdma",
    "ibv_devinfo",
    "ibv_devices",
    "ibv_rc_pingpong",
    "ib_write_bw",
    "ib_write_lat",
    "ib_read_bw",
    "ib_read_lat",
    "ib_send_bw",
    "ib_send_lat",
    "rping",
    "tcpdump",
    "ibsim",
    "opensm",
    "smpquery",
    "ibroute",
    "ibnetdiscover",
    "ibstat",
    "ibaddr",
    "sminfo",
    "saquery",
    "perfquery",
];

/// Folders of plugins loaded with dlopen (no ldd shows them), when present.
fn plugin_dirs() -> Vec<PathBuf> {
    let mut v = vec![
        PathBuf::from("/etc/libibverbs.d"),
        PathBuf::from("/etc/iproute2"),
    ];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        for e in entries.flatten() {
            let p = e.path();
            if p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with("-linux-gnu"))
            {
                v.push(p.join("libibverbs"));
                v.push(p.join("umad2sim"));
                // rping and friends abort without it (it is loaded for thread cancellation).
                v.push(p.join("libgcc_s.so.1"));
            }
        }
    }
    v.into_iter().filter(|p| p.exists()).collect()
}

/// What went into a quick image.
pub struct Contents {
    pub tarball: Tarball,
    pub programs: Vec<String>,
    pub missing: Vec<String>,
}

/// Copy the host's tools into a fresh tree and pack it.
pub async fn build() -> Result<Contents, ImageError> {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(PathError::of("create", &dir))?;
    super::rootfs::remove_abandoned(&dir);
    let work = dir.join(format!("host-{}", std::process::id()));
    remove_tree(&work);
    let result = fill_and_pack(&work, &dir).await;
    remove_tree(&work);
    result
}

async fn fill_and_pack(work: &Path, dir: &Path) -> Result<Contents, ImageError> {
    let mut files: Vec<PathBuf> = Vec::new();
    let (mut programs, mut missing) = (Vec::new(), Vec::new());
    for p in PROGRAMS {
        match which(p) {
            Some(path) => {
                files.push(path);
                programs.push(p.to_string());
            }
            None => missing.push(p.to_string()),
        }
    }
    if !programs.iter().any(|p| p == "sleep") {
        return Err(ImageError::NoSleep);
    }
    for d in plugin_dirs() {
        if d.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&d)
                .map(|r| r.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            entries.sort();
            files.extend(entries);
        } else {
            files.push(d);
        }
    }
    // The ldd closure of every executable and shared object.
    let mut libs = Vec::new();
    for f in &files {
        let name = f.to_string_lossy();
        if !(f.starts_with("/etc") || name.ends_with(".conf") || name.ends_with(".driver")) {
            let argv = vec!["ldd".to_string(), name.into_owned()];
            if let Ok(out) = process::run(&argv, None, Duration::from_secs(10)).await {
                libs.extend(ldd::parse(&out.stdout).libraries);
            }
        }
    }
    files.extend(libs);
    files.sort();
    files.dedup();
    for f in &files {
        copy_into(work, f)?;
    }
    for (d, mode) in [
        ("tmp", 0o1777),
        ("root", 0o700),
        ("run", 0o755),
        ("var/log", 0o755),
        ("var/cache/opensm", 0o755),
        ("etc", 0o755),
    ] {
        make_dir(&work.join(d), mode)?;
    }
    // A merged-/usr host's /bin, /sbin, /lib and /lib64 are links into /usr: the same
    // links here where nothing was copied under them, so `#!/bin/sh` finds its shell.
    for d in ["bin", "sbin", "lib", "lib64"] {
        let host = Path::new("/").join(d);
        if let Ok(target) = std::fs::read_link(&host)
            && !work.join(d).exists()
        {
            std::os::unix::fs::symlink(&target, work.join(d)).map_err(|source| {
                ImageError::Link {
                    dir: d,
                    target: target.clone(),
                    source,
                }
            })?;
        }
    }
    write(work, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")?;
    write(work, "etc/group", "root:x:0:\n")?;
    let tar_path = dir.join(format!("rootfs-host-{}.tar", std::process::id()));
    pack(work, &tar_path).await?;
    let sha256 = sha256_file(&tar_path).await?;
    Ok(Contents {
        tarball: Tarball {
            path: tar_path,
            sha256,
        },
        programs,
        missing,
    })
}

/// Pack a tree into a tarball as the engine imports it (numeric owners).
pub async fn pack(work: &Path, tar_path: &Path) -> Result<(), ImageError> {
    let argv: Vec<String> = vec![
        "tar".into(),
        "--numeric-owner".into(),
        "-C".into(),
        work.to_string_lossy().into_owned(),
        "-cf".into(),
        tar_path.to_string_lossy().into_owned(),
        ".".into(),
    ];
    let out = process::run(&argv, None, Duration::from_secs(120))
        .await
        .map_err(|source| ImageError::Run {
            program: "tar",
            source,
        })?;
    if !out.success() {
        return Err(ImageError::Tar(out.stderr.trim().to_string()));
    }
    Ok(())
}

/// Copy `src` (following symlinks) to the same path under `root`, keeping its mode.
fn copy_into(root: &Path, src: &Path) -> Result<(), PathError> {
    let rel = src.strip_prefix("/").unwrap_or(src);
    let dst = root.join(rel);
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(PathError::of("create", parent))?;
    }
    if src.is_dir() {
        return Ok(());
    }
    std::fs::copy(src, &dst)
        .map(|_| ())
        .map_err(PathError::of("copy", src))
}

fn make_dir(p: &Path, mode: u32) -> Result<(), PathError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(p).map_err(PathError::of("create", p))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(PathError::of("chmod", p))
}

fn write(root: &Path, rel: &str, text: &str) -> Result<(), PathError> {
    let p = root.join(rel);
    std::fs::write(&p, text).map_err(PathError::of("write", &p))
}
