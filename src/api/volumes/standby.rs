//! Standby (disaster-recovery) volumes through the API: what one holds
//! and follows, and activating it.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::info;
use utoipa::ToSchema;

use super::actions::authorize_patch;
use super::{ApiState, VolumeView, view, volume};
use crate::api::auth::Caller;
use crate::api::error::{ApiError, ErrorBody};
use crate::types::Volume;

/// What a standby volume holds and follows, or held when activated.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StandbyView {
    /// `standby`, `activating` or `activated`.
    pub phase: String,
    /// The volume whose backups it follows, and their BackupTarget.
    pub source_volume: String,
    pub backup_target: String,
    /// The backup it holds, whole, and when its restore completed.
    pub last_restored_backup: String,
    pub last_restored_at: Option<String>,
    /// The newest completed backup known, and how far behind it the volume
    /// is: in backups, and in seconds between their completions.
    pub newest_backup: String,
    pub backups_behind: i64,
    pub lag_seconds: i64,
    /// The backup being restored, if one is.
    pub restoring: Option<String>,
    /// Bytes the last restore wrote.
    pub last_step_bytes: Option<i64>,
    /// When it was activated, and how long that took, in milliseconds.
    pub activated_at: Option<String>,
    pub activation_millis: Option<i64>,
}

impl StandbyView {
    pub fn of(volume: &Volume) -> Option<Self> {
        let status = volume.status.as_ref().and_then(|s| s.standby.as_ref());
        if status.is_none() && !volume.spec.standby {
            return None;
        }
        let status = status.cloned().unwrap_or_default();
        let activation = status.activation.as_ref();
        let activated = activation.and_then(|a| a.activated_at.as_ref());
        let phase = match (volume.spec.standby, activated) {
            (true, _) => "standby",
            (false, None) => "activating",
            (false, Some(_)) => "activated",
        };
        Some(Self {
            phase: phase.to_owned(),
            source_volume: status.source_volume,
            backup_target: status.backup_target,
            last_restored_backup: status.last_restored_backup,
            last_restored_at: status.last_restored_at.as_ref().map(|t| t.0.to_string()),
            newest_backup: status.newest_backup,
            backups_behind: status.backups_behind,
            lag_seconds: status.lag_seconds,
            restoring: status.applying.map(|a| a.backup),
            last_step_bytes: status.last_step.map(|s| s.bytes_restored),
            activated_at: activated.map(|t| t.0.to_string()),
            activation_millis: activation
                .filter(|a| a.activated_at.is_some())
                .map(|a| a.duration_millis),
        })
    }
}

/// Activates a standby volume: it restores the newest backup a fresh sync
/// of its BackupVolume finds, then becomes a normal volume that a
/// PersistentVolume may use. The volume's status.standby.activation says
/// when it is done.
#[utoipa::path(
    operation_id = "activate_volume",
    post,
    path = "/v1/volumes/{name}/activate",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 202, description = "Activating: the volume as it was", body = VolumeView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the volume", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "It is not a standby volume, or it changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn activate(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    authorize_patch(&state, &caller, &name).await?;
    let volume = volume(&state, &name).await?;
    if !volume.spec.standby {
        if volume.is_standby() {
            // Asked already: under way.
            return Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))));
        }
        return Err(ApiError::Conflict(format!(
            "volume {name} is not a standby volume"
        )));
    }
    let ops = vec![json!({"op": "add", "path": "/spec/standby", "value": false})];
    crate::api::at_generation(&state, &*volume, "volume", ops).await?;
    info!(
        user = caller.name(),
        volume = name,
        "activating the standby volume, as asked through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))))
}
