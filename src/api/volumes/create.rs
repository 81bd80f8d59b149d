//! Making volumes: a new one (empty, or restored from a backup or a
//! snapshot), and a clone of another. Each writes the objects the CSI
//! controller would, so a volume made here is the same as one a claim made.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kube::ResourceExt;
use kube::api::PostParams;
use serde::Deserialize;
use tracing::info;
use utoipa::ToSchema;

use super::{ApiState, VolumeView, view, volume};
use crate::api::auth::{Access, Caller};
use crate::api::body::Body;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::found;
use crate::datastore::{Settings, create_if_absent};
use crate::names::validate_dns_subdomain;
use crate::types::{
    AccessMode, CLONE_FOR, DataLocality, DataSource, ReplicaAutoBalance, Snapshot, VOLUME_NAME_MAX,
    Volume, VolumeFrontend, VolumeSpec, clone_source,
};

/// A new volume.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewVolume {
    /// A DNS subdomain: lower-case letters, digits, `-` and `.`.
    pub name: String,
    /// Bytes, a whole number of 4096-byte blocks; restoring, at least the
    /// source's size, which it defaults to.
    pub size: Option<i64>,
    /// 1 to 20; default: the `default-replica-count` setting.
    pub number_of_replicas: Option<i32>,
    /// `auto` (default), `fuse` or `iscsi`.
    #[schema(value_type = Option<String>)]
    pub frontend: Option<VolumeFrontend>,
    /// `disabled` (default), `best-effort` or `strict-local`.
    #[schema(value_type = Option<String>)]
    pub data_locality: Option<DataLocality>,
    /// Only disks with all these tags hold its replicas.
    #[serde(default)]
    pub disk_selector: Vec<String>,
    /// Only nodes with all these tags hold its replicas.
    #[serde(default)]
    pub node_selector: Vec<String>,
    /// The Backup to restore it from.
    pub from_backup: Option<String>,
    /// The Snapshot to restore it from.
    pub from_snapshot: Option<String>,
}

/// A clone: a new volume holding what another holds now.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewClone {
    /// The clone's name.
    pub name: String,
    /// Bytes; at least the source's size, which it defaults to.
    pub size: Option<i64>,
    /// Default: the source's.
    pub number_of_replicas: Option<i32>,
}

