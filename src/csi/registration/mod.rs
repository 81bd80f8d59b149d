//! Registration with the kubelet: the manager serves the kubelet's plugin
//! registration API on a socket in its `plugins_registry` directory, so the
//! kubelet finds the CSI endpoint without a node-driver-registrar sidecar.
//! The socket goes when the manager stops, and the kubelet then forgets the
//! driver until the next manager registers it again. Each connection
//! passes through `relay.rs`, which mends the kubelet's `:authority`.

mod relay;

use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tracing::{debug, error, info};

use super::DRIVER_NAME;
use super::endpoint;
use crate::Result;

/// Code generated from proto/pluginregistration.proto.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("pluginregistration");
}

use proto::registration_server::{Registration, RegistrationServer};
use proto::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

/// Bytes buffered between a kubelet connection and the server, each way.
const RELAY_BUFFER: usize = 64 << 10;

/// What the kubelet calls a CSI driver's registration.
const PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI spec version of the services served.
const CSI_VERSION: &str = "1.12.0";

struct RegistrationService {
    /// The CSI socket's path as the kubelet sees it.
    csi_path: PathBuf,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.csi_path.display().to_string(),
            supported_versions: vec![CSI_VERSION.to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            info!("the kubelet registered the CSI driver");
        } else {
            error!(error = %status.error, "the kubelet refused the CSI driver");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The registration socket's path in the kubelet's `plugins_registry`
/// directory `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(format!("{DRIVER_NAME}-reg.sock"))
}

/// Serves the registration of the CSI endpoint at `csi_path` in `dir` for as
/// long as the future runs; the socket is removed when it is dropped.
pub async fn serve(dir: &Path, csi_path: PathBuf) -> Result<()> {
    let path = socket_path(dir);
    let (listener, _socket) = endpoint::bind(&path)?;
    info!(socket = %path.display(), csi = %csi_path.display(), "offering the CSI driver to the kubelet");
    let (connections, incoming) = mpsc::channel(4);
    let server = Server::builder()
        .add_service(RegistrationServer::new(RegistrationService { csi_path }))
        .serve_with_incoming(ReceiverStream::new(incoming));
    tokio::select! {
        served = server => served?,
        accepted = accept(listener, connections) => accepted?,
    }
    Ok(())
}

/// Hands each kubelet connection to the server through the relay.
async fn accept(
    listener: UnixListener,
    connections: mpsc::Sender<std::io::Result<tokio::io::DuplexStream>>,
) -> Result<()> {
    loop {
        let (kubelet, _) = listener
            .accept()
            .await
            .map_err(|e| crate::Error::io("the registration socket", e))?;
        let (ours, theirs) = tokio::io::duplex(RELAY_BUFFER);
        if connections.send(Ok(theirs)).await.is_err() {
            return Ok(());
        }
        tokio::spawn(async move {
            if let Err(error) = relay::relay(kubelet, ours).await {
                debug!(%error, "registration connection closed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_kubelet_is_told_the_driver_and_its_endpoint() {
        let service = RegistrationService {
            csi_path: PathBuf::from("/var/lib/kubelet/plugins/driver.oxhorn.io/csi.sock"),
        };
        let info = service
            .get_info(Request::new(InfoRequest {}))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "driver.oxhorn.io");
        assert_eq!(
            info.endpoint,
            "/var/lib/kubelet/plugins/driver.oxhorn.io/csi.sock"
        );
        assert_eq!(info.supported_versions, ["1.12.0"]);
    }
}
