//! Backups to an NFS export (issue 16), over a real NFS server on loopback
//! (NFS-Ganesha, NFSv3) and the client in oxhorn: no kernel mount. What a
//! user would notice: an `nfs://` target syncs, a backup through it holds
//! the volume's data and a second uploads only what changed, deleting one
//! leaves the other whole, the volume's lock is taken by one writer at a
//! time, and a server that goes away makes the target Unreachable until it
//! is back.
//!
//! The store over NFS: incremental backups restored byte for byte, a
//! deletion leaving exactly the blocks still needed, two racing creates of
//! one object (one wins, whole), a reconnect after the server restarts, and
//! puts cut short leaving the store usable. A target through the
//! controllers: backed up, restored, and `Unreachable` while the server is
//! down.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use kube::api::{DeleteParams, PostParams};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use oxhorn::backup::nfs::NfsStore;
use oxhorn::backup::target::{TargetUrl, open};
use oxhorn::backup::{
    BackupError, Backupstore, Compression, NewBackup, VolumeReader, VolumeWriter,
};
use oxhorn::types::*;
use oxhorn_testbed::NfsServer;
use serde_json::json;

use crate::backup::{create_target, request_sync, until_target};
use crate::common::*;

const SIZE: u64 = 64 << 20;

/// An NFS server exporting a fresh directory; stopped when dropped.
struct Export {
    server: NfsServer,
    dir: tempfile::TempDir,
}

impl Export {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = NfsServer::start(dir.path()).unwrap();
        Self { server, dir }
    }

    /// Directory `sub` of the export as an object store of its own.
    fn store(&self, sub: &str) -> NfsStore {
        match TargetUrl::parse(&self.server.url(sub)).unwrap() {
            TargetUrl::Nfs(server) => NfsStore::new(server),
            other => panic!("not NFS: {other:?}"),
        }
    }

    /// Files whose names an upload gives its temporary files, left anywhere
    /// in the export (read from the server's disk, never written there).
    fn temporary_files(&self) -> Vec<String> {
        let mut left = Vec::new();
        let mut pending = vec![self.dir.path().to_owned()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.to_string_lossy().contains('#') {
                    left.push(path.display().to_string());
                }
            }
        }
        left
    }
}

/// A volume in memory: read for a backup, written by a restore.
struct Image(Mutex<Vec<u8>>);

impl Image {
    fn new(data: Vec<u8>) -> Self {
        Self(Mutex::new(data))
    }

    fn data(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }

    /// Fills `range` with a seeded pattern.
    fn fill(&self, range: Range<usize>, seed: u64) {
        let mut state = seed;
        for byte in &mut self.0.lock().unwrap()[range] {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            *byte = (state >> 56) as u8;
        }
    }
}

impl VolumeReader for Image {
    async fn read(&self, offset: u64, len: u64) -> std::io::Result<Bytes> {
        let at = usize::try_from(offset).unwrap();
        let len = usize::try_from(len).unwrap();
        Ok(Bytes::copy_from_slice(
            &self.0.lock().unwrap()[at..at + len],
        ))
    }
}

impl VolumeWriter for Image {
    async fn write(&self, offset: u64, data: Bytes) -> std::io::Result<()> {
        let at = usize::try_from(offset).unwrap();
        self.0.lock().unwrap()[at..at + data.len()].copy_from_slice(&data);
        Ok(())
    }
}

async fn restored(store: &Backupstore, volume: &str, backup: &str) -> Vec<u8> {
    let image = Image::new(vec![0; SIZE as usize]);
    store.restore(volume, backup, &image).await.unwrap();
    image.data()
}

fn new_backup<'a>(
    name: &'a str,
    previous: Option<&'a str>,
    changed: &'a [Range<u64>],
    labels: &'a BTreeMap<String, String>,
) -> NewBackup<'a> {
    NewBackup {
        volume: "vol",
        name,
        snapshot: name,
        size: SIZE,
        previous,
        changed,
        owner: "test",
        labels,
        compression: Compression::Lz4,
        progress: None,
    }
}

