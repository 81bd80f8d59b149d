//! CSI snapshots: each is a Snapshot object, named from the CSI name, that
//! the volume's owner turns into a data-plane snapshot on every replica.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use tracing::info;

use super::backups::{self, Kind};
use super::{CSI_NAME, ControllerService, paginate, required};
use crate::csi::error::ControllerServiceError;
use crate::csi::proto::{
    CreateSnapshotRequest, CreateSnapshotResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    ListSnapshotsRequest, ListSnapshotsResponse, Snapshot as CsiSnapshot, list_snapshots_response,
};
use crate::datastore::{Datastore, unless_gone};
use crate::names::object_name;
use crate::replica::SNAPSHOT_NAME_MAX;
use crate::types::{BACKUP_FOR, CLONE_FOR, CSI_SNAPSHOT, Snapshot, SnapshotSpec};

/// How long CreateSnapshot waits for the snapshot to be taken before it
/// answers ready_to_use=false (the CO asks again).
const READY_WAIT: Duration = Duration::from_secs(20);
const DELETE_WAIT: Duration = Duration::from_secs(30);

/// Why `volume` cannot be deleted yet, if its snapshots say so: they live
/// in its replicas. Snapshots already being deleted do not count, as the
/// volume's own deletion finishes theirs. The cache may not show yet that a
/// snapshot is being deleted (a clone deletes its source snapshot as it goes,
/// and the clone's deletion may be all the CO waited for), so each snapshot
/// the cache keeps is read again from the API server.
pub async fn deletion_blocker(
    service: &ControllerService,
    volume: &str,
) -> Result<Option<String>, ControllerServiceError> {
    let cached: Vec<String> = service
        .ds
        .snapshots
        .store
        .state()
        .iter()
        .filter(|s| s.spec.volume == volume && s.metadata.deletion_timestamp.is_none())
        .filter(|s| !s.labels().contains_key(BACKUP_FOR))
        .map(|s| s.name_any())
        .collect();
    let mut kept = Vec::new();
    for name in cached {
        let current = service
            .snapshots_api()
            .get_opt(&name)
            .await
            .map_err(|e| ControllerServiceError::api(format!("snapshot {name}"), e))?;
        kept.extend(current);
    }
    Ok(crate::types::deletion_blocker(volume, &kept))
}

pub async fn create(
    service: &ControllerService,
    request: CreateSnapshotRequest,
) -> Result<CreateSnapshotResponse, ControllerServiceError> {
    let volume = required(&request.source_volume_id, "source_volume_id")?;
    let name = required(&request.name, "name")?;
    if let Kind::Backup(target) = backups::kind(&request.parameters)? {
        return backups::create(service, volume, name, target).await;
    }
    let id = object_name(name, SNAPSHOT_NAME_MAX);
    let _guard = service.locks.try_lock(&format!("snapshot/{id}"))?;
    let api = service.snapshots_api();
    let existing = api
        .get_opt(&id)
        .await
        .map_err(|e| ControllerServiceError::api(format!("snapshot {id}"), e))?;
    match existing {
        Some(snapshot) => same_snapshot(&snapshot, name, volume)?,
        None => {
            let Some(source) = service.get_volume(volume).await? else {
                return Err(ControllerServiceError::NotFound(format!(
                    "source volume {volume} does not exist"
                )));
            };
            if let Some(refusal) = source.standby_refusal("be snapshotted") {
                return Err(ControllerServiceError::FailedPrecondition(refusal));
            }
            let mut snapshot = Snapshot::new(
                &id,
                SnapshotSpec {
                    volume: volume.to_owned(),
                },
            );
            snapshot
                .labels_mut()
                .insert(CSI_SNAPSHOT.to_owned(), "true".to_owned());
            if id != name {
                snapshot
                    .annotations_mut()
                    .insert(CSI_NAME.to_owned(), name.to_owned());
            }
            api.create(&PostParams::default(), &snapshot)
                .await
                .map_err(|e| ControllerServiceError::api(format!("snapshot {id}"), e))?;
            info!(snapshot = %id, "snapshot requested");
        }
    }
    let snapshot = wait_taken(service, &id).await?;
    Ok(CreateSnapshotResponse {
        snapshot: Some(csi_snapshot(&snapshot)),
    })
}

/// A repeated CreateSnapshot must name the same source volume.
fn same_snapshot(
    snapshot: &Snapshot,
    name: &str,
    volume: &str,
) -> Result<(), ControllerServiceError> {
    let id = snapshot.name_any();
    let same_name = snapshot
        .annotations()
        .get(CSI_NAME)
        .map_or(id == name, |n| n == name);
    if same_name && snapshot.spec.volume == volume {
        Ok(())
    } else {
        Err(ControllerServiceError::AlreadyExists(format!(
            "snapshot {name} exists for volume {}, not {volume}",
            snapshot.spec.volume
        )))
    }
}

