//! Restoring a system backup: its owner reads what the SystemBackup holds
//! from its target, refuses a format it does not know or a backup of a
//! newer Oxhorn, and makes each object again in order (settings, targets,
//! jobs, classes, volumes from their backups, PersistentVolumes, claims).
//! An object that exists is left alone and reported; one it made carries
//! [`RESTORED_BY`], so a restore taken over after a crash still reports it
//! as restored.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Instrument, info, info_span, warn};

use super::WAIT;
use super::document::{Item, OXHORN_VERSION, SystemObjects, refusal, restore_order, unmet};
use crate::controller::backup::{bounded, unavailable};
use crate::controller::{Context, ControllerError, update_status};
use crate::types::{
    RESTORED_BY, RestoreOutcome, RestoredObject, SystemBackupState, SystemRestore,
    SystemRestoreState, SystemRestoreStatus,
};

pub async fn reconcile(
    restore: Arc<SystemRestore>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if restore.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some(restore) = ctx.claim(&*restore).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("system_restore", name = %restore.name_any(), system_backup = %restore.spec.system_backup);
    async move {
        let mut status = restore.status.clone().unwrap_or_default();
        if matches!(
            status.state,
            SystemRestoreState::Completed | SystemRestoreState::Error
        ) {
            return Ok(Action::await_change());
        }
        let action = match read(&ctx, &restore.spec.system_backup).await {
            Read::Wait(why) => {
                status.message = why;
                Action::requeue(WAIT)
            }
            Read::Refused(why) => {
                status.state = SystemRestoreState::Error;
                status.message = why;
                warn!(message = %status.message, "system restore refused");
                let note = status.message.clone();
                ctx.event(&restore, EventType::Warning, "Refused", note)
                    .await;
                Action::await_change()
            }
            Read::Objects(objects) => {
                status.state = SystemRestoreState::Restoring;
                restore_all(&ctx, &restore, *objects, &mut status).await;
                Action::await_change()
            }
        };
        update_status(&ctx.api::<SystemRestore>(), &restore, status).await?;
        Ok(action)
    }
    .instrument(span)
    .await
}

/// What reading a system backup for a restore came to.
enum Read {
    /// Not yet: the system backup, its target or its store is not there.
    Wait(String),
    /// Never: it cannot be restored by this Oxhorn.
    Refused(String),
    Objects(Box<SystemObjects>),
}

async fn read(ctx: &Context, name: &str) -> Read {
    let Some(backup) = ctx.ds.system_backups.get(name) else {
        return Read::Wait(format!(
            "waiting for SystemBackup {name}, which does not exist"
        ));
    };
    let status = backup.status.clone().unwrap_or_default();
    if status.state != SystemBackupState::Ready {
        return Read::Wait(format!("waiting for SystemBackup {name} to be Ready"));
    }
    let target_name = &backup.spec.backup_target_name;
    let Some(target) = ctx.ds.backup_targets.get(target_name) else {
        return Read::Wait(format!(
            "waiting for BackupTarget {target_name}, which does not exist"
        ));
    };
    let store = match ctx.open_store(&target) {
        Ok(store) => store,
        Err(error) => return Read::Wait(format!("BackupTarget {target_name}: {error}")),
    };
    // What the store says, not the object: the object may be a copy.
    let meta = match bounded(store.system_backup(name)).await {
        Ok(meta) => meta,
        Err(error) => return Read::Wait(unavailable(&error).1),
    };
    if let Some(why) = refusal(meta.format_version, &meta.oxhorn_version, OXHORN_VERSION) {
        return Read::Refused(why);
    }
    let bytes = match bounded(store.system_backup_objects(name)).await {
        Ok(bytes) => bytes,
        Err(error) => return Read::Wait(unavailable(&error).1),
    };
    match serde_json::from_slice::<SystemObjects>(&bytes) {
        Ok(objects) => Read::Objects(Box::new(objects)),
        Err(error) => Read::Refused(format!(
            "the system backup's objects are unreadable: {error}"
        )),
    }
}

