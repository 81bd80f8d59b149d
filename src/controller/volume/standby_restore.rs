//! The I/O of a standby's restore step: what a replica holds (to compare
//! it with a backup), writing the blocks each replica needs from the
//! store and zeroing the ones it must not hold, then making the replicas
//! one: a single revision, clean, and an I/O-path record naming exactly
//! them, so that a later engine trusts only replicas that hold the backup
//! whole and rebuilds any other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::ResourceExt;

use super::super::ControllerError;
use super::super::data_plane::{self, CALL_TIMEOUT};
use super::fill::settle;
use super::standby_plan::{Plan, covered};
use crate::backup::{BLOCK_SIZE, BackupConfig, BackupError, Backupstore, BlockRef, block_checksum};
use crate::protocol::control::{IoPath, LayerChunksRequest};
use crate::protocol::{Access, Connection, ConnectionError};
use crate::replica::VOLUME_HEAD;
use crate::types::Replica;

/// Blocks read, or fetched and written, at once.
const PARALLEL: usize = 8;

/// Why a step did not complete.
#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error("the backup store: {0}")]
    Store(#[from] BackupError),
    #[error("replica {replica}: {error}")]
    Replica {
        replica: String,
        error: ConnectionError,
    },
    #[error("the backup's block at {offset} holds {got} bytes, not {expected}")]
    BlockSize {
        offset: u64,
        got: u64,
        expected: u64,
    },
    #[error(transparent)]
    Controller(#[from] ControllerError),
}

/// One replica of the step: its object, its control address and a data
/// connection to it as the volume's engine.
pub(super) struct Member {
    pub replica: Arc<Replica>,
    pub control: String,
    pub data: Connection,
}

impl Member {
    pub(super) async fn connect(
        replica: Arc<Replica>,
        control: String,
        access: &Access,
    ) -> Result<Self, StepError> {
        let address = super::replica_address(&replica).unwrap_or_default();
        let data = Connection::connect(&address, access)
            .await
            .map_err(|error| StepError::Replica {
                replica: replica.name_any(),
                error,
            })?;
        Ok(Self {
            replica,
            control,
            data,
        })
    }

    fn failed(&self, error: ConnectionError) -> StepError {
        StepError::Replica {
            replica: self.replica.name_any(),
            error,
        }
    }

    /// Offsets of the blocks any layer of the replica holds data in: the
    /// others read as zeros.
    pub(super) async fn held_blocks(&self, access: &Access) -> Result<BTreeSet<u64>, StepError> {
        let mut control =
            data_plane::replica(&self.replica, &self.control, Some(CALL_TIMEOUT), access).await?;
        let layers = control
            .status()
            .await?
            .snapshots
            .into_iter()
            .map(|s| s.name);
        let mut held = BTreeSet::new();
        for layer in layers.chain([VOLUME_HEAD.to_owned()]) {
            let request = LayerChunksRequest {
                layer,
                chunk_size: BLOCK_SIZE,
                checksums: false,
            };
            let chunks = control
                .client
                .layer_chunks(request)
                .await
                .map_err(|e| control.failed(e))?
                .into_inner()
                .chunks;
            held.extend(chunks.iter().map(|c| c.index * BLOCK_SIZE));
        }
        Ok(held)
    }

    /// For each of `offsets`, the checksum of what the replica holds of
    /// the bytes `target` covers there, None where those are zeros. A
    /// block that fails the replica's own checksums differs from any.
    pub(super) async fn checksums(
        &self,
        offsets: &BTreeSet<u64>,
        target: &BackupConfig,
    ) -> Result<BTreeMap<u64, Option<String>>, StepError> {
        // Owned offsets: a stream of borrowed ones makes the reconcile's
        // future not provably Send (rust-lang/rust#102211).
        let offsets: Vec<u64> = offsets.iter().copied().collect();
        futures::stream::iter(offsets)
            .map(|offset| self.checksum(offset, target))
            .buffer_unordered(PARALLEL)
            .try_collect()
            .await
    }

    async fn checksum(
        &self,
        offset: u64,
        target: &BackupConfig,
    ) -> Result<(u64, Option<String>), StepError> {
        let Some(len) = covered(target, offset) else {
            return Ok((offset, None));
        };
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        let data = match self.data.read(offset, len).await {
            Ok(data) => data,
            Err(ConnectionError::Corrupt { .. }) => {
                return Ok((offset, Some("rotten".to_owned())));
            }
            Err(error) => return Err(self.failed(error)),
        };
        let sum = crate::backup::on_cpu(move || {
            (!data.iter().all(|&b| b == 0)).then(|| block_checksum(&data))
        })
        .await;
        Ok((offset, sum))
    }
}

/// What a step wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Written {
    pub blocks: u64,
    pub zeroed: u64,
    pub bytes: u64,
}

