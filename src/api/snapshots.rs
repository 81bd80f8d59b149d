//! A volume's snapshots, oldest first, each naming the one before it (its
//! parent: a volume's snapshots form a chain), taken and deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kube::ResourceExt;
use kube::api::PostParams;
use serde::{Deserialize, Serialize};
use tracing::info;
use utoipa::ToSchema;

use super::auth::{Access, Caller};
use super::body::Body;
use super::error::{ApiError, ErrorBody};
use super::{ApiState, found, only};
use crate::names::validate_dns_subdomain;
use crate::replica::{SNAPSHOT_NAME_MAX, validate_snapshot_name};
use crate::types::{BACKUP_FOR, CLONE_FOR, Snapshot, SnapshotSpec, engine_name};

/// A snapshot as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotView {
    pub name: String,
    pub volume: String,
    /// The snapshot before it; none for the first.
    pub parent: Option<String>,
    /// Taken on the replicas, usable to restore or clone from.
    pub ready_to_use: bool,
    /// The volume's size in bytes when it was taken.
    pub size: i64,
    /// When it was taken, RFC 3339.
    pub created: Option<String>,
    /// `user`, or what it was taken for: `backup` (the Backup named in
    /// `for`) or `clone` (the volume named in `for`).
    pub purpose: String,
    pub r#for: Option<String>,
    /// Why it could not be taken or removed.
    pub error: String,
    pub deleting: bool,
}

/// A new snapshot.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSnapshot {
    /// Default: the volume's name and the time.
    pub name: Option<String>,
}

fn view(snapshot: &Snapshot, parent: Option<String>) -> SnapshotView {
    let status = snapshot.status.clone().unwrap_or_default();
    let labels = snapshot.labels();
    let (purpose, r#for) = match (labels.get(BACKUP_FOR), labels.get(CLONE_FOR)) {
        (Some(backup), _) => ("backup", Some(backup.clone())),
        (None, Some(clone)) => ("clone", Some(clone.clone())),
        (None, None) => ("user", None),
    };
    SnapshotView {
        name: snapshot.name_any(),
        volume: snapshot.spec.volume.clone(),
        parent,
        ready_to_use: status.ready_to_use,
        size: status.size,
        created: status
            .creation_time
            .or_else(|| snapshot.metadata.creation_timestamp.clone())
            .map(|t| t.0.to_string()),
        purpose: purpose.into(),
        r#for,
        error: status.error,
        deleting: snapshot.metadata.deletion_timestamp.is_some(),
    }
}

/// A volume's snapshots, oldest first.
#[utoipa::path(
    operation_id = "list_snapshots",
    get,
    path = "/v1/volumes/{name}/snapshots",
    tag = "snapshots",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 200, description = "Its snapshots, oldest first", body = Vec<SnapshotView>),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not list snapshots", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Vec<SnapshotView>>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("list", "snapshots", None))
        .await?;
    found(&state, &state.ds.volumes, "volume", &name).await?;
    Ok(Json(chain(&state, &name)))
}

/// `name`'s snapshots, oldest first, each with its parent.
pub fn chain(state: &ApiState, name: &str) -> Vec<SnapshotView> {
    let mut snapshots: Vec<Arc<Snapshot>> = state
        .ds
        .snapshots
        .store
        .state()
        .into_iter()
        .filter(|s| s.spec.volume == name)
        .collect();
    let engine = state.ds.engines.get(&engine_name(name));
    let parents: BTreeMap<&str, &str> = engine
        .as_ref()
        .and_then(|e| e.status.as_ref())
        .map(|s| {
            let parents = s.snapshots.iter();
            parents
                .map(|(n, i)| (n.as_str(), i.parent.as_str()))
                .collect()
        })
        .unwrap_or_default();
    // In the engine's chain first (times are to the second), then those
    // taken since it last said, by time.
    snapshots.sort_by_key(|s| {
        let name = s.name_any();
        (depth(&name, &parents).unwrap_or(usize::MAX), taken(s), name)
    });
    let listed: BTreeSet<String> = snapshots.iter().map(|s| s.name_any()).collect();
    let mut before: Option<String> = None;
    snapshots
        .iter()
        .map(|snapshot| {
            let own = snapshot.name_any();
            let parent = parent(&own, &parents, &listed).unwrap_or_else(|| before.clone());
            before = Some(own);
            view(snapshot, parent)
        })
        .collect()
}

/// How many snapshots are before `name` in the engine's chain; `None` if
/// it has not reported `name`.
fn depth(name: &str, parents: &BTreeMap<&str, &str>) -> Option<usize> {
    let mut at = *parents.get(name)?;
    for depth in 0..=parents.len() {
        if at.is_empty() {
            return Some(depth);
        }
        at = parents.get(at).copied().unwrap_or_default();
    }
    Some(parents.len())
}

/// The snapshot listed before `name` in the chain the engine reported
/// (`parents`, each snapshot's parent), past those not listed (taken by
/// the system, as for a rebuild): `Some(None)` for the first; `None` if
/// the engine has not reported `name` (detached, or taken since).
fn parent(
    name: &str,
    parents: &BTreeMap<&str, &str>,
    listed: &BTreeSet<String>,
) -> Option<Option<String>> {
    let mut at = *parents.get(name)?;
    // Bounded: a chain the engine reported cannot loop, but a torn one
    // must not hang the request.
    for _ in 0..=parents.len() {
        if at.is_empty() {
            return Some(None);
        }
        if listed.contains(at) {
            return Some(Some(at.to_owned()));
        }
        at = parents.get(at).copied().unwrap_or_default();
    }
    Some(None)
}

