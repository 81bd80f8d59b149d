//! A volume's life through Kubernetes' own CSI machinery: the real
//! csi-provisioner, csi-attacher, csi-resizer, csi-snapshotter,
//! snapshot-controller and kube-controller-manager's PersistentVolume
//! controllers drive three `oxhorn manager` nodes. The test plays the two
//! parts that need a real node: the attach-detach controller (it creates the
//! VolumeAttachment) and the kubelet (it stages, publishes and expands
//! through the first node's CSI socket). What a user notices: a claim gets a
//! bound volume with its replicas on distinct nodes, a pod's files land on
//! it, it grows, a snapshot restores the files into a new claim, so does a
//! backup taken through a VolumeSnapshot of a backup class, and deleting it
//! all leaves nothing behind, no block in the backup store either.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, Resource, ResourceExt};
use oxhorn::csi::DRIVER_NAME;
use oxhorn::types::{Backup, BackupTarget, Engine, Replica, Snapshot, Volume};
use oxhorn_testbed::kubelet::{self, Kubelet, Published};
use oxhorn_testbed::sidecars::{self, Sidecars};
use oxhorn_testbed::{self as testbed, TestNamespace};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::common::{Cluster, MIB, eventually, require_root};

const PATIENCE: Duration = Duration::from_secs(120);
const NODES: usize = 3;
/// The managers' default: the sidecars and three managers keep the test
/// machine busy, and a node must not lose its objects to a late renewal.
const LEASE_SECONDS: u64 = 15;
const STORAGE_CLASS: &str = "oxhorn-two-replicas";
const SNAPSHOT_CLASS: &str = "oxhorn-snapshots";
const SNAPSHOT: &str = "data-snap";
/// A class whose snapshots are backups, into the BackupTarget `default`.
const BACKUP_CLASS: &str = "oxhorn-backups";
const BACKUP: &str = "data-backup";
const FILE: &str = "hello.txt";
const CONTENT: &[u8] = b"written through a PVC\n";

/// Three nodes, the sidecars on the first node's socket, oxhorn's objects in
/// the cluster's namespace and the users' claims in another.
struct CsiCluster {
    // Dropped in this order: mounts, then the sidecars, then the nodes and
    // oxhorn's namespace, then the users' namespace.
    kubelet: Kubelet,
    sidecars: Sidecars,
    cluster: Cluster,
    users: TestNamespace,
    /// Where the volumes attach: the node whose socket the sidecars use.
    node: String,
    started: Instant,
}

impl CsiCluster {
    async fn start() -> Self {
        require_root();
        let started = Instant::now();
        let control_plane = testbed::shared();
        sidecars::apply_snapshot_crds(control_plane).await.unwrap();
        let mut cluster = Cluster::start_with_lease("oxhorn", NODES, LEASE_SECONDS).await;
        let users = TestNamespace::create(control_plane, "users").await.unwrap();
        for node in &cluster.nodes {
            sidecars::register_csi_node(&cluster.client, node.node_id(), &[])
                .await
                .unwrap();
        }
        let node = cluster.nodes[0].node_id().to_owned();
        let socket = cluster.nodes[0].connect(PATIENCE).await.unwrap();
        let sidecars =
            Sidecars::start(control_plane.kubeconfig(), cluster.nodes[0].socket()).unwrap();
        let kubelet = Kubelet::new(socket).unwrap();
        let cluster = Self {
            kubelet,
            sidecars,
            cluster,
            users,
            node,
            started,
        };
        cluster.report("cluster and sidecars started");
        cluster
    }

    fn report(&self, what: &str) {
        eprintln!("[{:>6.1?}] {what}", self.started.elapsed());
    }

