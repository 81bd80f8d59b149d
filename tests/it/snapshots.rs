//! Snapshots and volumes filled from them, on a real API server with
//! several `oxhorn manager` nodes. What a user would notice: a snapshot of
//! an attached or a detached volume becomes ready and holds the data of
//! that moment; a volume restored or cloned from one shows exactly that
//! data, also when it is larger; a snapshot of nothing, or a restore from
//! nothing, says why; deleting snapshots removes their data.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Instant;

use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use oxhorn::types::*;
use serde_json::json;

use crate::common::*;

const SIZE: i64 = 64 * MIB;
/// Bytes written at first, from the start of the volume.
const PATTERN: usize = 16 << 20;
/// Bytes compared: the pattern and zeroes after it.
const COMPARED: usize = 24 << 20;

async fn create_snapshot(cluster: &Cluster, name: &str, volume: &str, clone_for: Option<&str>) {
    let mut snapshot = Snapshot::new(
        name,
        SnapshotSpec {
            volume: volume.into(),
        },
    );
    if let Some(clone) = clone_for {
        snapshot.metadata.labels =
            Some([("oxhorn.io/clone-for".to_owned(), clone.to_owned())].into());
    }
    cluster
        .api::<Snapshot>()
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap();
}

async fn until_snapshot(
    cluster: &Cluster,
    name: &str,
    what: &str,
    check: impl Fn(&SnapshotStatus) -> bool,
) -> SnapshotStatus {
    cluster
        .until(what, || async {
            let snapshot = cluster.api::<Snapshot>().get_opt(name).await.unwrap()?;
            snapshot.status.filter(|s| check(s))
        })
        .await
}

