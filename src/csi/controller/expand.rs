//! ControllerExpandVolume: the volume's `spec.size` grows; an attached
//! volume's engine grows its replicas and device.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::info;

use super::{ControllerService, required};
use crate::csi::capability;
use crate::csi::error::ControllerServiceError;
use crate::csi::parameters::volume_size;
use crate::csi::proto::*;
use crate::types::InstanceState;
use crate::types::engine_name;

/// How long an attached volume's engine may take to show the new size.
const GROW_WAIT: Duration = Duration::from_secs(60);

impl ControllerService {
    pub(super) async fn expand(
        &self,
        request: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, ControllerServiceError> {
        let id = required(&request.volume_id, "volume_id")?;
        let range = request
            .capacity_range
            .ok_or_else(|| ControllerServiceError::Required("capacity_range"))?;
        let size = volume_size(range.required_bytes, range.limit_bytes)?;
        let _guard = self.locks.try_lock(id)?;
        let volume = self.existing_volume(id).await?;
        let node_expansion_required = !capability::is_block(request.volume_capability.as_ref());
        if size <= volume.spec.size {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: volume.spec.size,
                node_expansion_required,
            });
        }
        let patch = json!({"spec": {"size": size}});
        self.volumes()
            .patch(id, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| ControllerServiceError::api(format!("volume {id}"), e))?;
        info!(volume = %id, from = volume.spec.size, to = size, "volume expansion requested");
        if !volume.spec.node_id.is_empty() {
            self.wait_engine_size(id, size).await?;
        }
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: size,
            node_expansion_required,
        })
    }

    /// An attached volume has grown when its running engine reports the size.
    async fn wait_engine_size(&self, id: &str, size: i64) -> Result<(), ControllerServiceError> {
        let engine = engine_name(id);
        self.wait_for(&format!("growing volume {id}"), GROW_WAIT, || {
            let engine = self.ds.engines.get(&engine);
            let status = engine.as_ref().and_then(|e| e.status.as_ref());
            Ok(status
                .filter(|s| {
                    s.instance.current_state == InstanceState::Running && s.current_size >= size
                })
                .map(|_| ()))
        })
        .await
    }
}
