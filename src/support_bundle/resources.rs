//! The objects in a bundle: every oxhorn.io object (`resources/`), the
//! effective settings, and the Kubernetes objects Oxhorn works with
//! (`kubernetes/`): the cluster's Nodes and CSINodes, Oxhorn's CSIDriver,
//! StorageClasses, PersistentVolumes, claims and VolumeAttachments, and
//! the namespace's pods, DaemonSets, Deployments, Leases and Secrets (their
//! names, types and keys: never a value).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Node as KubeNode, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, TypeMeta};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::archive::Stopped;
use super::collect::{Collection, list_all, values, why};
use super::report::Outcome;
use crate::csi::DRIVER_NAME;
use crate::datastore::settings;
use crate::types::Setting;

/// The claim annotation naming the provisioner that provisions it.
const PROVISIONER_ANNOTATION: &str = "volume.kubernetes.io/storage-provisioner";

/// The Kubernetes objects later steps look at again.
#[derive(Default)]
pub(super) struct Kubernetes {
    pub pods: Vec<Pod>,
    pub daemon_sets: Vec<DaemonSet>,
    pub deployments: Vec<Deployment>,
    pub nodes: Vec<KubeNode>,
    pub volumes: Vec<PersistentVolume>,
    pub claims: Vec<PersistentVolumeClaim>,
}

/// The Secrets of `namespace`, read only to scrub their values; why not.
pub(super) async fn secrets(client: &Client, namespace: &str) -> Result<Vec<Secret>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let listed = tokio::time::timeout(
        super::collect::READ_TIMEOUT,
        list_all(&api, ListParams::default()),
    );
    match listed.await {
        Ok(Ok((secrets, _))) => Ok(secrets),
        Ok(Err(error)) => Err(why(&error)),
        Err(_) => Err("the API server did not answer".into()),
    }
}

/// A Secret as a bundle shows it: no value, nor any annotation (kubectl's
/// last-applied-configuration holds them).
fn secret_names(secret: &Secret) -> Value {
    let keys: Vec<&String> = secret.data.iter().flatten().map(|(k, _)| k).collect();
    let owners: Vec<String> = secret
        .owner_references()
        .iter()
        .map(|o| format!("{}/{}", o.kind, o.name))
        .collect();
    json!({
        "name": secret.name_any(),
        "type": secret.type_,
        "keys": keys,
        "created": secret.metadata.creation_timestamp,
        "labels": secret.metadata.labels,
        "owners": owners,
    })
}

