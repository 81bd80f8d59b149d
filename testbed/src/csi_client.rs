//! A gRPC channel to a CSI endpoint over its unix socket, for callers of the
//! plugin: tests and the local cluster.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::Result;

/// Connects to the CSI socket at `path`.
pub async fn connect(path: impl Into<PathBuf>) -> Result<Channel> {
    let path = path.into();
    // The URI is required by tonic but unused: the connector dials the socket.
    let channel = Endpoint::from_static("http://csi.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await?;
    Ok(channel)
}
