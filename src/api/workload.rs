//! `/v1/volumes/{name}/workload`: who uses a volume, as Longhorn's volume
//! page shows it: the PersistentVolume whose CSI volume handle it is, the
//! claim bound to that, and the Pods of the claim's namespace that mount
//! the claim. None of these is cached: each call reads them from the API
//! server, each only once the caller may read it.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{Access, Caller, Scope};
use super::error::{ApiError, ErrorBody};
use super::{ApiState, found};
use crate::csi::DRIVER_NAME;

/// The PersistentVolume of a volume.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeView {
    pub name: String,
    /// Available, Bound, Released or Failed.
    pub phase: String,
    pub storage_class: String,
    /// Retain or Delete.
    pub reclaim_policy: String,
}

/// The claim bound to a volume's PersistentVolume.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimView {
    pub namespace: String,
    pub name: String,
    /// Pending, Bound or Lost.
    pub phase: String,
    /// What it was given, e.g. `1Gi`; empty while pending.
    pub capacity: String,
    pub storage_class: String,
}

/// A Pod that uses a volume's claim.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    pub name: String,
    /// The node it runs on, or is to; empty: not yet scheduled.
    pub node: String,
    /// Pending, Running, Succeeded, Failed or Unknown.
    pub phase: String,
    /// Its Ready condition is True.
    pub ready: bool,
}

/// Who uses a volume. A volume made without Kubernetes (or whose
/// PersistentVolume is gone) has none.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadView {
    pub volume: String,
    pub persistent_volume: Option<PersistentVolumeView>,
    /// The claim bound to it, if any.
    pub claim: Option<ClaimView>,
    /// The claim's Pods, by name.
    pub pods: Vec<PodView>,
}

/// Whether `pv` is oxhorn's volume `volume`.
fn is_of(pv: &PersistentVolume, volume: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|csi| csi.driver == DRIVER_NAME && csi.volume_handle == volume)
}

/// The PersistentVolume of `volume`: the one named after it, as the CSI
/// provisioner names them, else any whose handle it is.
async fn persistent_volume(
    api: &Api<PersistentVolume>,
    volume: &str,
) -> Result<Option<PersistentVolume>, ApiError> {
    if let Some(pv) = api.get_opt(volume).await?
        && is_of(&pv, volume)
    {
        return Ok(Some(pv));
    }
    let all = api.list(&ListParams::default()).await?;
    Ok(all.items.into_iter().find(|pv| is_of(pv, volume)))
}

fn pv_view(pv: &PersistentVolume) -> PersistentVolumeView {
    let spec = pv.spec.clone().unwrap_or_default();
    PersistentVolumeView {
        name: pv.name_any(),
        phase: pv
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        storage_class: spec.storage_class_name.unwrap_or_default(),
        reclaim_policy: spec.persistent_volume_reclaim_policy.unwrap_or_default(),
    }
}

fn claim_view(claim: &PersistentVolumeClaim) -> ClaimView {
    let status = claim.status.clone().unwrap_or_default();
    ClaimView {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        phase: status.phase.unwrap_or_default(),
        capacity: status
            .capacity
            .and_then(|c| c.get("storage").map(|q| q.0.clone()))
            .unwrap_or_default(),
        storage_class: claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default(),
    }
}

/// Whether `pod` mounts the claim `claim` (of its own namespace).
fn uses(pod: &Pod, claim: &str) -> bool {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes.is_some_and(|volumes| {
        volumes.iter().any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == claim)
        })
    })
}

fn pod_view(pod: &Pod) -> PodView {
    let status = pod.status.as_ref();
    PodView {
        name: pod.name_any(),
        node: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
    }
}

/// The claim `pv` is bound to: its claimRef, if that claim names `pv`
/// back (a claimRef alone may be a reservation).
fn claim_ref(pv: &PersistentVolume) -> Option<(String, String)> {
    let reference = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some((reference.namespace.clone()?, reference.name.clone()?))
}

