//! CSI Node: makes an attached volume's block device usable by pods on this
//! node. Staging formats (if blank) and mounts the device at a per-volume
//! staging path; publishing bind-mounts that (or, for block access, the
//! device node itself) at each pod's target path.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::runtime::reflector::ObjectRef;
use tokio::time::{Instant, sleep, timeout};
use tonic::{Request, Response, Status};
use tracing::info;

use super::error::NodeError;
use super::guard::VolumeLocks;
use super::proto::node_server::Node;
use super::proto::node_service_capability::{self, rpc};
use super::proto::volume_capability::access_mode::Mode;
use super::proto::volume_capability::{AccessType, MountVolume};
use super::proto::volume_usage::Unit;
use super::proto::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, Topology, VolumeCapability,
    VolumeCondition, VolumeUsage,
};
use super::traced::traced;
use crate::datastore::Datastore;
use crate::host::device::{self, DeviceNumber};
use crate::host::filesystem::{self, Content, FsType};
use crate::host::mount::{self, MountOptions};
use crate::host::{Host, HostError};
use crate::types::{Robustness, Volume};

/// How long staging waits for the engine to publish the volume's device.
const DEVICE_WAIT: Duration = Duration::from_secs(30);
/// How long expansion waits for the device to take the volume's new size.
const GROW_WAIT: Duration = Duration::from_secs(30);
/// How long a call waits for the caches' first sync before UNAVAILABLE.
const READY_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(200);
/// The filesystem made on a blank volume when the request names none.
const DEFAULT_FS: FsType = FsType::Ext4;
/// The volume_context key a StorageClass's filesystem type arrives in.
const FS_TYPE_KEY: &str = "fsType";

pub struct NodeServiceConfig {
    pub node_id: String,
    /// where engines publish `<dev_dir>/<volume>` symlinks to the volume's block device (a loop device)
    pub dev_dir: PathBuf,
    /// host's /proc: when Some, host commands run in the host's mount and network namespaces
    pub host_proc: Option<PathBuf>,
    /// NodeGetInfo max_volumes_per_node; 0 = not set
    pub max_volumes: i64,
}

pub struct NodeService {
    config: NodeServiceConfig,
    datastore: Arc<Datastore>,
    host: Host,
    locks: VolumeLocks,
}

type NodeResult<T> = Result<T, NodeError>;

/// How a request wants the volume: as a block device or a filesystem.
#[derive(Debug)]
enum Access {
    Block,
    Mount {
        /// Empty when the request leaves it to the volume context or default.
        fs_type: String,
        options: MountOptions,
    },
}

/// A validated volume capability.
#[derive(Debug)]
struct Capability {
    access: Access,
    mode: Mode,
}

impl Capability {
    fn read_only(&self) -> bool {
        self.mode == Mode::SingleNodeReaderOnly
    }
}

fn invalid(message: impl Into<String>) -> NodeError {
    NodeError::InvalidArgument(message.into())
}

fn required_volume_id(volume_id: &str) -> NodeResult<()> {
    if volume_id.is_empty() {
        return Err(invalid("volume_id is required"));
    }
    // The id becomes a path component (<dev_dir>/<volume_id>).
    crate::names::validate_dns_subdomain("volume_id", volume_id).map_err(NodeError::InvalidArgument)
}

/// A volume_path names where a volume is already published: one that is not
/// absolute cannot be, so the volume is not found there (csi-sanity agrees).
fn volume_path(path: &str) -> NodeResult<&Path> {
    if !path.is_empty() && !Path::new(path).is_absolute() {
        return Err(NodeError::NotFound(format!(
            "no volume is published at the relative path {path:?}"
        )));
    }
    required_path("volume_path", path)
}

fn required_path<'a>(field: &str, path: &'a str) -> NodeResult<&'a Path> {
    if path.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "{field} {path:?} must be an absolute path"
        )));
    }
    Ok(path)
}

fn parse_capability(capability: Option<&VolumeCapability>) -> NodeResult<Capability> {
    let capability = capability.ok_or_else(|| invalid("volume_capability is required"))?;
    super::capability::check(capability).map_err(invalid)?;
    let mode = capability
        .access_mode
        .as_ref()
        .map_or(Mode::Unknown, |m| m.mode());
    let access = match &capability.access_type {
        Some(AccessType::Mount(mount)) => parse_mount(mount)?,
        // None was refused by check().
        Some(AccessType::Block(_)) | None => Access::Block,
    };
    Ok(Capability { access, mode })
}

