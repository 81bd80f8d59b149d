//! Volume: the user-facing resource. Its spec is desired state written by users
//! and the CSI controller; its status is written only by the owning manager.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// A replicated block volume.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "Volume",
    namespaced,
    status = "VolumeStatus",
    shortname = "oxv",
    category = "oxhorn",
    doc = "A replicated block volume: its data lives in numberOfReplicas replicas on different nodes.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "attachment state"
    ),
    printcolumn(
        name = "Robustness",
        type_ = "string",
        json_path = ".status.robustness",
        description = "healthy, degraded or faulted"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.numberOfReplicas",
        description = "desired number of replicas"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".spec.size",
        description = "size in bytes"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.currentNodeID",
        description = "node the volume is attached to"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// The volume's desired size, replication, placement and attachment.
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// Size in bytes: a whole number of 4096-byte blocks. It can grow, never shrink.
    #[schemars(range(min = 4096))]
    #[x_kube(
        validation = Rule::new("self % 4096 == 0").message("size must be a whole number of 4096-byte blocks"),
        validation = Rule::new("self >= oldSelf").message("size cannot shrink")
    )]
    pub size: i64,
    /// How many replicas, each on a different node, hold the volume's data.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 20))]
    pub number_of_replicas: i32,
    /// How the volume is exposed as a block device on the node it is attached to.
    #[serde(default)]
    pub frontend: Frontend,
    /// The node to attach the volume to; empty means detached.
    #[serde(default, rename = "nodeID")]
    pub node_id: String,
    #[serde(default)]
    pub data_locality: DataLocality,
    /// Minutes a failed replica is kept for reuse before it is replaced.
    #[serde(default = "default_stale_replica_timeout")]
    #[schemars(range(min = 1))]
    pub stale_replica_timeout: i64,
    /// Backup URL to restore the volume from; empty for a new, zeroed volume.
    #[serde(default)]
    pub from_backup: String,
    /// Only disks carrying all these tags may hold the volume's replicas.
    #[serde(default)]
    pub disk_selector: Vec<String>,
    /// Only nodes carrying all these tags may hold the volume's replicas.
    #[serde(default)]
    pub node_selector: Vec<String>,
    #[serde(default)]
    pub replica_auto_balance: ReplicaAutoBalance,
    #[serde(default)]
    pub access_mode: AccessMode,
    /// What fills a new volume before first use: `snapshot/<Snapshot name>`
    /// (a restore or, for a clone, a snapshot of the source volume); empty
    /// for a zeroed volume. It cannot change.
    #[serde(default)]
    #[schemars(regex(pattern = r"^$|^snapshot/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the data source of a volume cannot change"))]
    pub data_source: String,
}

fn default_replicas() -> i32 {
    3
}

fn default_stale_replica_timeout() -> i64 {
    2880
}

/// How a volume is presented on its node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Frontend {
    /// A file in a FUSE mount behind a loop device.
    #[default]
    Fuse,
    /// An iSCSI target that the node's initiator logs into.
    Iscsi,
}

/// Whether a replica should be kept on the node the volume is attached to.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DataLocality {
    #[default]
    Disabled,
    BestEffort,
    StrictLocal,
}

/// Whether replicas are moved to spread them evenly over nodes and zones.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaAutoBalance {
    /// Follow the cluster-wide setting.
    #[default]
    Ignored,
    Disabled,
    LeastEffort,
    BestEffort,
}

/// Who may use the volume at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccessMode {
    /// Read-write by the pods of one node.
    #[default]
    Rwo,
    /// Read-write by a single pod.
    Rwop,
}

/// Observed state, written only by the owning manager.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// The manager (node id) acting on this volume.
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    #[serde(default)]
    pub state: VolumeState,
    #[serde(default)]
    pub robustness: Robustness,
    /// The node the engine currently runs on.
    #[serde(default, rename = "currentNodeID")]
    pub current_node_id: String,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Bytes actually allocated by the volume's data, counting snapshots.
    #[serde(default)]
    pub actual_size: i64,
    /// Name of the newest completed backup.
    #[serde(default)]
    pub last_backup: String,
}

/// Where the volume is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VolumeState {
    #[default]
    Creating,
    Attaching,
    Attached,
    Detaching,
    Detached,
    Deleting,
}

/// How well the volume's data is protected.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Robustness {
    #[default]
    Unknown,
    /// Every replica is healthy.
    Healthy,
    /// Some replicas failed; the volume still serves I/O.
    Degraded,
    /// No healthy replica is left.
    Faulted,
}
