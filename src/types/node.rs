//! Node: oxhorn's view of a Kubernetes node: its disks and whether replicas
//! may be scheduled there. Named after the Kubernetes node it describes.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, Frontend};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "Node",
    namespaced,
    status = "NodeStatus",
    shortname = "oxn",
    category = "oxhorn",
    doc = "A node's disks and scheduling switches, as oxhorn sees them.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "AllowScheduling",
        type_ = "boolean",
        json_path = ".spec.allowScheduling"
    ),
    printcolumn(
        name = "Schedulable",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Schedulable\")].status"
    ),
    printcolumn(name = "Zone", type_ = "string", json_path = ".status.zone"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// The node's disks and scheduling switches.
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Disk name to its configuration.
    #[serde(default)]
    pub disks: BTreeMap<String, DiskSpec>,
    /// Whether new replicas may be placed on this node.
    #[serde(default = "yes")]
    pub allow_scheduling: bool,
    /// Tags a volume's nodeSelector matches against.
    #[serde(default)]
    pub tags: Vec<String>,
}

fn yes() -> bool {
    true
}

/// A directory on a node's filesystem that holds replica data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSpec {
    /// Absolute path of the disk's mount point or directory.
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("disk path must be absolute"))]
    #[schemars(length(min = 1))]
    pub path: String,
    /// Whether new replicas may be placed on this disk.
    #[serde(default = "yes")]
    pub allow_scheduling: bool,
    /// Bytes kept free for other uses; replicas are never scheduled into them.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub storage_reserved: i64,
    /// Tags a volume's diskSelector matches against.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// What the node's manager measured of it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// The manager (node id) acting on this node object.
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Disk name to what was measured of it.
    #[serde(default)]
    pub disk_status: BTreeMap<String, DiskStatus>,
    /// From the Kubernetes node's topology.kubernetes.io/region label.
    #[serde(default)]
    pub region: String,
    /// From the Kubernetes node's topology.kubernetes.io/zone label.
    #[serde(default)]
    pub zone: String,
    /// The frontends this node can present volumes with, and why not.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["frontend"]))]
    pub frontends: Vec<FrontendSupport>,
}

impl NodeStatus {
    /// Whether the node last reported it can present volumes with `frontend`.
    pub fn supports(&self, frontend: Frontend) -> bool {
        self.frontends
            .iter()
            .any(|f| f.frontend == frontend && f.supported)
    }
}

/// Whether a node can present volumes with one frontend.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FrontendSupport {
    pub frontend: Frontend,
    pub supported: bool,
    /// What is missing, when not supported.
    #[serde(default)]
    pub reason: String,
}

/// What was measured of one disk.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    /// Free bytes on the filesystem.
    #[serde(default)]
    pub storage_available: i64,
    /// Size of the filesystem in bytes.
    #[serde(default)]
    pub storage_maximum: i64,
    /// Bytes promised to the replicas scheduled on this disk.
    #[serde(default)]
    pub storage_scheduled: i64,
    /// Filesystem id: two disks on one filesystem are one disk.
    #[serde(default)]
    pub fsid: String,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
