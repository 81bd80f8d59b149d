//! The embedded controllers. Every manager runs all of them; for each object
//! exactly one manager acts (see [`ownership`]). A reconcile reads the shared
//! caches, works on a copy, and writes status once at the end, only when it
//! changed; a conflict means the cache was stale or another manager won, and
//! the object is looked at again when its newer version arrives.

mod access;
pub mod backup;
mod control;
mod engine;
mod lease;
mod node;
pub mod ownership;
mod process;
mod replica;
pub mod settings;
mod snapshot;
mod volume;

pub use access::{KEY_SECRET, cluster_key};
pub use lease::hold_lease;
pub use node::ensure_own_node;
pub use replica::data_dir as replica_data_dir;

use std::collections::HashMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::object::HasStatus;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tracing::{debug, info, warn};

use crate::datastore::{Datastore, Liveness, Settings, changed_only, unless_gone};
use crate::instance::{InstanceError, InstanceManager};
use crate::protocol::{Access, Key};
use crate::types::{Backup, BackupState, Engine, FINALIZER, Node, Replica, Snapshot, Volume};
use ownership::Owned;

/// Longest a reconcile waits for the caches to show its own earlier writes.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

/// How often availability of nodes is re-evaluated: lease expiry makes no
/// watch event, so it has to be looked at.
const LIVENESS_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("instance manager: {0}")]
    Instance(#[from] InstanceError),
    #[error("{target} control at {address}: {}", .status.message())]
    DataPlane {
        target: String,
        address: String,
        status: Box<tonic::Status>,
    },
    #[error("{target} control at {address}: {source}")]
    DataPlaneConnect {
        target: String,
        address: String,
        source: tonic::transport::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding status: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("the data plane's key: {0}")]
    DataPlaneKey(String),
}

impl ControllerError {
    /// Another writer changed the object since the cache saw it.
    fn is_conflict(&self) -> bool {
        matches!(self, ControllerError::Kube(kube::Error::Api(status)) if status.code == 409)
    }

    /// A data-plane process refused or could not be reached: worth reporting
    /// in the object's status and retrying, not failing the whole pass.
    fn is_data_plane(&self) -> bool {
        matches!(
            self,
            ControllerError::DataPlane { .. } | ControllerError::DataPlaneConnect { .. }
        )
    }
}

/// What this node's manager is and where its pieces are.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: String,
    /// Directory of the node's default disk.
    pub data_dir: PathBuf,
    /// The node's host, where its frontends' programs run.
    pub host: crate::host::Host,
}

/// Everything a reconcile needs.
pub struct Context {
    pub client: Client,
    pub ds: Arc<Datastore>,
    pub node: NodeConfig,
    pub liveness: Liveness,
    pub instances: Arc<InstanceManager>,
    /// The cluster's data-plane key: volumes' keys derive from it.
    key: Key,
    /// Objects this manager created that its caches may not show yet.
    pub expected: Expectations,
    recorder: Recorder,
}

/// Writes a controller made to objects it does not own (a volume's engine
/// and replicas), kept until the caches show them. A reconcile that runs on
/// a cache lagging behind its own writes would otherwise decide again from
/// the old state: create the same replicas twice, or place a replica again
/// and lose the race with its own earlier write.
#[derive(Default)]
pub struct Expectations(Mutex<HashMap<String, Vec<Expected>>>);

struct Expected {
    /// When the write was made: a write the cache never shows (its watch
    /// broken for good) is given up on after EXPECTATION_TIMEOUT.
    at: std::time::Instant,
    name: String,
    /// The resourceVersion the write replaced; `None` for a creation.
    replaced: Option<String>,
}

impl Expectations {
    /// `owner` created the object `name`.
    pub fn created(&self, owner: &str, name: String) {
        self.push(
            owner,
            Expected {
                at: std::time::Instant::now(),
                name,
                replaced: None,
            },
        );
    }

