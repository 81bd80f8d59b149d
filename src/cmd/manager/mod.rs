//! `oxhorn manager`: the per-node daemon. It builds the shared caches, serves
//! the CSI services on the node's socket, and runs the controllers and the
//! instance manager until told to stop. The engine and replica processes it
//! started outlive it: the next manager on the node adopts them.

mod health;
mod http;
mod metrics;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tracing::{Instrument, error, info, info_span, warn};

use crate::controller::{self, NodeConfig};
use crate::csi::proto::controller_server::ControllerServer;
use crate::csi::proto::identity_server::IdentityServer;
use crate::csi::proto::node_server::NodeServer;
use crate::csi::{
    self, ControllerService, IdentityService, NodeService, NodeServiceConfig, VolumeLocks,
};
use crate::datastore::Datastore;
use crate::host::Host;
use crate::instance::{InstanceArgs, InstanceManager};
use crate::metrics::{Exporter, KubeApiLatency};
use crate::protocol::Key;
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
    /// The node's disk, address, ports and directories, shared with the
    /// node's instance manager.
    #[command(flatten)]
    pub node: InstanceArgs,
    /// Seconds this manager's lease lasts without renewal; after that, other
    /// managers take over what this node owned.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub lease_seconds: u64,
    /// The host's /proc (mounted into the container): host operations (mkfs,
    /// mount, resize) then run in the host's mount and network namespaces.
    /// Without it they run in the manager's own.
    #[arg(long, env = "OXHORN_HOST_PROC")]
    pub host_proc: Option<PathBuf>,
    /// The host process (in `--host-proc`) whose namespaces are the host's:
    /// the node's init, unless a sandbox keeps the init out of reach.
    #[arg(long, default_value_t = 1, requires = "host_proc")]
    pub host_pid: u32,
    /// Most volumes this node takes, told to Kubernetes' scheduler through
    /// NodeGetInfo; 0 means no limit.
    #[arg(long, default_value_t = 0)]
    pub max_volumes: i64,
    /// The kubelet's plugin registration directory (its `plugins_registry`):
    /// when given, the manager registers its CSI endpoint with the kubelet
    /// there.
    #[arg(long, env = "KUBELET_REGISTRATION_DIR")]
    pub kubelet_registration_dir: Option<PathBuf>,
    /// The CSI socket's path as the kubelet sees it, where that differs from
    /// `--csi-endpoint`'s (a manager in a container); by default the same.
    #[arg(long, env = "KUBELET_CSI_PATH")]
    pub kubelet_csi_path: Option<PathBuf>,
    /// Serve the kubelet's probes (`/healthz`, `/readyz`) on this port of
    /// `--ip`; none when not given.
    #[arg(long)]
    pub health_port: Option<u16>,
    /// Serve Prometheus metrics (`/metrics`) on this port of `--ip`; none
    /// when not given.
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Serve the REST API (`/v1`, docs/api.md) and the dashboard (`/ui/`)
    /// on this port of `--ip`; none when not given.
    #[arg(long)]
    pub api_port: Option<u16>,
    /// Serve them on the loopback's port too, for `kubectl port-forward`
    /// (which connects to the pod's loopback: the host's, for a manager on
    /// the host's network). Taken only if the port is free there.
    #[arg(long, requires = "api_port")]
    pub api_loopback: bool,
    /// Serve them over TLS with the `tls.crt` and `tls.key` in this
    /// directory (a `kubernetes.io/tls` Secret's volume), read again when
    /// they change; plain HTTP while it holds neither.
    #[arg(long, requires = "api_port")]
    pub api_tls_dir: Option<PathBuf>,
    /// The socket of the node's `oxhorn instance-manager`, which then holds
    /// the engine and replica processes (in a pod of its own, they outlive
    /// the manager's container); without it the manager holds them itself
    /// (`--ports`, `--run-dir` and `--dev-dir` are then its).
    #[arg(long, env = "INSTANCE_MANAGER_SOCKET")]
    pub instance_manager: Option<PathBuf>,
    /// For tests: recurring jobs' schedules and retention ages run this
    /// many times faster than real time (60: a cron minute each second).
    #[arg(long, default_value_t = 1, hide = true, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub recurring_time_scale: u32,
}

