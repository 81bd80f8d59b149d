//! `/v1/volumes`: the volumes, as the caches hold them; making them
//! (`create.rs`), what may be done to one (`actions.rs`, `revert.rs`,
//! `standby.rs`), deleting one.
//! The controllers do the rest.

pub mod actions;
pub mod create;
pub mod revert;
pub mod standby;

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Preconditions};
use serde::{Deserialize, Serialize};
use tracing::info;
use utoipa::{IntoParams, ToSchema};

use super::auth::{Access, Caller};
use super::error::{ApiError, ErrorBody};
use super::page::{self, Page};
use super::query::Query;
use super::{ApiState, found, lower};
use crate::types::{PVC_NAME, PVC_NAMESPACE, ReplicaMode, Snapshot, Volume, engine_name};

/// A volume as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeView {
    pub name: String,
    /// Bytes.
    pub size: i64,
    /// Bytes its data takes on a replica.
    pub actual_size: i64,
    pub replicas_wanted: i32,
    /// Replicas in the I/O path (RW) while it is attached.
    pub replicas_healthy: usize,
    /// `auto`, `fuse` or `iscsi`.
    pub frontend: String,
    /// The node it is attached to, or is to be; empty: detached.
    pub node: String,
    /// creating, attaching, attached, detaching, detached, deleting.
    pub state: String,
    /// unknown, healthy, degraded, faulted.
    pub robustness: String,
    /// The claim it was provisioned for, `namespace/name`, if any.
    pub pvc: Option<String>,
    /// When it was created, RFC 3339.
    pub created: Option<String>,
    /// The last revert to a snapshot asked, and where it is.
    pub revert: Option<revert::RevertView>,
    /// For a standby volume, or one that was: what it holds and follows.
    pub standby: Option<standby::StandbyView>,
}

/// A page of volumes.
pub type VolumeList = Page<VolumeView>;

/// Which volumes, and which page of them (by name).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// At most this many (1 to 1000; default 100).
    pub limit: Option<usize>,
    /// From the page after the one that returned this.
    pub r#continue: Option<String>,
    /// Only those in this state.
    pub state: Option<String>,
    /// Only those of this robustness.
    pub robustness: Option<String>,
    /// Only those attached (or to be) to this node.
    pub node: Option<String>,
    /// Only those whose name holds this.
    pub name: Option<String>,
}

pub fn view(state: &ApiState, volume: &Volume) -> VolumeView {
    let name = volume.name_any();
    let status = volume.status.clone().unwrap_or_default();
    let annotations = volume.annotations();
    let pvc = match (annotations.get(PVC_NAMESPACE), annotations.get(PVC_NAME)) {
        (Some(namespace), Some(claim)) => Some(format!("{namespace}/{claim}")),
        _ => None,
    };
    let replicas_healthy = state
        .ds
        .engines
        .get(&engine_name(&name))
        .and_then(|e| e.status.clone())
        .map_or(0, |s| {
            s.replica_mode_map
                .values()
                .filter(|m| **m == ReplicaMode::ReadWrite)
                .count()
        });
    VolumeView {
        size: volume.spec.size,
        actual_size: status.actual_size,
        replicas_wanted: volume.spec.number_of_replicas,
        replicas_healthy,
        frontend: lower(&volume.spec.frontend),
        node: volume.spec.node_id.clone(),
        state: lower(&status.state),
        robustness: lower(&status.robustness),
        pvc,
        created: volume
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        revert: revert::RevertView::of(volume),
        standby: standby::StandbyView::of(volume),
        name,
    }
}

fn matches(query: &ListQuery, volume: &VolumeView) -> bool {
    let is = |wanted: &Option<String>, value: &str| wanted.as_deref().is_none_or(|w| w == value);
    is(&query.state, &volume.state)
        && is(&query.robustness, &volume.robustness)
        && is(&query.node, &volume.node)
        && query
            .name
            .as_deref()
            .is_none_or(|part| volume.name.contains(part))
}

/// The volumes, by name, a page at a time.
#[utoipa::path(
    operation_id = "list_volumes",
    get,
    path = "/v1/volumes",
    tag = "volumes",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of volumes", body = Page<VolumeView>),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list volumes", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Query(query): Query<ListQuery>,
) -> Result<Json<VolumeList>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "volumes", None))
        .await?;
    let limit = page::limit(query.limit)?;
    let all = state
        .ds
        .volumes
        .store
        .state()
        .iter()
        .map(|v| view(&state, v))
        .filter(|v| matches(&query, v))
        .collect();
    let name: fn(&VolumeView) -> &str = |v| &v.name;
    Ok(Json(page::page(
        all,
        name,
        query.r#continue.as_deref(),
        limit,
    )))
}

