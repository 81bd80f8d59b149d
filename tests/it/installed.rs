//! Oxhorn installed as a user installs it: `kubectl apply` of the manifest
//! (`oxhorn manifest` for this node's directories) on a real kubelet node
//! whose containerd runs the images hack/build-image.sh built, and two more
//! beside it: the default StorageClass's three replicas have three real
//! nodes.
//!
//! What the test bed changes in the manifest: [`testbed::install`].
//!
//! Those changes are only where the test bed differs from a real cluster:
//! the API server's address in each container, as without kube-proxy;
//! loopback data and probe addresses; the pods kept on the kubelet nodes, the
//! Deployments on the first; a copy of each DaemonSet per kubelet node, for
//! its directories and address, since the nodes share one host; the
//! namespaces the manager joins as the host's, since this machine's pid 1 is
//! out of reach. kube-scheduler and kube-controller-manager (with its
//! default controllers but node lifecycle, which would judge the manager-only
//! nodes of the other tests sharing the control plane) run beside them; the
//! main job runs node lifecycle too (tests/it/local_cluster.rs).
//!
//! The first test waits for the DaemonSets' pods to be Ready on every node,
//! the Deployments' pods, and every kubelet to list the driver. Before
//! anything else, 36 `kubectl auth can-i --as` rows check each part's
//! ServiceAccount: it may do what its part does and nothing it never does
//! (no Secret outside its own, no workload, no other namespace's Leases). A
//! pod writes through a claim on the default StorageClass (three replicas on
//! three nodes); then a pod keeps writing (each round synced, with
//! checksums) while the manager on its node goes: its DaemonSet is deleted
//! (the pod orphaned), then its pod, and the writer completes 100 more rounds
//! with no manager on the node before the manifest is applied again and a
//! new manager pod is Ready, given the Secret `oxhorn-api-tls` meanwhile:
//! it serves its API over TLS with that certificate, and plain HTTP gets
//! no answer. The pod sees no error; a reader on another
//! kubelet node, where the volume moves, checks every checksum; deleting the
//! claim leaves no PV, attachment or oxhorn object, and no replica data on
//! any node.
//!
//! The second scales a StatefulSet of three (each pod with a claim of its
//! own) down to one, its claims and volumes going with the pods, and up to
//! two, the new pod on a fresh volume; then grows a claim by 100 MiB while
//! its pod runs and waits for the pod's filesystem to grow (xfs: this
//! machine withholds the capability ext4's online growth needs). Last, a pod
//! with a generic ephemeral volume on the default class writes and checks
//! its file on an ext4 of its own, and its claim and PV go with it.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use oxhorn::csi::DRIVER_NAME;
use oxhorn::types::{Replica, Volume};
use oxhorn_testbed::install::{Installation, NAMESPACE};
use oxhorn_testbed::sidecars::Sidecars;
use oxhorn_testbed::{self as testbed, KubeletNode, TestNamespace, delete_kube_node};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{
    API_PORT, Cluster, Steps, next_subnet, one_shot_pod, require_root, run_to_completion,
};
use crate::install::OXHORN_SYSTEM;

pub(crate) const PATIENCE: Duration = Duration::from_secs(240);
pub(crate) const CLAIM: &str = "data";
pub(crate) const MOUNT: &str = "/data";
/// The kubelet nodes, all the cluster's.
const NODES: usize = 3;

/// The installed product and everything it runs on. Dropped in field
/// order: the users' namespace, oxhorn-system, the cluster-wide objects,
/// the cluster's controllers, the kubelet nodes.
pub(crate) struct Installed {
    pub(crate) users: TestNamespace,
    pub(crate) cluster: Cluster,
    pub(crate) installation: Installation,
    controllers: Sidecars,
    pub(crate) kubelets: Vec<KubeletNode>,
    /// Each kubelet node's manager address, in order.
    addresses: Vec<IpAddr>,
    steps: Steps,
}

impl Drop for Installed {
    /// Before the fields go (the users' and oxhorn-system's pods are
    /// deleted first, their containers killed), the node lets go of its
    /// volumes' loop devices while it can still tell them.
    fn drop(&mut self) {
        for node in &self.kubelets {
            node.release_loop_devices();
        }
    }
}

