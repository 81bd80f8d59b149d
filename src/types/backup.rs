//! Backups (seed 002, second design): a BackupTarget names an object store;
//! its owner syncs, in the background, what the store holds into a
//! BackupVolume per volume and a Backup per backup, so that nothing a user
//! or the CSI services ask ever waits on the store. A Backup a user (or
//! CSI) creates is uploaded by the manager owning its volume; deleting a
//! Backup deletes it from the store.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// The BackupTarget a Backup goes to when it names none.
pub const DEFAULT_BACKUP_TARGET: &str = "default";

/// A Go duration, as `kubectl` users write them: `300s`, `5m`, `1h30m`, `0s`.
const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";
const NAME_PATTERN: &str = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$";

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "BackupTarget",
    namespaced,
    status = "BackupTargetStatus",
    shortname = "oxbt",
    category = "oxhorn",
    doc = "An object store holding backups, synced into BackupVolumes and Backups.",
    printcolumn(
        name = "URL",
        type_ = "string",
        json_path = ".spec.backupTargetURL",
        description = "where the backups are"
    ),
    printcolumn(
        name = "Available",
        type_ = "boolean",
        json_path = ".status.available",
        description = "the store answered the last sync"
    ),
    printcolumn(
        name = "Last Synced",
        type_ = "date",
        json_path = ".status.lastSyncedAt"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BackupTargetSpec {
    /// `s3://bucket@region/path`, `azblob://container@account/path`,
    /// `file:///path` or `nfs://server:/export/path`.
    #[serde(rename = "backupTargetURL")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.matches('^(s3://[^/@]+@[^/]+(/.*)?|azblob://[^/@]+@[^/]+(/.*)?|file:///.*|nfs://[^/:]+:/.*)$')").message("backupTargetURL must look like s3://bucket@region/path, azblob://container@account/path, file:///path or nfs://server:/export"))]
    pub backup_target_url: String,
    /// A Secret in oxhorn's namespace with the store's credentials: for S3
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optionally
    /// `AWS_ENDPOINTS` and `AWS_CERT`; for Azure `AZBLOB_ACCOUNT_KEY` or
    /// `AZBLOB_SAS`, optionally `AZBLOB_ENDPOINT`. Empty for none.
    #[serde(default)]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub credential_secret: String,
    /// How often the target is synced, as a duration (`300s`, `5m`); `0s`:
    /// only when asked through syncRequestedAt.
    #[serde(default = "default_poll_interval")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub poll_interval: String,
    /// A sync is due while this is newer than status.lastSyncedAt: the poll
    /// timer sets it, and so may a user to sync now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_requested_at: Option<MicroTime>,
}

fn default_poll_interval() -> String {
    "300s".into()
}

/// Observed state, written only by the target's owner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupTargetStatus {
    /// The manager (node id) syncing the target.
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    /// The store answered the last sync.
    #[serde(default)]
    pub available: bool,
    /// When the last sync completed, successful or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_synced_at: Option<MicroTime>,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "BackupVolume",
    namespaced,
    status = "BackupVolumeStatus",
    shortname = "oxbv",
    category = "oxhorn",
    doc = "A volume with backups in a BackupTarget, as last synced.",
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.backupTargetName"
    ),
    printcolumn(name = "Volume", type_ = "string", json_path = ".spec.volumeName"),
    printcolumn(
        name = "Last Backup",
        type_ = "string",
        json_path = ".status.lastBackupName"
    ),
    printcolumn(
        name = "Last Backup At",
        type_ = "date",
        json_path = ".status.lastBackupAt"
    ),
    printcolumn(
        name = "Last Synced",
        type_ = "date",
        json_path = ".status.lastSyncedAt"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BackupVolumeSpec {
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the target of a backup volume cannot change"))]
    pub backup_target_name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the volume of a backup volume cannot change"))]
    pub volume_name: String,
    /// A sync of this volume's backups is due while this is newer than
    /// status.lastSyncedAt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_requested_at: Option<MicroTime>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupVolumeStatus {
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    /// The volume's size in bytes at its last backup.
    #[serde(default)]
    pub size: i64,
    #[serde(default)]
    pub last_backup_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup_at: Option<Time>,
    /// The volume's labels as the store recorded them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The data engine the backups were taken from.
    #[serde(default)]
    pub data_engine: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_synced_at: Option<MicroTime>,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "Backup",
    namespaced,
    status = "BackupStatus",
    shortname = "oxbk",
    category = "oxhorn",
    doc = "A backup of a volume's snapshot in a BackupTarget.",
    printcolumn(name = "Volume", type_ = "string", json_path = ".spec.volumeName"),
    printcolumn(
        name = "Snapshot",
        type_ = "string",
        json_path = ".status.snapshotName"
    ),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Progress", type_ = "integer", json_path = ".status.progress"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.size"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// What to back up. The object's name is the backup's name in the store.
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// The volume backed up; it cannot change.
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the volume of a backup cannot change"))]
    pub volume_name: String,
    /// The snapshot (a Snapshot of the volume) to back up; empty: one is
    /// taken for the backup. It cannot change.
    #[serde(default)]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the snapshot of a backup cannot change"))]
    pub snapshot_name: String,
    /// The BackupTarget to store it in; it cannot change.
    #[serde(default = "default_target")]
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the target of a backup cannot change"))]
    pub backup_target_name: String,
    /// Labels recorded with the backup in the store.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn default_target() -> String {
    DEFAULT_BACKUP_TARGET.into()
}

/// Where a backup is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackupState {
    /// Not started: waiting for its target, volume or snapshot.
    #[default]
    Pending,
    InProgress,
    /// In the store: restorable.
    Completed,
    /// Failed; status.error says why. Retried while the Backup exists.
    Error,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    #[serde(default)]
    pub state: BackupState,
    /// Percent of the blocks to read that are done.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub progress: i32,
    /// The snapshot backed up.
    #[serde(default)]
    pub snapshot_name: String,
    /// The volume's size in bytes when the snapshot was taken.
    #[serde(default)]
    pub size: i64,
    /// Where the backup is: the target's URL and the backup's path in it.
    #[serde(default)]
    pub url: String,
    /// Blocks the backup holds, and of those, the ones this upload sent;
    /// the others were in the store already.
    #[serde(default)]
    pub blocks: i64,
    #[serde(default)]
    pub blocks_uploaded: i64,
    /// When the backup was completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_created_at: Option<Time>,
    /// Why the backup failed, if it did.
    #[serde(default)]
    pub error: String,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
