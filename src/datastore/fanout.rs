//! One kind's changes, fanned out from its watch to every controller that
//! follows them: objects added or changed, and objects deleted (a volume
//! learns that its last replica is gone from the replica's deletion). A
//! subscriber that falls behind never holds the watch back: it skips ahead
//! and is handed the cache's current objects instead of the changes it
//! missed.
//!
//! kube-runtime's own fan-out (`store_shared`) does not fit: its channel
//! makes the watch wait for the slowest subscriber, so one subscriber left
//! unread stops the cache for good once its buffer fills, and a subscriber
//! whose next object was deleted meanwhile stalls without a wake-up.

use std::sync::Arc;

use futures::{Stream, StreamExt, stream};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

/// The changes kept for subscribers that are momentarily behind.
const BUFFER: usize = 1024;

#[derive(Clone)]
enum Change<K: Resource<DynamicType = ()>> {
    /// Added or changed: read from the cache when a subscriber gets to it,
    /// so the buffer holds references, not objects.
    Applied(ObjectRef<K>),
    /// Gone from the cache: its last state.
    Deleted(Arc<K>),
}

pub struct Fanout<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
}

impl<K> Fanout<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// A fan-out of the changes applied to `store`.
    pub fn new(store: Store<K>) -> Self {
        Self {
            store,
            changes: broadcast::channel(BUFFER).0,
        }
    }

    /// Passes on a watch event the cache has applied: an object added,
    /// changed or deleted, or after a (re)list, every object.
    pub fn publish(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => {
                self.send(Change::Applied(ObjectRef::from_obj(object)))
            }
            watcher::Event::Delete(object) => self.send(Change::Deleted(Arc::new(object.clone()))),
            watcher::Event::InitDone => {
                for object in self.store.state() {
                    self.send(Change::Applied(ObjectRef::from_obj(&*object)));
                }
            }
            // A re-list's objects come all together at InitDone.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    fn send(&self, change: Change<K>) {
        // No subscriber yet is fine: each starts from the cache's contents.
        let _ = self.changes.send(change);
    }

    /// Every object in the cache now, then each object as it changes or is
    /// deleted. A subscriber that fell behind gets every object again (the
    /// deletions it missed are lost; finalizers make up for that).
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        // Subscribe before reading the cache, so nothing in between is lost.
        let changes = BroadcastStream::new(self.changes.subscribe());
        let store = self.store.clone();
        let current = self.store.state();
        stream::iter(current).chain(changes.flat_map(move |change| {
            let objects = match change {
                // Deleted since: its deletion follows.
                Ok(Change::Applied(object)) => store.get(&object).into_iter().collect(),
                Ok(Change::Deleted(object)) => vec![object],
                Err(BroadcastStreamRecvError::Lagged(_)) => store.state(),
            };
            stream::iter(objects)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector::{self, store::Writer};

    fn config_map(name: &str, version: u64) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                resource_version: Some(version.to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn apply(writer: &mut Writer<ConfigMap>, fanout: &Fanout<ConfigMap>, object: ConfigMap) {
        let event = watcher::Event::Apply(object);
        writer.apply_watcher_event(&event);
        fanout.publish(&event);
    }

    /// What the stream has ready now, as (name, resourceVersion). Outside
    /// tokio's cooperative budget, which would cut a long read short.
    fn ready(changes: &mut (impl Stream<Item = Arc<ConfigMap>> + Unpin)) -> Vec<(String, String)> {
        let mut seen = Vec::new();
        while let Some(Some(object)) = tokio::task::unconstrained(changes.next()).now_or_never() {
            seen.push((
                object.name_any(),
                object.resource_version().unwrap_or_default(),
            ));
        }
        seen
    }

    fn named(name: &str, version: u64) -> (String, String) {
        (name.to_owned(), version.to_string())
    }

    #[tokio::test]
    async fn subscribers_start_from_the_cache_then_follow_changes() {
        let (store, mut writer) = reflector::store();
        let fanout = Fanout::new(store);
        apply(&mut writer, &fanout, config_map("a", 1));
        let mut changes = Box::pin(fanout.subscribe());
        apply(&mut writer, &fanout, config_map("b", 2));
        apply(&mut writer, &fanout, config_map("a", 3));
        assert_eq!(
            ready(&mut changes),
            vec![named("a", 1), named("b", 2), named("a", 3)]
        );
    }

    #[tokio::test]
    async fn an_unread_subscriber_never_holds_changes_back() {
        let (store, mut writer) = reflector::store();
        let fanout = Fanout::new(store);
        let _idle = fanout.subscribe();
        let mut behind = Box::pin(fanout.subscribe());
        // Many more changes than the buffer holds: publishing never waits,
        // and the subscriber that fell behind gets the latest of each object.
        for version in 0..(4 * BUFFER as u64) {
            apply(&mut writer, &fanout, config_map("a", version));
        }
        apply(&mut writer, &fanout, config_map("b", 1));
        let seen = ready(&mut behind);
        assert!(
            seen.contains(&named("a", 4 * BUFFER as u64 - 1)),
            "{seen:?}"
        );
        assert_eq!(seen.last(), Some(&named("b", 1)));
        assert!(seen.len() <= BUFFER + 2, "{} objects", seen.len());

        let mut on_time = Box::pin(fanout.subscribe());
        ready(&mut on_time);
        apply(&mut writer, &fanout, config_map("a", 9999));
        assert_eq!(ready(&mut on_time), vec![named("a", 9999)]);
    }

    #[tokio::test]
    async fn a_deletion_is_passed_on_and_not_waited_for() {
        let (store, mut writer) = reflector::store();
        let fanout = Fanout::new(store);
        let mut changes = Box::pin(fanout.subscribe());
        apply(&mut writer, &fanout, config_map("gone", 1));
        let deletion = watcher::Event::Delete(config_map("gone", 2));
        writer.apply_watcher_event(&deletion);
        fanout.publish(&deletion);
        apply(&mut writer, &fanout, config_map("kept", 3));
        // The change the subscriber reads after the deletion is skipped.
        assert_eq!(
            ready(&mut changes),
            vec![named("gone", 2), named("kept", 3)]
        );
    }
}
