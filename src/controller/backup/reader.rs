//! Reading a snapshot for a backup from a running replica of its volume,
//! over the replica's control API: which blocks hold data (or changed since
//! an earlier snapshot), and each block's data as of the snapshot. What
//! fails its checksums there is read from another replica.
//!
//! The volume as of snapshot S is its layers from the oldest up to S, each
//! newer one over the older; a block changed since snapshot P is one that
//! a layer after P, up to S, holds (an unmap over older data is written as
//! zeros, so it counts). Snapshot layers do not change while they exist.

use std::collections::BTreeSet;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use futures::TryStreamExt;
use tokio::sync::OnceCell;
use tracing::warn;

use crate::backup::{BLOCK_SIZE, VolumeReader};
use crate::protocol::TokenChannel;
use crate::protocol::control::replica_control_client::ReplicaControlClient;
use crate::protocol::control::{LayerChunksRequest, ReadLayerRequest};

/// A snapshot's layers on one replica, and the blocks each holds.
pub struct SnapshotReader {
    client: ReplicaControlClient<TokenChannel>,
    /// Oldest first, up to and including the snapshot: each layer's name
    /// and the indexes of the blocks it holds data in.
    layers: Vec<(String, BTreeSet<u64>)>,
    /// Other replicas' readers of the snapshot, in turn, for what this
    /// replica's copy fails the checksums of: found on the first need.
    others: OnceCell<Vec<SnapshotReader>>,
    find_others: Mutex<Option<FindOthers>>,
}

/// Finds the other replicas' readers of a snapshot.
pub type FindOthers = Pin<Box<dyn Future<Output = Vec<SnapshotReader>> + Send>>;

impl SnapshotReader {
    /// Reads `chain` (the replica's snapshots, oldest first) up to
    /// `snapshot`; None when the chain does not hold it.
    pub async fn new(
        mut client: ReplicaControlClient<TokenChannel>,
        chain: &[String],
        snapshot: &str,
    ) -> Result<Option<Self>, tonic::Status> {
        let Some(end) = chain.iter().position(|s| s == snapshot) else {
            return Ok(None);
        };
        let mut layers = Vec::with_capacity(end + 1);
        for layer in &chain[..=end] {
            let request = LayerChunksRequest {
                layer: layer.clone(),
                chunk_size: BLOCK_SIZE,
                checksums: false,
            };
            let chunks = client.layer_chunks(request).await?.into_inner().chunks;
            layers.push((layer.clone(), chunks.iter().map(|c| c.index).collect()));
        }
        Ok(Some(Self {
            client,
            layers,
            others: OnceCell::new(),
            find_others: Mutex::new(None),
        }))
    }

    /// Reads what this replica's copy fails the checksums of from the
    /// readers `others` finds, in turn, instead.
    pub fn or_else(&mut self, others: FindOthers) {
        self.find_others = Mutex::new(Some(others));
    }

    async fn others(&self) -> &[SnapshotReader] {
        self.others
            .get_or_init(|| async {
                let find = self
                    .find_others
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                match find {
                    Some(find) => find.await,
                    None => Vec::new(),
                }
            })
            .await
    }

    /// The byte ranges of the blocks that layers after `since` (a snapshot
    /// in the chain; None: all of them) hold.
    pub fn changed(&self, since: Option<&str>) -> Vec<Range<u64>> {
        changed_ranges(&self.layers, since)
    }

    /// Where `snapshot` is among the layers read, oldest first, if it is.
    pub fn position(&self, snapshot: &str) -> Option<usize> {
        self.layers.iter().position(|(name, _)| name == snapshot)
    }