impl Installed {
    pub(crate) async fn install() -> Self {
        require_root();
        let steps = Steps::start();
        let control_plane = testbed::shared();
        testbed::sidecars::apply_snapshot_crds(control_plane)
            .await
            .unwrap();
        let first = KubeletNode::start(control_plane, "installed-kubelet-1")
            .await
            .unwrap();
        let mut kubelets = vec![first];
        for i in 2..=NODES {
            let name = format!("installed-kubelet-{i}");
            let node = KubeletNode::start_beside(control_plane, &name, &kubelets[0])
                .await
                .unwrap();
            kubelets.push(node);
        }
        for node in &kubelets {
            node.import_product_images().unwrap();
        }
        let controllers = Sidecars::start_cluster_beside_tests(control_plane).unwrap();
        steps.report("kubelet nodes and cluster controllers up");
        // The nodes of the cluster below, their addresses 127.0.subnet.i.
        let subnet = next_subnet();
        let nodes: Vec<(&KubeletNode, IpAddr)> = (1..)
            .zip(&kubelets)
            .map(|(i, node)| (node, IpAddr::from([127, 0, subnet, i])))
            .collect();
        let addresses = nodes.iter().map(|(_, address)| *address).collect();
        // (install::every_object_is_accepted_by_the_api_server dry-runs it.)
        let installation = Installation::apply(control_plane, &nodes).await.unwrap();
        steps.report("manifest applied");

        let cluster = Cluster::join_installed(
            TestNamespace::adopt(control_plane, NAMESPACE),
            NODES,
            NODES,
            subnet,
        )
        .await;
        let users = TestNamespace::create(control_plane, "installed-users")
            .await
            .unwrap();
        Self {
            users,
            cluster,
            installation,
            controllers,
            kubelets,
            addresses,
            steps,
        }
    }

