//! What can go wrong when starting, adopting or stopping instances.

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// A name that is not a DNS-1123 subdomain: it would become a path.
    #[error("{0}")]
    InvalidName(String),

    #[error("instance {name} runs as a {running}; it cannot become a {requested}")]
    KindChanged {
        name: String,
        running: &'static str,
        requested: &'static str,
    },

    #[error("instance {0} is being stopped; ask again once it is gone")]
    Stopping(String),

    #[error("the instance manager is shut down")]
    ShutDown,

    #[error("no {width} free consecutive port(s) in {first}-{last} on {ip}")]
    NoFreePort {
        ip: IpAddr,
        first: u16,
        last: u16,
        width: u16,
    },

    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("instance record {path}: {source}")]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("cleaning up the frontend of volume {volume}: {source}")]
    Frontend {
        volume: String,
        #[source]
        source: crate::frontend::FrontendError,
    },

    #[error("a blocking task failed: {0}")]
    Task(String),

    #[error("the instance manager must start inside a tokio runtime: {0}")]
    NoRuntime(String),

    #[error("process {pid} still runs after SIGKILL")]
    Unkillable { pid: u32 },

    #[error("stopping instance {name}: {reason}")]
    StopFailed { name: String, reason: String },

    /// The `oxhorn instance-manager` refused or failed the call.
    #[error("the instance manager answered {code}: {message}")]
    Remote { code: String, message: String },

    #[error("the instance manager at {socket}: {reason}")]
    Unreachable { socket: PathBuf, reason: String },
}

impl InstanceError {
    /// An I/O error while doing `what` on `path`.
    pub(super) fn io(what: &'static str, path: &Path, source: io::Error) -> Self {
        InstanceError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}
