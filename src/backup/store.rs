//! The backup store: writing a backup of a volume's snapshot block by block,
//! restoring one with every block checked, deleting one and the blocks no
//! other backup needs (see the module's layout).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use tracing::info;

use super::{BackupError, Compression, block, lock};
use crate::names::validate_dns_subdomain;

/// The unit a backup stores, deduplicates and restores.
pub const BLOCK_SIZE: u64 = 2 << 20;
/// Blocks read and uploaded, or downloaded and written, at once: each holds
/// its data and its compressed copy, so at most 8 x 2 x 2 MiB in memory.
const PARALLEL: usize = 8;
/// Backup configs read at once when listing a volume's backups.
const LIST_PARALLEL: usize = 16;

/// Where a backup's data comes from: the snapshot being backed up.
pub trait VolumeReader: Sync {
    /// `len` bytes at `offset`, both within the volume.
    fn read(&self, offset: u64, len: u64) -> impl Future<Output = std::io::Result<Bytes>> + Send;
}

/// Where a restore writes: a new volume, reading zeros where the backup
/// holds no block.
pub trait VolumeWriter: Sync {
    fn write(&self, offset: u64, data: Bytes) -> impl Future<Output = std::io::Result<()>> + Send;
}

/// One block of a backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRef {
    pub offset: u64,
    /// BLAKE3 hash of the block's data, hex.
    pub checksum: String,
}

/// A backup as its config in the store describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupConfig {
    pub name: String,
    pub volume: String,
    pub snapshot: String,
    /// When it was completed (RFC 3339).
    pub created: String,
    /// The volume's size when it was taken.
    pub size: u64,
    pub block_size: u64,
    pub compression: String,
    /// The blocks holding data, by offset; the rest of the volume is zeros.
    pub blocks: Vec<BlockRef>,
    /// The labels the backup was taken with.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl BackupConfig {
    /// When it was completed; None if `created` is not a time.
    pub fn completed_at(&self) -> Option<jiff::Timestamp> {
        self.created.parse().ok()
    }
}

/// The store's record of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeConfig {
    name: String,
    size: u64,
    last_backup: String,
    last_backup_at: String,
}

/// A backup to take.
pub struct NewBackup<'a> {
    pub volume: &'a str,
    pub name: &'a str,
    pub snapshot: &'a str,
    pub size: u64,
    /// The backup this one builds on: of the volume only `changed` is read,
    /// the rest is as in that backup.
    pub previous: Option<&'a str>,
    /// The byte ranges to read: those written since `previous`'s snapshot,
    /// or, without one, those holding data.
    pub changed: &'a [Range<u64>],
    /// Who takes it, for the volume's lock.
    pub owner: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// How blocks this backup uploads are compressed.
    pub compression: Compression,
    /// Told the blocks done and the blocks to do after each block.
    pub progress: Option<&'a (dyn Fn(usize, usize) + Sync)>,
}

/// What taking a backup did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupReport {
    pub config: BackupConfig,
    /// Blocks read from the volume, and of those, uploaded: the others were
    /// zeros or already in the store.
    pub blocks_read: usize,
    pub blocks_uploaded: usize,
    /// Compressed bytes uploaded.
    pub bytes_uploaded: u64,
}

/// The backups of a backup target: an object store and a path in it.
pub struct Backupstore {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) root: Path,
}

impl Backupstore {
    pub fn new(store: Arc<dyn ObjectStore>, root: Path) -> Self {
        Self { store, root }
    }

    fn volume_dir(&self, volume: &str) -> Path {
        self.root.clone().join("volumes").join(volume)
    }

    fn config_path(&self, volume: &str, name: &str) -> Path {
        self.volume_dir(volume)
            .join("backups")
            .join(format!("{name}.json"))
    }

    fn block_path(&self, volume: &str, checksum: &str) -> Path {
        let fan_out = checksum.get(..2).unwrap_or("00");
        self.volume_dir(volume)
            .join("blocks")
            .join(fan_out)
            .join(format!("{checksum}.blk"))
    }

    fn lock_path(&self, volume: &str) -> Path {
        self.volume_dir(volume).join("lock")
    }