    /// `[offset, offset + len)` as of the snapshot, from this replica's
    /// layers (each replica's own: a rebuilt one's may hold blocks in other
    /// layers, and read the same).
    async fn read_here(&self, offset: u64, len: u64) -> Result<Bytes, tonic::Status> {
        let mut buf = BytesMut::zeroed(
            usize::try_from(len).map_err(|e| tonic::Status::out_of_range(e.to_string()))?,
        );
        let first = offset / BLOCK_SIZE;
        let last = (offset + len).div_ceil(BLOCK_SIZE);
        // Oldest first, so that a newer layer's data lands over an older's.
        for (layer, blocks) in &self.layers {
            if blocks.range(first..last).next().is_none() {
                continue;
            }
            let request = ReadLayerRequest {
                layer: layer.clone(),
                offset,
                length: len,
            };
            let mut stream = self.client.clone().read_layer(request).await?.into_inner();
            while let Some(extent) = stream.try_next().await? {
                let at = extent
                    .offset
                    .checked_sub(offset)
                    .and_then(|at| usize::try_from(at).ok())
                    .filter(|at| at + extent.data.len() <= buf.len())
                    .ok_or_else(|| {
                        tonic::Status::internal(format!(
                            "layer {layer} sent data at {} outside {offset}+{len}",
                            extent.offset
                        ))
                    })?;
                buf[at..at + extent.data.len()].copy_from_slice(&extent.data);
            }
        }
        Ok(buf.freeze())
    }
}

/// [`SnapshotReader::changed`] of `layers`.
fn changed_ranges(layers: &[(String, BTreeSet<u64>)], since: Option<&str>) -> Vec<Range<u64>> {
    let start = since
        .and_then(|since| layers.iter().position(|(name, _)| name == since))
        .map_or(0, |at| at + 1);
    let blocks: BTreeSet<u64> = layers[start..]
        .iter()
        .flat_map(|(_, blocks)| blocks.iter().copied())
        .collect();
    let mut ranges: Vec<Range<u64>> = Vec::new();
    for block in blocks {
        let range = block * BLOCK_SIZE..(block + 1) * BLOCK_SIZE;
        match ranges.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => ranges.push(range),
        }
    }
    ranges
}

impl VolumeReader for SnapshotReader {
    async fn read(&self, offset: u64, len: u64) -> std::io::Result<Bytes> {
        let mut failed = match self.read_here(offset, len).await {
            Ok(data) => return Ok(data),
            Err(status) => status,
        };
        // A block of this replica's copy failed its checksum: never stored,
        // taken from another replica's copy if one passes.
        if failed.code() != tonic::Code::DataLoss {
            return Err(std::io::Error::other(failed));
        }
        for other in self.others().await {
            if failed.code() != tonic::Code::DataLoss {
                break;
            }
            warn!(offset, len, error = %failed.message(), "backup: a replica's copy of the snapshot is rotten here; reading another's");
            failed = match other.read_here(offset, len).await {
                Ok(data) => return Ok(data),
                Err(status) => status,
            };
        }
        Err(std::io::Error::other(failed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(of: &[(&str, &[u64])]) -> Vec<(String, BTreeSet<u64>)> {
        of.iter()
            .map(|(n, b)| ((*n).to_owned(), b.iter().copied().collect()))
            .collect()
    }

    const B: u64 = BLOCK_SIZE;

    #[test]
    fn without_an_earlier_snapshot_every_written_block_is_read() {
        let chain = layers(&[("s1", &[0, 1, 5]), ("s2", &[1, 2])]);
        assert_eq!(changed_ranges(&chain, None), vec![0..3 * B, 5 * B..6 * B]);
    }

    #[test]
    fn since_a_snapshot_only_the_later_layers_count() {
        let chain = layers(&[("s1", &[0, 1, 5]), ("s2", &[1, 2]), ("s3", &[7])]);
        assert_eq!(
            changed_ranges(&chain, Some("s1")),
            vec![B..3 * B, 7 * B..8 * B]
        );
        assert_eq!(changed_ranges(&chain, Some("s3")), vec![]);
    }

    #[test]
    fn an_unknown_earlier_snapshot_reads_everything() {
        let chain = layers(&[("s1", &[0]), ("s2", &[3])]);
        assert_eq!(
            changed_ranges(&chain, Some("gone")),
            vec![0..B, 3 * B..4 * B]
        );
    }
}
