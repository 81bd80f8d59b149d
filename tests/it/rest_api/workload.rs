//! A volume's workload as Kubernetes would show it: a PersistentVolume of
//! it, a claim bound to that and Pods mounting the claim, made directly
//! (no provisioner, controller manager or kubelet runs in the test bed),
//! and who may read PersistentVolumes.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::Cluster;

/// A ClusterRole letting the test namespace's `account` get
/// PersistentVolumes; deleted by the caller.
pub async fn may_get_persistent_volumes(cluster: &Cluster, account: &str) -> String {
    let name = format!("{}-{account}-pvs", cluster.ns.name());
    let meta = ObjectMeta {
        name: Some(name.clone()),
        ..ObjectMeta::default()
    };
    let role = ClusterRole {
        metadata: meta.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["persistentvolumes".into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    let binding = ClusterRoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(cluster.ns.name().into()),
            ..Subject::default()
        }]),
    };
    let post = PostParams::default();
    Api::<ClusterRole>::all(cluster.client.clone())
        .create(&post, &role)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(cluster.client.clone())
        .create(&post, &binding)
        .await
        .unwrap();
    name
}

/// Deletes `name` of `api` at once, finalizers and all (no controller
/// manager or kubelet runs here to finish a deletion).
async fn remove<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let no_finalizers = json!({"metadata": {"finalizers": null}});
    let _ = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&no_finalizers))
        .await;
    let _ = api
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
}

/// A PersistentVolume of oxhorn's `volume` (named after the test's
/// namespace and it), the claim `claim` of the test's namespace bound to
/// it, and `pods` (each a name and the claim it mounts), on a node no
/// kubelet runs. The PersistentVolume's name.
pub async fn make_workload(
    cluster: &Cluster,
    volume: &str,
    claim: &str,
    pods: &[(&str, &str)],
) -> String {
    let ns = cluster.ns.name().to_owned();
    let pv_name = format!("{ns}-{volume}");
    let post = PostParams::default();
    let pvs: Api<PersistentVolume> = Api::all(cluster.client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "16Mi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "oxhorn-test",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": ns, "name": claim},
            "csi": {"driver": oxhorn::csi::DRIVER_NAME, "volumeHandle": volume},
        },
    }))
    .unwrap();
    pvs.create(&post, &pv).await.unwrap();
    let claims = cluster.api::<PersistentVolumeClaim>();
    let bound: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "oxhorn-test",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "16Mi"}},
        },
    }))
    .unwrap();
    claims.create(&post, &bound).await.unwrap();
    // Pods need their namespace's default account (no controller manager
    // makes it here).
    let default_account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let _ = cluster
        .api::<ServiceAccount>()
        .create(&post, &default_account)
        .await;
    let api = cluster.api::<Pod>();
    for (name, claim) in pods {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "nodeName": "no-kubelet-here",
                "automountServiceAccountToken": false,
                "containers": [{"name": "main", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }))
        .unwrap();
        api.create(&post, &pod).await.unwrap();
    }
    pv_name
}

/// Deletes what [`make_workload`] made, and the ClusterRoles (and their
/// bindings) `cluster_roles`.
pub async fn remove_workload(
    cluster: &Cluster,
    pv: &str,
    claim: &str,
    pods: &[&str],
    cluster_roles: &[&str],
) {
    for name in pods {
        remove(&cluster.api::<Pod>(), name).await;
    }
    remove(&cluster.api::<PersistentVolumeClaim>(), claim).await;
    remove(&Api::<PersistentVolume>::all(cluster.client.clone()), pv).await;
    for role in cluster_roles {
        let _ = Api::<ClusterRoleBinding>::all(cluster.client.clone())
            .delete(role, &DeleteParams::default())
            .await;
        let _ = Api::<ClusterRole>::all(cluster.client.clone())
            .delete(role, &DeleteParams::default())
            .await;
    }
}
