//! RecurringJob: a task (snapshots, backups, their clean-up, a filesystem
//! trim) run on a cron schedule over the volumes that join it, as
//! Longhorn's RecurringJob, so that specs carry over. The job's owner
//! starts each run and grants volumes their turn, at most `concurrency` at
//! once; each volume's owner runs the task on its volume and records the
//! outcome in the volume's status (`status.recurringJobs`). Nothing runs in
//! a pod: a run has no pod to stay Pending.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// A volume label naming a job it joins: `recurring-job.oxhorn.io/<job>:
/// enabled`.
pub const JOB_LABEL_PREFIX: &str = "recurring-job.oxhorn.io/";
/// A volume label naming a group whose jobs it joins:
/// `recurring-job-group.oxhorn.io/<group>: enabled`.
pub const GROUP_LABEL_PREFIX: &str = "recurring-job-group.oxhorn.io/";
/// A claim label: `recurring-job-source.oxhorn.io: enabled` makes the
/// claim's job and group labels its volume's.
pub const SOURCE_LABEL: &str = "recurring-job-source.oxhorn.io";
/// The claims that are such a source, as a label selector.
pub const SOURCE_SELECTOR: &str = "recurring-job-source.oxhorn.io=enabled";
/// The value of a job or group label that joins it.
pub const ENABLED: &str = "enabled";
/// The group of the volumes that join no job or group by label.
pub const DEFAULT_GROUP: &str = "default";
/// Label on every Snapshot and Backup a job makes: the job. Retention
/// counts only these.
pub const MADE_BY: &str = "oxhorn.io/recurring-job";

/// A Go duration, as `kubectl` users write them: `300s`, `24h`, `1h30m`.
const DURATION_PATTERN: &str = r"^$|^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
const NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";
/// Five fields of what cron accepts, or one of its `@` shorthands; whether
/// the fields make sense is the controller's to say (the Valid condition).
const CRON_PATTERN: &str = r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9A-Za-z*/,?#LW-]+( +[0-9A-Za-z*/,?#LW-]+){4})$";

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "RecurringJob",
    namespaced,
    status = "RecurringJobStatus",
    shortname = "oxrj",
    category = "oxhorn",
    doc = "A task run on a cron schedule over the volumes that join it.",
    printcolumn(name = "Task", type_ = "string", json_path = ".spec.task"),
    printcolumn(name = "Cron", type_ = "string", json_path = ".spec.cron"),
    printcolumn(
        name = "Groups",
        type_ = "string",
        json_path = ".spec.groups",
        description = "volumes of these groups join the job; \"default\": those joining none"
    ),
    printcolumn(
        name = "Retain",
        type_ = "integer",
        json_path = ".spec.retain",
        description = "snapshots or backups kept per volume (count-based retention)"
    ),
    printcolumn(
        name = "Concurrency",
        type_ = "integer",
        json_path = ".spec.concurrency"
    ),
    printcolumn(
        name = "Last Run",
        type_ = "date",
        json_path = ".status.lastRun.scheduledAt"
    ),
    printcolumn(name = "Next Run", type_ = "date", json_path = ".status.nextRunAt"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("!has(self.retentionPolicy) || self.retentionPolicy != 'age-based' || (has(self.retainAge) && self.retainAge != '' && !self.retainAge.matches('^(0+(\\\\.0+)?(ns|us|µs|ms|s|m|h))+$'))").message("retentionPolicy age-based needs a retainAge longer than 0, such as 168h"))]
#[x_kube(validation = Rule::new("!has(self.backupTargetName) || self.backupTargetName == '' || self.task in ['backup', 'backup-force-create']").message("backupTargetName is for backup tasks only"))]
#[x_kube(validation = Rule::new("!(self.task in ['snapshot', 'snapshot-force-create', 'backup', 'backup-force-create']) || (has(self.retentionPolicy) && self.retentionPolicy == 'age-based') || !has(self.retain) || self.retain >= 1").message("a job that makes snapshots or backups must retain at least 1 of them"))]
#[serde(rename_all = "camelCase")]
pub struct RecurringJobSpec {
    /// What the job does to each volume.
    pub task: RecurringTask,
    /// When, in UTC: five cron fields (minute hour day-of-month month
    /// day-of-week) or a shorthand such as `@daily`.
    #[schemars(length(min = 1, max = 256), regex(pattern = CRON_PATTERN))]
    pub cron: String,
    /// Volumes of these groups join the job (by the label
    /// `recurring-job-group.oxhorn.io/<group>: enabled`); `default` takes
    /// every volume that joins no job or group by label.
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63), regex(pattern = NAME_PATTERN)))]
    pub groups: Vec<String>,
    /// How many of the snapshots or backups this job made are kept per
    /// volume (count-based retention); snapshot-delete keeps this many of
    /// all the volume's snapshots it may delete.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 250))]
    pub retain: i32,
    /// How long what this job made is kept (age-based retention), as a
    /// duration such as `168h`; the newest one is always kept.
    #[serde(default)]
    #[schemars(length(max = 64), regex(pattern = DURATION_PATTERN))]
    pub retain_age: String,
    /// Whether `retain` (count-based) or `retainAge` (age-based) decides
    /// what is kept.
    #[serde(default)]
    pub retention_policy: RetentionPolicy,
    /// How many volumes the job works on at once, across the cluster.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1000))]
    pub concurrency: i32,
    /// Labels put on every snapshot and backup the job makes.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The BackupTarget backups go to; empty: the default one.
    #[serde(default)]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub backup_target_name: String,
}

