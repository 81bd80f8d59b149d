//! The BackupTarget controller: its poll timer and its sync. The timer sets
//! spec.syncRequestedAt once pollInterval has passed since the last sync
//! (seed 002's second design: the timer is exact, and a user forces a sync
//! by setting the field); a sync runs whenever that request is newer than
//! status.lastSyncedAt. A sync lists the store's volumes, makes a
//! BackupVolume of each (asking each for a sync of its own backups) and
//! deletes those of volumes the store no longer has; and it shows the
//! store's system backups as SystemBackups.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use super::{RETRY, Unavailable, bounded, hex, now, owned_by, sync_due, unavailable};
use crate::backup::Backupstore;
use crate::controller::system_backup::reconcile_found;
use crate::controller::{Context, ControllerError, delete, update_status};
use crate::datastore::create_if_absent;
use crate::types::{
    BackupTarget, BackupTargetStatus, BackupVolume, BackupVolumeSpec, Condition, ConditionStatus,
};

/// The condition saying whether the store answered the last sync.
pub const AVAILABLE: &str = "Available";
/// The longest wait between tries of a store that does not answer.
const RETRY_MAX: Duration = Duration::from_secs(300);

pub async fn reconcile(
    target: Arc<BackupTarget>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if target.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some(target) = ctx.claim(&*target).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("backup_target", target = %target.name_any());
    async move {
        let status = target.status.clone().unwrap_or_default();
        if sync_due(
            target.spec.sync_requested_at.as_ref(),
            status.last_synced_at.as_ref(),
        ) {
            return sync(&ctx, &target, status).await;
        }
        poll(&ctx, &target, &status).await
    }
    .instrument(span)
    .await
}

/// The poll timer: asks for a sync once pollInterval has passed since the
/// last one, else comes back when it will have.
async fn poll(
    ctx: &Context,
    target: &BackupTarget,
    status: &BackupTargetStatus,
) -> Result<Action, ControllerError> {
    let interval = go_duration(&target.spec.poll_interval);
    // A store that did not answer is tried again sooner, whatever the poll.
    let interval = match interval {
        _ if !status.available => {
            let backoff = retry_after(status);
            backoff.min(interval.unwrap_or(backoff))
        }
        Some(interval) => interval,
        None => return Ok(Action::await_change()),
    };
    let last = status
        .last_synced_at
        .as_ref()
        .map_or(jiff::Timestamp::UNIX_EPOCH, |t| t.0);
    let since = jiff::Timestamp::now().duration_since(last);
    let since = Duration::try_from(since).unwrap_or_default();
    if since < interval {
        return Ok(Action::requeue(interval - since));
    }
    request_sync::<BackupTarget>(ctx, &target.name_any()).await?;
    Ok(Action::await_change())
}

/// How long after a failed sync the next is tried: as long as the store
/// had been unavailable at that sync, from [`RETRY`] up to [`RETRY_MAX`],
/// so the waits double (5, 5, 10, 20 s, ...) and reset once it answers.
fn retry_after(status: &BackupTargetStatus) -> Duration {
    let since = status
        .conditions
        .iter()
        .find(|c| c.type_ == AVAILABLE)
        .and_then(|c| c.last_transition_time.as_ref());
    let (Some(since), Some(synced)) = (since, status.last_synced_at.as_ref()) else {
        return RETRY;
    };
    let down = synced.0.duration_since(since.0);
    Duration::try_from(down)
        .unwrap_or_default()
        .clamp(RETRY, RETRY_MAX)
}

/// Sets `name`'s spec.syncRequestedAt to now.
pub(in crate::controller) async fn request_sync<K>(
    ctx: &Context,
    name: &str,
) -> Result<(), ControllerError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let patch = json!({"spec": {"syncRequestedAt": now()}});
    ctx.api::<K>()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A Go-style duration (`300s`, `5m`, `1h30m`); None for zero, which
/// means never. The schema admits only well-formed ones.
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * seconds;
    }
    (total > 0.0).then(|| Duration::from_secs_f64(total))
}

/// Lists the store's volumes into BackupVolumes and records how it went.
async fn sync(
    ctx: &Context,
    target: &BackupTarget,
    mut status: BackupTargetStatus,
) -> Result<Action, ControllerError> {
    let listed = match ctx.open_store(target) {
        Ok(store) => list(&store).await.map(|listed| (store, listed)),
        Err(error) => Err(Unavailable::Target(error)),
    };
    let was_available = status.available;
    status.last_synced_at = Some(now());
    let action = match listed {
        Ok((store, (volumes, system_backups))) => {
            reconcile_volumes(ctx, target, &volumes).await?;
            reconcile_found(ctx, target, &store, &system_backups).await?;
            status.available = true;
            let message = format!("{} volumes with backups", volumes.len());
            Condition::set(
                &mut status.conditions,
                AVAILABLE,
                ConditionStatus::True,
                "Synced",
                message,
            );
            if !was_available {
                info!(volumes = volumes.len(), "backup target available");
                let note = format!("the store answered: {} volumes with backups", volumes.len());
                ctx.event(target, EventType::Normal, "Available", note)
                    .await;
            }
            Action::await_change()
        }
        Err(error) => {
            let (reason, message) = unavailable(&error);
            status.available = false;
            let flipped = Condition::set(
                &mut status.conditions,
                AVAILABLE,
                ConditionStatus::False,
                reason,
                message.clone(),
            );
            warn!(reason, %message, "backup target unavailable");
            if flipped || was_available {
                ctx.event(target, EventType::Warning, reason, message).await;
            }
            Action::await_change()
        }
    };
    update_status(&ctx.api::<BackupTarget>(), target, status).await?;
    Ok(action)
}

