//! The operator's image: this iblab binary and the libraries it loads (its ldd closure),
//! a non-root user, and the folders it writes; nothing else (the lab pods it makes run the
//! lab image). Built here in under a second, no registry.

use iblab_sys::fs::PathError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::rootfs::{cache_dir, remove_tree, sha256_file};
use super::{Image, ImageError, find, import, label};
use crate::engine::Engine;
use iblab_sys::process;
use iblab_tools::ldd;

use iblab_core::images::OPERATOR_UID as UID;

use iblab_core::images::operator as reference;

fn copy_into(root: &Path, src: &Path, as_path: &Path) -> Result<(), PathError> {
    let dst = root.join(as_path.strip_prefix("/").unwrap_or(as_path));
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(PathError::of("create", parent))?;
    }
    std::fs::copy(src, &dst)
        .map(|_| ())
        .map_err(PathError::of("copy", src))
}

async fn fill(work: &Path) -> Result<(), ImageError> {
    let exe = std::env::current_exe().map_err(ImageError::Exe)?;
    // Stripped where binutils is here (a debug build is >100 MB, stripped ~30 MB).
    let dst = work.join("usr/local/bin/iblab");
    copy_into(work, &exe, Path::new("/usr/local/bin/iblab"))?;
    if iblab_sys::host::which("strip").is_some() {
        let argv: Vec<String> = vec!["strip".into(), dst.to_string_lossy().into_owned()];
        let _ = process::run(&argv, None, Duration::from_secs(60)).await;
    }
    let argv = vec!["ldd".to_string(), exe.to_string_lossy().into_owned()];
    let out = process::run(&argv, None, Duration::from_secs(10))
        .await
        .map_err(|source| ImageError::Run {
            program: "ldd",
            source,
        })?;
    for lib in ldd::parse(&out.stdout).libraries {
        copy_into(work, &lib, &lib)?;
    }
    let write = |rel: &str, text: &str| {
        let p = work.join(rel);
        if let Some(parent) = p.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(&p, text).map_err(PathError::of("write", &p))
    };
    write(
        "etc/passwd",
        &format!(
            "root:x:0:0:root:/root:/nonexistent\niblab:x:{UID}:{UID}:iblab operator:/var/lib/iblab:/nonexistent\n"
        ),
    )?;
    write("etc/group", &format!("root:x:0:\niblab:x:{UID}:\n"))?;
    use std::os::unix::fs::PermissionsExt;
    for (d, mode, own) in [
        ("tmp", 0o1777, false),
        ("run", 0o755, true),
        ("var/lib/iblab", 0o755, true),
    ] {
        let p = work.join(d);
        std::fs::create_dir_all(&p).map_err(PathError::of("create", &p))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .map_err(PathError::of("chmod", &p))?;
        if own {
            nix::unistd::chown(
                &p,
                Some(nix::unistd::Uid::from_raw(UID)),
                Some(nix::unistd::Gid::from_raw(UID)),
            )
            .map_err(|source| ImageError::Chown {
                path: p.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Build and import the operator image; returns it and the seconds it took.
pub async fn build(
    engine: &Engine,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(Image, f64), ImageError> {
    let t0 = Instant::now();
    let reference = reference();
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(PathError::of("create", &dir))?;
    let work: PathBuf = dir.join(format!("operator-{}", std::process::id()));
    remove_tree(&work);
    say("copying this iblab binary and its libraries into the operator image");
    let filled = fill(&work).await;
    let tar = dir.join(format!("rootfs-operator-{}.tar", std::process::id()));
    let packed = match filled {
        Ok(()) => super::hostcopy::pack(&work, &tar).await,
        Err(e) => Err(e),
    };
    remove_tree(&work);
    if let Err(e) = packed {
        let _ = std::fs::remove_file(&tar);
        return Err(e);
    }
    let sha = sha256_file(&tar).await?;
    let labels = BTreeMap::from([
        (
            label::VERSION.to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        (label::VARIANT.to_string(), "operator".to_string()),
        (label::CONTENT.to_string(), format!("sha256:{sha}")),
        (
            label::BUILT.to_string(),
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        ),
    ]);
    say(&format!("importing {} as {reference}", tar.display()));
    let imported = import::import(&engine.docker, &tar, &reference, &labels).await;
    let _ = std::fs::remove_file(&tar);
    imported?;
    let image = find(&engine.docker, &reference)
        .await?
        .ok_or_else(|| ImageError::MissingAfterImport(reference.clone()))?;
    Ok((image, t0.elapsed().as_secs_f64()))
}
