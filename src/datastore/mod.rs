//! The datastore: one watch per resource kind per process, feeding in-memory
//! caches (reflector stores) that every controller and CSI service reads.
//! kube-runtime's watcher resumes from the last resourceVersion and re-lists
//! when the server says it is too old, so the caches converge after any gap.

use std::fmt::Debug;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{Instrument, warn};

use crate::types::{Engine, Node, Replica, Setting, Volume};

/// Caches of every oxhorn resource in the manager's namespace. Dropping the
/// datastore stops its watches.
pub struct Datastore {
    pub volumes: Store<Volume>,
    pub engines: Store<Engine>,
    pub replicas: Store<Replica>,
    pub nodes: Store<Node>,
    pub settings: Store<Setting>,
    ready: watch::Receiver<bool>,
    _tasks: JoinSet<()>,
}

impl Datastore {
    /// Starts the watches in `namespace` on the current tokio runtime.
    pub fn start(client: &Client, namespace: &str) -> Self {
        let mut tasks = JoinSet::new();
        let volumes = cache::<Volume>(&mut tasks, client, namespace);
        let engines = cache::<Engine>(&mut tasks, client, namespace);
        let replicas = cache::<Replica>(&mut tasks, client, namespace);
        let nodes = cache::<Node>(&mut tasks, client, namespace);
        let settings = cache::<Setting>(&mut tasks, client, namespace);

        let (ready_tx, ready) = watch::channel(false);
        let waits = (
            volumes.clone(),
            engines.clone(),
            replicas.clone(),
            nodes.clone(),
            settings.clone(),
        );
        tasks.spawn(async move {
            let (v, e, r, n, s) = waits;
            let synced = futures::try_join!(
                v.wait_until_ready(),
                e.wait_until_ready(),
                r.wait_until_ready(),
                n.wait_until_ready(),
                s.wait_until_ready(),
            );
            if synced.is_ok() {
                tracing::info!("caches synced");
                let _ = ready_tx.send(true);
            }
        });
        Self {
            volumes,
            engines,
            replicas,
            nodes,
            settings,
            ready,
            _tasks: tasks,
        }
    }

    /// Turns true once every cache has completed its first list.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }
}

/// Starts a reflector for `K` and returns its store. Watch errors (the API
/// server restarting, RBAC not yet granted) are logged and retried with backoff.
fn cache<K>(tasks: &mut JoinSet<()>, client: &Client, namespace: &str) -> Store<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let (reader, writer) = reflector::store();
    let kind = K::kind(&());
    let stream = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .for_each(|event| {
            if let Err(error) = event {
                warn!(%error, "watch failed; retrying");
            }
            futures::future::ready(())
        });
    tasks.spawn(stream.instrument(tracing::info_span!("watch", %kind)));
    reader
}
