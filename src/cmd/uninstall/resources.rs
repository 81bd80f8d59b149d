//! Oxhorn's own resources: the Volumes, the engines, replicas and snapshots
//! of gone volumes, and the backup resources.

use std::collections::BTreeSet;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use tracing::warn;

use super::held::ours;
use super::wait::Wait;
use super::{UninstallError, list};
use crate::controller::delete;
use crate::datastore::unless_gone;
use crate::types::{Backup, BackupTarget, BackupVolume, Engine, Replica, Snapshot, Volume};

pub(super) async fn volumes_left(
    client: &Client,
    namespace: &str,
) -> Result<Vec<String>, UninstallError> {
    let volumes: Vec<Volume> = list(&Api::namespaced(client.clone(), namespace)).await?;
    let pvs = ours(list(&Api::all(client.clone())).await?);
    Ok(volumes
        .iter()
        .map(|v| format!("volume {}", v.name_any()))
        .chain(pvs.iter().map(|pv| format!("PV {}", pv.name_any())))
        .collect())
}

/// The engines, replicas and snapshots whose volume is gone.
async fn orphans_of(
    client: &Client,
    namespace: &str,
) -> Result<(Vec<Engine>, Vec<Replica>, Vec<Snapshot>), UninstallError> {
    let volumes: Vec<Volume> = list(&Api::namespaced(client.clone(), namespace)).await?;
    let volumes: BTreeSet<String> = volumes.iter().map(ResourceExt::name_any).collect();
    let engines: Vec<Engine> = list(&Api::namespaced(client.clone(), namespace)).await?;
    let replicas: Vec<Replica> = list(&Api::namespaced(client.clone(), namespace)).await?;
    let snapshots: Vec<Snapshot> = list(&Api::namespaced(client.clone(), namespace)).await?;
    Ok((
        engines
            .into_iter()
            .filter(|e| !volumes.contains(&e.spec.instance.volume_name))
            .collect(),
        replicas
            .into_iter()
            .filter(|r| !volumes.contains(&r.spec.instance.volume_name))
            .collect(),
        snapshots
            .into_iter()
            .filter(|s| !volumes.contains(&s.spec.volume))
            .collect(),
    ))
}

pub(super) async fn delete_orphans(client: &Client, namespace: &str) -> Result<(), UninstallError> {
    let (engines, replicas, snapshots) = orphans_of(client, namespace).await?;
    for engine in &engines {
        delete(&Api::namespaced(client.clone(), namespace), engine).await?;
    }
    for replica in &replicas {
        delete(&Api::namespaced(client.clone(), namespace), replica).await?;
    }
    for snapshot in &snapshots {
        delete(&Api::namespaced(client.clone(), namespace), snapshot).await?;
    }
    Ok(())
}

pub(super) async fn orphans(
    client: &Client,
    namespace: &str,
) -> Result<Vec<String>, UninstallError> {
    let (engines, replicas, snapshots) = orphans_of(client, namespace).await?;
    Ok(engines
        .iter()
        .map(|o| format!("engine {}", o.name_any()))
        .chain(replicas.iter().map(|o| format!("replica {}", o.name_any())))
        .chain(
            snapshots
                .iter()
                .map(|o| format!("snapshot {}", o.name_any())),
        )
        .collect())
}

/// Deletes the backup resources, the targets first: a Backup whose target
/// is gone is let go without its backup being deleted from the store.
pub(super) async fn forget_backups(
    client: &Client,
    namespace: &str,
    wait: &Wait,
) -> Result<(), UninstallError> {
    let targets: Api<BackupTarget> = Api::namespaced(client.clone(), namespace);
    for target in list(&targets).await? {
        delete(&targets, &target).await?;
    }
    wait.until("the backup targets deleted", || async {
        Ok(list(&targets)
            .await?
            .iter()
            .map(|t| format!("backup target {}", t.name_any()))
            .collect())
    })
    .await?;
    let volumes: Api<BackupVolume> = Api::namespaced(client.clone(), namespace);
    let backups: Api<Backup> = Api::namespaced(client.clone(), namespace);
    for volume in list(&volumes).await? {
        delete(&volumes, &volume).await?;
    }
    for backup in list(&backups).await? {
        delete(&backups, &backup).await?;
    }
    wait.until(
        "the backup resources forgotten (the stores keep them)",
        || async {
            let volumes = list(&volumes)
                .await?
                .into_iter()
                .map(|v| format!("backup volume {}", v.name_any()));
            let backups = list(&backups)
                .await?
                .into_iter()
                .map(|b| format!("backup {}", b.name_any()));
            Ok(volumes.chain(backups).collect())
        },
    )
    .await
}

/// Deletes every Volume. One still attached once no CSI attachment is left
/// was attached by hand (spec.nodeID): it is detached, since a volume's
/// deletion waits for its detachment.
pub(super) async fn delete_volumes(api: &Api<Volume>) -> Result<(), UninstallError> {
    for volume in list(api).await? {
        let name = volume.name_any();
        if !volume.spec.node_id.is_empty() {
            warn!(volume = %name, node = %volume.spec.node_id, "detaching a volume no CSI attachment holds");
            let detach = serde_json::json!({"spec": {"nodeID": ""}});
            unless_gone(
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&detach))
                    .await,
            )?;
        }
        delete(api, &volume).await?;
    }
    Ok(())
}