fn parse_mount(mount: &MountVolume) -> NodeResult<Access> {
    if !mount.volume_mount_group.is_empty() {
        return Err(invalid("volume_mount_group is not supported"));
    }
    let options = MountOptions::parse(&mount.mount_flags).map_err(|e| invalid(e.to_string()))?;
    Ok(Access::Mount {
        fs_type: mount.fs_type.clone(),
        options,
    })
}

/// The filesystem to make on a blank volume: the capability's, else the
/// volume context's, else the default.
fn wanted_fs(fs_type: &str, context: &HashMap<String, String>) -> NodeResult<Option<FsType>> {
    let named = Some(fs_type)
        .filter(|t| !t.is_empty())
        .or_else(|| context.get(FS_TYPE_KEY).map(String::as_str));
    named
        .map(|name| FsType::parse(name).map_err(|e| invalid(e.to_string())))
        .transpose()
}

impl NodeService {
    pub fn new(config: NodeServiceConfig, datastore: Arc<Datastore>) -> Self {
        let host = Host::new(config.host_proc.clone());
        Self {
            config,
            datastore,
            host,
            locks: VolumeLocks::new(),
        }
    }

    /// Waits briefly for the caches' first sync: before it, a missing volume
    /// may only be missing from the cache.
    async fn ready(&self) -> NodeResult<()> {
        timeout(READY_WAIT, self.datastore.wait_until_ready())
            .await
            .map_err(|_| NodeError::Unavailable("the plugin's caches are not synced yet".into()))
    }

    async fn volume(&self, volume_id: &str) -> NodeResult<Arc<Volume>> {
        self.ready().await?;
        let key = ObjectRef::new(volume_id).within(&self.datastore.namespace);
        self.datastore
            .volumes
            .store
            .get(&key)
            .ok_or_else(|| NodeError::NotFound(format!("volume {volume_id} does not exist")))
    }

    fn device_link(&self, volume_id: &str) -> PathBuf {
        self.config.dev_dir.join(volume_id)
    }

    /// The block device the volume's link points at now, if it does.
    fn current_device(&self, volume_id: &str) -> Option<(PathBuf, DeviceNumber)> {
        let device = fs::canonicalize(self.device_link(volume_id)).ok()?;
        let number = device::block_device_number(&device).ok()??;
        Some((device, number))
    }

    /// Waits for the engine to publish the volume's device on this node.
    async fn wait_for_device(&self, volume: &Volume) -> NodeResult<(PathBuf, DeviceNumber)> {
        let volume_id = volume.metadata.name.as_deref().unwrap_or_default();
        let deadline = Instant::now() + DEVICE_WAIT;
        loop {
            if let Some(found) = self.current_device(volume_id) {
                return Ok(found);
            }
            if Instant::now() >= deadline {
                return Err(self.device_missing(volume_id));
            }
            sleep(POLL).await;
        }
    }

    /// Not attached here is the CO's mistake; attached but no device yet is
    /// worth a retry.
    fn device_missing(&self, volume_id: &str) -> NodeError {
        let link = self.device_link(volume_id);
        let volume = self
            .datastore
            .volumes
            .store
            .get(&ObjectRef::new(volume_id).within(&self.datastore.namespace));
        let attached_to = volume.map(|v| v.spec.node_id.clone()).unwrap_or_default();
        if attached_to != self.config.node_id {
            return NodeError::FailedPrecondition(format!(
                "volume {volume_id} is not attached to node {} (it is to {attached_to:?}): \
                 ControllerPublishVolume first",
                self.config.node_id
            ));
        }
        NodeError::Unavailable(format!(
            "the device of volume {volume_id} did not appear at {} within {}s",
            link.display(),
            DEVICE_WAIT.as_secs()
        ))
    }
}

