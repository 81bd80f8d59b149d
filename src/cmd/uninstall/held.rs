//! What the users hold on Oxhorn volumes: the claims and their pods, the
//! PVs, the attachments and the VolumeSnapshots. What a refusal lists, and
//! what goes first once confirmed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, ResourceExt};
use tracing::info;

use super::{UninstallError, list};
use crate::controller::delete;
use crate::csi::DRIVER_NAME;
use crate::datastore::settings::DELETING_CONFIRMATION;
use crate::datastore::unless_gone;
use crate::types::Volume;

const PROVISIONER_ANNOTATIONS: [&str; 2] = [
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
];

/// What uninstalling would delete of the users'.
pub(super) struct Held {
    pub(super) volumes: Vec<Volume>,
    /// Oxhorn's PVs.
    pvs: Vec<PersistentVolume>,
    /// The claims of Oxhorn volumes, each with whether it is bound to one.
    pub(super) claims: BTreeMap<ClaimKey, bool>,
    /// The VolumeSnapshotContents of Oxhorn snapshots.
    pub(super) snapshots: Vec<String>,
}

impl Held {
    pub(super) async fn read(client: &Client, namespace: &str) -> Result<Self, UninstallError> {
        let classes: Vec<StorageClass> = list(&Api::all(client.clone())).await?;
        let classes: BTreeSet<String> = classes
            .iter()
            .filter(|class| class.provisioner == DRIVER_NAME)
            .map(ResourceExt::name_any)
            .collect();
        let pvs = ours(list(&Api::all(client.clone())).await?);
        let claims = claims_of(&pvs, &list(&Api::all(client.clone())).await?, &classes);
        Ok(Self {
            volumes: list(&Api::namespaced(client.clone(), namespace)).await?,
            pvs,
            claims,
            snapshots: snapshot_contents(client).await?,
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.volumes.is_empty() && self.claims.is_empty() && self.snapshots.is_empty()
    }
}

impl Held {
    /// What a refused uninstall tells the user: the volumes it would
    /// delete, with the claim and node of each, the claims still waiting
    /// for one, the snapshots, and how to confirm.
    pub(super) fn refusal(&self, namespace: &str) -> String {
        let described: Vec<String> = self.volumes.iter().map(|v| self.describe(v)).collect();
        let waiting: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, bound)| !**bound)
            .map(|((namespace, name), _)| format!("{namespace}/{name}"))
            .collect();
        let mut what = Vec::new();
        for (items, one, many, separator) in [
            (
                &described,
                "Oxhorn volume would be deleted with its data",
                "Oxhorn volumes would be deleted with their data",
                "; ",
            ),
            (
                &waiting,
                "claim waiting for an Oxhorn volume would be deleted",
                "claims waiting for an Oxhorn volume would be deleted",
                ", ",
            ),
            (
                &self.snapshots,
                "Oxhorn snapshot would be deleted",
                "Oxhorn snapshots would be deleted",
                ", ",
            ),
        ] {
            if !items.is_empty() {
                let said = if items.len() == 1 { one } else { many };
                what.push(format!("{} {said}: {}", items.len(), items.join(separator)));
            }
        }
        format!(
            "{}. To confirm, run `kubectl -n {namespace} patch settings.oxhorn.io {DELETING_CONFIRMATION} \
             --type merge -p '{{\"spec\":{{\"value\":\"true\"}}}}'`, then run the uninstall Job again",
            what.join("; and ")
        )
    }

    /// A volume, with its claim and the node it is attached to.
    fn describe(&self, volume: &Volume) -> String {
        let name = volume.name_any();
        let claim = self
            .pvs
            .iter()
            .filter(|pv| pv_volume(pv) == Some(name.as_str()))
            .find_map(|pv| pv.spec.as_ref()?.claim_ref.clone())
            .map(|c| {
                format!(
                    "claim {}/{}",
                    c.namespace.unwrap_or_default(),
                    c.name.unwrap_or_default()
                )
            });
        let node = &volume.spec.node_id;
        let attached = (!node.is_empty()).then(|| format!("attached to node {node}"));
        let details: Vec<String> = claim.into_iter().chain(attached).collect();
        if details.is_empty() {
            name
        } else {
            format!("{name} ({})", details.join(", "))
        }
    }
}

