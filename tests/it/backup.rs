//! Backups to real object stores on loopback (MinIO for S3, Azurite for
//! Azure Blob, a directory), on a real API
//! server with `oxhorn manager` nodes. What a user would notice: a target
//! says whether its store answers, and why not; a backup holds the
//! volume's data at its snapshot, a second one uploads only what changed,
//! and deleting one leaves every other whole; the store's contents show up
//! as BackupVolumes and Backups, on the poll timer or at once when asked.
//!
//! MinIO and Azurite run on loopback, and each test runs against both:
//! - a volume backed up twice (the second uploads only the two changed
//!   blocks), the store's volume synced into a BackupVolume, the volume
//!   deleted and each backup restored into a new volume and compared byte
//!   for byte, the second also after the first is deleted, and no block left
//!   once both are;
//! - two of three backups sharing blocks deleted at once: the third whole,
//!   the store holding exactly its blocks;
//! - targets with a wrong key, a missing bucket, a missing Secret and an
//!   outage (the server stopped, then started) say so in their conditions and
//!   recover, with no secret in a status, an event or a manager's log;
//! - a restore from a backup with a corrupt block fails, naming it, and the
//!   volume never attaches (on a file target too).
//!
//! MinIO over TLS: a target with the CA in `AWS_CERT` backs up and restores,
//! one without says `CertificateUntrusted`. On a file target: the poll timer
//! (every 2 s) and a forced sync; 1,000 backups of four volumes in a store
//! synced into completed Backups; the settings making, correcting and
//! forgetting the `default` target; a deleted target's resources removed by
//! Kubernetes' garbage collector, its store untouched.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use oxhorn::backup::{Backupstore, VolumeWriter};
use oxhorn::types::*;
use oxhorn_testbed::{
    AZURITE_ACCOUNT, AZURITE_ACCOUNT_KEY, MINIO_ACCESS_KEY, MINIO_SECRET_KEY, ObjectServer,
    ObjectServerKind,
};
use serde_json::json;

use crate::common::*;

const SIZE: i64 = 64 * MIB;
pub(crate) const BUCKET: &str = "backups";

/// A server on loopback and how a user points a target at it.
pub(crate) struct Store {
    server: ObjectServer,
    _dir: tempfile::TempDir,
}

impl Store {
    pub(crate) fn start(kind: ObjectServerKind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = ObjectServer::start(kind, dir.path(), &[BUCKET]).unwrap();
        Self { server, _dir: dir }
    }

    /// A target URL of `bucket` (a container, on Azure).
    pub(crate) fn url(&self, bucket: &str) -> String {
        match self.server.kind {
            ObjectServerKind::Minio => format!("s3://{bucket}@us-east-1/cluster"),
            ObjectServerKind::Azurite => format!("azblob://{bucket}@{AZURITE_ACCOUNT}/cluster"),
        }
    }

    /// A credential Secret's data, with the right secret or a wrong one;
    /// for a server serving HTTPS, its CA bundle too.
    fn credentials(&self, right: bool) -> BTreeMap<String, String> {
        let mut data = self.keys(right);
        if let Some(ca) = self.server.ca_pem() {
            data.insert("AWS_CERT".into(), ca.into());
        }
        data
    }

