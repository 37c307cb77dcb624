//! The booted-guest snapshot: the lab's VM as it is once booted (kernel up, modules
//! loaded, the agent waiting), saved by qemu once per image, agent, qemu and machine
//! shape, and restored by every later run instead of booting. The guest is the same for
//! every lab until the lab's own wiring starts; what must differ per run (clock, RNG,
//! identity) is set through the agent after the restore.
//!
//! Files, in the image cache's `snapshots/` folder: `KEY.vmstate` (qemu's migration
//! stream), `KEY.json` ([`Meta`]), `KEY.lock` (held while one run makes it), and
//! `KEY.restores` (one line per restore: its seconds, to choose restore or boot by what
//! was measured). A snapshot is written under a temporary name and renamed whole, and
//! used only when its size and first bytes are what its metadata says.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::image::{cache_dir, file_stamp, fnv1a};
use iblab_sys::fs::PathError;

/// Bumped when what a snapshot must hold changes in a way its inputs do not show.
const FORMAT: u32 = 1;
/// qemu's migration stream begins with "QEVM".
const MAGIC: &[u8; 4] = b"QEVM";

/// What a snapshot was made from, and what its boot said.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    pub key: String,
    /// The stream's length in bytes.
    pub bytes: u64,
    /// The boot it was saved from: seconds from qemu's start to the agent's hello.
    pub boot_s: f64,
    /// Seconds the guest was stopped while it was saved.
    pub save_s: f64,
    pub accel: String,
    pub memory_mb: u32,
    pub vcpus: usize,
    /// The hello of the boot it was saved from.
    pub kernel: String,
    pub modules_loaded: usize,
    pub modules_s: f64,
    pub problems: Vec<String>,
}

/// Why a snapshot cannot be used.
#[derive(Debug)]
pub enum Unusable {
    /// None made yet for this key.
    Missing,
    /// One is there but is not whole or not what its metadata says.
    Damaged(Damage),
}

/// What is wrong with a snapshot that is there.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    #[error("its metadata does not parse: {0}")]
    Metadata(#[source] serde_json::Error),
    #[error("{0}")]
    Open(#[source] PathError),
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("it holds {len} bytes where its metadata says {expected}")]
    Length { len: u64, expected: u64 },
    #[error("cannot read it: {0}")]
    Unreadable(#[source] std::io::Error),
    #[error("it does not begin as a qemu migration stream does")]
    NotMigration,
}

/// Why the file qemu wrote could not be made the snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    File(#[from] PathError),
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("{0}")]
    Damaged(#[from] Damage),
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
}

/// Restoring was measured slower than the boot it replaces: the VM is booted instead.
#[derive(Debug, thiserror::Error)]
#[error(
    "restoring it took {median:.2} s (median of {samples}) against {boot_s:.2} s for the boot \
     it replaces"
)]
pub struct SlowerThanBoot {
    pub median: f64,
    pub samples: usize,
    pub boot_s: f64,
}

/// The snapshot for one VM shape.
pub struct Snapshot {
    pub key: String,
    dir: PathBuf,
}

/// Whether runs use snapshots (`IBLAB_VM_SNAPSHOT=0` boots every run).
pub fn enabled() -> bool {
    std::env::var("IBLAB_VM_SNAPSHOT").map_or(true, |v| v != "0")
}

/// What doctor says of the booted-guest snapshots in the cache.
pub fn summary() -> String {
    if !enabled() {
        return "off (IBLAB_VM_SNAPSHOT=0): every vm run boots its guest".into();
    }
    let dir = cache_dir().join("snapshots");
    let (n, bytes) = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".vmstate"))
                .filter_map(|e| e.metadata().ok())
                .fold((0, 0u64), |(n, b), m| (n + 1, b + m.len()))
        })
        .unwrap_or((0, 0));
    format!(
        "{n} booted-guest snapshot(s), {} MB, in {}: the first vm run of an iblab binary, image and qemu boots the guest and saves it (~200 MB); later runs restore it instead of booting (IBLAB_VM_SNAPSHOT=0 boots every run)",
        bytes >> 20,
        dir.display()
    )
}

/// The qemu binary on `PATH`, as a stamp (a new qemu package makes a new snapshot).
fn qemu_stamp() -> String {
    iblab_sys::host::which(super::qemu::QEMU)
        .map(|p| file_stamp(&p))
        .unwrap_or_else(|| "no qemu".into())
}

impl Snapshot {
    /// The snapshot of the VM that `shape` (qemu's argument vector with every per-run
    /// path left out) boots from `kernel` and `initrd`.
    pub fn of(shape: &[String], kernel: &Path, initrd: &Path) -> Snapshot {
        let key = key(
            shape,
            &qemu_stamp(),
            &file_stamp(kernel),
            &file_stamp(initrd),
        );
        Snapshot {
            key,
            dir: cache_dir().join("snapshots"),
        }
    }