    fn client(&self) -> Client {
        self.cluster.client.clone()
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client(), self.users.name())
    }

    fn snapshots(&self) -> Api<DynamicObject> {
        let resource = snapshot_resource("VolumeSnapshot", "volumesnapshots");
        Api::namespaced_with(self.client(), self.users.name(), &resource)
    }

    fn logs(&self) -> String {
        let managers: String = self
            .cluster
            .nodes
            .iter()
            .map(|n| format!("==== {} ====\n{}\n", n.node_id(), tail(&n.log(), 40)))
            .collect();
        format!("{}{managers}", self.sidecars.logs(40))
    }

    /// Waits until `check` returns Some; fails the test with the logs after
    /// PATIENCE, or at once when a sidecar exits.
    async fn until<T, F, Fut>(&mut self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let step = Instant::now();
        let sidecars = &mut self.sidecars;
        let outcome = eventually(PATIENCE, || {
            let running = sidecars.check_running();
            let checked = check();
            async move {
                match running {
                    Ok(()) => checked.await.map(Ok),
                    Err(exited) => Some(Err(exited)),
                }
            }
        })
        .await;
        match outcome {
            Ok(Ok(value)) => {
                self.report(&format!("{what} after {:.1?}", step.elapsed()));
                value
            }
            Ok(Err(exited)) => panic!("waiting for {what}: {exited}\n{}", self.logs()),
            Err(e) => panic!("{e} waiting for {what}\n{}", self.logs()),
        }
    }

    async fn create_storage_classes(&self) {
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": DRIVER_NAME,
            // xfs: it grows online here; ext4's online grow needs
            // CAP_SYS_RESOURCE, which this test machine withholds.
            "parameters": {"numberOfReplicas": "2", "staleReplicaTimeout": "30", "fsType": "xfs"},
            "allowVolumeExpansion": true,
        }))
        .unwrap();
        Api::<StorageClass>::all(self.client())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        let resource = snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses");
        let snapshot_class = DynamicObject::new(SNAPSHOT_CLASS, &resource)
            .data(json!({"driver": DRIVER_NAME, "deletionPolicy": "Delete"}));
        let classes = Api::<DynamicObject>::all_with(self.client(), &resource);
        classes
            .create(&PostParams::default(), &snapshot_class)
            .await
            .unwrap();
        let backup_class = DynamicObject::new(BACKUP_CLASS, &resource).data(json!({
            "driver": DRIVER_NAME, "deletionPolicy": "Delete", "parameters": {"type": "backup"}
        }));
        classes
            .create(&PostParams::default(), &backup_class)
            .await
            .unwrap();
    }

    /// Claims `size` of the storage class, from `data_source` if any, and
    /// returns the PersistentVolume it is bound to.
    async fn claim(
        &mut self,
        name: &str,
        size: &str,
        data_source: Option<serde_json::Value>,
    ) -> PersistentVolume {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORAGE_CLASS,
                "resources": {"requests": {"storage": size}},
                "dataSource": data_source,
            },
        }))
        .unwrap();
        let claims = self.claims();
        claims.create(&PostParams::default(), &claim).await.unwrap();
        let volume_name = self
            .until(&format!("PVC {name} bound"), || async {
                let claim = claims.get(name).await.ok()?;
                let bound = claim.status.as_ref()?.phase.as_deref() == Some("Bound");
                bound.then_some(claim.spec?.volume_name?)
            })
            .await;
        let pvs: Api<PersistentVolume> = Api::all(self.client());
        pvs.get(&volume_name).await.unwrap()
    }

    /// Attaches the volume of `pv` to the first node as the attach-detach controller
    /// would, and waits for csi-attacher to report it attached.
    async fn attach(&mut self, pv: &PersistentVolume) -> VolumeAttachment {
        let node = self.node.clone();
        let name = kubelet::attachment_name(&pv.name_any(), &node);
        let attachment = kubelet::volume_attachment(&pv.name_any(), &node);
        let attachments: Api<VolumeAttachment> = Api::all(self.client());
        attachments
            .create(&PostParams::default(), &attachment)
            .await
            .unwrap();
        self.until(&format!("{} attached to {node}", pv.name_any()), || async {
            let attachment = attachments.get(&name).await.ok()?;
            let attached = attachment.status.as_ref()?.attached;
            attached.then_some(attachment)
        })
        .await
    }

    async fn detach(&mut self, pv: &PersistentVolume) {
        let name = kubelet::attachment_name(&pv.name_any(), &self.node);
        let attachments: Api<VolumeAttachment> = Api::all(self.client());
        attachments
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        self.until(&format!("{} detached", pv.name_any()), || async {
            attachments
                .get_opt(&name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }

    /// The oxhorn Volume behind `pv`, once its replicas are placed: their
    /// nodes.
    async fn replica_nodes(&mut self, pv: &PersistentVolume) -> (Volume, Vec<String>) {
        let volume_id = volume_id(pv);
        let volumes = self.cluster.api::<Volume>();
        let replicas = self.cluster.api::<Replica>();
        self.until(
            &format!("Volume {volume_id} has its replicas placed"),
            || async {
                let volume = volumes.get_opt(&volume_id).await.ok()??;
                let nodes: Vec<String> = replicas
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|r| r.spec.instance.volume_name == volume_id)
                    .map(|r| r.spec.instance.node_id)
                    .collect();
                let placed = nodes.len() == volume.spec.number_of_replicas as usize
                    && nodes.iter().all(|n| !n.is_empty());
                placed.then_some((volume, nodes))
            },
        )
        .await
    }

    /// Every PV and VolumeSnapshotContent, and every oxhorn object: what
    /// must be gone once the claims and snapshots are.
    async fn leftovers(&self) -> Vec<String> {
        let contents = snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents");
        [
            names(Api::<PersistentVolume>::all(self.client())).await,
            names(Api::<DynamicObject>::all_with(self.client(), &contents)).await,
            names(self.cluster.api::<Volume>()).await,
            names(self.cluster.api::<Engine>()).await,
            names(self.cluster.api::<Replica>()).await,
            names(self.cluster.api::<Snapshot>()).await,
            names(self.cluster.api::<Backup>()).await,
        ]
        .concat()
    }
}

/// Every object of `api`, as kind/name.
async fn names<K>(api: Api<K>) -> Vec<String>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let list = api.list(&Default::default()).await.unwrap();
    list.items
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                list.types.kind.trim_end_matches("List"),
                o.name_any()
            )
        })
        .collect()
}

