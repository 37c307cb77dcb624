//! iblab's own binary for nodes that do not share this host's files (containers, pods),
//! where lab steps run iblab itself (`iblab pingpong`, path ①'s latency test, and
//! `{{ iblab }}` in lab files): a folder with the binary, the libraries it was loaded with
//! (its dynamic loader among them, read from `/proc/self/maps`) and a wrapper that runs it
//! with them, so it runs on an image whatever that image's C library is.

use std::path::{Path, PathBuf};

use iblab_sys::fs::PathError;

/// The shared libraries this process was loaded with, from the text of its
/// `/proc/self/maps` (every file-backed mapping of a `.so`, once, the exe left out).
pub fn libraries(maps: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let p = PathBuf::from(path);
        let is_lib = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains(".so"));
        if path.starts_with('/') && is_lib && !v.contains(&p) {
            v.push(p);
        }
    }
    v
}

/// The dynamic loader among them (`ld-linux-x86-64.so.2`, `ld-linux-aarch64.so.1`).
fn loader(libs: &[PathBuf]) -> Option<&PathBuf> {
    libs.iter().find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ld-linux") || n.starts_with("ld64"))
    })
}

/// The wrapper script: the loader of the folder runs the binary with the folder's
/// libraries (a static binary runs as it is).
fn wrapper(loader: Option<&str>) -> String {
    let run = match loader {
        Some(l) => format!("exec \"$d/lib/{l}\" --library-path \"$d/lib\" \"$d/bin/iblab\" \"$@\""),
        None => "exec \"$d/bin/iblab\" \"$@\"".into(),
    };
    format!(
        "#!/bin/sh\n# iblab {} with the libraries it was built against (`iblab bundle`).\nd=${{0%/*}}\n{run}\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// Why the folder could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot find iblab itself: {0}")]
    Exe(#[source] std::io::Error),
    #[error("cannot read /proc/self/maps: {0}")]
    Maps(#[source] std::io::Error),
    /// A file or folder that could not be read, made or written.
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("cannot copy {} to {}: {source}", .from.display(), .to.display())]
    Copy {
        from: PathBuf,
        to: PathBuf,
        source: std::io::Error,
    },
    #[error("a library without a name")]
    Unnamed,
    /// Neither this process nor another run made the folder.
    #[error("cannot make {}", .0.display())]
    NotMade(PathBuf),
    #[error("cannot make {} executable: {source}", .path.display())]
    Executable {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A hard link where `dst` is on the same filesystem, else a copy; either way made beside
/// `dst` and renamed over it, never written into it. A folder written again while it is
/// in use (a node agent's DaemonSet installing itself anew while containerd runs the
/// handler from it) must not change the pages of a binary or library a running process
/// has mapped: a copy into the old file truncates it, and that process dies of SIGBUS
/// (seen as "runc did not terminate successfully: exit status 135" on a pod's exec).
fn place(src: &Path, dst: &Path) -> Result<(), BundleError> {
    let tmp = beside(dst);
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(src, &tmp).is_err() {
        std::fs::copy(src, &tmp).map_err(|source| BundleError::Copy {
            from: src.to_path_buf(),
            to: tmp.clone(),
            source,
        })?;
    }
    std::fs::rename(&tmp, dst).map_err(|source| BundleError::Copy {
        from: tmp,
        to: dst.to_path_buf(),
        source,
    })
}

/// A name in `path`'s folder for what is about to replace it (`.NAME.new`).
fn beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.new"))
}

/// Write the folder for this binary into `dir` (made if missing).
pub fn write(dir: &Path) -> Result<(), BundleError> {
    let exe = std::env::current_exe().map_err(BundleError::Exe)?;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(BundleError::Maps)?;
    let libs: Vec<PathBuf> = libraries(&maps).into_iter().filter(|l| *l != exe).collect();
    for sub in ["bin", "lib"] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(PathError::of("create", &path))?;
    }
    place(&exe, &dir.join("bin/iblab"))?;
    for l in &libs {
        let name = l.file_name().ok_or(BundleError::Unnamed)?;
        place(l, &dir.join("lib").join(name))?;
    }
    let name = loader(&libs).and_then(|l| l.file_name()?.to_str().map(str::to_string));
    // The wrapper too is replaced whole: a shell may be reading the old one.
    let path = dir.join("iblab");
    let tmp = beside(&path);
    std::fs::write(&tmp, wrapper(name.as_deref())).map_err(PathError::of("write", &tmp))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(|source| {
        BundleError::Executable {
            path: tmp.clone(),
            source,
        }
    })?;
    std::fs::rename(&tmp, &path).map_err(PathError::of("rename", &path))?;
    Ok(())
}