/// Oxhorn's PVs.
pub(super) fn ours(pvs: Vec<PersistentVolume>) -> Vec<PersistentVolume> {
    pvs.into_iter()
        .filter(|pv| pv_volume(pv).is_some())
        .collect()
}

/// The Oxhorn volume behind `pv`, if it is one of ours.
fn pv_volume(pv: &PersistentVolume) -> Option<&str> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    (csi.driver == DRIVER_NAME).then_some(csi.volume_handle.as_str())
}

/// A claim, by namespace and name.
type ClaimKey = (String, String);

/// The claims of Oxhorn volumes, each with whether it is bound to one:
/// those bound to its PVs, and those of its StorageClasses (or provisioner)
/// bound to none yet. A PV's claim reference counts only with the claim's
/// uid: a Released PV keeps naming a claim since deleted, whose name
/// another claim, of another driver's, may have now.
fn claims_of(
    pvs: &[PersistentVolume],
    claims: &[PersistentVolumeClaim],
    classes: &BTreeSet<String>,
) -> BTreeMap<ClaimKey, bool> {
    let referenced = |claim: &PersistentVolumeClaim| {
        pvs.iter().any(|pv| {
            let reference = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
            reference.is_some_and(|r| {
                r.uid.is_some()
                    && r.uid == claim.metadata.uid
                    && r.name == claim.metadata.name
                    && r.namespace == claim.metadata.namespace
            })
        })
    };
    claims
        .iter()
        .filter_map(|claim| {
            let spec = claim.spec.as_ref();
            let volume = spec
                .and_then(|s| s.volume_name.as_deref())
                .unwrap_or_default();
            let bound = pvs.iter().any(|pv| pv.name_any() == volume) || referenced(claim);
            let class = spec.and_then(|s| s.storage_class_name.as_deref());
            let provisioner = PROVISIONER_ANNOTATIONS
                .iter()
                .any(|key| claim.annotations().get(*key).map(String::as_str) == Some(DRIVER_NAME));
            let waiting =
                volume.is_empty() && (provisioner || class.is_some_and(|c| classes.contains(c)));
            let key = (claim.namespace().unwrap_or_default(), claim.name_any());
            (bound || waiting).then_some((key, bound))
        })
        .collect()
}

/// Whether `pod` uses one of `claims`, directly or as a generic ephemeral
/// volume (whose claim is named `<pod>-<volume>`).
fn uses(pod: &Pod, claims: &BTreeMap<ClaimKey, bool>) -> bool {
    let namespace = pod.namespace().unwrap_or_default();
    let volumes = pod
        .spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten());
    volumes
        .filter_map(|volume| {
            if let Some(claim) = &volume.persistent_volume_claim {
                Some(claim.claim_name.clone())
            } else {
                volume
                    .ephemeral
                    .as_ref()
                    .map(|_| format!("{}-{}", pod.name_any(), volume.name))
            }
        })
        .any(|claim| claims.contains_key(&(namespace.clone(), claim)))
}

/// Deletes `claims`, then the pods using them.
pub(super) async fn release_claims(
    client: &Client,
    claims: &BTreeMap<ClaimKey, bool>,
) -> Result<(), UninstallError> {
    for (namespace, name) in claims.keys() {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        info!(claim = %format!("{namespace}/{name}"), "deleting the claim");
        unless_gone(api.delete(name, &DeleteParams::default()).await)?;
    }
    let pods: Vec<Pod> = list(&Api::all(client.clone())).await?;
    for pod in pods.iter().filter(|pod| uses(pod, claims)) {
        let namespace = pod.namespace().unwrap_or_default();
        info!(pod = %format!("{namespace}/{}", pod.name_any()), "deleting a pod of a claim");
        delete(&Api::<Pod>::namespaced(client.clone(), &namespace), pod).await?;
    }
    Ok(())
}

