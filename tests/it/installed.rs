//! Oxhorn installed as a user installs it: `kubectl apply` of the manifest
//! (`oxhorn manifest` for this node's directories) on a real kubelet node
//! whose containerd runs the images hack/build-image.sh built. Two
//! manager-only nodes (host processes) join it, so that the default
//! StorageClass's three replicas have three nodes.
//!
//! What the test bed changes in the manifest ([`for_the_test_bed`]): its
//! cluster has no service network and its kubelet refuses a loopback node
//! address, so each container is given the API server's address (as on a
//! cluster without kube-proxy), the data plane and the probes use loopback,
//! and a node selector keeps the pods on the kubelet's node (the others
//! have no kubelet), with one replica per Deployment. This machine's init
//! (pid 1) is a sandbox's, whose namespaces no other process may open: the
//! manager joins those of the test process instead (`--host-pid`), which
//! are the ones the kubelet runs in.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use oxhorn::csi::DRIVER_NAME;
use oxhorn::manifest::HostDirs;
use oxhorn::types::{Engine, Replica, Volume};
use oxhorn_testbed::sidecars::Sidecars;
use oxhorn_testbed::{self as testbed, KubeletNode, TestNamespace, delete_kube_node};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::common::{
    Cluster, eventually, next_subnet, one_shot_pod, require_root, run_to_completion,
};
use crate::install::OXHORN_SYSTEM;

const PATIENCE: Duration = Duration::from_secs(240);
const NAMESPACE: &str = "oxhorn-system";
const CLAIM: &str = "data";
const MOUNT: &str = "/data";
/// The kubelet's node and the two manager-only ones.
const NODES: usize = 3;

/// The installed product and everything it runs on. Dropped in field
/// order: the users' namespace, the manager-only nodes and oxhorn-system,
/// the cluster-wide objects, the cluster's controllers, the node.
struct Installed {
    users: TestNamespace,
    cluster: Cluster,
    _cluster_objects: ClusterObjects,
    controllers: Sidecars,
    node: KubeletNode,
    /// When `kubectl apply` began.
    applied: Instant,
    started: Instant,
}