/// This binary's folder in `cache` (made once per build of iblab, found by the binary's
/// size and time), for bind mounts into containers.
pub fn cached(cache: &Path) -> Result<PathBuf, BundleError> {
    let exe = std::env::current_exe().map_err(BundleError::Exe)?;
    let meta = std::fs::metadata(&exe).map_err(PathError::at(&exe))?;
    use std::os::unix::fs::MetadataExt;
    let key = format!(
        "{:x}-{:x}-{:x}",
        meta.ino(),
        meta.size(),
        meta.mtime_nsec() ^ meta.mtime()
    );
    let dir = cache.join(format!("iblab-bundle-{key}"));
    if dir.join("iblab").exists() {
        // In use: the prune below goes by the last use.
        let _ =
            std::fs::File::open(&dir).and_then(|f| f.set_modified(std::time::SystemTime::now()));
        return Ok(dir);
    }
    prune(cache, &dir);
    let tmp = cache.join(format!("iblab-bundle-{key}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    write(&tmp)?;
    // Another run may have made it meanwhile: theirs is as good.
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if dir.join("iblab").exists() {
        Ok(dir)
    } else {
        Err(BundleError::NotMade(dir))
    }
}

/// Remove the folders of earlier builds unused for a week (a hard link keeps a replaced
/// binary's bytes; a kept lab of that build may still have it mounted, hence the week).
fn prune(cache: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    let week = std::time::Duration::from_secs(7 * 24 * 3600);
    for e in entries.flatten() {
        let p = e.path();
        let ours = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("iblab-bundle-"));
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > week);
        if ours && old && p != keep {
            let _ = std::fs::remove_dir_all(&p);
        }
    }
}

/// `iblab bundle DIR`: write the folder (a pod's init container does, into the volume the
/// lab container mounts at [`IN_NODE`]).
pub fn main(dir: &Path) -> i32 {
    match write(dir) {
        Ok(()) => {
            println!(
                "iblab {} bundled into {}",
                env!("CARGO_PKG_VERSION"),
                dir.display()
            );
            iblab_core::exit::OK
        }
        Err(e) => {
            eprintln!("iblab bundle: {e}");
            iblab_core::exit::ENVIRONMENT
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writing_again_replaces_files_and_leaves_what_a_process_holds_untouched() {
        use std::io::Read;
        let dir = std::env::temp_dir().join(format!("iblab-bundle-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (src, dst) = (dir.join("src"), dir.join("dst"));
        std::fs::write(&src, b"first").unwrap();
        place(&src, &dst).unwrap();
        // A process that has the installed file open (as one that maps it does).
        let mut held = std::fs::File::open(&dst).unwrap();
        std::fs::remove_file(&src).unwrap();
        std::fs::write(&src, b"second, longer").unwrap();
        place(&src, &dst).unwrap();
        let mut old = String::new();
        held.read_to_string(&mut old).unwrap();
        assert_eq!(old, "first", "the file a process holds was written into");
        assert_eq!(std::fs::read_to_string(&dst).unwrap(), "second, longer");
        assert!(!beside(&dst).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_libraries_are_the_mapped_shared_objects_once_each() {
        let maps = "\
55d0c0a00000-55d0c0a10000 r--p 00000000 08:01 123 /usr/local/bin/iblab
7f1a00000000-7f1a00020000 r--p 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1a00020000-7f1a00100000 r-xp 00020000 08:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1a00200000-7f1a00210000 r--p 00000000 08:01 789 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1
7f1a00300000-7f1a00301000 rw-p 00000000 00:00 0 [heap]
7f1a00400000-7f1a00420000 r--p 00000000 08:01 999 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0 [vdso]
";
        let libs = libraries(maps);
        assert_eq!(
            libs,
            [
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            loader(&libs).and_then(|l| l.file_name()).unwrap(),
            "ld-linux-x86-64.so.2"
        );
    }

    /// The folder of this very test binary runs it through its wrapper, with its own
    /// loader and libraries, from somewhere else.
    #[test]
    fn the_folder_runs_iblab_with_its_own_libraries() {
        let dir = std::env::temp_dir().join(format!("iblab-bundle-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write(&dir).unwrap();
        let script = std::fs::read_to_string(dir.join("iblab")).unwrap();
        assert!(script.contains("--library-path"), "{script}");
        assert!(dir.join("lib/libc.so.6").exists());
        // The test binary runs its tests when asked to list them: it really starts.
        let out = std::process::Command::new(dir.join("iblab"))
            .arg("--list")
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("the_folder_runs_iblab"),
            "the wrapper did not run this binary"
        );
    }
}