/// Makes a volume, empty or restored from a backup or a snapshot.
#[utoipa::path(
    operation_id = "create_volume",
    post,
    path = "/v1/volumes",
    tag = "volumes",
    request_body = NewVolume,
    responses(
        (status = 201, description = "Made: the controllers place and fill it", body = VolumeView),
        (status = 400, description = "Bad input, or a source that is not there or does not fit", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not create volumes", body = ErrorBody),
        (status = 409, description = "A volume of that name exists", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    body: Body,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("create", "volumes", None))
        .await?;
    let new: NewVolume = body.parse()?;
    check_name("the volume's name", &new.name)?;
    // Restoring reads the source: the caller must be allowed to.
    let sources = [
        ("backups", &new.from_backup),
        ("snapshots", &new.from_snapshot),
    ];
    for (resource, source) in sources {
        if let Some(source) = source {
            let access = Access::oxhorn("get", resource, Some(source));
            state.auth.authorize(&caller, &access).await?;
        }
    }
    let (source, source_size) = match (&new.from_backup, &new.from_snapshot) {
        (Some(_), Some(_)) => {
            return Err(ApiError::Invalid(
                "a volume is restored from a backup or from a snapshot, not both".into(),
            ));
        }
        (Some(backup), None) => {
            let backup = found(&state, &state.ds.backups, "backup", backup)
                .await
                .map_err(|e| ApiError::Invalid(e.to_string()))?;
            let size = backup.status.as_ref().map_or(0, |s| s.size);
            (Source::Backup(backup.name_any()), size)
        }
        (None, Some(snapshot)) => {
            let snapshot = found(&state, &state.ds.snapshots, "snapshot", snapshot)
                .await
                .map_err(|e| ApiError::Invalid(e.to_string()))?;
            let size = snapshot.status.as_ref().map_or(0, |s| s.size);
            (Source::Snapshot(snapshot.name_any()), size)
        }
        (None, None) => (Source::None, 0),
    };
    let size = size_for(new.size, source_size)?;
    let settings = Settings::read(&state.ds.settings);
    let mut spec = spec(&settings, size, source);
    spec.number_of_replicas = new
        .number_of_replicas
        .unwrap_or(settings.default_replica_count);
    spec.frontend = new.frontend.unwrap_or_default();
    spec.data_locality = new.data_locality.unwrap_or_default();
    spec.disk_selector = new.disk_selector;
    spec.node_selector = new.node_selector;
    let made = state
        .api::<Volume>()
        .create(&PostParams::default(), &Volume::new(&new.name, spec))
        .await?;
    info!(
        user = caller.name(),
        volume = new.name,
        "volume made through the API"
    );
    Ok((StatusCode::CREATED, Json(view(&state, &made))))
}

/// Makes a clone of a volume: a snapshot of it is taken for the clone,
/// which is filled from it (and then deletes it).
#[utoipa::path(
    operation_id = "clone_volume",
    post,
    path = "/v1/volumes/{name}/clone",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume to clone")),
    request_body = NewClone,
    responses(
        (status = 201, description = "Made: the controllers fill it", body = VolumeView),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not read the volume, or create volumes and snapshots", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "A volume of that name exists, or the source is being deleted or is a standby", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn clone(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    for access in [
        Access::oxhorn("get", "volumes", Some(&name)),
        Access::oxhorn("create", "volumes", None),
        Access::oxhorn("create", "snapshots", None),
    ] {
        state.auth.authorize(&caller, &access).await?;
    }
    let new: NewClone = body.parse()?;
    check_name("the clone's name", &new.name)?;
    let source = volume(&state, &name).await?;
    if source.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::Conflict(format!(
            "volume {name} is being deleted"
        )));
    }
    if let Some(refusal) = source.standby_refusal("be cloned") {
        return Err(ApiError::Conflict(refusal));
    }
    let size = size_for(new.size, source.spec.size)?;
    let snapshot = clone_source(&new.name, &name);
    let mut spec = spec(
        &Settings::read(&state.ds.settings),
        size,
        Source::Snapshot(snapshot.name_any()),
    );
    spec.number_of_replicas = new
        .number_of_replicas
        .unwrap_or(source.spec.number_of_replicas);
    spec.frontend = source.spec.frontend;
    spec.data_locality = source.spec.data_locality;
    spec.disk_selector.clone_from(&source.spec.disk_selector);
    spec.node_selector.clone_from(&source.spec.node_selector);
    let clone = Volume::new(&new.name, spec);
    // The clone is checked whole before its snapshot is taken: bad input
    // leaves nothing behind.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let volumes = state.api::<Volume>();
    volumes.create(&dry_run, &clone).await?;
    let snapshots = state.api::<Snapshot>();
    if create_if_absent(&snapshots, &snapshot).await?.is_none() {
        // Left by an earlier try: only if it is of this source, for this
        // clone, is it the clone's.
        let left = snapshots.get(&snapshot.name_any()).await?;
        let for_clone = left.labels().get(CLONE_FOR) == Some(&new.name);
        let going = left.metadata.deletion_timestamp.is_some();
        if left.spec.volume != name || !for_clone || going {
            return Err(ApiError::Conflict(format!(
                "snapshot {} exists and is not of volume {name} for this clone",
                left.name_any()
            )));
        }
    }
    let made = match volumes.create(&PostParams::default(), &clone).await {
        Ok(made) => made,
        // A clone of that name made meanwhile fills from the snapshot.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            return Err(ApiError::Conflict(status.message));
        }
        // Refused: the snapshot taken for it goes. (Not when unanswered:
        // the clone may have been made, and would then need it.)
        Err(kube::Error::Api(status)) => {
            let _ = snapshots
                .delete(&snapshot.name_any(), &Default::default())
                .await;
            return Err(kube::Error::Api(status).into());
        }
        Err(error) => return Err(error.into()),
    };
    info!(
        user = caller.name(),
        volume = new.name,
        source = name,
        "clone made through the API"
    );
    Ok((StatusCode::CREATED, Json(view(&state, &made))))
}

