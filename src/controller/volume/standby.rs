//! Following a standby volume's backups, and activating it (see
//! `types::standby`). Each pass takes the completed backups of the volume
//! followed that the caches show, finds those newer than the one held, and
//! restores the newest over it: the replicas that hold the old one get the
//! blocks that differ between the two backups' block lists; a replica new
//! to the volume, or all of them when the old backup is gone from the
//! store or a restore was cut short by another, are compared block by
//! block with the new backup instead. The restore is recorded in
//! status.standby.applying before its first write, and done again whole
//! if it is cut short (writing a block twice is harmless), so that the
//! volume, which nobody can read meanwhile, is never activated holding a
//! mix of two backups.
//!
//! Activation (spec.standby false) asks for a sync of the BackupVolume,
//! catches up to the newest backup that sync found, and only then marks
//! the volume Filled: it attaches like any other from then on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::super::backup::{SYNCED, backup_volume_name, request_sync};
use super::super::{ControllerError, replace_status};
use super::fill::Filling;
use super::standby_plan::{Candidate, Held, Plan, compare, diff, newer, to_read};
use super::standby_restore::{Member, StepError, apply, settle_members};
use super::{Pass, SOON};
use crate::backup::{BackupConfig, BackupError, Backupstore};
use crate::protocol::Access;
use crate::types::{
    Activation, BackupState, BackupTarget, BackupVolume, Condition, ConditionStatus, FILLED,
    Replica, StandbyMethod, StandbyRestore, StandbyStatus, StandbyStep, Volume,
};

/// The Filled reasons of a volume following backups, and of one being
/// activated.
const STANDBY: &str = "Standby";
const ACTIVATING: &str = "Activating";
/// How long after a failed sync of its BackupVolume an activation asks for
/// another.
const SYNC_RETRY: Duration = Duration::from_secs(5);
/// Backup configs read from the store at once.
const READ_PARALLEL: usize = 8;

/// Where a pass left the standby.
enum Progress {
    /// Waiting, for the reason given, as it should.
    Waiting(String),
    /// Kept from going on, for the reason given: a user may want to know.
    Blocked(String),
    /// Holding a backup, as said.
    Following(String),
    /// Activated: a normal volume from now on.
    Activated(String),
}

/// Whether the fresh sync an activation needs is done, and the newest
/// backup it found.
enum Sync {
    Done(Option<String>),
    NotYet(String),
}

