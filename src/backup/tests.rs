//! The backup store on a real filesystem (object_store's LocalFileSystem in
//! a temporary directory); the volumes are in memory.

// `&[0..SIZE]` is a list of byte ranges to back up, one of them here.
#![allow(clippy::single_range_in_vec_init)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

use super::*;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 16 * MIB + 512 * 1024;

/// A volume in memory, for backing up from and restoring to.
struct Volume(Mutex<Vec<u8>>);

impl Volume {
    fn new(size: u64) -> Self {
        Self(Mutex::new(vec![0; size as usize]))
    }

    fn fill(&self, offset: u64, len: u64, byte: u8) {
        self.0.lock().unwrap()[offset as usize..(offset + len) as usize].fill(byte);
    }

    fn data(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

impl VolumeReader for Volume {
    async fn read(&self, offset: u64, len: u64) -> std::io::Result<Bytes> {
        let data = self.0.lock().unwrap();
        Ok(Bytes::copy_from_slice(
            &data[offset as usize..(offset + len) as usize],
        ))
    }
}

impl VolumeWriter for Volume {
    async fn write(&self, offset: u64, data: Bytes) -> std::io::Result<()> {
        let mut volume = self.0.lock().unwrap();
        volume[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        Ok(())
    }
}

/// A backup by node-1 of the `SIZE` volume `volume`, of a snapshot named
/// like the backup.
fn request<'a>(
    volume: &'a str,
    name: &'a str,
    previous: Option<&'a str>,
    changed: &'a [std::ops::Range<u64>],
) -> NewBackup<'a> {
    NewBackup {
        volume,
        name,
        snapshot: name,
        size: SIZE,
        previous,
        changed,
        owner: "node-1",
        labels: &NO_LABELS,
        compression: Compression::default(),
        progress: None,
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

struct Fixture {
    dir: tempfile::TempDir,
    objects: Arc<LocalFileSystem>,
    store: Backupstore,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let objects = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let store = Backupstore::new(objects.clone(), Path::from("cluster-a"));
    Fixture {
        dir,
        objects,
        store,
    }
}

impl Fixture {
    async fn backup(
        &self,
        volume: &Volume,
        name: &str,
        previous: Option<&str>,
        changed: &[std::ops::Range<u64>],
    ) -> BackupReport {
        let new = request("vol", name, previous, changed);
        self.store.create(&new, volume).await.unwrap()
    }

    async fn restored(&self, name: &str) -> Vec<u8> {
        let volume = Volume::new(SIZE);
        self.store.restore("vol", name, &volume).await.unwrap();
        volume.data()
    }

    /// Block files in the store.
    fn block_files(&self) -> usize {
        let blocks = self.dir.path().join("cluster-a/volumes/vol/blocks");
        walk(&blocks)
    }
}

fn walk(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| if p.is_dir() { walk(&p) } else { 1 })
        .sum()
}

/// A first backup stores only the blocks holding data, each once; a second
/// uploads only what changed; each restores to what the volume held at its
/// point; after the first is deleted the second still restores, and the
/// blocks only the first held are gone.
#[tokio::test]
async fn backups_are_incremental_deduplicated_and_restore_exactly() {
    let f = fixture();
    let volume = Volume::new(SIZE);
    volume.fill(0, 3 * MIB, 0xa1);
    // The same data in two other blocks: stored once.
    volume.fill(8 * MIB, 2 * MIB, 0xa1);
    volume.fill(10 * MIB, 2 * MIB, 0xa1);
    // The last, short block of the volume.
    volume.fill(SIZE - 4096, 4096, 0x7e);
    let first = f.backup(&volume, "b1", None, &[0..SIZE]).await;
    let at_first = volume.data();
    // Blocks 0 (a1), 1 (a1 then zeros), 4 and 5 (a1, as block 0) and 8.
    assert_eq!(first.blocks_read, 9);
    assert_eq!(first.config.blocks.len(), 5);
    assert_eq!(first.blocks_uploaded, 3);
    assert_eq!(f.block_files(), 3);

    volume.fill(2 * MIB, 4096, 0x01);
    volume.fill(8 * MIB, 2 * MIB, 0);
    let second = f
        .backup(
            &volume,
            "b2",
            Some("b1"),
            &[2 * MIB..2 * MIB + 4096, 8 * MIB..10 * MIB],
        )
        .await;
    let at_second = volume.data();
    assert_eq!(second.blocks_read, 2);
    assert_eq!(second.blocks_uploaded, 1, "only the changed block is new");
    assert_eq!(second.config.blocks.len(), 4, "the zeroed block is dropped");
    assert_eq!(f.block_files(), 4);

    assert!(
        f.restored("b1").await == at_first,
        "b1 restores what it saw"
    );
    assert!(
        f.restored("b2").await == at_second,
        "b2 restores what it saw"
    );

    let removed = f.store.delete("vol", "b1", "node-1").await.unwrap();
    assert_eq!(removed, 1, "only the block b1 alone held goes");
    assert!(
        f.restored("b2").await == at_second,
        "b2 restores without b1"
    );
    let names: Vec<String> = f
        .store
        .backups("vol")
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["b2"]);
    assert_eq!(f.store.volumes().await.unwrap(), ["vol"]);
}

/// The compression setting changes only how new blocks are stored: a
/// backup taken with zstd and an incremental one with LZ4 on top of it
/// both restore exactly, also once the first is deleted, and the second
/// reuses the first's blocks whatever their encoding.
#[tokio::test]
async fn backups_in_either_compression_restore_and_share_blocks() {
    let f = fixture();
    let volume = Volume::new(SIZE);
    volume.fill(0, 4 * MIB, 0x5a);
    let mut new = request("vol", "b1", None, &[0..SIZE]);
    new.compression = Compression::Zstd;
    let first = f.store.create(&new, &volume).await.unwrap();
    let at_first = volume.data();
    assert_eq!(first.config.compression, "zstd");
    assert_eq!(first.blocks_uploaded, 1, "two equal blocks, stored once");
    assert!(first.bytes_uploaded < 4096, "{}", first.bytes_uploaded);

    volume.fill(2 * MIB, 4096, 0x01);
    let changed = [2 * MIB..2 * MIB + 4096];
    let mut new = request("vol", "b2", Some("b1"), &changed);
    new.compression = Compression::Lz4;
    let second = f.store.create(&new, &volume).await.unwrap();
    let at_second = volume.data();
    assert_eq!(
        (second.config.compression.as_str(), second.blocks_uploaded),
        ("lz4", 1)
    );

    assert!(
        f.restored("b1").await == at_first,
        "the zstd backup restores"
    );
    f.store.delete("vol", "b1", "node-1").await.unwrap();
    assert!(
        f.restored("b2").await == at_second,
        "b2 keeps b1's zstd block"
    );
    assert_eq!(f.block_files(), 2);
}

/// A block changed in the store fails the restore, naming it; one missing
/// too.
#[tokio::test]
async fn a_corrupt_or_missing_block_fails_the_restore_naming_it() {
    let f = fixture();
    let volume = Volume::new(SIZE);
    volume.fill(4 * MIB, MIB, 0x33);
    let report = f.backup(&volume, "b1", None, &[0..SIZE]).await;
    let block = &report.config.blocks[0];
    let path = f.store_block_path(&block.checksum);
    let other = super::block::encode(&[0x34; 2 << 20], Compression::default());
    f.objects.put(&path, other.into()).await.unwrap();
    let error = f.restore_error("b1").await;
    assert!(
        matches!(&error, BackupError::BlockCorrupt { checksum, offset, .. }
            if *checksum == block.checksum && *offset == 4 * MIB),
        "{error}"
    );
    assert!(error.to_string().contains(&block.checksum), "{error}");

    f.objects.delete(&path).await.unwrap();
    let error = f.restore_error("b1").await;
    assert!(
        matches!(error, BackupError::BlockMissing { offset, .. } if offset == 4 * MIB),
        "{error}"
    );
}

impl Fixture {
    async fn restore_error(&self, name: &str) -> BackupError {
        let volume = Volume::new(SIZE);
        self.store.restore("vol", name, &volume).await.unwrap_err()
    }