/// Staging: the volume's filesystem mounted at the staging path.
impl NodeService {
    async fn stage(&self, req: &NodeStageVolumeRequest) -> NodeResult<()> {
        required_volume_id(&req.volume_id)?;
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let capability = parse_capability(req.volume_capability.as_ref())?;
        let volume = self.volume(&req.volume_id).await?;
        let _guard = self.locks.try_lock(&req.volume_id)?;
        let (device, number) = self.wait_for_device(&volume).await?;
        let read_only = capability.read_only();
        let Access::Mount { fs_type, options } = capability.access else {
            // Block access: the device itself is published; nothing to stage.
            return Ok(());
        };
        if let Some(existing) = self.host.mount_at(staging)? {
            return if existing.device == number && existing.root == Path::new("/") {
                Ok(())
            } else {
                Err(NodeError::AlreadyExists(format!(
                    "{} already has {} mounted, not volume {}",
                    staging.display(),
                    existing.source,
                    req.volume_id
                )))
            };
        }
        let fs = self
            .filesystem_for(&device, wanted_fs(&fs_type, &req.volume_context)?)
            .await?;
        let mut options = options.or_read_only(read_only);
        if fs == FsType::Xfs && !options.data.iter().any(|o| o == "nouuid") {
            // A restore or clone carries its source's XFS UUID, and XFS
            // refuses a second mount of one UUID on a node.
            options.data.push("nouuid".to_owned());
        }
        fs::create_dir_all(staging).map_err(|e| HostError::io("creating", staging, e))?;
        mount::mount_filesystem(&device, staging, fs.name(), &options).await?;
        info!(device = %device.display(), %fs, "staged");
        Ok(())
    }

    /// The filesystem on `device`, made first if the device is blank. An
    /// existing one of another kind is an error, never reformatted.
    async fn filesystem_for(&self, device: &Path, wanted: Option<FsType>) -> NodeResult<FsType> {
        match self.host.probe(device).await? {
            Content::Empty => {
                let fs = wanted.unwrap_or(DEFAULT_FS);
                info!(device = %device.display(), %fs, "formatting a blank volume");
                self.host.format(device, fs).await?;
                Ok(fs)
            }
            Content::Filesystem(found) => match (FsType::parse(&found), wanted) {
                (Ok(fs), None) => Ok(fs),
                (Ok(fs), Some(wanted)) if fs == wanted => Ok(fs),
                _ => Err(NodeError::FailedPrecondition(format!(
                    "{} holds a {found} filesystem, not {}; it is not reformatted",
                    device.display(),
                    wanted.map_or("ext4 or xfs", FsType::name)
                ))),
            },
            Content::Other(what) => Err(NodeError::FailedPrecondition(format!(
                "{} holds {what}; it is not formatted",
                device.display()
            ))),
        }
    }

    async fn unstage(&self, req: &NodeUnstageVolumeRequest) -> NodeResult<()> {
        required_volume_id(&req.volume_id)?;
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let _guard = self.locks.try_lock(&req.volume_id)?;
        // kubelet made the staging directory and removes it itself.
        self.unmount_all(staging).await?;
        Ok(())
    }

    /// Unmounts whatever is mounted at `path`, stacked mounts included.
    async fn unmount_all(&self, path: &Path) -> NodeResult<()> {
        while self.host.mount_at(path)?.is_some() {
            mount::unmount(path).await?;
            info!(path = %path.display(), "unmounted");
        }
        Ok(())
    }
}

/// Publishing: the staged filesystem, or the device, at a pod's target path.
impl NodeService {
    async fn publish(&self, req: &NodePublishVolumeRequest) -> NodeResult<()> {
        required_volume_id(&req.volume_id)?;
        let target = required_path("target_path", &req.target_path)?;
        let capability = parse_capability(req.volume_capability.as_ref())?;
        if req.staging_target_path.is_empty() {
            return Err(NodeError::FailedPrecondition(
                "staging_target_path is required: the plugin stages volumes".into(),
            ));
        }
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let volume = self.volume(&req.volume_id).await?;
        let _guard = self.locks.try_lock(&req.volume_id)?;
        let (device, number) = self.wait_for_device(&volume).await?;
        let read_only = req.readonly || capability.read_only();
        let (source, options) = match &capability.access {
            Access::Block => (device, MountOptions::default()),
            Access::Mount { options, .. } => {
                self.check_staged(&req.volume_id, staging, number)?;
                let flags_only = MountOptions {
                    flags: options.flags,
                    data: Vec::new(),
                };
                (staging.to_path_buf(), flags_only)
            }
        };
        let options = options.or_read_only(read_only);
        if self.already_published(&req.volume_id, target, &source, options.is_read_only())? {
            return Ok(());
        }
        if capability.mode == Mode::SingleNodeSingleWriter && !options.is_read_only() {
            self.check_single_writer(&req.volume_id, number, &source, staging, target)?;
        }
        match capability.access {
            Access::Block => make_file(target)?,
            Access::Mount { .. } => {
                fs::create_dir_all(target).map_err(|e| HostError::io("creating", target, e))?
            }
        }
        mount::bind(&source, target, &options).await?;
        info!(target = %target.display(), read_only = options.is_read_only(), "published");
        Ok(())
    }