impl Pass<'_> {
    /// Whether the volume is a standby, or was one and is not activated
    /// yet: its filling is this module's.
    pub(super) fn follows_backups(&self) -> bool {
        self.volume.spec.standby || self.status.standby.is_some()
    }

    /// Follows the backups, or activates the volume; says whether the
    /// replicas must run.
    pub(super) async fn follow_backups(&mut self) -> Result<Filling, ControllerError> {
        let progress = match self.follow().await {
            Err(error) if error.is_data_plane() => {
                warn!(%error, "standby: a replica did not answer; retrying");
                Progress::Blocked(error.to_string())
            }
            other => other?,
        };
        let reason = if self.volume.spec.standby {
            STANDBY
        } else {
            ACTIVATING
        };
        if matches!(progress, Progress::Waiting(_) | Progress::Blocked(_)) {
            self.wait_at_most(SOON);
        }
        let conditions = &mut self.status.conditions;
        match progress {
            Progress::Activated(message) => {
                Condition::set(conditions, FILLED, ConditionStatus::True, "Filled", message);
                return Ok(Filling::Done);
            }
            Progress::Blocked(message) => {
                let old = conditions.iter().find(|c| c.type_ == FILLED);
                let news = old.is_none_or(|c| c.message != message);
                Condition::set(conditions, FILLED, ConditionStatus::False, reason, &message);
                if news {
                    self.ctx
                        .event(&self.volume, EventType::Warning, "StandbyBlocked", message)
                        .await;
                }
            }
            Progress::Waiting(message) | Progress::Following(message) => {
                Condition::set(conditions, FILLED, ConditionStatus::False, reason, message);
            }
        }
        // The replicas run throughout, ready for the next backup.
        Ok(Filling::Copying)
    }

    /// Records an activation whose record a lost status write dropped
    /// (its engine runs), if the volume was a standby.
    pub(super) fn activated_unrecorded(&mut self) {
        let Some(standby) = self.status.standby.as_mut() else {
            return;
        };
        let activation = standby.activation.get_or_insert_default();
        if activation.activated_at.is_none() {
            activation.activated_at = Some(MicroTime(Timestamp::now()));
            activation.backup.clone_from(&standby.last_restored_backup);
        }
    }

    fn standby(&mut self) -> &mut StandbyStatus {
        self.status.standby.get_or_insert_default()
    }

    async fn follow(&mut self) -> Result<Progress, ControllerError> {
        let Some((target_name, source)) = self.followed() else {
            let name = &self.volume.spec.from_backup;
            return Ok(Progress::Blocked(format!(
                "backup {name} does not exist: it names the volume whose backups to follow"
            )));
        };
        let must = if self.volume.spec.standby {
            None
        } else {
            match self.fresh_sync(&target_name, &source).await? {
                Sync::Done(newest) => newest,
                Sync::NotYet(why) => return Ok(Progress::Waiting(why)),
            }
        };
        let Some(target) = self.ctx.ds.backup_targets.get(&target_name) else {
            return Ok(Progress::Blocked(format!(
                "BackupTarget {target_name} does not exist"
            )));
        };
        let store = match self.ctx.open_store(&target) {
            Ok(store) => store,
            Err(error) => return Ok(Progress::Blocked(error.to_string())),
        };
        let candidates = self.candidates(&target_name, &source, must.as_deref());
        let newer = match self.newer(&store, &source, &candidates).await {
            Ok(newer) => newer,
            Err(error) => return Ok(Progress::Blocked(format!("reading the store: {error}"))),
        };
        self.summarize(&newer);
        let running = self.running_replicas();
        if running.is_empty() {
            return Ok(Progress::Waiting(
                "waiting for the volume's replicas to run".into(),
            ));
        }
        let running_names: Vec<String> = running.iter().map(|(r, _)| r.name_any()).collect();
        if let Some(next) = self.next_backup(&candidates, &newer, &running) {
            if let Err(why) = self.step(&store, &source, &next, running).await? {
                return Ok(Progress::Blocked(why));
            }
            let held_at = self.held().map(|h| h.completed);
            let newer: Vec<_> = newer
                .into_iter()
                .filter(|(n, at)| *n != next && held_at.is_none_or(|h| *at > h))
                .collect();
            self.summarize(&newer);
            if !newer.is_empty() {
                self.wait_at_most(SOON);
            }
        }
        let standby = self.standby();
        let held = standby.last_restored_backup.clone();
        if held.is_empty() {
            return Ok(Progress::Waiting(format!(
                "no completed backup of volume {source} in target {target_name} yet"
            )));
        }
        let holders: BTreeSet<&str> = standby.replicas.iter().map(String::as_str).collect();
        if !running_names.iter().any(|r| holders.contains(r.as_str())) {
            // The replicas running are new ones: an engine would trust
            // them as they are (zeros), so the volume follows nothing and
            // is not activated until a holder runs or a backup fills them.
            return Ok(Progress::Blocked(format!(
                "no running replica holds backup {held}, which is gone from the store: waiting for a replica holding it to run again, or for a newer backup"
            )));
        }
        let caught_up = standby.backups_behind == 0 && standby.applying.is_none();
        if !self.volume.spec.standby && caught_up {
            return Ok(Progress::Activated(self.activate().await));
        }
        let standby = self.standby();
        Ok(Progress::Following(format!(
            "follows the backups of volume {source} in target {target_name}: holds backup {held}, {} newer",
            standby.backups_behind
        )))
    }

    /// The BackupTarget and the store's volume whose backups the volume
    /// follows: recorded on the first pass, from the Backup fromBackup names.
    fn followed(&mut self) -> Option<(String, String)> {
        let standby = self.status.standby.get_or_insert_default();
        if standby.source_volume.is_empty() {
            let backup = self.ctx.ds.backups.get(&self.volume.spec.from_backup)?;
            standby
                .backup_target
                .clone_from(&backup.spec.backup_target_name);
            standby.source_volume.clone_from(&backup.spec.volume_name);
            info!(target = %standby.backup_target, source = %standby.source_volume, "standby: following the backups of this volume");
        }
        Some((standby.backup_target.clone(), standby.source_volume.clone()))
    }

    /// The completed backups of the volume followed that the caches show,
    /// and `must`, the newest a sync found (its details may not be read
    /// into its Backup yet).
    fn candidates(&self, target: &str, source: &str, must: Option<&str>) -> Vec<Candidate> {
        let mut candidates: Vec<Candidate> = self
            .ctx
            .ds
            .backups
            .store
            .state()
            .iter()
            .filter(|b| b.spec.backup_target_name == target && b.spec.volume_name == source)
            .filter(|b| b.metadata.deletion_timestamp.is_none())
            .filter_map(|b| {
                let status = b.status.as_ref()?;
                (status.state == BackupState::Completed).then(|| Candidate {
                    name: b.name_any(),
                    completed: status.backup_created_at.as_ref().map(|t| t.0),
                })
            })
            .collect();
        if let Some(must) = must.filter(|m| candidates.iter().all(|c| c.name != *m)) {
            candidates.push(Candidate {
                name: must.to_owned(),
                completed: None,
            });
        }
        candidates
    }

    fn held(&self) -> Option<Held> {
        let standby = self.status.standby.as_ref()?;
        (!standby.last_restored_backup.is_empty()).then(|| Held {
            name: standby.last_restored_backup.clone(),
            completed: standby
                .last_restored_backup_at
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        })
    }

    /// The candidates completed after the backup held, oldest first.
    async fn newer(
        &self,
        store: &Backupstore,
        source: &str,
        candidates: &[Candidate],
    ) -> Result<Vec<(String, Timestamp)>, BackupError> {
        let held = self.held();
        let names = to_read(candidates, held.as_ref());
        let exact: BTreeMap<String, Timestamp> = futures::stream::iter(names)
            .map(|name| completion(store, source, name))
            .buffer_unordered(READ_PARALLEL)
            .try_filter_map(|found| async move { Ok(found) })
            .try_collect()
            .await?;
        Ok(newer(candidates, held.as_ref(), &exact))
    }

    /// The newest backup known and how far behind it the volume is.
    fn summarize(&mut self, newer: &[(String, Timestamp)]) {
        let standby = self.standby();
        let held_at = standby.last_restored_backup_at.as_ref().map(|t| t.0);
        let (newest, newest_at) = match newer.last() {
            Some((name, at)) => (name.clone(), Some(*at)),
            None => (standby.last_restored_backup.clone(), held_at),
        };
        standby.newest_backup = newest;
        standby.newest_backup_at = newest_at.map(MicroTime);
        standby.backups_behind = newer.len() as i64;
        standby.lag_seconds = match (newest_at, held_at) {
            (Some(newest), Some(held)) => newest.duration_since(held).as_secs().max(0),
            _ => 0,
        };
    }

    /// The backup to restore now, if any: first the one a restore cut
    /// short was restoring, while it is there; else the newest; else the
    /// one held, for replicas that do not hold it yet.
    fn next_backup(
        &self,
        candidates: &[Candidate],
        newer: &[(String, Timestamp)],
        running: &[(Arc<Replica>, String)],
    ) -> Option<String> {
        let standby = self.status.standby.as_ref()?;
        let held = Some(standby.last_restored_backup.clone()).filter(|h| !h.is_empty());
        if let Some(applying) = &standby.applying {
            let there = candidates.iter().any(|c| c.name == applying.backup);
            if there {
                return Some(applying.backup.clone());
            }
            return newer.last().map(|(n, _)| n.clone()).or(held);
        }
        if let Some((newest, _)) = newer.last() {
            return Some(newest.clone());
        }
        let holders: BTreeSet<&str> = standby.replicas.iter().map(String::as_str).collect();
        let fresh = running
            .iter()
            .any(|(r, _)| !holders.contains(r.name_any().as_str()));
        // Gone from the store, it can fill no new replica: a first engine
        // start rebuilds them from the replicas holding it.
        let there = |h: &String| candidates.iter().any(|c| c.name == *h);
        held.filter(|h| fresh && there(h))
    }

    /// Restores backup `name` over what `running` (every usable replica)
    /// hold. Err: why it could not, for the condition.
    async fn step(
        &mut self,
        store: &Backupstore,
        source: &str,
        name: &str,
        running: Vec<(Arc<Replica>, String)>,
    ) -> Result<Result<(), String>, ControllerError> {
        let started = std::time::Instant::now();
        let config = match store.backup(source, name).await {
            Ok(config) => config,
            Err(BackupError::NotFound(..)) => {
                return Ok(Err(format!(
                    "backup {name} is gone from the store; waiting for a newer one"
                )));
            }
            Err(error) => return Ok(Err(format!("reading backup {name}: {error}"))),
        };
        let volume_size = u64::try_from(self.volume.spec.size).unwrap_or(0);
        if config.size > volume_size {
            return Ok(Err(format!(
                "backup {name} holds {} bytes, more than the volume's {volume_size}: grow the volume",
                config.size
            )));
        }
        let base = match self.diff_base(store, source, name).await {
            Ok(base) => base,
            Err(error) => return Ok(Err(format!("reading the store: {error}"))),
        };
        let restore = StandbyRestore {
            backup: name.to_owned(),
            base: base.as_ref().map(|b| b.name.clone()).unwrap_or_default(),
            started_at: Some(MicroTime(Timestamp::now())),
            by: self.ctx.node.node_id.clone(),
        };
        // Recorded before the first write, with a generation of its own:
        // a restore cut short is done again, the volume is not activated
        // meanwhile, and the writes of any earlier restore still going
        // (its manager lost the volume) are refused once this one has
        // reached the replicas. A stale status fails to be written here.
        // This manager doing its own again needs neither.
        let standby = self.standby();
        let again = standby.applying.as_ref().is_some_and(|a| {
            (&a.backup, &a.base, &a.by) == (&restore.backup, &restore.base, &restore.by)
        });
        if !again || standby.generation == 0 {
            standby.applying = Some(restore.clone());
            standby.generation += 1;
            self.persist().await?;
        }
        let floor = self.standby().revision;
        let access = self.access();
        let done = async {
            let mut members = Vec::with_capacity(running.len());
            for (replica, control) in running {
                members.push(Member::connect(replica, control, &access).await?);
            }
            let plans = self
                .plans(&members, base.as_ref(), &config, &access)
                .await?;
            let written = apply(store, source, &config, &members, &plans).await?;
            let revision = settle_members(&members, &access, floor).await?;
            Ok::<_, StepError>((members, written, revision))
        }
        .await;
        let (members, written, revision) = match done {
            Ok(done) => done,
            Err(StepError::Controller(error)) => return Err(error),
            Err(error) => {
                warn!(backup = name, %error, "standby: restore cut short; it is done again");
                return Ok(Err(format!("restoring backup {name}: {error}")));
            }
        };
        // By difference only if every replica held the base.
        let holders = self.status.standby.as_ref().map(|s| &s.replicas);
        let held = |m: &Member| holders.is_some_and(|h| h.contains(&m.replica.name_any()));
        let step = StandbyStep {
            backup: name.to_owned(),
            base: restore.base.clone(),
            method: if base.is_some() && members.iter().all(held) {
                StandbyMethod::Diff
            } else {
                StandbyMethod::Compare
            },
            blocks_written: written.blocks as i64,
            blocks_zeroed: written.zeroed as i64,
            bytes_restored: written.bytes as i64,
            duration_millis: started.elapsed().as_millis() as i64,
            completed_at: Some(MicroTime(Timestamp::now())),
        };
        let note = format!(
            "restored backup {name}{}: {} blocks written ({} bytes), {} zeroed, in {} ms",
            match restore.base.as_str() {
                "" => " (compared block by block)".to_owned(),
                base if base == name => " to new replicas".to_owned(),
                base => format!(" over {base}"),
            },
            step.blocks_written,
            step.bytes_restored,
            step.blocks_zeroed,
            step.duration_millis
        );
        info!(backup = name, base = %restore.base, blocks = step.blocks_written, bytes = step.bytes_restored, zeroed = step.blocks_zeroed, "standby: {note}");
        let standby = self.standby();
        standby.last_restored_backup = name.to_owned();
        standby.last_restored_backup_at = config.completed_at().map(MicroTime);
        standby.last_restored_at = step.completed_at.clone();
        standby.replicas = members.iter().map(|m| m.replica.name_any()).collect();
        standby.revision = revision;
        standby.applying = None;
        standby.last_step = Some(step);
        self.ctx
            .event(&self.volume, EventType::Normal, "StandbyRestored", note)
            .await;
        Ok(Ok(()))
    }

    /// The backup the replicas holding the last one can be brought from
    /// by the difference of block lists: that one, unless a restore of
    /// another was cut short (they may hold a mix) or it is gone from the
    /// store. None: compare every replica.
    async fn diff_base(
        &mut self,
        store: &Backupstore,
        source: &str,
        name: &str,
    ) -> Result<Option<BackupConfig>, BackupError> {
        let standby = self.standby();
        let base = match &standby.applying {
            Some(a) if a.backup != name || a.base.is_empty() => return Ok(None),
            Some(a) => a.base.clone(),
            None if standby.last_restored_backup.is_empty() => return Ok(None),
            None => standby.last_restored_backup.clone(),
        };
        match store.backup(source, &base).await {
            Ok(config) => Ok(Some(config)),
            Err(BackupError::NotFound(..)) => {
                info!(%base, "standby: the backup held is gone from the store; comparing blocks");
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Each member's plan: the difference from `base` for those holding
    /// it, a comparison of their blocks with the target's for the others.
    async fn plans(
        &self,
        members: &[Member],
        base: Option<&BackupConfig>,
        target: &BackupConfig,
        access: &Access,
    ) -> Result<Vec<Plan>, StepError> {
        let volume_size = u64::try_from(self.volume.spec.size).unwrap_or(0);
        let holders: BTreeSet<String> = self
            .status
            .standby
            .as_ref()
            .map(|s| s.replicas.iter().cloned().collect())
            .unwrap_or_default();
        let mut plans = Vec::with_capacity(members.len());
        for member in members {
            let plan = match base {
                Some(base) if holders.contains(&member.replica.name_any()) => {
                    diff(base, target, volume_size)
                }
                _ => {
                    let held = member.held_blocks(access).await?;
                    let sums = member.checksums(&held, target).await?;
                    compare(&sums, target, volume_size)
                }
            };
            plans.push(plan);
        }
        Ok(plans)
    }

    /// Writes the status now: what it records must be durable before the
    /// data plane is changed.
    async fn persist(&mut self) -> Result<(), ControllerError> {
        let mut updated = self.volume.clone();
        updated.status = Some(self.status.clone());
        self.volume = replace_status(&self.ctx.api::<Volume>(), &updated).await?;
        Ok(())
    }

    /// Asks for a sync of the BackupVolume once, and says whether it is
    /// done and which backup it found newest. Without a BackupVolume yet,
    /// the target is synced, which makes it.
    async fn fresh_sync(&mut self, target: &str, source: &str) -> Result<Sync, ControllerError> {
        let now = Timestamp::now();
        if self.standby().activation.is_none() {
            info!("standby: activation asked");
            self.standby().activation = Some(Activation {
                requested_at: Some(MicroTime(now)),
                ..Activation::default()
            });
            let note = "activation asked: catching up to the newest backup".to_owned();
            self.ctx
                .event(&self.volume, EventType::Normal, "Activating", note)
                .await;
        }
        let name = backup_volume_name(target, source);
        let ds = &self.ctx.ds;
        let (backup_volume, backup_target) =
            (ds.backup_volumes.get(&name), ds.backup_targets.get(target));
        let activation = self.standby().activation.get_or_insert_default();
        let Some(asked) = activation.sync_requested_at.as_ref().map(|t| t.0) else {
            activation.sync_requested_at = Some(MicroTime(now));
            if backup_volume.is_some() {
                request_sync::<BackupVolume>(self.ctx, &name).await?;
            } else {
                request_sync::<BackupTarget>(self.ctx, target).await?;
            }
            return Ok(Sync::NotYet(format!(
                "activating: waiting for a sync of backup volume {name}"
            )));
        };
        let synced_since = |at: Option<&MicroTime>| at.is_some_and(|t| t.0 >= asked);
        if let Some(status) = backup_volume.as_ref().and_then(|v| v.status.as_ref()) {
            if synced_since(status.last_synced_at.as_ref()) {
                if Condition::is_true(&status.conditions, SYNCED) {
                    let newest = Some(status.last_backup_name.clone()).filter(|n| !n.is_empty());
                    return Ok(Sync::Done(newest));
                }
                let failed = status.conditions.iter().find(|c| c.type_ == SYNCED);
                let why = failed.map_or(String::new(), |c| c.message.clone());
                let last = status.last_synced_at.as_ref().map_or(now, |t| t.0);
                if Duration::try_from(now.duration_since(last)).unwrap_or_default() > SYNC_RETRY {
                    // Asked again on the next pass.
                    activation.sync_requested_at = None;
                }
                return Ok(Sync::NotYet(format!(
                    "activating: the sync of backup volume {name} failed ({why}); trying again"
                )));
            }
        } else if backup_volume.is_none() {
            // The target synced since and found no backups of the volume.
            let status = backup_target.as_ref().and_then(|t| t.status.as_ref());
            if status.is_some_and(|s| s.available && synced_since(s.last_synced_at.as_ref())) {
                return Ok(Sync::Done(None));
            }
        }
        Ok(Sync::NotYet(format!(
            "activating: waiting for a sync of backup volume {name}"
        )))
    }

    /// Marks the activation done: the volume holds the newest backup.
    async fn activate(&mut self) -> String {
        let now = Timestamp::now();
        let standby = self.standby();
        let held = standby.last_restored_backup.clone();
        let held_at = standby.last_restored_backup_at.as_ref().map(|t| t.0);
        let activation = standby.activation.get_or_insert_default();
        let asked = activation.requested_at.as_ref().map_or(now, |t| t.0);
        activation.activated_at = Some(MicroTime(now));
        activation.backup.clone_from(&held);
        activation.duration_millis = now.duration_since(asked).as_millis() as i64;
        activation.data_lag_millis =
            held_at.map_or(0, |at| asked.duration_since(at).as_millis() as i64);
        let message = format!(
            "activated holding backup {held}, in {} ms; that backup was completed {} ms before activation was asked",
            activation.duration_millis, activation.data_lag_millis
        );
        info!(backup = %held, rto_ms = activation.duration_millis, rpo_ms = activation.data_lag_millis, "standby: activated");
        self.ctx
            .event(
                &self.volume,
                EventType::Normal,
                "Activated",
                message.clone(),
            )
            .await;
        message
    }
}

/// When backup `name` of `source` was completed, as the store says; None
/// if it is gone from the store.
async fn completion(
    store: &Backupstore,
    source: &str,
    name: String,
) -> Result<Option<(String, Timestamp)>, BackupError> {
    match store.backup(source, &name).await {
        Ok(config) => Ok(config.completed_at().map(|at| (name, at))),
        Err(BackupError::NotFound(..)) => Ok(None),
        Err(error) => Err(error),
    }
}
