//! Snapshot: a point-in-time copy of a volume's data, kept in each of its
//! replicas as a read-only layer of the same name. The CSI controller creates
//! one per CSI snapshot; the volume's owner takes and removes the data-plane
//! snapshot and reports here whether it is ready.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// Label on a Snapshot made only to clone a volume: the clone it is for.
/// The clone deletes it once filled (or when deleted first).
pub const CLONE_FOR: &str = "oxhorn.io/clone-for";

/// The Snapshot of `source` a clone named `clone` is filled from, labelled
/// for the clone (which deletes it once filled).
pub fn clone_source(clone: &str, source: &str) -> Snapshot {
    let mut snapshot = Snapshot::new(
        &format!("{clone}-clone-source"),
        SnapshotSpec {
            volume: source.to_owned(),
        },
    );
    snapshot
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(CLONE_FOR.to_owned(), clone.to_owned());
    snapshot
}

/// Why `volume` cannot be deleted, if its `snapshots` (any, of any
/// volume) say so: they live in its replicas, and a clone may be filling
/// from one. Snapshots being deleted, and those taken for a backup, do
/// not count. For CSI's DeleteVolume and the REST API alike.
pub fn deletion_blocker<'a>(
    volume: &str,
    snapshots: impl IntoIterator<Item = &'a Snapshot>,
) -> Option<String> {
    use kube::ResourceExt;
    let mut kept: Vec<&Snapshot> = snapshots
        .into_iter()
        .filter(|s| s.spec.volume == volume && s.metadata.deletion_timestamp.is_none())
        .filter(|s| !s.labels().contains_key(BACKUP_FOR))
        .collect();
    kept.sort_by_key(|s| s.name_any());
    if let Some(target) = kept.iter().find_map(|s| s.labels().get(CLONE_FOR)) {
        return Some(format!(
            "volume {volume} is being cloned into volume {target}; retry once the clone is \
             filled or deleted"
        ));
    }
    let names: Vec<String> = kept.iter().map(|s| s.name_any()).collect();
    (!names.is_empty()).then(|| {
        format!(
            "volume {volume} has snapshots, which live in its replicas: delete {} first",
            names.join(", ")
        )
    })
}

/// Label on a Snapshot a CSI CreateSnapshot made: a VolumeSnapshot holds
/// it, so only its deletion through Kubernetes deletes it.
pub const CSI_SNAPSHOT: &str = "oxhorn.io/csi-snapshot";

/// Label on a Snapshot taken for a Backup: the Backup. It is no CSI
/// snapshot and does not keep its volume from being deleted; once a newer
/// backup of the volume completes it goes, as the next backup builds on
/// the newer one's.
pub const BACKUP_FOR: &str = "oxhorn.io/backup-for";

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "Snapshot",
    namespaced,
    status = "SnapshotStatus",
    shortname = "oxsnap",
    category = "oxhorn",
    doc = "A point-in-time copy of a volume, held by every replica of the volume.",
    printcolumn(
        name = "Volume",
        type_ = "string",
        json_path = ".spec.volume",
        description = "the volume the snapshot is of"
    ),
    printcolumn(
        name = "Ready",
        type_ = "boolean",
        json_path = ".status.readyToUse",
        description = "taken on the replicas, usable as a data source"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".status.size",
        description = "the volume's size when the snapshot was taken"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// Which volume to snapshot. The object's name is the data-plane snapshot's name.
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    /// The volume to snapshot; it cannot change.
    #[schemars(length(min = 1))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("the volume of a snapshot cannot change"))]
    pub volume: String,
}

/// Observed state, written only by the manager owning the volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The manager (node id) acting on the snapshot: the volume's owner.
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    /// The snapshot exists on the volume's replicas.
    #[serde(default)]
    pub ready_to_use: bool,
    /// When the data-plane snapshot was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<Time>,
    /// The volume's size in bytes when the snapshot was taken.
    #[serde(default)]
    pub size: i64,
    /// Why the snapshot could not be taken or removed, if it could not.
    #[serde(default)]
    pub error: String,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