    fn keys(&self, right: bool) -> BTreeMap<String, String> {
        let pairs = match self.server.kind {
            ObjectServerKind::Minio => [
                ("AWS_ACCESS_KEY_ID", MINIO_ACCESS_KEY),
                (
                    "AWS_SECRET_ACCESS_KEY",
                    if right { MINIO_SECRET_KEY } else { WRONG },
                ),
                ("AWS_ENDPOINTS", &self.server.endpoint()),
            ],
            ObjectServerKind::Azurite => [
                (
                    "AZBLOB_ACCOUNT_KEY",
                    if right {
                        AZURITE_ACCOUNT_KEY
                    } else {
                        WRONG_KEY
                    },
                ),
                ("AZBLOB_ENDPOINT", &self.server.endpoint()),
                ("AZBLOB_SAS", ""),
            ],
        };
        pairs
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Stops the server: requests fail until [`resume`](Self::resume).
    pub(crate) fn stop(&mut self) {
        self.server.stop().unwrap();
    }

    /// Starts the stopped server again, on the same port and data.
    pub(crate) fn resume(&mut self) {
        self.server.resume().unwrap();
    }

    /// Leaves every request hanging, unanswered, until [`thaw`](Self::thaw).
    pub(crate) fn freeze(&self) {
        self.server.freeze().unwrap();
    }

    pub(crate) fn thaw(&self) {
        self.server.thaw().unwrap();
    }

    /// The bucket's objects, as a client of the server reads them.
    fn objects(&self) -> Arc<dyn ObjectStore> {
        // reqwest has no crypto provider of its own (see backup::target).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let endpoint = self.server.endpoint();
        match self.server.kind {
            ObjectServerKind::Minio => Arc::new(
                AmazonS3Builder::new()
                    .with_bucket_name(BUCKET)
                    .with_region("us-east-1")
                    .with_access_key_id(MINIO_ACCESS_KEY)
                    .with_secret_access_key(MINIO_SECRET_KEY)
                    .with_endpoint(endpoint)
                    .with_allow_http(true)
                    .build()
                    .unwrap(),
            ),
            ObjectServerKind::Azurite => Arc::new(
                MicrosoftAzureBuilder::new()
                    .with_account(AZURITE_ACCOUNT)
                    .with_access_key(AZURITE_ACCOUNT_KEY)
                    .with_container_name(BUCKET)
                    .with_endpoint(endpoint)
                    .with_allow_http(true)
                    .build()
                    .unwrap(),
            ),
        }
    }

    /// The store as the test reads it directly.
    pub(crate) fn backupstore(&self) -> Backupstore {
        oxhorn::backup::target::open(&self.url(BUCKET), "s", &self.credentials(true)).unwrap()
    }
}

/// A wrong secret key, and a wrong Azure account key (of a key's shape).
const WRONG: &str = "not-the-secret";
const WRONG_KEY: &str = "bm90LXRoZS1hY2NvdW50LWtleS1ub3QtdGhlLWFjY291bnQta2V5LW5vdC10aGUta2V5IQ==";

/// A Secret holding `store`'s credentials, as a user writes one.
pub(crate) async fn credential_secret(cluster: &Cluster, name: &str, store: &Store, right: bool) {
    secret(cluster, name, store.credentials(right)).await;
}

pub(crate) async fn secret(cluster: &Cluster, name: &str, data: BTreeMap<String, String>) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some(data.into_iter().collect()),
        ..Default::default()
    };
    cluster
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

pub(crate) async fn create_target(
    cluster: &Cluster,
    name: &str,
    url: &str,
    secret: &str,
    poll: &str,
) {
    let target = BackupTarget::new(
        name,
        serde_json::from_value(json!({
            "backupTargetURL": url, "credentialSecret": secret, "pollInterval": poll
        }))
        .unwrap(),
    );
    cluster
        .api::<BackupTarget>()
        .create(&PostParams::default(), &target)
        .await
        .unwrap();
}