impl Collection<'_> {
    /// The Kubernetes objects (`kubernetes/`); `secrets` as read first.
    pub(super) async fn kubernetes(
        &mut self,
        secrets: Result<Vec<Secret>, String>,
    ) -> Result<Kubernetes, Stopped> {
        let client = self.client.clone();
        let ns = self.options.namespace.as_str();
        let classes = self
            .kube(
                "storageclasses",
                Api::all(client.clone()),
                |c: &StorageClass| c.provisioner == DRIVER_NAME,
            )
            .await?;
        let volumes = self
            .kube(
                "persistentvolumes",
                Api::all(client.clone()),
                |pv: &PersistentVolume| {
                    let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
                    csi.is_some_and(|csi| csi.driver == DRIVER_NAME)
                },
            )
            .await?;
        let class_names: Vec<String> = classes.iter().map(ResourceExt::name_any).collect();
        let volume_names: Vec<String> = volumes.iter().map(ResourceExt::name_any).collect();
        let claims = self
            .kube("persistentvolumeclaims", Api::all(client.clone()), |c| {
                is_ours(c, &class_names, &volume_names)
            })
            .await?;
        let attachments = Api::all(client.clone());
        self.kube("volumeattachments", attachments, |a: &VolumeAttachment| {
            a.spec.attacher == DRIVER_NAME
        })
        .await?;
        let drivers = Api::all(client.clone());
        self.kube("csidrivers", drivers, |d: &CSIDriver| {
            d.name_any() == DRIVER_NAME
        })
        .await?;
        self.kube::<CSINode>("csinodes", Api::all(client.clone()), all)
            .await?;
        let nodes = self.kube("nodes", Api::all(client.clone()), all).await?;
        let pods = self
            .kube("pods", Api::namespaced(client.clone(), ns), all)
            .await?;
        let daemon_sets = self
            .kube("daemonsets", Api::namespaced(client.clone(), ns), all)
            .await?;
        let deployments = self
            .kube("deployments", Api::namespaced(client.clone(), ns), all)
            .await?;
        self.kube::<Lease>("leases", Api::namespaced(client, ns), all)
            .await?;
        self.secret_names(secrets).await?;
        Ok(Kubernetes {
            pods,
            daemon_sets,
            deployments,
            nodes,
            volumes,
            claims,
        })
    }

    /// The `K`s `api` lists that `keep` keeps, written to
    /// `kubernetes/<file>.yaml`; none when they could not be listed.
    async fn kube<K>(
        &mut self,
        file: &str,
        api: Api<K>,
        keep: impl Fn(&K) -> bool,
    ) -> Result<Vec<K>, Stopped>
    where
        K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    {
        let what = format!("kubernetes/{file}.yaml");
        let Some((mut listed, capped)) = self
            .attempt(&what, list_all(&api, ListParams::default()))
            .await
        else {
            return Ok(Vec::new());
        };
        listed.retain(keep);
        self.objects(&what, &what, values(&listed), capped).await?;
        Ok(listed)
    }

    /// `kubernetes/secrets.yaml`: the Secrets' names, types and keys.
    async fn secret_names(&mut self, secrets: Result<Vec<Secret>, String>) -> Result<(), Stopped> {
        let what = "kubernetes/secrets.yaml";
        if !self.options.secret_names {
            let why = "the caller may not list the namespace's Secrets";
            self.report.record(what, Outcome::Skipped(why.into()));
            return Ok(());
        }
        match secrets {
            Ok(secrets) => {
                let names: Vec<Value> = secrets.iter().map(secret_names).collect();
                let done = Outcome::Done(format!("{} Secrets, without their values", names.len()));
                self.yaml(what, what, &json!({"secrets": names}), 0, done)
                    .await
            }
            Err(why) => {
                self.report.record(what, Outcome::Failed(why));
                Ok(())
            }
        }
    }

    /// Every oxhorn.io object, a file per kind: `resources/<plural>.yaml`.
    pub(super) async fn oxhorn_objects(&mut self) -> Result<(), Stopped> {
        for crd in crate::types::crds() {
            let spec = &crd.spec;
            let Some(version) = spec.versions.iter().find(|v| v.storage) else {
                continue;
            };
            let gvk = GroupVersionKind::gvk(&spec.group, &version.name, &spec.names.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, &spec.names.plural);
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.options.namespace, &resource);
            let what = format!("resources/{}.yaml", spec.names.plural);
            let Some((objects, capped)) = self
                .attempt(&what, list_all(&api, ListParams::default()))
                .await
            else {
                continue;
            };
            // A list's items come without their kind.
            let types = TypeMeta {
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
            };
            let objects: Vec<DynamicObject> = objects
                .into_iter()
                .map(|object| DynamicObject {
                    types: Some(types.clone()),
                    ..object
                })
                .collect();
            self.objects(&what, &what, values(&objects), capped).await?;
        }
        Ok(())
    }

    /// `settings.yaml`: every setting's value in effect, whether a Setting
    /// holds it and whether the managers applied it.
    pub(super) async fn settings(&mut self) -> Result<(), Stopped> {
        let what = "settings.yaml";
        let api: Api<Setting> = Api::namespaced(self.client.clone(), &self.options.namespace);
        let Some((objects, _)) = self
            .attempt(what, list_all(&api, ListParams::default()))
            .await
        else {
            return Ok(());
        };
        let rows: Vec<Value> = settings::described()
            .map(|described| {
                let set = objects.iter().find(|s| s.name_any() == described.key);
                let status = set.and_then(|s| s.status.as_ref());
                let mut row = json!({
                    "key": described.key,
                    "value": set.map_or(described.default, |s| s.spec.value.as_str()),
                    "default": described.default,
                    "set": set.is_some(),
                });
                // A default is in effect; a value set, once the managers
                // said so.
                match (set, status) {
                    (None, _) => row["applied"] = json!(true),
                    (Some(_), Some(status)) => {
                        row["applied"] = json!(status.applied);
                        if !status.message.is_empty() {
                            row["message"] = json!(status.message);
                        }
                    }
                    (Some(_), None) => {}
                }
                row
            })
            .collect();
        let unknown: Vec<String> = objects
            .iter()
            .map(ResourceExt::name_any)
            .filter(|name| settings::describe(name).is_none())
            .collect();
        let done = Outcome::Done(format!("{} settings, {} set", rows.len(), objects.len()));
        let mut value = json!({"settings": rows, "unknownSettings": unknown});
        let redacted = super::redact::redact_json(&mut value);
        self.yaml(what, what, &value, redacted, done).await
    }
}

/// Keeps every object.
fn all<K>(_: &K) -> bool {
    true
}

/// Whether `claim` is Oxhorn's: on one of its StorageClasses, bound to
/// one of its PersistentVolumes, or left to its provisioner.
fn is_ours(claim: &PersistentVolumeClaim, classes: &[String], volumes: &[String]) -> bool {
    let spec = claim.spec.as_ref();
    let class = spec.and_then(|s| s.storage_class_name.as_ref());
    let volume = spec.and_then(|s| s.volume_name.as_ref());
    let provisioner = claim.annotations().get(PROVISIONER_ANNOTATION);
    class.is_some_and(|c| classes.contains(c))
        || volume.is_some_and(|v| volumes.contains(v))
        || provisioner.is_some_and(|p| p == DRIVER_NAME)
}