    fn store_block_path(&self, checksum: &str) -> Path {
        Path::from(format!(
            "cluster-a/volumes/vol/blocks/{}/{checksum}.blk",
            &checksum[..2]
        ))
    }
}

/// While one backup or deletion of a volume holds its lock, another is
/// refused, naming the holder, and changes nothing; the lock's owner can
/// break it when its operation died.
#[tokio::test]
async fn one_operation_at_a_time_holds_a_volume() {
    let f = fixture();
    let volume = Volume::new(SIZE);
    volume.fill(0, MIB, 0x11);
    f.backup(&volume, "b1", None, &[0..SIZE]).await;
    // A backup that died holding the lock.
    let stale = r#"{"owner":"node-2","operation":"backup b2","acquired":"2026-11-24T00:00:00Z"}"#;
    let lock = Path::from("cluster-a/volumes/vol/lock");
    f.objects
        .put(&lock, Bytes::from(stale).into())
        .await
        .unwrap();

    let error = f.store.delete("vol", "b1", "node-1").await.unwrap_err();
    assert!(
        matches!(&error, BackupError::Busy { held, .. } if held.owner == "node-2"),
        "{error}"
    );
    assert!(error.to_string().contains("backup b2"), "{error}");
    assert_eq!(
        f.store.backups("vol").await.unwrap().len(),
        1,
        "nothing deleted"
    );

    assert!(
        !f.store.break_lock("vol", "node-1").await.unwrap(),
        "not node-1's to break"
    );
    assert!(f.store.break_lock("vol", "node-2").await.unwrap());
    assert_eq!(f.store.lock_holder("vol").await.unwrap(), None);
    f.store.delete("vol", "b1", "node-1").await.unwrap();
    assert_eq!(f.block_files(), 0);
}

/// Names become paths in the store: anything but an object name is refused
/// before the store is touched; a backup name is not reused.
#[tokio::test]
async fn bad_names_and_a_second_backup_of_a_name_are_refused() {
    let f = fixture();
    let volume = Volume::new(SIZE);
    for (vol, name) in [
        ("../x", "b1"),
        ("vol", "b/../../x"),
        ("Vol", "b1"),
        ("vol", ""),
    ] {
        let new = request(vol, name, None, &[]);
        let error = f.store.create(&new, &volume).await.unwrap_err();
        assert!(
            matches!(error, BackupError::InvalidName(_)),
            "{vol}/{name}: {error}"
        );
    }
    assert_eq!(walk(f.dir.path()), 0);
    f.backup(&volume, "b1", None, &[]).await;
    let new = request("vol", "b1", None, &[]);
    let error = f.store.create(&new, &volume).await.unwrap_err();
    assert!(matches!(error, BackupError::AlreadyExists(..)), "{error}");
    assert_eq!(
        f.store.lock_holder("vol").await.unwrap(),
        None,
        "the lock is released"
    );
}

/// A volume whose reads wait until the test lets them go.
struct Gated {
    volume: Volume,
    open: tokio::sync::Semaphore,
}

impl VolumeReader for Gated {
    async fn read(&self, offset: u64, len: u64) -> std::io::Result<Bytes> {
        let _pass = self.open.acquire().await.unwrap();
        self.volume.read(offset, len).await
    }
}

/// A deletion while a backup of the volume is being written is refused
/// and removes nothing: the backup counts on a block only the deleted
/// backup held. Once the backup is done, the deletion goes through and
/// the new backup still restores.
#[tokio::test]
async fn a_deletion_racing_a_backup_never_removes_a_block_it_needs() {
    let f = fixture();
    let volume = Volume::new(SIZE);
    volume.fill(0, 2 * MIB, 0x42);
    f.backup(&volume, "b1", None, &[0..SIZE]).await;
    let gated = Gated {
        volume,
        open: tokio::sync::Semaphore::new(0),
    };
    gated.volume.fill(2 * MIB, MIB, 0x43);
    let changed = [2 * MIB..3 * MIB];
    let new = request("vol", "b2", Some("b1"), &changed);
    let backup = f.store.create(&new, &gated);
    let race = async {
        // The backup holds the lock once it is under way.
        while f.store.lock_holder("vol").await.unwrap().is_none() {
            tokio::task::yield_now().await;
        }
        let refused = f.store.delete("vol", "b1", "node-2").await;
        gated.open.add_permits(1);
        refused
    };
    let (report, refused) = tokio::join!(backup, race);
    let report = report.unwrap();
    assert!(
        matches!(&refused, Err(BackupError::Busy { held, .. }) if held.operation == "backup b2"),
        "{refused:?}"
    );
    assert_eq!(report.config.blocks.len(), 2);
    let expected = gated.volume.data();
    f.store.delete("vol", "b1", "node-2").await.unwrap();
    assert!(f.restored("b2").await == expected);
}

#[tokio::test]
async fn a_system_backup_exists_once_its_meta_is_written_and_reads_back() {
    let f = fixture();
    assert!(f.store.system_backups().await.unwrap().is_empty());
    // Objects without their meta: an upload cut short, not a system backup.
    let orphan = Path::from("cluster-a/system-backups/cut/objects.json");
    f.objects
        .put(&orphan, Bytes::from("{}").into())
        .await
        .unwrap();
    let meta = SystemBackupMeta {
        name: "sb1".into(),
        format_version: 1,
        oxhorn_version: "0.1.0".into(),
        created: "2026-01-01T00:00:00Z".into(),
    };
    let objects = Bytes::from(r#"{"volumes":[]}"#);
    f.store
        .put_system_backup(&meta, objects.clone())
        .await
        .unwrap();
    assert_eq!(f.store.system_backups().await.unwrap(), ["sb1"]);
    assert_eq!(f.store.system_backup("sb1").await.unwrap(), meta);
    assert_eq!(f.store.system_backup_objects("sb1").await.unwrap(), objects);
    assert!(matches!(
        f.store.system_backup("cut").await,
        Err(BackupError::NotFound(..))
    ));
    assert!(matches!(
        f.store.system_backup("../x").await,
        Err(BackupError::InvalidName(_))
    ));

    // Deleted, it is gone whole; deleting it again, or one never stored,
    // is no error.
    f.store.delete_system_backup("sb1").await.unwrap();
    assert!(f.store.system_backups().await.unwrap().is_empty());
    assert!(matches!(
        f.store.system_backup_objects("sb1").await,
        Err(BackupError::Store(_))
    ));
    f.store.delete_system_backup("sb1").await.unwrap();
    f.store.delete_system_backup("cut").await.unwrap();
}
