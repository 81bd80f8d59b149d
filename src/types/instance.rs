//! The spec and status shared by Engine and Replica: both are processes that the
//! instance manager of one node starts, watches and stops.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// Where and as what an instance should run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    /// The Volume this instance serves.
    #[schemars(length(min = 1))]
    pub volume_name: String,
    /// The volume's size in bytes.
    #[schemars(range(min = 4096))]
    pub volume_size: i64,
    /// The node whose instance manager runs the process; empty until scheduled.
    #[serde(default, rename = "nodeID")]
    pub node_id: String,
    #[serde(default)]
    pub desire_state: DesireState,
    /// The oxhorn build the process runs; empty means the manager's own.
    #[serde(default)]
    pub image: String,
}

/// Whether the process should run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DesireState {
    #[default]
    Stopped,
    Running,
}

/// What the instance manager last saw of the process.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    /// The manager (node id) acting on this instance.
    #[serde(default, rename = "ownerID")]
    pub owner_id: String,
    #[serde(default)]
    pub current_state: InstanceState,
    /// Address the process serves on.
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    #[schemars(range(min = 0, max = 65535))]
    pub port: i32,
    /// Whether the process has ever run since it was last asked to.
    #[serde(default)]
    pub started: bool,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The process's observed state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    #[default]
    Stopped,
    Starting,
    Running,
    Stopping,
    Error,
    Unknown,
}