impl Installed {
    async fn install() -> Self {
        require_root();
        let started = Instant::now();
        let control_plane = testbed::shared();
        testbed::sidecars::apply_snapshot_crds(control_plane)
            .await
            .unwrap();
        let node = KubeletNode::start(control_plane, "installed-kubelet")
            .await
            .unwrap();
        node.import_product_images().unwrap();
        let controllers = Sidecars::start_cluster(control_plane).unwrap();
        let client = control_plane.client().unwrap();
        // A namespace an earlier test deleted goes once the namespace
        // controller (now running) has emptied it.
        let namespaces: Api<Namespace> = Api::all(client.clone());
        eventually(PATIENCE, || async {
            namespaces
                .get_opt(NAMESPACE)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e} waiting for an old {NAMESPACE} to go"));
        eprintln!(
            "[{:>6.1?}] node and cluster controllers up",
            started.elapsed()
        );

        let dirs = HostDirs {
            kubelet_dir: node.kubelet_dir(),
            data_dir: node.host_dir("oxhorn-data").unwrap(),
            run_dir: node.host_dir("oxhorn-run").unwrap(),
        };
        let manifest = oxhorn::manifest::manifest_yaml_for(&dirs).unwrap();
        // Node 1 of the cluster below is the kubelet's, its address this.
        let subnet = next_subnet();
        let address = IpAddr::from([127, 0, subnet, 1]);
        let manifest = for_the_test_bed(&manifest, control_plane.api_address(), &node, address);
        let file = node.host_dir("manifest").unwrap().join("oxhorn.yaml");
        std::fs::write(&file, &manifest).unwrap();
        let cluster_objects = ClusterObjects::from_manifest(&manifest, &file);
        let applied = Instant::now();
        // (install::every_object_is_accepted_by_the_api_server dry-runs it.)
        kubectl_apply(&file);
        eprintln!("[{:>6.1?}] manifest applied", started.elapsed());

        let cluster = Cluster::join_installed(
            TestNamespace::adopt(control_plane, NAMESPACE),
            NODES,
            &node,
            subnet,
        )
        .await;
        let users = TestNamespace::create(control_plane, "installed-users")
            .await
            .unwrap();
        Self {
            users,
            cluster,
            _cluster_objects: cluster_objects,
            controllers,
            node,
            applied,
            started,
        }
    }

    fn report(&self, what: &str) {
        eprintln!("[{:>6.1?}] {what}", self.started.elapsed());
    }

    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    fn logs(&self) -> String {
        let described = testbed::shared()
            .kubectl(&[
                "describe",
                "pods,pvc,daemonsets,deployments",
                "-n",
                self.users.name(),
                "-n",
                NAMESPACE,
            ])
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        format!(
            "{described}\n{}\n{}\n{}\n{}",
            self.container_logs(),
            self.node.logs(40),
            self.controllers.logs(20),
            self.cluster.logs()
        )
    }

    /// The end of each oxhorn-system container's log, read from the
    /// kubelet's pod log directory.
    fn container_logs(&self) -> String {
        let mut logs = String::new();
        let pod_logs = Path::new(&self.node_dir()).join("pod-logs");
        let ours = format!("{NAMESPACE}_");
        for file in paths(&pod_logs, &[&ours, "", ""]) {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            logs.push_str(&format!("==== {} ====\n", file.display()));
            for line in tail.into_iter().rev() {
                logs.push_str(line);
                logs.push('\n');
            }
        }
        logs
    }

    fn node_dir(&self) -> String {
        // The kubelet's root is `<node dir>/kubelet`.
        self.node
            .kubelet_dir()
            .parent()
            .unwrap()
            .display()
            .to_string()
    }

    /// Waits until `check` returns Some, failing with every log after
    /// PATIENCE.
    async fn until<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let step = Instant::now();
        match eventually(PATIENCE, check).await {
            Ok(value) => {
                self.report(&format!("{what} after {:.1?}", step.elapsed()));
                value
            }
            Err(e) => panic!("{e} waiting for {what}\n{}", self.logs()),
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), self.users.name())
    }

    /// The ready pod of `app` (an oxhorn-system workload) on the node.
    async fn ready_pod(&self, app: &str) -> Option<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client(), NAMESPACE);
        let selector = format!("app.kubernetes.io/name={app}");
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|pod| pod.metadata.deletion_timestamp.is_none() && is_ready(pod))
    }

    /// A pod on the claim, on the kubelet's node, running `script`.
    fn pod_on_claim(&self, name: &str, script: &str) -> Value {
        let mut pod = one_shot_pod(name, script);
        let spec = &mut pod["spec"];
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": self.node.name()});
        spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": MOUNT}]);
        spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}]);
        pod
    }

    /// Runs a pod with `script` on the claim until it has finished and is
    /// gone; its phase.
    async fn run_pod(&self, name: &str, script: &str) -> String {
        let step = Instant::now();
        match run_to_completion(&self.pods(), self.pod_on_claim(name, script), PATIENCE).await {
            Ok(phase) => {
                self.report(&format!(
                    "pod {name} ran and went after {:.1?}",
                    step.elapsed()
                ));
                phase
            }
            Err(e) => panic!("{e}\n{}", self.logs()),
        }
    }

    /// Where the kubelet mounted the claim for the pod `name`, on the host.
    async fn mount_of(&self, name: &str) -> PathBuf {
        let pod = self.pods().get(name).await.unwrap();
        let uid = pod.uid().unwrap();
        let volumes = self
            .node
            .kubelet_dir()
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi");
        let mount = paths(&volumes, &[""]).pop().map(|pv| pv.join("mount"));
        mount.unwrap_or_else(|| {
            panic!(
                "no CSI volume of pod {name} in {}\n{}",
                volumes.display(),
                self.logs()
            )
        })
    }

    /// Every PV, VolumeAttachment and oxhorn volume object left.
    async fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let pvs: Api<PersistentVolume> = Api::all(self.client());
        for pv in pvs.list(&Default::default()).await.unwrap() {
            left.push(format!("PV/{}", pv.name_any()));
        }
        let attachments: Api<VolumeAttachment> = Api::all(self.client());
        for attachment in attachments.list(&Default::default()).await.unwrap() {
            left.push(format!("VolumeAttachment/{}", attachment.name_any()));
        }
        for volume in self
            .cluster
            .api::<Volume>()
            .list(&Default::default())
            .await
            .unwrap()
        {
            left.push(format!("Volume/{}", volume.name_any()));
        }
        for engine in self
            .cluster
            .api::<Engine>()
            .list(&Default::default())
            .await
            .unwrap()
        {
            left.push(format!("Engine/{}", engine.name_any()));
        }
        for replica in self
            .cluster
            .api::<Replica>()
            .list(&Default::default())
            .await
            .unwrap()
        {
            left.push(format!("Replica/{}", replica.name_any()));
        }
        left
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The paths `levels.len()` levels under `dir` whose name at each level
/// starts with that level's prefix, sorted.
fn paths(dir: &Path, levels: &[&str]) -> Vec<PathBuf> {
    let Some((prefix, rest)) = levels.split_first() else {
        return vec![dir.to_path_buf()];
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            found.extend(paths(&entry.path(), rest));
        }
    }
    found.sort();
    found
}

