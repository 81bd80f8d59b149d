//! The recurring tasks that keep volumes tidy, on `oxhorn manager` nodes
//! whose job clock runs 60 times faster: `snapshot-delete` keeps the newest
//! snapshots and spares those a CSI VolumeSnapshot holds, age-based
//! retention keeps the young ones and the newest, `filesystem-trim` frees
//! in every replica what the filesystem freed, and `snapshot-cleanup`
//! removes the snapshot a rebuild took, the data unchanged.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

use kube::ResourceExt;
use kube::api::DeleteParams;
use oxhorn::types::*;
use oxhorn_testbed::Mounted;
use serde_json::json;

use crate::common::*;
use crate::recurring::{SCALE, create_job, made_snapshots, until_record};

const SIZE: i64 = 16 * MIB;

/// The labels that put a volume in `jobs`.
fn in_jobs(jobs: &[&str]) -> serde_json::Value {
    let labels: serde_json::Map<String, serde_json::Value> = jobs
        .iter()
        .map(|job| (format!("recurring-job.oxhorn.io/{job}"), json!("enabled")))
        .collect();
    json!({"metadata": {"labels": labels}})
}

/// Takes the Snapshot `name` of `volume` with `labels`, once it is ready.
async fn take_snapshot(cluster: &Cluster, name: &str, volume: &str, labels: &[(&str, &str)]) {
    let mut snapshot = Snapshot::new(
        name,
        SnapshotSpec {
            volume: volume.into(),
        },
    );
    snapshot.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    cluster.create(&snapshot).await;
    cluster
        .until(&format!("snapshot {name} ready"), || async {
            let snapshot = cluster.api::<Snapshot>().get_opt(name).await.unwrap()?;
            snapshot.status.filter(|s| s.ready_to_use).map(|_| ())
        })
        .await;
}

/// The names of `volume`'s Snapshots not being deleted.
async fn snapshots_of(cluster: &Cluster, volume: &str) -> BTreeSet<String> {
    let snapshots = cluster
        .api::<Snapshot>()
        .list(&Default::default())
        .await
        .unwrap();
    snapshots
        .into_iter()
        .filter(|s| s.spec.volume == volume && s.metadata.deletion_timestamp.is_none())
        .map(|s| s.name_any())
        .collect()
}

/// `snapshot-delete` with `retain: 2` deletes the oldest snapshots of any
/// maker down to the newest two, leaves the one a CSI VolumeSnapshot
/// holds, and then has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_delete_keeps_the_newest_and_what_a_volume_snapshot_holds() {
    let cluster = Cluster::start_with_job_clock("rjprune", 1, SCALE).await;
    cluster.create_volume("pruned", SIZE, 1).await;
    cluster.patch_volume("pruned", in_jobs(&["prune"])).await;
    // Oldest first: the one a VolumeSnapshot holds, then four more.
    take_snapshot(&cluster, "held", "pruned", &[(CSI_SNAPSHOT, "snapshot-1")]).await;
    for name in ["s1", "s2", "s3", "s4"] {
        take_snapshot(&cluster, name, "pruned", &[]).await;
    }
    create_job(
        &cluster,
        "prune",
        json!({"task": "snapshot-delete", "cron": "* * * * *", "retain": 2}),
    )
    .await;
    until_record(&cluster, "pruned", "prune", "a run that deleted", |r| {
        r.state == VolumeJobState::Succeeded
    })
    .await;
    let skipped = until_record(
        &cluster,
        "pruned",
        "prune",
        "a run with nothing to do",
        |r| r.state == VolumeJobState::Skipped,
    )
    .await;
    assert!(skipped.message.contains("or fewer"), "{skipped:?}");
    let left: Vec<String> = snapshots_of(&cluster, "pruned").await.into_iter().collect();
    assert_eq!(left, ["held", "s3", "s4"]);
}

/// `retentionPolicy: age-based` keeps what the job made within `retainAge`
/// (4 job minutes: 4 s here) and deletes the older ones, oldest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_based_retention_keeps_the_young_snapshots() {
    let cluster = Cluster::start_with_job_clock("rjage", 1, SCALE).await;
    cluster.create_volume("aged", SIZE, 1).await;
    create_job(
        &cluster,
        "aged",
        json!({"task": "snapshot-force-create", "cron": "* * * * *", "groups": ["default"],
               "retentionPolicy": "age-based", "retainAge": "4m"}),
    )
    .await;
    // Names sort by their run's time.
    let seen = Mutex::new(BTreeSet::new());
    cluster
        .until("ten runs' snapshots", || async {
            let status = cluster.volume("aged").await?.status?;
            let record = status
                .recurring_jobs
                .into_iter()
                .find(|r| r.name == "aged")?;
            let mut seen = seen.lock().unwrap();
            if record.state == VolumeJobState::Succeeded {
                seen.insert(record.made);
            }
            (seen.len() >= 10).then_some(())
        })
        .await;
    let seen = seen.into_inner().unwrap();
    let kept = made_snapshots(&cluster, "aged", "aged").await;
    let deleted: BTreeSet<&String> = seen.iter().filter(|s| !kept.contains(*s)).collect();
    assert!(
        (1..=6).contains(&kept.len()),
        "4 s of runs, one a second at most: {kept:?}"
    );
    assert!(deleted.len() >= 4, "{deleted:?} of {seen:?}");
    let (Some(youngest_deleted), Some(oldest_kept)) = (deleted.last(), kept.first()) else {
        panic!("{kept:?} {deleted:?}");
    };
    assert!(
        *youngest_deleted < oldest_kept,
        "kept {kept:?}, deleted {deleted:?}"
    );
}