    fn check_staged(
        &self,
        volume_id: &str,
        staging: &Path,
        number: DeviceNumber,
    ) -> NodeResult<()> {
        match self.host.mount_at(staging)? {
            Some(entry) if entry.device == number => Ok(()),
            _ => Err(NodeError::FailedPrecondition(format!(
                "volume {volume_id} is not staged at {}: NodeStageVolume first",
                staging.display()
            ))),
        }
    }

    /// True if `target` already shows `source` with the same read-only-ness;
    /// ALREADY_EXISTS if it shows something else.
    fn already_published(
        &self,
        volume_id: &str,
        target: &Path,
        source: &Path,
        read_only: bool,
    ) -> NodeResult<bool> {
        let Some(entry) = self.host.mount_at(target)? else {
            return Ok(false);
        };
        if !same_file(source, target) {
            return Err(NodeError::AlreadyExists(format!(
                "{} already has {} mounted, not volume {volume_id}",
                target.display(),
                entry.source
            )));
        }
        if entry.read_only() != read_only {
            let mode = |ro| if ro { "read-only" } else { "read-write" };
            return Err(NodeError::AlreadyExists(format!(
                "volume {volume_id} is already published at {} {}, not {}",
                target.display(),
                mode(entry.read_only()),
                mode(read_only)
            )));
        }
        Ok(true)
    }

    /// SINGLE_NODE_SINGLE_WRITER: one read-write publication at a time.
    fn check_single_writer(
        &self,
        volume_id: &str,
        number: DeviceNumber,
        source: &Path,
        staging: &Path,
        target: &Path,
    ) -> NodeResult<()> {
        let other = self.host.mounts()?.into_iter().find(|m| {
            !m.read_only()
                && m.mount_point != staging
                && m.mount_point != target
                && (m.device == number || is_bind_of_device(&m.root, &m.mount_point, source))
        });
        match other {
            Some(m) => Err(NodeError::FailedPrecondition(format!(
                "volume {volume_id} is SINGLE_NODE_SINGLE_WRITER and already published \
                 read-write at {}",
                m.mount_point.display()
            ))),
            None => Ok(()),
        }
    }

    async fn unpublish(&self, req: &NodeUnpublishVolumeRequest) -> NodeResult<()> {
        required_volume_id(&req.volume_id)?;
        let target = required_path("target_path", &req.target_path)?;
        let _guard = self.locks.try_lock(&req.volume_id)?;
        self.unmount_all(target).await?;
        remove_target(target)?;
        Ok(())
    }
}

/// Whether a mount is a bind of the device node `device` (block access):
/// its root names the device and its mount point is that device.
fn is_bind_of_device(root: &Path, mount_point: &Path, device: &Path) -> bool {
    root.file_name()
        .is_some_and(|n| Some(n) == device.file_name())
        && same_file(device, mount_point)
}

/// Same inode on the same device, or the same block device.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) if a.file_type().is_block_device() && b.file_type().is_block_device() => {
            a.rdev() == b.rdev()
        }
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The file a block device is bind-mounted on. An empty directory there
/// (some COs create the target as one) is replaced.
fn make_file(target: &Path) -> NodeResult<()> {
    if target.is_dir() {
        fs::remove_dir(target).map_err(|e| HostError::io("removing", target, e))?;
    }
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(|e| HostError::io("creating", parent, e))?;
    }
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(target)
        .map_err(|e| HostError::io("creating", target, e))?;
    Ok(())
}

