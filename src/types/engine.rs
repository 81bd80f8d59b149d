//! Engine: the process on the attached node that replicates a volume's I/O to
//! its replicas and exposes it through a frontend.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Frontend, InstanceSpec, InstanceStatus};

/// The name of `volume`'s one engine.
pub fn engine_name(volume: &str) -> String {
    format!("{volume}-e")
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "Engine",
    namespaced,
    status = "EngineStatus",
    shortname = "oxe",
    category = "oxhorn",
    doc = "The process that replicates a volume's I/O to its replicas and exposes it as a block device.",
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
        description = "node the engine runs on"
    ),
    printcolumn(name = "Volume", type_ = "string", json_path = ".spec.volumeName"),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".status.endpoint",
        description = "block device or target"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// Where the engine runs, which replicas it uses and how it exposes the volume.
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    #[serde(flatten)]
    pub instance: InstanceSpec,
    /// Replica name to the address (host:port) the engine should use.
    #[serde(default)]
    pub replica_address_map: BTreeMap<String, String>,
    #[serde(default)]
    pub frontend: Frontend,
    /// The Secret with the CHAP credentials the iSCSI target asks for: the
    /// Volume's chapSecret when the engine last started.
    #[serde(default)]
    pub chap_secret: String,
    /// Raised by the volume controller each time it starts the volume's
    /// engine; replicas refuse engines of an older generation, so one left
    /// running on an unreachable node cannot write once a newer one started.
    #[serde(default)]
    pub generation: u64,
    /// Serve from the replicas in replicaAddressMap even if the newest I/O
    /// path they recorded names replicas that cannot be reached (a user's
    /// salvage, see the Volume's salvageRequest). Set for one start.
    #[serde(default)]
    pub salvage: bool,
    /// The Volume's salvageRequest the last salvage start answered: the
    /// request is not acted on again, whatever the Volume's status says yet.
    #[serde(default)]
    pub salvage_request: String,
}

/// What the engine's node last saw of the engine and its replicas.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    #[serde(flatten)]
    pub instance: InstanceStatus,
    /// Replica name to the address the running engine actually uses.
    #[serde(default)]
    pub current_replica_address_map: BTreeMap<String, String>,
    /// Replica name to its mode in the I/O path.
    #[serde(default)]
    pub replica_mode_map: BTreeMap<String, ReplicaMode>,
    /// Where the volume is exposed: a device path or a target address.
    #[serde(default)]
    pub endpoint: String,
    /// The size the running engine serves, in bytes.
    #[serde(default)]
    pub current_size: i64,
    /// Replica address to the progress of its rebuild.
    #[serde(default)]
    pub rebuild_status: BTreeMap<String, RebuildStatus>,
    /// MiB/s each rebuild the engine starts may average (0: no limit): the
    /// replica-rebuild-bandwidth-limit Setting, once the engine has it.
    #[serde(default)]
    pub rebuild_bandwidth_limit: i64,
    /// Snapshot name to what the engine reports of it.
    #[serde(default)]
    pub snapshots: BTreeMap<String, SnapshotInfo>,
    /// The running engine's scrub, running or last done (none yet: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<ScrubReport>,
    /// What read repair did since the engine started.
    #[serde(default)]
    pub read_repair: ReadRepair,
}

/// A scrub of the volume's replicas: every block of every layer checked
/// against its checksum, rotten ones rewritten from another replica's copy,
/// and what the volume reads compared across replicas (docs/integrity.md).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScrubReport {
    #[serde(default)]
    pub running: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Time>,
    /// Bytes of the replicas' layers checked, all replicas together.
    #[serde(default)]
    pub checked_bytes: i64,
    /// Bytes that failed their checksums.
    #[serde(default)]
    pub rotten_bytes: i64,
    /// Of those, rewritten from another replica's good copy.
    #[serde(default)]
    pub repaired_bytes: i64,
    /// Of those, with no good copy on any other replica.
    #[serde(default)]
    pub unrepaired_bytes: i64,
    /// 1 MiB chunks that did not read the same on every replica.
    #[serde(default)]
    pub mismatched_chunks: i64,
    /// Of those, settled by giving the odd replica the majority's data.
    #[serde(default)]
    pub resolved_chunks: i64,
    /// Why it stopped early, if it did.
    #[serde(default)]
    pub error: String,
}

/// Bytes read repair handled since the engine started: found failing their
/// checksums, rewritten from another replica's copy, and with no good copy
/// anywhere (those reads failed).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadRepair {
    #[serde(default)]
    pub checksum_failed_bytes: i64,
    #[serde(default)]
    pub repaired_bytes: i64,
    #[serde(default)]
    pub unrecoverable_bytes: i64,
}

/// A replica's place in the engine's I/O path.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ReplicaMode {
    /// Serves reads and writes.
    #[serde(rename = "RW")]
    ReadWrite,
    /// Receives writes while it is being rebuilt.
    #[serde(rename = "WO")]
    WriteOnly,
    /// Failed and out of the I/O path.
    #[serde(rename = "ERR")]
    Error,
}

/// How far a replica's rebuild has come.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebuildStatus {
    #[serde(default)]
    pub is_rebuilding: bool,
    /// Percent done.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub progress: i32,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub error: String,
    /// The healthy replica the data is copied from.
    #[serde(default)]
    pub from_replica_address: String,
}

/// A point-in-time layer of the volume's data.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    pub name: String,
    #[serde(default)]
    pub parent: String,
    #[serde(default)]
    pub children: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Time>,
    /// Taken at a user's request rather than by the system (e.g. for a rebuild).
    #[serde(default)]
    pub user_created: bool,
    /// Marked for removal; its data is merged into its child.
    #[serde(default)]
    pub removed: bool,
    /// Bytes the snapshot's own layer holds.
    #[serde(default)]
    pub size: i64,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}