/// Runs the manager until `shutdown` completes.
pub async fn run(config: ManagerConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    names::validate_dns_subdomain("node id", &config.node_id).map_err(Error::Config)?;
    let socket_path = csi::endpoint::parse(&config.csi_endpoint)?;
    let span = info_span!("manager", node = %config.node_id);
    async move {
        let api_latency = KubeApiLatency::default();
        let client = ClientBuilder::try_from(kube_config(config.kubeconfig.as_deref()).await?)?
            .with_layer(&api_latency)
            .build();
        let datastore = Arc::new(Datastore::start(&client, &config.namespace));
        let exporter = Arc::new(Exporter::new(
            Arc::clone(&datastore),
            &config.node_id,
            &api_latency,
        ));
        let (listener, _socket) = csi::endpoint::bind(&socket_path)?;
        info!(socket = %socket_path.display(), namespace = %config.namespace, "serving CSI");
        let identity = IdentityService::new(datastore.readiness());
        let controller = ControllerService::new(
            client.clone(),
            Arc::clone(&datastore),
            VolumeLocks::default(),
        );
        let node = NodeService::new(
            NodeServiceConfig {
                node_id: config.node_id.clone(),
                dev_dir: config.node.dev_dir.clone(),
                host_process: host_process(&config),
                max_volumes: config.max_volumes,
            },
            Arc::clone(&datastore),
        );
        let api = serve_api(&config, Arc::clone(&datastore), client.clone());
        let controllers = start_controllers(
            config.clone(),
            client,
            Arc::clone(&datastore),
            Arc::clone(&exporter),
        );
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = Server::builder()
            .add_service(IdentityServer::new(identity))
            .add_service(ControllerServer::new(controller))
            .add_service(NodeServer::new(node))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stop_rx.await;
            });
        let registration = register_with_kubelet(&config, &socket_path);
        let health = serve_health(&config, datastore.readiness());
        let metrics = serve_metrics(&config, exporter);
        tokio::pin!(server);
        tokio::select! {
            served = &mut server => served?,
            registered = registration => registered?,
            answered = health => answered?,
            answered = metrics => answered?,
            answered = api => answered?,
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
        controllers.abort();
        info!("stopped; engines and replicas keep running");
        Ok(())
    }
    .instrument(span)
    .await
}

/// Serves the kubelet's plugin registration while the manager runs, if asked
/// to: the socket goes when the manager stops (this future is dropped).
async fn register_with_kubelet(
    config: &ManagerConfig,
    socket_path: &std::path::Path,
) -> Result<()> {
    let Some(dir) = &config.kubelet_registration_dir else {
        return std::future::pending().await;
    };
    let csi_path = config
        .kubelet_csi_path
        .clone()
        .unwrap_or_else(|| socket_path.to_path_buf());
    csi::registration::serve(dir, csi_path).await
}

/// Answers the kubelet's probes while the manager runs, if asked to.
async fn serve_health(
    config: &ManagerConfig,
    ready: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    match config.health_port {
        Some(port) => health::serve(std::net::SocketAddr::new(config.node.ip, port), ready).await,
        None => std::future::pending().await,
    }
}

/// Serves `/metrics` while the manager runs, if asked to.
async fn serve_metrics(config: &ManagerConfig, exporter: Arc<Exporter>) -> Result<()> {
    match config.metrics_port {
        Some(port) => {
            let address = std::net::SocketAddr::new(config.node.ip, port);
            metrics::serve(address, exporter).await
        }
        None => std::future::pending().await,
    }
}

/// Serves the REST API while the manager runs, if asked to.
async fn serve_api(
    config: &ManagerConfig,
    datastore: Arc<Datastore>,
    client: Client,
) -> Result<()> {
    match config.api_port {
        Some(port) => {
            let address = std::net::SocketAddr::new(config.node.ip, port);
            let state = Arc::new(crate::api::ApiState::new(datastore, client));
            let routes =
                crate::api::router(Arc::clone(&state)).merge(crate::dashboard::router(state));
            let Ok(tls) = api_tls(config) else {
                return std::future::pending().await;
            };
            let loopback = async {
                if !config.api_loopback {
                    return std::future::pending().await;
                }
                let at = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                if let Err(error) = crate::api::serve(at, routes.clone(), tls.clone()).await {
                    // Another process has it: the node's address still serves.
                    tracing::warn!(%error, "the API is not served on the loopback");
                }
                std::future::pending().await
            };
            tokio::select! {
                served = crate::api::serve(address, routes.clone(), tls.clone()) => served,
                never = loopback => never,
            }
        }
        None => std::future::pending().await,
    }
}

