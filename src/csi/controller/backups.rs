//! CSI snapshots that are backups: a VolumeSnapshotClass with the
//! parameter `type: backup` makes CreateSnapshot take a Backup of the
//! volume into the BackupTarget `backupTargetName` names (default
//! `default`). Its CSI snapshot id is `backup/<Backup name>`: DeleteSnapshot
//! deletes the Backup, and the backup from the store with it; CreateVolume
//! from it restores the backup into the new volume.

use std::collections::HashMap;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use tracing::info;

use super::{CSI_NAME, ControllerService};
use crate::csi::error::ControllerServiceError;
use crate::csi::proto::{CreateSnapshotResponse, DeleteSnapshotResponse, Snapshot as CsiSnapshot};
use crate::datastore::unless_gone;
use crate::names::{object_name, validate_dns_subdomain};
use crate::replica::SNAPSHOT_NAME_MAX;
use crate::types::{Backup, BackupSpec, BackupState, DEFAULT_BACKUP_TARGET};

/// What a backup's CSI snapshot id starts with; plain snapshot ids, Snapshot
/// names, never hold a `/`.
const ID_PREFIX: &str = "backup/";
/// How long CreateSnapshot waits for the backup to complete before it
/// answers ready_to_use=false (the CO asks again).
const READY_WAIT: Duration = Duration::from_secs(20);
/// How long DeleteSnapshot waits for the backup to leave the store.
const DELETE_WAIT: Duration = Duration::from_secs(60);

/// What a VolumeSnapshotClass's parameters ask CreateSnapshot for.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind {
    /// A snapshot kept in the volume's replicas.
    Snapshot,
    /// A backup in this BackupTarget.
    Backup(String),
}

/// The kind of snapshot `parameters` ask for; the CO's own
/// `csi.storage.k8s.io/` keys are not the class's.
pub fn kind(parameters: &HashMap<String, String>) -> Result<Kind, ControllerServiceError> {
    let invalid = |why: String| ControllerServiceError::InvalidArgument(why);
    let mut kind = None;
    let mut target = None;
    for (key, value) in parameters {
        match key.as_str() {
            "type" => kind = Some(value.as_str()),
            "backupTargetName" => {
                validate_dns_subdomain("a BackupTarget name", value)
                    .map_err(|why| invalid(format!("parameter backupTargetName: {why}")))?;
                target = Some(value.clone());
            }
            key if key.starts_with("csi.storage.k8s.io/") => {}
            key => {
                return Err(invalid(format!(
                    "unknown snapshot parameter {key}; the known ones are type and backupTargetName"
                )));
            }
        }
    }
    match (kind, target) {
        (None | Some("snapshot"), None) => Ok(Kind::Snapshot),
        (Some("backup"), target) => Ok(Kind::Backup(
            target.unwrap_or_else(|| DEFAULT_BACKUP_TARGET.to_owned()),
        )),
        (None | Some("snapshot"), Some(_)) => Err(invalid(
            "parameter backupTargetName is for type: backup".into(),
        )),
        (Some(other), _) => Err(invalid(format!(
            "parameter type={other:?}: snapshot or backup"
        ))),
    }
}

/// The Backup a CSI snapshot id names, if it names one.
pub fn backup_of(snapshot_id: &str) -> Option<&str> {
    snapshot_id.strip_prefix(ID_PREFIX)
}

fn backups_api(service: &ControllerService) -> Api<Backup> {
    Api::namespaced(service.client.clone(), &service.ds.namespace)
}

/// CreateSnapshot of `type: backup`: the Backup `name` names, of `volume`
/// into `target`.
pub async fn create(
    service: &ControllerService,
    volume: &str,
    name: &str,
    target: String,
) -> Result<CreateSnapshotResponse, ControllerServiceError> {
    // A backup's name is also its snapshot's: a data-plane layer name.
    let id = object_name(name, SNAPSHOT_NAME_MAX);
    let _guard = service.locks.try_lock(&format!("{ID_PREFIX}{id}"))?;
    let api = backups_api(service);
    let existing = api
        .get_opt(&id)
        .await
        .map_err(|e| ControllerServiceError::api(format!("backup {id}"), e))?;
    match existing {
        Some(backup) => same_backup(&backup, name, volume)?,
        None => {
            let Some(source) = service.get_volume(volume).await? else {
                return Err(ControllerServiceError::NotFound(format!(
                    "source volume {volume} does not exist"
                )));
            };
            if let Some(refusal) = source.standby_refusal("be backed up") {
                return Err(ControllerServiceError::FailedPrecondition(refusal));
            }
            let mut backup = Backup::new(
                &id,
                BackupSpec {
                    volume_name: volume.to_owned(),
                    snapshot_name: String::new(),
                    backup_target_name: target,
                    labels: Default::default(),
                },
            );
            if id != name {
                backup
                    .annotations_mut()
                    .insert(CSI_NAME.to_owned(), name.to_owned());
            }
            api.create(&PostParams::default(), &backup)
                .await
                .map_err(|e| ControllerServiceError::api(format!("backup {id}"), e))?;
            info!(backup = %id, "backup requested");
        }
    }
    let waited = service
        .wait_for(&format!("backup {id}"), READY_WAIT, || {
            let done = service.ds.backups.get(&id).filter(|b| completed(b));
            Ok(done)
        })
        .await;
    let backup = match waited {
        Ok(backup) => backup,
        Err(ControllerServiceError::Timeout { .. }) => {
            service.ds.backups.get(&id).ok_or_else(|| {
                ControllerServiceError::Unavailable(format!("backup {id} is not cached yet"))
            })?
        }
        Err(error) => return Err(error),
    };
    Ok(CreateSnapshotResponse {
        snapshot: Some(csi_snapshot(&backup)),
    })
}

