//! `oxhorn replica`: serves one replica's store over the data protocol and
//! its control API (gRPC, on the next port), including the rebuild that
//! copies another replica's snapshot layers.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::Server;
use tonic::{Request, Response, Status as GrpcStatus};
use tracing::{Instrument, info, info_span, warn};

use super::fence::Fence;
use super::rebuild_pull;
use super::{BLOCK_SIZE, IoPath, ReplicaStore, SnapshotInfo, StorageError, VOLUME_HEAD};
use crate::protocol::control::replica_control_server::{ReplicaControl, ReplicaControlServer};
use crate::protocol::control::{
    self, ByteRange, DigestRangeRequest, DigestRangeResponse, ExpandRequest, LayerChunk,
    LayerChunksRequest, LayerChunksResponse, LayerData, MarkCleanRequest, ReadLayerRequest,
    RemoveSnapshotRequest, RepairLayerRequest, ReplicaStatus, ReplicaStatusRequest, RevertRequest,
    SetRevisionRequest, SnapshotRequest, SyncFromRequest, SyncProgress, VerifyLayerRequest,
    VerifyLayerResponse,
};
use crate::protocol::{
    self, Access, Claim, Handler, Key, Op, Peer, Request as DataRequest, RequireToken,
    Response as DataResponse, Role, Status, encode_corrupt,
};

/// ReadLayer answers in messages of at most this many bytes.
const READ_LAYER_MESSAGE: u64 = 2 << 20;
/// HTTP/2 flow-control windows for layer data: the 64 KiB default would
/// stall a stream after every 64 KiB for a round trip.
pub(super) const STREAM_WINDOW: Option<u32> = Some(8 << 20);
pub(super) const CONNECTION_WINDOW: Option<u32> = Some(32 << 20);

/// The command line of `oxhorn replica`. The volume's key comes from the
/// environment (`OXHORN_VOLUME_KEY`, hex), not the command line, which any
/// process on the node can read.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplicaConfig {
    /// The volume the replica belongs to; a replica of another is refused.
    #[arg(long)]
    pub volume: String,
    /// The replica's directory; created with a new replica if empty.
    #[arg(long)]
    pub dir: PathBuf,
    /// Volume size in bytes; an existing replica must have it.
    #[arg(long)]
    pub size: u64,
    /// Data address (host:port); control listens on the next port.
    #[arg(long)]
    pub listen: SocketAddr,
}

/// Opens (or creates) the replica and serves it until `shutdown` completes,
/// then flushes it and marks it cleanly closed.
pub async fn run(
    config: ReplicaConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StorageError> {
    let key = Key::from_env().map_err(|e| StorageError::Config(e.to_string()))?;
    run_with_key(config, key, shutdown).await
}

/// [`run`] with the volume's key given, not read from the environment: for
/// replicas run inside another process (tests).
pub async fn run_with_key(
    config: ReplicaConfig,
    key: Key,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StorageError> {
    let span = info_span!("replica", volume = %config.volume, dir = %config.dir.display(), listen = %config.listen);
    async move {
        crate::names::validate_dns_subdomain("volume name", &config.volume)
            .map_err(StorageError::Config)?;
        let store = Arc::new(open_or_create(&config)?);
        let id = store.claim(&config.volume)?;
        let fence = Arc::new(Fence::new(store.generation()?));
        let access = Access { volume: config.volume.clone(), key: key.clone(), generation: 0 };
        let control_port = protocol::control_port(config.listen.port())
            .ok_or_else(|| StorageError::Config("the data port must leave room for the control port".into()))?;
        let control_addr = SocketAddr::new(config.listen.ip(), control_port);
        let listen_failed = |address| move |source| StorageError::Listen { address, source };
        let data = TcpListener::bind(config.listen).await.map_err(listen_failed(config.listen))?;
        let control = TcpListener::bind(control_addr).await.map_err(listen_failed(control_addr))?;
        info!(revision = store.revision(), replica = %id, "replica serving");
        let handler = Arc::new(DataHandler { store: store.clone(), volume: config.volume.clone(), key: key.clone(), fence: fence.clone() });
        let service = ReplicaControlServer::new(ControlService { store: store.clone(), fence, access })
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let grpc = Server::builder()
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .add_service(tonic::service::interceptor::InterceptedService::new(service, RequireToken::new(key)))
            .serve_with_incoming_shutdown(TcpListenerStream::new(control), shutdown);
        // The control API, a rebuild's copies included, runs on a thread of
        // its own: moving layer data megabytes at a time on the data path's
        // one thread held up the volume's I/O behind it.
        let grpc = on_own_thread("replica-control", grpc).map_err(listen_failed(control_addr))?;
        tokio::select! {
            served = protocol::serve(data, handler) => served.map_err(listen_failed(config.listen))?,
            served = grpc => served.map_err(|_| StorageError::Config("the control thread ended".into()))??,
        }
        let store = Arc::try_unwrap(store);
        match store {
            Ok(store) => store.close()?,
            Err(store) => store.flush()?,
        }
        info!("replica stopped");
        Ok(())
    }
    .instrument(span)
    .await
}

/// Runs `work` on a new thread with an async runtime of its own; the
/// receiver gets its output once the runtime and the tasks it spawned are
/// gone.
fn on_own_thread<T: Send + 'static>(
    name: &str,
    work: impl Future<Output = T> + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, output) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let out = runtime.block_on(work);
            drop(runtime);
            let _ = done.send(out);
        })?;
    Ok(output)
}