/// The attachments of Oxhorn volumes.
pub(super) async fn attachments(client: &Client) -> Result<Vec<String>, UninstallError> {
    let attachments: Vec<VolumeAttachment> = list(&Api::all(client.clone())).await?;
    Ok(attachments
        .iter()
        .filter(|a| a.spec.attacher == DRIVER_NAME)
        .map(|a| {
            let volume = a.spec.source.persistent_volume_name.clone();
            format!(
                "{} on node {}",
                volume.unwrap_or_default(),
                a.spec.node_name
            )
        })
        .collect())
}

fn snapshot_content_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// The VolumeSnapshotContents of Oxhorn snapshots; none where the snapshot
/// CRDs are not installed.
async fn oxhorn_snapshot_contents(client: &Client) -> Result<Vec<DynamicObject>, UninstallError> {
    let listed = snapshot_content_api(client)
        .list(&ListParams::default())
        .await;
    let Some(list) = unless_gone(listed)? else {
        return Ok(Vec::new());
    };
    Ok(list
        .items
        .into_iter()
        .filter(|c| c.data["spec"]["driver"] == DRIVER_NAME)
        .collect())
}

pub(super) async fn snapshot_contents(client: &Client) -> Result<Vec<String>, UninstallError> {
    let contents = oxhorn_snapshot_contents(client).await?;
    Ok(contents.iter().map(ResourceExt::name_any).collect())
}

