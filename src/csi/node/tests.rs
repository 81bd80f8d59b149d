//! Validation runs against a datastore that never syncs; the real flows
//! (format, mount, bind, stats, grow) run against the test control plane and
//! a loop device, as root, and skip otherwise.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::Duration;

use kube::api::{Api, PostParams};
use serde_json::json;
use tonic::Code;

use super::*;
use crate::csi::proto::CapacityRange;
use crate::csi::proto::volume_capability::{self, BlockVolume};
use crate::csi::proto::volume_usage::Unit;
use crate::frontend::loopdev::LoopDevice;
use crate::host::filesystem;
use crate::testbed::{self, TestNamespace};

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
        host_proc: None,
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

fn block_capability(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
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

/// A volume's block device for a test: a sparse file on a loop device,
/// linked from the service's dev_dir. Drop releases every mount and the
/// device, also when the test fails.
struct TestDevice {
    dir: tempfile::TempDir,
    backing: PathBuf,
    device: Option<LoopDevice>,
}

impl TestDevice {
    fn new(volume: &str, size: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("backing.img");
        let file = std::fs::File::create(&backing).unwrap();
        file.set_len(size).unwrap();
        let device = LoopDevice::attach(&file, &backing, 512, false).unwrap();
        std::fs::create_dir(dir.path().join("dev")).unwrap();
        std::os::unix::fs::symlink(device.path(), dir.path().join("dev").join(volume)).unwrap();
        Self {
            dir,
            backing,
            device: Some(device),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Grows the volume as the engine does: the file, then the device.
    fn grow(&self, size: u64) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.backing)
            .unwrap();
        file.set_len(size).unwrap();
        self.device.as_ref().unwrap().refresh_capacity().unwrap();
    }
}

impl Drop for TestDevice {
    fn drop(&mut self) {
        for mount in testbed::mounts_under(self.dir.path()) {
            let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(device) = self.device.take() {
            let _ = device.detach(Duration::from_secs(5));
        }
    }
}

/// The service over a synced datastore holding `volume`, attached to this
/// node. None when not root (mounts and loop devices need it).
async fn synced_service(volume: &str, dev: &TestDevice) -> Option<(NodeService, TestNamespace)> {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: needs root");
        return None;
    }
    let control_plane = testbed::shared();
    let ns = TestNamespace::create(control_plane, "csi-node")
        .await
        .unwrap();
    let client = control_plane.client().unwrap();
    let spec = json!({"size": 64 << 20, "numberOfReplicas": 1, "nodeID": NODE});
    let object = Volume::new(volume, serde_json::from_value(spec).unwrap());
    Api::<Volume>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let datastore = Arc::new(Datastore::start(&client, ns.name()));
    datastore.wait_until_ready().await;
    let key = ObjectRef::new(volume).within(ns.name());
    while datastore.volumes.store.get(&key).is_none() {
        sleep(POLL).await;
    }
    Some((
        NodeService::new(config_for(&dev.path("dev")), datastore),
        ns,
    ))
}

fn is_mount(path: &Path) -> bool {
    Host::default().mount_at(path).unwrap().is_some()
}

#[tokio::test]
async fn an_ext4_volume_is_formatted_staged_published_measured_and_released() {
    let dev = TestDevice::new("vol-ext4", 64 << 20);
    let Some((svc, _ns)) = synced_service("vol-ext4", &dev).await else {
        return;
    };
    let (staging, rw, ro) = (dev.path("staging"), dev.path("pod-rw"), dev.path("pod-ro"));
    let cap = || mount_capability("", &["noatime"], Mode::SingleNodeWriter);
    let stage = stage_request("vol-ext4", &staging, cap());
    svc.node_stage_volume(Request::new(stage.clone()))
        .await
        .unwrap();
    svc.node_stage_volume(Request::new(stage)).await.unwrap();
    let entry = Host::default().mount_at(&staging).unwrap().unwrap();
    assert_eq!(entry.fs_type, "ext4");
    assert!(entry.options.contains("noatime"), "{}", entry.options);

    let publish = publish_request("vol-ext4", &staging, &rw, cap(), false);
    svc.node_publish_volume(Request::new(publish.clone()))
        .await
        .unwrap();
    svc.node_publish_volume(Request::new(publish))
        .await
        .unwrap();
    std::fs::write(rw.join("data"), b"kept").unwrap();
    assert_eq!(std::fs::read(staging.join("data")).unwrap(), b"kept");
    let readonly_again = publish_request("vol-ext4", &staging, &rw, cap(), true);
    let clash = svc.node_publish_volume(Request::new(readonly_again)).await;
    assert_code(clash, Code::AlreadyExists, "read-write");
    let publish_ro = publish_request("vol-ext4", &staging, &ro, cap(), true);
    svc.node_publish_volume(Request::new(publish_ro))
        .await
        .unwrap();
    let denied = std::fs::write(ro.join("other"), b"x").unwrap_err();
    assert_eq!(denied.raw_os_error(), Some(nix::libc::EROFS));

    let stats = NodeGetVolumeStatsRequest {
        volume_id: "vol-ext4".into(),
        volume_path: rw.display().to_string(),
        ..Default::default()
    };
    let stats = svc
        .node_get_volume_stats(Request::new(stats))
        .await
        .unwrap()
        .into_inner();
    let (bytes, inodes) = (&stats.usage[0], &stats.usage[1]);
    assert_eq!((bytes.unit(), inodes.unit()), (Unit::Bytes, Unit::Inodes));
    assert!(
        bytes.total > 50 << 20 && bytes.used > 0 && bytes.available > 0,
        "{bytes:?}"
    );
    assert!(inodes.total > 0 && inodes.used > 0, "{inodes:?}");
    assert!(!stats.volume_condition.unwrap().abnormal);
    let elsewhere = NodeGetVolumeStatsRequest {
        volume_id: "vol-ext4".into(),
        volume_path: dev.path("dev").display().to_string(),
        ..Default::default()
    };
    let elsewhere = svc.node_get_volume_stats(Request::new(elsewhere)).await;
    assert_code(elsewhere, Code::NotFound, "not a mount");

    expand_ext4(&svc, &dev, &rw).await;

    for target in [&rw, &ro] {
        let req = NodeUnpublishVolumeRequest {
            volume_id: "vol-ext4".into(),
            target_path: target.display().to_string(),
        };
        svc.node_unpublish_volume(Request::new(req.clone()))
            .await
            .unwrap();
        svc.node_unpublish_volume(Request::new(req)).await.unwrap();
        assert!(!target.exists());
    }
    let unstage = NodeUnstageVolumeRequest {
        volume_id: "vol-ext4".into(),
        staging_target_path: staging.display().to_string(),
    };
    svc.node_unstage_volume(Request::new(unstage.clone()))
        .await
        .unwrap();
    svc.node_unstage_volume(Request::new(unstage))
        .await
        .unwrap();
    assert!(!is_mount(&staging));

    // The filesystem is ext4 now: asking for xfs must not reformat it.
    let xfs = stage_request(
        "vol-ext4",
        &staging,
        mount_capability("xfs", &[], Mode::SingleNodeWriter),
    );
    let refused = svc.node_stage_volume(Request::new(xfs)).await;
    assert_code(refused, Code::FailedPrecondition, "not reformatted");
}

/// Online ext4 growth needs CAP_SYS_RESOURCE: where we have it the
/// filesystem must grow; where not, the error must say why, not pretend.
async fn expand_ext4(svc: &NodeService, dev: &TestDevice, path: &Path) {
    let before = filesystem::usage(path).unwrap().bytes_total;
    dev.grow(128 << 20);
    let req = NodeExpandVolumeRequest {
        volume_id: "vol-ext4".into(),
        volume_path: path.display().to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: 128 << 20,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    match svc.node_expand_volume(Request::new(req)).await {
        Ok(response) => {
            assert_eq!(response.into_inner().capacity_bytes, 128 << 20);
            assert!(filesystem::usage(path).unwrap().bytes_total > before);
        }
        Err(status) => {
            assert_eq!(status.code(), Code::Internal);
            assert!(
                status.message().contains("CAP_SYS_RESOURCE"),
                "{}",
                status.message()
            );
        }
    }
}

#[tokio::test]
async fn an_xfs_volume_grows_online() {
    let dev = TestDevice::new("vol-xfs", 320 << 20);
    let Some((svc, _ns)) = synced_service("vol-xfs", &dev).await else {
        return;
    };
    let staging = dev.path("staging");
    let cap = mount_capability("xfs", &[], Mode::SingleNodeSingleWriter);
    svc.node_stage_volume(Request::new(stage_request(
        "vol-xfs",
        &staging,
        cap.clone(),
    )))
    .await
    .unwrap();
    let target = dev.path("pod");
    let publish = publish_request("vol-xfs", &staging, &target, cap.clone(), false);
    svc.node_publish_volume(Request::new(publish))
        .await
        .unwrap();
    let second = publish_request("vol-xfs", &staging, &dev.path("pod-2"), cap, false);
    let refused = svc.node_publish_volume(Request::new(second)).await;
    assert_code(
        refused,
        Code::FailedPrecondition,
        "SINGLE_NODE_SINGLE_WRITER",
    );

    let before = filesystem::usage(&target).unwrap().bytes_total;
    dev.grow(640 << 20);
    let req = NodeExpandVolumeRequest {
        volume_id: "vol-xfs".into(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    let grown = svc
        .node_expand_volume(Request::new(req))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 640 << 20);
    assert!(filesystem::usage(&target).unwrap().bytes_total > before + (256 << 20));
}

#[tokio::test]
async fn a_block_volume_is_published_as_its_device() {
    let dev = TestDevice::new("vol-block", 16 << 20);
    let Some((svc, _ns)) = synced_service("vol-block", &dev).await else {
        return;
    };
    let (staging, target) = (dev.path("staging"), dev.path("pods/block"));
    let cap = block_capability(Mode::SingleNodeWriter);
    svc.node_stage_volume(Request::new(stage_request(
        "vol-block",
        &staging,
        cap.clone(),
    )))
    .await
    .unwrap();
    let publish = publish_request("vol-block", &staging, &target, cap, false);
    svc.node_publish_volume(Request::new(publish.clone()))
        .await
        .unwrap();
    svc.node_publish_volume(Request::new(publish))
        .await
        .unwrap();
    let meta = std::fs::metadata(&target).unwrap();
    assert!(meta.file_type().is_block_device());
    let device = dev.device.as_ref().unwrap().path();
    assert_eq!(meta.rdev(), std::fs::metadata(device).unwrap().rdev());

    let stats = NodeGetVolumeStatsRequest {
        volume_id: "vol-block".into(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    let stats = svc
        .node_get_volume_stats(Request::new(stats))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage.len(), 1);
    assert_eq!(stats.usage[0].total, 16 << 20);

    let req = NodeUnpublishVolumeRequest {
        volume_id: "vol-block".into(),
        target_path: target.display().to_string(),
    };
    svc.node_unpublish_volume(Request::new(req)).await.unwrap();
    assert!(!target.exists());
}