fn kubectl_apply(file: &Path) {
    let args = [
        "apply",
        "--server-side",
        "--field-manager=oxhorn-installed-test",
        "-f",
        file.to_str().unwrap(),
    ];
    let output = testbed::shared().kubectl(&args).unwrap();
    assert!(
        output.status.success(),
        "kubectl {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The manifest as the test bed runs it (see the module's comment).
fn for_the_test_bed(
    manifest: &str,
    api: SocketAddr,
    node: &KubeletNode,
    address: IpAddr,
) -> String {
    let mut out = String::new();
    for document in serde_yaml_ng::Deserializer::from_str(manifest) {
        let mut object = Value::deserialize(document).unwrap();
        if object.is_null() {
            continue;
        }
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        if kind == "Deployment" {
            object["spec"]["replicas"] = json!(1);
        }
        if kind == "DaemonSet" || kind == "Deployment" {
            let pod = &mut object["spec"]["template"]["spec"];
            pod["nodeSelector"] = json!({"kubernetes.io/hostname": node.name()});
            for container in pod["containers"].as_array_mut().unwrap() {
                on_loopback(container, api, address);
            }
        }
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&object).unwrap());
    }
    out
}

/// The API server's address in `container`'s environment, and its data
/// plane address `address`, where the manager also answers its probes.
fn on_loopback(container: &mut Value, api: SocketAddr, address: IpAddr) {
    let mut env: Vec<Value> = container["env"].as_array().cloned().unwrap_or_default();
    env.retain(|var| var["name"] != "POD_IP");
    if container["args"].to_string().contains("manager") {
        env.push(json!({"name": "POD_IP", "value": address.to_string()}));
    }
    env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": api.ip().to_string()}));
    env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": api.port().to_string()}));
    container["env"] = Value::Array(env);
    if let Some(args) = container["args"].as_array_mut()
        && args
            .iter()
            .any(|arg| arg.as_str() == Some("--host-proc=/host/proc"))
    {
        args.push(json!(format!("--host-pid={}", std::process::id())));
    }
    for probe in ["readinessProbe", "livenessProbe"] {
        if container[probe].is_object() {
            container[probe]["httpGet"]["host"] = json!(address.to_string());
        }
    }
}

/// The manifest's cluster-wide objects but its CRDs (which every test of
/// the binary shares): deleted when dropped.
struct ClusterObjects {
    file: PathBuf,
}

impl ClusterObjects {
    fn from_manifest(manifest: &str, beside: &Path) -> Self {
        let mut out = String::new();
        for document in serde_yaml_ng::Deserializer::from_str(manifest) {
            let object = Value::deserialize(document).unwrap();
            let kind = object["kind"].as_str().unwrap_or_default();
            let namespaced = object["metadata"]["namespace"].is_string();
            if !namespaced && !["Namespace", "CustomResourceDefinition", ""].contains(&kind) {
                out.push_str("---\n");
                out.push_str(&serde_yaml_ng::to_string(&object).unwrap());
            }
        }
        let file = beside.with_file_name("cluster-objects.yaml");
        std::fs::write(&file, out).unwrap();
        Self { file }
    }
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        if let Some(file) = self.file.to_str() {
            let _ = testbed::shared().kubectl(&[
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "-f",
                file,
            ]);
        }
    }
}

/// The write loop of the pod that keeps writing while the manager's pod is
/// replaced: 64 KiB files, each synced, with their checksums and a count
/// of rounds beside them, until a `stop` file appears; any failed write
/// fails the pod.
const WRITER: &str = "set -e; cd /data; i=0; \
    while [ ! -e stop ]; do \
      dd if=/dev/urandom of=w.$((i % 16)) bs=4096 count=16 conv=fsync 2>/dev/null; \
      sha256sum w.* > sums.tmp; mv sums.tmp sums; sync; \
      i=$((i + 1)); echo $i > progress.tmp; mv progress.tmp progress; \
    done";