    /// Takes the backup: reads the changed blocks, uploads those not in the
    /// store yet, then writes its config, the moment it exists.
    pub async fn create(
        &self,
        new: &NewBackup<'_>,
        source: &impl VolumeReader,
    ) -> Result<BackupReport, BackupError> {
        check_name("volume name", new.volume)?;
        check_name("backup name", new.name)?;
        let operation = format!("backup {}", new.name);
        let lock_path = self.lock_path(new.volume);
        let held = lock::take(&*self.store, lock_path, new.volume, new.owner, operation).await?;
        let result = self.create_locked(new, source).await;
        let released = held.release().await;
        let report = result?;
        released?;
        Ok(report)
    }

    async fn create_locked(
        &self,
        new: &NewBackup<'_>,
        source: &impl VolumeReader,
    ) -> Result<BackupReport, BackupError> {
        let path = self.config_path(new.volume, new.name);
        if self.exists(&path).await? {
            return Err(BackupError::AlreadyExists(
                new.name.to_owned(),
                new.volume.to_owned(),
            ));
        }
        let mut blocks: BTreeMap<u64, String> = match new.previous {
            Some(previous) => self
                .backup(new.volume, previous)
                .await?
                .blocks
                .into_iter()
                .filter(|b| b.offset < new.size)
                .map(|b| (b.offset, b.checksum))
                .collect(),
            None => BTreeMap::new(),
        };
        // The store's blocks, and those this backup uploads: each once.
        let stored = Mutex::new(self.stored_blocks(new.volume).await?);
        let offsets = block_offsets(new.changed, new.size);
        let read = offsets.len();
        let mut uploads = futures::stream::iter(offsets)
            .map(|offset| self.back_up_block(new, source, offset, &stored))
            .buffer_unordered(PARALLEL);
        let (mut uploaded, mut bytes_uploaded, mut done) = (0, 0, 0);
        while let Some((offset, held)) = uploads.try_next().await? {
            done += 1;
            if let Some(progress) = new.progress {
                progress(done, read);
            }
            match held {
                Some((checksum, sent)) => {
                    blocks.insert(offset, checksum);
                    if let Some(sent) = sent {
                        uploaded += 1;
                        bytes_uploaded += sent;
                    }
                }
                None => {
                    blocks.remove(&offset);
                }
            }
        }
        drop(uploads);
        let config = BackupConfig {
            name: new.name.to_owned(),
            volume: new.volume.to_owned(),
            snapshot: new.snapshot.to_owned(),
            created: jiff::Timestamp::now().to_string(),
            size: new.size,
            block_size: BLOCK_SIZE,
            compression: new.compression.name().to_owned(),
            blocks: blocks
                .into_iter()
                .map(|(offset, checksum)| BlockRef { offset, checksum })
                .collect(),
            labels: new.labels.clone(),
        };
        self.put_json(&path, &config).await?;
        let volume = VolumeConfig {
            name: new.volume.to_owned(),
            size: new.size,
            last_backup: new.name.to_owned(),
            last_backup_at: config.created.clone(),
        };
        self.put_json(&self.volume_dir(new.volume).join("volume.json"), &volume)
            .await?;
        info!(
            volume = new.volume,
            backup = new.name,
            blocks = config.blocks.len(),
            uploaded,
            "backup written"
        );
        Ok(BackupReport {
            config,
            blocks_read: read,
            blocks_uploaded: uploaded,
            bytes_uploaded,
        })
    }

    /// Reads the block at `offset`; None if it is all zeros, else its
    /// checksum and, if this call uploaded it, the bytes sent.
    async fn back_up_block(
        &self,
        new: &NewBackup<'_>,
        source: &impl VolumeReader,
        offset: u64,
        stored: &Mutex<HashSet<String>>,
    ) -> Result<(u64, Option<(String, Option<u64>)>), BackupError> {
        let len = BLOCK_SIZE.min(new.size - offset);
        let data = source
            .read(offset, len)
            .await
            .map_err(BackupError::Volume)?;
        let (data, sum) = on_cpu(move || {
            let sum = (!data.iter().all(|&b| b == 0)).then(|| block::checksum(&data));
            (data, sum)
        })
        .await;
        let Some(checksum) = sum else {
            return Ok((offset, None));
        };
        // Poisoned only by a panic while inserting a string.
        let fresh = stored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(checksum.clone());
        if !fresh {
            return Ok((offset, Some((checksum, None))));
        }
        let compression = new.compression;
        let compressed = on_cpu(move || block::encode(&data, compression)).await;
        let sent = compressed.len() as u64;
        self.store
            .put(&self.block_path(new.volume, &checksum), compressed.into())
            .await?;
        Ok((offset, Some((checksum, Some(sent)))))
    }

