//! The test bed's real node: containerd and a kubelet run a pod from an
//! image built here, and leave the host as they found it; a manager on the
//! node registers the CSI driver with the kubelet itself.
//!
//! The node (testbed's `kubelet_node.rs`): Debian's containerd and runc and
//! the pinned kubelet, each with its own root, state, socket and cgroup
//! (`oxhorn-testbed-<node>` in every hierarchy), registered with the shared
//! control plane. A pod from the busybox image built here (`images.rs`:
//! Debian's static busybox packed with umoci, imported with `ctr`, also the
//! nodes' sandbox image) writes a file and reads it back. Once the node
//! stops, the host must be as before: the kubelet's sysctls put back, the
//! fixed paths it and containerd's shims use (`/var/lib/kubelet`,
//! `/var/log/containers`, `/run/containerd`) removed, no cgroup, mount or
//! process left. The kubelet runs without iptables on its PATH, so it leaves
//! the firewall alone; a crashed run's leftovers are swept at the next start
//! (`host_state.rs`, `cgroup.rs`).
//!
//! Each kubelet runs in a mount namespace of its own, where its fixed
//! device-plugin directory (`/var/lib/kubelet/device-plugins`) is its
//! node's; the node directory's mounts stay shared with the host's, so the
//! kubelet sees the node plugin's mounts and containerd the kubelet's. A
//! test's kubelet nodes start together (`KubeletNode::start_beside`) and
//! share one turn of the host: those of another test or process wait for
//! them (a lock file), since the sysctls they set are recorded and put back
//! once for all.
//!
//! A manager on the node registers the driver with the real kubelet (its
//! CSINode lists `driver.oxhorn.io`), and the kubelet forgets it once the
//! manager stops.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::wait::await_condition;
use oxhorn_testbed::{
    HostTurn, KubeletNode, ManagerOptions, ManagerProcess, TestNamespace, delete_kube_node,
};

use crate::common::{OXHORN, one_shot_pod, run_to_completion};

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

#[tokio::test]
async fn a_real_node_runs_a_pod_and_leaves_the_host_as_it_was() {
    let control = oxhorn_testbed::shared();
    let client = control.client().unwrap();
    // The host as it is with no kubelet node: looked at in the host's turn.
    let turn = HostTurn::take().await.unwrap();
    let before = (sysctls(), fixed_paths());
    let namespace = TestNamespace::create(control, "kn").await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace.name());
    // Nothing runs the service-account controller here.
    let account = serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}));
    let _ = accounts
        .create(&PostParams::default(), &account.unwrap())
        .await;

    let node = KubeletNode::start_in_turn(control, "kn-1", turn)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace.name());
    let mut pod = one_shot_pod(
        "writer",
        "echo written > /tmp/file && test \"$(cat /tmp/file)\" = written",
    );
    pod["spec"]["nodeName"] = node.name().into();
    let phase = run_to_completion(&pods, pod, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", node.logs(40)));
    assert_eq!(phase, "Succeeded", "{}", node.logs(40));

    let dir = node.kubelet_dir();
    // The node's own directory: other nodes of this binary may be running.
    let node_dir = dir.parent().unwrap().display().to_string();
    let name = node.name().to_string();
    // No other node starts until the checks are done.
    let _turn = node.stop();
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
    assert!(!mounts.contains(&node_dir), "mounts left:\n{mounts}");
}

/// The drivers a node's CSINode lists, by name, with the node id each gave.
fn drivers(node: Option<&CSINode>) -> Vec<(String, String)> {
    node.map(|n| {
        n.spec
            .drivers
            .iter()
            .map(|d| (d.name.clone(), d.node_id.clone()))
            .collect()
    })
    .unwrap_or_default()
}

/// No node-driver-registrar: the manager registers the CSI driver with the
/// kubelet, which then lists it in the node's CSINode, and forgets it once
/// the manager stops.
#[tokio::test]
async fn the_manager_registers_the_driver_with_the_kubelet() {
    let control = oxhorn_testbed::shared();
    let client = control.client().unwrap();
    let namespace = TestNamespace::create(control, "kn-reg").await.unwrap();
    let node = KubeletNode::start(control, "kn-reg-1").await.unwrap();
    let mut options = ManagerOptions::new(control.kubeconfig(), node.name(), namespace.name());
    options.kubelet_registration_dir = Some(node.registration_dir());
    let mut manager = ManagerProcess::start(Path::new(OXHORN), options).unwrap();

    let csinodes: Api<CSINode> = Api::all(client.clone());
    let registered = [("driver.oxhorn.io".to_string(), node.name().to_string())];
    tokio::time::timeout(
        PATIENCE,
        await_condition(csinodes.clone(), node.name(), |n: Option<&CSINode>| {
            drivers(n) == registered
        }),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the CSINode does not list the driver\n{}\n{}",
            node.logs(30),
            manager.log()
        )
    })
    .unwrap();

    manager.terminate(Duration::from_secs(10)).unwrap();
    tokio::time::timeout(
        PATIENCE,
        await_condition(csinodes, node.name(), |n: Option<&CSINode>| {
            drivers(n).is_empty()
        }),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the kubelet kept the driver of a stopped manager\n{}",
            node.logs(30)
        )
    })
    .unwrap();
    let name = node.name().to_string();
    drop(node);
    delete_kube_node(&client, &name).await.unwrap();
}
