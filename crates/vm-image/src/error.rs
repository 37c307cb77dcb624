//! Why the guest image could not be had: each failure of its build a variant, with the
//! error that caused it.

use std::path::PathBuf;

use iblab_backend::{BackendError, EnvKind};
use iblab_sys::fs::PathError;

use crate::kmod::KmodError;
use crate::{DEFAULT_SUITE, MIN_KERNEL};

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A program of the build could not be started.
    #[error("cannot run {program}: {source}")]
    Run {
        program: String,
        source: std::io::Error,
    },
    /// A program of the build ran and failed.
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
    /// The private package lists of the kernel's suite could not be fetched.
    #[error(
        "{source}\n  the guest kernel comes from Debian {suite} ({mirror}): set \
         IBLAB_VM_KERNEL_MIRROR to a reachable mirror, or IBLAB_VM_KERNEL_SUITE to another \
         suite with a kernel ≥ 7.1"
    )]
    Lists {
        suite: String,
        mirror: String,
        source: Box<ImageError>,
    },
    #[error("Debian {suite} has no linux-image-amd64")]
    NoMetapackage { suite: String },
    #[error(
        "linux-image-amd64 in {suite} depends on no linux-image package; set \
         IBLAB_VM_KERNEL_PACKAGE"
    )]
    NoKernelDependency { suite: String },
    #[error("Debian {suite} has no package {package}")]
    NoPackage { suite: String, package: String },
    #[error(
        "the vm image is built from Debian packages that are not installed here: {}\n  fix: \
         apt-get install {}",
        .0.join(", "),
        .0.join(" ")
    )]
    PackagesMissing(Vec<&'static str>),
    #[error(
        "Debian {suite}'s kernel is {release} ({version}): the vm backend needs Linux ≥ {}.{}, \
         whose rxe works inside a network namespace\n  fix: IBLAB_VM_KERNEL_SUITE={} (or \
         another suite serving a kernel ≥ {}.{})",
        MIN_KERNEL.0,
        MIN_KERNEL.1,
        DEFAULT_SUITE,
        MIN_KERNEL.0,
        MIN_KERNEL.1
    )]
    OldKernel {
        suite: String,
        release: String,
        version: String,
    },
    /// Another process holds the build lock and did not let go in time.
    #[error(
        "another iblab has been building the vm image for {waited_s}s (lock {}); try again later",
        .lock.display()
    )]
    LockBusy { waited_s: u64, lock: PathBuf },
    /// Work sent off the runtime did not come back (it panicked or was cancelled).
    #[error("the vm image work stopped: {0}")]
    Stopped(#[source] tokio::task::JoinError),
    #[error("cannot write the state file: {0}")]
    State(#[source] std::io::Error),
    /// A file or folder that could not be made, read, written or moved.
    #[error("{0}")]
    Path(#[from] PathError),
    /// Writing an archive, or reading a folder, failed.
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("cannot write the image manifest: {0}")]
    Manifest(#[source] std::io::Error),
    #[error("apt-get download left no .deb")]
    NoDeb,
    #[error("the kernel packages have no modules folder")]
    NoModules,
    #[error("the kernel packages hold no vmlinuz for {0}")]
    NoVmlinuz(String),
    #[error(transparent)]
    Kmod(#[from] KmodError),
    #[error("busybox is not installed (apt-get install busybox-static)")]
    NoBusybox,
    #[error("{0} is not installed here")]
    NotInstalled(&'static str),
    #[error("ibv_devinfo does not link libibverbs")]
    NoLibibverbs,
    #[error("no rxe provider ({0}): apt-get install ibverbs-providers")]
    RxeProviderFolder(#[source] std::io::Error),
    #[error("no rxe provider: apt-get install ibverbs-providers")]
    NoRxeProvider,
    #[error("cannot find the iblab binary: {0}")]
    Exe(#[source] std::io::Error),
}

/// Why the bzImage yields no kernel that boots through its PVH entry point (the
/// compressed kernel is booted instead).
#[derive(Debug, thiserror::Error)]
pub enum NoPvh {
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run {tool}: {source}")]
    Run {
        tool: &'static str,
        source: std::io::Error,
    },
    #[error("no stdin")]
    NoStdin,
    #[error("{tool}: {source}")]
    Tool {
        tool: &'static str,
        source: std::io::Error,
    },
    #[error("the kernel has no PVH entry point")]
    NoEntry,
    #[error("{}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no compressed kernel found in the bzImage")]
    NoPayload,
}

impl BackendError for ImageError {
    fn env_kind(&self) -> EnvKind {
        match self {
            ImageError::Run { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                EnvKind::Missing
            }
            ImageError::Lists { source, .. } => source.env_kind(),
            ImageError::PackagesMissing(_)
            | ImageError::NoBusybox
            | ImageError::NotInstalled(_)
            | ImageError::NoLibibverbs
            | ImageError::RxeProviderFolder(_)
            | ImageError::NoRxeProvider => EnvKind::Missing,
            ImageError::State(_) => EnvKind::State,
            _ => EnvKind::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a user reads of these is what they read before they had types.
    #[test]
    fn the_words_are_the_ones_users_know() {
        let e = ImageError::PackagesMissing(vec!["perftest", "iperf3"]);
        assert_eq!(
            e.to_string(),
            "the vm image is built from Debian packages that are not installed here: perftest, \
             iperf3\n  fix: apt-get install perftest iperf3"
        );
        assert_eq!(e.env_kind(), EnvKind::Missing);
        let e = ImageError::Lists {
            suite: "sid".into(),
            mirror: "http://m".into(),
            source: Box::new(ImageError::Failed {
                command: "apt-get update".into(),
                stderr: "E: no".into(),
            }),
        };
        assert_eq!(
            e.to_string(),
            "`apt-get update` failed: E: no\n  the guest kernel comes from Debian sid (http://m): \
             set IBLAB_VM_KERNEL_MIRROR to a reachable mirror, or IBLAB_VM_KERNEL_SUITE to \
             another suite with a kernel ≥ 7.1"
        );
        let e = ImageError::OldKernel {
            suite: "trixie".into(),
            release: "6.12.1-amd64".into(),
            version: "6.12.1-1".into(),
        };
        assert_eq!(
            e.to_string(),
            format!(
                "Debian trixie's kernel is 6.12.1-amd64 (6.12.1-1): the vm backend needs Linux ≥ \
                 7.1, whose rxe works inside a network namespace\n  fix: \
                 IBLAB_VM_KERNEL_SUITE={DEFAULT_SUITE} (or another suite serving a kernel ≥ 7.1)"
            )
        );
        let run = ImageError::Run {
            program: "apt-get".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(run.env_kind(), EnvKind::Missing);
    }
}
