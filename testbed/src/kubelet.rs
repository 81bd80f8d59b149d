//! The node-side parts of Kubernetes that a test cluster has no process for:
//! the attach-detach controller's VolumeAttachment, and the kubelet's CSI
//! Node calls (stage, publish, expand) into directories under a temp dir.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use kube::ResourceExt;
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::{Error, Result};
use oxhorn::csi::DRIVER_NAME;
use oxhorn::csi::proto::node_client::NodeClient;
use oxhorn::csi::proto::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use oxhorn::csi::proto::{
    CapacityRange, NodeExpandVolumeRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};

/// The VolumeAttachment the attach-detach controller creates when a pod
/// using `pv` is scheduled to `node`; csi-attacher acts on it.
pub fn volume_attachment(pv: &str, node: &str) -> VolumeAttachment {
    let mut attachment = VolumeAttachment {
        spec: VolumeAttachmentSpec {
            attacher: DRIVER_NAME.to_owned(),
            node_name: node.to_owned(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.to_owned()),
                ..VolumeAttachmentSource::default()
            },
        },
        ..VolumeAttachment::default()
    };
    attachment.metadata.name = Some(attachment_name(pv, node));
    attachment
}

/// The name of the VolumeAttachment of `pv` on `node`.
pub fn attachment_name(pv: &str, node: &str) -> String {
    format!("{pv}-{node}")
}

/// A kubelet's CSI calls to one node plugin. Dropping it releases whatever
/// is still mounted under its directory (a failed test's leftovers), so drop
/// it before the engines behind the mounts stop.
pub struct Kubelet {
    node: NodeClient<Channel>,
    dir: TempDir,
}

/// A volume staged and published, as for a pod.
pub struct Published {
    pub volume_id: String,
    /// The PV's fsType; empty leaves the choice to the plugin.
    pub fs_type: String,
    pub staging: PathBuf,
    /// Where the pod sees the filesystem.
    pub target: PathBuf,
}

impl Kubelet {
    /// A kubelet calling the plugin on `channel`.
    pub fn new(channel: Channel) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("oxhorn-kubelet-")
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        Ok(Self {
            node: NodeClient::new(channel),
            dir,
        })
    }

    /// Stages and publishes the volume of `pv` (a filesystem of the PV's
    /// fsType, or the plugin's default; one writer), attached by
    /// `attachment`, as the kubelet does for a pod.
    pub async fn publish(
        &mut self,
        pv: &PersistentVolume,
        attachment: &VolumeAttachment,
    ) -> Result<Published> {
        let csi = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .ok_or_else(|| Error::Failed(format!("PV {} is not a CSI volume", pv.name_any())))?;
        let volume_id = csi.volume_handle.clone();
        let fs_type = csi.fs_type.clone().unwrap_or_default();
        let volume_context: HashMap<String, String> = csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let publish_context: HashMap<String, String> = attachment
            .status
            .as_ref()
            .and_then(|s| s.attachment_metadata.clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
        // The kubelet makes the staging dir and the target's parent; the
        // plugin makes the target.
        let pod_dir = self.dir.path().join(pv.name_any());
        let staging = pod_dir.join("globalmount");
        let target = pod_dir.join("pod").join("mount");
        create_dir(&staging)?;
        create_dir(&pod_dir.join("pod"))?;
        self.node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume_id.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: path_string(&staging),
                volume_capability: Some(capability(&fs_type)),
                volume_context: volume_context.clone(),
                ..NodeStageVolumeRequest::default()
            })
            .await
            .map_err(|s| call_failed("NodeStageVolume", &volume_id, s))?;
        self.node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume_id.clone(),
                publish_context,
                staging_target_path: path_string(&staging),
                target_path: path_string(&target),
                volume_capability: Some(capability(&fs_type)),
                volume_context,
                ..NodePublishVolumeRequest::default()
            })
            .await
            .map_err(|s| call_failed("NodePublishVolume", &volume_id, s))?;
        Ok(Published {
            volume_id,
            fs_type,
            staging,
            target,
        })
    }

    /// Grows the filesystem of a published volume to `bytes`, as the kubelet
    /// does once the controller side grew the volume.
    pub async fn expand(&mut self, published: &Published, bytes: i64) -> Result<()> {
        let volume_id = &published.volume_id;
        self.node
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: volume_id.clone(),
                volume_path: path_string(&published.target),
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                staging_target_path: path_string(&published.staging),
                volume_capability: Some(capability(&published.fs_type)),
                ..NodeExpandVolumeRequest::default()
            })
            .await
            .map_err(|s| call_failed("NodeExpandVolume", volume_id, s))?;
        Ok(())
    }

    /// Unpublishes and unstages, as the kubelet does when the pod is gone.
    pub async fn unpublish(&mut self, published: Published) -> Result<()> {
        let volume_id = published.volume_id;
        self.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                target_path: path_string(&published.target),
            })
            .await
            .map_err(|s| call_failed("NodeUnpublishVolume", &volume_id, s))?;
        self.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: path_string(&published.staging),
            })
            .await
            .map_err(|s| call_failed("NodeUnstageVolume", &volume_id, s))?;
        Ok(())
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        super::release_under(self.dir.path());
    }
}

fn capability(fs_type: &str) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..MountVolume::default()
        })),
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))
}

fn path_string(path: &Path) -> String {
    path.display().to_string()
}

fn call_failed(call: &str, volume_id: &str, status: tonic::Status) -> Error {
    Error::Failed(format!(
        "{call} {volume_id}: {:?}: {}",
        status.code(),
        status.message()
    ))
}
