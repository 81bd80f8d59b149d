//! Deleting a volume a workload still uses: like Kubernetes' protection of a
//! claim in use, the deletion waits until the volume is detached, and the
//! volume serves on meanwhile with all its replicas. What a foreground
//! cascade (Argo CD's default) does next, deleting the volume's engine and
//! replicas, waits too. A volume being deleted takes no new attachment.
//!
//! The volume, then its engine and replicas as a foreground cascade would
//! delete them: each says `DeletionHeld` in its conditions, the volume keeps
//! serving from both replicas with its data intact, and only once it is
//! detached do they all go, replica data too. A volume being deleted refuses
//! a new ControllerPublish.

use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use oxhorn::csi::proto::controller_client::ControllerClient;
use oxhorn::csi::proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use oxhorn::csi::proto::{ControllerPublishVolumeRequest, VolumeCapability};
use oxhorn::types::*;
use serde_json::json;
use tonic::Code;

use crate::common::*;

/// Keeps a deleted volume visible after Oxhorn let it go, so that what it
/// answers then can be asked.
const KEEP: &str = "test.oxhorn.io/keep";

fn held(conditions: &[Condition]) -> bool {
    Condition::is_true(conditions, DELETION_HELD)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_attached_volume_waits_until_it_is_detached() {
    let mut cluster = Cluster::start("held", 2).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let other = cluster.nodes[1].node_id().to_owned();
    let mut volume = Volume::new(
        "vol",
        serde_json::from_value(json!({"size": 32 * MIB, "numberOfReplicas": 2})).unwrap(),
    );
    volume.metadata.finalizers = Some(vec![KEEP.to_owned()]);
    cluster
        .api::<Volume>()
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
    let device = cluster.attach("vol", &node).await;
    let before = write_pattern(&device, 8 << 20, 1);

    // `kubectl delete`, then what a foreground cascade does next.
    let delete = DeleteParams::default();
    cluster
        .api::<Volume>()
        .delete("vol", &delete)
        .await
        .unwrap();
    let engine = cluster.engine_of("vol").await.unwrap();
    cluster
        .api::<Engine>()
        .delete(&engine.name_any(), &delete)
        .await
        .unwrap();
    let replicas = cluster.replicas_of("vol").await;
    assert_eq!(replicas.len(), 2);
    for replica in &replicas {
        cluster
            .api::<Replica>()
            .delete(&replica.name_any(), &delete)
            .await
            .unwrap();
    }
    let message = cluster
        .until("the volume, its engine and its replicas held", || async {
            let volume = cluster.volume("vol").await?.status?;
            let engine = cluster.engine_of("vol").await?.status?;
            let replicas = cluster.replicas_of("vol").await;
            let all = held(&volume.conditions)
                && held(&engine.instance.conditions)
                && replicas.len() == 2
                && replicas
                    .iter()
                    .all(|r| r.status.as_ref().is_some_and(|s| held(&s.conditions)));
            if !all {
                return None;
            }
            let condition = volume
                .conditions
                .into_iter()
                .find(|c| c.type_ == DELETION_HELD);
            condition.map(|c| c.message)
        })
        .await;
    assert!(message.contains(&node), "{message}");
    assert!(
        cluster.event_reasons().await.contains("DeletionHeld"),
        "no DeletionHeld event"
    );

    // Still serving, from both replicas: what was written reads back and
    // new writes land.
    assert_eq!(read_device(&device, before.len()), before);
    let after = write_pattern(&device, 8 << 20, 2);
    assert_eq!(read_device(&device, after.len()), after);
    let engine = cluster.engine_of("vol").await.unwrap().status.unwrap();
    let rw = engine
        .replica_mode_map
        .values()
        .filter(|m| **m == ReplicaMode::ReadWrite)
        .count();
    assert_eq!(rw, 2, "{engine:#?}");

    // Detached, it goes with everything it had; while only the test's own
    // finalizer keeps it, it takes no new attachment.
    cluster
        .patch_volume("vol", json!({"spec": {"nodeID": ""}}))
        .await;
    cluster
        .until("the engine and replicas gone", || async {
            let gone = cluster.engine_of("vol").await.is_none()
                && cluster.replicas_of("vol").await.is_empty();
            gone.then_some(())
        })
        .await;
    for replica in &replicas {
        let holder = cluster.node(&replica.spec.instance.node_id);
        let dir = replica_dir(holder, replica);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    let mut csi = ControllerClient::new(cluster.nodes[0].connect(PATIENCE).await.unwrap());
    let refused = csi
        .controller_publish_volume(publish_request("vol", &other))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("being deleted"),
        "{}",
        refused.message()
    );
    cluster
        .patch_volume("vol", json!({"metadata": {"finalizers": null}}))
        .await;
    cluster
        .until("the volume gone", || async {
            cluster.volume("vol").await.is_none().then_some(())
        })
        .await;
}

pub(crate) fn publish_request(volume: &str, node: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: access_mode::Mode::SingleNodeWriter.into(),
            }),
        }),
        ..Default::default()
    }
}
