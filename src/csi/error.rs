//! The one place where the CSI services' failures become gRPC status codes:
//! each service has its own error type, and each variant its code here.

use std::time::Duration;

use tonic::Status;

use super::guard::VolumeBusy;
use crate::frontend::FrontendError;
use crate::host::HostError;

/// Why a Controller call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerServiceError {
    /// Calls before the caches synced would decide on an empty view.
    #[error("the manager's caches are still syncing")]
    NotReady,
    /// A required request field is empty or missing.
    #[error("{0} is required")]
    Required(&'static str),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("volume {0} does not exist")]
    VolumeNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Aborted(String),
    #[error(transparent)]
    Busy(#[from] VolumeBusy),
    /// The scheduler cannot place the volume's replicas.
    #[error("volume {volume} cannot be placed ({reason}): {message}")]
    Unplaceable {
        volume: String,
        reason: String,
        message: String,
    },
    #[error("{0}")]
    Unavailable(String),
    /// A wait for the controllers that did not end in time; the CO retries.
    #[error("{what}: not done after {timeout:?}; the call can be retried")]
    Timeout { what: String, timeout: Duration },
    /// A failed Kubernetes API call about `what` ("volume pvc-1").
    #[error("Kubernetes API, {what}: {source}")]
    Api { what: String, source: kube::Error },
    #[error("{0}")]
    Unimplemented(&'static str),
}

impl ControllerServiceError {
    /// A failed API call about `what` ("volume pvc-1").
    pub fn api(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Api {
            what: what.into(),
            source,
        }
    }
}

impl From<ControllerServiceError> for Status {
    fn from(err: ControllerServiceError) -> Self {
        let message = err.to_string();
        match err {
            ControllerServiceError::Required(_) | ControllerServiceError::InvalidArgument(_) => {
                Status::invalid_argument(message)
            }
            ControllerServiceError::VolumeNotFound(_) | ControllerServiceError::NotFound(_) => {
                Status::not_found(message)
            }
            ControllerServiceError::AlreadyExists(_) => Status::already_exists(message),
            ControllerServiceError::FailedPrecondition(_) => Status::failed_precondition(message),
            ControllerServiceError::OutOfRange(_) => Status::out_of_range(message),
            ControllerServiceError::Aborted(_) | ControllerServiceError::Busy(_) => {
                Status::aborted(message)
            }
            ControllerServiceError::Unplaceable { .. } => Status::resource_exhausted(message),
            ControllerServiceError::NotReady | ControllerServiceError::Unavailable(_) => {
                Status::unavailable(message)
            }
            ControllerServiceError::Timeout { .. } => Status::deadline_exceeded(message),
            ControllerServiceError::Api { what, source } => api_status(&what, source),
            ControllerServiceError::Unimplemented(_) => Status::unimplemented(message),
        }
    }
}

/// A failed API call about `what` as the CSI caller should see it: a
/// conflict or throttling is retried by the CO (ABORTED / UNAVAILABLE), a
/// rejection by the schema is the caller's (INVALID_ARGUMENT, with the
/// schema's message), anything else is ours (INTERNAL).
fn api_status(what: &str, error: kube::Error) -> Status {
    match error {
        kube::Error::Api(status) => match status.code {
            404 => Status::not_found(format!("{what} does not exist")),
            409 => Status::aborted(format!(
                "{what} changed concurrently; retry: {}",
                status.message
            )),
            400 | 422 => Status::invalid_argument(format!("{what}: {}", status.message)),
            429 | 500..=599 => {
                Status::unavailable(format!("Kubernetes API, {what}: {}", status.message))
            }
            _ => Status::internal(format!("Kubernetes API, {what}: {}", status.message)),
        },
        other => Status::unavailable(format!("Kubernetes API, {what}: {other}")),
    }
}

/// Why a Node call failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Busy(#[from] VolumeBusy),
    #[error(transparent)]
    Host(#[from] HostError),
}

/// A device link the node could not make or remove.
impl From<FrontendError> for NodeError {
    fn from(err: FrontendError) -> Self {
        match err {
            FrontendError::NotALink { .. } => NodeError::FailedPrecondition(err.to_string()),
            FrontendError::InvalidVolume(why) => NodeError::InvalidArgument(why),
            FrontendError::Io { what, path, source } => NodeError::Host(HostError::Io {
                action: what,
                path,
                source,
            }),
        }
    }
}

impl From<NodeError> for Status {
    fn from(err: NodeError) -> Self {
        let message = err.to_string();
        match err {
            NodeError::InvalidArgument(_) => Status::invalid_argument(message),
            NodeError::NotFound(_) => Status::not_found(message),
            NodeError::AlreadyExists(_) => Status::already_exists(message),
            NodeError::FailedPrecondition(_) => Status::failed_precondition(message),
            NodeError::OutOfRange(_) => Status::out_of_range(message),
            NodeError::Busy(_) => Status::aborted(message),
            NodeError::Unavailable(_) => Status::unavailable(message),
            NodeError::Host(_) => Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::csi::VolumeLocks;

    #[test]
    fn a_busy_volume_is_aborted_in_both_services() {
        let locks = VolumeLocks::new();
        let _held = locks.try_lock("vol-a").unwrap();
        let busy = || locks.try_lock("vol-a").unwrap_err();
        for status in [
            Status::from(ControllerServiceError::from(busy())),
            Status::from(NodeError::from(busy())),
        ] {
            assert_eq!(status.code(), Code::Aborted);
            assert_eq!(
                status.message(),
                "an operation on volume vol-a is in progress"
            );
        }
    }

    #[test]
    fn api_failures_keep_their_codes_and_name_the_object() {
        let api = |code: u16| {
            let status = Status::from(ControllerServiceError::api(
                "volume pvc-1",
                kube::Error::Api(
                    kube::core::Status::failure("the message", "Reason")
                        .with_code(code)
                        .boxed(),
                ),
            ));
            assert!(status.message().contains("volume pvc-1"), "{status:?}");
            status.code()
        };
        assert_eq!(api(404), Code::NotFound);
        assert_eq!(api(409), Code::Aborted);
        assert_eq!(api(422), Code::InvalidArgument);
        assert_eq!(api(429), Code::Unavailable);
        assert_eq!(api(403), Code::Internal);
    }
}
