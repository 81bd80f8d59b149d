//! Staging an iSCSI volume through the kernel's initiator, as on a real
//! node: NodeStage logs in with the host's iscsiadm (proving the volume's
//! CHAP credentials), formats and mounts the disk the kernel made of the
//! LUN, and NodeUnstage unmounts and logs out. It needs open-iscsi and the
//! iscsi_tcp module; on a host without them (this test machine's kernel has
//! no iSCSI initiator) it is skipped, printing why.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use oxhorn::csi::proto::node_server::Node as _;
use oxhorn::csi::proto::volume_capability::access_mode::Mode;
use oxhorn::csi::proto::volume_capability::{AccessMode, AccessType, MountVolume};
use oxhorn::csi::proto::{NodeStageVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability};
use oxhorn::csi::{NodeService, NodeServiceConfig};
use oxhorn::datastore::Datastore;
use oxhorn::host::Host;
use oxhorn::host::iscsi::Initiator;
use serde_json::json;
use tonic::Request;

use crate::common::{Cluster, init_tracing, require_root};

const VOLUME: &str = "by-kernel";
const CHAP_SECRET: &str = "by-kernel-chap";

#[tokio::test]
async fn an_iscsi_volume_stages_through_the_kernel_initiator_with_chap() {
    init_tracing();
    require_root();
    if let Err(reason) = Initiator::new(Host::default()).available().await {
        eprintln!("skipped: no iSCSI initiator on this host: {reason}");
        return;
    }
    let cluster = Cluster::start_with_instance_managers("krn", 1).await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": CHAP_SECRET},
        "type": "kubernetes.io/iscsi-chap",
        "stringData": {
            "node.session.auth.username": "kernel-initiator",
            "node.session.auth.password": "initiator-secret",
        },
    }))
    .unwrap();
    cluster
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let spec = json!({"size": 64 << 20, "numberOfReplicas": 1, "frontend": "iscsi",
                      "chapSecret": CHAP_SECRET});
    cluster.create_volume_with(VOLUME, spec).await;
    let node = cluster.nodes[0].node_id().to_owned();
    cluster.attach(VOLUME, &node).await;

    let dir = tempfile::tempdir().unwrap();
    let datastore = Arc::new(Datastore::start(&cluster.client, cluster.ns.name()));
    datastore.wait_until_ready().await;
    let config = NodeServiceConfig {
        node_id: node,
        dev_dir: dir.path().join("dev"),
        host_process: None,
        max_volumes: 7,
    };
    let svc = NodeService::new(config, datastore);
    let staging = dir.path().join("staging");
    let stage = NodeStageVolumeRequest {
        volume_id: VOLUME.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter.into(),
            }),
        }),
        ..Default::default()
    };
    let unstage = NodeUnstageVolumeRequest {
        volume_id: VOLUME.into(),
        staging_target_path: staging.display().to_string(),
    };
    // Staged twice: what the first staging wrote, the second reads back.
    let mut read = Vec::new();
    for round in 0..2 {
        let staged = svc.node_stage_volume(Request::new(stage.clone())).await;
        let done = staged.is_ok()
            && if round == 0 {
                std::fs::write(staging.join("data"), b"kept").is_ok()
            } else {
                std::fs::read(staging.join("data"))
                    .map(|data| read = data)
                    .is_ok()
            };
        // Unstaged whatever happened, so nothing outlives a failure.
        let unstaged = svc.node_unstage_volume(Request::new(unstage.clone())).await;
        staged.unwrap();
        assert!(
            done,
            "the staged filesystem could not be used in round {round}"
        );
        unstaged.unwrap();
    }
    assert_eq!(read, b"kept");
    let link = dir.path().join("dev").join(VOLUME);
    assert!(!link.exists(), "{} outlived the unstage", link.display());
    assert!(
        !is_logged_in(),
        "a session to the volume's target outlived the unstage"
    );
    cluster.detach(VOLUME).await;
    cluster.delete_volume(VOLUME).await;
}

/// Whether the host has a session with the volume's target.
fn is_logged_in() -> bool {
    let output = std::process::Command::new("iscsiadm")
        .args(["-m", "session"])
        .output()
        .unwrap();
    let target = format!("iqn.2026-01.io.oxhorn:{VOLUME}");
    String::from_utf8_lossy(&output.stdout).contains(&target)
}