/// The backup store over NFS: a backup, an incremental one uploading only
/// the blocks changed, both restored byte for byte; the first deleted, the
/// second still restores and the blocks only the first held are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nfs_backupstore_is_incremental_restorable_and_deleted_whole() {
    let export = Export::start();
    let store = open(&export.server.url("cluster-a"), "", &BTreeMap::new()).unwrap();
    assert!(store.volumes().await.unwrap().is_empty(), "a fresh export");
    let labels = BTreeMap::new();

    let image = Image::new(vec![0; SIZE as usize]);
    image.fill(0..16 << 20, 1);
    let at_first = image.data();
    // The first 16 MiB, 8 blocks.
    let data: Range<u64> = 0..16 << 20;
    let written = std::slice::from_ref(&data);
    let first = store
        .create(&new_backup("first", None, written, &labels), &image)
        .await
        .unwrap();
    assert_eq!((first.blocks_read, first.blocks_uploaded), (8, 8));

    // One block rewritten, one written anew: two uploaded.
    image.fill(0..2 << 20, 2);
    image.fill(32 << 20..34 << 20, 3);
    let at_second = image.data();
    let changed = [0..2 << 20, 32 << 20..34 << 20];
    let second = store
        .create(
            &new_backup("second", Some("first"), &changed, &labels),
            &image,
        )
        .await
        .unwrap();
    assert_eq!((second.blocks_read, second.blocks_uploaded), (2, 2));
    assert_eq!(second.config.blocks.len(), 9);

    assert!(restored(&store, "vol", "first").await == at_first, "first");
    assert!(
        restored(&store, "vol", "second").await == at_second,
        "second"
    );
    assert_eq!(store.volumes().await.unwrap(), ["vol"]);
    assert_eq!(store.backups("vol").await.unwrap().len(), 2);

    let removed = store.delete("vol", "first", "test").await.unwrap();
    assert_eq!(removed, 1, "the block only the first backup held");
    assert!(
        restored(&store, "vol", "second").await == at_second,
        "second"
    );
    let needed: std::collections::HashSet<String> = second
        .config
        .blocks
        .iter()
        .map(|b| b.checksum.clone())
        .collect();
    assert_eq!(store.stored_blocks("vol").await.unwrap(), needed);
    assert_eq!(store.lock_holder("vol").await.unwrap(), None);
    let left = export.temporary_files();
    assert!(left.is_empty(), "uploads' temporary files left: {left:?}");
}

/// The volume's lock: two writers creating the same object at once, each
/// with a store (connections) of its own, as two managers would: exactly
/// one wins, the other is told it exists, and the object is the winner's,
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_nfs_creates_of_one_object_exactly_one_wins() {
    let export = Export::start();
    let (one, two) = (export.store("locks"), export.store("locks"));
    let create = PutOptions::from(PutMode::Create);
    for round in 0..8u8 {
        let path = Path::from(format!("volumes/v{round}/lock"));
        // Several WRITEs each, so that the two overlap.
        let ours = vec![round; 3 << 20];
        let theirs = vec![round.wrapping_add(100); 3 << 20];
        let (a, b) = tokio::join!(
            one.put_opts(&path, ours.clone().into(), create.clone()),
            two.put_opts(&path, theirs.clone().into(), create.clone()),
        );
        let winner = match (&a, &b) {
            (Ok(_), Err(object_store::Error::AlreadyExists { .. })) => ours,
            (Err(object_store::Error::AlreadyExists { .. }), Ok(_)) => theirs,
            _ => panic!("round {round}: {a:?} and {b:?}"),
        };
        let stored = one.get(&path).await.unwrap().bytes().await.unwrap();
        assert!(
            stored == winner,
            "round {round}: the lock is not the winner's"
        );
        let again = two.put_opts(&path, Bytes::from_static(b"x").into(), create.clone());
        assert!(matches!(
            again.await,
            Err(object_store::Error::AlreadyExists { .. })
        ));
        one.delete(&path).await.unwrap();
    }
    let left = export.temporary_files();
    assert!(left.is_empty(), "uploads' temporary files left: {left:?}");
}

