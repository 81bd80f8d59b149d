//! `versions.yaml`: what runs where. The version of whoever made the
//! bundle, Kubernetes' (the API server's, and each node's kubelet, kernel,
//! OS and container runtime), the images the namespace's DaemonSets and
//! Deployments ask for with how far their rollout got, and each pod's
//! containers with the image each runs (its digest) and its restarts.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod, PodSpec};
use kube::ResourceExt;
use serde_json::{Map, Value, json};

use super::archive::Stopped;
use super::collect::Collection;
use super::report::Outcome;
use super::resources::Kubernetes;

/// Each container's image, by container name.
fn images(spec: Option<&PodSpec>) -> Map<String, Value> {
    let containers = spec.into_iter().flat_map(|s| {
        let init = s.init_containers.iter().flatten();
        init.chain(&s.containers)
    });
    containers
        .map(|c| (c.name.clone(), json!(c.image)))
        .collect()
}

fn daemon_set(set: &DaemonSet) -> Value {
    let spec = set.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    let status = set.status.as_ref();
    json!({
        "kind": "DaemonSet",
        "name": set.name_any(),
        "images": images(spec),
        "desired": status.map(|s| s.desired_number_scheduled),
        "ready": status.map(|s| s.number_ready),
        "updated": status.and_then(|s| s.updated_number_scheduled),
        "available": status.and_then(|s| s.number_available),
    })
}

fn deployment(deployment: &Deployment) -> Value {
    let spec = deployment.spec.as_ref();
    let pods = spec.and_then(|s| s.template.spec.as_ref());
    let status = deployment.status.as_ref();
    json!({
        "kind": "Deployment",
        "name": deployment.name_any(),
        "images": images(pods),
        "desired": spec.and_then(|s| s.replicas),
        "ready": status.and_then(|s| s.ready_replicas),
        "updated": status.and_then(|s| s.updated_replicas),
        "available": status.and_then(|s| s.available_replicas),
    })
}

fn pod(pod: &Pod) -> Value {
    let status = pod.status.as_ref();
    let containers: Vec<Value> = status
        .into_iter()
        .flat_map(|s| {
            let init = s.init_container_statuses.iter().flatten();
            init.chain(s.container_statuses.iter().flatten())
        })
        .map(|c| {
            json!({
                "name": c.name,
                "image": c.image,
                "imageID": c.image_id,
                "ready": c.ready,
                "restarts": c.restart_count,
            })
        })
        .collect();
    json!({
        "name": pod.name_any(),
        "node": pod.spec.as_ref().and_then(|s| s.node_name.as_ref()),
        "phase": status.and_then(|s| s.phase.as_ref()),
        "containers": containers,
    })
}

fn node(node: &KubeNode) -> Value {
    let status = node.status.as_ref();
    let info = status.and_then(|s| s.node_info.as_ref());
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    json!({
        "name": node.name_any(),
        "ready": ready,
        "kubelet": info.map(|i| &i.kubelet_version),
        "kernel": info.map(|i| &i.kernel_version),
        "os": info.map(|i| &i.os_image),
        "architecture": info.map(|i| &i.architecture),
        "containerRuntime": info.map(|i| &i.container_runtime_version),
    })
}

impl Collection<'_> {
    pub(super) async fn versions(&mut self, kubernetes: &Kubernetes) -> Result<(), Stopped> {
        let what = "versions.yaml";
        let server = match tokio::time::timeout(
            super::collect::READ_TIMEOUT,
            self.client.apiserver_version(),
        )
        .await
        {
            Ok(Ok(info)) => json!({
                "version": info.git_version,
                "platform": info.platform,
                "goVersion": info.go_version,
                "buildDate": info.build_date,
            }),
            Ok(Err(error)) => json!({"error": error.to_string()}),
            Err(_) => json!({"error": "the API server did not answer"}),
        };
        let workloads: Vec<Value> = kubernetes
            .daemon_sets
            .iter()
            .map(daemon_set)
            .chain(kubernetes.deployments.iter().map(deployment))
            .collect();
        let done = Outcome::Done(format!(
            "{} workloads, {} pods, {} nodes",
            workloads.len(),
            kubernetes.pods.len(),
            kubernetes.nodes.len()
        ));
        let versions = json!({
            "madeBy": self.options.made_by,
            "oxhorn": env!("CARGO_PKG_VERSION"),
            "kubernetes": {
                "server": server,
                "nodes": kubernetes.nodes.iter().map(node).collect::<Vec<_>>(),
            },
            "workloads": workloads,
            "pods": kubernetes.pods.iter().map(pod).collect::<Vec<_>>(),
        });
        self.yaml(what, what, &versions, 0, done).await
    }
}