fn open_or_create(config: &ReplicaConfig) -> Result<ReplicaStore, StorageError> {
    if !config.dir.join("volume.meta").exists() {
        return ReplicaStore::create(&config.dir, config.size);
    }
    let store = ReplicaStore::open(&config.dir)?;
    let size = store.size()?;
    if size > config.size {
        return Err(StorageError::Config(format!(
            "{} holds a {size}-byte replica; it cannot shrink to {} bytes",
            config.dir.display(),
            config.size
        )));
    }
    // The volume grew while this replica was stopped.
    if size < config.size {
        info!(
            from = size,
            to = config.size,
            "expanding the replica to the volume's size"
        );
        store.expand(config.size)?;
    }
    Ok(store)
}

/// Runs blocking store work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(StorageError::Io {
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })
    })
}

struct DataHandler {
    store: Arc<ReplicaStore>,
    volume: String,
    key: Key,
    fence: Arc<Fence>,
}

fn status_of(error: &StorageError) -> Status {
    match error {
        StorageError::Unaligned { .. } | StorageError::OutOfRange { .. } => Status::InvalidArgument,
        StorageError::NoSpace { .. } => Status::NoSpace,
        StorageError::ReadOnly(_) => Status::InvalidArgument,
        StorageError::Fenced { .. } | StorageError::Superseded { .. } => Status::Fenced,
        StorageError::ChecksumMismatch { .. } => Status::Corrupt,
        _ => Status::IoError,
    }
}

/// Reads `length` bytes at `offset`. Rotten blocks are answered as
/// `Corrupt`, naming them, with the rest of the data read (they are zeroed):
/// the engine takes the good part and fetches the rest elsewhere.
fn read(
    store: &ReplicaStore,
    id: u64,
    offset: u64,
    length: u32,
) -> Result<DataResponse, StorageError> {
    let mut buf = vec![0; length as usize];
    match store.read_at(offset, &mut buf) {
        Ok(()) => Ok(DataResponse::ok(id, Bytes::from(buf))),
        Err(StorageError::ChecksumMismatch { path, blocks }) => {
            warn!(path = %path.display(), ?blocks, "a read found blocks that fail their checksums");
            let mut ranges = Vec::with_capacity(blocks.len());
            for (s, e) in blocks {
                let (at, len) = (s * BLOCK_SIZE, (e - s) * BLOCK_SIZE);
                ranges.push((at, len));
                let start = (at - offset) as usize;
                buf[start..start + len as usize].fill(0);
            }
            Ok(DataResponse {
                id,
                status: Status::Corrupt,
                data: encode_corrupt(&ranges, &buf),
            })
        }
        Err(error) => Err(error),
    }
}

