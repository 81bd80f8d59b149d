//! The volume's turns in its recurring jobs: while a job's status lists the
//! volume as running, its owner runs the job's task on it and records how
//! it went in `status.recurringJobs`, which the job's owner counts.
//!
//! What a run makes is named after the job, the volume and the run, so a
//! manager taking a run over after a crash finds it instead of making a
//! second one. Retention runs only once the new one completed.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use super::super::recurring::{Item, ItemState, to_delete, whole_seconds, with_complete};
use super::super::{ControllerError, data_plane, delete};
use super::{Pass, SOON, running_status};
use crate::controller::recurring::joins;
use crate::datastore::{create_if_absent, unless_gone};
use crate::types::{
    Backup, BackupSpec, BackupState, Condition, ConditionStatus, DEFAULT_BACKUP_TARGET, DataMark,
    Engine, MADE_BY, Made, RecurringJob, Snapshot, SnapshotSpec, VolumeJob, VolumeJobState,
};

/// The volume's condition saying whether its recurring jobs last ran well.
pub const RECURRING_JOBS: &str = "RecurringJobs";

/// Where a turn stands after one look at it.
pub(super) enum Step {
    Running,
    Succeeded,
    Skipped(String),
    Failed(String),
}

impl Pass<'_> {
    /// Takes the turns the volume's jobs give it, and forgets the records
    /// of jobs it no longer joins.
    pub(super) async fn run_recurring_jobs(&mut self, engine: &Engine) {
        let name = self.name();
        let jobs = self.ctx.ds.recurring_jobs.store.state();
        let labels = self.volume.labels().clone();
        let standby = self.volume.is_standby();
        self.status.recurring_jobs.retain(|record| {
            !standby
                && jobs.iter().any(|j| {
                    j.name_any() == record.name && joins(&labels, &record.name, &j.spec.groups)
                })
        });
        for job in jobs {
            let turn = job.status.as_ref().and_then(|s| {
                s.last_run
                    .as_ref()
                    .filter(|_| s.running.contains(&name))
                    .map(|run| run.scheduled_at.clone())
            });
            if let Some(due) = turn {
                let span = info_span!("recurring_job", job = %job.name_any());
                // A turn that could not be looked at now is looked at again
                // soon; it holds up nothing else the volume's owner does.
                let taken = self
                    .take_turn(&job, engine, due)
                    .instrument(span.clone())
                    .await;
                if let Err(error) = taken {
                    warn!(parent: &span, %error, "recurring job's turn not taken yet");
                    self.wait_at_most(SOON);
                }
            }
        }
        self.recurring_condition();
    }

    async fn take_turn(
        &mut self,
        job: &RecurringJob,
        engine: &Engine,
        due: Time,
    ) -> Result<(), ControllerError> {
        let job_name = job.name_any();
        let mut record = self
            .status
            .recurring_jobs
            .iter()
            .find(|r| r.name == job_name)
            .cloned()
            .unwrap_or_else(|| VolumeJob {
                name: job_name.clone(),
                ..VolumeJob::default()
            });
        let this_run = record.scheduled_at.as_ref() == Some(&due);
        if this_run && record.state.finished() {
            return Ok(());
        }
        let step = if this_run {
            self.follow_job(job, &mut record).await?
        } else {
            record.scheduled_at = Some(due);
            record.message.clear();
            self.start(job, engine, &mut record).await?
        };
        self.record(job, &mut record, step).await;
        match self
            .status
            .recurring_jobs
            .iter_mut()
            .find(|r| r.name == job_name)
        {
            Some(existing) => *existing = record,
            None => self.status.recurring_jobs.push(record),
        }
        Ok(())
    }

    /// The first look at a turn: skips it, or does the task (or starts it,
    /// for what completes later).
    async fn start(
        &mut self,
        job: &RecurringJob,
        engine: &Engine,
        record: &mut VolumeJob,
    ) -> Result<Step, ControllerError> {
        let task = job.spec.task;
        let Some(made) = task.makes() else {
            return self.maintain(job, engine).await;
        };
        let mark = self.data_mark(engine).await;
        let unchanged = task.skips_unchanged() && mark.is_some() && record.data_mark == mark;
        if unchanged && let Some(kept) = self.complete(made, &record.made).await? {
            return Ok(Step::Skipped(format!("nothing was written since {kept}")));
        }
        // An earlier run's that has not completed yet (its store down, say)
        // is followed on rather than joined by another at each run.
        let unfinished = self
            .made_state(made, &record.made)
            .await?
            .is_some_and(|(state, _)| state != ItemState::Complete);
        let name = if unfinished {
            record.made.clone()
        } else {
            made_name(&job.name_any(), &self.name(), record)
        };
        match made {
            Made::Snapshot => self.make_snapshot(job, &name).await?,
            Made::Backup => self.make_backup(job, &name).await?,
        }
        info!(made = %name, "recurring job started");
        self.wait_at_most(SOON);
        record.made = name;
        record.run_mark = mark;
        Ok(Step::Running)
    }

    /// A later look at a turn whose snapshot or backup was being made.
    async fn follow_job(
        &mut self,
        job: &RecurringJob,
        record: &mut VolumeJob,
    ) -> Result<Step, ControllerError> {
        let Some(made) = job.spec.task.makes() else {
            return Ok(Step::Failed("the job's task changed during its run".into()));
        };
        let name = record.made.clone();
        let state = self.made_state(made, &name).await?;
        match state {
            None => Ok(Step::Failed(format!(
                "{name} was deleted before it completed"
            ))),
            Some((ItemState::InProgress, _)) => {
                self.wait_at_most(SOON);
                Ok(Step::Running)
            }
            Some((ItemState::Failed, why)) => Ok(Step::Failed(format!("{name}: {why}"))),
            Some((ItemState::Complete, _)) => {
                self.retain(job, made, &name).await?;
                record.data_mark = record.run_mark.take();
                Ok(Step::Succeeded)
            }
        }
    }

    /// Writes a turn's step into its record, with an Event for a failure.
    async fn record(&mut self, job: &RecurringJob, record: &mut VolumeJob, step: Step) {
        let now = Some(whole_seconds(Timestamp::now()));
        record.state = match step {
            Step::Running => VolumeJobState::Running,
            Step::Succeeded => {
                record.last_success_at = now;
                VolumeJobState::Succeeded
            }
            Step::Skipped(why) => {
                info!(%why, "recurring job skipped the volume");
                record.message = why;
                VolumeJobState::Skipped
            }
            Step::Failed(why) => {
                warn!(%why, "recurring job failed on the volume");
                record.last_failure_at = now;
                record.last_failure.clone_from(&why);
                record.message.clone_from(&why);
                let note = format!(
                    "recurring job {} ({:?}) failed: {why}",
                    job.name_any(),
                    job.spec.task
                );
                self.ctx
                    .event(&self.volume, EventType::Warning, "RecurringJobFailed", note)
                    .await;
                VolumeJobState::Failed
            }
        };
    }

    /// `RecurringJobs`: False while a job's last run on the volume failed.
    fn recurring_condition(&mut self) {
        let failed: Vec<String> = self
            .status
            .recurring_jobs
            .iter()
            .filter(|r| r.state == VolumeJobState::Failed)
            .map(|r| format!("{}: {}", r.name, r.message))
            .collect();
        let (status, reason, message) = if failed.is_empty() {
            (
                ConditionStatus::True,
                "Succeeded",
                "the last run of each job succeeded or had nothing to do".to_owned(),
            )
        } else {
            (ConditionStatus::False, "Failed", failed.join("; "))
        };
        if self.status.recurring_jobs.is_empty() {
            self.status.conditions.retain(|c| c.type_ != RECURRING_JOBS);
            return;
        }
        Condition::set(
            &mut self.status.conditions,
            RECURRING_JOBS,
            status,
            reason,
            message,
        );
    }

    /// Where the volume's writes are now: None when it cannot be told
    /// (the engine starting, or not answering), which never skips a run.
    async fn data_mark(&self, engine: &Engine) -> Option<DataMark> {
        let generation = i64::try_from(engine.spec.generation).ok()?;
        if running_status(engine).is_none() {
            let stopped = engine_state_stopped(engine);
            return stopped.then_some(DataMark {
                generation,
                revision: None,
            });
        }
        let address = data_plane::engine_control_address(engine)?;
        let mut control = self
            .ctx
            .engine_channels
            .engine(engine, &address, data_plane::CALL_TIMEOUT, &self.access())
            .await
            .ok()?;
        let observed = control.status().await.ok()?;
        let revision = observed
            .replicas
            .iter()
            .filter(|r| r.mode() == crate::protocol::control::ReplicaMode::Rw)
            .map(|r| r.revision)
            .max()?;
        Some(DataMark {
            generation,
            revision: i64::try_from(revision).ok(),
        })
    }

    async fn make_snapshot(&self, job: &RecurringJob, name: &str) -> Result<(), ControllerError> {
        let mut snapshot = Snapshot::new(
            name,
            SnapshotSpec {
                volume: self.name(),
            },
        );
        snapshot.metadata.labels = Some(made_labels(job));
        create_if_absent(&self.ctx.api::<Snapshot>(), &snapshot).await?;
        Ok(())
    }

    async fn make_backup(&self, job: &RecurringJob, name: &str) -> Result<(), ControllerError> {
        let target = match job.spec.backup_target_name.as_str() {
            "" => DEFAULT_BACKUP_TARGET.to_owned(),
            named => named.to_owned(),
        };
        let mut backup = Backup::new(
            name,
            BackupSpec {
                volume_name: self.name(),
                snapshot_name: String::new(),
                backup_target_name: target,
                labels: job.spec.labels.clone(),
            },
        );
        backup.metadata.labels = Some(made_labels(job));
        create_if_absent(&self.ctx.api::<Backup>(), &backup).await?;
        Ok(())
    }

    /// The name of `name` if it is complete.
    async fn complete(&self, made: Made, name: &str) -> Result<Option<String>, ControllerError> {
        let state = self.made_state(made, name).await?;
        Ok(state
            .filter(|(s, _)| *s == ItemState::Complete)
            .map(|_| name.to_owned()))
    }

    /// Where the snapshot or backup `name` is; None when there is none
    /// (or no name).
    async fn made_state(
        &self,
        made: Made,
        name: &str,
    ) -> Result<Option<(ItemState, String)>, ControllerError> {
        match made {
            _ if name.is_empty() => Ok(None),
            Made::Snapshot => self.snapshot_state(name).await,
            Made::Backup => self.backup_state(name).await,
        }
    }

    async fn snapshot_state(
        &self,
        name: &str,
    ) -> Result<Option<(ItemState, String)>, ControllerError> {
        let snapshot = match self.ctx.ds.snapshots.get(name) {
            Some(snapshot) => Some(snapshot),
            None => unless_gone(self.ctx.api::<Snapshot>().get(name).await)?.map(Arc::new),
        };
        Ok(snapshot
            .filter(|s| s.spec.volume == self.name() && s.metadata.deletion_timestamp.is_none())
            .map(|s| snapshot_item_state(&s)))
    }

    async fn backup_state(
        &self,
        name: &str,
    ) -> Result<Option<(ItemState, String)>, ControllerError> {
        let backup = match self.ctx.ds.backups.get(name) {
            Some(backup) => Some(backup),
            None => unless_gone(self.ctx.api::<Backup>().get(name).await)?.map(Arc::new),
        };
        Ok(backup
            .filter(|b| {
                b.spec.volume_name == self.name() && b.metadata.deletion_timestamp.is_none()
            })
            .map(|b| backup_item_state(&b)))
    }

    /// Deletes what the job made on this volume past its retention, `done`
    /// (this run's) being complete.
    async fn retain(
        &self,
        job: &RecurringJob,
        made: Made,
        done: &str,
    ) -> Result<(), ControllerError> {
        let job_name = job.name_any();
        let mine = |labels: &std::collections::BTreeMap<String, String>| {
            labels.get(MADE_BY).is_some_and(|j| *j == job_name)
        };
        let volume = self.name();
        let items: Vec<Item> = match made {
            Made::Snapshot => self
                .snapshots
                .iter()
                .chain(self.ctx.ds.snapshots.store.state().iter())
                .filter(|s| s.spec.volume == volume && mine(s.labels()))
                .filter(|s| s.metadata.deletion_timestamp.is_none())
                .map(|s| {
                    item(
                        s.name_any(),
                        s.metadata.creation_timestamp.as_ref(),
                        snapshot_item_state(s).0,
                    )
                })
                .collect(),
            Made::Backup => self
                .ctx
                .ds
                .backups
                .store
                .state()
                .iter()
                .filter(|b| b.spec.volume_name == volume && mine(b.labels()))
                .filter(|b| b.metadata.deletion_timestamp.is_none())
                .map(|b| {
                    item(
                        b.name_any(),
                        b.metadata.creation_timestamp.as_ref(),
                        backup_item_state(b).0,
                    )
                })
                .collect(),
        };
        let mut items = items;
        items.sort_by(|a, b| a.name.cmp(&b.name));
        items.dedup_by(|a, b| a.name == b.name);
        // The pass's own view of the snapshots may be older than the look-up
        // that found this run's complete.
        let items = with_complete(items, done, Timestamp::now());
        let age = super::super::backup::go_duration(&job.spec.retain_age)
            .map(|age| self.ctx.node.job_clock.real_duration(age));
        let retain = usize::try_from(job.spec.retain).unwrap_or(1);
        let doomed = to_delete(
            &items,
            job.spec.retention_policy,
            retain,
            age,
            Timestamp::now(),
        );
        for name in doomed {
            info!(%name, "deleting past the job's retention");
            match made {
                Made::Snapshot => {
                    if let Some(s) = self.ctx.ds.snapshots.get(&name) {
                        delete(&self.ctx.api::<Snapshot>(), &*s).await?;
                    }
                }
                Made::Backup => {
                    if let Some(b) = self.ctx.ds.backups.get(&name) {
                        delete(&self.ctx.api::<Backup>(), &*b).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn engine_state_stopped(engine: &Engine) -> bool {
    engine.spec.instance.desire_state == crate::types::DesireState::Stopped
        && super::engine_state(engine) == crate::types::InstanceState::Stopped
}

fn item(name: String, created: Option<&Time>, state: ItemState) -> Item {
    Item {
        name,
        created: created.map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        state,
    }
}

fn snapshot_item_state(snapshot: &Snapshot) -> (ItemState, String) {
    let status = snapshot.status.clone().unwrap_or_default();
    if status.ready_to_use {
        (ItemState::Complete, String::new())
    } else if !status.error.is_empty() {
        (ItemState::Failed, status.error)
    } else {
        (ItemState::InProgress, String::new())
    }
}

/// A backup waiting on its target or store (not found, unreachable,
/// refusing) has failed for the job's run, which says so; the Backup
/// itself is tried again, and a later run follows it on.
fn backup_item_state(backup: &Backup) -> (ItemState, String) {
    let status = backup.status.clone().unwrap_or_default();
    match status.state {
        BackupState::Completed => (ItemState::Complete, String::new()),
        BackupState::Error => (ItemState::Failed, status.error),
        BackupState::InProgress => (ItemState::InProgress, String::new()),
        BackupState::Pending => {
            let waiting = status.conditions.iter().find(|c| c.type_ == "Completed");
            match waiting {
                Some(c) if !WAITING_ON_THE_VOLUME.contains(&c.reason.as_str()) => {
                    (ItemState::Failed, format!("{}: {}", c.reason, c.message))
                }
                _ => (ItemState::InProgress, String::new()),
            }
        }
    }
}

/// Why a Backup waits that is its volume's doing, not its store's.
const WAITING_ON_THE_VOLUME: [&str; 5] = [
    "",
    "WaitingForSnapshot",
    "WaitingForReplica",
    "VolumeNotFound",
    "SnapshotNotFound",
];

/// The labels of what `job` makes: its own, and the job's name.
fn made_labels(job: &RecurringJob) -> std::collections::BTreeMap<String, String> {
    let mut labels = job.spec.labels.clone();
    labels.insert(MADE_BY.to_owned(), job.name_any());
    labels
}

/// The name of what the run of `record` makes on `volume`: the same for
/// every manager that takes the run on.
fn made_name(job: &str, volume: &str, record: &VolumeJob) -> String {
    let due = record.scheduled_at.as_ref().map_or(0, |t| t.0.as_second());
    let stamp = jiff::Timestamp::from_second(due)
        .map(|t| t.strftime("%Y%m%d%H%M%S").to_string())
        .unwrap_or_default();
    crate::names::object_name(&format!("{job}-{volume}-{stamp}"), MADE_NAME_MAX)
}

/// Snapshot names become data-plane layer names; kept as short as CSI's.
const MADE_NAME_MAX: usize = 63;
