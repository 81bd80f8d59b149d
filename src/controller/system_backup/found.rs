//! The system backups a target's store holds, as SystemBackups: a target's
//! sync makes one, `Ready` and labelled as found, with the counts of what
//! it holds, for each the cluster lacks (so a fresh cluster pointed at the store can restore them), and
//! deletes the found ones the store no longer has.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use tracing::{info, warn};

use super::OXHORN_VERSION;
use super::document::{SystemObjects, refusal};
use crate::backup::{Backupstore, SystemBackupMeta};
use crate::controller::backup::owned_by;
use crate::controller::{Context, ControllerError, delete, replace_status};
use crate::datastore::create_if_absent;
use crate::types::{
    BackupTarget, SYSTEM_BACKUP_FROM_STORE, SystemBackup, SystemBackupSpec, SystemBackupState,
    SystemBackupStatus, VolumeBackupPolicy,
};

/// Makes the target's found SystemBackups those of `names`, which its
/// store holds. A system backup whose description cannot be read is left
/// out until a later sync (logged).
pub async fn reconcile_found(
    ctx: &Context,
    target: &BackupTarget,
    store: &Backupstore,
    names: &[String],
) -> Result<(), ControllerError> {
    let target_name = target.name_any();
    let found: Vec<Arc<SystemBackup>> = ctx
        .ds
        .system_backups
        .store
        .state()
        .into_iter()
        .filter(|b| {
            b.spec.backup_target_name == target_name
                && b.labels().contains_key(SYSTEM_BACKUP_FROM_STORE)
        })
        .collect();
    let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    for gone in found
        .iter()
        .filter(|b| !wanted.contains(b.name_any().as_str()))
    {
        info!(system_backup = %gone.name_any(), "no longer in the store");
        delete(&ctx.api::<SystemBackup>(), &**gone).await?;
    }
    for name in names {
        if ctx.ds.system_backups.get(name).is_some() {
            continue;
        }
        match store.system_backup(name).await {
            Ok(meta) => {
                // What it holds, for its counts; it is restorable without.
                let objects = store.system_backup_objects(name).await;
                let objects = objects
                    .ok()
                    .and_then(|bytes| serde_json::from_slice::<SystemObjects>(&bytes).ok());
                create_found(ctx, target, &meta, objects.as_ref()).await?;
            }
            Err(error) => warn!(system_backup = %name, %error, "system backup unreadable"),
        }
    }
    Ok(())
}

async fn create_found(
    ctx: &Context,
    target: &BackupTarget,
    meta: &SystemBackupMeta,
    objects: Option<&SystemObjects>,
) -> Result<(), ControllerError> {
    let mut object = SystemBackup::new(
        &meta.name,
        SystemBackupSpec {
            backup_target_name: target.name_any(),
            volume_backup_policy: VolumeBackupPolicy::Disabled,
        },
    );
    object.metadata.owner_references = Some(vec![owned_by(target)]);
    object.metadata.labels =
        Some([(SYSTEM_BACKUP_FROM_STORE.to_owned(), "true".to_owned())].into());
    // None: made by an earlier sync, or one of that name exists.
    let Some(mut created) = create_if_absent(&ctx.api::<SystemBackup>(), &object).await? else {
        return Ok(());
    };
    info!(system_backup = %meta.name, version = %meta.oxhorn_version, "found in the store");
    created.status = Some(found_status(meta, objects));
    replace_status(&ctx.api::<SystemBackup>(), &created).await?;
    Ok(())
}

/// A found system backup's status, from what the store says it is and
/// holds.
fn found_status(meta: &SystemBackupMeta, objects: Option<&SystemObjects>) -> SystemBackupStatus {
    let created = meta.created.parse::<jiff::Timestamp>().ok().map(Time);
    let message = refusal(meta.format_version, &meta.oxhorn_version, OXHORN_VERSION).map_or_else(
        || "found in the store".to_owned(),
        |why| format!("found in the store; {why}"),
    );
    SystemBackupStatus {
        state: SystemBackupState::Ready,
        version: meta.oxhorn_version.clone(),
        format_version: meta.format_version,
        created_at: created,
        message,
        counts: objects.map(SystemObjects::counts).unwrap_or_default(),
        volume_backups: objects
            .map(|o| o.volume_backups.clone())
            .unwrap_or_default(),
        ..SystemBackupStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(version: &str) -> SystemBackupMeta {
        SystemBackupMeta {
            name: "sb".into(),
            format_version: 1,
            oxhorn_version: version.into(),
            created: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn a_found_system_backup_is_ready_and_says_when_it_cannot_be_restored() {
        let status = found_status(&meta(OXHORN_VERSION), None);
        assert_eq!(status.state, SystemBackupState::Ready);
        assert_eq!(status.version, OXHORN_VERSION);
        assert_eq!(status.message, "found in the store");
        assert!(status.created_at.is_some());
        let newer = found_status(&meta("99.0.0"), None);
        assert!(newer.message.contains("newer"), "{}", newer.message);
    }
}
