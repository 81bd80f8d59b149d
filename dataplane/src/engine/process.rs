//! `oxhorn engine`: the engine as a process. It connects to the replicas,
//! exposes the volume through its frontend and serves the control API until
//! told to stop.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpSocket;
use tokio::time::Duration;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tracing::{Instrument, info, info_span, warn};

use tokio_util::sync::CancellationToken;

use super::{Engine, EngineControlService, EngineError};
use crate::frontend::iscsi::chap::{ChapSecrets, Credential};
use crate::frontend::iscsi::{Target, TargetConfig};
use crate::frontend::scsi::luns::DISK_LUN;
use crate::frontend::{FuseFrontend, FuseOptions, FuseTransport};
use crate::names;
use crate::protocol::{Access, Key, RequireToken};
use tonic::service::interceptor::InterceptedService;

/// How often a start waiting for replicas of the newest I/O path tries again.
const RETRY: Duration = Duration::from_secs(2);
/// How long it waits before it gives up, so that the process is started
/// again with the replica addresses its Engine names by then.
const START_PATIENCE: Duration = Duration::from_secs(60);
use crate::protocol::control::engine_control_server::EngineControlServer;

/// How the engine exposes the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FrontendKind {
    /// A file in a FUSE mount behind a loop device.
    Fuse,
    /// An iSCSI target serving the volume as LUN 1, on `--iscsi-listen`.
    Iscsi,
    /// No block device: only the control API (tests, rebuild-only engines).
    None,
}

/// The command line of `oxhorn engine`. The volume's key comes from the
/// environment (`OXHORN_VOLUME_KEY`, hex), not the command line.
#[derive(Clone, Debug, clap::Args)]
pub struct EngineConfig {
    #[arg(long)]
    pub volume: String,
    /// This engine's generation: replicas refuse engines older than the
    /// newest they have admitted.
    #[arg(long)]
    pub generation: u64,
    /// Serve from the replicas reachable even if some of the newest I/O
    /// path are not: whatever only those hold is lost. An operator's call.
    #[arg(long)]
    pub salvage: bool,
    /// Volume size in bytes.
    #[arg(long)]
    pub size: u64,
    /// Data address of a replica; repeat for each.
    #[arg(long = "replica", required = true)]
    pub replicas: Vec<String>,
    #[arg(long, value_enum, default_value = "fuse")]
    pub frontend: FrontendKind,
    /// Control API address.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The iSCSI portal's address, for `--frontend iscsi`.
    #[arg(long, required_if_eq("frontend", "iscsi"))]
    pub iscsi_listen: Option<SocketAddr>,
    /// Where the FUSE mount lives.
    #[arg(long, default_value = "/var/run/oxhorn")]
    pub run_dir: PathBuf,
    /// Where the device link `/dev/oxhorn/<volume>` is published.
    #[arg(long, default_value = "/dev/oxhorn")]
    pub dev_dir: PathBuf,
    /// How the FUSE frontend takes the kernel's requests: `/dev/fuse`, or
    /// io_uring (`io-uring`; `auto`: where the kernel offers it, through
    /// its fuse module's `enable_uring`, else `/dev/fuse`).
    #[arg(long, value_enum, default_value_t = FuseTransport::DevFuse)]
    pub fuse_transport: FuseTransport,
}

/// Mounts the FUSE file and attaches the loop device. Both block on the
/// kernel, so they run off the runtime's workers.
async fn start_fuse(
    engine: &Arc<Engine>,
    config: &EngineConfig,
) -> Result<FuseFrontend, EngineError> {
    let mut options = FuseOptions::new(&config.run_dir);
    options.dev_dir.clone_from(&config.dev_dir);
    options.transport = config.fuse_transport;
    let (engine, volume) = (Arc::clone(engine), config.volume.clone());
    let runtime = tokio::runtime::Handle::current();
    let frontend = tokio::task::spawn_blocking(move || {
        FuseFrontend::start(engine, &volume, &options, runtime)
    })
    .await??;
    Ok(frontend)
}