async fn restore_all(
    ctx: &Context,
    restore: &SystemRestore,
    objects: SystemObjects,
    status: &mut SystemRestoreStatus,
) {
    let name = restore.name_any();
    status.objects.clear();
    for item in restore_order(objects) {
        let outcome = match unmet(&item, &status.objects) {
            Some(why) => RestoredObject {
                kind: item.kind().to_owned(),
                namespace: item.meta().namespace.clone().unwrap_or_default(),
                name: item.meta().name.clone().unwrap_or_default(),
                outcome: RestoreOutcome::Failed,
                message: why,
            },
            None => restore_one(ctx, &name, item).await,
        };
        if outcome.outcome == RestoreOutcome::Failed {
            warn!(kind = %outcome.kind, object = %outcome.name, message = %outcome.message, "not restored");
        }
        status.objects.push(outcome);
    }
    let count = |o: RestoreOutcome| status.objects.iter().filter(|r| r.outcome == o).count();
    let (restored, exists, failed) = (
        count(RestoreOutcome::Restored),
        count(RestoreOutcome::Exists),
        count(RestoreOutcome::Failed),
    );
    status.message =
        format!("{restored} restored, {exists} left alone as they exist, {failed} failed");
    status.state = SystemRestoreState::Completed;
    info!(restored, exists, failed, "system restore completed");
    let type_ = if failed > 0 {
        EventType::Warning
    } else {
        EventType::Normal
    };
    ctx.event(restore, type_, "Completed", status.message.clone())
        .await;
}

async fn restore_one(ctx: &Context, restore: &str, item: Item) -> RestoredObject {
    // Oxhorn's own objects go to this Oxhorn's namespace, whichever the
    // old one was; a claim goes to its own.
    let namespace = match &item {
        Item::PersistentVolumeClaim(o) => o.metadata.namespace.clone().unwrap_or_default(),
        Item::StorageClass(_) | Item::PersistentVolume(_) => String::new(),
        _ => ctx.ds.namespace.clone(),
    };
    let mut report = RestoredObject {
        kind: item.kind().to_owned(),
        namespace,
        name: item.meta().name.clone().unwrap_or_default(),
        outcome: RestoreOutcome::Failed,
        message: String::new(),
    };
    let client = ctx.client.clone();
    let created = match item {
        Item::Setting(o) => create(&ctx.api(), here(o), restore).await,
        Item::BackupTarget(o) => {
            let secret = o.spec.credential_secret.clone();
            if !secret.is_empty() && ctx.ds.secrets.get(&secret).is_none() {
                report.message = format!(
                    "its credential Secret {secret} does not exist: make it in Oxhorn's namespace"
                );
            }
            create(&ctx.api(), here(o), restore).await
        }
        Item::RecurringJob(o) => create(&ctx.api(), here(o), restore).await,
        Item::StorageClass(o) => create(&Api::<StorageClass>::all(client), o, restore).await,
        Item::Volume(mut o, backup) => {
            match backup {
                Some(backup) => o.spec.from_backup = backup,
                // A standby follows its source's backups, as it did.
                None if o.spec.standby => {}
                None => {
                    report.message = "the system backup has no backup of this volume".into();
                    return report;
                }
            }
            let chap = o.spec.chap_secret.clone();
            if !chap.is_empty() && ctx.ds.secrets.get(&chap).is_none() {
                report.message = format!(
                    "its CHAP Secret {chap} does not exist: make it in Oxhorn's namespace before it attaches"
                );
            }
            create(&ctx.api(), here(*o), restore).await
        }
        Item::PersistentVolume(o) => {
            create(&Api::<PersistentVolume>::all(client), *o, restore).await
        }
        Item::PersistentVolumeClaim(o) => {
            let api = Api::<PersistentVolumeClaim>::namespaced(client, &report.namespace);
            create(&api, *o, restore).await
        }
    };
    match created {
        Ok(outcome) => report.outcome = outcome,
        Err(error) => report.message = error.to_string(),
    }
    report
}

/// `object`, to be made in this Oxhorn's namespace.
fn here<K: Resource>(mut object: K) -> K {
    object.meta_mut().namespace = None;
    object
}

/// Makes `object`, marked as made by `restore`: Restored, or Exists when
/// an object of its name that this restore did not make exists.
async fn create<K>(api: &Api<K>, mut object: K, restore: &str) -> kube::Result<RestoreOutcome>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    object
        .labels_mut()
        .insert(RESTORED_BY.to_owned(), restore.to_owned());
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(RestoreOutcome::Restored),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get(&object.name_any()).await?;
            let ours = existing.labels().get(RESTORED_BY).map(String::as_str) == Some(restore);
            Ok(if ours {
                RestoreOutcome::Restored
            } else {
                RestoreOutcome::Exists
            })
        }
        Err(error) => Err(error),
    }
}
