//! CSI Node: makes an attached volume's block device usable by pods on this
//! node. Staging formats (if blank) and mounts the device at a per-volume
//! staging path; publishing bind-mounts that (or, for block access, the
//! device node itself) at each pod's target path. This file holds the
//! service, request validation and what the calls share; stage.rs,
//! publish.rs and stats.rs (stats and expansion) hold the calls, iscsi.rs
//! the login to an iSCSI volume's target that gives it its device.

mod iscsi;
mod publish;
mod stage;
mod stats;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use tokio::time::{Instant, sleep, timeout};
use tonic::{Request, Response, Status};
use tracing::info;

use super::error::NodeError;
use super::guard::VolumeLocks;
use super::proto::node_server::Node;
use super::proto::node_service_capability::{self, rpc};
use super::proto::volume_capability::access_mode::Mode;
use super::proto::volume_capability::{AccessType, MountVolume};
use super::proto::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, Topology, VolumeCapability,
};
use super::traced::traced;
use crate::datastore::Datastore;
use crate::host::Host;
use crate::host::device::{self, DeviceNumber};
use crate::host::filesystem::FsType;
use crate::host::iscsi::{HostCommands, Initiator};
use crate::host::mount::{self, MountOptions};
use crate::types::Volume;

/// How long staging waits for the engine to publish the volume's device.
const DEVICE_WAIT: Duration = Duration::from_secs(30);
/// How long a call waits for the caches' first sync before UNAVAILABLE.
const READY_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(200);
/// The volume_context key a StorageClass's filesystem type arrives in.
const FS_TYPE_KEY: &str = "fsType";

pub struct NodeServiceConfig {
    pub node_id: String,
    /// where engines publish `<dev_dir>/<volume>` symlinks to the volume's block device (a loop device)
    pub dev_dir: PathBuf,
    /// a host process's /proc directory: when Some, host commands run in its mount and network namespaces
    pub host_process: Option<PathBuf>,
    /// NodeGetInfo max_volumes_per_node; 0 = not set
    pub max_volumes: i64,
}

pub struct NodeService {
    config: NodeServiceConfig,
    datastore: Arc<Datastore>,
    host: Host,
    /// iscsiadm on the host; a trait object so tests can script it.
    initiator: Initiator<Arc<dyn HostCommands>>,
    /// How long staging waits for a volume's device (DEVICE_WAIT).
    device_wait: Duration,
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
        let host = Host::new(config.host_process.clone());
        let runner: Arc<dyn HostCommands> = Arc::new(host.clone());
        Self {
            config,
            datastore,
            host,
            initiator: Initiator::new(runner),
            device_wait: DEVICE_WAIT,
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
        self.datastore
            .volumes
            .get(volume_id)
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
        let deadline = Instant::now() + self.device_wait;
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
        let volume = self.datastore.volumes.get(volume_id);
        let attached_to = volume.map(|v| v.spec.node_id.clone()).unwrap_or_default();
        if attached_to != self.config.node_id {
            return self.not_attached_here(volume_id, &attached_to);
        }
        NodeError::Unavailable(format!(
            "the device of volume {volume_id} did not appear at {} within {:?}",
            link.display(),
            self.device_wait
        ))
    }

    fn not_attached_here(&self, volume_id: &str, attached_to: &str) -> NodeError {
        NodeError::FailedPrecondition(format!(
            "volume {volume_id} is not attached to node {} (it is to {attached_to:?}): \
             ControllerPublishVolume first",
            self.config.node_id
        ))
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
        let node = self.datastore.kube_nodes.get(&self.config.node_id);
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes,
            accessible_topology: topology(node.as_deref()),
        }))
    }
}

#[cfg(test)]
mod tests;