/// Waits for the snapshot to be taken. A snapshot whose volume is gone is
/// an error; one still pending (or failing and being retried) after the wait
/// is returned not ready, and the CO asks again.
async fn wait_taken(
    service: &ControllerService,
    id: &str,
) -> Result<Arc<Snapshot>, ControllerServiceError> {
    let taken = service
        .wait_for(&format!("taking snapshot {id}"), READY_WAIT, || {
            let Some(snapshot) = service.ds.snapshots.get(id) else {
                return Ok(None);
            };
            let status = snapshot.status.clone().unwrap_or_default();
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
            if ready.is_some_and(|c| c.reason == "VolumeNotFound") {
                return Err(ControllerServiceError::NotFound(format!(
                    "snapshot {id}: {}",
                    status.error
                )));
            }
            Ok(status.ready_to_use.then_some(snapshot))
        })
        .await;
    match taken {
        Err(ControllerServiceError::Timeout { .. }) => {
            service.ds.snapshots.get(id).ok_or_else(|| {
                ControllerServiceError::Unavailable(format!("snapshot {id} is not cached yet"))
            })
        }
        other => other,
    }
}

pub async fn delete(
    service: &ControllerService,
    request: DeleteSnapshotRequest,
) -> Result<DeleteSnapshotResponse, ControllerServiceError> {
    let id = required(&request.snapshot_id, "snapshot_id")?;
    if let Some(backup) = backups::backup_of(id) {
        return backups::delete(service, backup).await;
    }
    let _guard = service.locks.try_lock(&format!("snapshot/{id}"))?;
    let dependents = filling_from(&service.ds, id);
    if !dependents.is_empty() {
        return Err(ControllerServiceError::FailedPrecondition(format!(
            "snapshot {id} is still being restored into {}",
            dependents.join(", ")
        )));
    }
    let deleting = unless_gone(
        service
            .snapshots_api()
            .delete(id, &DeleteParams::default())
            .await,
    )
    .map_err(|e| ControllerServiceError::api(format!("snapshot {id}"), e))?;
    if deleting.is_some() {
        info!(snapshot = %id, "snapshot deletion requested");
    }
    service
        .wait_for(&format!("deleting snapshot {id}"), DELETE_WAIT, || {
            Ok(service
                .ds
                .snapshots
                .get(id)
                .is_none()
                .then_some(DeleteSnapshotResponse {}))
        })
        .await
}

/// Volumes restored from `snapshot` whose data is not in place yet.
fn filling_from(ds: &Datastore, snapshot: &str) -> Vec<String> {
    ds.volumes
        .store
        .state()
        .iter()
        .filter(|v| v.spec.source_snapshot() == Some(snapshot) && !v.is_filled())
        .map(|v| v.name_any())
        .collect()
}

pub fn list(
    service: &ControllerService,
    request: &ListSnapshotsRequest,
) -> Result<ListSnapshotsResponse, ControllerServiceError> {
    let mut snapshots: Vec<CsiSnapshot> = service
        .ds
        .snapshots
        .store
        .state()
        .iter()
        .filter(|s| !s.labels().contains_key(CLONE_FOR) && !s.labels().contains_key(BACKUP_FOR))
        .map(|s| csi_snapshot(s))
        .chain(backups::listed(service))
        .filter(|s| request.snapshot_id.is_empty() || s.snapshot_id == request.snapshot_id)
        .filter(|s| {
            request.source_volume_id.is_empty() || s.source_volume_id == request.source_volume_id
        })
        .collect();
    snapshots.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
    let (page, next_token) = paginate(&snapshots, request.max_entries, &request.starting_token)?;
    Ok(ListSnapshotsResponse {
        entries: page
            .iter()
            .map(|s| list_snapshots_response::Entry {
                snapshot: Some(s.clone()),
            })
            .collect(),
        next_token,
    })
}

fn csi_snapshot(snapshot: &Snapshot) -> CsiSnapshot {
    let status = snapshot.status.clone().unwrap_or_default();
    let created = status
        .creation_time
        .map(|t| t.0)
        .or_else(|| snapshot.metadata.creation_timestamp.as_ref().map(|t| t.0));
    CsiSnapshot {
        size_bytes: status.size,
        snapshot_id: snapshot.name_any(),
        source_volume_id: snapshot.spec.volume.clone(),
        creation_time: created.map(timestamp),
        ready_to_use: status.ready_to_use,
        group_snapshot_id: String::new(),
    }
}

/// A time as CSI sends it.
pub(super) fn timestamp(time: jiff::Timestamp) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: time.as_second(),
        nanos: time.subsec_nanosecond(),
    }
}
