//! Taking a system backup: `Pending` takes the volume backups the policy
//! asks for (each named after the system backup and its volume, so that a
//! new owner finds them instead of taking more), `BackingUpVolumes` waits
//! for them, `Uploading` writes the objects and then what the system
//! backup is to the target; then it is `Ready`. A volume backup that fails
//! makes the system backup `Error`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use super::WAIT;
use super::document::{
    FORMAT_VERSION, OXHORN_VERSION, SystemObjects, strip, strip_pv, strip_pvc, strip_volume,
};
use crate::backup::SystemBackupMeta;
use crate::controller::backup::{on_store, unavailable};
use crate::controller::{Context, ControllerError, hold, update_status};
use crate::csi::DRIVER_NAME;
use crate::datastore::create_if_absent;
use crate::types::{
    Backup, BackupSpec, BackupState, SYSTEM_BACKUP_FROM_STORE, SYSTEM_BACKUP_LABEL, SystemBackup,
    SystemBackupState, SystemBackupStatus, VolumeBackupPolicy,
};

pub async fn reconcile(
    backup: Arc<SystemBackup>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    let found = backup.labels().contains_key(SYSTEM_BACKUP_FROM_STORE);
    // One a sync is making gets its status from the sync first: a write of
    // ours in between would make the sync's fail.
    if found && backup.status.is_none() && backup.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let Some(mut backup) = ctx.claim(&*backup).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("system_backup", name = %backup.name_any());
    async move {
        if backup.metadata.deletion_timestamp.is_some() {
            return super::remove::remove(&ctx, &backup).await;
        }
        hold(&ctx.api::<SystemBackup>(), &mut backup).await?;
        // One a sync found is Ready as the store has it.
        if found {
            return Ok(Action::await_change());
        }
        let mut status = backup.status.clone().unwrap_or_default();
        let action = match status.state {
            SystemBackupState::Ready | SystemBackupState::Error => {
                return Ok(Action::await_change());
            }
            SystemBackupState::Pending => take_volume_backups(&ctx, &backup, &mut status).await?,
            SystemBackupState::BackingUpVolumes => wait_for_volume_backups(&ctx, &mut status),
            SystemBackupState::Uploading => upload(&ctx, &backup, &mut status).await?,
        };
        if status.state == SystemBackupState::Error {
            warn!(message = %status.message, "system backup failed");
            let note = status.message.clone();
            ctx.event(&backup, EventType::Warning, "Failed", note).await;
        }
        update_status(&ctx.api::<SystemBackup>(), &backup, status).await?;
        Ok(action)
    }
    .instrument(span)
    .await
}

/// What a system backup does for a volume whose newest completed backup in
/// its target is `newest`: take one, refer to that one, or neither.
#[derive(Debug, PartialEq, Eq)]
enum VolumeStep<'a> {
    Take,
    Refer(&'a str),
    Nothing,
}

fn volume_step(policy: VolumeBackupPolicy, newest: Option<&str>) -> VolumeStep<'_> {
    match (policy, newest) {
        (VolumeBackupPolicy::Always, _) | (VolumeBackupPolicy::IfNotPresent, None) => {
            VolumeStep::Take
        }
        (_, Some(newest)) => VolumeStep::Refer(newest),
        (VolumeBackupPolicy::Disabled, None) => VolumeStep::Nothing,
    }
}

/// The name of the backup a system backup takes of a volume: the same for
/// every manager that takes the system backup on.
fn volume_backup_name(system_backup: &str, volume: &str) -> String {
    crate::names::object_name(&format!("{system_backup}-{volume}"), 63)
}