pub(crate) fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind);
    ApiResource::from_gvk_with_plural(&gvk, plural)
}

fn volume_id(pv: &PersistentVolume) -> String {
    let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
    csi.map(|c| c.volume_handle.clone()).unwrap_or_default()
}

fn capacity(pv: &PersistentVolume) -> i64 {
    let capacity = pv.spec.as_ref().and_then(|s| s.capacity.as_ref());
    capacity.and_then(|c| c.get("storage")).map_or(0, bytes)
}

/// A storage quantity in bytes: plain, or with a binary suffix.
fn bytes(quantity: &Quantity) -> i64 {
    let text = quantity.0.as_str();
    let suffixes = [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40)];
    for (suffix, shift) in suffixes {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<i64>().unwrap() << shift;
        }
    }
    text.parse().unwrap()
}

/// The size of the filesystem mounted at `path`.
fn filesystem_size(path: &Path) -> i64 {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    (stat.blocks() * stat.fragment_size()) as i64
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes the file through the mount and makes it durable on the volume.
/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flat_map(|entry| {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

fn write_file(dir: &Path) {
    let path = dir.join(FILE);
    std::fs::write(&path, CONTENT).unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    let root = std::fs::File::open(dir).unwrap();
    nix::unistd::syncfs(&root).unwrap();
}

/// A 320Mi claim of the StorageClass: bound, its volume's two replicas on
/// distinct nodes.
async fn provision(cluster: &mut CsiCluster) -> PersistentVolume {
    let pv = cluster.claim("data", "320Mi", None).await;
    assert_eq!(capacity(&pv), 320 * MIB, "the PV has the claimed size");
    let (volume, nodes) = cluster.replica_nodes(&pv).await;
    assert_eq!(volume.spec.number_of_replicas, 2, "from the StorageClass");
    let distinct: BTreeSet<&String> = nodes.iter().collect();
    assert_eq!(distinct.len(), 2, "replicas on distinct nodes: {nodes:?}");
    pv
}

/// Attaches and mounts `pv` on the first node, as for a pod.
async fn attach_and_publish(cluster: &mut CsiCluster, pv: &PersistentVolume) -> Published {
    let attachment = cluster.attach(pv).await;
    let published = cluster.kubelet.publish(pv, &attachment).await.unwrap();
    let node = &cluster.node;
    cluster.report(&format!("{} staged and published on {node}", pv.name_any()));
    published
}

/// Grows the claim to 384Mi: csi-resizer grows the volume and the PV, the
/// kubelet the filesystem. A failed filesystem grow is returned rather than
/// raised, so that the steps after it still run.
async fn grow(
    cluster: &mut CsiCluster,
    pv: &PersistentVolume,
    published: &Published,
) -> Option<String> {
    let before = filesystem_size(&published.target);
    let grow = json!({"spec": {"resources": {"requests": {"storage": "384Mi"}}}});
    cluster
        .claims()
        .patch("data", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(cluster.client());
    let pv_name = pv.name_any();
    cluster
        .until("the PV grown to 384Mi", || async {
            let pv = pvs.get(&pv_name).await.ok()?;
            (capacity(&pv) == 384 * MIB).then_some(())
        })
        .await;
    if let Err(error) = cluster.kubelet.expand(published, 384 * MIB).await {
        let failure = format!("online xfs grow failed: {error}");
        eprintln!("FAILED: {failure}");
        return Some(failure);
    }
    let after = filesystem_size(&published.target);
    cluster.report(&format!("filesystem grown from {before} to {after} bytes"));
    (after < before + 48 * MIB)
        .then(|| format!("the filesystem did not grow: {before} -> {after} bytes"))
}

/// Snapshots the claim with `class` into VolumeSnapshot `name` and
/// restores it into the new claim `into`, attached and mounted on the
/// first node.
async fn snapshot_and_restore(
    cluster: &mut CsiCluster,
    class: &str,
    name: &str,
    into: &str,
) -> (PersistentVolume, Published) {
    let resource = snapshot_resource("VolumeSnapshot", "volumesnapshots");
    let snapshot = DynamicObject::new(name, &resource).data(json!({"spec": {
        "volumeSnapshotClassName": class,
        "source": {"persistentVolumeClaimName": "data"},
    }}));
    let snapshots = cluster.snapshots();
    snapshots
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap();
    cluster
        .until(&format!("VolumeSnapshot {name} readyToUse"), || async {
            let snapshot = snapshots.get(name).await.ok()?;
            let ready = snapshot.data.pointer("/status/readyToUse")?.as_bool()?;
            ready.then_some(())
        })
        .await;
    let source = json!({
        "apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot",
        "name": name,
    });
    let pv = cluster.claim(into, "384Mi", Some(source)).await;
    let published = attach_and_publish(cluster, &pv).await;
    (pv, published)
}

/// A BackupTarget `default` in a directory of the test's, for the backup
/// class.
async fn create_backup_target(cluster: &CsiCluster, dir: &Path) {
    let target = BackupTarget::new(
        "default",
        serde_json::from_value(json!({"backupTargetURL": format!("file://{}", dir.display())}))
            .unwrap(),
    );
    cluster
        .cluster
        .api::<BackupTarget>()
        .create(&PostParams::default(), &target)
        .await
        .unwrap();
}

/// Unmounts and detaches the volumes, deletes the snapshot and the claims,
/// and waits until nothing of the driver's or oxhorn's is left.
async fn delete_all(cluster: &mut CsiCluster, volumes: Vec<(PersistentVolume, Published)>) {
    for (pv, published) in volumes {
        cluster.kubelet.unpublish(published).await.unwrap();
        cluster.detach(&pv).await;
    }
    for snapshot in [SNAPSHOT, BACKUP] {
        cluster
            .snapshots()
            .delete(snapshot, &DeleteParams::default())
            .await
            .unwrap();
    }
    let claims = cluster.claims();
    for claim in ["restored", "from-backup", "data"] {
        claims
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
    }
    let gone = eventually(PATIENCE, || async {
        cluster.leftovers().await.is_empty().then_some(())
    })
    .await;
    if let Err(e) = gone {
        let left = cluster.leftovers().await;
        panic!("{e}: left behind: {left:?}\n{}", cluster.logs());
    }
    cluster.report("every PV, VolumeSnapshotContent and oxhorn object gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_provisioned_attached_grown_snapshotted_restored_and_deleted() {
    let mut cluster = CsiCluster::start().await;
    cluster.create_storage_classes().await;

    let pv = provision(&mut cluster).await;
    let published = attach_and_publish(&mut cluster, &pv).await;
    write_file(&published.target);
    assert_eq!(std::fs::read(published.target.join(FILE)).unwrap(), CONTENT);

    let grow_failure = grow(&mut cluster, &pv, &published).await;

    let (restored_pv, restored) =
        snapshot_and_restore(&mut cluster, SNAPSHOT_CLASS, SNAPSHOT, "restored").await;
    assert_eq!(
        std::fs::read(restored.target.join(FILE)).unwrap(),
        CONTENT,
        "the restored claim holds the file written before the snapshot"
    );

    let backups = tempfile::tempdir().unwrap();
    create_backup_target(&cluster, backups.path()).await;
    let (from_backup_pv, from_backup) =
        snapshot_and_restore(&mut cluster, BACKUP_CLASS, BACKUP, "from-backup").await;
    assert_eq!(
        std::fs::read(from_backup.target.join(FILE)).unwrap(),
        CONTENT,
        "the claim restored from the backup holds the file written before it"
    );

    let volumes = vec![
        (from_backup_pv, from_backup),
        (restored_pv, restored),
        (pv, published),
    ];
    delete_all(&mut cluster, volumes).await;
    let blocks = backups.path().join("volumes");
    let left: Vec<_> = walk(&blocks)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect();
    assert!(left.is_empty(), "blocks left in the store: {left:?}");
    assert_eq!(grow_failure, None);
}
