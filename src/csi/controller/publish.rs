//! ControllerPublishVolume and ControllerUnpublishVolume: where a volume is
//! attached is its `spec.nodeID`.

use std::collections::HashMap;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::info;

use super::{ControllerService, required};
use crate::csi::capability;
use crate::csi::error::ControllerServiceError;
use crate::csi::proto::*;
use crate::types::{PUBLISHED_READONLY, Volume, VolumeState};

const ATTACH_WAIT: Duration = Duration::from_secs(60);

impl ControllerService {
    pub(super) async fn publish(
        &self,
        request: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, ControllerServiceError> {
        let id = required(&request.volume_id, "volume_id")?;
        let node = required(&request.node_id, "node_id")?;
        let capability = request
            .volume_capability
            .as_ref()
            .ok_or_else(|| ControllerServiceError::Required("volume_capability"))?;
        capability::check(capability).map_err(ControllerServiceError::InvalidArgument)?;
        let _guard = self.locks.try_lock(id)?;
        let volume = self.existing_volume(id).await?;
        self.existing_node(node)?;
        if let Some(refusal) = volume.standby_refusal(&format!("attach to {node}")) {
            return Err(ControllerServiceError::FailedPrecondition(refusal));
        }
        let readonly = request.readonly.to_string();
        let published_readonly = volume.annotations().get(PUBLISHED_READONLY);
        match volume.spec.node_id.as_str() {
            // A volume being deleted is held only while it stays attached:
            // it takes no new attachment that would keep it.
            "" if volume.metadata.deletion_timestamp.is_some() => {
                return Err(ControllerServiceError::FailedPrecondition(format!(
                    "volume {id} is being deleted; it cannot attach to {node}"
                )));
            }
            // The owner reverts only a detached volume, and finishes a
            // revert it began before the volume may attach.
            "" if volume.revert_pending() => {
                return Err(ControllerServiceError::FailedPrecondition(format!(
                    "volume {id} is being reverted to a snapshot; it attaches to {node} once that is done"
                )));
            }
            "" => self.set_attachment(&volume, node, Some(&readonly)).await?,
            current if current == node => match published_readonly {
                Some(published) if *published != readonly => {
                    return Err(ControllerServiceError::AlreadyExists(format!(
                        "volume {id} is published to {node} with readonly={published}"
                    )));
                }
                Some(_) => {}
                // Attached there by a person (the REST API) and since
                // deleted: no pod may start to use it.
                None if volume.metadata.deletion_timestamp.is_some() => {
                    return Err(ControllerServiceError::FailedPrecondition(format!(
                        "volume {id} is being deleted; it cannot be published to {node}"
                    )));
                }
                // Attached there by a person: from now on it is
                // Kubernetes', and no one detaches it from under its pod.
                None => self.set_attachment(&volume, node, Some(&readonly)).await?,
            },
            other => {
                return Err(ControllerServiceError::FailedPrecondition(format!(
                    "volume {id} is attached to node {other}; a single-node volume cannot also attach to {node}"
                )));
            }
        }
        self.wait_attached(id, node).await?;
        Ok(ControllerPublishVolumeResponse {
            publish_context: HashMap::new(),
        })
    }

    fn existing_node(&self, node: &str) -> Result<(), ControllerServiceError> {
        match self.ds.nodes.get(node) {
            Some(_) => Ok(()),
            None => Err(ControllerServiceError::NotFound(format!(
                "node {node} is not an oxhorn node"
            ))),
        }
    }

    /// Sets where the volume should be attached ("" detaches), with the
    /// publish's readonly flag, guarded by the volume's resourceVersion.
    async fn set_attachment(
        &self,
        volume: &Volume,
        node: &str,
        readonly: Option<&str>,
    ) -> Result<(), ControllerServiceError> {
        let id = volume.name_any();
        let patch = json!({
            "metadata": {
                "resourceVersion": volume.resource_version(),
                "annotations": {PUBLISHED_READONLY: readonly},
            },
            "spec": {"nodeID": node},
        });
        self.volumes()
            .patch(&id, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| ControllerServiceError::api(format!("volume {id}"), e))?;
        info!(volume = %id, node = %node, "volume attachment requested");
        Ok(())
    }

    async fn wait_attached(&self, id: &str, node: &str) -> Result<(), ControllerServiceError> {
        self.wait_for(
            &format!("attaching volume {id} to {node}"),
            ATTACH_WAIT,
            || {
                let volume = self.ds.volumes.get(id);
                let status = volume.as_ref().and_then(|v| v.status.as_ref());
                Ok(status
                    .filter(|s| s.state == VolumeState::Attached && s.current_node_id == node)
                    .map(|_| ()))
            },
        )
        .await
    }

    pub(super) async fn unpublish(
        &self,
        request: ControllerUnpublishVolumeRequest,
    ) -> Result<(), ControllerServiceError> {
        let id = required(&request.volume_id, "volume_id")?;
        let node = request.node_id.as_str();
        let _guard = self.locks.try_lock(id)?;
        let Some(volume) = self.get_volume(id).await? else {
            return Ok(());
        };
        let attached_to = volume.spec.node_id.as_str();
        if attached_to.is_empty() || (!node.is_empty() && attached_to != node) {
            return Ok(());
        }
        self.set_attachment(&volume, "", None).await?;
        self.wait_for(&format!("detaching volume {id}"), ATTACH_WAIT, || {
            let volume = self.ds.volumes.get(id);
            let status = volume.as_ref().and_then(|v| v.status.as_ref());
            Ok(status
                .filter(|s| s.current_node_id.is_empty() && s.state != VolumeState::Detaching)
                .map(|_| ()))
        })
        .await
    }
}