fn completed(backup: &Backup) -> bool {
    backup
        .status
        .as_ref()
        .is_some_and(|s| s.state == BackupState::Completed)
}

/// A repeated CreateSnapshot must name the same source volume.
fn same_backup(backup: &Backup, name: &str, volume: &str) -> Result<(), ControllerServiceError> {
    let id = backup.name_any();
    let same_name = backup
        .annotations()
        .get(CSI_NAME)
        .map_or(id == name, |n| n == name);
    if same_name && backup.spec.volume_name == volume {
        Ok(())
    } else {
        Err(ControllerServiceError::AlreadyExists(format!(
            "backup {name} exists for volume {}, not {volume}",
            backup.spec.volume_name
        )))
    }
}

/// DeleteSnapshot of a backup's id: the Backup, and the backup in the store.
pub async fn delete(
    service: &ControllerService,
    id: &str,
) -> Result<DeleteSnapshotResponse, ControllerServiceError> {
    let _guard = service.locks.try_lock(&format!("{ID_PREFIX}{id}"))?;
    let restoring: Vec<String> = service
        .ds
        .volumes
        .store
        .state()
        .iter()
        .filter(|v| v.needs_backup(id))
        .map(|v| v.name_any())
        .collect();
    if !restoring.is_empty() {
        return Err(ControllerServiceError::FailedPrecondition(format!(
            "backup {id} is still being restored into {}",
            restoring.join(", ")
        )));
    }
    let deleting = unless_gone(
        backups_api(service)
            .delete(id, &DeleteParams::default())
            .await,
    )
    .map_err(|e| ControllerServiceError::api(format!("backup {id}"), e))?;
    if deleting.is_some() {
        info!(backup = %id, "backup deletion requested");
    }
    service
        .wait_for(&format!("deleting backup {id}"), DELETE_WAIT, || {
            Ok(service
                .ds
                .backups
                .get(id)
                .is_none()
                .then_some(DeleteSnapshotResponse {}))
        })
        .await
}

/// Every Backup of a volume, as CSI snapshots, for ListSnapshots.
pub fn listed(service: &ControllerService) -> Vec<CsiSnapshot> {
    service
        .ds
        .backups
        .store
        .state()
        .iter()
        .map(|b| csi_snapshot(b))
        .collect()
}

fn csi_snapshot(backup: &Backup) -> CsiSnapshot {
    let status = backup.status.clone().unwrap_or_default();
    let created = status
        .backup_created_at
        .map(|t| t.0)
        .or_else(|| backup.metadata.creation_timestamp.as_ref().map(|t| t.0));
    CsiSnapshot {
        size_bytes: status.size,
        snapshot_id: format!("{ID_PREFIX}{}", backup.name_any()),
        source_volume_id: backup.spec.volume_name.clone(),
        creation_time: created.map(super::snapshots::timestamp),
        ready_to_use: status.state == BackupState::Completed,
        group_snapshot_id: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_class_asks_for_a_snapshot_unless_its_type_is_backup() {
        assert_eq!(kind(&params(&[])).unwrap(), Kind::Snapshot);
        assert_eq!(
            kind(&params(&[("type", "snapshot")])).unwrap(),
            Kind::Snapshot
        );
        let backup = kind(&params(&[("type", "backup")])).unwrap();
        assert_eq!(backup, Kind::Backup(DEFAULT_BACKUP_TARGET.into()));
        let offsite = params(&[("type", "backup"), ("backupTargetName", "offsite")]);
        assert_eq!(kind(&offsite).unwrap(), Kind::Backup("offsite".into()));
        let with_co_keys = params(&[
            ("type", "backup"),
            ("csi.storage.k8s.io/volumesnapshot/name", "s"),
        ]);
        assert!(kind(&with_co_keys).is_ok());
    }

    #[test]
    fn wrong_class_parameters_are_invalid_arguments_naming_them() {
        for (pairs, says) in [
            (&[("type", "bak")][..], "type=\"bak\""),
            (&[("color", "blue")][..], "unknown snapshot parameter color"),
            (&[("backupTargetName", "x")][..], "for type: backup"),
            (
                &[("type", "backup"), ("backupTargetName", "Not/Ok")][..],
                "backupTargetName",
            ),
        ] {
            let Err(error) = kind(&params(pairs)) else {
                panic!("{pairs:?} accepted");
            };
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().contains(says), "{}", status.message());
        }
    }

    #[test]
    fn backup_ids_are_told_from_snapshot_ids() {
        assert_eq!(backup_of("backup/nightly"), Some("nightly"));
        assert_eq!(backup_of("nightly"), None);
    }
}
