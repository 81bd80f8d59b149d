//! The Backup controller. Its owner is the manager owning the backup's
//! volume (any manager once the volume is gone). A Backup goes Pending
//! (waiting for its target, volume or snapshot), InProgress, then Completed
//! or Error; an Error is tried again. A backup the store already has is
//! taken as it is there (one a sync found, or one completed by an owner
//! that died before saying so). Deleting a Backup deletes it from the
//! store, unless its target is gone or going.
//!
//! Without spec.snapshotName, the backup takes a Snapshot of its own name
//! and keeps it: the next backup of the volume reads only what changed
//! since.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use super::reader::SnapshotReader;
use super::volume::from_store;
use super::{LockOwner, RETRY, Unavailable, bounded, on_store, stale_lock, unavailable};
use crate::backup::{BackupConfig, BackupError, BackupReport, Backupstore, NewBackup};
use crate::controller::data_plane::{self, replica_control_address};
use crate::controller::{
    Context, ControllerError, delete, hold, release, replace_status, update_status,
};
use crate::datastore::create_if_absent;
use crate::replica::SNAPSHOT_NAME_MAX;
use crate::types::{
    BACKUP_FOR, Backup, BackupState, BackupStatus, BackupTarget, Condition, ConditionStatus,
    Replica, Snapshot, SnapshotSpec, Volume,
};

const COMPLETED: &str = "Completed";
/// How often an upload under way writes its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

pub async fn reconcile(backup: Arc<Backup>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let volume = ctx.ds.volumes.get(&backup.spec.volume_name);
    let preferred = volume
        .as_ref()
        .and_then(|v| v.status.as_ref())
        .map_or("", |s| s.owner_id.as_str());
    let Some(mut backup) = ctx.claim_preferring(&*backup, preferred).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("backup", backup = %backup.name_any(), volume = %backup.spec.volume_name);
    async move {
        if backup.metadata.deletion_timestamp.is_some() {
            return remove(&ctx, &backup).await;
        }
        hold(&ctx.api::<Backup>(), &mut backup).await?;
        let status = backup.status.clone().unwrap_or_default();
        if status.state == BackupState::Completed {
            return Ok(Action::await_change());
        }
        let mut job = Job {
            ctx: ctx.clone(),
            backup,
            status,
        };
        let action = job.run(volume.as_deref()).await?;
        update_status(&ctx.api::<Backup>(), &job.backup, job.status).await?;
        Ok(action)
    }
    .instrument(span)
    .await
}

/// Deletes the backup from the store, then lets the Backup go.
async fn remove(ctx: &Context, backup: &Backup) -> Result<Action, ControllerError> {
    let target = ctx
        .ds
        .backup_targets
        .get(&backup.spec.backup_target_name)
        .filter(|t| t.metadata.deletion_timestamp.is_none());
    if let Some(target) = target {
        let removed = on_store(ctx, &target, |store| async move {
            delete_from(ctx, &store, backup).await
        })
        .await;
        if let Err(error) = removed {
            let (reason, message) = unavailable(&error);
            warn!(reason, %message, "backup not deleted from the store; retrying");
            let mut status = backup.status.clone().unwrap_or_default();
            status.error = format!("deleting from the store: {message}");
            update_status(&ctx.api::<Backup>(), backup, status).await?;
            return Ok(Action::requeue(RETRY));
        }
    }
    for snapshot in snapshots_taken_for(ctx, |owner| owner == backup.name_any()) {
        info!(snapshot = %snapshot.name_any(), "deleting the snapshot taken for the backup");
        delete(&ctx.api::<Snapshot>(), &*snapshot).await?;
    }
    release(&ctx.api::<Backup>(), backup).await?;
    Ok(Action::await_change())
}

/// The Snapshots taken for Backups that `owner` picks (by name).
fn snapshots_taken_for(ctx: &Context, owner: impl Fn(&str) -> bool) -> Vec<Arc<Snapshot>> {
    let snapshots = ctx.ds.snapshots.store.state();
    snapshots
        .into_iter()
        .filter(|s| s.labels().get(BACKUP_FOR).is_some_and(|b| owner(b)))
        .collect()
}

