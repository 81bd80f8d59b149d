//! Setting: one cluster-wide tunable, named by its key.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "oxhorn.io",
    version = "v1beta1",
    kind = "Setting",
    namespaced,
    status = "SettingStatus",
    shortname = "oxs",
    category = "oxhorn",
    doc = "A cluster-wide setting; the object's name is the setting's key.",
    printcolumn(name = "Value", type_ = "string", json_path = ".spec.value"),
    printcolumn(name = "Applied", type_ = "boolean", json_path = ".status.applied"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
/// The setting's value.
pub struct SettingSpec {
    /// The setting's value, parsed according to the setting's type.
    pub value: String,
}

/// Whether the value is in effect.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SettingStatus {
    /// Whether the value was accepted and is in effect.
    #[serde(default)]
    pub applied: bool,
    /// Why the value was not applied, when it was not.
    #[serde(default)]
    pub message: String,
}