    pub fn data(&self) -> PathBuf {
        self.dir.join(format!("{}.vmstate", self.key))
    }
    fn meta_path(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.key))
    }
    fn restores_path(&self) -> PathBuf {
        self.dir.join(format!("{}.restores", self.key))
    }

    /// Where this process writes the snapshot before it is whole.
    pub fn partial(&self) -> PathBuf {
        self.dir
            .join(format!("{}.vmstate.{}.tmp", self.key, std::process::id()))
    }

    /// The snapshot, opened for reading (qemu's stdin), and its metadata.
    pub fn usable(&self) -> Result<(std::fs::File, Meta), Unusable> {
        let text = match std::fs::read_to_string(self.meta_path()) {
            Ok(t) => t,
            Err(_) => return Err(Unusable::Missing),
        };
        let meta: Meta =
            serde_json::from_str(&text).map_err(|e| Unusable::Damaged(Damage::Metadata(e)))?;
        let mut f = std::fs::File::open(self.data())
            .map_err(|e| Unusable::Damaged(Damage::Open(PathError::at(self.data())(e))))?;
        check(&mut f, &meta).map_err(Unusable::Damaged)?;
        // Mark it as used (see prune).
        let _ = std::fs::File::open(self.meta_path())
            .and_then(|m| m.set_modified(std::time::SystemTime::now()));
        Ok((f, meta))
    }

    /// Take the right to make it, if nobody holds it (a run that does not get it boots
    /// without saving).
    pub fn try_lock(&self) -> Option<nix::fcntl::Flock<std::fs::File>> {
        std::fs::create_dir_all(&self.dir).ok()?;
        let f = std::fs::File::create(self.dir.join(format!("{}.lock", self.key))).ok()?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).ok()
    }

    /// Make the partial file written by qemu the snapshot, with its metadata.
    pub fn commit(&self, partial: &Path, mut meta: Meta) -> Result<Meta, SnapshotError> {
        let mut f = std::fs::File::open(partial).map_err(PathError::at(partial))?;
        meta.bytes = f.metadata().map_err(SnapshotError::Io)?.len();
        meta.key = self.key.clone();
        check(&mut f, &meta)?;
        let _ = std::fs::remove_file(self.meta_path());
        std::fs::rename(partial, self.data()).map_err(SnapshotError::Io)?;
        let tmp = self
            .dir
            .join(format!("{}.json.{}.tmp", self.key, std::process::id()));
        let text = serde_json::to_string_pretty(&meta).map_err(SnapshotError::Encode)?;
        std::fs::write(&tmp, text).map_err(PathError::at(&tmp))?;
        std::fs::rename(&tmp, self.meta_path()).map_err(SnapshotError::Io)?;
        let _ = std::fs::remove_file(self.restores_path());
        prune(&self.dir, &self.key);
        Ok(meta)
    }

    /// Remove a snapshot that could not be restored (the next run boots and makes it
    /// again). A run restoring it now keeps its open file.
    pub fn discard(&self) {
        let _ = std::fs::remove_file(self.meta_path());
        let _ = std::fs::remove_file(self.data());
        let _ = std::fs::remove_file(self.restores_path());
    }

    /// Record how long a restore took.
    pub fn record_restore(&self, seconds: f64) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.restores_path())
        {
            let _ = writeln!(f, "{seconds:.3}");
        }
    }

    /// Restore or boot, by what was measured here: restore, unless at least three
    /// restores have been timed and their median is slower than the boot it replaces.
    pub fn worth_restoring(&self, meta: &Meta) -> Result<(), SlowerThanBoot> {
        let text = std::fs::read_to_string(self.restores_path()).unwrap_or_default();
        let times: Vec<f64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        choose(meta.boot_s, &times)
    }
}

/// Restore unless three or more restores were timed and their median exceeds `boot_s`.
fn choose(boot_s: f64, restores: &[f64]) -> Result<(), SlowerThanBoot> {
    if restores.len() < 3 {
        return Ok(());
    }
    let mut t = restores.to_vec();
    t.sort_by(f64::total_cmp);
    let median = t[t.len() / 2];
    if median > boot_s {
        return Err(SlowerThanBoot {
            median,
            samples: t.len(),
            boot_s,
        });
    }
    Ok(())
}

/// The file is whole (its metadata's length) and begins as a migration stream does.
fn check(f: &mut std::fs::File, meta: &Meta) -> Result<(), Damage> {
    let len = f.metadata().map_err(Damage::Io)?.len();
    if len != meta.bytes {
        return Err(Damage::Length {
            len,
            expected: meta.bytes,
        });
    }
    let mut head = [0u8; 4];
    f.read_exact(&mut head).map_err(Damage::Unreadable)?;
    if &head != MAGIC {
        return Err(Damage::NotMigration);
    }
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(0)).map_err(Damage::Io)?;
    Ok(())
}

