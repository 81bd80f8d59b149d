//! The test bed's real node: containerd and a kubelet run a pod from an
//! image built here, and leave the host as they found it.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use oxhorn_testbed::{KubeletNode, TestNamespace, delete_kube_node, images};

const PATIENCE: Duration = Duration::from_secs(120);

const FIXED_PATHS: [&str; 3] = ["/var/lib/kubelet", "/var/log/containers", "/run/containerd"];

fn fixed_paths() -> Vec<bool> {
    FIXED_PATHS.iter().map(|p| Path::new(p).exists()).collect()
}

fn sysctls() -> Vec<String> {
    [
        "kernel/panic",
        "kernel/panic_on_oops",
        "vm/overcommit_memory",
    ]
    .iter()
    .map(|name| std::fs::read_to_string(Path::new("/proc/sys").join(name)).unwrap())
    .collect()
}

/// A pod that writes a file and reads it back, on the host's network.
fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": images::BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo written > /tmp/file && test \"$(cat /tmp/file)\" = written"]
            }]
        }
    }))
    .unwrap()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

#[tokio::test]
async fn a_real_node_runs_a_pod_and_leaves_the_host_as_it_was() {
    let control = oxhorn_testbed::shared();
    let client = control.client().unwrap();
    let before = (sysctls(), fixed_paths());
    let namespace = TestNamespace::create(control, "kn").await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace.name());
    // Nothing runs the service-account controller here.
    let account = serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}));
    let _ = accounts
        .create(&PostParams::default(), &account.unwrap())
        .await;

    let node = KubeletNode::start(control, "kn-1").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace.name());
    pods.create(&PostParams::default(), &pod("writer", node.name()))
        .await
        .unwrap();
    let done = tokio::time::timeout(
        PATIENCE,
        await_condition(pods.clone(), "writer", |pod: Option<&Pod>| {
            pod.is_some_and(|p| matches!(phase(p), "Succeeded" | "Failed"))
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("the pod did not finish\n{}", node.logs(40)))
    .unwrap()
    .unwrap();
    assert_eq!(
        phase(&done),
        "Succeeded",
        "{:#?}\n{}",
        done.status,
        node.logs(40)
    );
    pods.delete("writer", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::timeout(
        PATIENCE,
        await_condition(pods.clone(), "writer", |pod: Option<&Pod>| pod.is_none()),
    )
    .await
    .unwrap_or_else(|_| panic!("the pod was not removed\n{}", node.logs(40)))
    .unwrap();

    let dir = node.kubelet_dir();
    let name = node.name().to_string();
    drop(node);
    delete_kube_node(&client, &name).await.unwrap();
    assert!(!dir.exists(), "the node's directory is removed");
    assert_eq!(
        (sysctls(), fixed_paths()),
        before,
        "the kubelet's sysctls and the paths it made ({FIXED_PATHS:?}) are put back"
    );
    let cgroups: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(|h| std::fs::read_dir(h.ok()?.path()).ok())
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains("kn-1"))
        .collect();
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("oxhorn-node-"), "mounts left:\n{mounts}");
}
