//! Backups: the targets (object stores) with whether they answer, the
//! volumes they hold backups of, the backups themselves; backing a volume
//! up and deleting a backup (from its store too). A backup is restored by
//! making a volume from it (`POST /v1/volumes` with `fromBackup`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::info;
use utoipa::{IntoParams, ToSchema};

use super::auth::{Access, Caller};
use super::body::Body;
use super::error::{ApiError, ErrorBody};
use super::query::Query;
use super::snapshots::{check_name, timed_name};
use super::{ApiState, found, only};
use crate::types::{
    Backup, BackupSpec, BackupState, BackupTarget, BackupVolume, Condition, DEFAULT_BACKUP_TARGET,
};

/// A backup target as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackupTargetView {
    pub name: String,
    /// `s3://…`, `azblob://…`, `file://…` or `nfs://…`.
    pub url: String,
    pub credential_secret: String,
    pub poll_interval: String,
    /// The store answered the last sync.
    pub available: bool,
    /// Why not, when it did not.
    pub message: String,
    /// When the last sync ended, RFC 3339.
    pub last_synced: Option<String>,
}

/// A volume with backups in a target.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackupVolumeView {
    pub name: String,
    pub target: String,
    pub volume: String,
    /// The volume's size in bytes at its last backup.
    pub size: i64,
    pub last_backup: String,
    pub last_backup_at: Option<String>,
}

/// A backup as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackupView {
    pub name: String,
    pub volume: String,
    pub target: String,
    pub snapshot: String,
    /// pending, inProgress, completed, error.
    pub state: String,
    /// Percent done.
    pub progress: i32,
    /// The volume's size in bytes when it was taken.
    pub size: i64,
    pub url: String,
    /// When it was completed, RFC 3339.
    pub created: Option<String>,
    pub error: String,
    pub labels: BTreeMap<String, String>,
    pub deleting: bool,
}

/// A new backup of a volume.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewBackup {
    /// Default: the volume's name and the time.
    pub name: Option<String>,
    /// A snapshot of the volume to back up; default: one taken for it.
    pub snapshot: Option<String>,
    /// Default: `default`.
    pub target: Option<String>,
    /// Recorded with the backup in the store.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Which backups.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BackupQuery {
    /// Only those of this volume.
    pub volume: Option<String>,
}

fn time(t: Option<&MicroTime>) -> Option<String> {
    t.map(|t| t.0.to_string())
}

fn not_ready_message(conditions: &[Condition]) -> String {
    conditions
        .iter()
        .find(|c| !c.message.is_empty())
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

fn target_view(target: &BackupTarget) -> BackupTargetView {
    let status = target.status.clone().unwrap_or_default();
    BackupTargetView {
        name: target.name_any(),
        url: target.spec.backup_target_url.clone(),
        credential_secret: target.spec.credential_secret.clone(),
        poll_interval: target.spec.poll_interval.clone(),
        available: status.available,
        message: if status.available {
            String::new()
        } else {
            not_ready_message(&status.conditions)
        },
        last_synced: time(status.last_synced_at.as_ref()),
    }
}

fn backup_view(backup: &Backup) -> BackupView {
    let status = backup.status.clone().unwrap_or_default();
    BackupView {
        name: backup.name_any(),
        volume: backup.spec.volume_name.clone(),
        target: backup.spec.backup_target_name.clone(),
        snapshot: Some(status.snapshot_name)
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| backup.spec.snapshot_name.clone()),
        state: match status.state {
            BackupState::Pending => "pending",
            BackupState::InProgress => "inProgress",
            BackupState::Completed => "completed",
            BackupState::Error => "error",
        }
        .into(),
        progress: status.progress,
        size: status.size,
        url: status.url,
        created: status.backup_created_at.map(|t| t.0.to_string()),
        error: status.error,
        labels: backup.spec.labels.clone(),
        deleting: backup.metadata.deletion_timestamp.is_some(),
    }
}

/// The backup targets, by name.
#[utoipa::path(
    operation_id = "list_backup_targets",
    get,
    path = "/v1/backup-targets",
    tag = "backups",
    responses(
        (status = 200, description = "The targets", body = Vec<BackupTargetView>),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list backup targets", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn targets(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
) -> Result<Json<Vec<BackupTargetView>>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "backuptargets", None))
        .await?;
    let mut views: Vec<_> = state
        .ds
        .backup_targets
        .store
        .state()
        .iter()
        .map(|t| target_view(t))
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(views))
}

