//! How soon a failed reconcile is retried: half a second after a conflict
//! (another writer was first: look again at once), otherwise
//! [`FIRST_RETRY`] doubling with each failure in a row of the same object,
//! up to [`LAST_RETRY`]. An object that keeps failing (an engine that
//! cannot be reached, a Secret that cannot be used) then costs a pass a
//! minute, not one every few seconds, for as long as it fails. A success
//! starts it over.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub const CONFLICT_RETRY: Duration = Duration::from_millis(500);
pub const FIRST_RETRY: Duration = Duration::from_secs(3);
/// Long enough that a failing object costs next to nothing, short enough
/// that one whose trouble clears without any event (an engine that answers
/// again) recovers within a minute.
pub const LAST_RETRY: Duration = Duration::from_secs(60);

/// Failures in a row, per object ("Kind/name").
#[derive(Default)]
pub struct Retries {
    failures: Mutex<HashMap<String, u32>>,
}

impl Retries {
    fn failures(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        // Plain counters, left whole by any panicking holder.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a failure of `object`; how long until its next attempt.
    pub fn failed(&self, object: &str) -> Duration {
        let mut failures = self.failures();
        let count = failures.entry(object.to_owned()).or_insert(0);
        let delay = FIRST_RETRY
            .saturating_mul(1 << (*count).min(16))
            .min(LAST_RETRY);
        *count = count.saturating_add(1);
        delay
    }

    /// `object` reconciled: its next failure waits [`FIRST_RETRY`] again.
    pub fn succeeded(&self, object: &str) {
        self.failures().remove(object);
    }

    /// How many objects of each kind wait to retry after a failure.
    pub fn waiting(&self) -> BTreeMap<String, usize> {
        let mut waiting = BTreeMap::new();
        for object in self.failures().keys() {
            let kind = object
                .split_once('/')
                .map_or(object.as_str(), |(kind, _)| kind);
            *waiting.entry(kind.to_owned()).or_default() += 1;
        }
        waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_per_object_and_start_over_after_a_success() {
        let retries = Retries::default();
        let delays: Vec<u64> = (0..10)
            .map(|_| retries.failed("Engine/e").as_secs())
            .collect();
        assert_eq!(delays, [3, 6, 12, 24, 48, 60, 60, 60, 60, 60]);
        assert_eq!(retries.failed("Engine/other"), FIRST_RETRY);
        retries.succeeded("Engine/e");
        assert_eq!(retries.failed("Engine/e"), FIRST_RETRY);
        // Many failures in a row never overflow the delay.
        let last = (0..100).map(|_| retries.failed("Replica/r")).last();
        assert_eq!(last, Some(LAST_RETRY));
        let waiting = retries.waiting();
        assert_eq!(waiting.get("Engine"), Some(&2));
        assert_eq!(waiting.get("Replica"), Some(&1));
    }
}
