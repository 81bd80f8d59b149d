//! The CSI Controller service of a real three-node cluster, for what
//! csi-sanity does not check: a second call for a busy volume is ABORTED, a
//! volume that cannot be placed says why, and an attached volume or one with
//! snapshots is not deleted.

use std::collections::HashMap;

use oxhorn::csi::proto::controller_client::ControllerClient;
use oxhorn::csi::proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use oxhorn::csi::proto::*;
use oxhorn::types::Volume;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::{Cluster, MIB, PATIENCE, require_root};

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter.into(),
        }),
    }
}

fn create_request(name: &str, bytes: i64, replicas: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        parameters: HashMap::from([("numberOfReplicas".into(), replicas.into())]),
        ..Default::default()
    }
}

fn publish_request(volume: &str, node: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(capability()),
        ..Default::default()
    }
}

async fn created_id(csi: &mut ControllerClient<Channel>, request: CreateVolumeRequest) -> String {
    let response = csi.create_volume(request).await.unwrap().into_inner();
    response.volume.unwrap().volume_id
}

async fn controller(cluster: &mut Cluster) -> ControllerClient<Channel> {
    let channel = cluster.nodes[0].connect(PATIENCE).await.unwrap();
    ControllerClient::new(channel)
}

#[tokio::test]
async fn busy_volumes_abort_unplaceable_ones_say_why_and_in_use_ones_stay() {
    require_root();
    let mut cluster = Cluster::start("csictl", 3).await;
    let mut csi = controller(&mut cluster).await;
    let node = cluster.nodes[0].node_id().to_owned();

    let created = csi
        .create_volume(create_request("busy", 64 * MIB, "2"))
        .await
        .unwrap()
        .into_inner();
    let id = created.volume.unwrap().volume_id;

    // The first publish takes the volume's guard, sets the volume's node and
    // waits for the engine to start there; a second call for the volume
    // meanwhile is refused, not queued behind it.
    let mut first = csi.clone();
    let first_request = publish_request(&id, &node);
    let publishing =
        tokio::spawn(async move { first.controller_publish_volume(first_request).await });
    let volumes = cluster.api::<Volume>();
    cluster
        .until("the first publish to set the volume's node", || async {
            let volume = volumes.get(&id).await.ok()?;
            (volume.spec.node_id == node).then_some(())
        })
        .await;
    let second = csi
        .controller_publish_volume(publish_request(&id, &node))
        .await
        .expect_err("the second publish went through: the first had finished before it");
    assert_eq!(second.code(), Code::Aborted, "{second:?}");
    assert!(second.message().contains(&id), "{}", second.message());
    publishing
        .await
        .unwrap()
        .expect("the first publish attaches");
    let volume: Volume = cluster.api().get(&id).await.unwrap();
    assert_eq!(volume.status.unwrap().current_node_id, node);

    // Attached, and with a snapshot: both keep the volume.
    let deleting = DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    };
    let attached = csi.delete_volume(deleting.clone()).await.unwrap_err();
    assert_eq!(attached.code(), Code::FailedPrecondition, "{attached:?}");
    assert!(attached.message().contains(&node), "{}", attached.message());
    csi.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
        volume_id: id.clone(),
        node_id: node.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let snapshot = csi
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: "keep".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let has_snapshot = csi.delete_volume(deleting.clone()).await.unwrap_err();
    assert_eq!(has_snapshot.code(), Code::FailedPrecondition);
    assert!(
        has_snapshot.message().contains("keep"),
        "{}",
        has_snapshot.message()
    );
    csi.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: snapshot.snapshot_id,
        ..Default::default()
    })
    .await
    .unwrap();
    csi.delete_volume(deleting).await.unwrap();
    assert!(cluster.volume(&id).await.is_none());

    // Four replicas on three nodes: the scheduler's reason, and the volume
    // stays so that a retry succeeds once the cluster has room.
    let crowded = csi
        .create_volume(create_request("crowded", 16 * MIB, "4"))
        .await
        .unwrap_err();
    assert_eq!(crowded.code(), Code::ResourceExhausted, "{crowded:?}");
    assert!(
        crowded.message().contains("ReplicaAntiAffinity"),
        "{}",
        crowded.message()
    );
    assert!(cluster.volume("crowded").await.is_some());
    cluster.delete_volume("crowded").await;
}

/// A CO that deletes a clone before it is filled (csi-sanity does, in its
/// cleanup) and then the source: the clone takes the snapshot it was made
/// through with it, so the source is not held back by that snapshot.
#[tokio::test]
async fn a_clone_deleted_before_its_source_lets_the_source_go() {
    let mut cluster = Cluster::start("csiclone", 2).await;
    let mut csi = controller(&mut cluster).await;
    let source = created_id(&mut csi, create_request("origin", 16 * MIB, "2")).await;
    let mut cloning = create_request("copy", 16 * MIB, "2");
    cloning.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: source.clone(),
            },
        )),
    });
    let clone = created_id(&mut csi, cloning).await;
    for volume_id in [clone, source.clone()] {
        csi.delete_volume(DeleteVolumeRequest {
            volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(cluster.volume(&source).await.is_none());
}
