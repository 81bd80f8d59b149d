//! Volume: the user-facing resource. Its spec is desired state written by users
//! and the CSI controller; its status is written only by the owning manager.

use std::fmt;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, Node, RevertRequest, RevertStatus, StandbyStatus};

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
#[x_kube(validation = Rule::new("!has(self.chapSecret) || self.chapSecret == '' || !has(self.frontend) || self.frontend != 'fuse'").message("chapSecret authenticates iSCSI logins; frontend fuse has none"))]
#[x_kube(validation = Rule::new("!has(self.fromBackup) || self.fromBackup == '' || !has(self.dataSource) || self.dataSource == ''").message("a volume is filled from a backup or from a data source, not both"))]
#[x_kube(validation = Rule::new("!has(self.standby) || !self.standby || (has(self.fromBackup) && self.fromBackup != '')").message("a standby volume follows the backups of the volume its fromBackup is of: set fromBackup"))]
#[x_kube(validation = Rule::new("!has(self.standby) || !self.standby || !has(self.nodeID) || self.nodeID == ''").message("a standby volume cannot be attached: activate it first (standby: false)"))]
#[x_kube(validation = Rule::new("!has(self.standby) || !self.standby || (has(oldSelf.standby) && oldSelf.standby)").message("standby can only go from true to false (activation): a volume cannot become a standby"))]
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
    /// How the volume is exposed as a block device on the node it is
    /// attached to: `auto` (iSCSI where the node has an initiator, FUSE
    /// elsewhere), `fuse` or `iscsi`.
    #[serde(default)]
    pub frontend: VolumeFrontend,
    /// The Secret in oxhorn's namespace holding the CHAP credentials iSCSI
    /// logins to the volume must prove (`node.session.auth.username` and
    /// `.password`, and for mutual CHAP `.username_in` and `.password_in`,
    /// as a `kubernetes.io/iscsi-chap` Secret); empty for none. Read each
    /// time the engine starts.
    #[serde(default)]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub chap_secret: String,
    /// The node to attach the volume to; empty means detached.
    #[serde(default, rename = "nodeID")]
    pub node_id: String,
    #[serde(default)]
    pub data_locality: DataLocality,
    /// Minutes a failed replica is kept for reuse before it is replaced.
    #[serde(default = "default_stale_replica_timeout")]
    #[schemars(range(min = 1))]
    pub stale_replica_timeout: i64,
    /// The Backup (its name, in oxhorn's namespace) to restore the volume
    /// from before its first use; empty for none. It cannot change.
    #[serde(default)]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^$|^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the backup a volume is restored from cannot change"))]
    pub from_backup: String,
    /// Set to a new value (the time, say) to bring the volume up from the
    /// replicas that can be reached now, even when replicas that hold newer
    /// acknowledged writes cannot be: those writes are lost. Without it such
    /// a volume waits for them. Acted on once per value, on the next attach;
    /// status.salvagedRequest then holds the value.
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub salvage_request: String,
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
    #[serde(default, with = "data_source_wire")]
    #[schemars(
        with = "String",
        regex(pattern = r"^$|^snapshot/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the data source of a volume cannot change"))]
    pub data_source: Option<DataSource>,
    /// Reverts the volume, while detached, to one of its snapshots (see
    /// status.revert); absent for none. It does not attach until done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<RevertRequest>,
    /// A disaster-recovery volume: it follows the backups of the volume
    /// fromBackup is of, restoring each new one (see status.standby), and
    /// cannot be attached, snapshotted or backed up. Set to false to
    /// activate it; it cannot be set again.
    #[serde(default)]
    pub standby: bool,
}

impl VolumeSpec {
    /// The name of the Snapshot the volume fills from, if it has a data source.
    pub fn source_snapshot(&self) -> Option<&str> {
        match &self.data_source {
            Some(DataSource::Snapshot(name)) => Some(name),
            None => None,
        }
    }

    /// The Backup the volume is restored from, if any.
    pub fn source_backup(&self) -> Option<&str> {
        Some(self.from_backup.as_str()).filter(|b| !b.is_empty())
    }

    /// Whether anything fills the volume before its first use.
    pub fn has_source(&self) -> bool {
        self.data_source.is_some() || self.source_backup().is_some()
    }
}

impl Volume {
    /// Whether the volume holds its data source's data, as last written.
    pub fn is_filled(&self) -> bool {
        !self.spec.has_source()
            || self
                .status
                .as_ref()
                .is_some_and(|s| Condition::is_true(&s.conditions, FILLED))
    }

    /// Whether the volume is being deleted while still attached. Its
    /// deletion, and that of its engine and replicas (which a foreground
    /// cascade deletes first), then waits until it is detached: a workload
    /// still using it sees no I/O error, as Kubernetes keeps a claim in use.
    pub fn deletion_held(&self) -> bool {
        self.metadata.deletion_timestamp.is_some() && !self.spec.node_id.is_empty()
    }
}

/// Longest volume name: replica names, labels and clone snapshot names add
/// to it and must stay within 63 characters.
pub const VOLUME_NAME_MAX: usize = 48;

/// Annotations naming the claim a volume was provisioned for (from the
/// external-provisioner's --extra-create-metadata), for the operator's eye
/// and the metrics' `pvc` and `pvc_namespace` labels.
pub const PVC_NAME: &str = "oxhorn.io/pvc-name";
pub const PVC_NAMESPACE: &str = "oxhorn.io/pvc-namespace";