/// Syncs a target now: what its store holds is read again.
#[utoipa::path(
    operation_id = "sync_backup_target",
    post,
    path = "/v1/backup-targets/{name}/sync",
    tag = "backups",
    params(("name" = String, Path, description = "The target's name")),
    responses(
        (status = 202, description = "Asked: the target as it was", body = BackupTargetView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the target", body = ErrorBody),
        (status = 404, description = "No such target", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn sync(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<BackupTargetView>), ApiError> {
    state
        .auth
        .authorize(
            &caller,
            &Access::oxhorn("patch", "backuptargets", Some(&name)),
        )
        .await?;
    let target = found(&state, &state.ds.backup_targets, "backup target", &name).await?;
    let now = MicroTime(jiff::Timestamp::now());
    let patch = json!({"spec": {"syncRequestedAt": now}});
    state
        .api::<BackupTarget>()
        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    info!(
        user = caller.name(),
        target = name,
        "sync asked through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(target_view(&target))))
}

/// The volumes the targets hold backups of.
#[utoipa::path(
    operation_id = "list_backup_volumes",
    get,
    path = "/v1/backup-volumes",
    tag = "backups",
    responses(
        (status = 200, description = "The backup volumes, by name", body = Vec<BackupVolumeView>),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list backup volumes", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn volumes(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
) -> Result<Json<Vec<BackupVolumeView>>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "backupvolumes", None))
        .await?;
    let view = |v: &BackupVolume| {
        let status = v.status.clone().unwrap_or_default();
        BackupVolumeView {
            name: v.name_any(),
            target: v.spec.backup_target_name.clone(),
            volume: v.spec.volume_name.clone(),
            size: status.size,
            last_backup: status.last_backup_name,
            last_backup_at: status.last_backup_at.map(|t| t.0.to_string()),
        }
    };
    let mut views: Vec<_> = state
        .ds
        .backup_volumes
        .store
        .state()
        .iter()
        .map(|v| view(v))
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(views))
}

/// The backups, newest first.
#[utoipa::path(
    operation_id = "list_backups",
    get,
    path = "/v1/backups",
    tag = "backups",
    params(BackupQuery),
    responses(
        (status = 200, description = "The backups, newest first", body = Vec<BackupView>),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list backups", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Query(query): Query<BackupQuery>,
) -> Result<Json<Vec<BackupView>>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "backups", None))
        .await?;
    Ok(Json(newest_first(&state, query.volume.as_deref())))
}

/// The backups (of `volume` only, if named), newest first.
pub fn newest_first(state: &ApiState, volume: Option<&str>) -> Vec<BackupView> {
    let mut backups: Vec<_> = state
        .ds
        .backups
        .store
        .state()
        .into_iter()
        .filter(|b| volume.is_none_or(|v| v == b.spec.volume_name))
        .collect();
    let made = |b: &Backup| {
        let completed = b.status.as_ref().and_then(|s| s.backup_created_at.as_ref());
        completed
            .or(b.metadata.creation_timestamp.as_ref())
            .map(|t| t.0)
    };
    backups.sort_by_key(|b| std::cmp::Reverse((made(b), b.name_any())));
    backups.iter().map(|b| backup_view(b)).collect()
}

/// Backs a volume up, from a snapshot of it (one is taken if none is
/// named), to a target.
#[utoipa::path(
    operation_id = "create_backup",
    post,
    path = "/v1/volumes/{name}/backups",
    tag = "backups",
    params(("name" = String, Path, description = "The volume's name")),
    request_body = NewBackup,
    responses(
        (status = 201, description = "Asked for: the volume's owner uploads it", body = BackupView),
        (status = 400, description = "Bad input, or no such snapshot or target", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not create backups", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "A backup of that name exists, or the volume is a standby", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(volume): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<BackupView>), ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("create", "backups", None))
        .await?;
    let new: NewBackup = body.parse()?;
    let source = found(&state, &state.ds.volumes, "volume", &volume).await?;
    if let Some(refusal) = source.standby_refusal("be backed up") {
        return Err(ApiError::Conflict(refusal));
    }
    let target = new.target.unwrap_or_else(|| DEFAULT_BACKUP_TARGET.into());
    if state.ds.backup_targets.get(&target).is_none() {
        return Err(ApiError::Invalid(format!(
            "there is no backup target {target}"
        )));
    }
    let snapshot = new.snapshot.unwrap_or_default();
    if !snapshot.is_empty() {
        let of = state
            .ds
            .snapshots
            .get(&snapshot)
            .map(|s| s.spec.volume.clone());
        if of.as_deref() != Some(volume.as_str()) {
            return Err(ApiError::Invalid(format!(
                "volume {volume} has no snapshot {snapshot}"
            )));
        }
    }
    let name = new
        .name
        .unwrap_or_else(|| timed_name(&volume, jiff::Timestamp::now()));
    check_name("backup", &name)?;
    let backup = Backup::new(
        &name,
        BackupSpec {
            volume_name: volume.clone(),
            snapshot_name: snapshot,
            backup_target_name: target,
            labels: new.labels,
        },
    );
    let made = state
        .api::<Backup>()
        .create(&PostParams::default(), &backup)
        .await?;
    info!(
        user = caller.name(),
        volume,
        backup = name,
        "backup asked through the API"
    );
    Ok((StatusCode::CREATED, Json(backup_view(&made))))
}

/// Deletes a backup, from its store too.
#[utoipa::path(
    operation_id = "delete_backup",
    delete,
    path = "/v1/backups/{name}",
    tag = "backups",
    params(("name" = String, Path, description = "The backup's name")),
    responses(
        (status = 202, description = "Deleting: the backup as it was", body = BackupView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not delete it", body = ErrorBody),
        (status = 404, description = "No such backup", body = ErrorBody),
        (status = 409, description = "It changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<BackupView>), ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("delete", "backups", Some(&name)))
        .await?;
    let backup = found(&state, &state.ds.backups, "backup", &name).await?;
    state.api::<Backup>().delete(&name, &only(&*backup)).await?;
    info!(
        user = caller.name(),
        backup = name,
        "backup deleted through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(backup_view(&backup))))
}
