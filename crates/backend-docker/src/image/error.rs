//! Why the lab image (or the operator's) could not be built, imported or found: each
//! failure a variant, with the error that caused it.

use std::path::PathBuf;

use iblab_backend::{BackendError, EnvKind};
use iblab_sys::fs::PathError;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file or folder that could not be made, read, written, copied or chmod-ed.
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("cannot chown {}: {source}", .path.display())]
    Chown {
        path: PathBuf,
        source: nix::errno::Errno,
    },
    #[error("cannot link /{dir} to {}: {source}", .target.display())]
    Link {
        dir: &'static str,
        target: PathBuf,
        source: std::io::Error,
    },
    /// A program of the build could not be started.
    #[error("cannot run {program}: {source}")]
    Run {
        program: &'static str,
        source: std::io::Error,
    },
    #[error("tar failed: {0}")]
    Tar(String),
    #[error("debootstrap is not installed\n  fix: apt-get install debootstrap")]
    NoDebootstrap,
    /// debootstrap failed, timed out, or could not run (then `source` says why).
    #[error(
        "debootstrap failed (full log: {}): {why}\n  fix: check that {mirror} is reachable, \
         or pass another with --mirror",
        .log.display()
    )]
    Debootstrap {
        log: PathBuf,
        why: String,
        mirror: String,
        #[source]
        source: Option<std::io::Error>,
    },
    #[error("hashing failed: {0}")]
    Hash(#[source] tokio::task::JoinError),
    #[error("this host has no `sleep` (coreutils), which lab containers idle on")]
    NoSleep,
    #[error("cannot find iblab itself: {0}")]
    Exe(#[source] std::io::Error),
    #[error("the engine refused the import: {0}")]
    Import(#[source] bollard::errors::Error),
    #[error("imported, but {reference} cannot be found: {source}")]
    NotFoundAfterImport {
        reference: String,
        source: bollard::errors::Error,
    },
    #[error("cannot inspect image {reference}: {source}")]
    Inspect {
        reference: String,
        source: bollard::errors::Error,
    },
    #[error("{0} is missing right after its import")]
    MissingAfterImport(String),
}

impl BackendError for ImageError {
    fn env_kind(&self) -> EnvKind {
        match self {
            ImageError::NoDebootstrap | ImageError::NoSleep => EnvKind::Missing,
            ImageError::Run { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                EnvKind::Missing
            }
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
        let e = ImageError::Debootstrap {
            log: "/c/debootstrap-1.log".into(),
            why: "E: no".into(),
            mirror: "http://m".into(),
            source: None,
        };
        assert_eq!(
            e.to_string(),
            "debootstrap failed (full log: /c/debootstrap-1.log): E: no\n  fix: check that \
             http://m is reachable, or pass another with --mirror"
        );
        assert_eq!(
            ImageError::NoDebootstrap.to_string(),
            "debootstrap is not installed\n  fix: apt-get install debootstrap"
        );
        assert_eq!(ImageError::NoDebootstrap.env_kind(), EnvKind::Missing);
    }
}
