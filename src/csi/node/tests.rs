//! Validation runs against a datastore that never syncs. The real flows
//! (format, mount, bind, stats, grow) need the test control plane and a
//! loop device: they are integration tests (tests/it/csi_node.rs). iSCSI
//! runs against a scripted iscsiadm.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Output};
use std::sync::Mutex;

use futures::future::BoxFuture;
use tonic::Code;

use super::*;
use crate::csi::proto::volume_capability;
use crate::host::HostError;

const NODE: &str = "node-1";
const IQN: &str = "iqn.2026-01.io.oxhorn:vol";

/// A service whose caches never sync: the API server is unreachable. Its
/// iscsiadm is a fake that is not installed.
fn unsynced_service(dev_dir: &Path) -> NodeService {
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let datastore = Arc::new(Datastore::start(&client, "oxhorn-test"));
    let mut svc = NodeService::new(config_for(dev_dir), datastore);
    with_iscsiadm(&mut svc, dev_dir, FakeIscsiadm::missing());
    svc
}

/// iscsiadm's answers by exit status: `--version` and anything unlisted
/// exit 0, the login/logout/delete ones with their status.
struct FakeIscsiadm {
    installed: bool,
    logout: i32,
    delete: i32,
    calls: Mutex<Vec<String>>,
}

impl FakeIscsiadm {
    fn missing() -> Arc<Self> {
        Self::answering(false, 0, 0)
    }

    fn answering(installed: bool, logout: i32, delete: i32) -> Arc<Self> {
        Arc::new(Self {
            installed,
            logout,
            delete,
            calls: Mutex::new(Vec::new()),
        })
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl HostCommands for FakeIscsiadm {
    fn output<'a>(
        &'a self,
        program: &'a str,
        args: &'a [String],
    ) -> BoxFuture<'a, crate::host::Result<Output>> {
        self.calls.lock().unwrap().push(args.join(" "));
        let code = match args.last().map(String::as_str) {
            Some("--logout") => self.logout,
            Some("delete") => self.delete,
            _ => 0,
        };
        let answer = if self.installed {
            Ok(Output {
                status: ExitStatus::from_raw(code << 8),
                stdout: Vec::new(),
                stderr: format!("iscsiadm: exit {code}").into_bytes(),
            })
        } else {
            Err(HostError::MissingProgram {
                program: program.to_owned(),
                source: std::io::ErrorKind::NotFound.into(),
            })
        };
        Box::pin(async move { answer })
    }
}

/// Gives `svc` the scripted iscsiadm, by-path links under
/// `<dir>/by-path`, the iscsi_tcp module when `<dir>/iscsi_tcp` exists,
/// and short waits.
fn with_iscsiadm(svc: &mut NodeService, dir: &Path, fake: Arc<FakeIscsiadm>) {
    let runner: Arc<dyn HostCommands> = fake;
    svc.initiator = Initiator::new(runner)
        .with_by_path_dir(dir.join("by-path"))
        .with_transport_module(dir.join("iscsi_tcp"))
        .with_device_wait(Duration::from_millis(200));
    svc.device_wait = Duration::from_millis(200);
}

/// An unsynced service whose iscsiadm is `fake`.
fn scripted_service(dir: &Path, fake: &Arc<FakeIscsiadm>) -> NodeService {
    let mut svc = unsynced_service(dir);
    with_iscsiadm(&mut svc, dir, Arc::clone(fake));
    svc
}

fn iscsi_volume(attached_to: &str) -> Volume {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "oxhorn.io/v1beta1",
        "kind": "Volume",
        "metadata": {"name": "vol", "namespace": "oxhorn-test"},
        "spec": {"size": 4096, "frontend": "iscsi", "nodeID": attached_to},
    }))
    .unwrap()
}

fn unstage_request(volume: &str, staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
    }
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

#[tokio::test]
async fn an_iscsi_volume_on_a_node_without_an_initiator_is_a_failed_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::answering(true, 0, 0);
    let svc = scripted_service(dir.path(), &fake);
    let err = svc.attach_iscsi(&iscsi_volume(NODE)).await.unwrap_err();
    let status = Status::from(err);
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    for needle in ["volume vol uses the iSCSI frontend", "node-1", "iscsi_tcp"] {
        assert!(
            status.message().contains(needle),
            "{status:?} lacks {needle:?}"
        );
    }
    // Without iscsiadm, the reason says what to install.
    let status = Status::from(
        unsynced_service(dir.path())
            .attach_iscsi(&iscsi_volume(NODE))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("open-iscsi"), "{status:?}");
    assert_eq!(fake.calls(), ["--version"]);
}

