//! The datastore: one watch per resource kind per process, feeding in-memory
//! caches (reflector stores) that every controller and CSI service reads, and
//! fanning each kind's changes out to every controller that follows it.
//! kube-runtime's watcher resumes from the last resourceVersion and re-lists
//! when the server says it is too old, so the caches converge after any gap.

mod changes;
mod chap;
mod fanout;
mod idempotent;
mod lease_clock;
mod liveness;
pub mod settings;

pub use changes::changed_only;
pub use idempotent::{create_if_absent, unless_gone};
pub use lease_clock::LeaseClock;
pub use liveness::{Down, Liveness};
pub use settings::Settings;

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Instant;

use fanout::Fanout;
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node as KubeNode, PersistentVolumeClaim, Secret};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, warn};

use crate::types::{
    Backup, BackupTarget, BackupVolume, Engine, Node, RecurringJob, Replica, Setting, Snapshot,
    SystemBackup, SystemRestore, Volume,
};

/// One kind's cache and the fan-out controllers follow its changes through.
pub struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    pub store: Store<K>,
    changes: Arc<Fanout<K>>,
    /// Where the cached objects are; `None` for a cluster-scoped kind.
    namespace: Option<String>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: Arc::clone(&self.changes),
            namespace: self.namespace.clone(),
        }
    }
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The cache of `store`, holding the objects of `namespace`.
    pub fn new(store: Store<K>, namespace: Option<&str>) -> Self {
        Self {
            changes: Arc::new(Fanout::new(store.clone())),
            store,
            namespace: namespace.map(str::to_owned),
        }
    }

    /// The object `name` as the cache has it.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        let key = ObjectRef::new(name);
        let key = match &self.namespace {
            Some(namespace) => key.within(namespace),
            None => key,
        };
        self.store.get(&key)
    }

    /// Every object in the cache now, then each object as it changes; every
    /// object again after a re-list, or when the subscriber fell behind.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.changes.subscribe()
    }
}

/// Caches of every resource the manager reads: oxhorn's in its namespace,
/// the Kubernetes nodes, the managers' leases, and the Secrets of oxhorn's
/// namespace (volumes' CHAP credentials). Dropping the datastore
/// stops its watches.
pub struct Datastore {
    pub namespace: String,
    pub volumes: Cache<Volume>,
    pub engines: Cache<Engine>,
    pub replicas: Cache<Replica>,
    pub nodes: Cache<Node>,
    pub settings: Cache<Setting>,
    pub snapshots: Cache<Snapshot>,
    pub backup_targets: Cache<BackupTarget>,
    pub backup_volumes: Cache<BackupVolume>,
    pub backups: Cache<Backup>,
    pub recurring_jobs: Cache<RecurringJob>,
    pub system_backups: Cache<SystemBackup>,
    pub system_restores: Cache<SystemRestore>,
    pub kube_nodes: Cache<KubeNode>,
    pub leases: Cache<Lease>,
    pub secrets: Cache<Secret>,
    /// The claims, in every namespace, that choose their volume's recurring
    /// jobs (labelled so; no other claim is watched).
    pub claims: Cache<PersistentVolumeClaim>,
    /// When each lease was last seen to change, on this process's clock.
    pub lease_clock: Arc<LeaseClock>,
    ready: watch::Receiver<bool>,
    _tasks: JoinSet<()>,
}

