//! The controllers' writes to the API: status, guarded patches, deletion,
//! and oxhorn's finalizer.

use std::fmt::Debug;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::object::HasStatus;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ControllerError;
use crate::datastore::unless_gone;
use crate::types::FINALIZER;

/// Writes `object`'s status, guarded by its resourceVersion.
pub async fn replace_status<K>(api: &Api<K>, object: &K) -> Result<K, ControllerError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    Ok(api
        .replace_status(&object.name_any(), &PostParams::default(), object)
        .await?)
}

/// Writes `status` as `object`'s status, unless the object has it already.
pub async fn update_status<K>(
    api: &Api<K>,
    object: &K,
    status: K::Status,
) -> Result<(), ControllerError>
where
    K: Resource + HasStatus + Clone + Serialize + DeserializeOwned + Debug,
    K::Status: PartialEq,
{
    if object.status() == Some(&status) {
        return Ok(());
    }
    let mut updated = object.clone();
    *updated.status_mut() = Some(status);
    replace_status(api, &updated).await?;
    Ok(())
}

/// Merge-patches `object` with `patch`, guarded by the object's
/// resourceVersion so that a decision made on a stale copy fails as a conflict.
pub async fn patch_guarded<K>(
    api: &Api<K>,
    object: &K,
    mut patch: serde_json::Value,
) -> kube::Result<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    patch["metadata"]["resourceVersion"] = object.resource_version().into();
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

// Not kube-runtime's `finalizer()`: it runs a whole pass as either apply
// or cleanup and adds the finalizer in a pass of its own. Here the finalizer
// is put on at creation (engines, replicas, snapshots) or by the volume's
// and Backup's owner once claimed, and let go only once the data plane let
// go, in the middle of a pass that goes on to report status; errors stay
// ours for `error_policy`, and a 404 on release is done, not a failure.

/// Holds `object` until [`release`]: adds oxhorn's finalizer unless it
/// has it, `object` then becoming what the API server answered.
pub async fn hold<K>(api: &Api<K>, object: &mut K) -> Result<(), ControllerError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    if object.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let mut finalizers = object.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    let patch = serde_json::json!({ "metadata": { "finalizers": finalizers } });
    *object = patch_guarded(api, object, patch).await?;
    Ok(())
}

/// Lets `object` go: removes oxhorn's finalizer. Gone already is fine.
pub async fn release<K>(api: &Api<K>, object: &K) -> Result<(), ControllerError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let remaining: Vec<&String> = object
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .collect();
    let patch = serde_json::json!({ "metadata": { "finalizers": remaining } });
    unless_gone(patch_guarded(api, object, patch).await)?;
    Ok(())
}

/// Deletes `object` unless it is already going. Gone already is fine.
pub async fn delete<K>(api: &Api<K>, object: &K) -> Result<(), ControllerError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    if object.meta().deletion_timestamp.is_some() {
        return Ok(());
    }
    unless_gone(
        api.delete(&object.name_any(), &DeleteParams::default())
            .await,
    )?;
    Ok(())
}
