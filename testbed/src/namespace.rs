//! A namespace per test, emptied and removed when the guard drops, also while
//! a failed test unwinds. No namespace controller runs in the test control
//! plane (or not for long), so the guard does its work: deletes oxhorn's
//! objects and those Kubernetes workloads and their pods leave (dropping
//! their finalizers; pods at once), deletes the namespace and finalizes it.
//! Nothing of it stays in the store to come back with a namespace of the
//! same name.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::ControlPlane;
use crate::{Error, Result};
use oxhorn::types::{
    Backup, BackupTarget, BackupVolume, Engine, Node, RecurringJob, Replica, Setting, Snapshot,
    SystemBackup, SystemRestore, Volume,
};

pub struct TestNamespace {
    name: String,
    config: Config,
}

impl TestNamespace {
    /// Creates a fresh namespace named after `prefix`.
    pub async fn create(control_plane: &ControlPlane, prefix: &str) -> Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        oxhorn::names::validate_dns_subdomain("namespace", &name).map_err(Error::Failed)?;
        let api: Api<Namespace> = Api::all(control_plane.client()?);
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(name.clone());
        api.create(&PostParams::default(), &namespace).await?;
        Ok(Self {
            name,
            config: control_plane.config().clone(),
        })
    }

    /// Takes charge of the existing namespace `name` (e.g. the one an
    /// installed manifest made): removed like a created one when dropped.
    pub fn adopt(control_plane: &ControlPlane, name: &str) -> Self {
        Self {
            name: name.to_string(),
            config: control_plane.config().clone(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let (name, config) = (self.name.clone(), self.config.clone());
        // Drop may run inside the test's runtime, which cannot be blocked on:
        // clean up from a thread with a runtime of its own.
        let cleaned = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io("tokio runtime", e))?;
            runtime.block_on(remove(config, &name))
        })
        .join();
        match cleaned {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("removing test namespace {}: {e}", self.name),
            Err(_) => eprintln!("removing test namespace {}: cleanup panicked", self.name),
        }
    }
}

async fn remove(config: Config, name: &str) -> Result<()> {
    let client = Client::try_from(config)?;
    purge::<Volume>(&client, name).await?;
    purge::<Engine>(&client, name).await?;
    purge::<Replica>(&client, name).await?;
    purge::<Node>(&client, name).await?;
    purge::<Setting>(&client, name).await?;
    purge::<Snapshot>(&client, name).await?;
    purge::<BackupTarget>(&client, name).await?;
    purge::<BackupVolume>(&client, name).await?;
    purge::<Backup>(&client, name).await?;
    purge::<RecurringJob>(&client, name).await?;
    purge::<SystemBackup>(&client, name).await?;
    purge::<SystemRestore>(&client, name).await?;
    purge::<DaemonSet>(&client, name).await?;
    purge::<Deployment>(&client, name).await?;
    purge::<StatefulSet>(&client, name).await?;
    purge::<ReplicaSet>(&client, name).await?;
    purge::<Pod>(&client, name).await?;
    purge::<PersistentVolumeClaim>(&client, name).await?;
    purge::<Secret>(&client, name).await?;
    purge::<ConfigMap>(&client, name).await?;
    purge::<ServiceAccount>(&client, name).await?;
    purge::<Role>(&client, name).await?;
    purge::<RoleBinding>(&client, name).await?;
    purge::<Lease>(&client, name).await?;
    purge_volumes_named_after(&client, name).await?;
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces.delete(name, &DeleteParams::default()).await?;
    let mut namespace = namespaces.get(name).await?;
    if let Some(spec) = namespace.spec.as_mut() {
        spec.finalizers = None;
    }
    namespaces
        .replace_subresource("finalize", name, &PostParams::default(), &namespace)
        .await?;
    Ok(())
}

/// Deletes the PersistentVolumes (cluster-wide) a test named after its
/// namespace (`<namespace>-...`), as a test that failed left them: others
/// check that no PersistentVolume is left behind.
async fn purge_volumes_named_after(client: &Client, namespace: &str) -> Result<()> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let prefix = format!("{namespace}-");
    for pv in pvs.list(&ListParams::default()).await? {
        let name = pv.name_any();
        if !name.starts_with(&prefix) {
            continue;
        }
        // Deleted, then released from the protection finalizer that would
        // keep it while its (purged) claim was thought to use it.
        let release = serde_json::json!({"metadata": {"finalizers": null}});
        let deleted = match pvs.delete(&name, &DeleteParams::default()).await {
            Ok(_) => pvs
                .patch(&name, &PatchParams::default(), &Patch::Merge(&release))
                .await
                .map(drop),
            Err(error) => Err(error),
        };
        match deleted {
            // Gone already.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            other => other?,
        }
    }
    Ok(())
}

/// Deletes every `K` in the namespace, releasing finalizers nobody will run.
async fn purge<K>(client: &Client, namespace: &str) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    for object in api.list(&ListParams::default()).await? {
        if !object.finalizers().is_empty() {
            let release = serde_json::json!({"metadata": {"finalizers": null}});
            let released = api
                .patch(
                    &object.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&release),
                )
                .await;
            match released {
                // Gone meanwhile: a controller may still be at work.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                other => drop(other?),
            }
        }
    }
    // Grace 0: a pod goes from the store at once, whether or not a kubelet
    // is left to confirm it stopped.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    api.delete_collection(&now, &ListParams::default()).await?;
    Ok(())
}