/// When the snapshot was taken, or asked for if not yet.
fn taken(snapshot: &Snapshot) -> Option<jiff::Timestamp> {
    let status = snapshot.status.as_ref();
    status
        .and_then(|s| s.creation_time.as_ref())
        .or(snapshot.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
}

/// Takes a snapshot of a volume.
#[utoipa::path(
    operation_id = "create_snapshot",
    post,
    path = "/v1/volumes/{name}/snapshots",
    tag = "snapshots",
    params(("name" = String, Path, description = "The volume's name")),
    request_body = NewSnapshot,
    responses(
        (status = 201, description = "Asked for: the controllers take it", body = SnapshotView),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not create snapshots", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "A snapshot of that name exists, or the volume is a standby", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(volume): Path<String>,
    body: Body,
) -> Result<(StatusCode, Json<SnapshotView>), ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("create", "snapshots", None))
        .await?;
    let new: NewSnapshot = body.parse()?;
    let source = found(&state, &state.ds.volumes, "volume", &volume).await?;
    if let Some(refusal) = source.standby_refusal("be snapshotted") {
        return Err(ApiError::Conflict(refusal));
    }
    let name = new
        .name
        .unwrap_or_else(|| timed_name(&volume, jiff::Timestamp::now()));
    check_name("snapshot", &name)?;
    let snapshot = Snapshot::new(
        &name,
        SnapshotSpec {
            volume: volume.clone(),
        },
    );
    let made = state
        .api::<Snapshot>()
        .create(&PostParams::default(), &snapshot)
        .await?;
    info!(
        user = caller.name(),
        volume,
        snapshot = name,
        "snapshot asked through the API"
    );
    Ok((StatusCode::CREATED, Json(view(&made, None))))
}

/// `volume`'s name and the time to the second (`pg-20261128-153000`),
/// the name shortened to keep it a snapshot's name.
pub fn timed_name(volume: &str, now: jiff::Timestamp) -> String {
    let stamp = now.strftime("%Y%m%d-%H%M%S").to_string();
    let keep = SNAPSHOT_NAME_MAX - stamp.len() - 1;
    let volume = volume
        .get(..keep)
        .unwrap_or(volume)
        .trim_end_matches(['-', '.']);
    format!("{volume}-{stamp}")
}

/// A snapshot's (or backup's) name, as the replicas take it.
pub fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    validate_dns_subdomain(&format!("a {what}'s name"), name).map_err(ApiError::Invalid)?;
    validate_snapshot_name(name).map_err(|_| {
        ApiError::Invalid(format!(
            "a {what}'s name is 1 to {SNAPSHOT_NAME_MAX} characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit, not {name:?}"
        ))
    })
}

/// One snapshot.
#[utoipa::path(
    operation_id = "get_snapshot",
    get,
    path = "/v1/snapshots/{name}",
    tag = "snapshots",
    params(("name" = String, Path, description = "The snapshot's name")),
    responses(
        (status = 200, description = "The snapshot", body = SnapshotView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not get it", body = ErrorBody),
        (status = 404, description = "No such snapshot", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<SnapshotView>, ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("get", "snapshots", Some(&name)))
        .await?;
    let snapshot = found(&state, &state.ds.snapshots, "snapshot", &name).await?;
    Ok(Json(view(&snapshot, None)))
}

/// Deletes a snapshot: its data merges into the layer after it, so what
/// the volume reads is unchanged.
#[utoipa::path(
    operation_id = "delete_snapshot",
    delete,
    path = "/v1/snapshots/{name}",
    tag = "snapshots",
    params(("name" = String, Path, description = "The snapshot's name")),
    responses(
        (status = 202, description = "Deleting: the snapshot as it was", body = SnapshotView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not delete it", body = ErrorBody),
        (status = 404, description = "No such snapshot", body = ErrorBody),
        (status = 409, description = "It changed meanwhile", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<SnapshotView>), ApiError> {
    state
        .auth
        .authorize(&caller, &Access::oxhorn("delete", "snapshots", Some(&name)))
        .await?;
    let snapshot = found(&state, &state.ds.snapshots, "snapshot", &name).await?;
    state
        .api::<Snapshot>()
        .delete(&name, &only(&*snapshot))
        .await?;
    info!(
        user = caller.name(),
        snapshot = name,
        "snapshot deleted through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(view(&snapshot, None))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_is_the_nearest_listed_snapshot_before() {
        let parents = BTreeMap::from([("a", ""), ("sys", "a"), ("b", "sys"), ("c", "b")]);
        let listed = ["a", "b", "c"].map(String::from).into();
        assert_eq!(parent("a", &parents, &listed), Some(None));
        assert_eq!(parent("b", &parents, &listed), Some(Some("a".into())));
        assert_eq!(parent("c", &parents, &listed), Some(Some("b".into())));
        assert_eq!(parent("new", &parents, &listed), None);
        assert_eq!(depth("a", &parents), Some(0));
        assert_eq!(depth("c", &parents), Some(3));
        assert_eq!(depth("new", &parents), None);
        let looped = BTreeMap::from([("a", "b"), ("b", "a")]);
        assert_eq!(parent("a", &looped, &BTreeSet::new()), Some(None));
    }

    #[test]
    fn a_timed_name_is_a_valid_name() {
        let now: jiff::Timestamp = "2026-11-28T15:30:00Z".parse().unwrap();
        assert_eq!(timed_name("pg", now), "pg-20261128-153000");
        let long = format!("{}-x", "a".repeat(250));
        let name = timed_name(&long, now);
        assert!(check_name("snapshot", &name).is_ok(), "{name}");
        for bad in ["a".repeat(64), "a_b".into(), "a-".into()] {
            assert!(check_name("snapshot", &bad).is_err(), "{bad}");
        }
    }
}
