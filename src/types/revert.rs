//! Reverting a detached volume to one of its snapshots: the request a user
//! puts in the Volume's spec (`spec.revert`), and the owner's answer in its
//! status (`status.revert`). A revert is pending from the moment it is asked
//! until the owner answers it, and the volume attaches only once none is:
//! the owner performs it on every replica while no engine runs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Volume;

/// "Revert the volume to this snapshot", asked once per `request`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevertRequest {
    /// The Snapshot of this volume to go back to. Every write after it is
    /// discarded, and so are the snapshots taken after it.
    #[schemars(length(min = 1, max = 253))]
    pub snapshot: String,
    /// A new value (the time, say) for each revert asked for: a revert is
    /// acted on once per value; status.revert.request then holds it.
    #[schemars(length(min = 1, max = 253))]
    pub request: String,
}

/// Where a revert is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RevertPhase {
    /// Under way: the volume does not attach until it is done, whatever
    /// happens to the manager doing it.
    #[default]
    Reverting,
    /// Done on every replica in the volume's I/O path.
    Reverted,
    /// Refused before anything changed (the volume was attached, say): the
    /// message says why.
    Failed,
}

/// The owner's answer to the last revert asked.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevertStatus {
    /// The spec.revert.request answered.
    pub request: String,
    /// The snapshot reverted to.
    pub snapshot: String,
    pub phase: RevertPhase,
    /// What happened, or what the revert waits for.
    #[serde(default)]
    pub message: String,
    /// The engine generation the revert works as, above every engine before
    /// it, so that none of them can write to a replica again.
    #[serde(default)]
    pub generation: u64,
}

impl Volume {
    /// The revert the owner has taken on and not finished.
    pub fn revert_under_way(&self) -> Option<&RevertStatus> {
        let status = self.status.as_ref()?.revert.as_ref()?;
        (status.phase == RevertPhase::Reverting).then_some(status)
    }

    /// The revert asked for that the owner has not answered yet.
    pub fn revert_unanswered(&self) -> Option<&RevertRequest> {
        let asked = self.spec.revert.as_ref()?;
        let answered = self.status.as_ref().and_then(|s| s.revert.as_ref());
        answered
            .is_none_or(|a| a.request != asked.request)
            .then_some(asked)
    }

    /// Whether a revert keeps the volume from attaching: one asked and not
    /// answered, or one under way. CSI and the API refuse to attach it
    /// meanwhile; the owner, which decides, refuses a revert asked of a
    /// volume that is to attach, and finishes one under way first.
    pub fn revert_pending(&self) -> bool {
        self.revert_under_way().is_some() || self.revert_unanswered().is_some()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn volume(spec: Option<(&str, &str)>, status: Option<(&str, RevertPhase)>) -> Volume {
        let mut volume = Volume::new("v", serde_json::from_value(json!({"size": 4096})).unwrap());
        volume.spec.revert = spec.map(|(snapshot, request)| RevertRequest {
            snapshot: snapshot.into(),
            request: request.into(),
        });
        volume.status = Some(crate::types::VolumeStatus {
            revert: status.map(|(request, phase)| RevertStatus {
                request: request.into(),
                snapshot: "s".into(),
                phase,
                ..RevertStatus::default()
            }),
            ..Default::default()
        });
        volume
    }

    #[test]
    fn a_revert_is_pending_until_answered_and_while_under_way() {
        use RevertPhase::*;
        assert!(!volume(None, None).revert_pending());
        assert!(volume(Some(("s", "1")), None).revert_pending());
        assert!(volume(Some(("s", "1")), Some(("1", Reverting))).revert_pending());
        assert!(!volume(Some(("s", "1")), Some(("1", Reverted))).revert_pending());
        assert!(!volume(Some(("s", "1")), Some(("1", Failed))).revert_pending());
        // A new request after an answered one.
        assert!(volume(Some(("s", "2")), Some(("1", Reverted))).revert_pending());
        // One under way stays so even if the spec's request is dropped.
        assert!(volume(None, Some(("1", Reverting))).revert_pending());
        let absent: crate::types::VolumeSpec =
            serde_json::from_value(json!({"size": 4096})).unwrap();
        assert_eq!(absent.revert, None);
        assert!(
            serde_json::to_value(&absent)
                .unwrap()
                .get("revert")
                .is_none()
        );
    }
}
