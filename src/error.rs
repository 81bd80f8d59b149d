//! The process-level error of `main` and the manager. The data-plane
//! processes have their own (`StorageError`, `EngineError`), which `main`
//! turns into this one; CSI services have theirs in `csi/error.rs`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("invalid CSI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        endpoint: String,
        reason: &'static str,
    },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),

    #[error("{0} is in use by a running server")]
    SocketInUse(PathBuf),

    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),

    /// `oxhorn replica` failed; its messages say what and where.
    #[error(transparent)]
    Replica(#[from] crate::replica::StorageError),

    /// `oxhorn engine` failed.
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),

    #[error("a task stopped unexpectedly: {0}")]
    Task(#[from] tokio::task::JoinError),

    #[error("rendering YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),

    #[error("instance manager: {0}")]
    Instance(#[from] crate::instance::InstanceError),

    #[error("controller: {0}")]
    Controller(#[from] crate::controller::ControllerError),

    /// `oxhorn uninstall` refused or could not finish.
    #[error(transparent)]
    Uninstall(#[from] crate::cmd::uninstall::UninstallError),
}

impl Error {
    /// An I/O error on a path, keeping the path for the message.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// The kind of an I/O error; none for the others.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