/// The store's volumes and system backups.
async fn list(store: &Backupstore) -> Result<(Vec<String>, Vec<String>), Unavailable> {
    let volumes = bounded(store.volumes()).await?;
    Ok((volumes, bounded(store.system_backups()).await?))
}

/// Makes the target's BackupVolumes those of `volumes`, and asks each for
/// a sync.
async fn reconcile_volumes(
    ctx: &Context,
    target: &BackupTarget,
    volumes: &[String],
) -> Result<(), ControllerError> {
    let name = target.name_any();
    let ours: Vec<Arc<BackupVolume>> = ctx
        .ds
        .backup_volumes
        .store
        .state()
        .into_iter()
        .filter(|bv| bv.spec.backup_target_name == name)
        .collect();
    let wanted: BTreeSet<&str> = volumes.iter().map(String::as_str).collect();
    for gone in ours
        .iter()
        .filter(|bv| !wanted.contains(bv.spec.volume_name.as_str()))
    {
        info!(volume = %gone.spec.volume_name, "no longer in the store");
        delete(&ctx.api::<BackupVolume>(), &**gone).await?;
    }
    let known: BTreeSet<&str> = ours.iter().map(|bv| bv.spec.volume_name.as_str()).collect();
    let requested = Some(now());
    for volume in volumes {
        if known.contains(volume.as_str()) {
            let existing = backup_volume_name(&name, volume);
            request_sync::<BackupVolume>(ctx, &existing).await?;
            continue;
        }
        create_backup_volume(ctx, target, volume, requested.clone()).await?;
    }
    Ok(())
}

async fn create_backup_volume(
    ctx: &Context,
    target: &BackupTarget,
    volume: &str,
    requested: Option<MicroTime>,
) -> Result<(), ControllerError> {
    let target_name = target.name_any();
    let mut object = BackupVolume::new(
        &backup_volume_name(&target_name, volume),
        BackupVolumeSpec {
            backup_target_name: target_name,
            volume_name: volume.to_owned(),
            sync_requested_at: requested,
        },
    );
    object.metadata.owner_references = Some(vec![owned_by(target)]);
    // None: made by an earlier sync the cache does not show yet.
    if create_if_absent(&ctx.api::<BackupVolume>(), &object)
        .await?
        .is_some()
    {
        info!(volume, "found in the store");
    }
    Ok(())
}

/// A BackupVolume's name: the volume's, and a digest of the target's, so
/// that two targets holding one volume never collide.
pub fn backup_volume_name(target: &str, volume: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, target.as_bytes());
    format!("{volume}-{}", hex(&digest.as_ref()[..4]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn poll_intervals_read_as_go_durations() {
        assert_eq!(go_duration("300s"), Some(Duration::from_secs(300)));
        assert_eq!(go_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(go_duration("0s"), None, "never");
        assert_eq!(go_duration("5 minutes"), None);
    }

    #[test]
    fn an_unavailable_store_is_tried_again_after_doubling_waits() {
        let down_at = |synced_after: i64| {
            let since = jiff::Timestamp::from_second(1_000_000).unwrap();
            let synced = since + jiff::SignedDuration::from_secs(synced_after);
            let mut status = BackupTargetStatus {
                last_synced_at: Some(MicroTime(synced)),
                ..BackupTargetStatus::default()
            };
            Condition::set(
                &mut status.conditions,
                AVAILABLE,
                ConditionStatus::False,
                "Unreachable",
                String::new(),
            );
            status.conditions[0].last_transition_time = Some(Time(since));
            retry_after(&status).as_secs()
        };
        let mut waits = Vec::new();
        let mut synced = 0;
        for _ in 0..10 {
            let wait = down_at(synced);
            waits.push(wait);
            synced += i64::try_from(wait).unwrap();
        }
        assert_eq!(waits, [5, 5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(retry_after(&BackupTargetStatus::default()).as_secs(), 5);
    }

    #[test]
    fn backup_volume_names_differ_by_target() {
        let a = backup_volume_name("default", "pvc-1");
        assert!(a.starts_with("pvc-1-"), "{a}");
        assert_ne!(a, backup_volume_name("offsite", "pvc-1"));
        assert_eq!(a, backup_volume_name("default", "pvc-1"));
    }
}