fn progress(mount: &Path) -> u64 {
    std::fs::read_to_string(mount.join("progress"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_from_the_manifest_a_pod_keeps_writing_while_the_manager_is_replaced() {
    let _turn = OXHORN_SYSTEM.lock().await;
    let installed = Installed::install().await;
    let node = installed.node.name().to_string();

    for app in [
        "oxhorn-instance-manager",
        "oxhorn-manager",
        "oxhorn-csi-controller",
        "oxhorn-snapshot-controller",
    ] {
        installed
            .until(&format!("{app} Ready"), || installed.ready_pod(app))
            .await;
    }
    let csinodes: Api<CSINode> = Api::all(installed.client());
    installed
        .until("the kubelet lists the driver", || async {
            let csinode = csinodes.get_opt(&node).await.ok()??;
            csinode
                .spec
                .drivers
                .iter()
                .any(|d| d.name == DRIVER_NAME)
                .then_some(())
        })
        .await;
    let accounts: Api<ServiceAccount> = Api::namespaced(installed.client(), installed.users.name());
    installed
        .until("the users' default ServiceAccount", || async {
            accounts.get_opt("default").await.ok()?.map(drop)
        })
        .await;

    // A claim on the default StorageClass: three replicas.
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": CLAIM},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "64Mi"}},
        },
    }))
    .unwrap();
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(installed.client(), installed.users.name());
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let write = format!(
        "set -e; dd if=/dev/urandom of={MOUNT}/file bs=4096 count=256; \
         sha256sum {MOUNT}/file > {MOUNT}/file.sha256; sync"
    );
    let phase = installed.run_pod("first-writer", &write).await;
    assert_eq!(
        phase,
        "Succeeded",
        "the first writer failed\n{}",
        installed.logs()
    );
    installed.report(&format!(
        "from kubectl apply to a pod's write on its volume: {:.1?}",
        installed.applied.elapsed()
    ));
    let replicas = installed
        .cluster
        .api::<Replica>()
        .list(&Default::default())
        .await
        .unwrap();
    let mut replica_nodes: Vec<String> = replicas
        .iter()
        .map(|r| r.spec.instance.node_id.clone())
        .collect();
    replica_nodes.sort();
    replica_nodes.dedup();
    assert_eq!(replica_nodes.len(), NODES, "replicas on {replica_nodes:?}");

    // A pod keeps writing while the manager's pod is deleted and replaced.
    let pods = installed.pods();
    let writer: Pod = serde_json::from_value(installed.pod_on_claim("writer", WRITER)).unwrap();
    pods.create(&PostParams::default(), &writer).await.unwrap();
    installed
        .until("the writer running", || async {
            pods.get("writer").await.ok().filter(is_ready).map(drop)
        })
        .await;
    let mount = installed.mount_of("writer").await;
    installed
        .until("the writer's first rounds", || async {
            (progress(&mount) >= 10).then_some(())
        })
        .await;
    let old = installed.ready_pod("oxhorn-manager").await.unwrap();
    let manager_pods: Api<Pod> = Api::namespaced(installed.client(), NAMESPACE);
    manager_pods
        .delete(&old.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    installed
        .until("the old manager pod gone", || async {
            let pod = manager_pods.get_opt(&old.name_any()).await.ok()?;
            pod.filter(|p| p.uid() == old.uid()).is_none().then_some(())
        })
        .await;
    let at_gone = progress(&mount);
    let new = installed
        .until("a new manager pod Ready", || async {
            installed
                .ready_pod("oxhorn-manager")
                .await
                .filter(|p| p.uid() != old.uid())
        })
        .await;
    let at_ready = progress(&mount);
    assert!(
        at_ready > at_gone,
        "no write completed between the old manager's end and the new one's start"
    );
    installed
        .until("more rounds after the new manager", || async {
            (progress(&mount) >= at_ready + 20).then_some(())
        })
        .await;
    std::fs::write(mount.join("stop"), b"").unwrap();
    let phase = installed
        .until("the writer finished", || async {
            let phase = pods.get("writer").await.ok()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        })
        .await;
    assert_eq!(
        phase,
        "Succeeded",
        "a write failed while manager pod {} was replaced by {}\n{}",
        old.name_any(),
        new.name_any(),
        installed.logs()
    );
    pods.delete("writer", &DeleteParams::default())
        .await
        .unwrap();
    installed
        .until("the writer gone", || async {
            pods.get_opt("writer").await.ok()?.is_none().then_some(())
        })
        .await;

    let read = format!("set -e; cd {MOUNT}; sha256sum -c file.sha256; sha256sum -c sums");
    let phase = installed.run_pod("reader", &read).await;
    assert_eq!(
        phase,
        "Succeeded",
        "the reader did not find what the writers left\n{}",
        installed.logs()
    );

    claims
        .delete(CLAIM, &DeleteParams::default())
        .await
        .unwrap();
    installed
        .until(
            "every PV, attachment and oxhorn volume object gone",
            || async { installed.leftovers().await.is_empty().then_some(()) },
        )
        .await;
    let client = installed.client();
    let host_nodes: Vec<String> = installed
        .cluster
        .nodes
        .iter()
        .map(|n| n.node_id().to_string())
        .collect();
    drop(installed);
    for name in host_nodes.iter().chain([&node]) {
        delete_kube_node(&client, name).await.unwrap();
    }
}