impl Handler for DataHandler {
    fn volume(&self) -> &str {
        &self.volume
    }

    fn key(&self) -> &Key {
        &self.key
    }

    async fn admit(&self, claim: &Claim) -> Result<u64, String> {
        let (store, fence, claim) = (self.store.clone(), self.fence.clone(), claim.clone());
        blocking(move || fence.admit_connection(&store, &claim))
            .await
            .map_err(|e| e.to_string())
    }

    async fn handle(&self, request: DataRequest, peer: Peer) -> DataResponse {
        let store = &self.store;
        let (id, offset, length) = (request.id, request.offset, request.length);
        // Reads and writes hit the page cache and finish in microseconds:
        // handing them to the blocking pool would cost more than it saves.
        // Only flush waits on the disk.
        let fence = &self.fence;
        let result = match request.op {
            Op::Read => match fence.within_connection(peer, || read(store, id, offset, length)) {
                Ok(response) => return response,
                Err(error) => Err(error),
            },
            _ if peer.role == Role::Reader => Err(StorageError::ReadOnly(request.op.verb())),
            Op::Write => fence.within_connection(peer, || {
                store.write_at(offset, &request.data).map(|()| Bytes::new())
            }),
            Op::Repair => fence.within_connection(peer, || {
                store
                    .repair_at(offset, &request.data)
                    .map(|()| Bytes::new())
            }),
            Op::Unmap => fence.within_connection(peer, || {
                store
                    .unmap(offset, u64::from(length))
                    .map(|()| Bytes::new())
            }),
            Op::Flush => match fence.within_connection(peer, || Ok(())) {
                Ok(()) => {
                    let store = store.clone();
                    blocking(move || store.flush().map(|()| Bytes::new())).await
                }
                Err(error) => Err(error),
            },
            Op::Ping => Ok(Bytes::new()),
        };
        match result {
            Ok(data) => DataResponse::ok(id, data),
            Err(error) => {
                if !matches!(status_of(&error), Status::InvalidArgument | Status::Fenced) {
                    warn!(%error, op = ?request.op, "replica I/O failed");
                }
                DataResponse::error(id, status_of(&error), error)
            }
        }
    }
}

struct ControlService {
    store: Arc<ReplicaStore>,
    fence: Arc<Fence>,
    /// How this replica reaches another of its volume (a rebuild's source).
    access: Access,
}

/// The one place storage errors become gRPC codes.
pub(super) fn grpc(error: StorageError) -> GrpcStatus {
    let message = error.to_string();
    match error {
        StorageError::SnapshotNotFound(_) => GrpcStatus::not_found(message),
        StorageError::SnapshotExists(_) => GrpcStatus::already_exists(message),
        StorageError::InvalidName(_)
        | StorageError::Unaligned { .. }
        | StorageError::OutOfRange { .. }
        | StorageError::InvalidSize { .. }
        | StorageError::CannotShrink { .. }
        | StorageError::TooLong { .. }
        | StorageError::ChainOrder(_) => GrpcStatus::invalid_argument(message),
        StorageError::NoSpace { .. } => GrpcStatus::resource_exhausted(message),
        StorageError::ChecksumMismatch { .. } => GrpcStatus::data_loss(message),
        StorageError::Fenced { .. }
        | StorageError::Superseded { .. }
        | StorageError::StaleIoPath { .. } => GrpcStatus::failed_precondition(message),
        _ => GrpcStatus::internal(message),
    }
}

fn snapshot_message(info: SnapshotInfo) -> control::Snapshot {
    control::Snapshot {
        name: info.name,
        parent: info.parent.unwrap_or_default(),
        created_unix: i64::try_from(info.created).unwrap_or(i64::MAX),
        user_created: info.user_created,
        size: info.size,
        labels: info.labels.into_iter().collect(),
    }
}