/// Serves the volume as an iSCSI target until `stop`; returns its
/// endpoint, `iscsi://<ip>:<port>/<iqn>/1`, and the task serving it.
async fn start_iscsi(
    engine: &Arc<Engine>,
    config: &EngineConfig,
    stop: CancellationToken,
) -> Result<(String, tokio::task::JoinHandle<()>), EngineError> {
    let address = config
        .iscsi_listen
        .ok_or_else(|| EngineError::Config("--frontend iscsi needs --iscsi-listen".to_owned()))?;
    let listen_error = |source| EngineError::Listen { address, source };
    let listener = bind(address)
        .and_then(|socket| socket.listen(LISTEN_BACKLOG))
        .map_err(listen_error)?;
    let mut target_config = TargetConfig::new(&config.volume);
    target_config.chap = chap_from_env().map_err(EngineError::Config)?;
    let endpoint = format!(
        "iscsi://{address}/{}/{DISK_LUN}",
        target_config.target_name()
    );
    let target = Target::new(target_config, Arc::clone(engine));
    Ok((endpoint, tokio::spawn(target.serve(listener, stop))))
}

/// The environment variables holding the iSCSI target's CHAP secrets
/// (never the command line, which anyone on the node can read): the user
/// and secret initiators prove, and for mutual CHAP those the target proves.
const CHAP_ENV: &str = "OXHORN_ISCSI_CHAP";
const CHAP_TARGET_ENV: &str = "OXHORN_ISCSI_CHAP_TARGET";

/// The environment that hands `secrets` to an engine (see `chap_from_env`).
pub fn chap_env(secrets: &ChapSecrets) -> Vec<(String, String)> {
    let credential = |prefix: &str, credential: &Credential| {
        [
            (format!("{prefix}_USER"), credential.user.clone()),
            (format!("{prefix}_SECRET"), credential.secret.clone()),
        ]
    };
    let mut env = credential(CHAP_ENV, &secrets.initiator).to_vec();
    if let Some(target) = &secrets.target {
        env.extend(credential(CHAP_TARGET_ENV, target));
    }
    env
}

/// The CHAP secrets of the iSCSI target, from the environment:
/// `OXHORN_ISCSI_CHAP_USER` and `_SECRET` that initiators prove, and for
/// mutual CHAP `OXHORN_ISCSI_CHAP_TARGET_USER` and `_SECRET` that the
/// target proves. None set: no authentication.
fn chap_from_env() -> Result<Option<ChapSecrets>, String> {
    let credential = |prefix: &str| -> Result<Option<Credential>, String> {
        let user = std::env::var(format!("{prefix}_USER")).ok();
        let secret = std::env::var(format!("{prefix}_SECRET")).ok();
        match (user, secret) {
            (None, None) => Ok(None),
            (Some(user), Some(secret)) if !user.is_empty() && secret.len() >= CHAP_MIN_SECRET => {
                Ok(Some(Credential { user, secret }))
            }
            _ => Err(format!(
                "{prefix}_USER and {prefix}_SECRET go together, the secret at least \
                 {CHAP_MIN_SECRET} bytes (RFC 7143 §12.1.3)"
            )),
        }
    };
    let initiator = credential(CHAP_ENV)?;
    let target = credential(CHAP_TARGET_ENV)?;
    match (initiator, target) {
        (None, None) => Ok(None),
        (Some(initiator), target) => Ok(Some(ChapSecrets { initiator, target })),
        (None, Some(_)) => Err(format!("mutual CHAP needs {CHAP_ENV}_USER and _SECRET too")),
    }
}

/// RFC 7143's shortest CHAP secret without IPsec: 96 bits.
pub const CHAP_MIN_SECRET: usize = 12;

/// Shows the volume's new size on the block device each time it grows.
async fn follow_size(mut size: tokio::sync::watch::Receiver<u64>, frontend: Arc<FuseFrontend>) {
    while size.changed().await.is_ok() {
        let frontend = Arc::clone(&frontend);
        match tokio::task::spawn_blocking(move || frontend.refresh_size()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => warn!(%error, "the block device keeps its old size"),
            Err(error) => warn!(%error, "resizing the block device"),
        }
    }
}

/// Connections the control port queues before it accepts them.
const LISTEN_BACKLOG: u32 = 1024;

