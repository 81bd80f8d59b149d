//! What a system backup holds, and the pure rules around it: what is kept
//! of each object, which versions can be restored, and in which order the
//! objects are made again.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::types::{
    BackupTarget, ObjectCounts, RecurringJob, RestoreOutcome, RestoredObject, Setting, Volume,
};

/// The format of `objects.json` this Oxhorn writes, and the newest it
/// reads.
pub const FORMAT_VERSION: i32 = 1;
/// The Oxhorn version recorded with each system backup.
pub const OXHORN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The annotation the scheduler puts on a claim waiting for its first
/// consumer: a node of the old cluster means nothing in the new one.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Oxhorn's objects, as a system backup stores them: metadata without
/// what the API server assigns, no status. Secrets are never among them:
/// a BackupTarget names its credential Secret only.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemObjects {
    #[serde(default)]
    pub settings: Vec<Setting>,
    #[serde(default)]
    pub backup_targets: Vec<BackupTarget>,
    #[serde(default)]
    pub recurring_jobs: Vec<RecurringJob>,
    #[serde(default)]
    pub storage_classes: Vec<StorageClass>,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    #[serde(default)]
    pub persistent_volumes: Vec<PersistentVolume>,
    #[serde(default)]
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// The Backup each volume is restored from: `volume: backup`.
    #[serde(default)]
    pub volume_backups: BTreeMap<String, String>,
}

impl SystemObjects {
    pub fn counts(&self) -> ObjectCounts {
        let n = |len: usize| i32::try_from(len).unwrap_or(i32::MAX);
        ObjectCounts {
            settings: n(self.settings.len()),
            backup_targets: n(self.backup_targets.len()),
            recurring_jobs: n(self.recurring_jobs.len()),
            storage_classes: n(self.storage_classes.len()),
            volumes: n(self.volumes.len()),
            persistent_volumes: n(self.persistent_volumes.len()),
            persistent_volume_claims: n(self.persistent_volume_claims.len()),
        }
    }
}

/// What of an object's metadata a system backup keeps: its name,
/// namespace, labels and annotations; not what the API server or the
/// controllers of the old cluster assigned (uid, versions, owners,
/// finalizers, times).
pub fn strip_meta(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        annotations: meta.annotations.clone().map(|mut a| {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
            a
        }),
        ..ObjectMeta::default()
    }
}

/// A volume as a system backup keeps it: its spec as made, detached, and
/// filled from nothing: its restore fills it from its backup.
pub fn strip_volume(volume: &Volume) -> Volume {
    let mut kept = Volume::new(
        &volume.metadata.name.clone().unwrap_or_default(),
        volume.spec.clone(),
    );
    kept.metadata = strip_meta(&volume.metadata);
    let spec = &mut kept.spec;
    spec.node_id.clear();
    // A standby's data is another volume's backups: it is made again
    // following them. Any other volume is made from its own backup.
    if !volume.is_standby() {
        spec.standby = false;
        spec.from_backup.clear();
    }
    spec.data_source = None;
    spec.revert = None;
    spec.salvage_request.clear();
    kept
}

/// A PersistentVolume as kept: bound to its claim by name only (the
/// claim's uid is the old cluster's).
pub fn strip_pv(pv: &PersistentVolume) -> PersistentVolume {
    let mut spec = pv.spec.clone();
    if let Some(claim) = spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        claim.uid = None;
        claim.resource_version = None;
    }
    PersistentVolume {
        metadata: strip_meta(&pv.metadata),
        spec,
        status: None,
    }
}

/// A claim as kept: naming its volume, without the old cluster's node.
pub fn strip_pvc(pvc: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let mut metadata = strip_meta(&pvc.metadata);
    if let Some(annotations) = metadata.annotations.as_mut() {
        annotations.remove(SELECTED_NODE);
    }
    PersistentVolumeClaim {
        metadata,
        spec: pvc.spec.clone(),
        status: None,
    }
}