/// One volume.
#[utoipa::path(
    operation_id = "get_volume",
    get,
    path = "/v1/volumes/{name}",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 200, description = "The volume", body = VolumeView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not get it", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<VolumeView>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("get", "volumes", Some(&name)))
        .await?;
    let volume = volume(&state, &name).await?;
    Ok(Json(view(&state, &volume)))
}

/// Deletes a volume and its data (its replicas, snapshots; not its
/// backups). A volume a PersistentVolume uses is better deleted through
/// its claim.
#[utoipa::path(
    operation_id = "delete_volume",
    delete,
    path = "/v1/volumes/{name}",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 202, description = "Deleting: the volume as it was", body = VolumeView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not delete it", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "It is attached, a claim uses it, it has snapshots or is being cloned, or it changed meanwhile", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("delete", "volumes", Some(&name)))
        .await?;
    let volume = delete_as_judged(&state, &name).await?;
    info!(
        user = caller.name(),
        volume = name,
        "deleting the volume, as asked through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))))
}

/// How many times a volume changed between its judgement and its deletion
/// (its controllers write its status often) is judged again.
const JUDGEMENTS: usize = 5;

/// Deletes volume `name` if, as the API server holds it and its snapshots
/// now, nothing blocks it, and only as judged (its resourceVersion): a
/// volume that changed meanwhile is judged again. The volume as deleted.
async fn delete_as_judged(state: &ApiState, name: &str) -> Result<Volume, ApiError> {
    let volumes = state.api::<Volume>();
    let mut judged = 0;
    loop {
        let Some(volume) = volumes.get_opt(name).await? else {
            return Err(ApiError::NotFound {
                kind: "volume",
                name: name.to_owned(),
            });
        };
        let snapshots = state.api::<Snapshot>().list(&ListParams::default()).await?;
        if let Some(blocker) = deletion_blocker(&volume, &snapshots.items) {
            return Err(ApiError::Conflict(blocker));
        }
        let as_judged = DeleteParams {
            preconditions: Some(Preconditions {
                uid: volume.uid(),
                resource_version: volume.resource_version(),
            }),
            ..DeleteParams::default()
        };
        judged += 1;
        match volumes.delete(name, &as_judged).await {
            Ok(_) => return Ok(volume),
            Err(kube::Error::Api(refused)) if refused.code == 409 && judged < JUDGEMENTS => {}
            Err(error) => return Err(error.into()),
        }
    }
}

/// Why the volume may not be deleted now, as CSI's DeleteVolume refuses
/// it and more: it is attached, a claim uses it (delete the claim), a
/// clone is being filled from it, or it has snapshots (which live in its
/// replicas, and may back VolumeSnapshots).
fn deletion_blocker(volume: &Volume, snapshots: &[Snapshot]) -> Option<String> {
    let name = volume.name_any();
    if !volume.spec.node_id.is_empty() {
        return Some(format!(
            "volume {name} is attached to {}; detach it first",
            volume.spec.node_id
        ));
    }
    let annotations = volume.annotations();
    if let (Some(namespace), Some(claim)) =
        (annotations.get(PVC_NAMESPACE), annotations.get(PVC_NAME))
    {
        return Some(format!(
            "volume {name} was made for the claim {namespace}/{claim}: delete the claim, and its PersistentVolume deletes the volume"
        ));
    }
    crate::types::deletion_blocker(&name, snapshots)
}

async fn volume(state: &ApiState, name: &str) -> Result<Arc<Volume>, ApiError> {
    found(state, &state.ds.volumes, "volume", name).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(name: &str, state: &str) -> VolumeView {
        VolumeView {
            name: name.into(),
            size: 1 << 30,
            actual_size: 0,
            replicas_wanted: 3,
            replicas_healthy: 0,
            frontend: "auto".into(),
            node: String::new(),
            state: state.into(),
            robustness: "unknown".into(),
            pvc: None,
            created: None,
            revert: None,
            standby: None,
        }
    }

    #[test]
    fn filters_match_exactly_and_names_by_part() {
        let query = ListQuery {
            state: Some("detached".into()),
            name: Some("db".into()),
            ..ListQuery::default()
        };
        assert!(matches(&query, &volume("pg-db-1", "detached")));
        assert!(!matches(&query, &volume("pg-db-1", "attached")));
        assert!(!matches(&query, &volume("web", "detached")));
        assert!(matches(&ListQuery::default(), &volume("web", "attached")));
    }
}