/// Bytes the replica's files take on its disk.
fn allocated(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let metadata = entry.metadata().unwrap();
        total += if metadata.is_dir() {
            allocated(&entry.path())
        } else {
            metadata.blocks() * 512
        };
    }
    total
}

/// Bytes each of `volume`'s replicas takes, by replica.
async fn replica_usage(cluster: &Cluster, volume: &str) -> Vec<(String, u64)> {
    cluster
        .replicas_of(volume)
        .await
        .iter()
        .map(|replica| {
            let node = cluster.node(&replica.spec.instance.node_id);
            (replica.name_any(), allocated(&replica_dir(node, replica)))
        })
        .collect()
}

/// A file deleted from a filesystem mounted without `discard` keeps its
/// blocks in the replicas until `filesystem-trim` runs; then they are
/// freed in each. A rebuild's snapshot stays until `snapshot-cleanup`
/// removes it, and the files read the same afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_frees_what_the_filesystem_freed_and_cleanup_removes_a_rebuilds_snapshot() {
    require_root();
    let cluster = Cluster::start_with_job_clock("rjtrim", 2, SCALE).await;
    let node = cluster.nodes[0].node_id().to_owned();
    cluster.create_volume("fs", 64 * MIB, 2).await;
    cluster.patch_volume("fs", in_jobs(&["trim", "tidy"])).await;
    let device = cluster.attach("fs", &node).await;
    run("mkfs.ext4", &["-q", "-F", &device]);
    let dir = tempfile::tempdir().unwrap();
    let mount = Mounted::new(Path::new(&device), &dir.path().join("fs"), "ext4", None).unwrap();
    let kept = pattern(4 << 20, 1);
    std::fs::write(mount.path().join("kept"), &kept).unwrap();
    std::fs::write(mount.path().join("gone"), pattern(24 << 20, 2)).unwrap();
    run("sync", &[]);
    let full = replica_usage(&cluster, "fs").await;
    std::fs::remove_file(mount.path().join("gone")).unwrap();
    run("sync", &[]);

    create_job(
        &cluster,
        "trim",
        json!({"task": "filesystem-trim", "cron": "* * * * *"}),
    )
    .await;
    until_record(&cluster, "fs", "trim", "a trim", |r| {
        r.state == VolumeJobState::Succeeded
    })
    .await;
    let trimmed = replica_usage(&cluster, "fs").await;
    for ((replica, before), (_, after)) in full.iter().zip(&trimmed) {
        assert!(
            before.saturating_sub(*after) >= 16 << 20,
            "{replica}: {before} bytes before, {after} after"
        );
    }
    cluster
        .api::<RecurringJob>()
        .delete("trim", &DeleteParams::default())
        .await
        .unwrap();

    // A replica replaced: the rebuild takes a snapshot of the system's.
    let replaced = cluster.replicas_of("fs").await[0].name_any();
    cluster
        .api::<Replica>()
        .delete(&replaced, &DeleteParams::default())
        .await
        .unwrap();
    let system = |engine: &EngineStatus| -> Vec<String> {
        engine
            .snapshots
            .values()
            .filter(|s| !s.user_created && !s.removed)
            .map(|s| s.name.clone())
            .collect()
    };
    let taken = cluster
        .until("the rebuild done, its snapshot left", || async {
            let engine = cluster.engine_of("fs").await?.status?;
            let modes = &engine.replica_mode_map;
            let rebuilt = modes.len() == 2
                && !modes.contains_key(&replaced)
                && modes.values().all(|m| *m == ReplicaMode::ReadWrite);
            let taken = system(&engine);
            (rebuilt && !taken.is_empty()).then_some(taken)
        })
        .await;
    create_job(
        &cluster,
        "tidy",
        json!({"task": "snapshot-cleanup", "cron": "* * * * *"}),
    )
    .await;
    until_record(&cluster, "fs", "tidy", "a clean-up", |r| {
        r.state == VolumeJobState::Succeeded
    })
    .await;
    cluster
        .until("the rebuild's snapshot removed", || async {
            let engine = cluster.engine_of("fs").await?.status?;
            system(&engine).is_empty().then_some(())
        })
        .await;
    assert!(
        std::fs::read(mount.path().join("kept")).unwrap() == kept,
        "the file differs after {taken:?} was removed"
    );
    mount.unmount().unwrap();
    cluster.detach("fs").await;
}