impl Datastore {
    /// Starts the watches in `namespace` on the current tokio runtime.
    pub fn start(client: &Client, namespace: &str) -> Self {
        let mut tasks = JoinSet::new();
        let mut synced = Vec::new();
        let mut w = Watches {
            tasks: &mut tasks,
            synced: &mut synced,
            client,
            namespace,
        };
        let (volumes, engines, replicas) = (w.ours(), w.ours(), w.ours());
        let (nodes, settings, snapshots) = (w.ours(), w.ours(), w.ours());
        let (backup_targets, backup_volumes, backups) = (w.ours(), w.ours(), w.ours());
        let (secrets, recurring_jobs) = (w.ours(), w.ours());
        let (system_backups, system_restores) = (w.ours(), w.ours());
        let kube_nodes = cache::<KubeNode>(
            &mut tasks,
            &mut synced,
            Api::all(client.clone()),
            watcher::Config::default(),
        );
        let leases = cache::<Lease>(
            &mut tasks,
            &mut synced,
            Api::namespaced(client.clone(), namespace),
            watcher::Config::default().labels(crate::types::MANAGER_LEASE_SELECTOR),
        );

        // Only the claims' own controller reads them: the manager is ready
        // without them (a ClusterRole that cannot watch claims costs the
        // feature, not the node).
        let claims = cache::<PersistentVolumeClaim>(
            &mut tasks,
            &mut Vec::new(),
            Api::all(client.clone()),
            watcher::Config::default().labels(crate::types::SOURCE_SELECTOR),
        );

        let lease_clock = Arc::new(LeaseClock::new(Instant::now()));
        let clock = Arc::clone(&lease_clock);
        let mut lease_changes = leases.subscribe();
        tasks.spawn(async move {
            while let Some(lease) = lease_changes.next().await {
                clock.observe(&lease, Instant::now());
            }
        });

        let (ready_tx, ready) = watch::channel(false);
        tasks.spawn(async move {
            if futures::future::try_join_all(synced).await.is_ok() {
                tracing::info!("caches synced");
                let _ = ready_tx.send(true);
            }
        });
        Self {
            namespace: namespace.to_owned(),
            volumes,
            engines,
            replicas,
            nodes,
            settings,
            snapshots,
            backup_targets,
            backup_volumes,
            backups,
            recurring_jobs,
            system_backups,
            system_restores,
            kube_nodes,
            leases,
            secrets,
            claims,
            lease_clock,
            ready,
            _tasks: tasks,
        }
    }

    /// Turns true once every cache has completed its first list.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }

    /// Waits until every cache has completed its first list.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.readiness();
        // The sender lives in a task owned by self, so it cannot go away first.
        let _ = ready.wait_for(|ready| *ready).await;
    }
}

/// Futures that complete when a cache has completed its first list.
type Synced = Vec<futures::future::BoxFuture<'static, Result<(), reflector::store::WriterDropped>>>;

/// What starting the namespace's caches needs.
struct Watches<'a> {
    tasks: &'a mut JoinSet<()>,
    synced: &'a mut Synced,
    client: &'a Client,
    namespace: &'a str,
}

impl Watches<'_> {
    /// A cache of every `K` in oxhorn's namespace.
    fn ours<K>(&mut self) -> Cache<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        let api = Api::namespaced(self.client.clone(), self.namespace);
        cache(self.tasks, self.synced, api, watcher::Config::default())
    }
}

/// Starts a shared reflector for `K` and returns its cache. Watch errors (the
/// API server restarting, RBAC not yet granted) are logged and retried with
/// backoff. managedFields are dropped: nothing reads them and they are often
/// the larger half of an object.
fn cache<K>(
    tasks: &mut JoinSet<()>,
    synced: &mut Synced,
    api: Api<K>,
    config: watcher::Config,
) -> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    let (store, writer) = reflector::store();
    let ready = store.clone();
    synced.push(Box::pin(async move { ready.wait_until_ready().await }));
    let cache = Cache::new(store, api.namespace());
    let fanout = Arc::clone(&cache.changes);
    let kind = K::kind(&());
    let stream = reflector(
        writer,
        watcher(api, config).modify(|object: &mut K| object.managed_fields_mut().clear()),
    )
    .default_backoff()
    .for_each(move |event| {
        match event {
            Ok(event) => fanout.publish(&event),
            Err(error) => warn!(%error, "watch failed; retrying"),
        }
        futures::future::ready(())
    });
    tasks.spawn(stream.instrument(tracing::info_span!("watch", %kind)));
    cache
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_of<K>(namespace: Option<&str>, objects: Vec<K>) -> Cache<K>
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let (store, mut writer) = reflector::store();
        for object in objects {
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        Cache::new(store, namespace)
    }

    fn in_namespace(name: &str, namespace: &str) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.into());
        secret.metadata.namespace = Some(namespace.into());
        secret
    }

    #[test]
    fn a_namespaced_cache_finds_names_in_its_namespace_only() {
        let secrets = cache_of(
            Some("oxhorn-system"),
            vec![
                in_namespace("ours", "oxhorn-system"),
                in_namespace("theirs", "other"),
            ],
        );
        assert!(secrets.get("ours").is_some());
        assert!(secrets.get("theirs").is_none());
    }

    #[test]
    fn a_cluster_scoped_cache_finds_names_without_a_namespace() {
        let mut node = KubeNode::default();
        node.metadata.name = Some("node-1".into());
        let nodes = cache_of(None, vec![node]);
        assert!(nodes.get("node-1").is_some());
        assert!(nodes.get("node-2").is_none());
    }
}
