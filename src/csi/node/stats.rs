//! NodeGetVolumeStats and NodeExpandVolume of a published volume.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tracing::info;

use super::{
    Access, NodeError, NodeResult, NodeService, POLL, invalid, parse_capability,
    required_volume_id, volume_path,
};
use crate::csi::proto::volume_usage::Unit;
use crate::csi::proto::*;
use crate::host::device::{self, DeviceNumber};
use crate::host::filesystem::{self, FsType};
use crate::types::{Robustness, Volume};

/// Stats and expansion of a published volume.
/// How long expansion waits for the device to take the volume's new size.
const GROW_WAIT: Duration = Duration::from_secs(30);

impl NodeService {
    pub(super) async fn stats(
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

    pub(super) async fn expand(&self, req: &NodeExpandVolumeRequest) -> NodeResult<i64> {
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
        self.rescan_iscsi(&req.volume_id).await?;
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