/// Objects over NFS behave as files on a local filesystem do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_on_an_nfs_export_behave_as_files() {
    let export = Export::start();
    let store = export.store("objects/deep");
    let path = Path::from("a/b/c.json");
    assert!(matches!(
        store.get(&path).await,
        Err(object_store::Error::NotFound { .. })
    ));
    let all: Vec<_> = store.list(None).try_collect().await.unwrap();
    assert!(all.is_empty(), "{all:?}");

    // Larger than a transfer: several WRITEs and READs.
    let data: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i % 251) as u8).collect();
    store.put(&path, data.clone().into()).await.unwrap();
    let got = store.get(&path).await.unwrap();
    assert_eq!(got.meta.size, data.len() as u64);
    assert!(got.bytes().await.unwrap() == data);
    let range = store.get_range(&path, 1_000_000..2_500_000).await.unwrap();
    assert!(range == data[1_000_000..2_500_000]);
    let head = store.head(&path).await.unwrap();
    assert_eq!(head.size, data.len() as u64);

    // Overwritten whole; an empty object.
    store
        .put(&path, Bytes::from_static(b"{}").into())
        .await
        .unwrap();
    assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap(), "{}");
    store
        .put(&Path::from("a/empty"), Bytes::new().into())
        .await
        .unwrap();
    assert_eq!(store.head(&Path::from("a/empty")).await.unwrap().size, 0);

    let listed: Vec<_> = store
        .list(Some(&Path::from("a")))
        .try_collect()
        .await
        .unwrap();
    let mut listed: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
    listed.sort();
    assert_eq!(listed, ["a/b/c.json", "a/empty"]);
    let one_level = store
        .list_with_delimiter(Some(&Path::from("a")))
        .await
        .unwrap();
    assert_eq!(one_level.common_prefixes, [Path::from("a/b")]);
    assert_eq!(one_level.objects.len(), 1);
    assert_eq!(one_level.objects[0].location, Path::from("a/empty"));

    store.delete(&path).await.unwrap();
    assert!(matches!(
        store.delete(&path).await,
        Err(object_store::Error::NotFound { .. })
    ));
    assert!(matches!(
        store.head(&path).await,
        Err(object_store::Error::NotFound { .. })
    ));
}

/// A store whose server restarts: a call while it is down fails at once
/// (its connections closed under it), and the same store works again once
/// it is back, on new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nfs_store_reconnects_after_its_server_restarts() {
    let mut export = Export::start();
    let store = export.store("restarts");
    let path = Path::from("volumes/v/volume.json");
    store
        .put(&path, Bytes::from_static(b"{}").into())
        .await
        .unwrap();

    export.server.stop().unwrap();
    let down = tokio::time::timeout(Duration::from_secs(10), store.get(&path))
        .await
        .expect("a call to a stopped server hangs");
    match down {
        Err(object_store::Error::Generic { source, .. }) => {
            let said = source.to_string();
            assert!(!said.contains("status code"), "{said}");
        }
        other => panic!("not a transport error: {other:?}"),
    }

    export.server.resume().unwrap();
    let got = store.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(got, "{}");
}