/// Writes each member its plan: the target's blocks, fetched once each
/// and checked, and zeros; then flushes them.
pub(super) async fn apply(
    store: &Backupstore,
    source_volume: &str,
    target: &BackupConfig,
    members: &[Member],
    plans: &[Plan],
) -> Result<Written, StepError> {
    let sums: BTreeMap<u64, &str> = target
        .blocks
        .iter()
        .map(|b| (b.offset, b.checksum.as_str()))
        .collect();
    // By member index: a stream of borrowed items makes the reconcile's
    // future not provably Send (rust-lang/rust#102211).
    let mut writes: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (index, plan) in plans.iter().enumerate() {
        for offset in &plan.writes {
            writes.entry(*offset).or_default().push(index);
        }
    }
    let blocks = writes.len() as u64;
    let bytes = futures::stream::iter(writes)
        .map(|(offset, to)| {
            let checksum = sums.get(&offset).copied().unwrap_or_default().to_owned();
            let block = BlockRef { offset, checksum };
            let to: Vec<&Member> = to.iter().filter_map(|i| members.get(*i)).collect();
            restore_block(store, source_volume, target, block, to)
        })
        .buffer_unordered(PARALLEL)
        .try_fold(0, |total, written| async move { Ok(total + written) })
        .await?;
    let mut zeroed = BTreeSet::new();
    for (member, plan) in members.iter().zip(plans) {
        for range in &plan.zeros {
            let len = u32::try_from(range.end - range.start).unwrap_or(u32::MAX);
            member
                .data
                .unmap(range.start, len)
                .await
                .map_err(|e| member.failed(e))?;
            zeroed.insert(range.start);
        }
    }
    for member in members {
        member.data.flush().await.map_err(|e| member.failed(e))?;
    }
    Ok(Written {
        blocks,
        zeroed: zeroed.len() as u64,
        bytes,
    })
}

/// Fetches `block` of the target and writes it to the members `to`; the
/// bytes written to each.
async fn restore_block(
    store: &Backupstore,
    source_volume: &str,
    target: &BackupConfig,
    block: BlockRef,
    to: Vec<&Member>,
) -> Result<u64, StepError> {
    let offset = block.offset;
    let data = store.read_block(source_volume, &block).await?;
    let expected = covered(target, offset).unwrap_or(0);
    if data.len() as u64 != expected {
        let got = data.len() as u64;
        return Err(StepError::BlockSize {
            offset,
            got,
            expected,
        });
    }
    write_all(&to, offset, data).await
}

async fn write_all(to: &[&Member], offset: u64, data: Bytes) -> Result<u64, StepError> {
    let len = data.len() as u64;
    let writes: Vec<_> = to
        .iter()
        .map(|member| write_one(member, offset, data.clone()).boxed())
        .collect();
    futures::future::try_join_all(writes).await?;
    Ok(len)
}

async fn write_one(member: &Member, offset: u64, data: Bytes) -> Result<(), StepError> {
    member
        .data
        .write(offset, data)
        .await
        .map_err(|e| member.failed(e))
}

/// Makes the members the volume's replicas as a first engine start must
/// see them: one revision above `floor` (the last restore's), clean, and
/// an I/O-path record of this restore's generation naming exactly them, so
/// that any other replica is rebuilt rather than trusted. Returns the
/// revision.
pub(super) async fn settle_members(
    members: &[Member],
    access: &Access,
    floor: u64,
) -> Result<u64, StepError> {
    let replicas: Vec<(Arc<Replica>, String)> = members
        .iter()
        .map(|m| (Arc::clone(&m.replica), m.control.clone()))
        .collect();
    let revision = settle(&replicas, access, floor + 1).await?;
    let mut controls = Vec::with_capacity(members.len());
    let mut ids = Vec::with_capacity(members.len());
    for member in members {
        let mut control =
            data_plane::replica(&member.replica, &member.control, Some(CALL_TIMEOUT), access)
                .await?;
        ids.push(control.status().await?.id);
        controls.push(control);
    }
    // Each restore writes as a generation of its own: its record is above
    // those of every earlier one.
    let record = IoPath {
        generation: access.generation,
        version: 1,
        members: ids,
    };
    for control in &mut controls {
        control
            .client
            .set_io_path(record.clone())
            .await
            .map_err(|e| control.failed(e))?;
    }
    Ok(revision)
}