impl ControlService {
    async fn status(&self) -> Result<ReplicaStatus, GrpcStatus> {
        let store = self.store.clone();
        blocking(move || {
            Ok(ReplicaStatus {
                size: store.size()?,
                revision: store.revision(),
                snapshots: store
                    .snapshots()?
                    .into_iter()
                    .map(snapshot_message)
                    .collect(),
                rebuilding: store.rebuilding()?,
                dirty: store.dirty(),
                id: store.id()?,
                generation: store.generation()?,
                io_path: store.io_path()?.map(|p| control::IoPath {
                    generation: p.generation,
                    version: p.version,
                    members: p.members,
                }),
                volume: store.volume()?,
            })
        })
        .await
        .map_err(grpc)
    }

    /// Runs `work` on the store for the engine generation `request`
    /// carries (admitting it if newer; fenced if older), then answers
    /// with the replica's status.
    async fn change<T>(
        &self,
        request: &Request<T>,
        work: impl FnOnce(&ReplicaStore) -> Result<(), StorageError> + Send + 'static,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        self.change_for(generation, work).await
    }

    async fn change_for(
        &self,
        generation: u64,
        work: impl FnOnce(&ReplicaStore) -> Result<(), StorageError> + Send + 'static,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let (store, fence) = (self.store.clone(), self.fence.clone());
        blocking(move || {
            if generation > store.generation()? {
                fence.admit(&store, generation)?;
            }
            fence.within(generation, || work(&store))
        })
        .await
        .map_err(grpc)?;
        Ok(Response::new(self.status().await?))
    }
}

type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, GrpcStatus>> + Send>>;

#[tonic::async_trait]
impl ReplicaControl for ControlService {
    async fn status(
        &self,
        _: Request<ReplicaStatusRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        Ok(Response::new(self.status().await?))
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let request = request.into_inner();
        self.change_for(generation, move |s| {
            s.snapshot(
                &request.name,
                request.user_created,
                request.labels.into_iter().collect(),
            )
        })
        .await
    }

    async fn remove_snapshot(
        &self,
        request: Request<RemoveSnapshotRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let name = request.into_inner().name;
        self.change_for(generation, move |s| s.remove_snapshot(&name))
            .await
    }

    async fn revert(
        &self,
        request: Request<RevertRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let name = request.into_inner().name;
        self.change_for(generation, move |s| s.revert(&name)).await
    }

    async fn expand(
        &self,
        request: Request<ExpandRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let size = request.into_inner().size;
        self.change_for(generation, move |s| s.expand(size)).await
    }

    async fn mark_clean(
        &self,
        request: Request<MarkCleanRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        self.change(&request, ReplicaStore::mark_clean).await
    }

    async fn set_revision(
        &self,
        request: Request<SetRevisionRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let revision = request.into_inner().revision;
        self.change_for(generation, move |s| s.set_revision(revision))
            .await
    }

    async fn set_io_path(
        &self,
        request: Request<control::IoPath>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let record = request.into_inner();
        let path = IoPath {
            generation: record.generation,
            version: record.version,
            members: record.members,
        };
        self.change_for(generation, move |s| s.set_io_path(path))
            .await
    }

    async fn verify_layer(
        &self,
        request: Request<VerifyLayerRequest>,
    ) -> Result<Response<VerifyLayerResponse>, GrpcStatus> {
        let request = request.into_inner();
        let store = self.store.clone();
        let check =
            blocking(move || store.verify_layer(&request.layer, request.offset, request.length))
                .await
                .map_err(grpc)?;
        if !check.rotten.is_empty() {
            warn!(rotten = ?check.rotten, "a scrub found blocks that fail their checksums");
        }
        Ok(Response::new(VerifyLayerResponse {
            held_bytes: check.held_bytes,
            rotten: check
                .rotten
                .into_iter()
                .map(|(offset, length)| ByteRange { offset, length })
                .collect(),
            digest: check.digest,
        }))
    }