/// Puts cut short in mid-write (their callers gone, as when a backup's
/// other blocks fail or its time runs out) leave no connection out of
/// step: every call after them answers at once, and right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_cut_short_leave_the_store_usable() {
    let export = Export::start();
    let store = export.store("cut");
    let big = Bytes::from(vec![0x5a; 8 << 20]);
    let path = Path::from("volumes/v/blocks/5a/big.blk");
    let mut cut = 0;
    for wait in 1..=12 {
        let put = store.put(&path, big.clone().into());
        match tokio::time::timeout(Duration::from_millis(wait), put).await {
            Err(_) => cut += 1,
            Ok(put) => {
                put.unwrap();
            }
        }
    }
    assert!(cut > 0, "no put was cut short");
    for i in 0..12 {
        let small = Path::from(format!("volumes/v/small-{i}"));
        let body = Bytes::from(format!("small {i}"));
        let put = store.put(&small, body.clone().into());
        let put = tokio::time::timeout(Duration::from_secs(10), put).await;
        put.expect("a put after cut ones hangs").unwrap();
        let got = store.get(&small).await.unwrap().bytes().await.unwrap();
        assert_eq!(got, body);
    }
}

/// The whole path: an `nfs://` target syncs, a Backup of a volume
/// completes through it, and a volume restored from it reads back what was
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_backed_up_to_an_nfs_target_is_restored() {
    let export = Export::start();
    let cluster = Cluster::start("bknfs", 1).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let url = export.server.url("cluster");
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "", "300s").await;
    let synced = until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    assert!(synced.available, "{synced:?}");

    let size = 16 * MIB;
    cluster.create_volume("vol", size, 1).await;
    let device = cluster.attach("vol", &node).await;
    let mut expected = vec![0; usize::try_from(size).unwrap()];
    expected[..6 << 20].copy_from_slice(&write_pattern(&device, 6 << 20, 31));
    let backup = Backup::new(
        "nightly",
        serde_json::from_value(json!({"volumeName": "vol"})).unwrap(),
    );
    cluster
        .api::<Backup>()
        .create(&PostParams::default(), &backup)
        .await
        .unwrap();
    let done = cluster
        .until("backup nightly completed", || async {
            let backup = cluster.api::<Backup>().get_opt("nightly").await.unwrap()?;
            backup.status.filter(|s| s.state == BackupState::Completed)
        })
        .await;
    assert_eq!((done.blocks, done.blocks_uploaded), (3, 3), "{done:?}");

    let spec = json!({"size": size, "numberOfReplicas": 1, "fromBackup": "nightly"});
    cluster.create_volume_with("restored", spec).await;
    let copy = cluster.attach("restored", &node).await;
    assert!(
        read_device(&copy, expected.len()) == expected,
        "the restored volume differs"
    );
    cluster.detach("restored").await;
    cluster.delete_volume("restored").await;
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
    cluster
        .api::<Backup>()
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    // Its config goes first, then its blocks, then the volume's lock.
    let store = open(&url, "", &BTreeMap::new()).unwrap();
    cluster
        .until(
            "backup nightly and its blocks deleted from the store",
            || async {
                let read = async {
                    let gone = matches!(
                        store.backup("vol", "nightly").await,
                        Err(BackupError::NotFound(..))
                    );
                    let blocks = store.stored_blocks("vol").await?;
                    let lock = store.lock_holder("vol").await?;
                    Ok::<_, BackupError>(gone && blocks.is_empty() && lock.is_none())
                };
                read.await.unwrap().then_some(())
            },
        )
        .await;
}

/// An outage: the NFS server stops, the target says Unreachable; it starts
/// again on the same ports and export, and the target is Synced again by
/// itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nfs_target_is_unreachable_while_its_server_is_down() {
    let mut export = Export::start();
    let cluster = Cluster::start("bknfsdown", 1).await;
    create_target(&cluster, "nas", &export.server.url("cluster"), "", "300s").await;
    until_target(&cluster, "nas", "Synced").await;

    export.server.stop().unwrap();
    request_sync(&cluster, "nas").await;
    let down = until_target(&cluster, "nas", "Unreachable").await;
    assert!(!down.available, "{down:?}");
    let message = &down.conditions[0].message;
    assert!(
        message.contains("cannot connect to NFS server 127.0.0.1"),
        "{message}"
    );

    export.server.resume().unwrap();
    let up = until_target(&cluster, "nas", "Synced").await;
    assert!(up.available, "{up:?}");
}