fn one() -> i32 {
    1
}

/// A recurring job's task, named as Longhorn names them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RecurringTask {
    /// Takes a snapshot, unless nothing was written since this job's last.
    Snapshot,
    /// Takes a snapshot whether or not anything was written.
    SnapshotForceCreate,
    /// Deletes the snapshots of the volume nobody made or holds any more:
    /// those left by a backup whose Backup is gone.
    SnapshotCleanup,
    /// Deletes the oldest of the volume's snapshots past `retain`, of any
    /// maker, except those a clone, a backup or a CSI VolumeSnapshot holds.
    SnapshotDelete,
    /// Backs the volume up, unless nothing was written since this job's
    /// last backup.
    Backup,
    /// Backs the volume up whether or not anything was written.
    BackupForceCreate,
    /// Trims the volume's mounted filesystem, so the blocks it freed are
    /// freed in the replicas too.
    FilesystemTrim,
}

impl RecurringTask {
    /// The task makes snapshots or backups, which its retention counts.
    pub fn makes(self) -> Option<Made> {
        match self {
            Self::Snapshot | Self::SnapshotForceCreate => Some(Made::Snapshot),
            Self::Backup | Self::BackupForceCreate => Some(Made::Backup),
            _ => None,
        }
    }

    /// The task skips a volume nothing was written to since its last run.
    pub fn skips_unchanged(self) -> bool {
        matches!(self, Self::Snapshot | Self::Backup)
    }
}

/// What a task makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Made {
    Snapshot,
    Backup,
}

/// Which of `retain` and `retainAge` decides what a job keeps.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RetentionPolicy {
    #[default]
    CountBased,
    AgeBased,
}

/// Observed state, written only by the job's owner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecurringJobStatus {
    /// The manager (node id) starting the job's runs.
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    /// Runs started since the job was made.
    #[serde(default)]
    pub execution_count: i64,
    /// The run going on, or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<JobRun>,
    /// When the next run is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_at: Option<Time>,
    /// The volumes whose turn it is in the run going on: their owners run
    /// the task on them. Never more than spec.concurrency.
    #[serde(default)]
    pub running: Vec<String>,
    /// `Valid`: whether the cron schedule parses.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One run of a job: the volumes that were members when it was due, and
/// how each fared.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobRun {
    /// The time the schedule named for this run; volumes' records name
    /// their run by it.
    pub scheduled_at: Time,
    pub started_at: Time,
    /// When the last of its volumes finished; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Volumes in the run.
    #[serde(default)]
    pub volumes: i32,
    #[serde(default)]
    pub succeeded: i32,
    #[serde(default)]
    pub failed: i32,
    /// Volumes the task had nothing to do on (nothing written since its
    /// last run; for a trim, no mounted filesystem).
    #[serde(default)]
    pub skipped: i32,
}

impl JobRun {
    /// A run due at `scheduled_at`, started at `started_at`, with no
    /// volume counted yet.
    pub fn new(scheduled_at: Time, started_at: Time) -> Self {
        Self {
            scheduled_at,
            started_at,
            finished_at: None,
            volumes: 0,
            succeeded: 0,
            failed: 0,
            skipped: 0,
        }
    }
}

/// What a volume's owner records of one job on the volume, in the volume's
/// status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeJob {
    /// The RecurringJob.
    pub name: String,
    /// The run this record is about: its scheduledAt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<Time>,
    #[serde(default)]
    pub state: VolumeJobState,
    /// The snapshot or backup the run made (its name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub made: String,
    /// Why the run failed or skipped the volume.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_at: Option<Time>,
    /// Why the last failed run failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_failure: String,
    /// The volume's data as the last successful run found it, before it
    /// made its snapshot or backup: a run finding the same skips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_mark: Option<DataMark>,
    /// The volume's data as the run going on found it; its data mark once
    /// it succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_mark: Option<DataMark>,
}

/// Where a volume's writes were: its engine's generation and, while the
/// engine runs, the revision counter of its replicas. Nothing is written
/// to a volume without an engine, and each engine start takes a new
/// generation, so an equal mark means nothing was written in between.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataMark {
    pub generation: i64,
    /// The highest revision of the engine's read-write replicas; absent
    /// while the volume has no running engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// Where a volume is in a job's run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum VolumeJobState {
    /// Not yet run.
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
}

impl VolumeJobState {
    pub fn finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Skipped)
    }
}