/// Makes `store`'s bucket the cluster's default target, with a Secret of
/// its credentials, and waits until the target has synced.
pub(crate) async fn store_as_default_target(cluster: &Cluster, store: &Store) {
    credential_secret(cluster, "creds", store, true).await;
    create_target(
        cluster,
        DEFAULT_BACKUP_TARGET,
        &store.url(BUCKET),
        "creds",
        "300s",
    )
    .await;
    until_target(cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
}

/// Waits until target `name`'s Available condition has `reason`.
pub(crate) async fn until_target(
    cluster: &Cluster,
    name: &str,
    reason: &str,
) -> BackupTargetStatus {
    cluster
        .until(&format!("target {name} {reason}"), || async {
            let target = cluster.api::<BackupTarget>().get_opt(name).await.unwrap()?;
            let status = target.status?;
            let available = status.conditions.iter().find(|c| c.type_ == "Available")?;
            (available.reason == reason).then_some(status)
        })
        .await
}

pub(crate) async fn create_backup(cluster: &Cluster, name: &str, volume: &str) {
    let backup = Backup::new(
        name,
        serde_json::from_value(json!({"volumeName": volume})).unwrap(),
    );
    cluster
        .api::<Backup>()
        .create(&PostParams::default(), &backup)
        .await
        .unwrap();
}

pub(crate) async fn until_backup_completed(cluster: &Cluster, name: &str) -> BackupStatus {
    cluster
        .until(&format!("backup {name} completed"), || async {
            let backup = cluster.api::<Backup>().get_opt(name).await.unwrap()?;
            backup.status.filter(|s| s.state == BackupState::Completed)
        })
        .await
}

pub(crate) async fn delete_backup(cluster: &Cluster, name: &str) {
    cluster
        .api::<Backup>()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .until(&format!("backup {name} gone"), || async {
            let gone = cluster
                .api::<Backup>()
                .get_opt(name)
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
}

/// A volume in memory, for restoring a backup straight from the store.
struct Image(Mutex<Vec<u8>>);

impl VolumeWriter for Image {
    async fn write(&self, offset: u64, data: Bytes) -> std::io::Result<()> {
        let mut image = self.0.lock().unwrap();
        let at = usize::try_from(offset).unwrap();
        image[at..at + data.len()].copy_from_slice(&data);
        Ok(())
    }
}

async fn restored(store: &Backupstore, volume: &str, backup: &str) -> Vec<u8> {
    let image = Image(Mutex::new(vec![0; usize::try_from(SIZE).unwrap()]));
    store.restore(volume, backup, &image).await.unwrap();
    image.0.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_backups_are_incremental_restorable_and_deleted_whole() {
    backups_are_incremental_restorable_and_deleted_whole(ObjectServerKind::Minio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_backups_are_incremental_restorable_and_deleted_whole() {
    backups_are_incremental_restorable_and_deleted_whole(ObjectServerKind::Azurite).await;
}

async fn backups_are_incremental_restorable_and_deleted_whole(kind: ObjectServerKind) {
    let store = Store::start(kind);
    let cluster = Cluster::start("bkup", 2).await;
    let node = cluster.nodes[0].node_id().to_owned();
    credential_secret(&cluster, "creds", &store, true).await;
    let url = store.url(BUCKET);
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "creds", "300s").await;
    until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;

    cluster.create_volume("vol", SIZE, 2).await;
    let device = cluster.attach("vol", &node).await;
    // 16 MiB at the start: 8 blocks of 2 MiB.
    let mut at_first = vec![0; usize::try_from(SIZE).unwrap()];
    at_first[..16 << 20].copy_from_slice(&write_pattern(&device, 16 << 20, 1));

    create_backup(&cluster, "first", "vol").await;
    let first = until_backup_completed(&cluster, "first").await;
    assert_eq!((first.blocks, first.blocks_uploaded), (8, 8), "{first:?}");
    assert_eq!(first.snapshot_name, "first");
    assert_eq!(first.size, SIZE);

    // One block rewritten, one written anew: the second backup sends two.
    let mut at_second = at_first.clone();
    at_second[..2 << 20].copy_from_slice(&write_pattern(&device, 2 << 20, 2));
    at_second[32 << 20..34 << 20].copy_from_slice(&write_pattern_at(&device, 32, 2 << 20, 3));
    create_backup(&cluster, "second", "vol").await;
    let second = until_backup_completed(&cluster, "second").await;
    assert_eq!(
        (second.blocks, second.blocks_uploaded),
        (9, 2),
        "{second:?}"
    );
    // The managers tell Prometheus: what was sent, the two backups, the
    // target's availability and the last backup's time.
    let scraped = cluster.scrape();
    let target = r#"backup_target="default""#;
    let sent = sample_sum(&scraped, "oxhorn_backup_uploaded_bytes_total", &[target]);
    assert!(sent.is_some_and(|bytes| bytes > 0.0), "{scraped}");
    let completed = [r#"volume="vol""#, r#"state="completed""#];
    assert_eq!(
        sample_sum(&scraped, "oxhorn_backups", &completed),
        Some(2.0)
    );
    let durations = "oxhorn_backup_duration_seconds_count";
    assert_eq!(sample_sum(&scraped, durations, &[target]), Some(2.0));
    let available = sample_sum(&scraped, "oxhorn_backup_target_available", &[target]);
    assert_eq!(available, Some(1.0), "{scraped}");
    let last = "oxhorn_volume_last_backup_timestamp_seconds";
    assert!(sample_sum(&scraped, last, &[r#"volume="vol""#]).is_some());

    let objects = store.backupstore();
    assert!(
        restored(&objects, "vol", "first").await == at_first,
        "first backup's data"
    );
    assert!(
        restored(&objects, "vol", "second").await == at_second,
        "second backup's data"
    );

    // The store's volume shows up as a BackupVolume once the target syncs.
    request_sync(&cluster, DEFAULT_BACKUP_TARGET).await;
    let volume = cluster
        .until("the BackupVolume synced", || async {
            let all = cluster
                .api::<BackupVolume>()
                .list(&Default::default())
                .await
                .unwrap();
            all.items.into_iter().find(|bv| {
                bv.spec.volume_name == "vol"
                    && bv
                        .status
                        .as_ref()
                        .is_some_and(|s| s.last_backup_name == "second")
            })
        })
        .await;
    assert_eq!(volume.status.unwrap().size, SIZE);

    // The volume goes; each backup restores into a new one, the second
    // also once the first is gone.
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
    restore_and_compare(&cluster, "from-first", "first", &node, &at_first).await;
    delete_backup(&cluster, "first").await;
    restore_and_compare(&cluster, "from-second", "second", &node, &at_second).await;
    delete_backup(&cluster, "second").await;
    assert!(objects.backups("vol").await.unwrap().is_empty());
    let left = objects.stored_blocks("vol").await.unwrap();
    assert!(left.is_empty(), "blocks left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_backups_deleted_together_leave_the_store_consistent() {
    backups_deleted_together_leave_the_store_consistent(ObjectServerKind::Minio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_backups_deleted_together_leave_the_store_consistent() {
    backups_deleted_together_leave_the_store_consistent(ObjectServerKind::Azurite).await;
}

/// Three backups sharing blocks; two deleted at once, racing for the
/// volume's lock in the store: the third keeps every block it needs, and
/// no block is left that none needs.
async fn backups_deleted_together_leave_the_store_consistent(kind: ObjectServerKind) {
    let store = Store::start(kind);
    let cluster = Cluster::start("bkrace", 1).await;
    let node = cluster.nodes[0].node_id().to_owned();
    credential_secret(&cluster, "creds", &store, true).await;
    create_target(
        &cluster,
        DEFAULT_BACKUP_TARGET,
        &store.url(BUCKET),
        "creds",
        "300s",
    )
    .await;
    cluster.create_volume("vol", SIZE, 1).await;
    let device = cluster.attach("vol", &node).await;
    let mut expected = vec![0; usize::try_from(SIZE).unwrap()];
    expected[..8 << 20].copy_from_slice(&write_pattern(&device, 8 << 20, 11));
    create_backup(&cluster, "one", "vol").await;
    until_backup_completed(&cluster, "one").await;
    for (name, offset_mib, seed) in [("two", 16, 12), ("three", 24, 13)] {
        let at = offset_mib << 20;
        let written = write_pattern_at(&device, offset_mib, 2 << 20, seed);
        expected[at..at + (2 << 20)].copy_from_slice(&written);
        create_backup(&cluster, name, "vol").await;
        until_backup_completed(&cluster, name).await;
    }
    let objects = store.backupstore();
    let three = objects.backup("vol", "three").await.unwrap();

    let api = cluster.api::<Backup>();
    for name in ["one", "two"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in ["one", "two"] {
        cluster
            .until(&format!("backup {name} gone"), || async {
                api.get_opt(name).await.unwrap().is_none().then_some(())
            })
            .await;
    }
    assert!(
        restored(&objects, "vol", "three").await == expected,
        "three holds what was written before it"
    );
    let needed: std::collections::BTreeSet<String> =
        three.blocks.iter().map(|b| b.checksum.clone()).collect();
    let stored: std::collections::BTreeSet<String> = objects
        .stored_blocks("vol")
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(
        stored, needed,
        "the store holds exactly the blocks of the backup left"
    );
    assert_eq!(
        objects.lock_holder("vol").await.unwrap(),
        None,
        "a lock left behind"
    );
    delete_backup(&cluster, "three").await;
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}

/// Creates volume `name` from `backup`, checks that it holds `expected`
/// once attached, and deletes it.
async fn restore_and_compare(
    cluster: &Cluster,
    name: &str,
    backup: &str,
    node: &str,
    expected: &[u8],
) {
    let spec = json!({"size": SIZE, "numberOfReplicas": 2, "fromBackup": backup});
    cluster.create_volume_with(name, spec).await;
    let device = cluster.attach(name, node).await;
    assert!(
        read_device(&device, expected.len()) == expected,
        "volume {name} restored from {backup} differs"
    );
    cluster.detach(name).await;
    cluster.delete_volume(name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_a_damaged_s3_backup_names_the_block_and_never_attaches() {
    let store = Store::start(ObjectServerKind::Minio);
    a_restore_from_a_damaged_backup_names_the_block_and_never_attaches(Some(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_a_damaged_azure_backup_names_the_block_and_never_attaches() {
    let store = Store::start(ObjectServerKind::Azurite);
    a_restore_from_a_damaged_backup_names_the_block_and_never_attaches(Some(&store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_a_damaged_file_backup_names_the_block_and_never_attaches() {
    a_restore_from_a_damaged_backup_names_the_block_and_never_attaches(None).await;
}

/// A backup in `store` (a directory without one) whose block is changed
/// in the store behind its back.
async fn a_restore_from_a_damaged_backup_names_the_block_and_never_attaches(store: Option<&Store>) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start("bkbad", 1).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let (url, secret, objects, root) = match store {
        Some(store) => {
            credential_secret(&cluster, "creds", store, true).await;
            (store.url(BUCKET), "creds", store.objects(), "cluster")
        }
        None => {
            let local = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
            let url = format!("file://{}", dir.path().display());
            (url, "", Arc::new(local) as Arc<dyn ObjectStore>, "")
        }
    };
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, secret, "300s").await;
    until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    cluster.create_volume("vol", 16 * MIB, 1).await;
    let device = cluster.attach("vol", &node).await;
    write_pattern(&device, 4 << 20, 7);
    create_backup(&cluster, "only", "vol").await;
    assert_eq!(until_backup_completed(&cluster, "only").await.blocks, 2);

    // One of its two blocks, its last byte flipped.
    let blocks = ObjectPath::from(root)
        .join("volumes")
        .join("vol")
        .join("blocks");
    let listed: Vec<_> = objects.list(Some(&blocks)).try_collect().await.unwrap();
    let damaged = &listed[0].location;
    let checksum = damaged
        .filename()
        .unwrap()
        .trim_end_matches(".blk")
        .to_owned();
    let mut bytes = objects
        .get(damaged)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    objects.put(damaged, bytes.into()).await.unwrap();

    let spec =
        json!({"size": 16 * MIB, "numberOfReplicas": 1, "fromBackup": "only", "nodeID": node});
    cluster.create_volume_with("restored", spec).await;
    let volume = cluster
        .until_volume("restored", "the restore failed", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == FILLED && c.reason == "RestoreFailed")
        })
        .await;
    let status = volume.status.unwrap();
    let filled = status
        .conditions
        .iter()
        .find(|c| c.type_ == FILLED)
        .unwrap();
    assert!(filled.message.contains(&checksum), "{}", filled.message);
    assert_ne!(
        status.state,
        VolumeState::Attached,
        "attached half-restored"
    );
    let detach = json!({"spec": {"nodeID": ""}});
    cluster.patch_volume("restored", detach).await;
    cluster.delete_volume("restored").await;
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}

/// A backup never stores a rotten block: what one replica's copy of the
/// snapshot fails the checksums of is read from the other's. Each replica
/// has a different block rotten, so whichever the backup reads first, it
/// must turn to the other once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_reads_what_one_replica_has_rotten_from_another() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start("bkrot", 2).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let url = format!("file://{}", dir.path().display());
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "", "300s").await;
    until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    cluster.create_volume("vol", SIZE, 2).await;
    let device = cluster.attach("vol", &node).await;
    let mut expected = vec![0; usize::try_from(SIZE).unwrap()];
    expected[..8 << 20].copy_from_slice(&write_pattern(&device, 8 << 20, 3));
    let snapshot = Snapshot::new(
        "snap",
        SnapshotSpec {
            volume: "vol".into(),
        },
    );
    cluster
        .api::<Snapshot>()
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap();
    cluster
        .until("the snapshot taken", || async {
            let snapshot = cluster.api::<Snapshot>().get_opt("snap").await.unwrap()?;
            snapshot.status.filter(|s| s.ready_to_use).map(|_| ())
        })
        .await;
    // Block 10 on one replica, block 1000 (another 2 MiB backup block) on
    // the other: one bit each of the snapshot's layer.
    for (replica, block) in cluster.replicas_of("vol").await.iter().zip([10u64, 1000]) {
        let dir = replica_dir(cluster.node(&replica.spec.instance.node_id), replica);
        let layer = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with("snap-") && name.ends_with(".img")
            })
            .expect("the snapshot's layer");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(layer)
            .unwrap();
        let at = block * 4096 + 100;
        let mut byte = [0u8];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, at).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &[!byte[0]], at).unwrap();
    }

    let backup = Backup::new(
        "bk",
        serde_json::from_value(json!({"volumeName": "vol", "snapshotName": "snap"})).unwrap(),
    );
    cluster
        .api::<Backup>()
        .create(&PostParams::default(), &backup)
        .await
        .unwrap();
    until_backup_completed(&cluster, "bk").await;
    let store = oxhorn::backup::target::open(&url, "", &BTreeMap::new()).unwrap();
    assert!(
        restored(&store, "vol", "bk").await == expected,
        "the backup differs from what was written"
    );
    delete_backup(&cluster, "bk").await;
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_target_says_why_its_store_does_not_answer_and_recovers() {
    a_target_says_why_its_store_does_not_answer_and_recovers(ObjectServerKind::Minio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_target_says_why_its_store_does_not_answer_and_recovers() {
    a_target_says_why_its_store_does_not_answer_and_recovers(ObjectServerKind::Azurite).await;
}

async fn a_target_says_why_its_store_does_not_answer_and_recovers(kind: ObjectServerKind) {
    let mut store = Store::start(kind);
    let cluster = Cluster::start("bkfail", 1).await;
    credential_secret(&cluster, "good", &store, true).await;
    credential_secret(&cluster, "bad", &store, false).await;
    let url = store.url(BUCKET);
    create_target(&cluster, "good", &url, "good", "300s").await;
    create_target(&cluster, "wrong-key", &url, "bad", "300s").await;
    create_target(&cluster, "no-bucket", &store.url("missing"), "good", "300s").await;
    create_target(&cluster, "no-secret", &url, "absent", "300s").await;

    until_target(&cluster, "good", "Synced").await;
    let denied = until_target(&cluster, "wrong-key", "AccessDenied").await;
    assert!(!denied.available);
    until_target(&cluster, "no-bucket", "BucketNotFound").await;
    let missing = until_target(&cluster, "no-secret", "InvalidCredentials").await;
    let message = &missing.conditions[0].message;
    assert!(
        message.contains("absent") && message.contains("does not exist"),
        "{message}"
    );

    // An outage: the target goes unavailable, and comes back by itself.
    store.server.stop().unwrap();
    request_sync(&cluster, "good").await;
    let down = until_target(&cluster, "good", "Unreachable").await;
    assert!(!down.available, "{down:?}");
    store.server.resume().unwrap();
    let up = until_target(&cluster, "good", "Synced").await;
    assert!(up.available);
    let reasons = cluster.event_reasons().await;
    for reason in ["Unreachable", "Available", "AccessDenied"] {
        assert!(reasons.contains(reason), "no {reason} event in {reasons:?}");
    }
    // No secret in any status, event or log line.
    let all = Default::default();
    let targets = cluster.api::<BackupTarget>().list(&all).await.unwrap();
    let events = cluster.api::<k8s_openapi::api::events::v1::Event>();
    let said = [
        serde_json::to_string(&targets).unwrap(),
        serde_json::to_string(&events.list(&all).await.unwrap()).unwrap(),
        cluster.logs(),
    ];
    for secret in [MINIO_SECRET_KEY, WRONG, AZURITE_ACCOUNT_KEY, WRONG_KEY] {
        for text in &said {
            if let Some(at) = text.find(secret) {
                let around = text.get(at.saturating_sub(200)..at).unwrap_or_default();
                panic!("a secret said, after: {around}");
            }
        }
    }
}

/// An S3 store serving HTTPS with a certificate of a private CA: a target
/// whose Secret holds that CA in `AWS_CERT` syncs, and a backup through it
/// holds the volume's data; a target without it is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_target_over_tls_trusts_the_ca_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let server = ObjectServer::start_tls(dir.path(), &[BUCKET]).unwrap();
    assert!(server.endpoint().starts_with("https://"));
    let store = Store { server, _dir: dir };
    let cluster = Cluster::start("bktls", 1).await;
    let node = cluster.nodes[0].node_id().to_owned();
    credential_secret(&cluster, "with-ca", &store, true).await;
    secret(&cluster, "without-ca", store.keys(true)).await;
    let url = store.url(BUCKET);
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "with-ca", "300s").await;
    create_target(&cluster, "untrusted", &url, "without-ca", "300s").await;
    until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    let refused = until_target(&cluster, "untrusted", "CertificateUntrusted").await;
    assert!(!refused.available);
    let message = &refused.conditions[0].message;
    assert!(message.contains("certificate"), "{message}");

    cluster.create_volume("vol", SIZE, 1).await;
    let device = cluster.attach("vol", &node).await;
    let mut expected = vec![0; usize::try_from(SIZE).unwrap()];
    expected[..4 << 20].copy_from_slice(&write_pattern(&device, 4 << 20, 21));
    create_backup(&cluster, "over-tls", "vol").await;
    let done = until_backup_completed(&cluster, "over-tls").await;
    assert!(done.url.contains(BUCKET), "{done:?}");
    assert!(restored(&store.backupstore(), "vol", "over-tls").await == expected);
    delete_backup(&cluster, "over-tls").await;
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_syncs_on_its_poll_timer_and_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start("bkpoll", 1).await;
    let url = format!("file://{}", dir.path().display());
    create_target(&cluster, "local", &url, "", "2s").await;
    let synced_at = || async {
        let target = cluster.api::<BackupTarget>().get("local").await.unwrap();
        target.status.and_then(|s| s.last_synced_at).map(|t| t.0)
    };
    let seen = Mutex::new(Vec::new());
    cluster
        .until("three syncs on the timer", || async {
            let at = synced_at().await;
            let mut seen = seen.lock().unwrap();
            if let Some(at) = at
                && seen.last() != Some(&at)
            {
                seen.push(at);
            }
            (seen.len() >= 3).then_some(())
        })
        .await;
    let seen = seen.into_inner().unwrap();
    for pair in seen.windows(2) {
        let gap = pair[1].duration_since(pair[0]).as_secs_f64();
        assert!(
            gap >= 1.9,
            "synced {gap:.2}s after the one before, polling every 2 s"
        );
    }

    // Without a timer, a sync happens only when asked.
    let patch = json!({"spec": {"pollInterval": "0s"}});
    cluster
        .api::<BackupTarget>()
        .patch("local", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let before = synced_at().await.unwrap();
    let asked = request_sync(&cluster, "local").await;
    let after = cluster
        .until("a sync after the request", || async {
            synced_at().await.filter(|at| *at > asked && *at > before)
        })
        .await;
    assert!(after > asked);
}

/// The settings make the `default` target and keep it what they say: an
/// edit of its spec is put back, a new URL syncs the new store at once,
/// and emptying `backup-target` forgets the target; a `default` target a
/// user made while the setting is empty stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_make_and_keep_the_default_target() {
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let url = |dir: &tempfile::TempDir| format!("file://{}", dir.path().display());
    let objects = oxhorn::backup::target::open(&url(&second), "", &BTreeMap::new()).unwrap();
    back_up_nothing(&objects, "moved", "moved-b1").await;

    let cluster = Cluster::start("bkdefault", 1).await;
    let api = cluster.api::<BackupTarget>();
    cluster.set("backupstore-poll-interval", "0").await;
    cluster.set("backup-target", &url(&first)).await;
    let made = until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    assert!(made.available);
    let target = api.get(DEFAULT_BACKUP_TARGET).await.unwrap();
    assert_eq!(target.spec.backup_target_url, url(&first));
    assert_eq!(target.spec.poll_interval, "0s");
    assert!(target.labels().contains_key("oxhorn.io/from-settings"));

    let edit = json!({"spec": {"pollInterval": "5s"}});
    api.patch(
        DEFAULT_BACKUP_TARGET,
        &PatchParams::default(),
        &Patch::Merge(&edit),
    )
    .await
    .unwrap();
    cluster
        .until("the settings' poll interval put back", || async {
            let target = api.get(DEFAULT_BACKUP_TARGET).await.unwrap();
            (target.spec.poll_interval == "0s").then_some(())
        })
        .await;

    // Synced at once although it polls never.
    cluster.set("backup-target", &url(&second)).await;
    cluster
        .until("the new store's volume a BackupVolume", || async {
            let api = cluster.api::<BackupVolume>();
            let volumes = api.list(&Default::default()).await.unwrap().items;
            volumes
                .iter()
                .any(|bv| bv.spec.volume_name == "moved")
                .then_some(())
        })
        .await;

    cluster.set("backup-target", "").await;
    cluster
        .until("the default target gone", || async {
            api.get_opt(DEFAULT_BACKUP_TARGET)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    assert_eq!(
        objects.volumes().await.unwrap(),
        ["moved"],
        "the store kept"
    );

    // A user's own: synced, and left alone through its changes.
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url(&first), "", "0s").await;
    let synced = until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    let asked = request_sync(&cluster, DEFAULT_BACKUP_TARGET).await;
    cluster
        .until("synced again when asked", || async {
            let target = api.get_opt(DEFAULT_BACKUP_TARGET).await.unwrap()?;
            let at = target.status?.last_synced_at?.0;
            (at > asked && Some(at) > synced.last_synced_at.as_ref().map(|t| t.0)).then_some(())
        })
        .await;
    let target = api.get(DEFAULT_BACKUP_TARGET).await.unwrap();
    assert!(!target.labels().contains_key("oxhorn.io/from-settings"));
    assert_eq!(target.spec.poll_interval, "0s");
}

/// Deleting a BackupTarget forgets what was synced from it (Kubernetes'
/// garbage collector deletes its BackupVolumes and Backups, their owner
/// being gone) and leaves its store as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_target_forgets_its_resources_and_keeps_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let objects = oxhorn::backup::target::open(&url, "", &BTreeMap::new()).unwrap();
    for name in ["kept-b1", "kept-b2"] {
        back_up_nothing(&objects, "kept", name).await;
    }
    let cluster = Cluster::start("bkforget", 1).await;
    let gc = oxhorn_testbed::sidecars::Sidecars::start_garbage_collector(
        oxhorn_testbed::shared().kubeconfig(),
    )
    .unwrap();
    create_target(&cluster, "old", &url, "", "300s").await;
    let counts = || async {
        let all = Default::default();
        let volumes = cluster.api::<BackupVolume>().list(&all).await.unwrap();
        let backups = cluster.api::<Backup>().list(&all).await.unwrap();
        (volumes.items.len(), backups.items.len())
    };
    cluster
        .until("the store's backups synced", || async {
            (counts().await == (1, 2)).then_some(())
        })
        .await;

    cluster
        .api::<BackupTarget>()
        .delete("old", &DeleteParams::default())
        .await
        .unwrap();
    let forgotten = eventually(PATIENCE, || async {
        (counts().await == (0, 0)).then_some(())
    })
    .await;
    if let Err(e) = forgotten {
        panic!("{e}: {:?} left\n{}", counts().await, gc.logs(40));
    }
    let kept: Vec<String> = objects
        .backups("kept")
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(kept, ["kept-b1", "kept-b2"], "the store kept");
}

/// Asks target `name` for a sync now; returns when it asked.
pub(crate) async fn request_sync(cluster: &Cluster, name: &str) -> jiff::Timestamp {
    let now = MicroTime(jiff::Timestamp::now());
    let patch = json!({"spec": {"syncRequestedAt": now}});
    cluster
        .api::<BackupTarget>()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    now.0
}

/// Writes backup `name` of a 4 KiB `volume` holding nothing into
/// `objects`, straight to the store: a store filled quickly.
async fn back_up_nothing(objects: &Backupstore, volume: &str, name: &str) {
    let request = oxhorn::backup::NewBackup {
        volume,
        name,
        snapshot: name,
        size: 4096,
        previous: None,
        changed: &[],
        owner: "test",
        labels: &BTreeMap::new(),
        compression: oxhorn::backup::Compression::default(),
        progress: None,
    };
    objects.create(&request, &Zeros).await.unwrap();
}

/// Reads zeros: backups of nothing, to fill a store quickly.
struct Zeros;

impl oxhorn::backup::VolumeReader for Zeros {
    async fn read(&self, _offset: u64, len: u64) -> std::io::Result<Bytes> {
        Ok(Bytes::from(vec![0; usize::try_from(len).unwrap()]))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_backups_in_a_store_become_resources() {
    const VOLUMES: usize = 4;
    const PER_VOLUME: usize = 250;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let objects = oxhorn::backup::target::open(&url, "", &BTreeMap::new()).unwrap();
    for v in 0..VOLUMES {
        let volume = format!("old-{v}");
        for b in 0..PER_VOLUME {
            back_up_nothing(&objects, &volume, &format!("old-{v}-b{b}")).await;
        }
    }

    let cluster = Cluster::start("bkmany", 1).await;
    create_target(&cluster, "old", &url, "", "300s").await;
    cluster
        .until("every backup a completed Backup", || async {
            let backups = cluster
                .api::<Backup>()
                .list(&Default::default())
                .await
                .unwrap();
            let completed = backups
                .items
                .iter()
                .filter(|b| {
                    b.status
                        .as_ref()
                        .is_some_and(|s| s.state == BackupState::Completed)
                })
                .count();
            (completed == VOLUMES * PER_VOLUME).then_some(())
        })
        .await;
    let volumes = cluster
        .api::<BackupVolume>()
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(volumes.items.len(), VOLUMES);
    for volume in &volumes.items {
        let status = volume.status.as_ref().unwrap();
        assert_eq!(
            status.last_backup_name,
            format!("{}-b{}", volume.spec.volume_name, PER_VOLUME - 1)
        );
    }
}
