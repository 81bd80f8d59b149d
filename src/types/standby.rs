//! Standby (disaster-recovery) volumes: a Volume with `standby: true` and
//! `fromBackup` follows the backups of the volume that Backup is of, in
//! its BackupTarget: it restores the newest, then each newer one as it
//! appears, writing only the blocks that differ. Its data is always that
//! of one completed backup, whole (status.standby.lastRestoredBackup),
//! except while a restore recorded in status.standby.applying is under
//! way; no one can read it meanwhile: it refuses attachment, snapshots
//! and backups. Setting `standby: false` activates it: it catches up to
//! the newest backup after a fresh sync, then becomes a normal volume.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Volume;

/// What a standby volume holds and follows, written by its owner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandbyStatus {
    /// The BackupTarget whose backups are followed.
    #[serde(default)]
    pub backup_target: String,
    /// The volume whose backups are followed, as the store names it.
    #[serde(default)]
    pub source_volume: String,
    /// The backup the volume holds, whole; empty before the first restore.
    #[serde(default)]
    pub last_restored_backup: String,
    /// When that backup was completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restored_backup_at: Option<MicroTime>,
    /// When its restore completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restored_at: Option<MicroTime>,
    /// The replicas holding it: each was written by its restore.
    #[serde(default)]
    pub replicas: Vec<String>,
    /// The engine generation of the last restore begun: each (and each
    /// taken over by another manager) takes a new one, recorded before its
    /// first write, which fences the writes of any earlier one (a manager
    /// that lost the volume and goes on) out of the replicas. The volume's
    /// first engine starts above it.
    #[serde(default)]
    pub generation: u64,
    /// The revision the last restore gave the replicas holding its backup:
    /// each sets one above it, so that a salvage, which goes by revisions,
    /// never takes a replica left out of a later restore for current.
    #[serde(default)]
    pub revision: u64,
    /// The restore under way, recorded before its first write: until it
    /// completes, it is done again whole (or the next one compares every
    /// block), and the volume is not activated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applying: Option<StandbyRestore>,
    /// The newest completed backup known.
    #[serde(default)]
    pub newest_backup: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest_backup_at: Option<MicroTime>,
    /// Completed backups newer than the one held.
    #[serde(default)]
    pub backups_behind: i64,
    /// Seconds between the completion of the backup held and that of the
    /// newest.
    #[serde(default)]
    pub lag_seconds: i64,
    /// What the last restore did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<StandbyStep>,
    /// The activation, once spec.standby is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<Activation>,
}

/// A restore of one backup over what the replicas hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandbyRestore {
    /// The backup restored.
    pub backup: String,
    /// The backup the holding replicas held when it began; the blocks
    /// that differ between the two are written. Empty: none, each
    /// replica's blocks are compared with the backup's.
    #[serde(default)]
    pub base: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<MicroTime>,
    /// The manager that began it, as status.standby.generation: another
    /// that takes it over begins it again as a new generation.
    #[serde(default)]
    pub by: String,
}

/// How a restore found the blocks to write.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StandbyMethod {
    /// From the two backups' block lists in the store.
    #[default]
    Diff,
    /// By reading the replicas' blocks and comparing their checksums with
    /// the backup's: when the base backup is gone from the store, a
    /// restore was cut short by another, or a replica is new.
    Compare,
}

/// What one restore did.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandbyStep {
    pub backup: String,
    /// The backup it went from, if it went from one.
    #[serde(default)]
    pub base: String,
    #[serde(default)]
    pub method: StandbyMethod,
    /// Blocks of the backup written, and blocks made zeros, on any replica.
    #[serde(default)]
    pub blocks_written: i64,
    #[serde(default)]
    pub blocks_zeroed: i64,
    /// Bytes of block data written to each replica written.
    #[serde(default)]
    pub bytes_restored: i64,
    #[serde(default)]
    pub duration_millis: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<MicroTime>,
}

