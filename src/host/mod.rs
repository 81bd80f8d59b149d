//! Operations on the node's host: running its programs (blkid, mkfs,
//! resize2fs, iscsiadm), mounting, and reading its mount table. When the
//! manager runs in a container, `host_process` is a host process's directory
//! in the host's /proc (its init's), and programs run in that process's mount
//! and network namespaces.

pub mod command;
pub mod device;
pub mod filesystem;
pub mod frontends;
pub mod iscsi;
pub mod mount;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What failed on the host. The messages carry what an operator needs: the
/// program and its stderr, the path and the system error.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{program} is not available on the host: {source}")]
    MissingProgram {
        program: String,
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid mount option {option:?}: {reason}")]
    MountOption {
        option: String,
        reason: &'static str,
    },
    #[error("unsupported filesystem {0:?}: only ext4 and xfs are supported")]
    UnsupportedFilesystem(String),
    #[error("unexpected output of {program}: {detail}")]
    Output { program: String, detail: String },
    /// A value refused before it reached iscsiadm's argv.
    #[error("invalid iSCSI {what} {value:?}: {reason}")]
    IscsiArgument {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    /// iscsiadm exited with a status that is not an answer we expect;
    /// `meaning` is open-iscsi's name for it.
    #[error("{command} failed ({status}, {meaning}): {stderr}")]
    Iscsiadm {
        command: String,
        status: String,
        meaning: &'static str,
        stderr: String,
    },
    /// Logged in, but the kernel made no disk of the LUN in time.
    #[error(
        "logged in to {iqn} at {portal}, but its disk did not appear at {} within {waited:?}; \
         the session is kept and a retry reuses it",
        path.display()
    )]
    IscsiDeviceMissing {
        iqn: String,
        portal: SocketAddr,
        path: PathBuf,
        waited: Duration,
    },
}

impl HostError {
    pub fn io(action: &'static str, path: &Path, source: impl Into<std::io::Error>) -> Self {
        HostError::Io {
            action,
            path: path.to_path_buf(),
            source: source.into(),
        }
    }
}

pub type Result<T, E = HostError> = std::result::Result<T, E>;

/// The host this node plugin acts on.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// A host process's /proc directory, e.g. `/host/proc/1`; None when we
    /// already are in the host's namespaces.
    host_process: Option<PathBuf>,
}

impl Host {
    pub fn new(host_process: Option<PathBuf>) -> Self {
        Self { host_process }
    }

    /// The mount table of the namespace host programs and kubelet see.
    fn mountinfo_path(&self) -> PathBuf {
        match &self.host_process {
            Some(process) => process.join("mountinfo"),
            None => PathBuf::from("/proc/self/mountinfo"),
        }
    }
}