async fn take_volume_backups(
    ctx: &Context,
    backup: &SystemBackup,
    status: &mut SystemBackupStatus,
) -> Result<Action, ControllerError> {
    let target = &backup.spec.backup_target_name;
    if ctx.ds.backup_targets.get(target).is_none() {
        status.message = format!("waiting for its BackupTarget {target}, which does not exist");
        return Ok(Action::requeue(WAIT));
    }
    let name = backup.name_any();
    let mut references = BTreeMap::new();
    for volume in ctx.ds.volumes.store.state() {
        if volume.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if volume.is_standby() {
            // It cannot be backed up, and needs not: it is kept as the
            // standby of the volume whose backups it follows.
            continue;
        }
        let volume_name = volume.name_any();
        let newest = newest_backup(ctx, target, &volume_name);
        match volume_step(backup.spec.volume_backup_policy, newest.as_deref()) {
            VolumeStep::Take => {
                let made = volume_backup_name(&name, &volume_name);
                let mut object = Backup::new(
                    &made,
                    BackupSpec {
                        volume_name: volume_name.clone(),
                        snapshot_name: String::new(),
                        backup_target_name: target.clone(),
                        labels: BTreeMap::new(),
                    },
                );
                object.metadata.labels =
                    Some([(SYSTEM_BACKUP_LABEL.to_owned(), name.clone())].into());
                create_if_absent(&ctx.api::<Backup>(), &object).await?;
                info!(volume = %volume_name, backup = %made, "volume backup taken");
                references.insert(volume_name, made);
            }
            VolumeStep::Refer(newest) => {
                references.insert(volume_name, newest.to_owned());
            }
            VolumeStep::Nothing => {}
        }
    }
    status.volume_backups = references;
    status.state = SystemBackupState::BackingUpVolumes;
    status.message = format!("{} volume backups", status.volume_backups.len());
    Ok(Action::requeue(WAIT))
}

/// The newest completed backup of `volume` in `target`.
fn newest_backup(ctx: &Context, target: &str, volume: &str) -> Option<String> {
    ctx.ds
        .backups
        .store
        .state()
        .into_iter()
        .filter(|b| b.spec.backup_target_name == target && b.spec.volume_name == volume)
        .filter_map(|b| {
            let status = b.status.as_ref()?;
            let created = status.backup_created_at.clone();
            (status.state == BackupState::Completed).then(|| (created.map(|t| t.0), b.name_any()))
        })
        .max()
        .map(|(_, name)| name)
}

fn wait_for_volume_backups(ctx: &Context, status: &mut SystemBackupStatus) -> Action {
    let mut waiting = 0;
    for (volume, name) in &status.volume_backups {
        let state = ctx.ds.backups.get(name).and_then(|b| b.status.clone());
        match state {
            Some(s) if s.state == BackupState::Completed => {}
            Some(s) if s.state == BackupState::Error => {
                status.state = SystemBackupState::Error;
                status.message = format!("backup {name} of volume {volume} failed: {}", s.error);
                return Action::await_change();
            }
            None if ctx.ds.backups.get(name).is_none() => {
                status.state = SystemBackupState::Error;
                status.message = format!("backup {name} of volume {volume} was deleted");
                return Action::await_change();
            }
            _ => waiting += 1,
        }
    }
    if waiting > 0 {
        status.message = format!("waiting for {waiting} volume backups");
        return Action::requeue(WAIT);
    }
    status.state = SystemBackupState::Uploading;
    status.message.clear();
    Action::requeue(std::time::Duration::ZERO)
}

async fn upload(
    ctx: &Context,
    backup: &SystemBackup,
    status: &mut SystemBackupStatus,
) -> Result<Action, ControllerError> {
    let objects = collect(ctx, status.volume_backups.clone()).await?;
    let Some(target) = ctx.ds.backup_targets.get(&backup.spec.backup_target_name) else {
        status.message = "its BackupTarget was deleted".into();
        status.state = SystemBackupState::Error;
        return Ok(Action::await_change());
    };
    let created = jiff::Timestamp::now();
    let meta = SystemBackupMeta {
        name: backup.name_any(),
        format_version: FORMAT_VERSION,
        oxhorn_version: OXHORN_VERSION.to_owned(),
        created: created.to_string(),
    };
    let body = serde_json::to_vec(&objects)?;
    let stored = on_store(ctx, &target, |store| {
        let meta = &meta;
        async move { store.put_system_backup(meta, Bytes::from(body)).await }
    })
    .await;
    if let Err(error) = stored {
        let (reason, message) = unavailable(&error);
        warn!(reason, %message, "system backup not stored yet");
        status.message = format!("not stored yet: {message}");
        return Ok(Action::requeue(WAIT));
    }
    status.state = SystemBackupState::Ready;
    status.version = meta.oxhorn_version;
    status.format_version = FORMAT_VERSION;
    status.created_at = Some(Time(created));
    status.counts = objects.counts();
    status.message = format!("{} volumes", objects.volumes.len());
    info!(volumes = objects.volumes.len(), "system backup stored");
    let note = format!("stored in {}", target.spec.backup_target_url);
    ctx.event(backup, EventType::Normal, "Ready", note).await;
    Ok(Action::await_change())
}

