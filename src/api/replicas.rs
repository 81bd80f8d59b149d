//! A volume's replicas: where each is, its place in the I/O path and how
//! far its rebuild has come; deleting one, which the volume controller
//! replaces. The last replica holding the volume's data is never deleted
//! here: that would lose it.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use tracing::info;
use utoipa::ToSchema;

use super::auth::{Access, Caller};
use super::error::{ApiError, ErrorBody};
use super::{ApiState, found, lower, only};
use crate::types::{Engine, Replica, ReplicaMode, Volume, engine_name};
use kube::api::{ListParams, Patch, PatchParams};

/// A replica as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaView {
    pub name: String,
    pub volume: String,
    /// Empty until it is placed.
    pub node: String,
    pub disk_path: String,
    /// The process: stopped, starting, running, stopping, error, unknown.
    pub state: String,
    /// In the I/O path of the volume's engine: `RW` (serves reads and
    /// writes), `WO` (rebuilding), `ERR` (failed); none while detached.
    pub mode: Option<String>,
    /// Percent of its rebuild done, while it is rebuilt.
    pub rebuild_progress: Option<i32>,
    /// When it last became healthy, and last failed, RFC 3339.
    pub healthy_at: Option<String>,
    pub failed_at: Option<String>,
    pub deleting: bool,
}

fn view(replica: &Replica, engine: Option<&Engine>) -> ReplicaView {
    let name = replica.name_any();
    let status = engine.and_then(|e| e.status.as_ref());
    let mode = status.and_then(|s| s.replica_mode_map.get(&name));
    let rebuild = status
        .and_then(|s| {
            let address = s.current_replica_address_map.get(&name)?;
            s.rebuild_status.get(address)
        })
        .filter(|r| r.is_rebuilding);
    let time = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.as_ref().map(|t| t.0.to_string())
    };
    ReplicaView {
        volume: replica.spec.instance.volume_name.clone(),
        node: replica.spec.instance.node_id.clone(),
        disk_path: replica.spec.disk_path.clone(),
        state: replica
            .status
            .as_ref()
            .map_or("unknown".into(), |s| lower(&s.current_state)),
        mode: mode.map(lower),
        rebuild_progress: rebuild.map(|r| r.progress),
        healthy_at: time(&replica.spec.healthy_at),
        failed_at: time(&replica.spec.failed_at),
        deleting: replica.metadata.deletion_timestamp.is_some(),
        name,
    }
}

/// The replicas of `volume`, by name.
fn replicas_of(state: &ApiState, volume: &str) -> Vec<Arc<Replica>> {
    let mut replicas: Vec<_> = state
        .ds
        .replicas
        .store
        .state()
        .into_iter()
        .filter(|r| r.spec.instance.volume_name == volume)
        .collect();
    replicas.sort_by_key(|r| r.name_any());
    replicas
}

/// A volume's replicas.
#[utoipa::path(
    operation_id = "list_replicas",
    get,
    path = "/v1/volumes/{name}/replicas",
    tag = "replicas",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 200, description = "Its replicas, by name", body = Vec<ReplicaView>),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list replicas", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Vec<ReplicaView>>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "replicas", None))
        .await?;
    found(&state, &state.ds.volumes, "volume", &name).await?;
    Ok(Json(of_volume(&state, &name)))
}

/// `volume`'s replicas, by name.
pub fn of_volume(state: &ApiState, volume: &str) -> Vec<ReplicaView> {
    let engine = state.ds.engines.get(&engine_name(volume));
    replicas_of(state, volume)
        .iter()
        .map(|r| view(r, engine.as_deref()))
        .collect()
}

