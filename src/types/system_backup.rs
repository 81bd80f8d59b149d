//! System backup and restore, as Longhorn's: a SystemBackup keeps Oxhorn's
//! own objects (volumes' specs, settings, recurring jobs, backup targets,
//! storage classes, and the PersistentVolumes and claims of Oxhorn's
//! volumes) in a backup target, with a backup of each volume by policy; a
//! SystemRestore, in a cluster pointed at that target, makes them again.
//! A target's sync shows the system backups it holds as SystemBackups.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, DEFAULT_BACKUP_TARGET};

const NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";

/// Label on a SystemBackup a target's sync made from what the store holds:
/// it is restorable, and nothing is backed up for it.
pub const SYSTEM_BACKUP_FROM_STORE: &str = "oxhorn.io/system-backup-from-store";
/// Label on each Backup a SystemBackup took: the SystemBackup.
pub const SYSTEM_BACKUP_LABEL: &str = "oxhorn.io/system-backup";
/// Label on each object a SystemRestore made: the SystemRestore. An object
/// carrying it was restored, not found, when the restore looks again.
pub const RESTORED_BY: &str = "oxhorn.io/restored-by";

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "SystemBackup",
    namespaced,
    status = "SystemBackupStatus",
    shortname = "oxsb",
    category = "oxhorn",
    doc = "A backup of Oxhorn's own objects, and of its volumes by policy, in a BackupTarget.",
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.backupTargetName"
    ),
    printcolumn(
        name = "Policy",
        type_ = "string",
        json_path = ".spec.volumeBackupPolicy"
    ),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "Created", type_ = "date", json_path = ".status.createdAt"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// What to back up and where. The object's name is the system backup's
/// name in the store.
#[serde(rename_all = "camelCase")]
pub struct SystemBackupSpec {
    /// The BackupTarget to store it in; it cannot change.
    #[serde(default = "default_target")]
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the target of a system backup cannot change"))]
    pub backup_target_name: String,
    /// Which volume backups the system backup takes: `if-not-present`
    /// backs up a volume that has no completed backup in the target,
    /// `always` backs up every volume, `disabled` backs up none (each
    /// volume then refers to its newest completed backup, if any).
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the volume backup policy of a system backup cannot change"))]
    pub volume_backup_policy: VolumeBackupPolicy,
}

fn default_target() -> String {
    DEFAULT_BACKUP_TARGET.into()
}

/// Which volume backups a system backup takes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeBackupPolicy {
    #[default]
    IfNotPresent,
    Always,
    Disabled,
}

/// Where a system backup is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SystemBackupState {
    #[default]
    Pending,
    /// Waiting for the volume backups it took.
    BackingUpVolumes,
    /// Writing the objects to the store.
    Uploading,
    /// In the store: restorable.
    Ready,
    /// Failed; status.message says why.
    Error,
}

/// Observed state, written only by the system backup's owner (or, for one
/// found in the store, by the sync that found it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemBackupStatus {
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    #[serde(default)]
    pub state: SystemBackupState,
    /// The Oxhorn version that took it.
    #[serde(default)]
    pub version: String,
    /// The format of what it holds in the store.
    #[serde(default)]
    pub format_version: i32,
    /// When it was completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    /// How many objects of each kind it holds.
    #[serde(default)]
    pub counts: ObjectCounts,
    /// The volume backup each volume is restored from: `volume: backup`.
    #[serde(default)]
    pub volume_backups: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// How many objects of each kind a system backup holds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectCounts {
    #[serde(default)]
    pub settings: i32,
    #[serde(default)]
    pub backup_targets: i32,
    #[serde(default)]
    pub recurring_jobs: i32,
    #[serde(default)]
    pub storage_classes: i32,
    #[serde(default)]
    pub volumes: i32,
    #[serde(default)]
    pub persistent_volumes: i32,
    #[serde(default)]
    pub persistent_volume_claims: i32,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "SystemRestore",
    namespaced,
    status = "SystemRestoreStatus",
    shortname = "oxsr",
    category = "oxhorn",
    doc = "Makes again the objects a SystemBackup holds; those that exist are left alone.",
    printcolumn(
        name = "System Backup",
        type_ = "string",
        json_path = ".spec.systemBackup"
    ),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SystemRestoreSpec {
    /// The SystemBackup (its name, in Oxhorn's namespace) to restore; it
    /// cannot change.
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the system backup a restore restores cannot change"))]
    pub system_backup: String,
}

/// Where a system restore is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SystemRestoreState {
    #[default]
    Pending,
    Restoring,
    /// Every object was looked at; `objects` says how each fared.
    Completed,
    /// Refused or failed; status.message says why.
    Error,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemRestoreStatus {
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    #[serde(default)]
    pub state: SystemRestoreState,
    /// Each object of the system backup, in the order they were restored,
    /// and how it fared.
    #[serde(default)]
    pub objects: Vec<RestoredObject>,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One object of a restore.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoredObject {
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    pub outcome: RestoreOutcome,
    /// Why it failed, or what to know of it (a missing credential Secret).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// How one object of a restore fared.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RestoreOutcome {
    Restored,
    /// It existed already and was left alone.
    Exists,
    Failed,
}
