//! The debootstrap root filesystem of the lab image, packed as a tarball and cached by its
//! recipe's hash, so that re-importing the image takes seconds instead of a minute.

use iblab_sys::fs::PathError;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::ImageError;
use super::recipe::{Recipe, hex};
use iblab_sys::process;

/// Where rootfs tarballs are cached: `$IBLAB_CACHE_DIR`, else `/var/cache/iblab`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("IBLAB_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/iblab"))
}

/// A packed root filesystem and the sha256 of its bytes.
pub struct Tarball {
    pub path: PathBuf,
    pub sha256: String,
}

/// Paths left out of the image: package caches, apt lists, docs and locales (about 150 MB
/// of 330), and the pseudo filesystems the container runtime mounts itself.
const EXCLUDE: &[&str] = &[
    "./var/cache/apt/archives/*.deb",
    "./var/cache/apt/*.bin",
    "./var/lib/apt/lists/*",
    "./usr/share/doc/*",
    "./usr/share/man/*",
    "./usr/share/info/*",
    "./usr/share/locale/*",
    "./dev/*",
    "./proc/*",
    "./sys/*",
];

/// The cached tarball of `recipe`, made with debootstrap when not cached (or `rebuild`).
pub async fn debootstrap(
    recipe: &Recipe,
    rebuild: bool,
    say: &(dyn Fn(&str) + Sync),
) -> Result<Tarball, ImageError> {
    let dir = cache_dir();
    let key = &recipe.hash()[..16];
    let path = dir.join(format!("rootfs-{key}.tar"));
    let sum_path = dir.join(format!("rootfs-{key}.tar.sha256"));
    if !rebuild && path.exists() {
        let sha256 = match std::fs::read_to_string(&sum_path) {
            Ok(s) if s.trim().len() == 64 => s.trim().to_string(),
            _ => sha256_file(&path).await?,
        };
        say(&format!(
            "using the cached root filesystem {}",
            path.display()
        ));
        return Ok(Tarball { path, sha256 });
    }
    if iblab_sys::host::which("debootstrap").is_none() {
        return Err(ImageError::NoDebootstrap);
    }
    std::fs::create_dir_all(&dir).map_err(PathError::of("create", &dir))?;
    remove_abandoned(&dir);
    let work = dir.join(format!("build-{key}-{}", std::process::id()));
    remove_tree(&work);
    say(&format!(
        "debootstrap {} from {} with {} (about a minute; cached afterwards)",
        recipe.suite,
        recipe.mirror,
        recipe.packages.join(",")
    ));
    let argv: Vec<String> = vec![
        "debootstrap".into(),
        "--variant=minbase".into(),
        format!("--include={}", recipe.packages.join(",")),
        recipe.suite.clone(),
        work.to_string_lossy().into_owned(),
        recipe.mirror.clone(),
    ];
    let out = process::run(&argv, None, Duration::from_secs(30 * 60)).await;
    let log = dir.join(format!("debootstrap-{key}.log"));
    if let Ok(o) = &out {
        let _ = std::fs::write(&log, format!("{}\n--- stderr\n{}", o.stdout, o.stderr));
    }
    let ok = matches!(&out, Ok(o) if o.success());
    if !ok {
        remove_tree(&work);
        let (why, source) = match out {
            Ok(o) if o.timed_out => ("it did not finish within 30 minutes".to_string(), None),
            Ok(o) => (tail(&format!("{}{}", o.stdout, o.stderr), 6), None),
            Err(e) => (e.to_string(), Some(e)),
        };
        return Err(ImageError::Debootstrap {
            log,
            why,
            mirror: recipe.mirror.clone(),
            source,
        });
    }
    let tmp = path.with_extension("tar.tmp");
    let mut tar: Vec<String> = vec!["tar".into(), "--numeric-owner".into()];
    for x in EXCLUDE {
        tar.push(format!("--exclude={x}"));
    }
    tar.extend([
        "-C".into(),
        work.to_string_lossy().into_owned(),
        "-cf".into(),
        tmp.to_string_lossy().into_owned(),
        ".".into(),
    ]);
    let packed = process::run(&tar, None, Duration::from_secs(600)).await;
    remove_tree(&work);
    match packed {
        Ok(o) if o.success() => {}
        Ok(o) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(ImageError::Tar(o.stderr.trim().to_string()));
        }
        Err(source) => {
            return Err(ImageError::Run {
                program: "tar",
                source,
            });
        }
    }
    let sha256 = sha256_file(&tmp).await?;
    std::fs::rename(&tmp, &path).map_err(PathError::of("write", &path))?;
    let _ = std::fs::write(&sum_path, &sha256);
    Ok(Tarball { path, sha256 })
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The sha256 of a file, hex.
pub async fn sha256_file(path: &Path) -> Result<String, ImageError> {
    let p = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&p).map_err(PathError::of("read", &p))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(PathError::of("read", &p))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(hex(&h.finalize()))
    })
    .await
    .map_err(ImageError::Hash)?
}

/// Build trees (`build-…-PID`, `host-PID`) and quick-image tarballs (`rootfs-host-PID.tar`)
/// whose builder is gone: an interrupted build leaves them (a killed debootstrap can leave
/// /proc mounted in its tree).
pub fn remove_abandoned(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let tarball = name.starts_with("rootfs-host-") && name.ends_with(".tar");
        let tree = name.starts_with("build-") || name.starts_with("host-");
        let owner = (tarball || tree)
            .then(|| {
                let stem = name.trim_end_matches(".tar");
                stem.rsplit('-').next().and_then(|p| p.parse::<u32>().ok())
            })
            .flatten();
        if let Some(pid) = owner
            && pid != std::process::id()
            && !iblab_sys::pid::alive(pid)
        {
            if tarball {
                let _ = std::fs::remove_file(e.path());
            } else {
                remove_tree(&e.path());
            }
        }
    }
}

/// Remove a build tree, detaching anything debootstrap left mounted inside it first (a
/// failed run can leave /proc or /sys mounted there).
pub fn remove_tree(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let prefix = dir.to_string_lossy().into_owned();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .filter(|m| m == &prefix || m.starts_with(&format!("{prefix}/")))
        .collect();
    // Deepest first.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in &mounts {
        let _ = std::process::Command::new("umount")
            .args(["-l", m])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    let still_mounted = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|m| m.starts_with(&prefix))
        });
    if still_mounted {
        tracing::warn!("not removing {prefix}: something is still mounted inside it");
        return;
    }
    let _ = std::fs::remove_dir_all(dir);
}
