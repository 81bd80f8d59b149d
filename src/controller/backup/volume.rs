//! The BackupVolume controller: syncs one volume's backups in the store
//! into Backups when its spec.syncRequestedAt is newer than its
//! status.lastSyncedAt. It creates a Backup for each backup the store has
//! and the cluster does not (the Backup controller then reads its details
//! from the store), and deletes completed Backups whose backup the store no
//! longer has. Backups still being taken are left alone.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{Instrument, info, info_span, warn};

use super::{RETRY, now, on_store, owned_by, sync_due, unavailable};
use crate::backup::BackupConfig;
use crate::controller::{Context, ControllerError, delete, update_status};
use crate::datastore::create_if_absent;
use crate::types::{
    Backup, BackupSpec, BackupState, BackupTarget, BackupVolume, BackupVolumeStatus, Condition,
    ConditionStatus,
};

/// The condition saying whether the last sync of the volume's backups
/// succeeded.
pub const SYNCED: &str = "Synced";
/// Label on a Backup made by a sync: it is never uploaded, only read from
/// the store (a sync racing a deletion may make one the store lacks).
pub const FROM_STORE: &str = "oxhorn.io/from-store";

pub fn from_store(backup: &Backup) -> bool {
    backup.labels().contains_key(FROM_STORE)
}

pub async fn reconcile(
    volume: Arc<BackupVolume>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if volume.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some(volume) = ctx.claim(&*volume).await? else {
        return Ok(Action::await_change());
    };
    let status = volume.status.clone().unwrap_or_default();
    if !sync_due(
        volume.spec.sync_requested_at.as_ref(),
        status.last_synced_at.as_ref(),
    ) {
        return Ok(Action::await_change());
    }
    let span = info_span!("backup_volume", target = %volume.spec.backup_target_name, volume = %volume.spec.volume_name);
    sync(&ctx, &volume, status).instrument(span).await
}

async fn sync(
    ctx: &Context,
    volume: &BackupVolume,
    mut status: BackupVolumeStatus,
) -> Result<Action, ControllerError> {
    let Some(target) = ctx.ds.backup_targets.get(&volume.spec.backup_target_name) else {
        // Its target is gone; the garbage collector removes it.
        return Ok(Action::await_change());
    };
    let volume_name = &volume.spec.volume_name;
    let listed = on_store(ctx, &target, |store| async move {
        store.backups(volume_name).await
    })
    .await;
    status.last_synced_at = Some(now());
    let action = match listed {
        Ok(backups) => {
            reconcile_backups(ctx, &target, volume, &backups).await?;
            summarize(&mut status, &backups);
            let message = format!("{} backups", backups.len());
            Condition::set(
                &mut status.conditions,
                SYNCED,
                ConditionStatus::True,
                SYNCED,
                message,
            );
            Action::await_change()
        }
        Err(error) => {
            let (reason, message) = unavailable(&error);
            warn!(reason, %message, "backup volume not synced");
            Condition::set(
                &mut status.conditions,
                SYNCED,
                ConditionStatus::False,
                reason,
                message,
            );
            Action::requeue(RETRY)
        }
    };
    update_status(&ctx.api::<BackupVolume>(), volume, status).await?;
    Ok(action)
}

/// The volume's size, labels and last backup, from its newest backup.
fn summarize(status: &mut BackupVolumeStatus, backups: &[BackupConfig]) {
    // As times: their text has as many fractional digits as it needs.
    let created = |b: &BackupConfig| b.created.parse::<jiff::Timestamp>().ok();
    let newest = backups.iter().max_by_key(|b| created(b));
    let Some(newest) = newest else {
        return;
    };
    status.size = i64::try_from(newest.size).unwrap_or(i64::MAX);
    status.last_backup_name.clone_from(&newest.name);
    status.last_backup_at = created(newest).map(Time);
    status.labels.clone_from(&newest.labels);
    status.data_engine = "v1".into();
}

/// Creates a Backup for each backup in the store the cluster lacks, and
/// deletes completed Backups the store no longer has.
async fn reconcile_backups(
    ctx: &Context,
    target: &BackupTarget,
    volume: &BackupVolume,
    backups: &[BackupConfig],
) -> Result<(), ControllerError> {
    let in_store: BTreeSet<&str> = backups.iter().map(|b| b.name.as_str()).collect();
    let target_name = target.name_any();
    let ours: Vec<Arc<Backup>> = ctx
        .ds
        .backups
        .store
        .state()
        .into_iter()
        .filter(|b| {
            b.spec.backup_target_name == target_name
                && b.spec.volume_name == volume.spec.volume_name
        })
        .collect();
    for vanished in ours.iter().filter(|b| {
        let done = b
            .status
            .as_ref()
            .is_some_and(|s| s.state == BackupState::Completed);
        !in_store.contains(b.name_any().as_str()) && (done || from_store(b))
    }) {
        info!(backup = %vanished.name_any(), "no longer in the store");
        delete(&ctx.api::<Backup>(), &**vanished).await?;
    }
    let known: BTreeSet<String> = ours.iter().map(|b| b.name_any()).collect();
    for config in backups.iter().filter(|b| !known.contains(&b.name)) {
        create_backup(ctx, target, config).await?;
    }
    Ok(())
}

async fn create_backup(
    ctx: &Context,
    target: &BackupTarget,
    config: &BackupConfig,
) -> Result<(), ControllerError> {
    let mut backup = Backup::new(
        &config.name,
        BackupSpec {
            volume_name: config.volume.clone(),
            snapshot_name: config.snapshot.clone(),
            backup_target_name: target.name_any(),
            labels: config.labels.clone(),
        },
    );
    backup.metadata.owner_references = Some(vec![owned_by(target)]);
    backup.metadata.labels = Some([(FROM_STORE.to_owned(), "true".to_owned())].into());
    // None: made by an earlier sync, or a Backup of that name elsewhere.
    if create_if_absent(&ctx.api::<Backup>(), &backup)
        .await?
        .is_some()
    {
        info!(backup = %config.name, "found in the store");
    }
    Ok(())
}