/// A volume's name: the names of its replicas, engine and clone snapshots
/// are made from it, and must stay valid.
fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    validate_dns_subdomain(what, name).map_err(ApiError::Invalid)?;
    if name.len() > VOLUME_NAME_MAX || name.contains('.') {
        return Err(ApiError::Invalid(format!(
            "{what} must be at most {VOLUME_NAME_MAX} characters of a-z, 0-9 and -"
        )));
    }
    Ok(())
}

/// What fills a new volume.
enum Source {
    None,
    Backup(String),
    Snapshot(String),
}

/// A new volume's spec, as the CSI controller writes it for a claim with
/// no StorageClass parameters; the callers set what the user chose.
fn spec(settings: &Settings, size: i64, source: Source) -> VolumeSpec {
    let (from_backup, data_source) = match source {
        Source::None => (String::new(), None),
        Source::Backup(backup) => (backup, None),
        Source::Snapshot(snapshot) => (String::new(), Some(DataSource::Snapshot(snapshot))),
    };
    VolumeSpec {
        size,
        number_of_replicas: settings.default_replica_count,
        frontend: VolumeFrontend::default(),
        chap_secret: String::new(),
        node_id: String::new(),
        data_locality: DataLocality::default(),
        stale_replica_timeout: settings.stale_replica_timeout,
        from_backup,
        salvage_request: String::new(),
        disk_selector: Vec::new(),
        node_selector: Vec::new(),
        replica_auto_balance: ReplicaAutoBalance::default(),
        access_mode: AccessMode::default(),
        data_source,
        revert: None,
        standby: false,
    }
}

/// The size asked for, or the source's; never less than the source's.
fn size_for(asked: Option<i64>, source: i64) -> Result<i64, ApiError> {
    let size = match asked {
        Some(size) => size,
        None if source > 0 => source,
        None => return Err(ApiError::Invalid("size is needed".into())),
    };
    if size < source {
        return Err(ApiError::Invalid(format!(
            "size {size} is less than the source's {source} bytes"
        )));
    }
    if size < 4096 || size % 4096 != 0 {
        return Err(ApiError::Invalid(format!(
            "size {size} is not a whole, positive number of 4096-byte blocks"
        )));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_is_whole_blocks_and_holds_the_source() {
        assert_eq!(size_for(Some(8192), 4096).unwrap(), 8192);
        assert_eq!(size_for(None, 8192).unwrap(), 8192);
        for (asked, source) in [(None, 0), (Some(4096), 8192), (Some(4097), 0), (Some(0), 0)] {
            let error = size_for(asked, source).unwrap_err();
            assert_eq!(error.code(), "invalid", "{asked:?} {source}");
        }
    }

    #[test]
    fn a_volume_name_leaves_room_for_its_parts() {
        assert!(check_name("name", &"a".repeat(48)).is_ok());
        for bad in ["a".repeat(49), "a.b".into(), "A".into(), String::new()] {
            assert_eq!(
                check_name("name", &bad).unwrap_err().code(),
                "invalid",
                "{bad}"
            );
        }
    }

    #[test]
    fn a_new_volume_takes_unknown_fields_as_errors() {
        let bad = serde_json::from_str::<NewVolume>(r#"{"name": "a", "size": 4096, "bogus": 1}"#);
        assert!(bad.unwrap_err().to_string().contains("bogus"));
        let bad = serde_json::from_str::<NewVolume>(r#"{"name": "a", "frontend": "nbd"}"#);
        assert!(bad.unwrap_err().to_string().contains("nbd"));
    }
}