    /// Checksums of the blocks stored for `volume`.
    pub async fn stored_blocks(&self, volume: &str) -> Result<HashSet<String>, BackupError> {
        let prefix = self.volume_dir(volume).join("blocks");
        self.store
            .list(Some(&prefix))
            .map_ok(|meta| {
                let name = meta.location.filename().unwrap_or_default();
                name.strip_suffix(".blk").unwrap_or(name).to_owned()
            })
            .try_collect()
            .await
            .map_err(Into::into)
    }

    /// Writes backup `name` of `volume` to `sink`, each block checked
    /// against its checksum; returns the bytes written. A block missing or
    /// corrupt fails the restore, naming it.
    pub async fn restore(
        &self,
        volume: &str,
        name: &str,
        sink: &impl VolumeWriter,
    ) -> Result<u64, BackupError> {
        let config = self.backup(volume, name).await?;
        // Owned blocks: a stream of borrowed ones makes the future of a
        // caller's caller not provably Send (rust-lang/rust#102211).
        futures::stream::iter(config.blocks)
            .map(|block| self.restore_block(volume, block, sink))
            .buffer_unordered(PARALLEL)
            .try_fold(0, |total, written| async move { Ok(total + written) })
            .await
    }

    async fn restore_block(
        &self,
        volume: &str,
        block: BlockRef,
        sink: &impl VolumeWriter,
    ) -> Result<u64, BackupError> {
        let data = self.read_block(volume, &block).await?;
        let len = data.len() as u64;
        sink.write(block.offset, data)
            .await
            .map_err(BackupError::Volume)?;
        Ok(len)
    }