/// Removes what publishing created: an empty directory or a file. Never
/// recursive, so a mount that could not be removed keeps its data.
fn remove_target(target: &Path) -> NodeResult<()> {
    let removed = match fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => fs::remove_dir(target),
        Ok(_) => fs::remove_file(target),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(HostError::io("removing", target, e).into())
        }
        _ => Ok(()),
    }
}

/// Stats and expansion of a published volume.
impl NodeService {
    async fn stats(
        &self,
        req: &NodeGetVolumeStatsRequest,
    ) -> NodeResult<NodeGetVolumeStatsResponse> {
        required_volume_id(&req.volume_id)?;
        let path = volume_path(&req.volume_path)?;
        let volume = self.volume(&req.volume_id).await?;
        let device = self.current_device(&req.volume_id);
        let usage = match self.published_kind(&req.volume_id, path, device.as_ref())? {
            Published::Block => block_usage(path)?,
            Published::Filesystem => filesystem_usage(path)?,
        };
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition(&volume, device.is_some())),
        })
    }

    /// What `path` is for this volume, NOT_FOUND if it is not the volume.
    /// Without the device link (engine gone) any mount there is taken as it.
    fn published_kind(
        &self,
        volume_id: &str,
        path: &Path,
        device: Option<&(PathBuf, DeviceNumber)>,
    ) -> NodeResult<Published> {
        let not_found = |why: &str| NodeError::NotFound(format!("{} {why}", path.display()));
        if !path.exists() {
            return Err(not_found("does not exist"));
        }
        let not_ours = || not_found(&format!("is not a mount of volume {volume_id}"));
        let entry = self.host.mount_at(path)?.ok_or_else(not_ours)?;
        if let Some(number) = device::block_device_number(path)? {
            return match device {
                Some((_, ours)) if *ours != number => Err(not_ours()),
                _ => Ok(Published::Block),
            };
        }
        match device {
            Some((_, ours)) if *ours != entry.device => Err(not_ours()),
            _ => Ok(Published::Filesystem),
        }
    }

    async fn expand(&self, req: &NodeExpandVolumeRequest) -> NodeResult<i64> {
        required_volume_id(&req.volume_id)?;
        let path = volume_path(&req.volume_path)?;
        let block = match req.volume_capability.as_ref() {
            Some(capability) => matches!(parse_capability(Some(capability))?.access, Access::Block),
            None => false,
        };
        let (required, limit) = req
            .capacity_range
            .as_ref()
            .map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        if required < 0 || limit < 0 || (limit > 0 && limit < required) {
            return Err(invalid(format!(
                "capacity_range is inconsistent: required {required}, limit {limit}"
            )));
        }
        self.volume(&req.volume_id).await?;
        let _guard = self.locks.try_lock(&req.volume_id)?;
        let Some((device, number)) = self.current_device(&req.volume_id) else {
            return Err(NodeError::FailedPrecondition(format!(
                "volume {} is not attached to node {}",
                req.volume_id, self.config.node_id
            )));
        };
        let kind = self.published_kind(&req.volume_id, path, Some(&(device.clone(), number)))?;
        let size = self.wait_for_size(&device, required).await?;
        if limit > 0 && size > limit as u64 {
            return Err(NodeError::OutOfRange(format!(
                "the device of volume {} is {size} bytes, over the limit of {limit}",
                req.volume_id
            )));
        }
        if matches!(kind, Published::Filesystem) && !block {
            self.grow_filesystem(&device, path).await?;
        }
        Ok(i64::try_from(size).unwrap_or(i64::MAX))
    }

    /// Waits for the device to reach `required` bytes: the engine grows it
    /// after the controller grew the volume.
    async fn wait_for_size(&self, device: &Path, required: i64) -> NodeResult<u64> {
        let required = u64::try_from(required).unwrap_or(0);
        let deadline = Instant::now() + GROW_WAIT;
        loop {
            let size = device::size(device)?;
            if size >= required {
                return Ok(size);
            }
            if Instant::now() >= deadline {
                return Err(NodeError::Unavailable(format!(
                    "{} is {size} bytes, not yet the requested {required}",
                    device.display()
                )));
            }
            sleep(POLL).await;
        }
    }

    async fn grow_filesystem(&self, device: &Path, path: &Path) -> NodeResult<()> {
        let entry = self
            .host
            .mount_at(path)?
            .ok_or_else(|| NodeError::NotFound(format!("{} is not mounted", path.display())))?;
        let fs = FsType::parse(&entry.fs_type)
            .map_err(|e| NodeError::FailedPrecondition(e.to_string()))?;
        self.host.grow(device, path, fs).await?;
        info!(device = %device.display(), %fs, "filesystem grown");
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Published {
    Block,
    Filesystem,
}

fn block_usage(path: &Path) -> NodeResult<Vec<VolumeUsage>> {
    let total = device::size(path)?;
    Ok(vec![VolumeUsage {
        total: i64::try_from(total).unwrap_or(i64::MAX),
        unit: Unit::Bytes.into(),
        ..Default::default()
    }])
}

fn filesystem_usage(path: &Path) -> NodeResult<Vec<VolumeUsage>> {
    let usage = filesystem::usage(path)?;
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Ok(vec![
        VolumeUsage {
            available: int(usage.bytes_available),
            total: int(usage.bytes_total),
            used: int(usage.bytes_used),
            unit: Unit::Bytes.into(),
        },
        VolumeUsage {
            available: int(usage.inodes_available),
            total: int(usage.inodes_total),
            used: int(usage.inodes_used),
            unit: Unit::Inodes.into(),
        },
    ])
}

fn condition(volume: &Volume, device_present: bool) -> VolumeCondition {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let robustness = volume
        .status
        .as_ref()
        .map(|s| s.robustness)
        .unwrap_or_default();
    let (abnormal, message) = match robustness {
        _ if !device_present => (
            true,
            format!("the device of volume {name} is gone from this node"),
        ),
        Robustness::Faulted => (
            true,
            format!("volume {name} is faulted: no healthy replica is left"),
        ),
        Robustness::Degraded => (
            true,
            format!("volume {name} is degraded: some replicas failed; it still serves I/O"),
        ),
        Robustness::Healthy => (false, format!("volume {name} is healthy")),
        Robustness::Unknown => (
            false,
            format!("the health of volume {name} is not known yet"),
        ),
    };
    VolumeCondition { abnormal, message }
}

fn capability(kind: rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc {
                r#type: kind.into(),
            },
        )),
    }
}

