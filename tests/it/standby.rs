//! Standby (disaster-recovery) volumes on real managers, with backups in
//! MinIO or a directory. What a user would notice:
//! - a standby follows three backups of a source volume, each restored by
//!   writing only the blocks that changed (the bytes of each step printed,
//!   a few MiB of a 64 MiB volume), a block the source zeroed zeroed too;
//!   it refuses attachment (the schema, CSI, the REST API), snapshots and
//!   backups (their objects say why, nothing is taken), and a volume cannot
//!   become a standby; activated through the REST API, it attaches and
//!   reads byte for byte as the source did at its last backup; the
//!   activation's time and data lag are printed;
//! - deleting the backup a standby holds strands nothing: the next backup
//!   is restored by comparing the replicas' blocks with it; once every
//!   replica holding it is lost too, the new ones (zeros) are neither
//!   taken for it nor activated on, and the next backup fills them whole;
//!   a standby whose only backup was deleted still activates, holding it;
//! - activation first restores a backup only its own sync finds; that
//!   restore, cut short (a block missing from the store), leaves the
//!   replicas holding a mix of two backups, and the activation waits; its
//!   manager is killed, the block comes back, and the restarted manager
//!   restores the backup again whole before the activation completes:
//!   every replica holds the backup exactly.

use std::collections::BTreeMap;

use bytes::Bytes;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use oxhorn::backup::{BLOCK_SIZE, Backupstore, NewBackup, VolumeReader};
use oxhorn::csi::proto::controller_client::ControllerClient;
use oxhorn::protocol::Connection;
use oxhorn::types::*;
use oxhorn_testbed::ObjectServerKind;
use serde_json::json;

use crate::backup::{
    BUCKET, Store, create_backup, create_target, credential_secret, delete_backup,
    until_backup_completed, until_target,
};
use crate::common::*;
use crate::rest_api::{self, Client, code, oxhorn};

const SIZE: i64 = 64 * MIB;
const BLOCK: usize = BLOCK_SIZE as usize;

/// Two nodes whose default BackupTarget is a bucket of a MinIO server.
async fn with_minio(prefix: &str) -> (Store, Cluster) {
    let store = Store::start(ObjectServerKind::Minio);
    let cluster = Cluster::start(prefix, 2).await;
    credential_secret(&cluster, "creds", &store, true).await;
    let url = store.url(BUCKET);
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "creds", "300s").await;
    until_target(&cluster, DEFAULT_BACKUP_TARGET, "Synced").await;
    (store, cluster)
}

/// Makes `name` a standby of the volume `from` (a Backup) is of.
async fn create_standby(cluster: &Cluster, name: &str, from: &str) {
    let spec = json!({"size": SIZE, "numberOfReplicas": 2, "fromBackup": from, "standby": true});
    cluster.create_volume_with(name, spec).await;
}

/// Waits until standby `name` holds `backup`, no restore under way.
async fn until_holds(cluster: &Cluster, name: &str, backup: &str) -> StandbyStatus {
    let volume = cluster
        .until_volume(name, &format!("{name} holding {backup}"), |s| {
            s.standby.as_ref().is_some_and(|s| {
                s.last_restored_backup == backup && s.applying.is_none() && s.backups_behind == 0
            })
        })
        .await;
    volume.status.unwrap().standby.unwrap()
}

/// Waits until `name` is activated; its activation.
async fn until_activated(cluster: &Cluster, name: &str) -> Activation {
    let volume = cluster
        .until_volume(name, &format!("{name} activated"), |s| {
            let activated = s.standby.as_ref().and_then(|s| s.activation.as_ref());
            activated.is_some_and(|a| a.activated_at.is_some())
                && Condition::is_true(&s.conditions, FILLED)
        })
        .await;
    let status = volume.status.unwrap();
    status.standby.unwrap().activation.unwrap()
}

