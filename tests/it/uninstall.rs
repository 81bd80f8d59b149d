//! Uninstalling Oxhorn as a user does (docs/install.md, "Uninstall"): the Job
//! of deploy/uninstall.yaml refuses while a volume holds data, until the
//! Setting deleting-confirmation-flag says "true"; then it takes every
//! volume away in order, and nothing is left on a finalizer or a node.
//!
//! The Job is applied while a pod holds a volume: it fails, its pod's
//! termination message naming the volume, its claim and node and the command
//! that confirms, and the pod, its file and the volume are untouched. After
//! `deleting-confirmation-flag` is set it completes, and the pod, the claim,
//! the PV, the attachment, every volume, engine, replica and snapshot
//! object, the replicas' data on all three nodes, the kubelet nodes' CSI
//! mounts, FUSE mounts and loop devices are gone; no remaining oxhorn object
//! holds a finalizer, and the Setting is `"false"` again. A volume attached
//! by hand through `spec.nodeID` goes too: the Job detaches it. 14
//! `kubectl auth can-i` rows check the Job's account.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use oxhorn::backup::target::open as open_target;
use oxhorn::types::{
    Backup, BackupState, BackupTarget, BackupVolume, DEFAULT_BACKUP_TARGET, Node, Replica, Setting,
    Snapshot, Volume, VolumeState,
};
use oxhorn_testbed::install::NAMESPACE;
use oxhorn_testbed::{
    self as testbed, MINIO_ACCESS_KEY, MINIO_SECRET_KEY, ObjectServer, ObjectServerKind,
    loop_devices_under, mounts_under,
};
use serde_json::json;

use crate::backup::{create_backup, create_target, secret};
use crate::common::MIB;
use crate::install::OXHORN_SYSTEM;
use crate::installed::{CLAIM, Installed, MOUNT, is_ready, rbac_mismatches, replica_dirs};
use crate::provisioning::snapshot_resource;

const JOB: &str = "oxhorn-uninstall";
const FLAG: &str = "deleting-confirmation-flag";
const BY_HAND: &str = "by-hand";

/// The uninstall Job's account may take volumes, their claims and pods
/// away, and nothing else.
const RBAC: &[(&str, bool)] = &[
    (
        "oxhorn-uninstall delete persistentvolumeclaims -n default",
        true,
    ),
    ("oxhorn-uninstall delete pods -n default", true),
    ("oxhorn-uninstall delete persistentvolumes", true),
    ("oxhorn-uninstall delete volumes.oxhorn.io", true),
    ("oxhorn-uninstall patch volumes.oxhorn.io", true),
    ("oxhorn-uninstall create settings.oxhorn.io", true),
    ("oxhorn-uninstall update settings.oxhorn.io", false),
    (
        "oxhorn-uninstall patch settings.oxhorn.io/deleting-confirmation-flag",
        true,
    ),
    (
        "oxhorn-uninstall patch settings.oxhorn.io/default-replica-count",
        false,
    ),
    ("oxhorn-uninstall get secrets", false),
    ("oxhorn-uninstall create pods -n default", false),
    ("oxhorn-uninstall delete nodes", false),
    (
        "oxhorn-uninstall delete volumes.oxhorn.io -n default",
        false,
    ),
    ("oxhorn-uninstall delete daemonsets.apps", false),
];