/// This node's zone and region, from its Kubernetes Node's labels.
fn topology(node: Option<&KubeNode>) -> Option<Topology> {
    let labels = node?.metadata.labels.as_ref()?;
    let segments: HashMap<String, String> = [crate::types::ZONE_LABEL, crate::types::REGION_LABEL]
        .into_iter()
        .filter_map(|key| Some((key.to_string(), labels.get(key)?.clone())))
        .collect();
    (!segments.is_empty()).then_some(Topology { segments })
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        traced("NodeStageVolume", &req.volume_id, async {
            self.stage(&req).await.map(|()| NodeStageVolumeResponse {})
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        traced("NodeUnstageVolume", &req.volume_id, async {
            self.unstage(&req)
                .await
                .map(|()| NodeUnstageVolumeResponse {})
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        traced("NodePublishVolume", &req.volume_id, async {
            self.publish(&req)
                .await
                .map(|()| NodePublishVolumeResponse {})
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        traced("NodeUnpublishVolume", &req.volume_id, async {
            self.unpublish(&req)
                .await
                .map(|()| NodeUnpublishVolumeResponse {})
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        // Polled by the kubelet: not logged, as the controller's listings.
        Ok(Response::new(self.stats(request.get_ref()).await?))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        traced("NodeExpandVolume", &req.volume_id, async {
            let capacity_bytes = self.expand(&req).await?;
            Ok::<_, NodeError>(NodeExpandVolumeResponse { capacity_bytes })
        })
        .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                capability(rpc::Type::StageUnstageVolume),
                capability(rpc::Type::GetVolumeStats),
                capability(rpc::Type::ExpandVolume),
                capability(rpc::Type::VolumeCondition),
                capability(rpc::Type::SingleNodeMultiWriter),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        self.ready().await?;
        let node = self
            .datastore
            .kube_nodes
            .store
            .get(&ObjectRef::new(&self.config.node_id));
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes,
            accessible_topology: topology(node.as_deref()),
        }))
    }
}

#[cfg(test)]
mod tests;
