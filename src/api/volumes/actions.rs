//! What may be done to a volume: attach it to a node or detach it, grow
//! it, change how it is replicated, salvage it. Each is a change to the
//! volume's spec (or, to grow a volume a claim uses, to the claim), made
//! only to the spec the manager saw (its generation): if it changed
//! meanwhile, the caller hears 409 and may look again.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::info;
use utoipa::ToSchema;

use super::{ApiState, VolumeView, view, volume};
use crate::api::auth::{Access, Caller, Scope};
use crate::api::body::Body;
use crate::api::error::{ApiError, ErrorBody};
use crate::types::{
    DataLocality, PUBLISHED_READONLY, PVC_NAME, PVC_NAMESPACE, ReplicaAutoBalance, Robustness,
    Volume,
};

/// Where to attach a volume.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Attach {
    /// An oxhorn node.
    pub node: String,
}

/// A volume's new size.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Expand {
    /// Bytes, a whole number of 4096-byte blocks, no less than now.
    pub size: i64,
}

/// How a volume is to be replicated; what is left out stays.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeChange {
    /// 1 to 20.
    pub number_of_replicas: Option<i32>,
    /// `disabled`, `best-effort` or `strict-local`.
    #[schema(value_type = Option<String>)]
    pub data_locality: Option<DataLocality>,
    /// `ignored`, `disabled`, `least-effort` or `best-effort`.
    #[schema(value_type = Option<String>)]
    pub replica_auto_balance: Option<ReplicaAutoBalance>,
}

/// Attaches a detached volume to a node, for maintenance or to read it
/// there; a workload's volume is attached by Kubernetes.
#[utoipa::path(
    operation_id = "attach_volume",
    post,
    path = "/v1/volumes/{name}/attach",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    request_body = Attach,
    responses(
        (status = 202, description = "Attaching: the volume as it was", body = VolumeView),
        (status = 400, description = "Bad input, or no such node", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the volume", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "Attached elsewhere, being deleted or reverted, a standby, or changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn attach(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    authorize_patch(&state, &caller, &name).await?;
    let Attach { node } = body.parse()?;
    let volume = volume(&state, &name).await?;
    if state.ds.nodes.get(&node).is_none() {
        return Err(ApiError::Invalid(format!("{node} is not an oxhorn node")));
    }
    if volume.metadata.deletion_timestamp.is_some() {
        return Err(ApiError::Conflict(format!(
            "volume {name} is being deleted; it takes no new attachment"
        )));
    }
    if let Some(refusal) = volume.standby_refusal(&format!("attach to {node}")) {
        return Err(ApiError::Conflict(refusal));
    }
    match volume.spec.node_id.as_str() {
        "" if volume.revert_pending() => {
            return Err(ApiError::Conflict(format!(
                "volume {name} is being reverted to a snapshot; attach it once that is done"
            )));
        }
        "" => {
            patch_spec(&state, &volume, json!({"nodeID": node})).await?;
            info!(
                user = caller.name(),
                volume = name,
                node,
                "attaching, as asked through the API"
            );
        }
        current if current == node => {}
        current => {
            return Err(ApiError::Conflict(format!(
                "volume {name} is attached to {current}; detach it first"
            )));
        }
    }
    Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))))
}

/// Detaches a volume attached through the API. One Kubernetes attached for
/// a pod is refused: its pod would lose its disk.
#[utoipa::path(
    operation_id = "detach_volume",
    post,
    path = "/v1/volumes/{name}/detach",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 202, description = "Detaching: the volume as it was", body = VolumeView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the volume", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "Kubernetes attached it for a pod, or it changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn detach(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    authorize_patch(&state, &caller, &name).await?;
    let volume = volume(&state, &name).await?;
    if volume.annotations().contains_key(PUBLISHED_READONLY) {
        return Err(ApiError::Conflict(format!(
            "Kubernetes attached volume {name} to {} for a pod; it detaches when no pod there uses it",
            volume.spec.node_id
        )));
    }
    if !volume.spec.node_id.is_empty() {
        patch_spec(&state, &volume, json!({"nodeID": ""})).await?;
        info!(
            user = caller.name(),
            volume = name,
            "detaching, as asked through the API"
        );
    }
    Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))))
}

