//! Deleting a SystemBackup deletes it from its target's store, so that the
//! next sync does not find it again; the volume backups it took or named
//! are kept (they are Backups of their own). A target being deleted keeps
//! its store: its SystemBackups go without touching it.

use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::WAIT;
use crate::controller::backup::{on_store, unavailable};
use crate::controller::{Context, ControllerError, release, update_status};
use crate::types::SystemBackup;

pub async fn remove(ctx: &Context, backup: &SystemBackup) -> Result<Action, ControllerError> {
    let target = ctx
        .ds
        .backup_targets
        .get(&backup.spec.backup_target_name)
        .filter(|t| t.metadata.deletion_timestamp.is_none());
    if let Some(target) = target {
        let name = backup.metadata.name.as_deref().unwrap_or_default();
        let removed = on_store(ctx, &target, |store| async move {
            store.delete_system_backup(name).await
        })
        .await;
        if let Err(error) = removed {
            let (reason, message) = unavailable(&error);
            warn!(reason, %message, "system backup not deleted from the store; retrying");
            let mut status = backup.status.clone().unwrap_or_default();
            status.message = format!("deleting from the store: {message}");
            update_status(&ctx.api::<SystemBackup>(), backup, status).await?;
            return Ok(Action::requeue(WAIT));
        }
        info!("deleted from the store");
    }
    release(&ctx.api::<SystemBackup>(), backup).await?;
    Ok(Action::await_change())
}
