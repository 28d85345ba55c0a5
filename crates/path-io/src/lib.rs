//! The one error kloop's crates give for a failed file-system operation:
//! what was being done, on which path, and the OS error.
//!
//! Every crate's error enum carries it as `#[error(transparent)]
//! Io(#[from] PathIo)`, so a caller reads one shape and each message is
//! written in one place.
//!
//! ```
//! use kloop_path_io::{PathIo, PathIoExt};
//! let path = std::path::Path::new("/nonexistent/pin.toml");
//! let e: PathIo = std::fs::read(path).at("reading", path).unwrap_err();
//! assert!(e.to_string().starts_with("reading /nonexistent/pin.toml: "));
//! let e: PathIo = std::fs::read(path).doing("reading the pin").unwrap_err();
//! assert!(e.to_string().starts_with("reading the pin: "));
//! ```
#![warn(missing_docs)]

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

/// A failed file-system operation. Its message is `{what} {path}:
/// {source}` when the path was given apart (`at`), or `{what}: {source}`
/// when `what` already says where (`doing`).
#[derive(Debug, thiserror::Error)]
pub struct PathIo {
    /// What was being done: "reading", "writing the reference".
    pub what: Cow<'static, str>,
    /// The path it was done on, when `what` does not already name it.
    pub path: Option<PathBuf>,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

impl PathIo {
    /// `what` failed on `path`: shown as `{what} {path}: {source}`.
    pub fn at(
        what: impl Into<Cow<'static, str>>,
        path: impl AsRef<Path>,
        source: std::io::Error,
    ) -> PathIo {
        PathIo {
            what: what.into(),
            path: Some(path.as_ref().to_path_buf()),
            source,
        }
    }

    /// `what` (which names its path itself, if any) failed: shown as
    /// `{what}: {source}`.
    pub fn doing(what: impl Into<Cow<'static, str>>, source: std::io::Error) -> PathIo {
        PathIo {
            what: what.into(),
            path: None,
            source,
        }
    }
}

impl fmt::Display for PathIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{} {}: {}", self.what, path.display(), self.source),
            None => write!(f, "{}: {}", self.what, self.source),
        }
    }
}

/// Names the operation and path of an I/O result's error:
/// `std::fs::read(&p).at("reading", &p)?`.
pub trait PathIoExt<T> {
    /// The error, if any, as `{what} {path}: {source}`.
    fn at(self, what: impl Into<Cow<'static, str>>, path: impl AsRef<Path>) -> Result<T, PathIo>;
    /// The error, if any, as `{what}: {source}` (`what` names the path).
    fn doing(self, what: impl Into<Cow<'static, str>>) -> Result<T, PathIo>;
}

impl<T> PathIoExt<T> for Result<T, std::io::Error> {
    fn at(self, what: impl Into<Cow<'static, str>>, path: impl AsRef<Path>) -> Result<T, PathIo> {
        self.map_err(|source| PathIo::at(what, path, source))
    }

    fn doing(self, what: impl Into<Cow<'static, str>>) -> Result<T, PathIo> {
        self.map_err(|source| PathIo::doing(what, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_shapes_of_message() {
        let e = || std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(
            PathIo::at("reading", "/a b", e()).to_string(),
            format!("reading /a b: {}", e())
        );
        assert_eq!(
            PathIo::doing(format!("creating {}", "/x"), e()).to_string(),
            format!("creating /x: {}", e())
        );
        let error = PathIo::doing("x", e());
        let source = std::error::Error::source(&error).unwrap();
        assert_eq!(source.to_string(), e().to_string());
    }
}
