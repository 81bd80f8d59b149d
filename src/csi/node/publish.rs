//! NodePublishVolume and NodeUnpublishVolume: the staged filesystem, or the
//! device, at a pod's target path.

use std::fs;
use std::io;
use std::path::Path;

use tracing::info;

use super::{
    Access, NodeError, NodeResult, NodeService, parse_capability, required_path, required_volume_id,
};
use crate::csi::proto::volume_capability::access_mode::Mode;
use crate::csi::proto::*;
use crate::host::HostError;
use crate::host::device::DeviceNumber;
use crate::host::mount::{self, MountOptions};

/// Publishing: the staged filesystem, or the device, at a pod's target path.
impl NodeService {
    pub(super) async fn publish(&self, req: &NodePublishVolumeRequest) -> NodeResult<()> {
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

    pub(super) async fn unpublish(&self, req: &NodeUnpublishVolumeRequest) -> NodeResult<()> {
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