/// Deletes the snapshots taken for earlier completed backups of `backup`'s
/// volume into its target: the next backup builds on this one's.
async fn drop_snapshots_before(ctx: &Context, backup: &Backup) -> Result<(), ControllerError> {
    let this = backup.name_any();
    let superseded = |name: &str| {
        if name == this {
            return false;
        }
        ctx.ds.backups.get(name).is_none_or(|other| {
            other.spec.volume_name == backup.spec.volume_name
                && other.spec.backup_target_name == backup.spec.backup_target_name
                && other
                    .status
                    .as_ref()
                    .is_some_and(|s| s.state == BackupState::Completed)
        })
    };
    for snapshot in snapshots_taken_for(ctx, superseded) {
        if snapshot.spec.volume == backup.spec.volume_name {
            info!(snapshot = %snapshot.name_any(), "deleting a snapshot a newer backup supersedes");
            delete(&ctx.api::<Snapshot>(), &*snapshot).await?;
        }
    }
    Ok(())
}

async fn delete_from(
    ctx: &Context,
    store: &Backupstore,
    backup: &Backup,
) -> Result<(), BackupError> {
    let (volume, name) = (&backup.spec.volume_name, backup.name_any());
    let owner = LockOwner::new(&ctx.node.node_id);
    let deleted = match store.delete(volume, &name, owner.as_str()).await {
        Err(BackupError::Busy { held, .. }) if stale_lock(ctx, &held) => {
            warn!(holder = %held.owner, "breaking a lock its holder left");
            store.break_lock(volume, &held.owner).await?;
            store.delete(volume, &name, owner.as_str()).await
        }
        other => other,
    };
    match deleted {
        Ok(blocks) => {
            info!(blocks_removed = blocks, "deleted from the store");
            Ok(())
        }
        Err(BackupError::NotFound(..)) => Ok(()),
        Err(error) => Err(error),
    }
}

/// One pass over a Backup not yet completed.
struct Job {
    ctx: Arc<Context>,
    /// As last written: each status write builds on the one before.
    backup: Backup,
    status: BackupStatus,
}

