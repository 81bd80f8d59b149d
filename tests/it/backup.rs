//! Backups to real object stores on loopback (MinIO for S3), on a real API
//! server with `oxhorn manager` nodes. What a user would notice: a target
//! says whether its store answers, and why not; a backup holds the
//! volume's data at its snapshot, a second one uploads only what changed,
//! and deleting one leaves every other whole; the store's contents show up
//! as BackupVolumes and Backups, on the poll timer or at once when asked.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use oxhorn::backup::{Backupstore, VolumeWriter};
use oxhorn::types::*;
use oxhorn_testbed::Minio;
use serde_json::json;

use crate::common::*;

const SIZE: i64 = 64 * MIB;
const BUCKET: &str = "backups";

/// A Secret holding MinIO's credentials, as a user writes one.
async fn s3_secret(cluster: &Cluster, name: &str, minio: &Minio, secret_key: &str) {
    let data = [
        ("AWS_ACCESS_KEY_ID", Minio::ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", secret_key),
        ("AWS_ENDPOINTS", &minio.endpoint()),
    ];
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some(
            data.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        ),
        ..Default::default()
    };
    cluster
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn create_target(cluster: &Cluster, name: &str, url: &str, secret: &str, poll: &str) {
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

/// Waits until target `name`'s Available condition has `reason`.
async fn until_target(cluster: &Cluster, name: &str, reason: &str) -> BackupTargetStatus {
    cluster
        .until(&format!("target {name} {reason}"), || async {
            let target = cluster.api::<BackupTarget>().get_opt(name).await.unwrap()?;
            let status = target.status?;
            let available = status.conditions.iter().find(|c| c.type_ == "Available")?;
            (available.reason == reason).then_some(status)
        })
        .await
}

async fn create_backup(cluster: &Cluster, name: &str, volume: &str) {
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

async fn until_backup_completed(cluster: &Cluster, name: &str) -> BackupStatus {
    cluster
        .until(&format!("backup {name} completed"), || async {
            let backup = cluster.api::<Backup>().get_opt(name).await.unwrap()?;
            backup.status.filter(|s| s.state == BackupState::Completed)
        })
        .await
}

async fn delete_backup(cluster: &Cluster, name: &str) {
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

/// The MinIO target's store, as the test reads it directly.
fn store_of(minio: &Minio) -> Backupstore {
    let secret = BTreeMap::from([
        ("AWS_ACCESS_KEY_ID".to_owned(), Minio::ACCESS_KEY.to_owned()),
        (
            "AWS_SECRET_ACCESS_KEY".to_owned(),
            Minio::SECRET_KEY.to_owned(),
        ),
        ("AWS_ENDPOINTS".to_owned(), minio.endpoint()),
    ]);
    oxhorn::backup::target::open(&format!("s3://{BUCKET}@us-east-1/cluster"), "s", &secret).unwrap()
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
async fn backups_are_incremental_and_deleting_one_keeps_the_others_whole() {
    let dir = tempfile::tempdir().unwrap();
    let minio = Minio::start(dir.path(), &[BUCKET]).unwrap();
    let cluster = Cluster::start("bkup", 2).await;
    let node = cluster.nodes[0].node_id().to_owned();
    s3_secret(&cluster, "s3", &minio, Minio::SECRET_KEY).await;
    let url = format!("s3://{BUCKET}@us-east-1/cluster");
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "s3", "300s").await;
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

    let store = store_of(&minio);
    assert!(
        restored(&store, "vol", "first").await == at_first,
        "first backup's data"
    );
    assert!(
        restored(&store, "vol", "second").await == at_second,
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

    delete_backup(&cluster, "first").await;
    assert!(
        restored(&store, "vol", "second").await == at_second,
        "second after the first went"
    );
    delete_backup(&cluster, "second").await;
    assert!(store.backups("vol").await.unwrap().is_empty());
    assert_eq!(
        store.stored_blocks("vol").await.unwrap().len(),
        0,
        "blocks left behind"
    );
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_says_why_its_store_does_not_answer_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut minio = Minio::start(dir.path(), &[BUCKET]).unwrap();
    let cluster = Cluster::start("bkfail", 1).await;
    s3_secret(&cluster, "good", &minio, Minio::SECRET_KEY).await;
    s3_secret(&cluster, "bad", &minio, "not-the-secret").await;
    let url = format!("s3://{BUCKET}@us-east-1/x");
    create_target(&cluster, "good", &url, "good", "300s").await;
    create_target(&cluster, "wrong-key", &url, "bad", "300s").await;
    create_target(
        &cluster,
        "no-bucket",
        "s3://missing@us-east-1/x",
        "good",
        "300s",
    )
    .await;
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
    minio.stop().unwrap();
    request_sync(&cluster, "good").await;
    let down = until_target(&cluster, "good", "Unreachable").await;
    assert!(!down.available, "{down:?}");
    minio.resume().unwrap();
    let up = until_target(&cluster, "good", "Synced").await;
    assert!(up.available);
    let reasons = cluster.event_reasons().await;
    for reason in ["Unreachable", "Available", "AccessDenied"] {
        assert!(reasons.contains(reason), "no {reason} event in {reasons:?}");
    }
    // No secret in any status or event.
    let statuses = serde_json::to_string(
        &cluster
            .api::<BackupTarget>()
            .list(&Default::default())
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(!statuses.contains(Minio::SECRET_KEY) && !statuses.contains("not-the-secret"));
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

/// Asks target `name` for a sync now; returns when it asked.
async fn request_sync(cluster: &Cluster, name: &str) -> jiff::Timestamp {
    let now = MicroTime(jiff::Timestamp::now());
    let patch = json!({"spec": {"syncRequestedAt": now}});
    cluster
        .api::<BackupTarget>()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    now.0
}