impl Installed {
    /// Applies the uninstall Job and waits until it ends; whether it
    /// succeeded, and its pod's termination message (empty on success).
    async fn run_uninstall(&self, file: &Path) -> (bool, String) {
        let file = file.to_str().unwrap();
        let applied = testbed::shared()
            .kubectl(&["apply", "--server-side", "-f", file])
            .unwrap();
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
        let jobs: Api<Job> = Api::namespaced(self.client(), NAMESPACE);
        let succeeded = self
            .until("the uninstall Job finished", || async {
                let conditions = jobs.get(JOB).await.ok()?.status?.conditions?;
                conditions
                    .iter()
                    .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
                    .map(|c| c.type_ == "Complete")
            })
            .await;
        let pods: Api<Pod> = Api::namespaced(self.client(), NAMESPACE);
        let selector = format!("app.kubernetes.io/name={JOB}");
        let message = self
            .until("the uninstall pod terminated", || async {
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?;
                let statuses = list.items.first()?.status.clone()?.container_statuses?;
                let terminated = statuses.first()?.state.clone()?.terminated?;
                // Only a failure's has the log's tail.
                Some(terminated.message.unwrap_or_default())
            })
            .await;
        (succeeded, message)
    }

    /// Deletes the Job and its pod, so that it can run again.
    async fn delete_uninstall(&self) {
        let jobs: Api<Job> = Api::namespaced(self.client(), NAMESPACE);
        jobs.delete(JOB, &DeleteParams::foreground()).await.unwrap();
        self.until("the uninstall Job gone", || async {
            jobs.get_opt(JOB).await.ok()?.is_none().then_some(())
        })
        .await;
    }

