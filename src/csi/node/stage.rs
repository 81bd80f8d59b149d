//! NodeStageVolume and NodeUnstageVolume: the volume's filesystem at the
//! staging path.

use std::fs;
use std::path::Path;

use tracing::info;

use super::{
    Access, NodeError, NodeResult, NodeService, parse_capability, required_path,
    required_volume_id, wanted_fs,
};
use crate::csi::proto::*;
use crate::host::HostError;
use crate::host::filesystem::{Content, FsType};
use crate::host::mount;
use crate::types::Frontend;

/// Staging: the volume's filesystem mounted at the staging path.
/// The filesystem made on a blank volume when the request names none.
const DEFAULT_FS: FsType = FsType::Ext4;

impl NodeService {
    pub(super) async fn stage(&self, req: &NodeStageVolumeRequest) -> NodeResult<()> {
        required_volume_id(&req.volume_id)?;
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let capability = parse_capability(req.volume_capability.as_ref())?;
        let volume = self.volume(&req.volume_id).await?;
        let _guard = self.locks.try_lock(&req.volume_id)?;
        if self.frontend_here(&volume).await? == Frontend::Iscsi {
            // Links the device as the FUSE frontend's engine would.
            self.attach_iscsi(&volume).await?;
        }
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

    pub(super) async fn unstage(&self, req: &NodeUnstageVolumeRequest) -> NodeResult<()> {
        required_volume_id(&req.volume_id)?;
        let staging = required_path("staging_target_path", &req.staging_target_path)?;
        let _guard = self.locks.try_lock(&req.volume_id)?;
        // kubelet made the staging directory and removes it itself.
        self.unmount_all(staging).await?;
        self.detach_iscsi(&req.volume_id).await?;
        Ok(())
    }
}