    /// The data of `block` of one of `volume`'s backups, checked against
    /// its checksum.
    pub async fn read_block(&self, volume: &str, block: &BlockRef) -> Result<Bytes, BackupError> {
        let BlockRef { checksum, offset } = block.clone();
        let corrupt = |reason: String| BackupError::BlockCorrupt {
            checksum: checksum.clone(),
            offset,
            reason,
        };
        let compressed = match self.store.get(&self.block_path(volume, &checksum)).await {
            Ok(got) => got.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BackupError::BlockMissing { checksum, offset });
            }
            Err(error) => return Err(error.into()),
        };
        let expected = checksum.clone();
        on_cpu(move || {
            let data = block::decode(&compressed)?;
            if block::checksum(&data) != expected {
                return Err("its data does not match its checksum".to_owned());
            }
            Ok(data)
        })
        .await
        .map_err(corrupt)
    }

    /// Deletes backup `name` of `volume`, then every block of the volume
    /// that no remaining backup holds; returns how many blocks went.
    pub async fn delete(
        &self,
        volume: &str,
        name: &str,
        owner: &str,
    ) -> Result<usize, BackupError> {
        check_name("volume name", volume)?;
        check_name("backup name", name)?;
        let operation = format!("delete {name}");
        let held = lock::take(
            &*self.store,
            self.lock_path(volume),
            volume,
            owner,
            operation,
        )
        .await?;
        let result = self.delete_locked(volume, name).await;
        let released = held.release().await;
        let removed = result?;
        released?;
        Ok(removed)
    }

    async fn delete_locked(&self, volume: &str, name: &str) -> Result<usize, BackupError> {
        match self.store.delete(&self.config_path(volume, name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        let needed: HashSet<String> = self
            .backups(volume)
            .await?
            .into_iter()
            .flat_map(|b| b.blocks.into_iter().map(|block| block.checksum))
            .collect();
        let unneeded: Vec<String> = self
            .stored_blocks(volume)
            .await?
            .into_iter()
            .filter(|c| !needed.contains(c))
            .collect();
        let paths = unneeded.iter().map(|c| Ok(self.block_path(volume, c)));
        let deleted: Vec<Path> = self
            .store
            .delete_stream(futures::stream::iter(paths.collect::<Vec<_>>()).boxed())
            .try_collect()
            .await?;
        info!(
            volume,
            backup = name,
            blocks = deleted.len(),
            "backup deleted"
        );
        Ok(deleted.len())
    }

    /// Backup `name` of `volume`.
    pub async fn backup(&self, volume: &str, name: &str) -> Result<BackupConfig, BackupError> {
        check_name("volume name", volume)?;
        check_name("backup name", name)?;
        let path = self.config_path(volume, name);
        match self.store.get(&path).await {
            Ok(got) => parse(&path, &got.bytes().await?),
            Err(object_store::Error::NotFound { .. }) => {
                Err(BackupError::NotFound(name.to_owned(), volume.to_owned()))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Every backup of `volume`, by name.
    pub async fn backups(&self, volume: &str) -> Result<Vec<BackupConfig>, BackupError> {
        check_name("volume name", volume)?;
        let prefix = self.volume_dir(volume).join("backups");
        let paths: Vec<Path> = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await?;
        let mut configs: Vec<BackupConfig> = futures::stream::iter(paths)
            .map(|path| {
                let store = Arc::clone(&self.store);
                async move {
                    let bytes = store.get(&path).await?.bytes().await?;
                    parse(&path, &bytes)
                }
            })
            .buffer_unordered(LIST_PARALLEL)
            .try_collect()
            .await?;
        configs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(configs)
    }

    /// The volumes with backups in the store.
    pub async fn volumes(&self) -> Result<Vec<String>, BackupError> {
        let listed = self
            .store
            .list_with_delimiter(Some(&self.root.clone().join("volumes")))
            .await?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Who holds `volume`'s lock, if anyone.
    pub async fn lock_holder(&self, volume: &str) -> Result<Option<lock::LockInfo>, BackupError> {
        check_name("volume name", volume)?;
        lock::read(&*self.store, &self.lock_path(volume)).await
    }

    /// Removes `volume`'s lock if `owner` holds it (its operation died);
    /// whether it did.
    pub async fn break_lock(&self, volume: &str, owner: &str) -> Result<bool, BackupError> {
        check_name("volume name", volume)?;
        lock::break_for(&*self.store, &self.lock_path(volume), owner).await
    }

    pub(super) async fn exists(&self, path: &Path) -> Result<bool, BackupError> {
        match self.store.head(path).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    pub(super) async fn put_json(
        &self,
        path: &Path,
        value: &impl Serialize,
    ) -> Result<(), BackupError> {
        let body = serde_json::to_vec(value)
            .map_err(|e| BackupError::Malformed(path.to_string(), e.to_string()))?;
        self.store.put(path, body.into()).await?;
        Ok(())
    }
}

/// Names become object paths: only Kubernetes object names are taken.
pub(super) fn check_name(what: &str, name: &str) -> Result<(), BackupError> {
    validate_dns_subdomain(what, name).map_err(BackupError::InvalidName)
}

pub(super) fn parse<T: for<'de> Deserialize<'de>>(
    path: &Path,
    bytes: &[u8],
) -> Result<T, BackupError> {
    serde_json::from_slice(bytes)
        .map_err(|e| BackupError::Malformed(path.to_string(), e.to_string()))
}

/// Runs CPU-heavy work (checksums, compression) on the blocking pool, so
/// that the blocks in flight use every core rather than the one polling
/// them. A panic there goes on here (the pool is only shut down with the
/// runtime, and with it this task).
pub async fn on_cpu<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(out) => out,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// Offsets of the blocks that `ranges` touch, within a volume of `size`.
fn block_offsets(ranges: &[Range<u64>], size: u64) -> BTreeSet<u64> {
    let mut offsets = BTreeSet::new();
    for range in ranges {
        let end = range.end.min(size);
        let mut at = range.start / BLOCK_SIZE * BLOCK_SIZE;
        while at < end {
            offsets.insert(at);
            at += BLOCK_SIZE;
        }
    }
    offsets
}