    /// `owner` wrote `before`, which became `after`. A write that changed
    /// nothing keeps the resourceVersion and is not waited for.
    pub fn changed<K: Resource>(&self, owner: &str, before: &K, after: &K) {
        let replaced = before.resource_version();
        if replaced == after.resource_version() {
            return;
        }
        self.push(
            owner,
            Expected {
                at: std::time::Instant::now(),
                name: before.name_any(),
                replaced,
            },
        );
    }

    /// Whether the cache shows every write of `owner`; forgets those it
    /// shows. `version` gives an object's resourceVersion in the cache.
    pub fn satisfied(&self, owner: &str, version: impl Fn(&str) -> Option<String>) -> bool {
        let mut table = self.lock();
        let Some(pending) = table.get_mut(owner) else {
            return true;
        };
        pending.retain(|expected| {
            if expected.at.elapsed() > EXPECTATION_TIMEOUT {
                warn!(owner, object = %expected.name, "the cache never showed a write; deciding without it");
                return false;
            }
            match (&expected.replaced, version(&expected.name)) {
                (None, seen) => seen.is_none(),
                (Some(replaced), Some(seen)) => *replaced == seen,
                // Deleted since: nothing left to wait for.
                (Some(_), None) => false,
            }
        });
        if pending.is_empty() {
            table.remove(owner);
            return true;
        }
        false
    }

    fn push(&self, owner: &str, expected: Expected) {
        self.lock()
            .entry(owner.to_owned())
            .or_default()
            .push(expected);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Expected>>> {
        // The table stays consistent whatever panicked while holding it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Context {
    pub fn new(
        client: Client,
        ds: Arc<Datastore>,
        node: NodeConfig,
        instances: Arc<InstanceManager>,
        key: Key,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "oxhorn-manager".into(),
                instance: Some(node.node_id.clone()),
            },
        );
        Arc::new(Self {
            liveness: Liveness::new(&ds),
            client,
            ds,
            node,
            instances,
            key,
            expected: Expectations::default(),
            recorder,
        })
    }

    /// How to reach `volume`'s data plane as its engine generation
    /// `generation` does.
    pub fn access(&self, volume: &str, generation: u64) -> Access {
        Access {
            volume: volume.to_string(),
            key: self.key.for_volume(volume),
            generation,
        }
    }

    /// The volume `name` as the cache has it.
    pub fn cached_volume(&self, name: &str) -> Option<Arc<Volume>> {
        self.ds.volumes.get(name)
    }

    /// The replica `name` as the cache has it.
    pub fn cached_replica(&self, name: &str) -> Option<Arc<Replica>> {
        self.ds.replicas.get(name)
    }

    /// oxhorn's Node of `node_id`, as last cached.
    pub fn cached_node(&self, node_id: &str) -> Option<Arc<Node>> {
        self.ds.nodes.get(node_id)
    }