/// Deletes the VolumeSnapshots of Oxhorn snapshots, and their contents
/// directly too (a Retain policy keeps a content once its VolumeSnapshot
/// is gone).
pub(super) async fn delete_volume_snapshots(client: &Client) -> Result<(), UninstallError> {
    let contents = snapshot_content_api(client);
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot");
    let resource = ApiResource::from_gvk(&gvk);
    for content in oxhorn_snapshot_contents(client).await? {
        let reference = &content.data["spec"]["volumeSnapshotRef"];
        if let (Some(namespace), Some(name)) =
            (reference["namespace"].as_str(), reference["name"].as_str())
        {
            let snapshots: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            info!(snapshot = %format!("{namespace}/{name}"), "deleting the VolumeSnapshot");
            unless_gone(snapshots.delete(name, &DeleteParams::default()).await)?;
        }
        unless_gone(
            contents
                .delete(&content.name_any(), &DeleteParams::default())
                .await,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pv(name: &str, driver: &str, claim: Option<(&str, &str, &str)>) -> PersistentVolume {
        let mut spec = json!({"csi": {"driver": driver, "volumeHandle": name}});
        if let Some((namespace, claim, uid)) = claim {
            spec["claimRef"] = json!({"namespace": namespace, "name": claim, "uid": uid});
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    }

    fn claim(name: &str, uid: &str, spec: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": name, "uid": uid},
            "spec": spec,
        }))
        .unwrap()
    }

    fn volume(name: &str, node: &str) -> Volume {
        let mut volume: Volume = serde_json::from_value(json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Volume",
            "metadata": {"name": name},
            "spec": {"size": 1 << 30, "numberOfReplicas": 3},
        }))
        .unwrap();
        volume.spec.node_id = node.into();
        volume
    }

    fn pod(namespace: &str, name: &str, volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"containers": [], "volumes": volumes},
        }))
        .unwrap()
    }

    fn keys(claims: &[(&str, &str)]) -> Vec<ClaimKey> {
        claims
            .iter()
            .map(|(n, c)| (n.to_string(), c.to_string()))
            .collect()
    }

    fn held(volumes: Vec<Volume>, pvs: Vec<PersistentVolume>) -> Held {
        Held {
            volumes,
            pvs,
            claims: BTreeMap::new(),
            snapshots: Vec::new(),
        }
    }

    #[test]
    fn the_refusal_names_each_volume_its_claim_and_node_and_how_to_confirm() {
        let volumes = vec![volume("pvc-1", "node-a"), volume("pvc-2", "")];
        let pvs = vec![pv("pvc-1", DRIVER_NAME, Some(("apps", "data", "u1")))];
        let message = held(volumes, pvs).refusal("oxhorn-system");
        assert!(
            message.starts_with(
                "2 Oxhorn volumes would be deleted with their data: \
                 pvc-1 (claim apps/data, attached to node node-a); pvc-2. To confirm"
            ),
            "{message}"
        );
        assert!(
            message.contains(
                "kubectl -n oxhorn-system patch settings.oxhorn.io deleting-confirmation-flag \
                 --type merge -p '{\"spec\":{\"value\":\"true\"}}'"
            ),
            "{message}"
        );
    }

    #[test]
    fn the_refusal_names_the_claims_still_waiting_and_the_snapshots() {
        let mut held = held(Vec::new(), Vec::new());
        held.claims = [(("apps".into(), "pending".into()), false)].into();
        held.snapshots = vec!["snapcontent-1".into(), "snapcontent-2".into()];
        let message = held.refusal("oxhorn-system");
        assert!(
            message.starts_with(
                "1 claim waiting for an Oxhorn volume would be deleted: apps/pending; \
                 and 2 Oxhorn snapshots would be deleted: snapcontent-1, snapcontent-2. To confirm"
            ),
            "{message}"
        );
    }

    #[test]
    fn only_oxhorn_pvs_are_ours() {
        let pvs = ours(vec![
            pv("pvc-1", DRIVER_NAME, None),
            pv("pvc-2", "other.csi.io", None),
        ]);
        let names: Vec<String> = pvs.iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["pvc-1"]);
    }

    #[test]
    fn claims_are_those_bound_to_oxhorn_and_those_waiting_for_it() {
        let pvs = [
            pv("pvc-1", DRIVER_NAME, Some(("apps", "bound", "u1"))),
            // Released: its claim is gone, and another of that name is
            // another driver's.
            pv("pvc-2", DRIVER_NAME, Some(("apps", "reused", "u-old"))),
        ];
        let annotated: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {
            "namespace": "apps", "name": "annotated", "uid": "u5",
            "annotations": {"volume.kubernetes.io/storage-provisioner": DRIVER_NAME},
        }}))
        .unwrap();
        let claims = [
            claim("bound", "u1", json!({"volumeName": "pvc-1"})),
            claim(
                "reused",
                "u-new",
                json!({"volumeName": "ebs-9", "storageClassName": "oxhorn"}),
            ),
            claim(
                "first-consumer",
                "u3",
                json!({"storageClassName": "oxhorn"}),
            ),
            claim("elsewhere", "u4", json!({"storageClassName": "gp3"})),
            annotated,
        ];
        let classes: BTreeSet<String> = ["oxhorn".to_string()].into();
        let found = claims_of(&pvs, &claims, &classes);
        let expected: BTreeMap<ClaimKey, bool> = keys(&[
            ("apps", "annotated"),
            ("apps", "bound"),
            ("apps", "first-consumer"),
        ])
        .into_iter()
        .zip([false, true, false])
        .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn a_pod_uses_a_claim_by_name_or_as_its_ephemeral_volume_in_its_namespace() {
        let claims: BTreeMap<ClaimKey, bool> = keys(&[("apps", "data"), ("apps", "web-0-scratch")])
            .into_iter()
            .map(|key| (key, true))
            .collect();
        let by_name = json!([{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]);
        let ephemeral = json!([{"name": "scratch", "ephemeral": {}}]);
        assert!(uses(&pod("apps", "p", by_name.clone()), &claims));
        assert!(!uses(&pod("other", "p", by_name), &claims));
        assert!(uses(&pod("apps", "web-0", ephemeral.clone()), &claims));
        assert!(!uses(&pod("apps", "web-1", ephemeral), &claims));
        assert!(!uses(
            &pod("apps", "p", json!([{"name": "e", "emptyDir": {}}])),
            &claims
        ));
    }
}