#[tokio::test]
async fn an_iscsi_volume_attached_elsewhere_is_not_logged_into() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("iscsi_tcp")).unwrap();
    let fake = FakeIscsiadm::answering(true, 0, 0);
    let svc = scripted_service(dir.path(), &fake);
    let status = Status::from(svc.attach_iscsi(&iscsi_volume("node-2")).await.unwrap_err());
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("not attached to node node-1"),
        "{status:?}"
    );
    assert_eq!(fake.calls(), ["--version"]);
}

#[tokio::test]
async fn an_engine_without_an_iscsi_endpoint_is_unavailable_after_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("iscsi_tcp")).unwrap();
    let fake = FakeIscsiadm::answering(true, 0, 0);
    let svc = scripted_service(dir.path(), &fake);
    let status = Status::from(svc.attach_iscsi(&iscsi_volume(NODE)).await.unwrap_err());
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("serves no iSCSI target"),
        "{status:?}"
    );
    assert_eq!(fake.calls(), ["--version"]);
}

#[tokio::test]
async fn unstage_of_a_gone_volume_logs_out_of_the_target_named_by_its_id() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("iscsi_tcp")).unwrap();
    // Logged out and deleted already: a repeated unstage.
    let fake = FakeIscsiadm::answering(true, 21, 21);
    let svc = scripted_service(dir.path(), &fake);
    let staging = dir.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    let unstaged = svc.node_unstage_volume(Request::new(unstage_request("vol", &staging)));
    unstaged.await.unwrap();
    assert_eq!(
        fake.calls(),
        [
            "--version".to_owned(),
            format!("-m node -T {IQN} --logout"),
            format!("-m node -T {IQN} -o delete"),
        ]
    );
}

#[tokio::test]
async fn unstage_logs_out_and_removes_the_iscsi_link_only() {
    let dir = tempfile::tempdir().unwrap();
    // No iscsi_tcp module here now: the link alone says a login was made.
    let fake = FakeIscsiadm::answering(true, 0, 0);
    let svc = scripted_service(dir.path(), &fake);
    let disk = dir
        .path()
        .join(format!("by-path/ip-10.0.0.7:3260-iscsi-{IQN}-lun-1"));
    std::os::unix::fs::symlink(&disk, dir.path().join("vol")).unwrap();
    std::os::unix::fs::symlink("/dev/loop3", dir.path().join("other")).unwrap();
    let staging = dir.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    svc.node_unstage_volume(Request::new(unstage_request("vol", &staging)))
        .await
        .unwrap();
    assert!(std::fs::symlink_metadata(dir.path().join("vol")).is_err());
    assert_eq!(
        fake.calls(),
        [
            format!("-m node -T {IQN} --logout"),
            format!("-m node -T {IQN} -o delete"),
        ]
    );
    // Another volume's FUSE link is no iSCSI attachment: nothing runs.
    svc.node_unstage_volume(Request::new(unstage_request("other", &staging)))
        .await
        .unwrap();
    assert!(std::fs::symlink_metadata(dir.path().join("other")).is_ok());
    assert_eq!(fake.calls().len(), 3, "{:?}", fake.calls());
}

#[tokio::test]
async fn a_failed_logout_fails_the_unstage_and_keeps_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeIscsiadm::answering(true, 10, 0);
    let svc = scripted_service(dir.path(), &fake);
    let disk = dir
        .path()
        .join(format!("by-path/ip-10.0.0.7:3260-iscsi-{IQN}-lun-1"));
    std::os::unix::fs::symlink(&disk, dir.path().join("vol")).unwrap();
    let staging = dir.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    let unstaged = svc
        .node_unstage_volume(Request::new(unstage_request("vol", &staging)))
        .await;
    assert_code(unstaged, Code::Internal, "ISCSI_ERR_LOGOUT");
    // Kept, so the retry knows to log out.
    assert!(std::fs::symlink_metadata(dir.path().join("vol")).is_ok());
}
