//! The one place where failures of the Kubernetes API become CSI status codes.

use tonic::Status;

/// A failed API call about `what` ("volume pvc-1") as the CSI caller should
/// see it: a conflict or throttling is retried by the CO (ABORTED /
/// UNAVAILABLE), a rejection by the schema is the caller's (INVALID_ARGUMENT,
/// with the schema's message), anything else is ours (INTERNAL).
pub fn api_status(what: &str, error: kube::Error) -> Status {
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