/// Turning a standby into a normal volume.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Activation {
    /// When the owner saw spec.standby turned off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<MicroTime>,
    /// The sync of the BackupVolume asked for then: the activation catches
    /// up to the newest backup that sync found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_requested_at: Option<MicroTime>,
    /// When the volume became a normal one, holding `backup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated_at: Option<MicroTime>,
    #[serde(default)]
    pub backup: String,
    /// From requestedAt to activatedAt: the recovery time.
    #[serde(default)]
    pub duration_millis: i64,
    /// From the completion of `backup` to requestedAt: at most this much
    /// of the source's writes is not in the volume.
    #[serde(default)]
    pub data_lag_millis: i64,
}

impl Volume {
    /// Whether the volume is a standby, or one being activated: it holds
    /// a backup's data and nothing may read or change it yet. CSI and the
    /// API refuse to attach it, snapshot it or back it up.
    pub fn is_standby(&self) -> bool {
        if self.spec.standby {
            return true;
        }
        let standby = self.status.as_ref().and_then(|s| s.standby.as_ref());
        standby.is_some_and(|s| {
            s.activation
                .as_ref()
                .is_none_or(|a| a.activated_at.is_none())
        })
    }

    /// Whether the volume still needs Backup `name` to be filled: deleting
    /// it would leave the volume without its data. A standby needs its
    /// fromBackup only until it has recorded which volume's backups it
    /// follows.
    pub fn needs_backup(&self, name: &str) -> bool {
        let following = self
            .status
            .as_ref()
            .and_then(|s| s.standby.as_ref())
            .is_some_and(|s| !s.source_volume.is_empty());
        self.spec.source_backup() == Some(name) && !self.is_filled() && !following
    }

    /// Why the volume may not be attached, snapshotted or backed up, if
    /// it is a standby.
    pub fn standby_refusal(&self, what: &str) -> Option<String> {
        let name = kube::ResourceExt::name_any(self);
        if self.spec.standby {
            return Some(format!(
                "volume {name} is a standby volume (it follows the backups of another): it cannot {what} until it is activated (set standby: false)"
            ));
        }
        self.is_standby().then(|| {
            format!("volume {name} is being activated: it can {what} once activation completes")
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::types::{FILLED, VolumeStatus};

    fn volume(standby: bool, status: Option<StandbyStatus>) -> Volume {
        let spec = json!({"size": 4096, "fromBackup": "b1", "standby": standby});
        let mut volume = Volume::new("v", serde_json::from_value(spec).unwrap());
        volume.status = Some(VolumeStatus {
            standby: status,
            ..VolumeStatus::default()
        });
        volume
    }

    #[test]
    fn a_standby_stays_one_until_its_activation_completes() {
        assert!(volume(true, None).is_standby());
        assert!(!volume(false, None).is_standby(), "a plain restore");
        let following = StandbyStatus {
            source_volume: "src".into(),
            ..StandbyStatus::default()
        };
        assert!(volume(false, Some(following.clone())).is_standby());
        let activating = StandbyStatus {
            activation: Some(Activation::default()),
            ..following.clone()
        };
        assert!(volume(false, Some(activating)).is_standby());
        let activated = StandbyStatus {
            activation: Some(Activation {
                activated_at: Some(MicroTime(jiff::Timestamp::now())),
                ..Activation::default()
            }),
            ..following
        };
        let done = volume(false, Some(activated));
        assert!(!done.is_standby());
        assert_eq!(done.standby_refusal("attach"), None);
        let refusal = volume(true, None).standby_refusal("attach").unwrap();
        assert!(refusal.contains("standby: false"), "{refusal}");
    }

    #[test]
    fn a_standby_needs_its_backup_only_until_it_knows_what_it_follows() {
        assert!(volume(true, None).needs_backup("b1"));
        assert!(!volume(true, None).needs_backup("b2"));
        let following = StandbyStatus {
            source_volume: "src".into(),
            ..StandbyStatus::default()
        };
        assert!(!volume(true, Some(following)).needs_backup("b1"));
        let mut filled = volume(false, None);
        let status = filled.status.as_mut().unwrap();
        crate::types::Condition::set(
            &mut status.conditions,
            FILLED,
            crate::types::ConditionStatus::True,
            "Filled",
            "",
        );
        assert!(!filled.needs_backup("b1"));
    }
}