    /// What Oxhorn left on the nodes: replica data in `replica_dirs`, the
    /// kubelet nodes' CSI mounts, FUSE mounts and loop devices.
    fn node_leftovers(&self, replica_dirs: &[PathBuf]) -> Vec<String> {
        let mut left: Vec<String> = replica_dirs
            .iter()
            .filter(|dir| dir.exists())
            .map(|dir| format!("replica data {}", dir.display()))
            .collect();
        for node in &self.kubelets {
            let csi_mounts = mounts_under(&node.kubelet_dir()).into_iter().filter(|m| {
                let path = m.to_string_lossy();
                path.contains("kubernetes.io~csi") || path.contains("/plugins/kubernetes.io/csi/")
            });
            let run = node.host_dir("oxhorn-run").unwrap();
            left.extend(
                csi_mounts
                    .chain(mounts_under(&run))
                    .map(|m| format!("mount {}", m.display())),
            );
            let loops = loop_devices_under(&node.host_dir("").unwrap());
            left.extend(loops.iter().map(|n| format!("/dev/loop{n}")));
        }
        left
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_is_refused_while_a_volume_is_attached_and_once_confirmed_leaves_nothing() {
    let _turn = OXHORN_SYSTEM.lock().await;
    let installed = Installed::install().await;
    installed.until_running().await;
    let uninstall = installed.installation.uninstall_file().unwrap();

    // A pod holding a volume.
    let claims = installed.create_claim().await;
    let hold = format!("echo kept > {MOUNT}/file; sync; exec sleep 100000");
    let mount = installed.start_on_claim("holder", &hold).await;
    let pods = installed.pods();
    installed
        .until("the holder's file", || async {
            std::fs::read_to_string(mount.join("file")).ok()
        })
        .await;
    let volumes = installed.cluster.api::<Volume>();
    let volume = volumes.list(&Default::default()).await.unwrap().items;
    assert_eq!(volume.len(), 1);
    let volume = volume[0].name_any();

    // Unconfirmed: refused, naming the volume, its claim and node, and how
    // to confirm; nothing is touched.
    let (succeeded, message) = installed.run_uninstall(&uninstall).await;
    installed.report("the unconfirmed uninstall ended");
    assert!(!succeeded, "an unconfirmed uninstall ran: {message}");
    let expected = format!(
        "refusing to uninstall: 1 Oxhorn volume would be deleted with its data: \
         {volume} (claim {}/{CLAIM}, attached to node {})",
        installed.users.name(),
        installed.node().name()
    );
    assert!(
        message.contains(&expected),
        "{expected}\nnot in:\n{message}"
    );
    assert!(
        message.contains(&format!("patch settings.oxhorn.io {FLAG}")),
        "{message}"
    );
    let settings = installed.cluster.api::<Setting>();
    let flag = settings.get(FLAG).await.unwrap();
    assert_eq!(
        flag.spec.value, "false",
        "the refusal made the Setting to patch"
    );
    assert!(volumes.get_opt(&volume).await.unwrap().is_some());
    assert!(
        is_ready(&pods.get("holder").await.unwrap()),
        "the holder was disturbed"
    );
    assert_eq!(
        std::fs::read_to_string(mount.join("file")).unwrap(),
        "kept\n"
    );

    let wrong = rbac_mismatches(RBAC);
    assert!(wrong.is_empty(), "uninstall RBAC:\n{}", wrong.join("\n"));

    // A volume attached by hand (spec.nodeID), with no claim or CSI
    // attachment: uninstall detaches it, or its deletion would wait.
    let spec = json!({"size": 64 * MIB, "numberOfReplicas": 1, "nodeID": installed.node().name()});
    let by_hand = Volume::new(BY_HAND, serde_json::from_value(spec).unwrap());
    volumes
        .create(&PostParams::default(), &by_hand)
        .await
        .unwrap();
    installed
        .until("the volume attached by hand", || async {
            let status = volumes.get_opt(BY_HAND).await.ok()??.status?;
            (status.state == VolumeState::Attached).then_some(())
        })
        .await;

    // A backup of the volume, in a store the uninstall leaves alone.
    let store_dir = tempfile::tempdir().unwrap();
    let store = ObjectServer::start(ObjectServerKind::Minio, store_dir.path(), &[BUCKET]).unwrap();
    let credentials = minio_credentials(&store);
    let objects = open_target(TARGET_URL, "s3", &credentials).unwrap();
    take_backup(&installed, credentials, &volume).await;
    let csi_backup = take_csi_backup(&installed).await;

    // Confirmed: the pod, claim, volume and its data go.
    let replicas = installed.cluster.api::<Replica>();
    let replica_dirs = replica_dirs(&replicas.list(&Default::default()).await.unwrap().items);
    assert_eq!(replica_dirs.len(), 4);
    assert!(
        installed.node_leftovers(&[]).len() >= 2,
        "no loop device or CSI mount to see go"
    );
    settings
        .patch(
            FLAG,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"value": "true"}})),
        )
        .await
        .unwrap();
    installed.delete_uninstall().await;
    let (succeeded, message) = installed.run_uninstall(&uninstall).await;
    installed.report("the confirmed uninstall ended");
    assert!(
        succeeded,
        "the confirmed uninstall failed: {message}\n{}",
        installed.logs()
    );
    assert!(
        pods.get_opt("holder").await.unwrap().is_none(),
        "the holder is left"
    );
    assert!(
        claims.get_opt(CLAIM).await.unwrap().is_none(),
        "the claim is left"
    );
    let left = installed.cluster.volume_leftovers().await;
    assert!(left.is_empty(), "left: {left:?}");
    assert_eq!(
        settings.get(FLAG).await.unwrap().spec.value,
        "false",
        "the confirmation was not used up"
    );
    let snapshots = installed.cluster.api::<Snapshot>();
    assert!(
        snapshots
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // What stays until the manifest is deleted holds no finalizer.
    let nodes = installed
        .cluster
        .api::<Node>()
        .list(&Default::default())
        .await
        .unwrap();
    let settings = settings.list(&Default::default()).await.unwrap();
    let held: Vec<String> = nodes
        .iter()
        .map(|n| (n.name_any(), n.finalizers().to_vec()))
        .chain(
            settings
                .iter()
                .map(|s| (s.name_any(), s.finalizers().to_vec())),
        )
        .filter(|(_, finalizers)| !finalizers.is_empty())
        .map(|(name, finalizers)| format!("{name}: {finalizers:?}"))
        .collect();
    assert!(held.is_empty(), "held by finalizers: {held:?}");
    let on_nodes = installed.node_leftovers(&replica_dirs);
    assert!(on_nodes.is_empty(), "left on the nodes: {on_nodes:?}");

    let forgotten = backup_leftovers(&installed).await;
    assert!(forgotten.is_empty(), "backup resources left: {forgotten:?}");
    let kept: Vec<String> = objects
        .backups(&volume)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(
        kept,
        [BACKUP.to_owned(), csi_backup],
        "the store keeps the backups"
    );

    installed.delete_uninstall().await;
    installed.stop().await;
}

