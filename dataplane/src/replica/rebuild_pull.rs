//! The replica side of a rebuild: pulling the snapshot layers of a healthy
//! replica (the source) over its control API, chunk by chunk, copying only
//! the chunks whose checksums differ, at no more than the bandwidth the
//! engine allows.

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::mpsc;
use tonic::Status as GrpcStatus;
use tracing::info;

use super::fence::Fence;
use super::rebuild_store::ROTTEN_CHUNK;
use super::service::{CONNECTION_WINDOW, STREAM_WINDOW, blocking, grpc};
use super::{BLOCK_SIZE, LayerSpec, ReplicaStore, StorageError};
use crate::pace::Pace;
use crate::protocol::control::replica_control_client::ReplicaControlClient;
use crate::protocol::control::{self, LayerChunksRequest, ReadLayerRequest, SyncProgress};
use crate::protocol::{self, Access, TokenChannel};

/// Rebuilds compare and copy layers in chunks of this size.
const SYNC_CHUNK: u64 = 2 << 20;
/// Chunks a rebuild fetches and writes at once.
const SYNC_PARALLEL: usize = 8;

/// A client of the source replica's control API, with flow-control windows
/// sized for layer data.
pub(super) async fn connect(
    address: &str,
    access: &Access,
) -> Result<ReplicaControlClient<TokenChannel>, GrpcStatus> {
    let endpoint = crate::protocol::control_endpoint(address)
        .map_err(|e| GrpcStatus::invalid_argument(format!("source {address:?}: {e}")))?
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| GrpcStatus::unavailable(format!("source {address}: {e}")))?;
    Ok(
        ReplicaControlClient::new(protocol::with_token(channel, access))
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20),
    )
}

/// The replica a rebuild fills, for the engine generation that asked.
pub(super) struct Target {
    pub store: Arc<ReplicaStore>,
    pub fence: Arc<Fence>,
    pub generation: u64,
}

/// Makes the store's snapshot chain equal to `layers` on the source,
/// copying only the chunks that differ at no more than `pace` allows, and
/// reports progress on `progress`.
pub(super) async fn sync(
    target: &Target,
    mut source: ReplicaControlClient<TokenChannel>,
    layers: &[control::Snapshot],
    pace: Pace,
    progress: &mpsc::Sender<Result<SyncProgress, GrpcStatus>>,
) -> Result<(), GrpcStatus> {
    let store = &target.store;
    let mut plans = Vec::new();
    for layer in layers {
        plans.push(plan_layer(store, &mut source, layer).await?);
    }
    let total: u64 = plans.iter().map(|p| p.bytes).sum();
    let mut report = SyncProgress {
        bytes_done: 0,
        bytes_total: total,
        bytes_copied: 0,
    };
    for plan in &plans {
        let copies: Vec<_> = plan
            .copy
            .iter()
            .map(|&(index, bytes)| {
                let (store, source, name) = (store.clone(), source.clone(), plan.name.clone());
                let pace = &pace;
                async move {
                    pace.take(bytes).await;
                    let copied = copy_chunk(&store, source, &name, index * SYNC_CHUNK).await?;
                    Ok::<_, GrpcStatus>((copied, bytes))
                }
            })
            .collect();
        let mut copies = futures::stream::iter(copies).buffer_unordered(SYNC_PARALLEL);
        while let Some(done) = copies.next().await {
            let (copied, bytes) = done?;
            report.bytes_copied += copied;
            report.bytes_done += bytes;
            let _ = progress.send(Ok(report)).await;
        }
        report.bytes_done += plan.skipped;
    }
    let chain: Vec<String> = layers.iter().map(|l| l.name.clone()).collect();
    let (store_, fence, generation) = (store.clone(), target.fence.clone(), target.generation);
    // Not if a newer engine took over meanwhile: it rebuilds on its own.
    blocking(move || {
        fence.within(generation, || {
            store_.install_chain(&chain)?;
            store_.set_rebuilding(false)
        })
    })
    .await
    .map_err(grpc)?;
    info!(
        bytes_total = total,
        bytes_copied = report.bytes_copied,
        "layers in sync"
    );
    let _ = progress.send(Ok(report)).await;
    Ok(())
}

