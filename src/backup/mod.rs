//! Backups: a volume's snapshots kept in an object store (S3, Azure Blob,
//! a filesystem through `object_store`, or an NFS export through [`nfs`]),
//! incremental and deduplicated.
//!
//! # Store layout
//!
//! Under the backup target's path, per volume:
//! - `volumes/<volume>/volume.json`: the volume's size and its last backup;
//! - `volumes/<volume>/backups/<backup>.json`: one backup: its snapshot, the
//!   volume size then, and the blocks holding data, each by offset and
//!   checksum. Written last, after every block it names: a backup without
//!   its config does not exist;
//! - `volumes/<volume>/blocks/<c0c1>/<checksum>.blk`: the blocks, of
//!   [`BLOCK_SIZE`] (the last one of a volume may be shorter), named by the
//!   BLAKE3 hash of their data and compressed (LZ4 or zstd, by setting) when
//!   that makes them smaller (see `block.rs`). Identical blocks are stored
//!   once across all the volume's backups; a block of zeros is never stored;
//! - `volumes/<volume>/lock`: held by the one backup or deletion of the
//!   volume under way (see `lock.rs`): a deletion never removes a block a
//!   backup being written counts on.
//!
//! And `system-backups/<name>/`: a system backup of Oxhorn's objects (see
//! `system.rs`).

mod block;
mod lock;
pub mod nfs;
mod store;
mod system;
pub mod target;
#[cfg(test)]
mod tests;

pub use block::{Compression, checksum as block_checksum};
pub use lock::LockInfo;
pub use store::{
    BLOCK_SIZE, BackupConfig, BackupReport, Backupstore, BlockRef, NewBackup, VolumeReader,
    VolumeWriter, on_cpu,
};
pub use system::SystemBackupMeta;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("invalid {0}")]
    InvalidName(String),
    #[error("backup {0} of volume {1} does not exist")]
    NotFound(String, String),
    #[error("backup {0} of volume {1} already exists")]
    AlreadyExists(String, String),
    #[error(
        "volume {volume} is busy in the backup store: {} (held by {} since {})",
        held.operation,
        held.owner,
        held.acquired
    )]
    Busy { volume: String, held: LockInfo },
    #[error("block {checksum} at offset {offset} is missing from the backup store")]
    BlockMissing { checksum: String, offset: u64 },
    #[error("block {checksum} at offset {offset} is corrupt: {reason}")]
    BlockCorrupt {
        checksum: String,
        offset: u64,
        reason: String,
    },
    #[error("{0} in the backup store is unreadable: {1}")]
    Malformed(String, String),
    #[error("the volume: {0}")]
    Volume(std::io::Error),
    #[error("the backup store: {0}")]
    Store(#[from] object_store::Error),
}
