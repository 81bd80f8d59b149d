//! What goes wrong talking to an NFS server, and what it means to an
//! object store's user.
//!
//! The words matter to the controller (see `store_refusal` there): an
//! answer the server gave says "status code" and its NFS status, a server
//! that did not answer never does (it is then "Unreachable").

use std::net::SocketAddr;

use nfs3_client::nfs3_types::mount::mountstat3;
use nfs3_client::nfs3_types::nfs3::nfsstat3;
use nfs3_client::{PortmapError, RpcError};

pub(super) const STORE: &str = "NFS";

#[derive(Debug, thiserror::Error)]
pub enum NfsError {
    #[error("cannot resolve NFS server {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("cannot connect to NFS server {address}: {source}")]
    Connect {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "the portmapper of NFS server {host} (port 111) did not give the port of {program}: {source}"
    )]
    Portmap {
        host: String,
        program: &'static str,
        source: PortmapError,
    },
    #[error("NFS server {host} did not answer {procedure} within {}s", seconds)]
    Timeout {
        host: String,
        procedure: &'static str,
        seconds: u64,
    },
    #[error("{procedure} to NFS server {host} failed: {source}")]
    Rpc {
        host: String,
        procedure: &'static str,
        source: RpcError,
    },
    #[error("NFS server {host} refused to mount {path}: status code {status}{}; its exports: {}",
        mount_hint(*status), exports.join(", "))]
    Mount {
        host: String,
        path: String,
        status: mountstat3,
        exports: Vec<String>,
    },
    #[error("NFS server answered {procedure} of {path} with status code {status}{}", hint(*status))]
    Status {
        procedure: &'static str,
        path: String,
        status: nfsstat3,
    },
    #[error("{path}: {why}")]
    Path { path: String, why: &'static str },
    #[error("NFS server answered READDIRPLUS of {path} with a page that does not go on")]
    Listing { path: String },
}

impl NfsError {
    /// The NFS status the server answered with, if it did.
    pub fn status(&self) -> Option<nfsstat3> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(nfsstat3::NFS3ERR_NOENT)
    }
}

fn hint(status: nfsstat3) -> &'static str {
    match status {
        nfsstat3::NFS3ERR_ACCES | nfsstat3::NFS3ERR_PERM | nfsstat3::NFS3ERR_ROFS => {
            " (the export must be writable by root: rw and no_root_squash)"
        }
        nfsstat3::NFS3ERR_NOSPC | nfsstat3::NFS3ERR_DQUOT => " (the NFS export is full)",
        nfsstat3::NFS3ERR_STALE => {
            " (the export changed on the server; it is mounted again on the next call)"
        }
        _ => "",
    }
}

fn mount_hint(status: mountstat3) -> &'static str {
    match status {
        mountstat3::MNT3ERR_ACCES | mountstat3::MNT3ERR_PERM => {
            " (is the path an export, and may this node mount it?)"
        }
        _ => "",
    }
}

impl From<NfsError> for object_store::Error {
    fn from(error: NfsError) -> Self {
        let path = match &error {
            NfsError::Status { path, .. } | NfsError::Path { path, .. } => path.clone(),
            _ => String::new(),
        };
        let status = error.status();
        let source = Box::new(error);
        match status {
            Some(nfsstat3::NFS3ERR_NOENT) => Self::NotFound { path, source },
            Some(nfsstat3::NFS3ERR_EXIST) => Self::AlreadyExists { path, source },
            Some(nfsstat3::NFS3ERR_ACCES | nfsstat3::NFS3ERR_PERM) => {
                Self::PermissionDenied { path, source }
            }
            _ => Self::Generic {
                store: STORE,
                source,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: nfsstat3) -> object_store::Error {
        NfsError::Status {
            procedure: "LOOKUP",
            path: "volumes/v".into(),
            status,
        }
        .into()
    }

    #[test]
    fn nfs_statuses_become_object_store_errors_naming_them() {
        let error = status(nfsstat3::NFS3ERR_NOENT);
        assert!(
            matches!(error, object_store::Error::NotFound { ref path, .. } if path == "volumes/v")
        );
        assert!(error.to_string().contains("NFS3ERR_NOENT"), "{error}");
        let error = status(nfsstat3::NFS3ERR_ACCES);
        assert!(matches!(
            error,
            object_store::Error::PermissionDenied { .. }
        ));
        assert!(error.to_string().contains("no_root_squash"), "{error}");
        let error = status(nfsstat3::NFS3ERR_NOSPC);
        assert!(matches!(error, object_store::Error::Generic { .. }));
        assert!(
            error.to_string().contains("the NFS export is full"),
            "{error}"
        );
        let error = status(nfsstat3::NFS3ERR_EXIST);
        assert!(matches!(error, object_store::Error::AlreadyExists { .. }));
        let error = status(nfsstat3::NFS3ERR_IO);
        assert!(
            error.to_string().contains("status code NFS3ERR_IO"),
            "{error}"
        );
    }

    #[test]
    fn a_server_that_does_not_answer_never_says_status_code() {
        let error: object_store::Error = NfsError::Timeout {
            host: "10.0.0.1".into(),
            procedure: "READ",
            seconds: 30,
        }
        .into();
        let text = error.to_string();
        assert!(text.contains("did not answer READ"), "{text}");
        assert!(!text.contains("status code"), "{text}");
    }
}