/// What must be copied of one source layer.
struct LayerPlan {
    name: String,
    /// (chunk index, source bytes in it) of chunks that differ.
    copy: Vec<(u64, u64)>,
    /// Source bytes in chunks that already match.
    skipped: u64,
    bytes: u64,
}

async fn plan_layer(
    store: &Arc<ReplicaStore>,
    source: &mut ReplicaControlClient<TokenChannel>,
    layer: &control::Snapshot,
) -> Result<LayerPlan, GrpcStatus> {
    let spec = LayerSpec {
        name: layer.name.clone(),
        created: u64::try_from(layer.created_unix).unwrap_or(0),
        user_created: layer.user_created,
        labels: layer.labels.clone().into_iter().collect(),
    };
    let (store_, name) = (store.clone(), layer.name.clone());
    // What this replica already holds of the layer, if anything.
    let local = blocking(move || {
        let local = match store_.layer_chunks(&name, SYNC_CHUNK, true) {
            Ok(chunks) => chunks,
            Err(StorageError::SnapshotNotFound(_)) => Vec::new(),
            Err(error) => return Err(error),
        };
        store_.stage_layer(&spec)?;
        Ok(local)
    })
    .await
    .map_err(grpc)?;
    let remote = source
        .layer_chunks(LayerChunksRequest {
            layer: layer.name.clone(),
            chunk_size: SYNC_CHUNK,
            checksums: !local.is_empty(),
        })
        .await?
        .into_inner()
        .chunks;
    let local: std::collections::BTreeMap<u64, u64> =
        local.into_iter().map(|c| (c.index, c.checksum)).collect();
    let mut plan = LayerPlan {
        name: layer.name.clone(),
        copy: Vec::new(),
        skipped: 0,
        bytes: 0,
    };
    for chunk in &remote {
        plan.bytes += chunk.bytes;
        if chunk.checksum != ROTTEN_CHUNK && local.get(&chunk.index) == Some(&chunk.checksum) {
            plan.skipped += chunk.bytes;
        } else {
            plan.copy.push((chunk.index, chunk.bytes));
        }
    }
    // Chunks only this replica holds must be emptied.
    let remote_indexes: std::collections::BTreeSet<u64> = remote.iter().map(|c| c.index).collect();
    plan.copy.extend(
        local
            .keys()
            .filter(|i| !remote_indexes.contains(i))
            .map(|&i| (i, 0)),
    );
    plan.copy.sort_unstable();
    Ok(plan)
}

/// Replaces one chunk of layer `name` with the source's; returns bytes copied.
async fn copy_chunk(
    store: &Arc<ReplicaStore>,
    mut source: ReplicaControlClient<TokenChannel>,
    name: &str,
    offset: u64,
) -> Result<u64, GrpcStatus> {
    let mut stream = source
        .read_layer(ReadLayerRequest {
            layer: name.to_string(),
            offset,
            length: SYNC_CHUNK,
        })
        .await?
        .into_inner();
    let mut runs = Vec::new();
    while let Some(piece) = stream.message().await? {
        runs.push((piece.offset, piece.data));
    }
    let copied = runs.iter().map(|(_, d)| d.len() as u64).sum();
    let (store, name) = (store.clone(), name.to_string());
    let size = store.size().map_err(grpc)?;
    let len = SYNC_CHUNK.min(size.saturating_sub(offset)) / BLOCK_SIZE * BLOCK_SIZE;
    blocking(move || store.patch_layer(&name, offset, len, &runs))
        .await
        .map_err(grpc)?;
    Ok(copied)
}