    /// The settings in effect now.
    pub fn settings(&self) -> Settings {
        Settings::read(&self.ds.settings)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ds.namespace)
    }

    /// Publishes a Kubernetes Event about `object`. Events are best effort:
    /// failing to record one never fails a reconcile.
    pub async fn event<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            debug!(%error, reason, "event not recorded");
        }
    }

    /// Claims `object` for this manager when it is responsible for it: returns
    /// the object as it is after the claim, or `None` when another manager
    /// acts on it (including when another claimed it first).
    async fn claim<K>(&self, object: &K) -> Result<Option<K>, ControllerError>
    where
        K: Owned
            + Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Serialize
            + DeserializeOwned
            + Debug,
    {
        self.claim_preferring(object, object.preferred_owner())
            .await
    }

    /// [`claim`](Self::claim), with `preferred` as the preferred owner.
    async fn claim_preferring<K>(
        &self,
        object: &K,
        preferred: &str,
    ) -> Result<Option<K>, ControllerError>
    where
        K: Owned
            + Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Serialize
            + DeserializeOwned
            + Debug,
    {
        let current = object.current_owner();
        if !self
            .liveness
            .is_responsible_for(&self.node.node_id, preferred, current)
        {
            return Ok(None);
        }
        if current == self.node.node_id {
            return Ok(Some(object.clone()));
        }
        let mut claimed = object.clone();
        claimed.set_owner(&self.node.node_id);
        match replace_status(&self.api::<K>(), &claimed).await {
            Ok(written) => {
                info!(kind = %K::kind(&()), name = %object.name_any(), from = current, "took ownership");
                Ok(Some(written))
            }
            Err(error) if error.is_conflict() => {
                debug!(name = %object.name_any(), "another manager claimed it first");
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }
}

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

/// Retries soon after a conflict, later after anything else.
fn error_policy<K>(object: Arc<K>, error: &ControllerError, _ctx: Arc<Context>) -> Action
where
    K: Resource,
{
    if error.is_conflict() {
        debug!(name = %object.name_any(), "conflict; looking again");
        return Action::requeue(Duration::from_millis(500));
    }
    warn!(name = %object.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(3))
}

/// Watches node availability and sends `()` each time the set of available
/// nodes changes, so every object whose owner may have changed is looked at
/// again. Subscribe once per controller.
fn watch_liveness(liveness: Liveness) -> broadcast::Sender<()> {
    let (tx, _) = broadcast::channel(4);
    let sender = tx.clone();
    tokio::spawn(async move {
        let mut last = liveness.up_nodes();
        let mut tick = tokio::time::interval(LIVENESS_POLL);
        loop {
            tick.tick().await;
            let now = liveness.up_nodes();
            if now != last {
                info!(up = ?now, was = ?last, "node availability changed");
                last = now;
                // No receiver yet is fine: controllers start from a full list.
                let _ = sender.send(());
            }
        }
    });
    tx
}

fn liveness_changes(changes: &broadcast::Sender<()>) -> impl Stream<Item = ()> + Send + use<> {
    tokio_stream::wrappers::BroadcastStream::new(changes.subscribe())
        .filter_map(|r| futures::future::ready(r.ok()))
}

/// Refers to the object named like each instance whose process state
/// changed. Engines and replicas never share a name, so the controller of the
/// other kind finds no such object and ignores it.
fn instance_changes<K>(
    instances: &InstanceManager,
    ns: &str,
) -> impl Stream<Item = ObjectRef<K>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + 'static,
{
    let ns = ns.to_owned();
    tokio_stream::wrappers::BroadcastStream::new(instances.subscribe()).filter_map(move |r| {
        futures::future::ready(r.ok().map(|name| ObjectRef::new(name.as_str()).within(&ns)))
    })
}

/// The replicas on `node`: what a node change may affect.
fn replicas_on(replicas: &Store<Replica>, node: &str) -> Vec<ObjectRef<Replica>> {
    replicas
        .state()
        .iter()
        .filter(|r| r.spec.instance.node_id == node)
        .map(|r| ObjectRef::from_obj(&**r))
        .collect()
}

/// The volumes a snapshot change concerns: its own volume, whose owner takes
/// and removes it, and the volumes filling from it, which wait for it.
fn snapshot_concerns(volumes: &Store<Volume>, snapshot: &Snapshot) -> Vec<ObjectRef<Volume>> {
    let ns = snapshot.namespace().unwrap_or_default();
    let source = snapshot.name_any();
    volumes
        .state()
        .iter()
        .filter(|v| v.spec.source_snapshot() == Some(&source))
        .map(|v| ObjectRef::from_obj(&**v))
        .chain([ObjectRef::new(&snapshot.spec.volume).within(&ns)])
        .collect()
}

/// The volumes a Backup change concerns: its own volume, whose replicas
/// run while it is taken, and the volumes restoring from it.
fn backup_concerns(volumes: &Store<Volume>, backup: &Backup) -> Vec<ObjectRef<Volume>> {
    let ns = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    volumes
        .state()
        .iter()
        .filter(|v| v.spec.source_backup() == Some(&name))
        .map(|v| ObjectRef::from_obj(&**v))
        .chain([ObjectRef::new(&backup.spec.volume_name).within(&ns)])
        .collect()
}

/// The volume whose snapshot `volume` fills from: its replicas are the
/// source, so it must see how the filling goes.
fn filled_from(
    snapshots: &Store<Snapshot>,
    ns: &str,
    volume: &Volume,
) -> Option<ObjectRef<Volume>> {
    let name = volume.spec.source_snapshot()?;
    let snapshot = snapshots.get(&ObjectRef::new(name).within(ns))?;
    Some(ObjectRef::new(&snapshot.spec.volume).within(ns))
}

/// The Backups of `volume` not completed yet: a change of its snapshots
/// may let them go on.
fn backups_of(backups: &Store<Backup>, volume: &str) -> Vec<ObjectRef<Backup>> {
    backups
        .state()
        .iter()
        .filter(|b| {
            b.spec.volume_name == volume
                && b.status
                    .as_ref()
                    .is_none_or(|s| s.state != BackupState::Completed)
        })
        .map(|b| ObjectRef::from_obj(&**b))
        .collect()
}

/// Runs every controller until the future is dropped. Call after the caches
/// have synced, so that no decision is made on a partial view.
pub async fn run(ctx: Arc<Context>) {
    let ns = ctx.ds.namespace.clone();
    let ds = Arc::clone(&ctx.ds);
    let liveness = watch_liveness(ctx.liveness.clone());
    let by_volume = {
        let ns = ns.clone();
        move |volume: &str| Some(ObjectRef::<Volume>::new(volume).within(&ns))
    };

    let volumes = {
        let (on_replica, on_engine) = (by_volume.clone(), by_volume.clone());
        let (volume_store, snapshot_store) = (ds.volumes.store.clone(), ds.snapshots.store.clone());
        let ns_ = ns.clone();
        Controller::for_shared_stream(
            changed_only(ds.volumes.subscribe()),
            ds.volumes.store.clone(),
        )
        .watches_shared_stream(
            changed_only(ds.replicas.subscribe()),
            move |r: Arc<Replica>| on_replica(&r.spec.instance.volume_name),
        )
        .watches_shared_stream(
            changed_only(ds.engines.subscribe()),
            move |e: Arc<Engine>| on_engine(&e.spec.instance.volume_name),
        )
        .watches_shared_stream(
            changed_only(ds.snapshots.subscribe()),
            move |s: Arc<Snapshot>| snapshot_concerns(&volume_store, &s),
        )
        .watches_shared_stream(
            changed_only(ds.volumes.subscribe()),
            move |v: Arc<Volume>| filled_from(&snapshot_store, &ns_, &v),
        )
        .watches_shared_stream(changed_only(ds.backups.subscribe()), {
            let volume_store = ds.volumes.store.clone();
            move |b: Arc<Backup>| backup_concerns(&volume_store, &b)
        })
        .reconcile_all_on(liveness_changes(&liveness))
        .run(volume::reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|_| futures::future::ready(()))
    };

    let engines = Controller::for_shared_stream(
        changed_only(ds.engines.subscribe()),
        ds.engines.store.clone(),
    )
    .reconcile_on(instance_changes(&ctx.instances, &ns))
    .reconcile_all_on(liveness_changes(&liveness))
    .run(engine::reconcile, error_policy, Arc::clone(&ctx))
    .for_each(|_| futures::future::ready(()));

    let replicas = Controller::for_shared_stream(
        changed_only(ds.replicas.subscribe()),
        ds.replicas.store.clone(),
    )
    .reconcile_on(instance_changes(&ctx.instances, &ns))
    .watches_shared_stream(changed_only(ds.nodes.subscribe()), {
        let replicas = ds.replicas.store.clone();
        move |node: Arc<Node>| replicas_on(&replicas, &node.name_any())
    })
    .reconcile_all_on(liveness_changes(&liveness))
    .run(replica::reconcile, error_policy, Arc::clone(&ctx))
    .for_each(|_| futures::future::ready(()));

    let nodes =
        Controller::for_shared_stream(changed_only(ds.nodes.subscribe()), ds.nodes.store.clone())
            .reconcile_all_on(liveness_changes(&liveness))
            .run(node::reconcile, error_policy, Arc::clone(&ctx))
            .for_each(|_| futures::future::ready(()));

    let settings = Controller::for_shared_stream(
        changed_only(ds.settings.subscribe()),
        ds.settings.store.clone(),
    )
    .reconcile_all_on(liveness_changes(&liveness))
    .run(settings::reconcile, error_policy, Arc::clone(&ctx))
    .for_each(|_| futures::future::ready(()));

    let snapshots = Controller::for_shared_stream(
        changed_only(ds.snapshots.subscribe()),
        ds.snapshots.store.clone(),
    )
    .reconcile_all_on(liveness_changes(&liveness))
    .run(snapshot::reconcile, error_policy, Arc::clone(&ctx))
    .for_each(|_| futures::future::ready(()));

    let backup_targets = Controller::for_shared_stream(
        changed_only(ds.backup_targets.subscribe()),
        ds.backup_targets.store.clone(),
    )
    .reconcile_all_on(liveness_changes(&liveness))
    .run(backup::reconcile_target, error_policy, Arc::clone(&ctx))
    .for_each(|_| futures::future::ready(()));

    let backup_volumes = Controller::for_shared_stream(
        changed_only(ds.backup_volumes.subscribe()),
        ds.backup_volumes.store.clone(),
    )
    .reconcile_all_on(liveness_changes(&liveness))
    .run(backup::reconcile_volume, error_policy, Arc::clone(&ctx))
    .for_each(|_| futures::future::ready(()));

    let backups = {
        let backup_store = ds.backups.store.clone();
        Controller::for_shared_stream(
            changed_only(ds.backups.subscribe()),
            ds.backups.store.clone(),
        )
        .watches_shared_stream(
            changed_only(ds.snapshots.subscribe()),
            move |s: Arc<Snapshot>| backups_of(&backup_store, &s.spec.volume),
        )
        .reconcile_all_on(liveness_changes(&liveness))
        .run(backup::reconcile_backup, error_policy, Arc::clone(&ctx))
        .for_each(|_| futures::future::ready(()))
    };

    let default_backup_target = backup::run_default_target(Arc::clone(&ctx));

    futures::join!(
        volumes,
        engines,
        replicas,
        nodes,
        settings,
        snapshots,
        backup_targets,
        backup_volumes,
        backups,
        default_backup_target
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(name: &str, version: &str) -> Replica {
        let mut replica: Replica = serde_json::from_value(serde_json::json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Replica",
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"volumeName": "v", "volumeSize": 4096}
        }))
        .unwrap();
        replica.metadata.resource_version = Some(version.into());
        replica
    }

    #[test]
    fn a_creation_is_awaited_until_the_cache_has_the_object() {
        let expected = Expectations::default();
        expected.created("v", "v-r-1".into());
        assert!(!expected.satisfied("v", |_| None));
        assert!(expected.satisfied("v", |_| Some("7".into())));
        // Forgotten once seen.
        assert!(expected.satisfied("v", |_| None));
    }

    #[test]
    fn a_change_is_awaited_until_the_cache_moves_past_the_replaced_version() {
        let expected = Expectations::default();
        expected.changed("v", &replica("v-r-1", "5"), &replica("v-r-1", "6"));
        assert!(!expected.satisfied("v", |_| Some("5".into())));
        assert!(expected.satisfied("v", |_| Some("9".into())));
        expected.changed("v", &replica("v-r-1", "9"), &replica("v-r-1", "10"));
        assert!(expected.satisfied("v", |_| None), "deleted since the write");
    }

    #[test]
    fn a_write_that_changed_nothing_is_not_awaited() {
        let expected = Expectations::default();
        expected.changed("v", &replica("v-r-1", "5"), &replica("v-r-1", "5"));
        assert!(expected.satisfied("v", |_| Some("5".into())));
    }

    #[test]
    fn owners_wait_only_for_their_own_writes() {
        let expected = Expectations::default();
        expected.created("v", "v-r-1".into());
        assert!(expected.satisfied("w", |_| None));
    }
}
