//! `oxhorn uninstall` (the Job of deploy/uninstall.yaml): removes every
//! Oxhorn volume, and with it its data, while the controllers still run to
//! let go of each, so that `kubectl delete -f deploy/oxhorn.yaml` then
//! leaves nothing stuck on a finalizer and nothing on the nodes.
//!
//! Refused while an Oxhorn volume, claim or snapshot exists unless the
//! Setting `deleting-confirmation-flag` is "true" (the refusal creates it,
//! "false", for the user to change). With it, in this order:
//! 1. the claims of Oxhorn volumes are deleted (a claim being deleted admits
//!    no new pod, so a StatefulSet's replacement pods cannot take it), then
//!    the pods that use them, so the kubelets unmount them and the
//!    attachments go;
//! 2. the backup resources are forgotten (see below), then the
//!    VolumeSnapshots of Oxhorn snapshots (through the snapshot controller
//!    and csi-snapshotter, which hold their finalizers): those of a backup
//!    class let go of their backups, which stay in the store;
//! 3. the Volume objects and their PVs (the volume controller stops the
//!    engines and removes the replicas' data), any volume attached by hand
//!    detached first; the Setting is "false" again.
//!
//! Either way, engines, replicas and snapshots whose volume is gone go
//! last, and the backup resources are forgotten: the BackupTargets first,
//! so that the Backups then let go without deleting anything from their
//! stores, which keep every backup for a later install to find.

mod held;
mod resources;
mod wait;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

use crate::controller::{ControllerError, delete};
use crate::datastore::create_if_absent;
use crate::datastore::settings::{self, DELETING_CONFIRMATION};
use crate::types::{DEFAULT_NAMESPACE, Setting, SettingSpec};
use held::{Held, attachments, delete_volume_snapshots, ours, release_claims, snapshot_contents};
use resources::{delete_orphans, delete_volumes, forget_backups, orphans, volumes_left};
use wait::Wait;

/// Where the kubelet reads a container's termination message from; there
/// only when running in a container.
const TERMINATION_LOG: &str = "/dev/termination-log";

#[derive(clap::Args, Debug)]
pub struct UninstallArgs {
    /// The namespace Oxhorn is installed in.
    #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// How long the volumes may take to go, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// A kubeconfig; the in-cluster account when not given.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Controller(#[from] ControllerError),
    #[error("refusing to uninstall: {0}")]
    Refused(String),
    #[error("still there after {after:?}: {left}")]
    Timeout { after: Duration, left: String },
    #[error("stopped by a signal before done; run it again to finish")]
    Interrupted,
}

/// Uninstalls (see the module's comment), or stops when `shutdown`
/// completes first.
pub async fn run(args: UninstallArgs, shutdown: impl Future<Output = ()>) -> crate::Result<()> {
    let client = crate::cmd::manager::kube_client(args.kubeconfig.as_deref()).await?;
    let result = tokio::select! {
        result = uninstall(&args, client) => result,
        () = shutdown => Err(UninstallError::Interrupted),
    };
    if let Err(error) = &result
        && Path::new(TERMINATION_LOG).exists()
    {
        // The reason, alone, as the pod's termination message.
        let _ = std::fs::write(TERMINATION_LOG, format!("{error}\n"));
    }
    Ok(result?)
}

async fn uninstall(args: &UninstallArgs, client: Client) -> Result<(), UninstallError> {
    let namespace = args.namespace.as_str();
    let confirmed = confirmation(&client, namespace).await?;
    let held = Held::read(&client, namespace).await?;
    let wait = Wait::new(Duration::from_secs(args.timeout));
    if held.is_empty() {
        info!("no Oxhorn volume, claim or snapshot");
    } else if !confirmed {
        return Err(UninstallError::Refused(held.refusal(namespace)));
    } else {
        info!(
            volumes = held.volumes.len(),
            claims = held.claims.len(),
            snapshots = held.snapshots.len(),
            "deleting every Oxhorn volume and its data"
        );
        // Twice: claims made while the first pods went (a StatefulSet's
        // for its pending pods) and their pods go too.
        for _ in 0..2 {
            let held = Held::read(&client, namespace).await?;
            release_claims(&client, &held.claims).await?;
            wait.until("the volumes' pods gone and the volumes detached", || {
                attachments(&client)
            })
            .await?;
        }
        // Before the VolumeSnapshots: with their targets gone, those of a
        // backup class let go of their backups without deleting them from
        // the store.
        forget_backups(&client, namespace, &wait).await?;
        delete_volume_snapshots(&client).await?;
        wait.until("the volumes' snapshots deleted", || {
            snapshot_contents(&client)
        })
        .await?;
        // Listed again: whatever was made meanwhile goes too.
        delete_volumes(&Api::namespaced(client.clone(), namespace)).await?;
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        for pv in ours(list(&pvs).await?) {
            delete(&pvs, &pv).await?;
        }
        wait.until("the volumes and their PVs deleted", || {
            volumes_left(&client, namespace)
        })
        .await?;
        use_up_confirmation(&client, namespace).await?;
    }
    delete_orphans(&client, namespace).await?;
    wait.until(
        "every engine, replica and snapshot of a gone volume gone",
        || orphans(&client, namespace),
    )
    .await?;
    forget_backups(&client, namespace, &wait).await?;
    info!("no Oxhorn volume is left: `kubectl delete -f deploy/oxhorn.yaml` removes the rest");
    Ok(())
}

/// Whether deleting volumes is confirmed. Creates the Setting, "false",
/// when there is none, for the user to patch; a value that is not a
/// boolean is refused rather than read as either.
async fn confirmation(client: &Client, namespace: &str) -> Result<bool, UninstallError> {
    let settings: Api<Setting> = Api::namespaced(client.clone(), namespace);
    let setting = match settings.get_opt(DELETING_CONFIRMATION).await? {
        Some(setting) => setting,
        None => {
            let unset = Setting::new(
                DELETING_CONFIRMATION,
                SettingSpec {
                    value: "false".into(),
                },
            );
            create_if_absent(&settings, &unset).await?;
            return Ok(false);
        }
    };
    let value = setting.spec.value.trim();
    settings::validate(DELETING_CONFIRMATION, value).map_err(UninstallError::Refused)?;
    Ok(value == "true")
}

/// A confirmation is for one uninstall: once it has deleted the volumes,
/// the Setting is "false" again, so that a later run (say, after Oxhorn was
/// installed again over the same namespace) asks anew.
async fn use_up_confirmation(client: &Client, namespace: &str) -> Result<(), UninstallError> {
    let settings: Api<Setting> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"spec": {"value": "false"}});
    settings
        .patch(
            DELETING_CONFIRMATION,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    info!("{DELETING_CONFIRMATION} is false again");
    Ok(())
}

pub(super) async fn list<K>(api: &Api<K>) -> Result<Vec<K>, UninstallError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    Ok(api.list(&ListParams::default()).await?.items)
}
