//! What a reconcile, and the controllers' start-up, can fail with.

use std::path::PathBuf;

use crate::instance::InstanceError;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("instance manager: {0}")]
    Instance(#[from] InstanceError),
    #[error("{target} control at {address}: {}", .status.message())]
    DataPlane {
        target: String,
        address: String,
        status: Box<tonic::Status>,
    },
    #[error("{target} control at {address}: {source}")]
    DataPlaneConnect {
        target: String,
        address: String,
        source: tonic::transport::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding status: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("the data plane's key: {0}")]
    DataPlaneKey(String),
}

impl ControllerError {
    /// Another writer changed the object since the cache saw it.
    pub(super) fn is_conflict(&self) -> bool {
        matches!(self, ControllerError::Kube(kube::Error::Api(status)) if status.code == 409)
    }

    /// A data-plane process refused or could not be reached: worth reporting
    /// in the object's status and retrying, not failing the whole pass.
    pub(super) fn is_data_plane(&self) -> bool {
        matches!(
            self,
            ControllerError::DataPlane { .. } | ControllerError::DataPlaneConnect { .. }
        )
    }
}
