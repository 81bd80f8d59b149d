//! Drops objects a controller has already seen at the same resourceVersion:
//! a re-list after a watch gap emits every object again, and reconciling an
//! unchanged object would only repeat the last reconcile.

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::{Resource, ResourceExt};

/// Passes an object on only when its resourceVersion differs from the last
/// one seen for the same uid.
pub fn changed_only<K, S>(objects: S) -> impl Stream<Item = Arc<K>> + Send
where
    K: Resource + Send + Sync + 'static,
    S: Stream<Item = Arc<K>> + Send + 'static,
{
    let mut seen: HashMap<String, String> = HashMap::new();
    objects.filter(move |object| {
        let key = object.uid().unwrap_or_else(|| object.name_any());
        let version = object.resource_version().unwrap_or_default();
        let fresh = seen.get(&key) != Some(&version);
        if fresh {
            seen.insert(key, version);
        }
        futures::future::ready(fresh)
    })
}