/// Why a pass stopped before the upload.
enum Wait {
    /// Pending: a condition's reason and message, and when to look again.
    Pending(&'static str, String, Option<Duration>),
    /// Error: the same, for a failure.
    Failed(&'static str, String),
}

impl Job {
    async fn run(&mut self, volume: Option<&Volume>) -> Result<Action, ControllerError> {
        match self.try_run(volume).await? {
            Ok(action) => Ok(action),
            Err(Wait::Pending(reason, message, again)) => {
                self.status.state = BackupState::Pending;
                self.condition(ConditionStatus::False, reason, message);
                Ok(again.map_or(Action::await_change(), Action::requeue))
            }
            Err(Wait::Failed(reason, message)) => {
                if self.status.state != BackupState::Error {
                    let note = format!("{reason}: {message}");
                    self.ctx
                        .event(&self.backup, EventType::Warning, reason, note)
                        .await;
                }
                warn!(reason, %message, "backup failed; retrying");
                self.status.state = BackupState::Error;
                self.status.error.clone_from(&message);
                self.condition(ConditionStatus::False, reason, message);
                Ok(Action::requeue(RETRY * 2))
            }
        }
    }

    async fn try_run(
        &mut self,
        volume: Option<&Volume>,
    ) -> Result<Result<Action, Wait>, ControllerError> {
        let target_name = &self.backup.spec.backup_target_name;
        let Some(target) = self.ctx.ds.backup_targets.get(target_name) else {
            let message = format!("BackupTarget {target_name} does not exist");
            return Ok(Err(Wait::Pending("TargetNotFound", message, Some(RETRY))));
        };
        let store = match self.ctx.open_store(&target) {
            Ok(store) => store,
            Err(error) => {
                let (reason, message) = unavailable(&Unavailable::Target(error));
                return Ok(Err(Wait::Pending(reason, message, Some(RETRY))));
            }
        };
        let name = self.backup.name_any();
        match bounded(store.backup(&self.backup.spec.volume_name, &name)).await {
            Ok(config) => {
                self.completed(&target, &config, None);
                return Ok(Ok(Action::await_change()));
            }
            Err(Unavailable::Store(BackupError::NotFound(..))) => {}
            Err(error) => {
                let (reason, message) = unavailable(&error);
                return Ok(Err(Wait::Pending(reason, message, Some(RETRY))));
            }
        }
        if from_store(&self.backup) {
            let message = "the store no longer has it".to_owned();
            return Ok(Err(Wait::Failed("NotInStore", message)));
        }
        let Some(volume) = volume else {
            let message = format!("volume {} does not exist", self.backup.spec.volume_name);
            return Ok(Err(Wait::Pending("VolumeNotFound", message, None)));
        };
        if let Some(refusal) = volume.standby_refusal("be backed up") {
            // Nothing is taken: its data is another volume's backup.
            return Ok(Err(Wait::Failed("VolumeIsStandby", refusal)));
        }
        let snapshot = match self.snapshot(volume).await? {
            Ok(snapshot) => snapshot,
            Err(wait) => return Ok(Err(wait)),
        };
        self.upload(&target, &store, &snapshot).await
    }

    /// The snapshot to back up, once it is taken; takes one if the Backup
    /// names none.
    async fn snapshot(
        &mut self,
        volume: &Volume,
    ) -> Result<Result<Snapshot, Wait>, ControllerError> {
        let named = &self.backup.spec.snapshot_name;
        let name = if named.is_empty() {
            self.backup.name_any()
        } else {
            named.clone()
        };
        let api = self.ctx.api::<Snapshot>();
        let snapshot = match self.ctx.ds.snapshots.get(&name) {
            Some(snapshot) => (*snapshot).clone(),
            None if named.is_empty() => {
                if name.len() > SNAPSHOT_NAME_MAX {
                    let message = format!(
                        "a backup named over {SNAPSHOT_NAME_MAX} characters needs spec.snapshotName"
                    );
                    return Ok(Err(Wait::Failed("NameTooLong", message)));
                }
                let mut snapshot = Snapshot::new(
                    &name,
                    SnapshotSpec {
                        volume: volume.name_any(),
                    },
                );
                let label = (BACKUP_FOR.to_owned(), self.backup.name_any());
                snapshot.metadata.labels = Some([label].into());
                match create_if_absent(&api, &snapshot).await? {
                    Some(created) => {
                        info!(snapshot = %name, "snapshot taken for the backup");
                        created
                    }
                    None => snapshot,
                }
            }
            None => {
                let message = format!("snapshot {name} does not exist");
                return Ok(Err(Wait::Pending("SnapshotNotFound", message, None)));
            }
        };
        if snapshot.spec.volume != self.backup.spec.volume_name {
            let message = format!(
                "snapshot {name} is of volume {}, not {}",
                snapshot.spec.volume, self.backup.spec.volume_name
            );
            return Ok(Err(Wait::Failed("WrongSnapshot", message)));
        }
        self.status.snapshot_name.clone_from(&name);
        if !snapshot.status.as_ref().is_some_and(|s| s.ready_to_use) {
            let message = format!("waiting for snapshot {name} to be taken");
            return Ok(Err(Wait::Pending(
                "WaitingForSnapshot",
                message,
                Some(RETRY),
            )));
        }
        Ok(Ok(snapshot))
    }

    /// Reads the snapshot from a replica of the volume and writes the
    /// backup, reporting progress as it goes.
    async fn upload(
        &mut self,
        target: &BackupTarget,
        store: &Backupstore,
        snapshot: &Snapshot,
    ) -> Result<Result<Action, Wait>, ControllerError> {
        let volume = &self.backup.spec.volume_name.clone();
        let labels = &self.backup.spec.labels.clone();
        let snapshot_name = snapshot.name_any();
        let Some(reader) = self.reader(&snapshot_name).await? else {
            let message =
                format!("no running replica of volume {volume} holds snapshot {snapshot_name}");
            return Ok(Err(Wait::Pending(
                "WaitingForReplica",
                message,
                Some(RETRY),
            )));
        };
        let previous = self.previous(&reader);
        let changed = reader.changed(previous.as_ref().map(|(_, snap)| snap.as_str()));
        let size = u64::try_from(snapshot.status.as_ref().map_or(0, |s| s.size)).unwrap_or(0);
        self.status.state = BackupState::InProgress;
        self.status.error.clear();
        self.status.size = i64::try_from(size).unwrap_or(i64::MAX);
        self.condition(ConditionStatus::False, "InProgress", "uploading".into());
        self.write_status().await?;
        info!(previous = ?previous.as_ref().map(|(b, _)| b), ranges = changed.len(), "backing up");

        let owner = LockOwner::new(&self.ctx.node.node_id);
        let name = self.backup.name_any();
        let done = Mutex::new((0usize, 0usize));
        let progress = |now: usize, of: usize| {
            // Poisoned only by a panic while storing two integers.
            *done.lock().unwrap_or_else(|e| e.into_inner()) = (now, of);
        };
        let request = NewBackup {
            volume,
            name: &name,
            snapshot: &snapshot_name,
            size,
            previous: previous.as_ref().map(|(backup, _)| backup.as_str()),
            changed: &changed,
            owner: owner.as_str(),
            labels,
            compression: self.ctx.settings().backup_compression,
            progress: Some(&progress),
        };
        let ctx = self.ctx.clone();
        let started = std::time::Instant::now();
        let upload = take(&ctx, store, &request, &reader);
        tokio::pin!(upload);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        let result = loop {
            tokio::select! {
                result = &mut upload => break result,
                _ = tick.tick() => {
                    let (now, of) = *done.lock().unwrap_or_else(|e| e.into_inner());
                    self.report_progress(now, of).await;
                }
            }
        };
        let uploaded = result.as_ref().ok().map(|report| report.bytes_uploaded);
        let backups = &self.ctx.metrics.backups;
        backups.ended(&target.name_any(), started.elapsed(), uploaded);
        match result {
            Ok(report) => {
                self.completed(target, &report.config, Some(&report));
                let note = format!(
                    "{} blocks, {} uploaded ({} bytes)",
                    report.config.blocks.len(),
                    report.blocks_uploaded,
                    report.bytes_uploaded
                );
                info!(%note, "backup completed");
                self.ctx
                    .event(&self.backup, EventType::Normal, COMPLETED, note)
                    .await;
                drop_snapshots_before(&self.ctx, &self.backup).await?;
                Ok(Ok(Action::await_change()))
            }
            Err(error) => Ok(Err(Wait::Failed("UploadFailed", error.to_string()))),
        }
    }

    /// Writes the upload's progress; best effort, the upload goes on.
    async fn report_progress(&mut self, done: usize, of: usize) {
        let percent = (done * 100).checked_div(of).unwrap_or(0);
        let percent = i32::try_from(percent).unwrap_or(100).min(99);
        if percent == self.status.progress {
            return;
        }
        self.status.progress = percent;
        if let Err(error) = self.write_status().await {
            warn!(%error, "progress not recorded");
        }
    }

    /// Writes the status as it is now, guarded by the last write.
    async fn write_status(&mut self) -> Result<(), ControllerError> {
        let mut updated = self.backup.clone();
        updated.status = Some(self.status.clone());
        self.backup = replace_status(&self.ctx.api::<Backup>(), &updated).await?;
        Ok(())
    }

    /// A reader of `snapshot` on a healthy running replica of the volume,
    /// reading what fails its checksums there from the others that hold
    /// it (found only then).
    async fn reader(&self, snapshot: &str) -> Result<Option<SnapshotReader>, ControllerError> {
        for replica in healthy_replicas(&self.ctx, &self.backup.spec.volume_name) {
            let Some(mut reader) = reader_on(&self.ctx, &replica, snapshot).await? else {
                continue;
            };
            let (ctx, snapshot) = (self.ctx.clone(), snapshot.to_owned());
            reader.or_else(Box::pin(async move {
                let mut others = Vec::new();
                let replicas = healthy_replicas(&ctx, &replica.spec.instance.volume_name);
                for other in replicas.iter().filter(|r| r.name_any() != replica.name_any()) {
                    match reader_on(&ctx, other, &snapshot).await {
                        Ok(Some(reader)) => others.push(reader),
                        Ok(None) => {}
                        Err(error) => {
                            warn!(replica = %other.name_any(), %error, "backup: another replica cannot read the snapshot");
                        }
                    }
                }
                others
            }));
            return Ok(Some(reader));
        }
        Ok(None)
    }

    /// The newest completed backup of the volume in the same target whose
    /// snapshot the reader's chain still holds: the backup this one builds
    /// on, and its snapshot.
    fn previous(&self, reader: &SnapshotReader) -> Option<(String, String)> {
        let spec = &self.backup.spec;
        // The reader's chain ends at this backup's snapshot: every other
        // snapshot it holds is older.
        self.ctx
            .ds
            .backups
            .store
            .state()
            .iter()
            .filter(|b| {
                b.spec.volume_name == spec.volume_name
                    && b.spec.backup_target_name == spec.backup_target_name
                    && b.name_any() != self.backup.name_any()
            })
            .filter_map(|b| {
                let status = b.status.as_ref()?;
                let snapshot = &status.snapshot_name;
                let at = reader.position(snapshot)?;
                (status.state == BackupState::Completed && *snapshot != self.status.snapshot_name)
                    .then(|| (at, b.name_any(), snapshot.clone()))
            })
            .max_by_key(|(at, _, _)| *at)
            .map(|(_, backup, snapshot)| (backup, snapshot))
    }

    fn completed(
        &mut self,
        target: &BackupTarget,
        config: &BackupConfig,
        report: Option<&BackupReport>,
    ) {
        let status = &mut self.status;
        status.state = BackupState::Completed;
        status.progress = 100;
        status.snapshot_name.clone_from(&config.snapshot);
        status.size = i64::try_from(config.size).unwrap_or(i64::MAX);
        status.url = backup_url(&target.spec.backup_target_url, &config.name, &config.volume);
        status.blocks = i64::try_from(config.blocks.len()).unwrap_or(i64::MAX);
        status.blocks_uploaded =
            report.map_or(0, |r| i64::try_from(r.blocks_uploaded).unwrap_or(i64::MAX));
        status.backup_created_at = config.completed_at().map(Time);
        status.error.clear();
        let message = format!("{} blocks in the store", config.blocks.len());
        self.condition(ConditionStatus::True, COMPLETED, message);
    }

    fn condition(&mut self, status: ConditionStatus, reason: &str, message: String) {
        Condition::set(
            &mut self.status.conditions,
            COMPLETED,
            status,
            reason,
            message,
        );
    }
}

/// Writes the backup; breaks first a lock its holder left behind.
async fn take(
    ctx: &Context,
    store: &Backupstore,
    request: &NewBackup<'_>,
    reader: &SnapshotReader,
) -> Result<BackupReport, BackupError> {
    match store.create(request, reader).await {
        Err(BackupError::Busy { held, .. }) if stale_lock(ctx, &held) => {
            warn!(holder = %held.owner, "breaking a lock its holder left");
            store.break_lock(request.volume, &held.owner).await?;
            store.create(request, reader).await
        }
        other => other,
    }
}

/// Where a backup is, as `fromBackup` takes it: the target's URL with the
/// backup and its volume as query keys (after the target's own, an NFS
/// target's ports).
fn backup_url(target_url: &str, backup: &str, volume: &str) -> String {
    let separator = if target_url.contains('?') { '&' } else { '?' };
    format!("{target_url}{separator}backup={backup}&volume={volume}")
}

/// The volume's replicas that are healthy and not failed.
fn healthy_replicas(ctx: &Context, volume: &str) -> Vec<Arc<Replica>> {
    ctx.ds
        .replicas
        .store
        .state()
        .into_iter()
        .filter(|r| {
            r.spec.instance.volume_name == volume
                && r.spec.healthy_at.is_some()
                && r.spec.failed_at.is_none()
        })
        .collect()
}

/// A reader of `snapshot` on `replica`; None when it is rebuilding or does
/// not hold the snapshot.
async fn reader_on(
    ctx: &Context,
    replica: &Replica,
    snapshot: &str,
) -> Result<Option<SnapshotReader>, ControllerError> {
    let volume = &replica.spec.instance.volume_name;
    let Some(address) = replica_control_address(replica) else {
        return Ok(None);
    };
    let access = ctx.access(volume, 0);
    let mut control = data_plane::replica(replica, &address, None, &access).await?;
    let status = control.status().await?;
    if status.rebuilding {
        return Ok(None);
    }
    let chain: Vec<String> = status.snapshots.iter().map(|s| s.name.clone()).collect();
    let client = control.client.clone().max_decoding_message_size(64 << 20);
    SnapshotReader::new(client, &chain, snapshot)
        .await
        .map_err(|status| control.failed(status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_url_adds_its_keys_to_the_target_url_query() {
        assert_eq!(
            backup_url("s3://b@us-east-1/p", "nightly-1", "pvc-1"),
            "s3://b@us-east-1/p?backup=nightly-1&volume=pvc-1"
        );
        assert_eq!(
            backup_url("nfs://nas:/export?nfsport=2049", "nightly-1", "pvc-1"),
            "nfs://nas:/export?nfsport=2049&backup=nightly-1&volume=pvc-1"
        );
    }
}
