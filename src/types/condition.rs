//! Conditions in the Kubernetes convention, shared by every resource's status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a condition holds; `Unknown` when it could not be determined.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    #[default]
    Unknown,
}

/// One observation of an aspect of an object's state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// CamelCase kind of the condition, e.g. `Scheduled` or `Ready`.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    pub status: ConditionStatus,
    /// CamelCase machine-readable reason for the last transition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable detail of the last transition.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// The metadata.generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    /// Whether the condition of `type_` in `conditions` is True.
    pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
        Self::status_of(conditions, type_) == ConditionStatus::True
    }

    /// The status of the condition of `type_`, Unknown when absent.
    pub fn status_of(conditions: &[Condition], type_: &str) -> ConditionStatus {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map_or(ConditionStatus::Unknown, |c| c.status)
    }

    /// Sets the condition of `type_`, keeping its lastTransitionTime unless
    /// the status flips. Returns whether the status flipped, which is when a
    /// user wants an Event.
    pub fn set(
        conditions: &mut Vec<Condition>,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
    ) -> bool {
        let message = message.into();
        let now = || Some(Time(jiff::Timestamp::now()));
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(existing) => {
                let flipped = existing.status != status;
                if flipped {
                    existing.last_transition_time = now();
                }
                existing.status = status;
                existing.reason = reason.to_owned();
                existing.message = message;
                flipped
            }
            None => {
                conditions.push(Condition {
                    type_: type_.to_owned(),
                    status,
                    reason: reason.to_owned(),
                    message,
                    last_transition_time: now(),
                    observed_generation: None,
                });
                true
            }
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}
