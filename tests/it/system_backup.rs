//! System backup and restore across two clusters, as a user moving to a
//! new cluster does it. In the shared control plane: two volumes with
//! data (one attached, one detached), a StorageClass, a PersistentVolume
//! and its claim, a RecurringJob and a Setting; a SystemBackup to MinIO
//! (policy if-not-present: it backs both volumes up). Then a second,
//! fresh control plane (its own etcd and kube-apiserver,
//! kube-controller-manager's claim binder, managers on data directories
//! of their own) pointed at the same bucket: the sync shows the system
//! backup, a SystemRestore makes everything again, the claim is Bound,
//! both volumes read back byte for byte, and what existed there already
//! (the target, a setting) is reported as left alone. A system backup
//! whose recorded version is newer than this Oxhorn is refused with a
//! message naming both versions. Bad SystemBackups and SystemRestores are
//! refused by their schema with a reason.

use bytes::Bytes;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use oxhorn::backup::SystemBackupMeta;
use oxhorn::csi::DRIVER_NAME;
use oxhorn::types::*;
use oxhorn_testbed::sidecars::Sidecars;
use oxhorn_testbed::{ControlPlane, MINIO_ACCESS_KEY, ObjectServerKind, TestNamespace};
use serde_json::json;

use crate::backup::{BUCKET, Store, create_target, credential_secret, request_sync, until_target};
use crate::common::*;

const SIZE: i64 = 32 * MIB;
const WRITTEN: usize = 8 << 20;

/// Removes the cluster-scoped StorageClass a test made from the shared
/// control plane, also when the test fails.
struct ClassGuard {
    client: Client,
    name: String,
}

impl Drop for ClassGuard {
    fn drop(&mut self) {
        let (client, name) = (self.client.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let classes: Api<StorageClass> = Api::all(client);
                let _ = classes.delete(&name, &DeleteParams::default()).await;
            });
        })
        .join();
    }
}

/// A StorageClass of Oxhorn's, a PersistentVolume of `volume` and its
/// claim `data` in the cluster's namespace, bound to each other by name.
async fn claim_objects(cluster: &Cluster, volume: &str) -> (ClassGuard, String) {
    let ns = cluster.ns.name();
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-sc")},
        "provisioner": DRIVER_NAME,
        "parameters": {"numberOfReplicas": "2"},
    }))
    .unwrap();
    let classes: Api<StorageClass> = Api::all(cluster.client.clone());
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let guard = ClassGuard {
        client: cluster.client.clone(),
        name: class.name_any(),
    };
    let pv_name = format!("{ns}-pv");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": SIZE.to_string()},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class.name_any(),
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": ns, "name": "data"},
            "csi": {"driver": DRIVER_NAME, "volumeHandle": volume, "fsType": "ext4"},
        },
    }))
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(cluster.client.clone());
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class.name_any(),
            "volumeName": pv_name,
            "resources": {"requests": {"storage": SIZE.to_string()}},
        },
    }))
    .unwrap();
    cluster.create(&claim).await;
    (guard, pv_name)
}

async fn until_system_backup(cluster: &Cluster, name: &str) -> SystemBackupStatus {
    cluster
        .until(&format!("system backup {name} Ready"), || async {
            let backup = cluster.api::<SystemBackup>().get_opt(name).await.unwrap()?;
            let status = backup.status?;
            assert_ne!(status.state, SystemBackupState::Error, "{status:?}");
            (status.state == SystemBackupState::Ready).then_some(status)
        })
        .await
}

async fn restore(cluster: &Cluster, name: &str, system_backup: &str) -> SystemRestoreStatus {
    let restore = SystemRestore::new(
        name,
        SystemRestoreSpec {
            system_backup: system_backup.into(),
        },
    );
    cluster.create(&restore).await;
    cluster
        .until(&format!("system restore {name} done"), || async {
            let restore = cluster.api::<SystemRestore>().get(name).await.unwrap();
            let status = restore.status?;
            matches!(
                status.state,
                SystemRestoreState::Completed | SystemRestoreState::Error
            )
            .then_some(status)
        })
        .await
}

