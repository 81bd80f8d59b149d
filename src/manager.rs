//! `oxhorn manager`: the per-node daemon. It builds the shared caches and serves
//! the CSI services on the node's socket until told to stop.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tracing::{Instrument, info, info_span, warn};

use crate::csi::proto::identity_server::IdentityServer;
use crate::csi::{self, IdentityService};
use crate::datastore::Datastore;
use crate::{Error, Result, names};

/// How long in-flight CSI calls may take to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What a manager needs to know about its node and cluster; also the
/// command line of `oxhorn manager`.
#[derive(Clone, Debug, clap::Args)]
pub struct ManagerConfig {
    /// CSI endpoint to serve on.
    #[arg(long, env = "CSI_ENDPOINT", value_name = "unix:///PATH")]
    pub csi_endpoint: String,
    /// This node's name, as Kubernetes knows it.
    #[arg(long, env = "NODE_ID")]
    pub node_id: String,
    /// Kubeconfig file; without it, the in-cluster service account or $KUBECONFIG.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of oxhorn's objects.
    #[arg(long, env = "POD_NAMESPACE", default_value = crate::types::DEFAULT_NAMESPACE)]
    pub namespace: String,
}

/// Runs the manager until `shutdown` completes.
pub async fn run(config: ManagerConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    names::validate_dns_subdomain("node id", &config.node_id).map_err(Error::Config)?;
    let socket_path = csi::endpoint::parse(&config.csi_endpoint)?;
    let span = info_span!("manager", node = %config.node_id);
    async move {
        let client = kube_client(config.kubeconfig.as_deref()).await?;
        let datastore = Datastore::start(&client, &config.namespace);
        let (listener, _socket) = csi::endpoint::bind(&socket_path)?;
        info!(socket = %socket_path.display(), namespace = %config.namespace, "serving CSI");
        let identity = IdentityService::new(datastore.readiness());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = Server::builder()
            .add_service(IdentityServer::new(identity))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stop_rx.await;
            });
        tokio::pin!(server);
        tokio::select! {
            served = &mut server => served?,
            () = shutdown => {
                let _ = stop_tx.send(());
                // Graceful shutdown also waits for idle client connections,
                // which kubelet keeps open: bound the wait.
                match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                    Ok(served) => served?,
                    Err(_) => warn!(grace = ?SHUTDOWN_GRACE, "closing connections still open"),
                }
            }
        }
        info!("stopped");
        Ok(())
    }
    .instrument(span)
    .await
}

/// A client from the given kubeconfig, or from the environment (in-cluster
/// service account, $KUBECONFIG, ~/.kube/config).
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::KubeConfig(format!("{}: {e}", path.display())))?
        }
        None => Config::infer()
            .await
            .map_err(|e| Error::KubeConfig(e.to_string()))?,
    };
    Ok(Client::try_from(config)?)
}
