//! Validation runs against a datastore that never syncs. The real flows
//! (format, mount, bind, stats, grow) need the test control plane and a
//! loop device: they are integration tests (tests/it/csi_node.rs).

use tonic::Code;

use super::*;
use crate::csi::proto::volume_capability;

const NODE: &str = "node-1";

/// A service whose caches never sync: the API server is unreachable.
fn unsynced_service(dev_dir: &Path) -> NodeService {
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let datastore = Arc::new(Datastore::start(&client, "oxhorn-test"));
    NodeService::new(config_for(dev_dir), datastore)
}

fn config_for(dev_dir: &Path) -> NodeServiceConfig {
    NodeServiceConfig {
        node_id: NODE.into(),
        dev_dir: dev_dir.to_path_buf(),
        host_process: None,
        max_volumes: 7,
    }
}

fn mount_capability(fs_type: &str, flags: &[&str], mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(volume_capability::AccessMode { mode: mode.into() }),
    }
}

fn stage_request(volume: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn publish_request(
    volume: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, needle: &str) {
    let status = result.expect_err("the call should fail");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().contains(needle),
        "{:?} lacks {needle:?}",
        status.message()
    );
}

#[tokio::test]
async fn required_fields_are_invalid_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let svc = unsynced_service(dir.path());
    let staging = dir.path().join("staging");
    let cap = || mount_capability("", &[], Mode::SingleNodeWriter);
    let stage = |req| svc.node_stage_volume(Request::new(req));

    assert_code(
        stage(stage_request("", &staging, cap())).await,
        Code::InvalidArgument,
        "volume_id",
    );
    assert_code(
        stage(stage_request("../etc", &staging, cap())).await,
        Code::InvalidArgument,
        "volume_id",
    );
    let mut no_path = stage_request("vol", &staging, cap());
    no_path.staging_target_path.clear();
    assert_code(
        stage(no_path).await,
        Code::InvalidArgument,
        "staging_target_path",
    );
    let mut no_cap = stage_request("vol", &staging, cap());
    no_cap.volume_capability = None;
    assert_code(
        stage(no_cap).await,
        Code::InvalidArgument,
        "volume_capability",
    );
    let multi = mount_capability("", &[], Mode::MultiNodeMultiWriter);
    assert_code(
        stage(stage_request("vol", &staging, multi)).await,
        Code::InvalidArgument,
        "share manager",
    );
    let btrfs = mount_capability("btrfs", &[], Mode::SingleNodeWriter);
    assert_code(
        stage(stage_request("vol", &staging, btrfs)).await,
        Code::InvalidArgument,
        "btrfs",
    );
    let comma = mount_capability("", &["noatime,exec"], Mode::SingleNodeWriter);
    assert_code(
        stage(stage_request("vol", &staging, comma)).await,
        Code::InvalidArgument,
        "comma",
    );

    let target = dir.path().join("target");
    let mut no_staging = publish_request("vol", &staging, &target, cap(), false);
    no_staging.staging_target_path.clear();
    let published = svc.node_publish_volume(Request::new(no_staging)).await;
    assert_code(published, Code::FailedPrecondition, "staging_target_path");
    let no_target = publish_request("vol", &staging, Path::new(""), cap(), false);
    let published = svc.node_publish_volume(Request::new(no_target)).await;
    assert_code(published, Code::InvalidArgument, "target_path");

    let stats = NodeGetVolumeStatsRequest {
        volume_id: "vol".into(),
        ..Default::default()
    };
    let stats = svc.node_get_volume_stats(Request::new(stats)).await;
    assert_code(stats, Code::InvalidArgument, "volume_path");
    let expand = NodeExpandVolumeRequest {
        volume_path: "/x".into(),
        ..Default::default()
    };
    let expand = svc.node_expand_volume(Request::new(expand)).await;
    assert_code(expand, Code::InvalidArgument, "volume_id");
}

#[tokio::test]
async fn calls_needing_the_caches_are_unavailable_before_they_sync() {
    let dir = tempfile::tempdir().unwrap();
    let svc = unsynced_service(dir.path());
    let cap = mount_capability("", &[], Mode::SingleNodeWriter);
    let req = stage_request("vol", &dir.path().join("s"), cap);
    let staged = svc.node_stage_volume(Request::new(req)).await;
    assert_code(staged, Code::Unavailable, "not synced");
}

#[tokio::test]
async fn unpublish_and_unstage_of_nothing_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let svc = unsynced_service(dir.path());
    let target = dir.path().join("gone");
    let req = NodeUnpublishVolumeRequest {
        volume_id: "vol".into(),
        target_path: target.display().to_string(),
    };
    svc.node_unpublish_volume(Request::new(req)).await.unwrap();
    std::fs::create_dir(&target).unwrap();
    let req = NodeUnstageVolumeRequest {
        volume_id: "vol".into(),
        staging_target_path: target.display().to_string(),
    };
    svc.node_unstage_volume(Request::new(req)).await.unwrap();
}

#[tokio::test]
async fn a_concurrent_call_on_the_same_volume_is_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let svc = unsynced_service(dir.path());
    let _busy = svc.locks.try_lock("vol").unwrap();
    let req = NodeUnstageVolumeRequest {
        volume_id: "vol".into(),
        staging_target_path: "/nowhere".into(),
    };
    let unstaged = svc.node_unstage_volume(Request::new(req)).await;
    assert_code(unstaged, Code::Aborted, "in progress");
}

#[tokio::test]
async fn capabilities_are_what_works() {
    let dir = tempfile::tempdir().unwrap();
    let svc = unsynced_service(dir.path());
    let caps = svc
        .node_get_capabilities(Request::new(NodeGetCapabilitiesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let kinds: Vec<rpc::Type> = caps
        .iter()
        .filter_map(|c| {
            let node_service_capability::Type::Rpc(rpc) = c.r#type.as_ref()?;
            Some(rpc.r#type())
        })
        .collect();
    assert_eq!(
        kinds,
        [
            rpc::Type::StageUnstageVolume,
            rpc::Type::GetVolumeStats,
            rpc::Type::ExpandVolume,
            rpc::Type::VolumeCondition,
            rpc::Type::SingleNodeMultiWriter,
        ]
    );
}

#[test]
fn topology_has_only_the_labels_present() {
    let mut node = KubeNode::default();
    assert_eq!(topology(Some(&node)), None);
    node.metadata.labels = Some([(crate::types::ZONE_LABEL.to_string(), "z1".to_string())].into());
    let segments = topology(Some(&node)).unwrap().segments;
    assert_eq!(
        segments,
        HashMap::from([(crate::types::ZONE_LABEL.to_string(), "z1".to_string())])
    );
    assert_eq!(topology(None), None);
}
