//! The oxhorn.io API: custom resource types and their CRDs.
//!
//! `spec` is desired state (users, the CSI controller); `status` is observed
//! state, written only by the owning manager through the status subresource.

// kube's `printcolumn(...)` repeats the same keys once per column.
#![allow(clippy::duplicated_attributes)]

mod backup;
mod condition;
mod engine;
mod instance;
mod lease;
mod node;
mod recurring_job;
mod replica;
mod revert;
mod setting;
mod snapshot;
mod standby;
mod system_backup;
mod volume;

pub use backup::{
    Backup, BackupSpec, BackupState, BackupStatus, BackupTarget, BackupTargetSpec,
    BackupTargetStatus, BackupVolume, BackupVolumeSpec, BackupVolumeStatus, DEFAULT_BACKUP_TARGET,
};
pub use condition::{Condition, ConditionStatus};
pub use engine::{
    Engine, EngineSpec, EngineStatus, ReadRepair, RebuildStatus, ReplicaMode, ScrubReport,
    SnapshotInfo, engine_name,
};
pub use instance::{DesireState, InstanceSpec, InstanceState, InstanceStatus};
pub use lease::{MANAGER_LEASE_LABEL, MANAGER_LEASE_SELECTOR, lease_name};
pub use node::{
    DUPLICATE_FILESYSTEM, DiskSpec, DiskStatus, FrontendSupport, Node, NodeSpec, NodeStatus,
    same_path,
};
pub use recurring_job::{
    DEFAULT_GROUP, DataMark, ENABLED, GROUP_LABEL_PREFIX, JOB_LABEL_PREFIX, JobRun, MADE_BY, Made,
    RecurringJob, RecurringJobSpec, RecurringJobStatus, RecurringTask, RetentionPolicy,
    SOURCE_LABEL, SOURCE_SELECTOR, VolumeJob, VolumeJobState,
};
pub use replica::{Replica, ReplicaSpec, ReplicaStatus};
pub use revert::{RevertPhase, RevertRequest, RevertStatus};
pub use setting::{Setting, SettingSpec, SettingStatus};
pub use snapshot::{
    BACKUP_FOR, CLONE_FOR, CSI_SNAPSHOT, Snapshot, SnapshotSpec, SnapshotStatus, clone_source,
    deletion_blocker,
};
pub use standby::{Activation, StandbyMethod, StandbyRestore, StandbyStatus, StandbyStep};
pub use system_backup::{
    ObjectCounts, RESTORED_BY, RestoreOutcome, RestoredObject, SYSTEM_BACKUP_FROM_STORE,
    SYSTEM_BACKUP_LABEL, SystemBackup, SystemBackupSpec, SystemBackupState, SystemBackupStatus,
    SystemRestore, SystemRestoreSpec, SystemRestoreState, SystemRestoreStatus, VolumeBackupPolicy,
};
pub use volume::{
    AccessMode, DELETION_HELD, DataLocality, DataSource, FILLED, Frontend, PUBLISHED_READONLY,
    PVC_NAME, PVC_NAMESPACE, ReplicaAutoBalance, Robustness, VOLUME_NAME_MAX, Volume,
    VolumeFrontend, VolumeSpec, VolumeState, VolumeStatus,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every oxhorn resource.
pub const GROUP: &str = "oxhorn.io";

/// Finalizer oxhorn puts on its objects so their data and processes are
/// cleaned up before they go.
pub const FINALIZER: &str = "oxhorn.io/cleanup";

/// A Kubernetes Node's zone and region labels: where oxhorn reads a node's
/// topology, and the CSI topology keys it reports.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";

/// Where oxhorn's objects live unless told otherwise.
pub const DEFAULT_NAMESPACE: &str = "oxhorn-system";

/// Every CRD oxhorn serves, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Volume::crd(),
        Engine::crd(),
        Replica::crd(),
        Node::crd(),
        Setting::crd(),
        Snapshot::crd(),
        BackupTarget::crd(),
        BackupVolume::crd(),
        Backup::crd(),
        RecurringJob::crd(),
        SystemBackup::crd(),
        SystemRestore::crd(),
    ]
}

/// The CRDs as one multi-document YAML stream: what `oxhorn crds` prints and
/// deploy/crds.yaml holds.
pub fn crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}