/// Annotation on a volume Kubernetes attached (ControllerPublishVolume):
/// whether it was published read-only, to refuse an incompatible second
/// publish. Gone once Kubernetes detaches it.
pub const PUBLISHED_READONLY: &str = "oxhorn.io/published-readonly";

/// The volume's condition saying whether it holds its data source's data.
pub const FILLED: &str = "Filled";

/// The condition of a volume, engine or replica being deleted whose deletion
/// waits until the volume is detached.
pub const DELETION_HELD: &str = "DeletionHeld";

/// What fills a new volume before first use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// The Snapshot of this name: a restore or, for a clone, a snapshot of
    /// the source volume taken for it.
    Snapshot(String),
}

impl fmt::Display for DataSource {
    /// The wire form, as the CRD's `dataSource` string holds it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSource::Snapshot(name) => write!(f, "{SNAPSHOT_PREFIX}{name}"),
        }
    }
}

const SNAPSHOT_PREFIX: &str = "snapshot/";

/// `dataSource` stays the string it always was (`snapshot/<name>`, empty for
/// none), so stored objects and the CRD schema do not change.
mod data_source_wire {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::{DataSource, SNAPSHOT_PREFIX};

    pub fn serialize<S: Serializer>(
        source: &Option<DataSource>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match source {
            Some(source) => serializer.collect_str(source),
            None => serializer.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<DataSource>, D::Error> {
        let wire = String::deserialize(deserializer)?;
        if wire.is_empty() {
            return Ok(None);
        }
        match wire.strip_prefix(SNAPSHOT_PREFIX) {
            Some(name) => Ok(Some(DataSource::Snapshot(name.to_owned()))),
            None => Err(D::Error::custom(format!(
                "data source {wire:?} is not {SNAPSHOT_PREFIX}<name>"
            ))),
        }
    }
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

/// The frontend a volume asks for.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VolumeFrontend {
    /// iSCSI on a node whose status says it can attach over iSCSI, FUSE on
    /// any other, decided each time the volume attaches.
    #[default]
    Auto,
    Fuse,
    Iscsi,
}

impl VolumeFrontend {
    /// The frontend the volume's engine serves on `node` (not reported yet:
    /// None): for `auto`, iSCSI only where the node reports it supported.
    pub fn on(self, node: Option<&Node>) -> Frontend {
        match self {
            VolumeFrontend::Fuse => Frontend::Fuse,
            VolumeFrontend::Iscsi => Frontend::Iscsi,
            VolumeFrontend::Auto => {
                let iscsi = node
                    .and_then(|n| n.status.as_ref())
                    .is_some_and(|s| s.supports(Frontend::Iscsi));
                if iscsi {
                    Frontend::Iscsi
                } else {
                    Frontend::Fuse
                }
            }
        }
    }
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
    /// The last spec.salvageRequest acted on.
    #[serde(default)]
    pub salvaged_request: String,
    /// The volume's last scrub, or the one running (see the
    /// scrub-interval Setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrub: Option<super::ScrubReport>,
    /// The answer to the last spec.revert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<RevertStatus>,
    /// The recurring jobs the volume is in, and how each last ran on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub recurring_jobs: Vec<super::VolumeJob>,
    /// What a standby volume holds and follows, and its activation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<StandbyStatus>,
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_data_source_keeps_its_wire_form() {
        for (wire, typed) in [
            ("", None),
            ("snapshot/s-1", Some(DataSource::Snapshot("s-1".to_owned()))),
        ] {
            let spec: VolumeSpec =
                serde_json::from_value(json!({"size": 4096, "dataSource": wire})).unwrap();
            assert_eq!(spec.data_source, typed);
            assert_eq!(serde_json::to_value(&spec).unwrap()["dataSource"], wire);
        }
        let absent: VolumeSpec = serde_json::from_value(json!({"size": 4096})).unwrap();
        assert_eq!(absent.data_source, None);
        let unknown =
            serde_json::from_value::<VolumeSpec>(json!({"size": 4096, "dataSource": "backup/b"}));
        assert!(unknown.is_err());
    }

    #[test]
    fn auto_is_iscsi_only_where_the_node_reports_an_initiator() {
        let node = |iscsi: Option<bool>| {
            let mut node = Node::new("n", serde_json::from_value(json!({})).unwrap());
            let frontends = iscsi.map_or(json!([]), |supported| {
                json!([{"frontend": "fuse", "supported": true},
                       {"frontend": "iscsi", "supported": supported, "reason": ""}])
            });
            node.status = Some(serde_json::from_value(json!({"frontends": frontends})).unwrap());
            node
        };
        let (with, without, silent) = (node(Some(true)), node(Some(false)), node(None));
        let auto = VolumeFrontend::Auto;
        assert_eq!(auto.on(Some(&with)), Frontend::Iscsi);
        assert_eq!(auto.on(Some(&without)), Frontend::Fuse);
        assert_eq!(auto.on(Some(&silent)), Frontend::Fuse);
        assert_eq!(auto.on(None), Frontend::Fuse);
        assert_eq!(VolumeFrontend::Fuse.on(Some(&with)), Frontend::Fuse);
        assert_eq!(VolumeFrontend::Iscsi.on(None), Frontend::Iscsi);
        let absent: VolumeSpec = serde_json::from_value(json!({"size": 4096})).unwrap();
        assert_eq!(absent.frontend, VolumeFrontend::Auto);
    }
}
