//! The `default` BackupTarget, made from the settings `backup-target`,
//! `backup-target-credential-secret` and `backupstore-poll-interval` (as
//! Longhorn makes its own): the settings are its source of truth while
//! `backup-target` is set, and writing a new URL there points the target at
//! the new store and syncs it at once. Emptying `backup-target` deletes the
//! target only if the settings made it, which forgets its resources and
//! never touches the store; a `default` target a user made while the
//! setting was empty is the user's.
//!
//! Settings are cluster-wide, so one manager does this, the one that
//! writes the Settings' statuses (`settings::writes_for_settings`). It
//! looks again on every change of a Setting or of the target, and every
//! [`RECHECK`], since neither cache tells of a deletion.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use super::now;
use crate::controller::settings::writes_for_settings;
use crate::controller::{Context, ControllerError, delete};
use crate::datastore::settings::DefaultBackupTarget;
use crate::datastore::{changed_only, create_if_absent};
use crate::types::{BackupTarget, BackupTargetSpec, DEFAULT_BACKUP_TARGET};

/// The label on a target the settings made.
pub const FROM_SETTINGS: &str = "oxhorn.io/from-settings";
/// How often the target is compared with the settings without a change to
/// wake it: for a deleted Setting or target.
const RECHECK: Duration = Duration::from_secs(30);

/// Keeps the `default` target what the settings say, until dropped.
pub async fn run(ctx: Arc<Context>) {
    let settings = changed_only(ctx.ds.settings.subscribe()).map(drop);
    let target = changed_only(ctx.ds.backup_targets.subscribe())
        .filter(|t| std::future::ready(t.name_any() == DEFAULT_BACKUP_TARGET))
        .map(drop);
    let mut changes = futures::stream::select(settings, target);
    let mut recheck = tokio::time::interval(RECHECK);
    loop {
        tokio::select! {
            Some(()) = changes.next() => {}
            _ = recheck.tick() => {}
        }
        if let Err(error) = reconcile(&ctx).await
            && !error.is_conflict()
        {
            warn!(%error, "the default backup target could not be made what the settings say");
        }
    }
}

async fn reconcile(ctx: &Context) -> Result<(), ControllerError> {
    if !writes_for_settings(ctx) {
        return Ok(());
    }
    let wanted = ctx.settings().default_backup_target;
    let existing = ctx.ds.backup_targets.get(DEFAULT_BACKUP_TARGET);
    match existing {
        Some(target) if wanted.url.is_empty() => {
            if from_settings(&target) {
                info!("backup-target is empty: deleting the default target it made");
                delete(&ctx.api::<BackupTarget>(), &*target).await?;
            }
            Ok(())
        }
        None if wanted.url.is_empty() => Ok(()),
        // Made again once it is gone.
        Some(target) if target.metadata.deletion_timestamp.is_some() => Ok(()),
        Some(target) => update(ctx, &target, &wanted).await,
        None => create(ctx, &wanted).await,
    }
}

fn from_settings(target: &BackupTarget) -> bool {
    target.labels().contains_key(FROM_SETTINGS)
}

fn spec_of(wanted: &DefaultBackupTarget) -> BackupTargetSpec {
    BackupTargetSpec {
        backup_target_url: wanted.url.clone(),
        credential_secret: wanted.credential_secret.clone(),
        poll_interval: format!("{}s", wanted.poll_interval),
        sync_requested_at: None,
    }
}

async fn create(ctx: &Context, wanted: &DefaultBackupTarget) -> Result<(), ControllerError> {
    let mut target = BackupTarget::new(DEFAULT_BACKUP_TARGET, spec_of(wanted));
    target.metadata.labels = Some([(FROM_SETTINGS.to_owned(), "true".to_owned())].into());
    // None: made meanwhile; the next look compares it.
    if create_if_absent(&ctx.api::<BackupTarget>(), &target)
        .await?
        .is_some()
    {
        info!(url = %wanted.url, "default backup target made from the settings");
    }
    Ok(())
}

/// Makes the target's spec the settings', asking for a sync at once when
/// its store changed.
async fn update(
    ctx: &Context,
    target: &BackupTarget,
    wanted: &DefaultBackupTarget,
) -> Result<(), ControllerError> {
    let spec = spec_of(wanted);
    let current = &target.spec;
    let store_changed = current.backup_target_url != spec.backup_target_url
        || current.credential_secret != spec.credential_secret;
    if !store_changed && current.poll_interval == spec.poll_interval && from_settings(target) {
        return Ok(());
    }
    let mut patch = json!({
        "metadata": {"labels": {FROM_SETTINGS: "true"}},
        "spec": {
            "backupTargetURL": spec.backup_target_url,
            "credentialSecret": spec.credential_secret,
            "pollInterval": spec.poll_interval,
        }
    });
    if store_changed {
        patch["spec"]["syncRequestedAt"] = json!(now());
    }
    ctx.api::<BackupTarget>()
        .patch(
            DEFAULT_BACKUP_TARGET,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    info!(url = %wanted.url, "default backup target set from the settings");
    Ok(())
}
