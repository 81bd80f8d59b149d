//! A user's flow on a real kubelet node: a StorageClass and a claim, a pod
//! that writes a file and its checksum through the volume, then another pod
//! on the same claim that finds them; deleting it all leaves nothing. The
//! kubelet, kube-scheduler, the attach-detach controller and the CSI
//! sidecars are the real programs; the managers run as host processes, the
//! first on the kubelet's node, registering the driver with it.
//!
//! Around the real node: kube-scheduler, kube-controller-manager's
//! attach-detach and PersistentVolume controllers, csi-provisioner and
//! csi-attacher, three managers (the first on the kubelet's node). A
//! WaitForFirstConsumer StorageClass and a claim; a pod writes a file and its
//! checksum through the volume (the kubelet stages and publishes it through
//! the manager), a second pod on the claim checks them, and deleting the
//! claim leaves no PV, VolumeAttachment or oxhorn object. The test bed
//! removes the kubelet's `not-ready` taint once its node is Ready, as the
//! node-lifecycle controller would; kube-controller-manager runs only the
//! controllers named above.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use oxhorn::csi::DRIVER_NAME;
use oxhorn_testbed::sidecars::Sidecars;
use oxhorn_testbed::{self as testbed, KubeletNode, TestNamespace, delete_kube_node};
use serde_json::json;

use crate::common::{Cluster, Steps, one_shot_pod, require_root, run_to_completion};

const PATIENCE: Duration = Duration::from_secs(180);
const STORAGE_CLASS: &str = "oxhorn-kubelet-flow";
const CLAIM: &str = "data";
const MOUNT: &str = "/data";

/// The real node, the managers, the sidecars and the users' namespace.
struct Flow {
    // Dropped in this order: the users' pods and claims first (their
    // namespace), then the sidecars, the managers, the kubelet node.
    users: TestNamespace,
    sidecars: Sidecars,
    cluster: Cluster,
    node: KubeletNode,
    steps: Steps,
}

impl Flow {
    async fn start() -> Self {
        require_root();
        let steps = Steps::start();
        let control_plane = testbed::shared();
        testbed::sidecars::apply_snapshot_crds(control_plane)
            .await
            .unwrap();
        let node = KubeletNode::start(control_plane, "kflow-kubelet")
            .await
            .unwrap();
        let cluster = Cluster::start_with_kubelet("kflow", 3, &node).await;
        let sidecars =
            Sidecars::start_for_kubelets(control_plane.kubeconfig(), cluster.nodes[0].socket())
                .unwrap();
        let users = TestNamespace::create(control_plane, "kflow-users")
            .await
            .unwrap();
        let flow = Self {
            users,
            sidecars,
            cluster,
            node,
            steps,
        };
        // Pods are refused until the service-account controller has given
        // the new namespace its `default` ServiceAccount.
        let accounts: Api<ServiceAccount> = Api::namespaced(flow.client(), flow.users.name());
        flow.until("the users' default ServiceAccount", || async {
            accounts.get_opt("default").await.ok()?.map(drop)
        })
        .await;
        flow.report("kubelet node, managers and sidecars started");
        flow
    }

    fn report(&self, what: &str) {
        self.steps.report(what);
    }

    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    fn logs(&self) -> String {
        let described = testbed::shared()
            .kubectl(&["describe", "pods,pvc", "-n", self.users.name()])
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        format!(
            "{described}\n{}\n{}\n{}",
            self.node.logs(40),
            self.sidecars.logs(30),
            self.cluster.logs()
        )
    }

    /// Waits until `check` returns Some, failing with every log after
    /// PATIENCE.
    async fn until<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.steps
            .until(what, PATIENCE, check, || self.logs())
            .await
    }

    async fn create_storage_class(&self) {
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": DRIVER_NAME,
            "parameters": {"numberOfReplicas": "3", "fsType": "ext4"},
            "volumeBindingMode": "WaitForFirstConsumer",
        }))
        .unwrap();
        let classes: Api<StorageClass> = Api::all(self.client());
        let _ = classes
            .delete(STORAGE_CLASS, &DeleteParams::default())
            .await;
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    /// Runs a pod with `script` on the claim, on the kubelet's node, until
    /// it has finished and is gone; its phase.
    async fn run_pod(&self, name: &str, script: &str) -> String {
        let mut pod = one_shot_pod(name, script);
        let spec = &mut pod["spec"];
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": self.node.name()});
        spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": MOUNT}]);
        spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}]);
        let pods: Api<Pod> = Api::namespaced(self.client(), self.users.name());
        let step = Instant::now();
        match run_to_completion(&pods, pod, PATIENCE).await {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_writes_through_a_claim_and_the_next_pod_reads_it() {
    let flow = Flow::start().await;
    let csinodes: Api<CSINode> = Api::all(flow.client());
    let node = flow.node.name().to_string();
    flow.until("the kubelet lists the driver", || async {
        let csinode = csinodes.get_opt(&node).await.ok()??;
        let listed = csinode.spec.drivers.iter().any(|d| d.name == DRIVER_NAME);
        listed.then_some(())
    })
    .await;
    flow.create_storage_class().await;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": CLAIM},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": "64Mi"}},
        },
    }))
    .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(flow.client(), flow.users.name());
    claims.create(&PostParams::default(), &claim).await.unwrap();

    let write = format!(
        "set -e; dd if=/dev/urandom of={MOUNT}/file bs=4096 count=256; \
         sha256sum {MOUNT}/file > {MOUNT}/file.sha256; sync"
    );
    let phase = flow.run_pod("writer", &write).await;
    assert_eq!(phase, "Succeeded", "the writer pod failed\n{}", flow.logs());
    let read = format!("set -e; cd {MOUNT} && sha256sum -c file.sha256");
    let phase = flow.run_pod("reader", &read).await;
    assert_eq!(
        phase,
        "Succeeded",
        "the reader pod did not find the file the writer left\n{}",
        flow.logs()
    );

    claims
        .delete(CLAIM, &DeleteParams::default())
        .await
        .unwrap();
    flow.until("every PV, attachment and oxhorn object gone", || async {
        flow.cluster
            .volume_leftovers()
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let classes: Api<StorageClass> = Api::all(flow.client());
    classes
        .delete(STORAGE_CLASS, &DeleteParams::default())
        .await
        .unwrap();
    let client = flow.client();
    drop(flow);
    delete_kube_node(&client, &node).await.unwrap();
}