/// Who uses the volume: its PersistentVolume, that one's claim, and the
/// claim's Pods. Needs `get` on the volume and on PersistentVolumes, then
/// `get` on the claim and `list` on Pods in the claim's namespace.
#[utoipa::path(
    get,
    path = "/v1/volumes/{name}/workload",
    operation_id = "get_workload",
    tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 200, description = "Who uses the volume", body = WorkloadView),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "The caller may not get the volume, PersistentVolumes or the claim, or list Pods in its namespace", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 503, description = "The API server did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<Arc<ApiState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<WorkloadView>, ApiError> {
    let get_volume = Access::oxhorn("get", "volumes", Some(&name));
    state.auth.authorize(&caller, &get_volume).await?;
    found(&state, &state.ds.volumes, "volume", &name).await?;
    of_volume(&state, &caller, &name).await.map(Json)
}

/// Who uses the volume `name` (one the caller may get), as the caller may
/// see it: refused whole (403) once any of it may not be read, as the
/// endpoint is; the dashboard's volume page shows it the same way.
pub(crate) async fn of_volume(
    state: &ApiState,
    caller: &Caller,
    name: &str,
) -> Result<WorkloadView, ApiError> {
    let auth = &state.auth;
    let mut workload = WorkloadView {
        volume: name.to_owned(),
        persistent_volume: None,
        claim: None,
        pods: Vec::new(),
    };
    // Which PersistentVolume is the volume's is known only once read.
    let any_pv = Access::core("get", "persistentvolumes", Scope::Cluster, None);
    auth.authorize(caller, &any_pv).await?;
    let pvs: Api<PersistentVolume> = Api::all(state.client.clone());
    let Some(pv) = persistent_volume(&pvs, name).await? else {
        return Ok(workload);
    };
    workload.persistent_volume = Some(pv_view(&pv));
    let Some((namespace, claim_name)) = claim_ref(&pv) else {
        return Ok(workload);
    };
    let scope = Scope::Namespace(namespace.clone());
    let get_claim = Access::core(
        "get",
        "persistentvolumeclaims",
        scope.clone(),
        Some(&claim_name),
    );
    auth.authorize(caller, &get_claim).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(state.client.clone(), &namespace);
    let pv_name = pv.name_any();
    let bound = claims.get_opt(&claim_name).await?.filter(|claim| {
        claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(pv_name.as_str())
    });
    let Some(claim) = bound else {
        return Ok(workload);
    };
    workload.claim = Some(claim_view(&claim));
    auth.authorize(caller, &Access::core("list", "pods", scope, None))
        .await?;
    let pods: Api<Pod> = Api::namespaced(state.client.clone(), &namespace);
    let mut users: Vec<PodView> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|pod| uses(pod, &claim_name))
        .map(pod_view)
        .collect();
    users.sort_by(|a, b| a.name.cmp(&b.name));
    workload.pods = users;
    Ok(workload)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_persistent_volume_is_the_volumes_by_driver_and_handle() {
        let pv = |driver: &str, handle: &str| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pv"},
                "spec": {"csi": {"driver": driver, "volumeHandle": handle}},
            }))
            .unwrap()
        };
        assert!(is_of(&pv(DRIVER_NAME, "vol-a"), "vol-a"));
        assert!(!is_of(&pv(DRIVER_NAME, "vol-b"), "vol-a"));
        assert!(!is_of(&pv("other.csi.io", "vol-a"), "vol-a"));
        let hostpath: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "vol-a"},
            "spec": {"hostPath": {"path": "/tmp"}},
        }))
        .unwrap();
        assert!(!is_of(&hostpath, "vol-a"));
    }

    #[test]
    fn a_pod_uses_a_claim_it_mounts_and_is_ready_when_its_condition_says() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "c"}],
                "volumes": [
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                ],
            },
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        assert!(uses(&pod, "data"));
        assert!(!uses(&pod, "other"));
        let shown = pod_view(&pod);
        assert_eq!(
            (shown.node.as_str(), shown.phase.as_str(), shown.ready),
            ("n1", "Running", true)
        );
    }
}