/// A socket bound to `address`, not listening yet (as TcpListener::bind,
/// with SO_REUSEADDR).
fn bind(address: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    Ok(socket)
}

/// Starts the engine, waiting a while for replicas of the newest I/O path
/// that are out of reach; `None` if `shutdown` completes first.
async fn start(
    access: &Access,
    config: &EngineConfig,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<Arc<Engine>>, EngineError> {
    let deadline = tokio::time::Instant::now() + START_PATIENCE;
    loop {
        match Engine::start(access, config.size, &config.replicas, config.salvage).await {
            Ok(engine) => return Ok(Some(engine)),
            Err(error @ EngineError::IoPathUnreachable { .. })
                if tokio::time::Instant::now() < deadline =>
            {
                warn!(%error, "not serving yet");
            }
            Err(error) => return Err(error),
        }
        tokio::select! {
            () = shutdown.as_mut() => return Ok(None),
            () = tokio::time::sleep(RETRY) => {}
        }
    }
}

/// Runs the engine until `shutdown` completes.
pub async fn run(
    config: EngineConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), EngineError> {
    names::validate_dns_subdomain("volume name", &config.volume).map_err(EngineError::Config)?;
    let key = Key::from_env().map_err(|e| EngineError::Config(e.to_string()))?;
    let access = Access {
        volume: config.volume.clone(),
        key,
        generation: config.generation,
    };
    let span = info_span!("engine", volume = %config.volume, generation = config.generation);
    let mut shutdown = std::pin::pin!(shutdown);
    async move {
        // The port is bound now, so that nothing else takes it, but listens
        // only once the engine serves: the instance manager takes a port
        // that accepts connections for an engine that runs, and the volume
        // then reports itself attached; an engine still waiting for its
        // I/O path, or without its device yet, must not look so.
        let address = config.listen;
        let listen_error = |source| EngineError::Listen { address, source };
        let socket = bind(address).map_err(listen_error)?;
        let Some(engine) = start(&access, &config, &mut shutdown).await? else {
            info!("engine stopped before it served");
            return Ok(());
        };
        let frontend = match config.frontend {
            FrontendKind::Fuse => Some(Arc::new(start_fuse(&engine, &config).await?)),
            FrontendKind::Iscsi | FrontendKind::None => None,
        };
        let stop_target = CancellationToken::new();
        let target = match config.frontend {
            FrontendKind::Iscsi => Some(start_iscsi(&engine, &config, stop_target.clone()).await?),
            FrontendKind::Fuse | FrontendKind::None => None,
        };
        let endpoint = match (&frontend, &target) {
            (Some(fuse), _) => fuse.link_path().display().to_string(),
            (None, Some((endpoint, _))) => endpoint.clone(),
            (None, None) => String::new(),
        };
        let resizer = frontend
            .clone()
            .map(|f| tokio::spawn(follow_size(engine.watch_size(), f)));
        let listener = socket.listen(LISTEN_BACKLOG).map_err(listen_error)?;
        let service = EngineControlService::new(Arc::clone(&engine), endpoint.clone());
        info!(control = %config.listen, replicas = ?config.replicas, endpoint, "engine serving");
        Server::builder()
            .add_service(InterceptedService::new(
                EngineControlServer::new(service),
                RequireToken::new(access.key.clone()),
            ))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), &mut shutdown)
            .await?;
        if let Some((_, serving)) = target {
            // The commands in flight finish before the replicas are let go.
            stop_target.cancel();
            let _ = serving.await;
        }
        if let Some(resizer) = resizer {
            resizer.abort();
            let _ = resizer.await;
        }
        if let Some(frontend) = frontend.and_then(Arc::into_inner) {
            match tokio::task::spawn_blocking(move || frontend.stop()).await? {
                Ok(outcome) => info!(?outcome, "frontend stopped"),
                Err(error) => warn!(%error, "frontend did not stop cleanly"),
            }
        }
        if let Err(error) = engine.shut_down().await {
            warn!(%error, "replicas not marked clean: the next start rebuilds all but one");
        }
        info!("engine stopped");
        Ok(())
    }
    .instrument(span)
    .await
}
