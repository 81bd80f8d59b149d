//! Reverting a detached volume to one of its snapshots: the API asks it in
//! the volume's spec (`spec.revert`), and the volume's owner does it on every
//! replica, then answers in its status (`status.revert`, see VolumeView's
//! `revert`). The volume does not attach until then.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::info;
use utoipa::ToSchema;

use super::actions::authorize_patch;
use super::{ApiState, VolumeView, view, volume};
use crate::api::auth::Caller;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::{found, lower};
use crate::types::{RevertRequest, RevertStatus, Snapshot, Volume, VolumeState};

/// The last revert of a volume.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct RevertView {
    pub snapshot: String,
    /// `reverting`, `reverted` or `failed`; `asked` until the volume's
    /// manager takes it on.
    pub phase: String,
    pub message: String,
}

impl RevertView {
    /// The revert asked and not answered yet, or else the last answer.
    pub fn of(volume: &Volume) -> Option<Self> {
        if let Some(asked) = volume.revert_unanswered()
            && volume.revert_under_way().is_none()
        {
            return Some(Self {
                snapshot: asked.snapshot.clone(),
                phase: "asked".into(),
                message: String::new(),
            });
        }
        let status: &RevertStatus = volume.status.as_ref()?.revert.as_ref()?;
        Some(Self {
            snapshot: status.snapshot.clone(),
            phase: lower(&status.phase),
            message: status.message.clone(),
        })
    }
}

/// Reverts a detached volume to one of its snapshots: every write after
/// it is discarded, and so are the snapshots taken after it. The volume
/// does not attach until the revert is done (see its `revert`).
#[utoipa::path(
    operation_id = "revert_volume",
    post,
    path = "/v1/volumes/{name}/snapshots/{snapshot}/revert",
    tag = "snapshots",
    params(
        ("name" = String, Path, description = "The volume's name"),
        ("snapshot" = String, Path, description = "The snapshot to revert to"),
    ),
    responses(
        (status = 202, description = "Asked: the volume as it was", body = VolumeView),
        (status = 400, description = "The snapshot is not taken yet, or being deleted", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the volume", body = ErrorBody),
        (status = 404, description = "No such volume, or no such snapshot of it", body = ErrorBody),
        (status = 409, description = "The volume is attached (or attaching, detaching, being deleted or filled), a revert is under way, or it changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn revert(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path((name, snapshot)): Path<(String, String)>,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    authorize_patch(&state, &caller, &name).await?;
    let volume = volume(&state, &name).await?;
    let target = found(&state, &state.ds.snapshots, "snapshot", &snapshot).await?;
    refusal(&volume, &target).map_or(Ok(()), Err)?;
    let request = RevertRequest {
        snapshot: snapshot.clone(),
        request: jiff::Timestamp::now().to_string(),
    };
    let ops = vec![json!({"op": "add", "path": "/spec/revert", "value": request})];
    crate::api::at_generation(&state, &*volume, "volume", ops).await?;
    info!(
        user = caller.name(),
        volume = name,
        snapshot,
        "revert asked through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))))
}

/// Why `volume` cannot be reverted to `snapshot` now, if it cannot.
fn refusal(volume: &Volume, snapshot: &Snapshot) -> Option<ApiError> {
    let name = volume.name_any();
    let snapshot_name = snapshot.name_any();
    if snapshot.spec.volume != name {
        return Some(ApiError::NotFound {
            kind: "snapshot",
            name: format!("{snapshot_name} of volume {name}"),
        });
    }
    if snapshot.metadata.deletion_timestamp.is_some() {
        return Some(ApiError::Invalid(format!(
            "snapshot {snapshot_name} is being deleted"
        )));
    }
    if !snapshot.status.as_ref().is_some_and(|s| s.ready_to_use) {
        return Some(ApiError::Invalid(format!(
            "snapshot {snapshot_name} is not taken yet: revert to it once it is ready"
        )));
    }
    let conflict = |why: String| Some(ApiError::Conflict(why));
    if volume.metadata.deletion_timestamp.is_some() {
        return conflict(format!("volume {name} is being deleted"));
    }
    if !volume.spec.node_id.is_empty() {
        return conflict(format!(
            "volume {name} is attached to node {}: detach it first (a revert needs the volume unused)",
            volume.spec.node_id
        ));
    }
    let state = volume.status.as_ref().map(|s| s.state).unwrap_or_default();
    if state != VolumeState::Detached {
        return conflict(format!(
            "volume {name} is {}: revert it once it is detached",
            lower(&state)
        ));
    }
    if volume.revert_pending() {
        return conflict(format!(
            "volume {name} is being reverted already: wait for that to finish"
        ));
    }
    if !volume.is_filled() {
        return conflict(format!(
            "volume {name} is still being filled from its data source"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::{RevertPhase, SnapshotSpec, SnapshotStatus, VolumeStatus};

    fn volume(node: &str, state: VolumeState) -> Volume {
        let mut volume = Volume::new("v", serde_json::from_value(json!({"size": 4096})).unwrap());
        volume.spec.node_id = node.into();
        volume.status = Some(VolumeStatus {
            state,
            ..VolumeStatus::default()
        });
        volume
    }

    fn snapshot(of: &str, ready: bool) -> Snapshot {
        let mut snapshot = Snapshot::new("s", SnapshotSpec { volume: of.into() });
        snapshot.status = Some(SnapshotStatus {
            ready_to_use: ready,
            ..SnapshotStatus::default()
        });
        snapshot
    }

    #[test]
    fn a_revert_is_for_a_detached_volume_and_a_taken_snapshot_of_it() {
        let code = |v: &Volume, s: &Snapshot| refusal(v, s).map(|e| e.status().as_u16());
        let detached = volume("", VolumeState::Detached);
        let ready = snapshot("v", true);
        assert_eq!(code(&detached, &ready), None);
        assert_eq!(code(&detached, &snapshot("w", true)), Some(404));
        assert_eq!(code(&detached, &snapshot("v", false)), Some(400));
        assert_eq!(
            code(&volume("n1", VolumeState::Attached), &ready),
            Some(409)
        );
        assert_eq!(code(&volume("", VolumeState::Detaching), &ready), Some(409));
        let mut reverting = detached.clone();
        if let Some(status) = reverting.status.as_mut() {
            status.revert = Some(RevertStatus {
                phase: RevertPhase::Reverting,
                ..RevertStatus::default()
            });
        }
        assert_eq!(code(&reverting, &ready), Some(409));
        assert_eq!(RevertView::of(&reverting).unwrap().phase, "reverting");
        let mut asked = detached.clone();
        asked.spec.revert = Some(RevertRequest {
            snapshot: "s".into(),
            request: "1".into(),
        });
        assert_eq!(code(&asked, &ready), Some(409));
        assert_eq!(RevertView::of(&asked).unwrap().phase, "asked");
        assert_eq!(RevertView::of(&detached), None);
    }
}
