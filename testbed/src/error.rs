//! What can go wrong while setting up or driving the test bed.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("reading YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),

    #[error("gRPC channel: {0}")]
    Transport(#[from] tonic::transport::Error),

    #[error("generating test certificates: {0}")]
    Certificates(#[from] rcgen::Error),

    /// Anything else, said in words: a process that exited, a timeout, a
    /// refused call.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    /// An I/O error on a path, keeping the path for the message.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