/// Strips metadata and status of one of Oxhorn's own kinds.
pub fn strip<K: kube::Resource + Clone>(object: &K, clear_status: impl FnOnce(&mut K)) -> K {
    let mut kept = object.clone();
    *kept.meta_mut() = strip_meta(object.meta());
    clear_status(&mut kept);
    kept
}

/// Why a system backup of `format` taken by Oxhorn `taken_by` cannot be
/// restored by Oxhorn `running`, if it cannot.
pub fn refusal(format: i32, taken_by: &str, running: &str) -> Option<String> {
    if !(1..=FORMAT_VERSION).contains(&format) {
        return Some(format!(
            "the system backup's format {format} is unknown to Oxhorn {running}, which reads formats 1 to {FORMAT_VERSION}"
        ));
    }
    let (Some(taken), Some(here)) = (version(taken_by), version(running)) else {
        return Some(format!(
            "the system backup was taken by Oxhorn {taken_by:?}, a version Oxhorn {running} cannot compare with its own"
        ));
    };
    (taken > here).then(|| {
        format!(
            "the system backup was taken by Oxhorn {taken_by}, newer than this Oxhorn {running}: restore it with Oxhorn {taken_by} or later"
        )
    })
}

/// `major.minor.patch` of a version, any pre-release or build suffix
/// ignored.
fn version(text: &str) -> Option<(u64, u64, u64)> {
    let core = text.trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// One object of a restore, in the order objects are made again.
#[derive(Clone, Debug)]
pub enum Item {
    Setting(Setting),
    BackupTarget(BackupTarget),
    RecurringJob(RecurringJob),
    StorageClass(StorageClass),
    /// A volume and the Backup it is restored from, if the system backup
    /// has one.
    Volume(Box<Volume>, Option<String>),
    PersistentVolume(Box<PersistentVolume>),
    PersistentVolumeClaim(Box<PersistentVolumeClaim>),
}

impl Item {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Setting(_) => "Setting",
            Self::BackupTarget(_) => "BackupTarget",
            Self::RecurringJob(_) => "RecurringJob",
            Self::StorageClass(_) => "StorageClass",
            Self::Volume(..) => "Volume",
            Self::PersistentVolume(_) => "PersistentVolume",
            Self::PersistentVolumeClaim(_) => "PersistentVolumeClaim",
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Setting(o) => &o.metadata,
            Self::BackupTarget(o) => &o.metadata,
            Self::RecurringJob(o) => &o.metadata,
            Self::StorageClass(o) => &o.metadata,
            Self::Volume(o, _) => &o.metadata,
            Self::PersistentVolume(o) => &o.metadata,
            Self::PersistentVolumeClaim(o) => &o.metadata,
        }
    }
}

/// Why `item` is not to be made, when what it names failed to be:
/// a PersistentVolume whose Volume, or a claim whose PersistentVolume,
/// was not restored (a claim bound to nothing is worse than none).
pub fn unmet(item: &Item, done: &[RestoredObject]) -> Option<String> {
    let failed = |kind: &str, name: &str| {
        done.iter()
            .any(|o| o.kind == kind && o.name == name && o.outcome == RestoreOutcome::Failed)
    };
    match item {
        Item::PersistentVolume(pv) => {
            let csi = pv.spec.as_ref()?.csi.as_ref()?;
            failed("Volume", &csi.volume_handle)
                .then(|| format!("its Volume {} was not restored", csi.volume_handle))
        }
        Item::PersistentVolumeClaim(pvc) => {
            let pv = pvc.spec.as_ref()?.volume_name.as_deref()?;
            failed("PersistentVolume", pv)
                .then(|| format!("its PersistentVolume {pv} was not restored"))
        }
        _ => None,
    }
}

