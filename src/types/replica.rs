//! Replica: one copy of a volume's data, in a directory on one node's disk.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::{InstanceSpec, InstanceStatus};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "Replica",
    namespaced,
    status = "ReplicaStatus",
    shortname = "oxr",
    category = "oxhorn",
    doc = "One copy of a volume's data, served by a process on the node whose disk holds it.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.currentState",
        description = "process state"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.nodeID",
        description = "node holding the data"
    ),
    printcolumn(name = "Disk", type_ = "string", json_path = ".spec.diskID"),
    printcolumn(name = "Volume", type_ = "string", json_path = ".spec.volumeName"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// Where the replica's data lives and which engine it serves.
#[serde(rename_all = "camelCase")]
pub struct ReplicaSpec {
    #[serde(flatten)]
    pub instance: InstanceSpec,
    /// The Engine this replica serves.
    #[serde(default)]
    pub engine_name: String,
    /// The scheduled disk, by its filesystem id; empty until scheduled.
    #[serde(default, rename = "diskID")]
    pub disk_id: String,
    /// Mount path of the scheduled disk.
    #[serde(default)]
    pub disk_path: String,
    /// The replica's directory under the disk path.
    #[serde(default)]
    #[schemars(regex(pattern = r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub data_directory_name: String,
    /// When the replica last became healthy (RW in its engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_at: Option<Time>,
    /// When the replica last failed; unset while it is healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<Time>,
    /// How many times in a row the replica rejoined after failing without
    /// staying healthy for long in between; each such rejoin waits twice as
    /// long as the one before.
    #[serde(default)]
    pub rejoins: u32,
}

pub type ReplicaStatus = InstanceStatus;