fn key(shape: &[String], qemu: &str, kernel: &str, initrd: &str) -> String {
    let text = format!(
        "{FORMAT}\n{}\n{qemu}\n{kernel}\n{initrd}",
        shape.join("\u{1f}")
    );
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// Remove other keys' snapshots not used for an hour (each is hundreds of MB; a new iblab
/// binary or image makes a new one), and partial files of processes that are gone.
fn prune(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let files: Vec<(String, PathBuf)> = entries
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    let idle = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(3600))
    };
    for (name, path) in &files {
        let key = name.split('.').next().unwrap_or_default();
        if let Some(pid) = partial_pid(name) {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(path);
            }
            continue;
        }
        if key == keep {
            continue;
        }
        let meta = dir.join(format!("{key}.json"));
        if !meta.exists() || idle(&meta) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Partial snapshots whose writer is gone (a run killed while saving, its state file
/// lost): removed, and named.
pub fn remove_partials() -> Vec<String> {
    let dir = cache_dir().join("snapshots");
    let mut removed = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = partial_pid(&name)
            && !Path::new(&format!("/proc/{pid}")).exists()
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed.push(e.path().display().to_string());
        }
    }
    removed
}

/// `KEY.vmstate.PID.tmp` or `KEY.json.PID.tmp` → PID.
fn partial_pid(name: &str) -> Option<u32> {
    let rest = name.strip_suffix(".tmp")?;
    rest.rsplit('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(bytes: u64) -> Meta {
        Meta {
            key: String::new(),
            bytes,
            boot_s: 5.0,
            save_s: 2.0,
            accel: "tcg".into(),
            memory_mb: 1024,
            vcpus: 2,
            kernel: "7.2".into(),
            modules_loaded: 9,
            modules_s: 0.5,
            problems: vec![],
        }
    }

    #[test]
    fn the_key_follows_every_input() {
        let shape: Vec<String> = ["-m", "1024", "-smp", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let k = key(&shape, "q", "k", "i");
        assert_eq!(k, key(&shape, "q", "k", "i"));
        let mut other = shape.clone();
        other[1] = "2048".into();
        for k2 in [
            key(&other, "q", "k", "i"),
            key(&shape, "q2", "k", "i"),
            key(&shape, "q", "k2", "i"),
            key(&shape, "q", "k", "i2"),
        ] {
            assert_ne!(k, k2);
        }
    }

    #[test]
    fn only_a_whole_stream_is_used_and_a_cut_or_foreign_one_is_damaged() {
        let dir = std::env::temp_dir().join(format!("iblab-snaptest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = Snapshot {
            key: "k1".into(),
            dir: dir.clone(),
        };
        assert!(matches!(s.usable(), Err(Unusable::Missing)));
        // qemu wrote a stream: committed, it is used.
        std::fs::write(s.partial(), b"QEVM\0\0\0\x03rest of the stream").unwrap();
        let m = s.commit(&s.partial(), meta(0)).unwrap();
        assert_eq!(m.bytes, 26);
        assert!(!s.partial().exists());
        let (mut f, got) = s.usable().unwrap();
        assert_eq!(got, m);
        let mut head = [0u8; 4];
        f.read_exact(&mut head).unwrap();
        assert_eq!(&head, MAGIC, "qemu reads it from its start");
        // Cut short after it was made.
        std::fs::write(s.data(), b"QEVM\0\0").unwrap();
        assert!(matches!(
            s.usable(),
            Err(Unusable::Damaged(w @ Damage::Length { len: 6, expected: 26 }))
                if w.to_string().contains("bytes")
        ));
        // Not a migration stream.
        std::fs::write(s.data(), vec![b'x'; 26]).unwrap();
        assert!(matches!(
            s.usable(),
            Err(Unusable::Damaged(w @ Damage::NotMigration)) if w.to_string().contains("migration")
        ));
        // A partial write never becomes one.
        std::fs::write(s.partial(), b"not qemu").unwrap();
        assert!(matches!(
            s.commit(&s.partial(), meta(0)),
            Err(SnapshotError::Damaged(Damage::NotMigration))
        ));
        s.discard();
        assert!(matches!(s.usable(), Err(Unusable::Missing)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn restore_is_chosen_until_it_is_measured_slower_than_the_boot() {
        assert!(choose(5.0, &[]).is_ok());
        assert!(
            choose(5.0, &[9.0, 9.0]).is_ok(),
            "two samples decide nothing"
        );
        assert!(choose(5.0, &[0.8, 1.1, 9.0]).is_ok());
        let e = choose(5.0, &[6.0, 7.0, 0.5]).unwrap_err();
        assert_eq!((e.median, e.samples, e.boot_s), (6.0, 3, 5.0));
        let e = e.to_string();
        assert!(e.contains("6.00 s") && e.contains("5.00 s"), "{e}");
    }

    #[test]
    fn a_partial_file_names_its_writer() {
        assert_eq!(partial_pid("0123.vmstate.4567.tmp"), Some(4567));
        assert_eq!(partial_pid("0123.json.89.tmp"), Some(89));
        assert_eq!(partial_pid("0123.vmstate"), None);
    }
}