fn outcome(status: &SystemRestoreStatus, kind: &str, name: &str) -> RestoreOutcome {
    let found = status
        .objects
        .iter()
        .find(|o| o.kind == kind && o.name == name);
    found
        .unwrap_or_else(|| panic!("{kind}/{name} not in the restore: {status:?}"))
        .outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_backup_restores_volumes_and_claims_into_a_fresh_cluster() {
    require_root();
    let steps = Steps::start();
    let store = Store::start(ObjectServerKind::Minio);
    let url = store.url(BUCKET);

    // The first cluster: a volume with data, its claim, a job, a setting.
    let first = Cluster::start("sysbk", 2).await;
    let node = first.nodes[0].node_id().to_owned();
    credential_secret(&first, "creds", &store, true).await;
    create_target(&first, DEFAULT_BACKUP_TARGET, &url, "creds", "300s").await;
    until_target(&first, DEFAULT_BACKUP_TARGET, "Synced").await;
    first.create_volume("vol", SIZE, 2).await;
    let device = first.attach("vol", &node).await;
    let mut expected = vec![0; usize::try_from(SIZE).unwrap()];
    expected[..WRITTEN].copy_from_slice(&write_pattern(&device, WRITTEN, 7));
    // A second volume, detached when the system backup is taken.
    first.create_volume("cold", SIZE, 2).await;
    let cold_device = first.attach("cold", &node).await;
    let mut cold = vec![0; usize::try_from(SIZE).unwrap()];
    cold[..WRITTEN].copy_from_slice(&write_pattern(&cold_device, WRITTEN, 8));
    first.detach("cold").await;
    let (_class, pv_name) = claim_objects(&first, "vol").await;
    let job = json!({"task": "backup", "cron": "0 3 * * *", "groups": ["nightly"], "retain": 3});
    let job = RecurringJob::new("nightly", serde_json::from_value(job).unwrap());
    first.create(&job).await;
    first.set("backup-compression-method", "zstd").await;
    steps.report("first cluster ready");

    let backup = SystemBackup::new(
        "sb1",
        serde_json::from_value(json!({"volumeBackupPolicy": "if-not-present"})).unwrap(),
    );
    first.create(&backup).await;
    let status = until_system_backup(&first, "sb1").await;
    steps.report("system backup Ready");
    assert_eq!(status.version, env!("CARGO_PKG_VERSION"));
    let volume_backup = status.volume_backups.get("vol").cloned();
    let volume_backup = volume_backup.unwrap_or_else(|| panic!("no backup of vol: {status:?}"));
    let cold_backup = status.volume_backups.get("cold").cloned();
    let cold_backup = cold_backup.unwrap_or_else(|| panic!("no backup of cold: {status:?}"));
    assert_eq!(status.counts.volumes, 2);
    assert_eq!(status.counts.persistent_volumes, 1);
    assert_eq!(status.counts.persistent_volume_claims, 1);
    assert!(status.counts.recurring_jobs >= 1 && status.counts.settings >= 2);
    first.detach("vol").await;

    // The same system backup, as if taken by a newer Oxhorn.
    let objects = store.backupstore();
    let stored = objects.system_backup_objects("sb1").await.unwrap();
    let future = SystemBackupMeta {
        name: "sb-future".into(),
        format_version: 1,
        oxhorn_version: "99.0.0".into(),
        created: jiff::Timestamp::now().to_string(),
    };
    objects
        .put_system_backup(&future, Bytes::clone(&stored))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&stored);
    assert!(
        !text.contains(MINIO_ACCESS_KEY),
        "a credential in the system backup"
    );

    // A fresh cluster, its namespace named as the first's (the claim's).
    let control_plane = ControlPlane::start().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(control_plane.client().unwrap());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": first.ns.name()}})).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let _binder = Sidecars::start_claim_binder(control_plane.kubeconfig()).unwrap();
    let ns = TestNamespace::adopt(&control_plane, first.ns.name());
    let second = Cluster::start_on(&control_plane, ns, 2).await;
    steps.report("second control plane and cluster ready");
    credential_secret(&second, "creds", &store, true).await;
    create_target(&second, DEFAULT_BACKUP_TARGET, &url, "creds", "300s").await;
    until_target(&second, DEFAULT_BACKUP_TARGET, "Synced").await;
    let found = until_system_backup(&second, "sb1").await;
    assert_eq!(found.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(found.counts, status.counts, "{found:?}");
    assert_eq!(found.volume_backups, status.volume_backups);
    steps.report("system backup found by the sync");

    let restored = restore(&second, "r1", "sb1").await;
    steps.report("restore done");
    assert_eq!(
        restored.state,
        SystemRestoreState::Completed,
        "{restored:?}"
    );
    let restored_kinds = [
        ("Volume", "vol"),
        ("Volume", "cold"),
        ("PersistentVolume", pv_name.as_str()),
        ("PersistentVolumeClaim", "data"),
        ("RecurringJob", "nightly"),
        ("Setting", "backup-compression-method"),
    ];
    for (kind, name) in restored_kinds {
        assert_eq!(
            outcome(&restored, kind, name),
            RestoreOutcome::Restored,
            "{kind}/{name}: {restored:?}"
        );
    }
    let left_alone = [
        ("BackupTarget", DEFAULT_BACKUP_TARGET),
        ("Setting", "storage-minimal-available-percentage"),
    ];
    for (kind, name) in left_alone {
        assert_eq!(outcome(&restored, kind, name), RestoreOutcome::Exists);
    }
    let volume = second.volume("vol").await.unwrap();
    assert_eq!(volume.spec.from_backup, volume_backup);
    assert_eq!(volume.spec.size, SIZE);

    let claims = second.api::<PersistentVolumeClaim>();
    second
        .until("the claim Bound", || async {
            let claim = claims.get("data").await.unwrap();
            (claim.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await;
    steps.report("claim Bound");
    let node = second.nodes[0].node_id().to_owned();
    let device = second.attach("vol", &node).await;
    let read = read_device(&device, expected.len());
    assert!(read == expected, "the restored volume's data differs");
    let device = second.attach("cold", &node).await;
    let read = read_device(&device, cold.len());
    assert!(read == cold, "the restored detached volume's data differs");
    steps.report("data equal");

    let refused = restore(&second, "r2", "sb-future").await;
    assert_eq!(refused.state, SystemRestoreState::Error);
    assert!(
        refused.message.contains("99.0.0") && refused.message.contains(env!("CARGO_PKG_VERSION")),
        "{}",
        refused.message
    );

    // Clean up: the second cluster goes with its control plane; the
    // first's volume, claim objects and backups here.
    for volume in ["vol", "cold"] {
        second.detach(volume).await;
        second.delete_volume(volume).await;
    }
    drop(second);
    for volume in ["vol", "cold"] {
        first.delete_volume(volume).await;
    }
    let pvs: Api<PersistentVolume> = Api::all(first.client.clone());
    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    // Deleted, the system backup goes from the store too: the next sync
    // does not bring it back; the volume backups it took are kept.
    first
        .api::<SystemBackup>()
        .delete("sb1", &DeleteParams::default())
        .await
        .unwrap();
    first
        .until("sb1 gone", || async {
            let gone = first.api::<SystemBackup>().get_opt("sb1").await.unwrap();
            gone.is_none().then_some(())
        })
        .await;
    let stored = objects.system_backups().await.unwrap();
    assert_eq!(stored, ["sb-future"], "sb1 left in the store");
    let asked = request_sync(&first, DEFAULT_BACKUP_TARGET).await;
    first
        .until("a sync after the deletion", || async {
            let target = first
                .api::<BackupTarget>()
                .get(DEFAULT_BACKUP_TARGET)
                .await
                .ok()?;
            let synced = target.status?.last_synced_at?.0;
            (synced >= asked).then_some(())
        })
        .await;
    let found = first.api::<SystemBackup>().get_opt("sb1").await.unwrap();
    assert!(found.is_none(), "the sync found sb1 again: {found:?}");
    assert_eq!(
        objects.backups("vol").await.unwrap().len(),
        1,
        "sb1's volume backup"
    );
    for backup in [volume_backup, cold_backup] {
        first
            .api::<Backup>()
            .delete(&backup, &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// What the API server says when it refuses `object`.
async fn refusal<K>(api: &Api<K>, object: &K) -> String
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(made) => panic!("accepted: {made:?}"),
        Err(kube::Error::Api(status)) => status.message,
        Err(error) => panic!("{error}"),
    }
}

#[tokio::test]
async fn bad_system_backups_and_restores_are_refused_with_a_reason() {
    let control_plane = oxhorn_testbed::shared();
    let ns = TestNamespace::create(control_plane, "sysbk-schema")
        .await
        .unwrap();
    let client = control_plane.client().unwrap();
    let backups: Api<SystemBackup> = Api::namespaced(client.clone(), ns.name());
    let restores: Api<SystemRestore> = Api::namespaced(client, ns.name());
    let backup = |spec: serde_json::Value| {
        let mut object = SystemBackup::new("sb", serde_json::from_value(json!({})).unwrap());
        object.spec = serde_json::from_value(spec).unwrap_or(object.spec);
        object
    };

    // An unknown policy: the schema's enum.
    let mut wrong = serde_json::to_value(backup(json!({}))).unwrap();
    wrong["spec"]["volumeBackupPolicy"] = json!("sometimes");
    let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(
        control_plane.client().unwrap(),
        ns.name(),
        &kube::api::ApiResource::erase::<SystemBackup>(&()),
    );
    let wrong: kube::api::DynamicObject = serde_json::from_value(wrong).unwrap();
    let message = refusal(&dynamic, &wrong).await;
    assert!(
        message.contains("volumeBackupPolicy") && message.contains("if-not-present"),
        "{message}"
    );
    let bad_target = backup(json!({"backupTargetName": "Not_A_Name"}));
    let message = refusal(&backups, &bad_target).await;
    assert!(message.contains("backupTargetName"), "{message}");

    // A system backup's target and policy are fixed once made.
    let made = backups
        .create(&PostParams::default(), &backup(json!({})))
        .await
        .unwrap();
    let mut moved = made.clone();
    moved.spec.backup_target_name = "offsite".into();
    let message = match backups.replace("sb", &PostParams::default(), &moved).await {
        Ok(_) => panic!("its target changed"),
        Err(kube::Error::Api(status)) => status.message,
        Err(error) => panic!("{error}"),
    };
    assert!(
        message.contains("the target of a system backup cannot change"),
        "{message}"
    );

    let restore = SystemRestore::new(
        "r",
        SystemRestoreSpec {
            system_backup: String::new(),
        },
    );
    let message = refusal(&restores, &restore).await;
    assert!(message.contains("systemBackup"), "{message}");
    backups
        .delete("sb", &DeleteParams::default())
        .await
        .unwrap();
}
