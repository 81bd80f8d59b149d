//! [`Expectations`]: the writes a reconcile waits to see in the caches
//! before it decides again.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::{Resource, ResourceExt};
use tracing::warn;

/// Longest a reconcile waits for the caches to show its own earlier writes.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Replica;

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