/// Deletes a replica; the volume controller makes another and rebuilds it
/// from the healthy ones. Refused for the volume's last healthy replica.
#[utoipa::path(
    operation_id = "delete_replica",
    delete,
    path = "/v1/replicas/{name}",
    tag = "replicas",
    params(("name" = String, Path, description = "The replica's name")),
    responses(
        (status = 202, description = "Deleting: the replica as it was", body = ReplicaView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not delete it", body = ErrorBody),
        (status = 404, description = "No such replica", body = ErrorBody),
        (status = 409, description = "It is the last to hold the volume's data, or changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<ReplicaView>), ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("delete", "replicas", Some(&name)))
        .await?;
    // One deletion at a time here, judged on what the API server holds now:
    // two deletions at once must not each leave the other the last copy.
    let _one_at_a_time = state.replica_deletes.lock().await;
    let replica = found(&state, &state.ds.replicas, "replica", &name).await?;
    let volume = &replica.spec.instance.volume_name;
    // A revert under way waits for every replica of the volume's I/O path:
    // one deleted meanwhile would hold it back for good.
    if let Some(reverting) = state.api::<Volume>().get_opt(volume).await?
        && reverting.revert_pending()
    {
        return Err(ApiError::Conflict(format!(
            "volume {volume} is being reverted to a snapshot; delete its replicas once that is done"
        )));
    }
    claim_deletion(&state, volume, &name).await?;
    let engine = state.api::<Engine>().get_opt(&engine_name(volume)).await?;
    let listed = state.api::<Replica>().list(&ListParams::default()).await?;
    let siblings: Vec<Arc<Replica>> = listed
        .items
        .into_iter()
        .filter(|r| r.spec.instance.volume_name == *volume)
        .map(Arc::new)
        .collect();
    if !another_holds_the_data(&replica, &siblings, engine.as_ref()) {
        // Not deleted: its claim must not hold others back.
        let patch = serde_json::json!({"metadata": {"annotations": {DELETING_REPLICA: null}}});
        let _ = state
            .api::<Volume>()
            .patch(volume, &PatchParams::default(), &Patch::Merge(patch))
            .await;
        return Err(ApiError::Conflict(format!(
            "no replica of volume {volume} but {name} is known to hold its data; add a replica and let it rebuild first"
        )));
    }
    state
        .api::<Replica>()
        .delete(&name, &only(&*replica))
        .await?;
    info!(
        user = caller.name(),
        volume,
        replica = name,
        "replica deleted through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(view(&replica, engine.as_ref()))))
}

/// The annotation on a Volume naming the replica of it being deleted
/// through the API, and since when: `<replica> <RFC 3339 time>`.
const DELETING_REPLICA: &str = "oxhorn.io/api-deleting-replica";

/// How long a claim on a volume's replica deletion holds if its manager
/// never finished it (it died between the claim and the delete).
const CLAIM_HOLDS: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// Claims the right to delete a replica of `volume` (`name`), on the
/// Volume itself, so that across every manager serving the API one
/// deletion at a time is judged: the claim is written only over the
/// Volume as read (its resourceVersion), and only once the replica an
/// earlier claim named is being deleted, gone, or its claim has expired.
/// Whoever judges next then sees that replica as going.
async fn claim_deletion(state: &ApiState, volume: &str, name: &str) -> Result<(), ApiError> {
    let volumes = state.api::<Volume>();
    let current = volumes.get(volume).await?;
    if let Some(claim) = current.annotations().get(DELETING_REPLICA) {
        let (earlier, since) = claim.split_once(' ').unwrap_or((claim, ""));
        let fresh = since
            .parse::<jiff::Timestamp>()
            .is_ok_and(|at| jiff::Timestamp::now().duration_since(at) < CLAIM_HOLDS);
        let earlier_going = match state.api::<Replica>().get_opt(earlier).await? {
            Some(replica) => replica.metadata.deletion_timestamp.is_some(),
            None => true,
        };
        if fresh && !earlier_going && earlier != name {
            return Err(ApiError::Conflict(format!(
                "replica {earlier} of volume {volume} is being deleted; try again in a moment"
            )));
        }
    }
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": current.resource_version(),
        "annotations": {DELETING_REPLICA: format!("{name} {}", jiff::Timestamp::now())},
    }});
    volumes
        .patch(volume, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Whether a replica other than `replica`, not being deleted, is known to
/// hold the volume's data: while the volume is attached, one RW in its
/// engine; while it is detached, one that became healthy and has not
/// failed since. When none does (a faulted volume), no replica may go:
/// each may hold what a salvage would bring back.
fn another_holds_the_data(
    replica: &Replica,
    all: &[Arc<Replica>],
    engine: Option<&Engine>,
) -> bool {
    let modes = engine
        .and_then(|e| e.status.as_ref())
        .map(|s| &s.replica_mode_map)
        .filter(|m| !m.is_empty());
    let own = replica.name_any();
    let holds = |r: &Replica| match modes {
        Some(modes) => modes.get(&r.name_any()) == Some(&ReplicaMode::ReadWrite),
        None => r.spec.healthy_at.is_some() && r.spec.failed_at.is_none(),
    };
    all.iter()
        .filter(|r| r.name_any() != own && r.metadata.deletion_timestamp.is_none())
        .any(|r| holds(r))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::types::{EngineStatus, InstanceSpec, ReplicaSpec};

    fn replica(name: &str, healthy: bool, failed: bool) -> Arc<Replica> {
        let time = || Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let spec = ReplicaSpec {
            instance: InstanceSpec {
                volume_name: "v".into(),
                volume_size: 4096,
                node_id: String::new(),
                desire_state: Default::default(),
                image: String::new(),
            },
            engine_name: "v-e".into(),
            disk_id: String::new(),
            disk_path: String::new(),
            data_directory_name: String::new(),
            healthy_at: healthy.then(time).flatten(),
            failed_at: failed.then(time).flatten(),
            rejoins: 0,
        };
        Arc::new(Replica::new(name, spec))
    }

    fn engine(modes: &[(&str, ReplicaMode)]) -> Engine {
        let mut engine: Engine = serde_json::from_value(serde_json::json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Engine",
            "metadata": {"name": "v-e"},
            "spec": {"volumeName": "v", "volumeSize": 4096},
        }))
        .unwrap();
        let map: BTreeMap<_, _> = modes.iter().map(|(n, m)| ((*n).to_owned(), *m)).collect();
        engine.status = Some(EngineStatus {
            replica_mode_map: map,
            ..EngineStatus::default()
        });
        engine
    }

    #[test]
    fn a_replica_goes_only_while_another_holds_the_data() {
        let all = [replica("a", true, false), replica("b", true, false)];
        // Attached: what the engine serves from counts.
        let both = engine(&[("a", ReplicaMode::ReadWrite), ("b", ReplicaMode::ReadWrite)]);
        assert!(another_holds_the_data(&all[0], &all, Some(&both)));
        let one = engine(&[("a", ReplicaMode::ReadWrite), ("b", ReplicaMode::WriteOnly)]);
        assert!(!another_holds_the_data(&all[0], &all, Some(&one)));
        // A rebuilding replica may go: the healthy one stays.
        assert!(another_holds_the_data(&all[1], &all, Some(&one)));
        // Faulted: none holds the data for sure, so none goes.
        let none = engine(&[("a", ReplicaMode::Error), ("b", ReplicaMode::Error)]);
        assert!(!another_holds_the_data(&all[0], &all, Some(&none)));
        assert!(!another_holds_the_data(&all[1], &all, Some(&none)));
        // Detached: replicas that were healthy and have not failed since.
        assert!(another_holds_the_data(&all[0], &all, None));
        let failed = [replica("a", true, false), replica("b", true, true)];
        assert!(!another_holds_the_data(&failed[0], &failed, None));
        assert!(another_holds_the_data(&failed[1], &failed, None));
        let both_failed = [replica("a", true, true), replica("b", true, true)];
        assert!(!another_holds_the_data(&both_failed[0], &both_failed, None));
    }
}