/// The objects in the order they are made again: what the others use
/// first (settings, where backups are, schedules, classes), then the
/// volumes, then the PersistentVolumes naming them and the claims naming
/// those, so that each claim binds to its volume.
pub fn restore_order(objects: SystemObjects) -> Vec<Item> {
    let backups = objects.volume_backups;
    let volumes = objects.volumes.into_iter().map(|v| {
        let backup = backups
            .get(&v.metadata.name.clone().unwrap_or_default())
            .cloned();
        Item::Volume(Box::new(v), backup)
    });
    objects
        .settings
        .into_iter()
        .map(Item::Setting)
        .chain(objects.backup_targets.into_iter().map(Item::BackupTarget))
        .chain(objects.recurring_jobs.into_iter().map(Item::RecurringJob))
        .chain(objects.storage_classes.into_iter().map(Item::StorageClass))
        .chain(volumes)
        .chain(
            objects
                .persistent_volumes
                .into_iter()
                .map(|pv| Item::PersistentVolume(Box::new(pv))),
        )
        .chain(
            objects
                .persistent_volume_claims
                .into_iter()
                .map(|pvc| Item::PersistentVolumeClaim(Box::new(pvc))),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    use crate::types::{SettingSpec, VolumeSpec};

    fn full_meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("oxhorn-system".into()),
            uid: Some("1234".into()),
            resource_version: Some("99".into()),
            generation: Some(3),
            creation_timestamp: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            finalizers: Some(vec!["oxhorn.io/cleanup".into()]),
            labels: Some([("app".to_owned(), "db".to_owned())].into()),
            annotations: Some(
                [
                    ("note".to_owned(), "kept".to_owned()),
                    (SELECTED_NODE.to_owned(), "node-1".to_owned()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn what_the_api_server_assigned_is_not_kept() {
        let kept = strip_meta(&full_meta("v1"));
        assert_eq!(kept.name.as_deref(), Some("v1"));
        assert_eq!(kept.namespace.as_deref(), Some("oxhorn-system"));
        assert_eq!(kept.labels, full_meta("v1").labels);
        assert!(kept.uid.is_none() && kept.resource_version.is_none());
        assert!(kept.managed_fields.is_none() && kept.finalizers.is_none());
        assert!(kept.creation_timestamp.is_none() && kept.generation.is_none());
    }

    fn volume(name: &str) -> Volume {
        let mut volume = Volume::new(
            name,
            serde_json::from_value::<VolumeSpec>(serde_json::json!({"size": 4096})).unwrap(),
        );
        volume.metadata = full_meta(name);
        volume.spec.node_id = "node-1".into();
        volume.spec.from_backup = "older".into();
        volume.status = Some(Default::default());
        volume
    }

    #[test]
    fn a_volume_is_kept_detached_without_status_or_source() {
        let kept = strip_volume(&volume("v1"));
        assert!(kept.spec.node_id.is_empty());
        assert!(kept.spec.from_backup.is_empty());
        assert!(kept.status.is_none());
        assert_eq!(kept.spec.size, 4096);
    }

    #[test]
    fn a_standby_is_kept_following_the_backups_it_follows() {
        let mut standby = volume("dr");
        standby.spec.standby = true;
        let kept = strip_volume(&standby);
        assert!(kept.spec.standby);
        assert_eq!(kept.spec.from_backup, "older");
        assert!(kept.spec.node_id.is_empty());
    }

    #[test]
    fn a_claim_forgets_its_node_and_a_pv_its_claims_uid() {
        let pvc = PersistentVolumeClaim {
            metadata: full_meta("data"),
            status: Some(Default::default()),
            ..Default::default()
        };
        let kept = strip_pvc(&pvc);
        let annotations = kept.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(SELECTED_NODE));
        assert_eq!(annotations["note"], "kept");
        assert!(kept.status.is_none());
        let pv = PersistentVolume {
            metadata: full_meta("pvc-1"),
            spec: Some(PersistentVolumeSpec {
                claim_ref: Some(ObjectReference {
                    name: Some("data".into()),
                    namespace: Some("default".into()),
                    uid: Some("old".into()),
                    resource_version: Some("7".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        let kept = strip_pv(&pv);
        let claim = kept.spec.unwrap().claim_ref.unwrap();
        assert_eq!(claim.name.as_deref(), Some("data"));
        assert!(claim.uid.is_none() && claim.resource_version.is_none());
        assert!(kept.status.is_none());
    }

    #[test]
    fn objects_are_restored_before_what_uses_them() {
        let objects = SystemObjects {
            persistent_volume_claims: vec![PersistentVolumeClaim::default()],
            persistent_volumes: vec![PersistentVolume::default()],
            volumes: vec![volume("v1"), volume("v2")],
            storage_classes: vec![StorageClass::default()],
            settings: vec![Setting::new("s", SettingSpec { value: "1".into() })],
            volume_backups: [("v1".to_owned(), "b1".to_owned())].into(),
            ..SystemObjects::default()
        };
        let order: Vec<&str> = restore_order(objects.clone())
            .iter()
            .map(Item::kind)
            .collect();
        assert_eq!(
            order,
            [
                "Setting",
                "StorageClass",
                "Volume",
                "Volume",
                "PersistentVolume",
                "PersistentVolumeClaim"
            ]
        );
        let backups: Vec<Option<String>> = restore_order(objects)
            .into_iter()
            .filter_map(|i| match i {
                Item::Volume(_, backup) => Some(backup),
                _ => None,
            })
            .collect();
        assert_eq!(backups, [Some("b1".to_owned()), None]);
    }

    #[test]
    fn what_names_an_object_not_restored_is_not_made() {
        let failed = |kind: &str, name: &str| RestoredObject {
            kind: kind.into(),
            namespace: String::new(),
            name: name.into(),
            outcome: RestoreOutcome::Failed,
            message: String::new(),
        };
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"csi": {"driver": "driver.oxhorn.io", "volumeHandle": "v1"}},
        }))
        .unwrap();
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data"},
            "spec": {"volumeName": "pv-1"},
        }))
        .unwrap();
        let (pv, pvc) = (
            Item::PersistentVolume(Box::new(pv)),
            Item::PersistentVolumeClaim(Box::new(pvc)),
        );
        assert_eq!(unmet(&pv, &[]), None);
        let mut done = vec![failed("Volume", "v2")];
        assert_eq!(unmet(&pv, &done), None);
        done.push(failed("Volume", "v1"));
        assert_eq!(
            unmet(&pv, &done).as_deref(),
            Some("its Volume v1 was not restored")
        );
        assert_eq!(unmet(&pvc, &done), None);
        done.push(failed("PersistentVolume", "pv-1"));
        assert!(unmet(&pvc, &done).is_some());
    }

    #[test]
    fn a_backup_from_a_newer_oxhorn_or_an_unknown_format_is_refused() {
        assert_eq!(refusal(1, "0.1.0", "0.1.0"), None);
        assert_eq!(refusal(1, "0.1.0", "0.2.0"), None, "older is fine");
        assert_eq!(refusal(1, "0.1.0-rc1", "0.1.0"), None);
        let newer = refusal(1, "0.3.0", "0.2.9").unwrap();
        assert!(
            newer.contains("0.3.0") && newer.contains("0.2.9"),
            "both versions: {newer}"
        );
        assert!(refusal(1, "1.0.0", "0.99.99").is_some());
        let format = refusal(FORMAT_VERSION + 1, "0.1.0", "0.1.0").unwrap();
        assert!(format.contains("unknown"), "{format}");
        assert!(refusal(0, "0.1.0", "0.1.0").is_some());
        assert!(refusal(1, "garbage", "0.1.0").is_some());
        assert!(refusal(1, "0.1", "0.1.0").is_some());
    }
}