/// The API's TLS configuration: none for plain HTTP, an error (logged:
/// the API is then not served, while the rest of the manager is) for a
/// certificate that cannot be used.
fn api_tls(config: &ManagerConfig) -> std::result::Result<Option<Arc<rustls::ServerConfig>>, ()> {
    use crate::api::tls;
    let Some(dir) = &config.api_tls_dir else {
        return Ok(None);
    };
    let unusable = |error: crate::Error| {
        error!(%error, "the API is not served: its certificate cannot be used");
    };
    if !dir.is_dir() {
        warn!(dir = %dir.display(), "no such directory: the API is served over plain HTTP");
        return Ok(None);
    }
    let Some(files) = tls::TlsFiles::in_dir(dir).map_err(unusable)? else {
        info!(dir = %dir.display(), "no certificate: the API is served over plain HTTP");
        return Ok(None);
    };
    tls::config(files).map(Some).map_err(unusable)
}

/// Once the caches have synced: adopts the engine and replica processes a
/// previous manager left running, makes sure this node has its Node object,
/// holds the node's lease and runs the controllers.
fn start_controllers(
    config: ManagerConfig,
    client: Client,
    datastore: Arc<Datastore>,
    exporter: Arc<Exporter>,
) -> JoinHandle<()> {
    tokio::spawn(
        async move {
            if let Err(error) = run_controllers(config, client, datastore, exporter).await {
                error!(%error, "the controllers stopped");
            }
        }
        .in_current_span(),
    )
}

/// The host process whose namespaces host programs run in, with
/// `--host-proc`.
fn host_process(config: &ManagerConfig) -> Option<PathBuf> {
    config
        .host_proc
        .as_ref()
        .map(|proc| proc.join(config.host_pid.to_string()))
}

async fn run_controllers(
    config: ManagerConfig,
    client: Client,
    datastore: Arc<Datastore>,
    exporter: Arc<Exporter>,
) -> Result<()> {
    datastore.wait_until_ready().await;
    let key = controller::cluster_key(&client, &config.namespace).await?;
    let instances = start_instances(&config, &key).await?;
    let node = NodeConfig {
        node_id: config.node_id.clone(),
        data_dir: config.node.data_dir.clone(),
        host: Host::new(host_process(&config)),
        dev_dir: config.node.dev_dir.clone(),
        job_clock: controller::JobClock::scaled(config.recurring_time_scale),
    };
    let counted = exporter.counted();
    let ctx = controller::Context::new(client.clone(), datastore, node, instances, key, counted);
    exporter.controllers_run(Arc::clone(&ctx));
    controller::ensure_own_node(&ctx).await?;
    let lease = controller::hold_lease(
        client,
        config.namespace.clone(),
        config.node_id.clone(),
        Duration::from_secs(config.lease_seconds),
    )
    .await?;
    info!("controllers running");
    futures::join!(lease, controller::run(ctx));
    Ok(())
}

/// The node's instance manager: the `oxhorn instance-manager` at
/// `--instance-manager` (told the cluster key through its file), or one in
/// this process.
async fn start_instances(config: &ManagerConfig, key: &Key) -> Result<Arc<InstanceManager>> {
    if let Some(socket) = &config.instance_manager {
        crate::instance::write_cluster_key(&config.node.data_dir, key)?;
        info!(socket = %socket.display(), "asking the node's instance manager");
        return Ok(InstanceManager::connect(socket).await?);
    }
    Ok(InstanceManager::start(config.node.config(key.clone())?).await?)
}

/// A client from the given kubeconfig, or from the environment (in-cluster
/// service account, $KUBECONFIG, ~/.kube/config).
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<Client> {
    Ok(Client::try_from(kube_config(kubeconfig).await?)?)
}

/// The client configuration [`kube_client`] uses.
async fn kube_config(kubeconfig: Option<&std::path::Path>) -> Result<Config> {
    Ok(match kubeconfig {
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
    })
}
