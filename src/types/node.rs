//! Node: oxhorn's view of a Kubernetes node: its disks and whether replicas
//! may be scheduled there. Named after the Kubernetes node it describes.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, Frontend, Replica};

/// The Ready reason of a disk on a filesystem another disk of its node
/// already uses: its filesystem id is the other disk's.
pub const DUPLICATE_FILESYSTEM: &str = "DuplicateFilesystem";

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
        name = "Evicting",
        type_ = "boolean",
        json_path = ".spec.evictionRequested"
    ),
    printcolumn(
        name = "ToEvict",
        type_ = "integer",
        json_path = ".status.replicasToEvict"
    ),
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
    /// Move every replica off this node: each gets a replacement elsewhere
    /// and goes once that one is healthy; nothing new is placed here.
    #[serde(default)]
    pub eviction_requested: bool,
}

fn yes() -> bool {
    true
}

impl Node {
    /// Whether `replica`'s data is on this node's disk `disk`: by its path,
    /// or by the disk's filesystem id (the scheduler's diskID), unless the
    /// disk only repeats another's filesystem (then that id is the other
    /// disk's).
    pub fn holds(&self, replica: &Replica, disk: &str) -> bool {
        let Some(spec) = self.spec.disks.get(disk) else {
            return false;
        };
        let fsid = self
            .status
            .as_ref()
            .and_then(|s| s.disk_status.get(disk))
            .filter(|s| {
                !s.conditions
                    .iter()
                    .any(|c| c.reason == DUPLICATE_FILESYSTEM)
            })
            .map_or("", |s| s.fsid.as_str());
        replica.spec.instance.node_id == self.metadata.name.as_deref().unwrap_or_default()
            && ((!fsid.is_empty() && replica.spec.disk_id == fsid)
                || (!replica.spec.disk_path.is_empty()
                    && same_path(&replica.spec.disk_path, &spec.path)))
    }

    /// Whether `replica` is to move off this node: the node, or the disk
    /// holding it, is evicting.
    pub fn evicts(&self, replica: &Replica) -> bool {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        replica.spec.instance.node_id == name
            && (self.spec.eviction_requested
                || self
                    .spec
                    .disks
                    .iter()
                    .any(|(disk, spec)| spec.eviction_requested && self.holds(replica, disk)))
    }

    /// Whether the node, or any of its disks, is evicting.
    pub fn evicting(&self) -> bool {
        self.spec.eviction_requested || self.spec.disks.values().any(|d| d.eviction_requested)
    }
}

/// Whether two paths name one directory, trailing slashes aside.
pub fn same_path(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
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
    /// Move every replica off this disk: each gets a replacement elsewhere
    /// and goes once that one is healthy; nothing new is placed here.
    #[serde(default)]
    pub eviction_requested: bool,
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
    /// Replicas still to move off this node: every replica on it while it
    /// is evicting, else those on its evicting disks.
    #[serde(default)]
    pub replicas_to_evict: i64,
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
    /// Replicas whose data is on this disk (those being deleted not counted).
    #[serde(default)]
    pub scheduled_replicas: i64,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::ConditionStatus;

    fn replica(node: &str, disk_id: &str, disk_path: &str) -> Replica {
        serde_json::from_value(json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Replica",
            "metadata": {"name": "r"},
            "spec": {"volumeName": "v", "volumeSize": 4096, "nodeID": node,
                     "diskID": disk_id, "diskPath": disk_path},
        }))
        .expect("a replica")
    }

    /// Node n1 with disk "ssd" at /mnt/ssd on filesystem 803 and disk
    /// "hdd" at /mnt/hdd on 804.
    fn node() -> Node {
        serde_json::from_value(json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Node",
            "metadata": {"name": "n1"},
            "spec": {"disks": {
                "ssd": {"path": "/mnt/ssd", "allowScheduling": false},
                "hdd": {"path": "/mnt/hdd"},
            }},
            "status": {"diskStatus": {"ssd": {"fsid": "803"}, "hdd": {"fsid": "804"}}},
        }))
        .expect("a node")
    }

    #[test]
    fn a_replica_is_on_a_disk_by_fsid_or_path_on_that_node() {
        let mut node = node();
        assert!(node.holds(&replica("n1", "803", "/x"), "ssd"));
        assert!(node.holds(&replica("n1", "", "/mnt/ssd/"), "ssd"));
        assert!(!node.holds(&replica("n2", "803", "/mnt/ssd"), "ssd"));
        assert!(!node.holds(&replica("n1", "804", "/mnt/hdd"), "ssd"));
        assert!(
            !node.holds(&replica("n1", "803", "/x"), "nvme"),
            "no such disk"
        );
        // Not yet scheduled: on no disk.
        assert!(!node.holds(&replica("n1", "", ""), "ssd"));
        // A disk repeating another's filesystem has its id, not its replicas.
        let status = node.status.as_mut().expect("status");
        let ssd = status.disk_status.get_mut("ssd").expect("ssd");
        Condition::set(
            &mut ssd.conditions,
            "Ready",
            ConditionStatus::False,
            DUPLICATE_FILESYSTEM,
            "",
        );
        assert!(!node.holds(&replica("n1", "803", "/x"), "ssd"));
    }

    #[test]
    fn a_replica_is_evicted_by_its_node_or_its_disk() {
        let mut node = node();
        let on_ssd = replica("n1", "803", "/mnt/ssd");
        let on_hdd = replica("n1", "804", "/mnt/hdd");
        assert!(!node.evicting());
        assert!(!node.evicts(&on_ssd));
        node.spec
            .disks
            .get_mut("ssd")
            .expect("ssd")
            .eviction_requested = true;
        assert!(node.evicting());
        assert!(node.evicts(&on_ssd));
        assert!(!node.evicts(&on_hdd), "only the evicting disk's replicas");
        node.spec.eviction_requested = true;
        assert!(node.evicts(&on_hdd));
        assert!(
            !node.evicts(&replica("n2", "804", "/mnt/hdd")),
            "another node's replica"
        );
    }
}
