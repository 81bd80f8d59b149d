//! Errors of setting a frontend up or tearing it down. I/O errors of the
//! volume itself never appear here: they go to the kernel as errnos.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("{0}")]
    InvalidVolume(String),

    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{path} exists and is not a symbolic link; refusing to replace it")]
    NotALink { path: PathBuf },
}

impl FrontendError {
    /// An I/O error while doing `what` on `path`.
    pub fn io(what: &'static str, path: &Path, source: impl Into<io::Error>) -> Self {
        FrontendError::Io {
            what,
            path: path.to_path_buf(),
            source: source.into(),
        }
    }
}

pub type Result<T, E = FrontendError> = std::result::Result<T, E>;
