//! A file or folder of this host that could not be made, read, written or moved: what
//! was being done, to which path, and the I/O error that said no.

use std::path::PathBuf;

/// `cannot ACTION PATH: why`, or `PATH: why` where the path says enough.
#[derive(Debug, thiserror::Error)]
pub struct PathError {
    /// What was being done (`create`, `write`, `move the image into`), if said.
    pub action: Option<&'static str>,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.action {
            Some(a) => write!(f, "cannot {a} {}: {}", self.path.display(), self.source),
            None => write!(f, "{}: {}", self.path.display(), self.source),
        }
    }
}

impl PathError {
    /// `cannot ACTION PATH: why`, for `map_err`.
    pub fn of(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> PathError {
        let path = path.into();
        move |source| PathError {
            action: Some(action),
            path,
            source,
        }
    }

    /// `PATH: why`, for `map_err`.
    pub fn at(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> PathError {
        let path = path.into();
        move |source| PathError {
            action: None,
            path,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_was_done_to_which_path() {
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = PathError::of("move the image into", "/c/img-1")(denied());
        assert_eq!(
            e.to_string(),
            "cannot move the image into /c/img-1: permission denied"
        );
        assert_eq!(
            PathError::at("/c/base.cpio")(denied()).to_string(),
            "/c/base.cpio: permission denied"
        );
    }
}