/// Zeros `len` bytes `offset_mib` MiB into `device`, as a user's writes of
/// zeros would.
fn zero_at(device: &str, offset_mib: usize, len: usize) {
    dd(&[
        "if=/dev/zero",
        &format!("of={device}"),
        "bs=1M",
        &format!("count={}", len >> 20),
        &format!("seek={offset_mib}"),
        "oflag=direct",
        "conv=fsync,notrunc",
    ]);
}

/// The changes of each backup after the first: (backup, MiB offsets
/// written with a new pattern, MiB offsets zeroed), each 2 MiB long.
const STEPS: [(&str, &[usize], &[usize]); 3] = [
    ("b2", &[0, 40], &[8]),
    ("b3", &[20], &[12]),
    ("b4", &[2], &[]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_follows_three_backups_incrementally_and_activates_holding_the_newest() {
    let (_store, mut cluster) = with_minio("standby").await;
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.node_id().to_owned())
        .collect();

    cluster.create_volume("src", SIZE, 2).await;
    let device = cluster.attach("src", &nodes[0]).await;
    let mut image = vec![0; usize::try_from(SIZE).unwrap()];
    image[..16 << 20].copy_from_slice(&write_pattern(&device, 16 << 20, 1));
    create_backup(&cluster, "b1", "src").await;
    until_backup_completed(&cluster, "b1").await;

    create_standby(&cluster, "dr", "b1").await;
    let first = until_holds(&cluster, "dr", "b1").await;
    let step = first.last_step.unwrap();
    println!("standby | b1: {step:?}");
    assert_eq!(step.method, StandbyMethod::Compare, "a first restore");
    assert_eq!(step.bytes_restored, 16 * MIB, "the blocks b1 holds");
    assert_eq!(
        (first.source_volume.as_str(), first.replicas.len()),
        ("src", 2)
    );

    refusals(&mut cluster, &nodes).await;

    for (seed, (backup, written, zeroed)) in (2..).zip(STEPS) {
        for mib in written {
            let at = mib << 20;
            let data = write_pattern_at(&device, *mib, BLOCK, seed);
            image[at..at + BLOCK].copy_from_slice(&data);
        }
        for mib in zeroed {
            zero_at(&device, *mib, BLOCK);
            image[mib << 20..(mib << 20) + BLOCK].fill(0);
        }
        create_backup(&cluster, backup, "src").await;
        until_backup_completed(&cluster, backup).await;
        let held = until_holds(&cluster, "dr", backup).await;
        let step = held.last_step.unwrap();
        println!(
            "standby | {backup}: {} bytes restored ({} blocks written, {} zeroed) of a {SIZE}-byte volume, in {} ms",
            step.bytes_restored, step.blocks_written, step.blocks_zeroed, step.duration_millis
        );
        assert_eq!(step.method, StandbyMethod::Diff, "{step:?}");
        assert_eq!(step.blocks_written, written.len() as i64, "{step:?}");
        assert_eq!(step.bytes_restored, (written.len() * BLOCK) as i64);
        assert_eq!(step.blocks_zeroed, zeroed.len() as i64, "{step:?}");
        assert!(step.bytes_restored * 8 <= SIZE, "{step:?}");
        assert_eq!(held.newest_backup, backup);
    }
    let reasons = cluster.event_reasons().await;
    assert!(reasons.contains("StandbyRestored"), "{reasons:?}");

    // Activated through the REST API, by someone who may patch volumes.
    let admin = rest_api::account_with(
        &cluster,
        "dr-admin",
        &[oxhorn(&["volumes"], &["get", "patch"])],
    )
    .await;
    let api = Client::new(&cluster);
    let (status, body) = api
        .post("/v1/volumes/dr/activate", &admin, &json!({}))
        .await;
    assert_eq!(status, 202, "{body}");
    let activation = until_activated(&cluster, "dr").await;
    println!(
        "standby | activation of a {SIZE}-byte volume: {} ms (recovery time); the backup held was completed {} ms before it was asked (data lag)",
        activation.duration_millis, activation.data_lag_millis
    );
    assert_eq!(activation.backup, "b4");
    let (status, body) = api
        .post("/v1/volumes/dr/activate", &admin, &json!({}))
        .await;
    assert_eq!((status, code(&body)), (409, "conflict"), "{body}");

    // Kubernetes attaches it for a pod like any volume.
    csi_publish(&mut cluster, "dr", &nodes[1]).await.unwrap();
    let restored = cluster.attach("dr", &nodes[1]).await;
    assert!(
        read_device(&restored, image.len()) == image,
        "the activated volume differs from the source at its last backup"
    );
    assert!(read_device(&device, image.len()) == image, "the source");
    cluster
        .until_volume("dr", "both replicas in the I/O path", |s| {
            s.robustness == Robustness::Healthy
        })
        .await;
    for volume in ["dr", "src"] {
        cluster.detach(volume).await;
        cluster.delete_volume(volume).await;
    }
}

/// CSI ControllerPublishVolume of `volume` to `node`, as Kubernetes asks
/// for a pod's PersistentVolume (a static one names the volume).
async fn csi_publish(cluster: &mut Cluster, volume: &str, node: &str) -> Result<(), tonic::Status> {
    let channel = cluster.nodes[0].connect(PATIENCE).await.unwrap();
    let publish = crate::held_deletion::publish_request(volume, node);
    let mut client = ControllerClient::new(channel);
    client.controller_publish_volume(publish).await.map(drop)
}

/// What a standby refuses, and what no volume may become.
async fn refusals(cluster: &mut Cluster, nodes: &[String]) {
    let volumes = cluster.api::<Volume>();
    let refused = |result: kube::Result<Volume>, says: &str| match result {
        Err(kube::Error::Api(status)) => assert!(status.message.contains(says), "{status:?}"),
        other => panic!("accepted: {other:?}"),
    };
    let attach = json!({"spec": {"nodeID": nodes[1]}});
    let patched = volumes
        .patch("dr", &PatchParams::default(), &Patch::Merge(&attach))
        .await;
    refused(patched, "a standby volume cannot be attached");
    let become_one = json!({"spec": {"standby": true}});
    let patched = volumes
        .patch("src", &PatchParams::default(), &Patch::Merge(&become_one))
        .await;
    refused(patched, "standby can only go from true to false");
    let orphan = Volume::new(
        "orphan",
        serde_json::from_value(json!({"size": SIZE, "standby": true})).unwrap(),
    );
    let created = volumes.create(&PostParams::default(), &orphan).await;
    refused(created, "set fromBackup");

    // CSI: Kubernetes attaching it for a pod.
    let status = csi_publish(cluster, "dr", &nodes[1]).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("standby"), "{status:?}");

    // The REST API, for someone who may do all three.
    let rules = [oxhorn(
        &["volumes", "snapshots", "backups"],
        &["get", "list", "create", "patch"],
    )];
    let token = rest_api::account_with(cluster, "dr-user", &rules).await;
    let api = Client::new(cluster);
    for (path, body) in [
        ("/v1/volumes/dr/attach", json!({"node": nodes[1]})),
        ("/v1/volumes/dr/snapshots", json!({})),
        ("/v1/volumes/dr/backups", json!({})),
    ] {
        let (status, answer) = api.post(path, &token, &body).await;
        assert_eq!(
            (status, code(&answer)),
            (409, "conflict"),
            "{path}: {answer}"
        );
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains("standby"), "{path}: {message}");
    }

    // Objects made directly: each says why, and nothing is taken.
    let snapshot = Snapshot::new(
        "dr-snap",
        SnapshotSpec {
            volume: "dr".into(),
        },
    );
    cluster
        .api::<Snapshot>()
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap();
    create_backup(cluster, "dr-backup", "dr").await;
    cluster
        .until("the snapshot refused", || async {
            let status = cluster
                .api::<Snapshot>()
                .get("dr-snap")
                .await
                .ok()?
                .status?;
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            (ready.reason == "VolumeIsStandby" && !status.ready_to_use).then_some(())
        })
        .await;
    cluster
        .until("the backup refused", || async {
            let status = cluster
                .api::<Backup>()
                .get("dr-backup")
                .await
                .ok()?
                .status?;
            let refused = status
                .conditions
                .iter()
                .any(|c| c.reason == "VolumeIsStandby");
            (refused && status.state == BackupState::Error).then_some(())
        })
        .await;
    delete_backup(cluster, "dr-backup").await;
    cluster
        .api::<Snapshot>()
        .delete("dr-snap", &Default::default())
        .await
        .unwrap();
    cluster
        .until("the refused snapshot gone", || async {
            let gone = cluster
                .api::<Snapshot>()
                .get_opt("dr-snap")
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
    let standby = cluster.volume("dr").await.unwrap();
    assert_eq!(standby.spec.node_id, "", "attached after all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_whose_backup_is_deleted_compares_its_blocks_and_still_activates() {
    let (_store, cluster) = with_minio("standby-del").await;
    let node = cluster.nodes[0].node_id().to_owned();
    cluster.create_volume("src", SIZE, 1).await;
    let device = cluster.attach("src", &node).await;
    let mut image = vec![0; usize::try_from(SIZE).unwrap()];
    image[..8 << 20].copy_from_slice(&write_pattern(&device, 8 << 20, 1));
    create_backup(&cluster, "b1", "src").await;
    until_backup_completed(&cluster, "b1").await;
    create_standby(&cluster, "dr", "b1").await;
    until_holds(&cluster, "dr", "b1").await;

    // The backup it holds goes (Longhorn #7997): it keeps its data, and
    // the next backup is restored over it, block by block compared.
    delete_backup(&cluster, "b1").await;
    image[4 << 20..6 << 20].copy_from_slice(&write_pattern_at(&device, 4, BLOCK, 2));
    create_backup(&cluster, "b2", "src").await;
    until_backup_completed(&cluster, "b2").await;
    let held = until_holds(&cluster, "dr", "b2").await;
    let step = held.last_step.unwrap();
    println!("standby | b2 over the deleted b1: {step:?}");
    assert_eq!(step.method, StandbyMethod::Compare, "{step:?}");
    assert_eq!(
        (step.blocks_written, step.blocks_zeroed),
        (1, 0),
        "{step:?}"
    );

    // b2 goes, and then every replica holding it: the new replicas hold
    // zeros, which the standby neither claims to be b2 nor could activate
    // on. The next backup fills them whole.
    delete_backup(&cluster, "b2").await;
    let lost = cluster.replicas_of("dr").await;
    for replica in &lost {
        let delete = DeleteParams::default();
        let api = cluster.api::<Replica>();
        api.delete(&replica.name_any(), &delete).await.unwrap();
    }
    cluster
        .until_volume("dr", "dr refusing new replicas as holders of b2", |s| {
            s.conditions.iter().any(|c| {
                c.type_ == FILLED && c.message.contains("no running replica holds backup b2")
            })
        })
        .await;
    image[10 << 20..(10 << 20) + BLOCK].copy_from_slice(&write_pattern_at(&device, 10, BLOCK, 3));
    create_backup(&cluster, "b3", "src").await;
    until_backup_completed(&cluster, "b3").await;
    let held = until_holds(&cluster, "dr", "b3").await;
    let lost: Vec<String> = lost.iter().map(|r| r.name_any()).collect();
    assert!(
        held.replicas.iter().all(|r| !lost.contains(r)),
        "{held:?} {lost:?}"
    );
    let step = held.last_step.unwrap();
    println!("standby | b3 onto new replicas: {step:?}");
    assert_eq!(step.method, StandbyMethod::Compare, "{step:?}");
    // The 8 MiB and the block at 10 MiB: every block of b3.
    let blocks = (8 << 20) / BLOCK + 1;
    assert_eq!(step.blocks_written, blocks as i64, "{step:?}");

    // Its only backup goes too: activated, it holds that backup still.
    delete_backup(&cluster, "b3").await;
    cluster
        .patch_volume("dr", json!({"spec": {"standby": false}}))
        .await;
    let activation = until_activated(&cluster, "dr").await;
    assert_eq!(activation.backup, "b3");
    let restored = cluster.attach("dr", &node).await;
    assert!(
        read_device(&restored, image.len()) == image,
        "dr differs from b3"
    );
    for volume in ["dr", "src"] {
        cluster.detach(volume).await;
        cluster.delete_volume(volume).await;
    }
}

/// A volume in memory, backed up straight to the store.
struct Image(Vec<u8>);

impl VolumeReader for Image {
    async fn read(&self, offset: u64, len: u64) -> std::io::Result<Bytes> {
        let at = usize::try_from(offset).unwrap();
        Ok(Bytes::copy_from_slice(
            &self.0[at..at + usize::try_from(len).unwrap()],
        ))
    }
}

/// Writes backup `name` of volume `src` holding `image` into `objects`,
/// building on `previous`, whose image it changed at `changed` (MiB).
async fn back_up(
    objects: &Backupstore,
    name: &str,
    previous: Option<&str>,
    image: &[u8],
    changed: &[usize],
) {
    let ranges: Vec<std::ops::Range<u64>> = match previous {
        None => std::iter::once(0..image.len() as u64).collect(),
        Some(_) => changed
            .iter()
            .map(|m| (*m as u64) << 20..((*m as u64) << 20) + BLOCK_SIZE)
            .collect(),
    };
    let request = NewBackup {
        volume: "src",
        name,
        snapshot: name,
        size: image.len() as u64,
        previous,
        changed: &ranges,
        owner: "test",
        labels: &BTreeMap::new(),
        compression: oxhorn::backup::Compression::default(),
        progress: None,
    };
    objects
        .create(&request, &Image(image.to_vec()))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cut_short_is_done_again_whole_after_its_manager_is_killed() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let objects = oxhorn::backup::target::open(&url, "", &BTreeMap::new()).unwrap();
    let mut first = vec![0; usize::try_from(SIZE).unwrap()];
    first[..16 << 20].copy_from_slice(&pattern(16 << 20, 1));
    back_up(&objects, "b1", None, &first, &[]).await;

    let mut cluster = Cluster::start("standby-cut", 2).await;
    create_target(&cluster, DEFAULT_BACKUP_TARGET, &url, "", "0s").await;
    cluster
        .until("b1 synced", || async {
            let backup = cluster.api::<Backup>().get_opt("b1").await.unwrap()?;
            backup.status.filter(|s| s.state == BackupState::Completed)
        })
        .await;
    create_standby(&cluster, "dr", "b1").await;
    until_holds(&cluster, "dr", "b1").await;

    // b2 changes 16 blocks; its last one is missing from the store.
    let mut second = first.clone();
    let changed: Vec<usize> = (0..16).map(|b| 2 * b + 16).collect();
    second[16 << 20..48 << 20].copy_from_slice(&pattern(32 << 20, 2));
    back_up(&objects, "b2", Some("b1"), &second, &changed).await;
    let config = objects.backup("src", "b2").await.unwrap();
    let last = config.blocks.last().unwrap().clone();
    assert_eq!(last.offset, 46 << 20);
    let block_file = dir.path().join(format!(
        "volumes/src/blocks/{}/{}.blk",
        &last.checksum[..2],
        last.checksum
    ));
    let kept = std::fs::read(&block_file).unwrap();
    std::fs::remove_file(&block_file).unwrap();
    // Only the sync that activation asks for finds b2 (the target is not
    // polled): the volume restores it before it activates.
    cluster
        .patch_volume("dr", json!({"spec": {"standby": false}}))
        .await;
    cluster
        .until_volume("dr", "a restore of b2 cut short", |s| {
            let cut = s.standby.as_ref().is_some_and(|s| {
                s.last_restored_backup == "b1"
                    && s.applying.as_ref().is_some_and(|a| a.backup == "b2")
            });
            let filled = s.conditions.iter().find(|c| c.type_ == FILLED);
            cut && filled.is_some_and(|c| c.message.contains("missing"))
        })
        .await;

    // Its replicas hold a mix: b2's blocks before the missing one, b1's
    // where it is missing.
    let access = cluster.access("dr").await;
    for replica in cluster.replicas_of("dr").await {
        let status = replica.status.unwrap();
        let reader = Connection::read_only(&format!("{}:{}", status.ip, status.port), &access)
            .await
            .unwrap();
        let written = reader.read(16 << 20, BLOCK as u32).await.unwrap();
        assert!(
            written[..] == second[16 << 20..(16 << 20) + BLOCK],
            "b2's first changed block"
        );
        let missing = reader.read(46 << 20, BLOCK as u32).await.unwrap();
        assert!(
            missing[..] == first[46 << 20..(46 << 20) + BLOCK],
            "b1's data there"
        );
    }

    // Activation waits for the restore under way, whatever it takes.
    cluster
        .until_volume("dr", "the activation waiting on the restore", |s| {
            let asked = s.standby.as_ref().and_then(|s| s.activation.as_ref());
            let filled = s.conditions.iter().find(|c| c.type_ == FILLED);
            let waiting =
                filled.is_some_and(|c| c.reason == "Activating" && c.message.contains("missing"));
            asked.is_some_and(|a| a.sync_requested_at.is_some()) && waiting
        })
        .await;
    let volume = cluster.volume("dr").await.unwrap();
    assert!(
        !Condition::is_true(&volume.status.unwrap().conditions, FILLED),
        "activated on a mix"
    );

    // Its manager dies; the block comes back; the manager restarts.
    let owner = volume_owner(&cluster, "dr").await;
    cluster.node_mut(&owner).kill();
    std::fs::write(&block_file, &kept).unwrap();
    cluster
        .node_mut(&owner)
        .restart(std::path::Path::new(OXHORN))
        .unwrap();
    let activation = until_activated(&cluster, "dr").await;
    assert_eq!(activation.backup, "b2");
    let standby = cluster
        .volume("dr")
        .await
        .unwrap()
        .status
        .unwrap()
        .standby
        .unwrap();
    let step = standby.last_step.unwrap();
    assert_eq!(
        (step.backup.as_str(), step.method),
        ("b2", StandbyMethod::Diff),
        "done again whole: {step:?}"
    );
    assert_eq!(step.blocks_written, 16, "{step:?}");

    // The volume holds b2 exactly, and so does every replica: the engine
    // trusted both.
    let node = cluster.nodes[0].node_id().to_owned();
    let device = cluster.attach("dr", &node).await;
    assert!(
        read_device(&device, second.len()) == second,
        "dr differs from b3"
    );
    let engine = cluster.engine_of("dr").await.unwrap().status.unwrap();
    let modes: Vec<ReplicaMode> = engine.replica_mode_map.values().copied().collect();
    assert_eq!(modes, [ReplicaMode::ReadWrite; 2], "{engine:?}");
    let access = cluster.access("dr").await;
    for replica in cluster.replicas_of("dr").await {
        let status = replica.status.unwrap();
        let reader = Connection::read_only(&format!("{}:{}", status.ip, status.port), &access)
            .await
            .unwrap();
        for offset in (0..SIZE as u64).step_by(BLOCK) {
            let data = reader.read(offset, BLOCK as u32).await.unwrap();
            let at = offset as usize;
            assert!(
                data[..] == second[at..at + BLOCK],
                "replica {} at {offset}",
                replica.metadata.name.clone().unwrap_or_default()
            );
        }
    }
    cluster.detach("dr").await;
    cluster.delete_volume("dr").await;
}

/// The manager acting on `volume`.
async fn volume_owner(cluster: &Cluster, volume: &str) -> String {
    let volume = cluster.volume(volume).await.unwrap();
    volume.status.unwrap().owner_id
}