const BUCKET: &str = "backups";
const TARGET_URL: &str = "s3://backups@us-east-1/uninstalled";
const BACKUP: &str = "before-uninstall";

fn minio_credentials(store: &ObjectServer) -> BTreeMap<String, String> {
    [
        ("AWS_ACCESS_KEY_ID", MINIO_ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", MINIO_SECRET_KEY.to_owned()),
        ("AWS_ENDPOINTS", store.endpoint()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The default target on `credentials`' store (the managers run on the
/// hosts' network, so they reach it on loopback), and a completed backup
/// of `volume` in it.
async fn take_backup(installed: &Installed, credentials: BTreeMap<String, String>, volume: &str) {
    let cluster = &installed.cluster;
    secret(cluster, "s3", credentials).await;
    create_target(cluster, DEFAULT_BACKUP_TARGET, TARGET_URL, "s3", "300s").await;
    create_backup(cluster, BACKUP, volume).await;
    let backups = cluster.api::<Backup>();
    installed
        .until("the backup completed", || async {
            let status = backups.get_opt(BACKUP).await.ok()??.status?;
            (status.state == BackupState::Completed).then_some(())
        })
        .await;
}

/// A backup of the claim through a VolumeSnapshot of the manifest's class
/// `oxhorn-backup`; its Backup's name, which sorts after [`BACKUP`].
async fn take_csi_backup(installed: &Installed) -> String {
    let resource = snapshot_resource("VolumeSnapshot", "volumesnapshots");
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(installed.client(), installed.users.name(), &resource);
    let snapshot = DynamicObject::new("in-a-backup", &resource).data(json!({"spec": {
        "volumeSnapshotClassName": "oxhorn-backup",
        "source": {"persistentVolumeClaimName": CLAIM},
    }}));
    snapshots
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap();
    let handle = installed
        .until("the backup's VolumeSnapshot ready", || async {
            let snapshot = snapshots.get("in-a-backup").await.ok()?;
            let ready = snapshot.data.pointer("/status/readyToUse")?.as_bool()?;
            let content = snapshot
                .data
                .pointer("/status/boundVolumeSnapshotContentName")?;
            ready.then(|| content.as_str().map(str::to_owned))?
        })
        .await;
    let backups = installed
        .cluster
        .api::<Backup>()
        .list(&Default::default())
        .await
        .unwrap();
    let name = backups
        .items
        .iter()
        .map(ResourceExt::name_any)
        .find(|name| name != BACKUP)
        .unwrap_or_else(|| panic!("no Backup for VolumeSnapshotContent {handle}"));
    assert!(name.as_str() > BACKUP, "{name}");
    name
}

/// The BackupTargets, BackupVolumes and Backups left.
async fn backup_leftovers(installed: &Installed) -> Vec<String> {
    let cluster = &installed.cluster;
    let all = Default::default();
    let targets = cluster.api::<BackupTarget>().list(&all).await.unwrap();
    let volumes = cluster.api::<BackupVolume>().list(&all).await.unwrap();
    let backups = cluster.api::<Backup>().list(&all).await.unwrap();
    let targets = targets
        .items
        .iter()
        .map(|t| format!("target {}", t.name_any()));
    let volumes = volumes
        .items
        .iter()
        .map(|v| format!("backup volume {}", v.name_any()));
    let backups = backups
        .items
        .iter()
        .map(|b| format!("backup {}", b.name_any()));
    targets.chain(volumes).chain(backups).collect()
}