/// Oxhorn's objects as the caches and the API server have them now.
async fn collect(
    ctx: &Context,
    volume_backups: BTreeMap<String, String>,
) -> Result<SystemObjects, ControllerError> {
    let ds = &ctx.ds;
    let volumes: Vec<_> = ds
        .volumes
        .store
        .state()
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .map(|v| strip_volume(v))
        .collect();
    let names: BTreeSet<String> = volumes.iter().map(ResourceExt::name_any).collect();
    let classes = Api::<StorageClass>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    let pvs = Api::<PersistentVolume>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?;
    let pvs: Vec<PersistentVolume> = pvs
        .items
        .into_iter()
        .filter(|pv| {
            let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
            csi.is_some_and(|c| c.driver == DRIVER_NAME && names.contains(&c.volume_handle))
        })
        .collect();
    let mut claims = Vec::new();
    for pv in &pvs {
        let Some(claim) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            continue;
        };
        let (Some(namespace), Some(name)) = (&claim.namespace, &claim.name) else {
            continue;
        };
        let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), namespace);
        if let Some(pvc) = api.get_opt(name).await? {
            claims.push(strip_pvc(&pvc));
        }
    }
    Ok(SystemObjects {
        settings: ds
            .settings
            .store
            .state()
            .iter()
            .map(|s| strip(&**s, |s| s.status = None))
            .collect(),
        backup_targets: ds
            .backup_targets
            .store
            .state()
            .iter()
            .map(|t| {
                strip(&**t, |t| {
                    t.status = None;
                    t.spec.sync_requested_at = None;
                })
            })
            .collect(),
        recurring_jobs: ds
            .recurring_jobs
            .store
            .state()
            .iter()
            .map(|j| strip(&**j, |j| j.status = None))
            .collect(),
        storage_classes: classes
            .items
            .into_iter()
            .filter(|c| c.provisioner == DRIVER_NAME)
            .map(|c| strip(&c, |_| {}))
            .collect(),
        persistent_volumes: pvs.iter().map(strip_pv).collect(),
        persistent_volume_claims: claims,
        volumes,
        volume_backups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_decides_which_volumes_are_backed_up() {
        use VolumeBackupPolicy::*;
        assert_eq!(volume_step(Always, Some("b1")), VolumeStep::Take);
        assert_eq!(volume_step(Always, None), VolumeStep::Take);
        assert_eq!(volume_step(IfNotPresent, None), VolumeStep::Take);
        assert_eq!(
            volume_step(IfNotPresent, Some("b1")),
            VolumeStep::Refer("b1")
        );
        assert_eq!(volume_step(Disabled, Some("b1")), VolumeStep::Refer("b1"));
        assert_eq!(volume_step(Disabled, None), VolumeStep::Nothing);
    }

    #[test]
    fn a_volume_backup_is_named_after_its_system_backup_and_volume() {
        assert_eq!(volume_backup_name("sb1", "pvc-1"), "sb1-pvc-1");
        let long = volume_backup_name(&"s".repeat(40), &"v".repeat(48));
        assert!(long.len() <= 63, "{long}");
        assert_ne!(long, volume_backup_name(&"s".repeat(41), &"v".repeat(48)));
    }
}
