//! The Kubernetes Node of a manager-only test node (an `oxhorn manager`
//! host process, no kubelet), registered as a kubelet would register it.
//! Its Lease in `kube-node-lease` is renewed as a kubelet renews its own,
//! so kube-controller-manager's node-lifecycle controller, where it runs,
//! finds the node alive rather than marking it unreachable; and it is
//! tainted [`MANAGER_ONLY_TAINT`]`:NoSchedule`, since no kubelet would run
//! a pod placed there.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node as KubeNode, NodeCondition, NodeSpec, NodeStatus, Taint};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::Result;

/// The taint of every manager-only node.
pub const MANAGER_ONLY_TAINT: &str = "oxhorn.io/manager-only";
const LEASE_NAMESPACE: &str = "kube-node-lease";
/// A kubelet's defaults: a 40 s lease renewed every quarter of it.
const LEASE_SECONDS: i32 = 40;
const RENEW_EVERY: Duration = Duration::from_secs(10);

/// The renewing tasks of this process's manager-only nodes, by node name.
static HEARTBEATS: Mutex<BTreeMap<String, tokio::task::AbortHandle>> = Mutex::new(BTreeMap::new());

/// Registers a manager-only Kubernetes Node, Ready, with `labels`, and
/// renews its Lease until [`delete_kube_node`] or the end of the caller's
/// runtime. Replaces one left by an earlier run.
pub async fn register_kube_node(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
) -> Result<()> {
    stop_heartbeat(name);
    let api: Api<KubeNode> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    let mut node = KubeNode::default();
    node.metadata.name = Some(name.to_owned());
    node.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    node.spec = Some(NodeSpec {
        taints: Some(vec![Taint {
            key: MANAGER_ONLY_TAINT.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]),
        ..NodeSpec::default()
    });
    let node = api.create(&PostParams::default(), &node).await?;
    set_kube_node_ready(client, name, true).await?;
    renew_lease(client, &node).await?;
    let (client, renewing) = (client.clone(), node);
    let task = tokio::spawn(async move {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            if let Err(error) = renew_lease(&client, &renewing).await {
                tracing::warn!(%error, "renewing a manager-only node's lease");
            }
        }
    });
    lock_heartbeats().insert(name.to_owned(), task.abort_handle());
    Ok(())
}

/// Sets the Kubernetes Node's Ready condition, as a kubelet reports it (or
/// the node lifecycle controller, when a kubelet stops reporting).
pub async fn set_kube_node_ready(client: &Client, name: &str, ready: bool) -> Result<()> {
    let api: Api<KubeNode> = Api::all(client.clone());
    let status = NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: Some(
                if ready {
                    "KubeletReady"
                } else {
                    "NodeStatusUnknown"
                }
                .into(),
            ),
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    };
    let patch = json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Removes a Kubernetes Node registered by [`register_kube_node`], and its
/// Lease.
pub async fn delete_kube_node(client: &Client, name: &str) -> Result<()> {
    stop_heartbeat(name);
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let nodes: Api<KubeNode> = Api::all(client.clone());
    for deleted in [
        leases
            .delete(name, &DeleteParams::default())
            .await
            .map(drop),
        nodes.delete(name, &DeleteParams::default()).await.map(drop),
    ] {
        match deleted {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// The node's Lease, held by the node and renewed now, owned by the Node
/// (so the garbage collector removes it with the Node), as a kubelet keeps
/// its own.
async fn renew_lease(client: &Client, node: &KubeNode) -> Result<()> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": name,
                "uid": node.metadata.uid,
            }],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now()
            ),
        },
    });
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let params = PatchParams::apply("oxhorn-testbed-node").force();
    leases.patch(name, &params, &Patch::Apply(&lease)).await?;
    Ok(())
}

fn stop_heartbeat(name: &str) {
    if let Some(task) = lock_heartbeats().remove(name) {
        task.abort();
    }
}

fn lock_heartbeats() -> std::sync::MutexGuard<'static, BTreeMap<String, tokio::task::AbortHandle>> {
    HEARTBEATS.lock().unwrap_or_else(|e| e.into_inner())
}