    /// Waits until every workload of the manifest is Ready (the
    /// DaemonSets' on every node), every kubelet lists the driver and the
    /// users' namespace has its default ServiceAccount (pods are refused
    /// before).
    pub(crate) async fn until_running(&self) {
        for node in &self.kubelets {
            for app in ["oxhorn-instance-manager", "oxhorn-manager"] {
                self.until(&format!("{app} Ready on {}", node.name()), || {
                    self.ready_pod_on(app, node.name())
                })
                .await;
            }
        }
        for app in ["oxhorn-csi-controller", "oxhorn-snapshot-controller"] {
            self.until(&format!("{app} Ready"), || self.ready_pod(app))
                .await;
        }
        let csinodes: Api<CSINode> = Api::all(self.client());
        for node in self.kubelets.iter().map(KubeletNode::name) {
            self.until(
                &format!("the kubelet of {node} lists the driver"),
                || async {
                    let csinode = csinodes.get_opt(node).await.ok()??;
                    let drivers = &csinode.spec.drivers;
                    drivers.iter().any(|d| d.name == DRIVER_NAME).then_some(())
                },
            )
            .await;
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), self.users.name());
        self.until("the users' default ServiceAccount", || async {
            accounts.get_opt("default").await.ok()?.map(drop)
        })
        .await;
    }

    /// Waits until the users' volumes are all gone (no PV, attachment or
    /// oxhorn volume object left), then stops it all and removes the
    /// Kubernetes Nodes.
    pub(crate) async fn stop(self) {
        self.until(
            "every PV, attachment and oxhorn volume object gone",
            || async {
                self.cluster
                    .volume_leftovers()
                    .await
                    .is_empty()
                    .then_some(())
            },
        )
        .await;
        let client = self.client();
        let mut nodes: Vec<String> = self
            .cluster
            .nodes
            .iter()
            .map(|n| n.node_id().to_string())
            .collect();
        nodes.extend(self.kubelets.iter().map(|n| n.name().to_string()));
        drop(self);
        for name in nodes {
            delete_kube_node(&client, &name).await.unwrap();
        }
    }

    pub(crate) fn report(&self, what: &str) {
        self.steps.report(what);
    }

    /// The first kubelet node, where the users' pods run unless a test
    /// says otherwise.
    pub(crate) fn node(&self) -> &KubeletNode {
        &self.kubelets[0]
    }

    /// The second kubelet node.
    fn other_node(&self) -> &KubeletNode {
        &self.kubelets[1]
    }

    pub(crate) fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    pub(crate) fn logs(&self) -> String {
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
        let nodes: String = self
            .kubelets
            .iter()
            .map(|n| format!("{}\n{}\n", n.pod_logs(NAMESPACE, 40), n.logs(40)))
            .collect();
        format!(
            "{described}\n{nodes}{}\n{}",
            self.controllers.logs(20),
            self.cluster.logs()
        )
    }

    /// Waits until `check` returns Some, failing with every log after
    /// PATIENCE.
    pub(crate) async fn until<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        self.steps
            .until(what, PATIENCE, check, || self.logs())
            .await
    }

    /// The Secret `oxhorn-api-tls` the manifest mounts, with a certificate
    /// from `ca` for the first node's manager address.
    async fn create_api_certificate(&self, ca: &testbed::certs::Ca) {
        let address = self.addresses[0].to_string();
        let issued = ca.serving(&address, &[&address]).unwrap();
        let secret = serde_json::from_value(json!({
            "metadata": {"name": "oxhorn-api-tls"},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem},
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client(), NAMESPACE)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }

    /// Waits until the first node's manager answers its API over TLS with
    /// a certificate from `ca`; plain HTTP then gets no answer.
    async fn until_api_over_tls(&self, ca: &testbed::certs::Ca) {
        let at = std::net::SocketAddr::new(self.addresses[0], API_PORT);
        let host = self.addresses[0].to_string();
        let answer = self
            .until("the manager's API over TLS", || async {
                let answer = testbed::certs::https_get(at, ca.pem(), &host, "/v1/openapi.json");
                answer.await.ok()
            })
            .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut plain = tokio::net::TcpStream::connect(at).await.unwrap();
        plain
            .write_all(b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = plain.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            !answer.contains("HTTP/1.1"),
            "plain HTTP answered: {answer}"
        );
        self.report("the new manager serves its API over TLS");
    }

    pub(crate) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client(), self.users.name())
    }

    /// Creates the claim [`CLAIM`], 64 MiB on the default StorageClass
    /// (three replicas); the users' claims.
    pub(crate) async fn create_claim(&self) -> Api<PersistentVolumeClaim> {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": CLAIM},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "64Mi"}},
            },
        }))
        .unwrap();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client(), self.users.name());
        claims.create(&PostParams::default(), &claim).await.unwrap();
        claims
    }

    /// The ready pod of `app` (an oxhorn-system workload) on the first
    /// node.
    pub(crate) async fn ready_pod(&self, app: &str) -> Option<Pod> {
        self.ready_pod_on(app, self.node().name()).await
    }

    /// The ready pod of `app` (an oxhorn-system workload) on `node`.
    async fn ready_pod_on(&self, app: &str, node: &str) -> Option<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client(), NAMESPACE);
        let selector = format!("app.kubernetes.io/name={app}");
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        list.items.into_iter().find(|pod| {
            let on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            pod.metadata.deletion_timestamp.is_none() && is_ready(pod) && on == Some(node)
        })
    }

    /// A pod on the claim, on the first kubelet node, running `script`.
    fn pod_on_claim(&self, name: &str, script: &str) -> Value {
        self.pod_on_claim_at(name, script, self.node().name())
    }

    /// A pod on the claim, on `node`, running `script`.
    fn pod_on_claim_at(&self, name: &str, script: &str, node: &str) -> Value {
        let mut pod = one_shot_pod(name, script);
        let spec = &mut pod["spec"];
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": MOUNT}]);
        spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}]);
        pod
    }

    /// Runs a pod with `script` on the claim on `node` until it has
    /// finished and is gone; its phase.
    async fn run_pod(&self, name: &str, script: &str, node: &str) -> String {
        let step = Instant::now();
        let pod = self.pod_on_claim_at(name, script, node);
        match run_to_completion(&self.pods(), pod, PATIENCE).await {
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

    /// Starts a pod on the claim on the first node, running `script`, and
    /// waits until it runs; where the claim is mounted for it, on the host.
    pub(crate) async fn start_on_claim(&self, name: &str, script: &str) -> PathBuf {
        let pod: Pod = serde_json::from_value(self.pod_on_claim(name, script)).unwrap();
        let pods = self.pods();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        self.until(&format!("{name} running"), || async {
            pods.get(name).await.ok().filter(is_ready).map(drop)
        })
        .await;
        self.mount_of(name).await
    }

    /// Where the kubelet mounted the claim for the pod `name`, on the host.
    async fn mount_of(&self, name: &str) -> PathBuf {
        let pod = self.pods().get(name).await.unwrap();
        let uid = pod.uid().unwrap();
        let volumes = self
            .node()
            .kubelet_dir()
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi");
        let volume = std::fs::read_dir(&volumes).ok().and_then(|mut v| v.next());
        let mount = volume
            .and_then(Result::ok)
            .map(|pv| pv.path().join("mount"));
        mount.unwrap_or_else(|| {
            panic!(
                "no CSI volume of pod {name} in {}\n{}",
                volumes.display(),
                self.logs()
            )
        })
    }
}

/// Where each placed replica keeps its data.
pub(crate) fn replica_dirs(replicas: &[Replica]) -> Vec<PathBuf> {
    replicas
        .iter()
        .filter_map(oxhorn::controller::replica_data_dir)
        .collect()
}

pub(crate) fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What each part's ServiceAccount may do: its name and the arguments of
/// `kubectl auth can-i` (namespace oxhorn-system unless one is given), and
/// whether it is allowed. Each may do what its part does, and nothing it
/// never does, such as reading Secrets it does not own. The instance
/// manager runs without API access (its pod mounts no token; `default` is
/// its namespace's account).
const RBAC: &[(&str, bool)] = &[
    ("oxhorn-manager create volumes.oxhorn.io", true),
    (
        "oxhorn-manager patch engines.oxhorn.io --subresource=status",
        true,
    ),
    ("oxhorn-manager update leases.coordination.k8s.io", true),
    ("oxhorn-manager get secrets/oxhorn-data-plane-key", true),
    ("oxhorn-manager watch nodes", true),
    ("oxhorn-manager create events.events.k8s.io", true),
    // The volumes' CHAP Secrets, in oxhorn's namespace only.
    ("oxhorn-manager watch secrets", true),
    ("oxhorn-manager delete secrets", false),
    ("oxhorn-manager list secrets -n default", false),
    ("oxhorn-manager get secrets -n kube-system", false),
    ("oxhorn-manager create volumes.oxhorn.io -n default", false),
    ("oxhorn-manager update nodes", false),
    ("oxhorn-manager create pods", false),
    ("oxhorn-manager delete persistentvolumes", false),
    // The claims that choose their volumes' recurring jobs, anywhere.
    (
        "oxhorn-manager watch persistentvolumeclaims -n default",
        true,
    ),
    (
        "oxhorn-manager update persistentvolumeclaims -n default",
        false,
    ),
    // A support bundle's reads, for callers allowed them: the logs of its
    // namespace's pods only, events wherever a volume's are.
    ("oxhorn-manager get pods --subresource=log", true),
    (
        "oxhorn-manager get pods --subresource=log -n default",
        false,
    ),
    ("oxhorn-manager list daemonsets.apps -n default", false),
    ("oxhorn-manager list events -n default", true),
    ("oxhorn-csi-controller create persistentvolumes", true),
    (
        "oxhorn-csi-controller patch volumeattachments.storage.k8s.io --subresource=status",
        true,
    ),
    (
        "oxhorn-csi-controller patch persistentvolumeclaims --subresource=status -n default",
        true,
    ),
    (
        "oxhorn-csi-controller update volumesnapshotcontents.snapshot.storage.k8s.io",
        true,
    ),
    (
        "oxhorn-csi-controller update leases.coordination.k8s.io",
        true,
    ),
    ("oxhorn-csi-controller get secrets -n default", false),
    ("oxhorn-csi-controller get secrets", false),
    ("oxhorn-csi-controller create volumes.oxhorn.io", false),
    ("oxhorn-csi-controller delete pods -n default", false),
    (
        "oxhorn-csi-controller update leases.coordination.k8s.io -n kube-system",
        false,
    ),
    (
        "oxhorn-snapshot-controller update volumesnapshots.snapshot.storage.k8s.io -n default",
        true,
    ),
    (
        "oxhorn-snapshot-controller create volumesnapshotcontents.snapshot.storage.k8s.io",
        true,
    ),
    (
        "oxhorn-snapshot-controller list volumegroupsnapshots.groupsnapshot.storage.k8s.io",
        true,
    ),
    ("oxhorn-snapshot-controller get secrets", false),
    ("oxhorn-snapshot-controller create persistentvolumes", false),
    ("oxhorn-snapshot-controller update volumes.oxhorn.io", false),
    ("default get pods", false),
    ("default get volumes.oxhorn.io", false),
];

/// The rows of `rows` (as [`RBAC`]'s) the API server answers otherwise,
/// impersonating each account.
pub(crate) fn rbac_mismatches(rows: &[(&str, bool)]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (row, allowed) in rows {
        let mut words = row.split_whitespace();
        let account = words.next().unwrap();
        let user = format!("--as=system:serviceaccount:{NAMESPACE}:{account}");
        let mut args = vec!["auth", "can-i", user.as_str(), "-n", NAMESPACE];
        // A later -n wins.
        args.extend(words);
        let output = testbed::shared().kubectl(&args).unwrap();
        let answer = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if (answer == "yes") != *allowed {
            wrong.push(format!("{row}: {answer}"));
        }
    }
    wrong
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
    installed.until_running().await;
    let wrong = rbac_mismatches(RBAC);
    assert!(
        wrong.is_empty(),
        "RBAC not as the parts need:\n{}",
        wrong.join("\n")
    );
    installed.report(&format!("{} RBAC checks", RBAC.len()));

    // A claim on the default StorageClass: three replicas.
    let claims = installed.create_claim().await;
    let write = format!(
        "set -e; dd if=/dev/urandom of={MOUNT}/file bs=4096 count=256; \
         sha256sum {MOUNT}/file > {MOUNT}/file.sha256; sync"
    );
    let phase = installed
        .run_pod("first-writer", &write, installed.node().name())
        .await;
    assert_eq!(
        phase,
        "Succeeded",
        "the first writer failed\n{}",
        installed.logs()
    );
    installed.report(&format!(
        "from kubectl apply to a pod's write on its volume: {:.1?}",
        installed.installation.applied.elapsed()
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
    let data = replica_dirs(&replicas.items);
    assert!(data.iter().all(|dir| dir.exists()), "{data:?}");

    // A pod keeps writing while the manager's pod is deleted, and after
    // it is replaced.
    let mount = installed.start_on_claim("writer", WRITER).await;
    let pods = installed.pods();
    installed
        .until("the writer's first rounds", || async {
            (progress(&mount) >= 10).then_some(())
        })
        .await;
    // The node's manager goes, its DaemonSet first (the pod orphaned), so
    // that none replaces it until the DaemonSet is applied again: the
    // writer must go on with no manager on its node.
    let old = installed.ready_pod("oxhorn-manager").await.unwrap();
    let daemon_set = old.owner_references()[0].name.clone();
    let deleted = testbed::shared()
        .kubectl(&[
            "delete",
            "daemonset",
            &daemon_set,
            "-n",
            NAMESPACE,
            "--cascade=orphan",
        ])
        .unwrap();
    assert!(deleted.status.success(), "{deleted:?}");
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
    installed
        .until("rounds with no manager on the writer's node", || async {
            (progress(&mount) >= at_gone + 100).then_some(())
        })
        .await;
    assert!(
        installed.ready_pod("oxhorn-manager").await.is_none(),
        "a manager came back before its DaemonSet"
    );
    // Given a certificate, the new manager serves its API over TLS.
    let ca = testbed::certs::Ca::generate().unwrap();
    installed.create_api_certificate(&ca).await;
    installed.installation.apply_again().unwrap();
    let new = installed
        .until("a new manager pod Ready", || async {
            installed
                .ready_pod("oxhorn-manager")
                .await
                .filter(|p| p.uid() != old.uid())
        })
        .await;
    installed.until_api_over_tls(&ca).await;
    let at_ready = progress(&mount);
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

    // Read on the other kubelet node: the volume moves there.
    let read = format!("set -e; cd {MOUNT}; sha256sum -c file.sha256; sha256sum -c sums");
    let phase = installed
        .run_pod("reader", &read, installed.other_node().name())
        .await;
    assert_eq!(
        phase,
        "Succeeded",
        "the reader on {} did not find what the writers on {} left\n{}",
        installed.other_node().name(),
        installed.node().name(),
        installed.logs()
    );

    claims
        .delete(CLAIM, &DeleteParams::default())
        .await
        .unwrap();
    installed
        .until("the replicas' data gone from the nodes", || async {
            data.iter().all(|dir| !dir.exists()).then_some(())
        })
        .await;
    installed.stop().await;
}

const SET: &str = "web";
/// The StatefulSet's StorageClass: xfs, since this machine withholds the
/// capability ext4's online growth needs (CAP_SYS_RESOURCE) from all but
/// its init.
const XFS_CLASS: &str = "oxhorn-xfs";

fn xfs_class() -> Value {
    json!({
        "metadata": {"name": XFS_CLASS},
        "provisioner": DRIVER_NAME,
        "parameters": {"numberOfReplicas": "3", "fsType": "xfs"},
        "allowVolumeExpansion": true,
        "volumeBindingMode": "WaitForFirstConsumer",
    })
}

/// A StatefulSet of `replicas` busybox pods on the kubelet's node, each with
/// a claim of its own (xfs's smallest, 300 MiB), on which it notes its name
/// at each start; its claims go with its pods (scaled down or deleted).
fn stateful_set(node: &str, replicas: i32) -> Value {
    json!({
        "metadata": {"name": SET},
        "spec": {
            "replicas": replicas,
            "serviceName": SET,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": SET}},
            "persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Delete"},
            "template": {
                "metadata": {"labels": {"app": SET}},
                "spec": {
                    "hostNetwork": true,
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{
                        "name": "main",
                        "image": testbed::images::BUSYBOX,
                        "imagePullPolicy": "Never",
                        "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "command": ["/bin/sh", "-c",
                            "echo $POD >> /data/starts && sync && exec sleep 1000000"],
                        "volumeMounts": [{"name": "data", "mountPath": MOUNT}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": XFS_CLASS,
                    "resources": {"requests": {"storage": "300Mi"}},
                },
            }],
        },
    })
}

impl Installed {
    /// Waits until the StatefulSet's pods are exactly `names`, each Ready,
    /// and oxhorn holds one volume for each.
    async fn until_set_is(&self, names: &[&str]) {
        let pods = self.pods();
        let volumes = self.cluster.api::<Volume>();
        let what = format!("pods {names:?} Ready with a volume each");
        self.until(&what, || async {
            let list = pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            let mut ready: Vec<String> = list
                .iter()
                .filter(|p| is_ready(p))
                .map(|p| p.name_any())
                .collect();
            ready.sort();
            let count = volumes.list(&Default::default()).await.ok()?.items.len();
            (ready == names && list.items.len() == names.len() && count == names.len())
                .then_some(())
        })
        .await;
    }

    /// The names the pod noted on its volume at each start.
    async fn starts(&self, pod: &str) -> Vec<String> {
        let mount = self.mount_of(pod).await;
        let text = std::fs::read_to_string(mount.join("starts")).unwrap_or_default();
        text.lines().map(str::to_string).collect()
    }
}

/// The size of the filesystem mounted at `path`, in bytes.
fn filesystem_size(path: &Path) -> u64 {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    stat.blocks() * stat.fragment_size()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_a_stateful_set_scales_and_a_claim_grows_under_its_pod() {
    let _turn = OXHORN_SYSTEM.lock().await;
    let installed = Installed::install().await;
    installed.until_running().await;
    let node = installed.node().name().to_string();
    let classes: Api<StorageClass> = Api::all(installed.client());
    let class = serde_json::from_value(xfs_class()).unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
        Api::namespaced(installed.client(), installed.users.name());
    let set = serde_json::from_value(stateful_set(&node, 3)).unwrap();
    sets.create(&PostParams::default(), &set).await.unwrap();
    installed.until_set_is(&["web-0", "web-1", "web-2"]).await;
    for pod in ["web-0", "web-1", "web-2"] {
        assert_eq!(
            installed.starts(pod).await,
            [pod],
            "what {pod}'s volume holds"
        );
    }

    let scale = |replicas: i32| json!({"spec": {"replicas": replicas}});
    let params = kube::api::PatchParams::default();
    sets.patch(SET, &params, &kube::api::Patch::Merge(scale(1)))
        .await
        .unwrap();
    installed.until_set_is(&["web-0"]).await;
    sets.patch(SET, &params, &kube::api::Patch::Merge(scale(2)))
        .await
        .unwrap();
    installed.until_set_is(&["web-0", "web-1"]).await;
    assert_eq!(
        installed.starts("web-0").await,
        ["web-0"],
        "web-0 ran on undisturbed"
    );
    assert_eq!(
        installed.starts("web-1").await,
        ["web-1"],
        "web-1's claim went with it when scaled down: it starts on a new volume"
    );

    // The claim grows while its pod runs; the pod's filesystem with it.
    let mount = installed.mount_of("web-0").await;
    let before = filesystem_size(&mount);
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(installed.client(), installed.users.name());
    let grow = json!({"spec": {"resources": {"requests": {"storage": "400Mi"}}}});
    claims
        .patch("data-web-0", &params, &kube::api::Patch::Merge(grow))
        .await
        .unwrap();
    installed
        .until("the pod's filesystem grown by 100 MiB", || async {
            (filesystem_size(&mount) > before + 90 * (1 << 20)).then_some(())
        })
        .await;
    installed
        .until("the claim's capacity 400Mi", || async {
            let claim = claims.get("data-web-0").await.ok()?;
            let capacity = claim.status?.capacity?.get("storage")?.0.clone();
            (capacity == "400Mi").then_some(())
        })
        .await;
    let pod = installed.pods().get("web-0").await.unwrap();
    let restarts = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default();
    assert!(
        restarts.iter().all(|c| c.restart_count == 0),
        "web-0 restarted while its claim grew: {restarts:?}"
    );

    // A generic ephemeral volume: a claim made for the pod from its
    // template, on the default class, and gone with the pod.
    let scratch = "scratch";
    let pods = installed.pods();
    let pod = serde_json::from_value(ephemeral_pod(scratch, &node)).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let phase = installed
        .until("the ephemeral volume's pod finished", || async {
            let phase = pods.get(scratch).await.ok()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        })
        .await;
    assert_eq!(phase, "Succeeded", "{}", installed.logs());
    let claim = format!("{scratch}-data");
    let volume = claims.get(&claim).await.unwrap().spec.unwrap().volume_name;
    let volume = volume.expect("the ephemeral claim is bound");
    pods.delete(scratch, &DeleteParams::default())
        .await
        .unwrap();
    // The PV goes once the driver deleted its volume (reclaim policy Delete).
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(installed.client());
    installed
        .until("the ephemeral claim and its volume gone", || async {
            let claim_gone = claims.get_opt(&claim).await.ok()?.is_none();
            let volume_gone = pvs.get_opt(&volume).await.ok()?.is_none();
            (claim_gone && volume_gone).then_some(())
        })
        .await;

    sets.delete(SET, &DeleteParams::default()).await.unwrap();
    installed.stop().await;
}

/// A pod on `node` with a generic ephemeral volume on the default class:
/// it writes through it and checks it is an ext4 filesystem of its own. It
/// runs as a user other than root with an fsGroup, as most databases' pods
/// do: it can write only if the kubelet gave the volume to its group.
fn ephemeral_pod(name: &str, node: &str) -> Value {
    let script = format!(
        "set -e; grep -q ' {MOUNT} ext4 ' /proc/mounts; \
         test \"$(stat -c %g {MOUNT})\" = 2000; \
         dd if=/dev/urandom of={MOUNT}/file bs=4096 count=64; \
         sha256sum {MOUNT}/file > {MOUNT}/sum; sync; sha256sum -c {MOUNT}/sum"
    );
    let mut pod = one_shot_pod(name, &script);
    let spec = &mut pod["spec"];
    spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    spec["securityContext"] = json!({"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000});
    spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": MOUNT}]);
    spec["volumes"] = json!([{"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "64Mi"}}
    }}}}]);
    pod
}