    async fn digest_range(
        &self,
        request: Request<DigestRangeRequest>,
    ) -> Result<Response<DigestRangeResponse>, GrpcStatus> {
        let request = request.into_inner();
        let store = self.store.clone();
        let view = match request.view.as_str() {
            "" => VOLUME_HEAD.to_string(),
            view => view.to_string(),
        };
        let digest = blocking(move || store.digest_range(&view, request.offset, request.length))
            .await
            .map_err(grpc)?;
        Ok(Response::new(DigestRangeResponse { digest }))
    }

    async fn repair_layer(
        &self,
        request: Request<RepairLayerRequest>,
    ) -> Result<Response<ReplicaStatus>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let request = request.into_inner();
        self.change_for(generation, move |s| {
            let runs: Vec<_> = request
                .runs
                .into_iter()
                .map(|r| (r.offset, r.data))
                .collect();
            s.repair_layer(&request.layer, request.offset, request.length, &runs)
        })
        .await
    }

    async fn layer_chunks(
        &self,
        request: Request<LayerChunksRequest>,
    ) -> Result<Response<LayerChunksResponse>, GrpcStatus> {
        let request = request.into_inner();
        let store = self.store.clone();
        let (size, chunks) = blocking(move || {
            let chunks =
                store.layer_chunks(&request.layer, request.chunk_size, request.checksums)?;
            Ok((store.size()?, chunks))
        })
        .await
        .map_err(grpc)?;
        let chunks = chunks
            .into_iter()
            .map(|c| LayerChunk {
                index: c.index,
                checksum: c.checksum,
                bytes: c.bytes,
            })
            .collect();
        Ok(Response::new(LayerChunksResponse { size, chunks }))
    }

    type ReadLayerStream = Streamed<LayerData>;

    async fn read_layer(
        &self,
        request: Request<ReadLayerRequest>,
    ) -> Result<Response<Self::ReadLayerStream>, GrpcStatus> {
        let request = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let store = self.store.clone();
        tokio::spawn(async move {
            let mut at = request.offset;
            let end = request.offset.saturating_add(request.length);
            while at < end {
                let len = READ_LAYER_MESSAGE.min(end - at);
                let (store, layer) = (store.clone(), request.layer.clone());
                let runs = blocking(move || store.read_layer(&layer, at, len)).await;
                match runs {
                    Ok(runs) => {
                        for (offset, data) in runs {
                            if tx
                                .send(Ok(LayerData {
                                    offset,
                                    data: data.into(),
                                }))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                    Err(error) => {
                        let _ = tx.send(Err(grpc(error))).await;
                        return;
                    }
                }
                at += len;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type SyncFromStream = Streamed<SyncProgress>;

    async fn sync_from(
        &self,
        request: Request<SyncFromRequest>,
    ) -> Result<Response<Self::SyncFromStream>, GrpcStatus> {
        let generation = protocol::generation_of(request.metadata())?;
        let request = request.into_inner();
        // Marked before the answer: the engine asks while its I/O is
        // quiesced, so no write or discard reaches the layers unmarked.
        self.change_for(generation, |store| store.set_rebuilding(true))
            .await?;
        let source_access = if request.source_volume.is_empty() {
            self.access.clone()
        } else {
            Access {
                volume: request.source_volume.clone(),
                key: Key::from_hex(&request.source_key)
                    .map_err(|e| GrpcStatus::invalid_argument(format!("source key: {e}")))?,
                generation: 0,
            }
        };
        let source = rebuild_pull::connect(&request.source, &source_access).await?;
        let pace = crate::pace::Pace::new(request.bandwidth_limit);
        let (tx, rx) = mpsc::channel(16);
        let (store, fence) = (self.store.clone(), self.fence.clone());
        let span = info_span!("sync", source = %request.source);
        tokio::spawn(
            async move {
                let target = rebuild_pull::Target {
                    store,
                    fence,
                    generation,
                };
                let result = rebuild_pull::sync(&target, source, &request.layers, pace, &tx).await;
                if let Err(status) = result {
                    warn!(error = %status.message(), "rebuild sync failed");
                    let _ = tx.send(Err(status)).await;
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