async fn delete_snapshot(cluster: &Cluster, name: &str) {
    cluster
        .api::<Snapshot>()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .until("the snapshot gone", || async {
            let gone = cluster
                .api::<Snapshot>()
                .get_opt(name)
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
}

async fn create_volume_from(
    cluster: &Cluster,
    name: &str,
    size: i64,
    replicas: i32,
    snapshot: &str,
) {
    let spec = json!({"size": size, "numberOfReplicas": replicas, "dataSource": format!("snapshot/{snapshot}")});
    cluster.create_volume_with(name, spec).await;
}

fn filled(status: &VolumeStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == "Filled")
}

/// The snapshot layers in the directories of `volume`'s replicas.
async fn layers_of(cluster: &Cluster, volume: &str) -> BTreeSet<String> {
    let mut layers = BTreeSet::new();
    for replica in cluster.replicas_of(volume).await {
        let dir = replica_dir(cluster.node(&replica.spec.instance.node_id), &replica);
        for entry in std::fs::read_dir(dir).unwrap() {
            let file = entry.unwrap().file_name().to_string_lossy().into_owned();
            if let Some(name) = file
                .strip_prefix("snap-")
                .and_then(|f| f.strip_suffix(".img"))
            {
                layers.insert(format!("{}:{name}", replica.name_any()));
            }
        }
    }
    layers
}

fn device_size(device: &str) -> u64 {
    let output = Command::new("blockdev")
        .args(["--getsize64", device])
        .output()
        .unwrap();
    assert!(output.status.success(), "blockdev {device}: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_fill_restored_and_cloned_volumes_and_go_when_deleted() {
    let cluster = Cluster::start("snap", 3).await;
    let node = |i: usize| cluster.nodes[i].node_id().to_owned();

    cluster.create_volume("vol", SIZE, 2).await;
    cluster
        .until_volume("vol", "the volume detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    let device = cluster.attach("vol", &node(0)).await;
    let mut at_a = vec![0; COMPARED];
    at_a[..PATTERN].copy_from_slice(&write_pattern(&device, PATTERN, 1));

    // Attached: taken through the engine.
    let started = Instant::now();
    create_snapshot(&cluster, "a", "vol", None).await;
    let a = until_snapshot(&cluster, "a", "snapshot a ready", |s| s.ready_to_use).await;
    let took_attached = started.elapsed();
    assert_eq!(a.size, SIZE);
    assert!(a.creation_time.is_some() && a.error.is_empty(), "{a:?}");

    let mut at_b = at_a.clone();
    at_b[8 << 20..12 << 20].copy_from_slice(&write_pattern_at(&device, 8, 4 << 20, 2));
    cluster.detach("vol").await;

    // Detached: the replicas run for it, then go idle again.
    let started = Instant::now();
    create_snapshot(&cluster, "b", "vol", None).await;
    until_snapshot(&cluster, "b", "snapshot b ready", |s| s.ready_to_use).await;
    let took_detached = started.elapsed();
    cluster
        .until("the replicas stopped again", || async {
            let replicas = cluster.replicas_of("vol").await;
            replicas
                .iter()
                .all(|r| {
                    r.spec.instance.desire_state == DesireState::Stopped
                        && r.status
                            .as_ref()
                            .is_some_and(|s| s.current_state == InstanceState::Stopped)
                })
                .then_some(())
        })
        .await;
    let layers = layers_of(&cluster, "vol").await;
    assert_eq!(
        layers
            .iter()
            .filter(|l| l.ends_with(":a") || l.ends_with(":b"))
            .count(),
        4,
        "a and b on both replicas: {layers:?}"
    );

    // A snapshot of nothing, and a restore from nothing, say why.
    create_snapshot(&cluster, "orphan", "no-such-volume", None).await;
    until_snapshot(&cluster, "orphan", "the orphan snapshot's error", |s| {
        !s.ready_to_use && s.error.contains("no-such-volume")
    })
    .await;
    create_volume_from(&cluster, "lost", SIZE, 1, "no-such-snapshot").await;
    cluster
        .patch_volume("lost", json!({"spec": {"nodeID": node(1)}}))
        .await;
    cluster
        .until_volume("lost", "the restore from nothing says so", |s| {
            filled(s)
                .is_some_and(|c| c.status == ConditionStatus::False && c.reason == "SourceNotFound")
        })
        .await;

    // A restore of each snapshot, the second one larger, and a clone.
    let started = Instant::now();
    create_volume_from(&cluster, "x", SIZE, 1, "a").await;
    create_volume_from(&cluster, "y", 96 * MIB, 2, "b").await;
    create_snapshot(&cluster, "c-clone-source", "vol", Some("c")).await;
    create_volume_from(&cluster, "c", SIZE, 1, "c-clone-source").await;
    for name in ["x", "y", "c"] {
        cluster
            .until_volume(name, "the volume filled", |s| {
                filled(s).is_some_and(|c| c.status == ConditionStatus::True)
            })
            .await;
    }
    let took_fill = started.elapsed();
    cluster
        .until("the clone's snapshot deleted", || async {
            let gone = cluster
                .api::<Snapshot>()
                .get_opt("c-clone-source")
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
    let lost = cluster.volume("lost").await.unwrap().status.unwrap();
    assert_eq!(
        lost.state,
        VolumeState::Attaching,
        "a volume not filled never attaches"
    );

    let x = cluster.attach("x", &node(1)).await;
    assert!(
        read_device(&x, COMPARED) == at_a,
        "x differs from the volume at snapshot a"
    );
    let y = cluster.attach("y", &node(2)).await;
    assert_eq!(device_size(&y), 96 << 20);
    let mut at_b_64 = at_b.clone();
    at_b_64.resize(SIZE as usize, 0);
    assert!(
        read_device(&y, SIZE as usize) == at_b_64,
        "y differs from the volume at snapshot b"
    );
    let tail = write_pattern_at(&y, 90, 1 << 20, 3);
    let read = read_device(&y, 91 << 20);
    assert!(
        read[90 << 20..] == tail[..],
        "y's grown space holds what was written"
    );
    let y_engine = cluster.engine_of("y").await.unwrap().status.unwrap();
    let rw = y_engine
        .replica_mode_map
        .values()
        .filter(|m| **m == ReplicaMode::ReadWrite);
    assert_eq!(rw.count(), 2, "{y_engine:?}");
    // A rebuild starts with a snapshot of its own: none means the first
    // engine start trusted both filled replicas.
    let layers = layers_of(&cluster, "y").await;
    assert!(
        !layers.iter().any(|l| l.contains(":rebuild-")),
        "y rebuilt a replica: {layers:?}"
    );
    let c = cluster.attach("c", &node(0)).await;
    assert!(
        read_device(&c, COMPARED) == at_b,
        "the clone differs from its source"
    );

    let reasons = cluster.event_reasons().await;
    for reason in ["SnapshotTaken", "Filled"] {
        assert!(
            reasons.contains(reason),
            "no {reason} event among {reasons:?}"
        );
    }

    // Detached first: a volume's deletion waits for its detachment.
    for name in ["x", "y", "c", "lost"] {
        cluster.detach(name).await;
        cluster.delete_volume(name).await;
    }
    delete_snapshot(&cluster, "orphan").await;

    // Deleting the snapshots of the detached volume removes their layers.
    let started = Instant::now();
    delete_snapshot(&cluster, "a").await;
    delete_snapshot(&cluster, "b").await;
    let took_delete = started.elapsed();
    let layers = layers_of(&cluster, "vol").await;
    assert!(
        !layers
            .iter()
            .any(|l| l.ends_with(":a") || l.ends_with(":b") || l.ends_with(":c-clone-source")),
        "snapshot layers left: {layers:?}"
    );
    cluster.delete_volume("vol").await;
    eprintln!(
        "snapshot attached {took_attached:?}, detached {took_detached:?}; three volumes filled in {took_fill:?}; two snapshots deleted in {took_delete:?}"
    );
}