/// Grows a volume. One a claim uses is grown through its claim (as
/// `kubectl` would: the caller must be allowed to patch the claim), so the
/// claim, its PersistentVolume and the filesystem on it follow.
#[utoipa::path(
    operation_id = "expand_volume",
    post,
    path = "/v1/volumes/{name}/expand",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    request_body = Expand,
    responses(
        (status = 202, description = "Growing: the volume as it was", body = VolumeView),
        (status = 400, description = "Bad input: not whole blocks, or smaller than now", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the volume, or its claim", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "It changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn expand(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    authorize_patch(&state, &caller, &name).await?;
    let Expand { size } = body.parse()?;
    let volume = volume(&state, &name).await?;
    check_growth(volume.spec.size, size)?;
    let annotations = volume.annotations();
    match (annotations.get(PVC_NAMESPACE), annotations.get(PVC_NAME)) {
        (Some(namespace), Some(claim)) => {
            let access = Access::core(
                "patch",
                "persistentvolumeclaims",
                Scope::Namespace(namespace.clone()),
                Some(claim),
            );
            state.auth.authorize(&caller, &access).await?;
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(state.client.clone(), namespace);
            let patch = json!({"spec": {"resources": {"requests": {"storage": size.to_string()}}}});
            claims
                .patch(claim, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        _ => {
            patch_spec(&state, &volume, json!({"size": size})).await?;
        }
    }
    info!(
        user = caller.name(),
        volume = name,
        size,
        "growing, as asked through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))))
}

/// Changes how a volume is replicated.
#[utoipa::path(
    operation_id = "update_volume",
    patch,
    path = "/v1/volumes/{name}",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    request_body = VolumeChange,
    responses(
        (status = 200, description = "Changed: the volume as it now is", body = VolumeView),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the volume", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "It changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn update(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body,
) -> Result<Json<VolumeView>, ApiError> {
    authorize_patch(&state, &caller, &name).await?;
    let change: VolumeChange = body.parse()?;
    let volume = volume(&state, &name).await?;
    let mut spec = serde_json::Map::new();
    if let Some(replicas) = change.number_of_replicas {
        spec.insert("numberOfReplicas".into(), replicas.into());
    }
    if let Some(locality) = change.data_locality {
        spec.insert("dataLocality".into(), json!(locality));
    }
    if let Some(balance) = change.replica_auto_balance {
        spec.insert("replicaAutoBalance".into(), json!(balance));
    }
    if spec.is_empty() {
        return Ok(Json(view(&state, &volume)));
    }
    let changed = patch_spec(&state, &volume, Value::Object(spec)).await?;
    info!(
        user = caller.name(),
        volume = name,
        ?change,
        "changed, as asked through the API"
    );
    Ok(Json(view(&state, &changed)))
}

/// Brings a faulted volume up from the replicas that can be reached now,
/// even when replicas holding newer acknowledged writes cannot be: those
/// writes are lost. Refused for a volume that is not faulted: salvaging
/// restarts its engine.
#[utoipa::path(
    operation_id = "salvage_volume",
    post,
    path = "/v1/volumes/{name}/salvage",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 202, description = "Asked: the volume as it was", body = VolumeView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not patch the volume", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "It is not faulted, or changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn salvage(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    authorize_patch(&state, &caller, &name).await?;
    let volume = volume(&state, &name).await?;
    let robustness = volume.status.as_ref().map(|s| s.robustness);
    if robustness != Some(Robustness::Faulted) {
        return Err(ApiError::Conflict(format!(
            "volume {name} is not faulted: salvage is for a volume none of whose replicas can serve"
        )));
    }
    let request = jiff::Timestamp::now().to_string();
    patch_spec(&state, &volume, json!({"salvageRequest": request})).await?;
    info!(
        user = caller.name(),
        volume = name,
        "salvage asked through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(view(&state, &volume))))
}

pub(super) async fn authorize_patch(
    state: &ApiState,
    caller: &Caller,
    name: &str,
) -> Result<(), ApiError> {
    let access = Access::oxhorn("patch", "volumes", Some(name));
    state.auth.authorize(caller, &access).await
}

fn check_growth(now: i64, asked: i64) -> Result<(), ApiError> {
    if asked < now {
        return Err(ApiError::Invalid(format!(
            "a volume cannot shrink: it is {now} bytes, not {asked}"
        )));
    }
    if asked % 4096 != 0 {
        return Err(ApiError::Invalid(format!(
            "size {asked} is not a whole number of 4096-byte blocks"
        )));
    }
    Ok(())
}

/// Sets the fields of `spec` in the volume's spec, if its spec is still
/// the one `volume` had.
async fn patch_spec(state: &ApiState, volume: &Volume, spec: Value) -> Result<Volume, ApiError> {
    let ops = match spec {
        Value::Object(fields) => fields
            .into_iter()
            .map(|(field, value)| json!({"op": "add", "path": format!("/spec/{field}"), "value": value}))
            .collect(),
        _ => Vec::new(),
    };
    crate::api::at_generation(state, volume, "volume", ops).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_grows_by_whole_blocks_only() {
        assert!(check_growth(4096, 4096).is_ok());
        assert!(check_growth(4096, 8192).is_ok());
        assert_eq!(check_growth(8192, 4096).unwrap_err().code(), "invalid");
        assert_eq!(check_growth(4096, 5000).unwrap_err().code(), "invalid");
    }
}
