//! When each manager lease was last seen to change, on this manager's own
//! clock. Expiry is measured from that moment, as client-go's leader election
//! does, never by comparing the holder's renewTime with the local wall clock:
//! two nodes' clocks may disagree by more than a lease.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

/// A lease duration to assume before any lease was seen.
const DEFAULT_DURATION: Duration = Duration::from_secs(15);

pub struct LeaseClock {
    /// When this observer started watching.
    started: Instant,
    seen: Mutex<HashMap<String, Seen>>,
}

struct Seen {
    /// The renewTime last seen, as written (compared, never interpreted).
    renewed: Option<String>,
    /// When it was first seen with that renewTime.
    at: Instant,
    duration: Duration,
}

impl LeaseClock {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records `lease` as seen at `now`; the clock restarts only when its
    /// renewTime changed.
    pub fn observe(&self, lease: &Lease, now: Instant) {
        let spec = lease.spec.as_ref();
        let renewed = spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string());
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .map_or(DEFAULT_DURATION, |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(0))
            });
        let mut seen = self.lock();
        match seen.get_mut(&lease.name_any()) {
            Some(entry) if entry.renewed == renewed => entry.duration = duration,
            _ => {
                seen.insert(
                    lease.name_any(),
                    Seen {
                        renewed,
                        at: now,
                        duration,
                    },
                );
            }
        }
    }

    /// Whether lease `name` (present in the cache) was renewed within its
    /// duration as this observer saw it. One not yet observed has only just
    /// appeared, so it is fresh.
    pub fn is_fresh(&self, name: &str, now: Instant) -> bool {
        self.lock()
            .get(name)
            .is_none_or(|seen| now.duration_since(seen.at) < seen.duration)
    }

    /// Whether this observer has watched for less than a lease duration: a
    /// node it has not seen yet may simply not have been seen, so none is
    /// declared missing until then.
    pub fn warming_up(&self, now: Instant) -> bool {
        let longest = self
            .lock()
            .values()
            .map(|seen| seen.duration)
            .max()
            .unwrap_or(DEFAULT_DURATION);
        now.duration_since(self.started) < longest
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        // Every change is one insert or one field assignment: never torn.
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(renewed: &str, seconds: i32) -> Lease {
        let mut lease = Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        lease.metadata.name = Some("oxhorn-manager-a".into());
        lease
    }

    const S: Duration = Duration::from_secs(1);

    /// A renewTime far in the future (the holder's clock runs ahead) keeps
    /// a lease fresh no longer than its duration once renewals stop, and
    /// one far in the past (the holder's clock runs behind) is fresh while
    /// it keeps changing.
    #[test]
    fn expiry_follows_observed_changes_not_the_holders_clock() {
        let t0 = Instant::now();
        let clock = LeaseClock::new(t0);
        clock.observe(&lease("2099-01-01T00:00:00Z", 10), t0);
        assert!(clock.is_fresh("oxhorn-manager-a", t0 + 9 * S));
        clock.observe(&lease("2099-01-01T00:00:00Z", 10), t0 + 9 * S);
        assert!(
            !clock.is_fresh("oxhorn-manager-a", t0 + 10 * S),
            "no change seen for 10 s"
        );

        clock.observe(&lease("2000-01-01T00:00:00Z", 10), t0 + 11 * S);
        assert!(clock.is_fresh("oxhorn-manager-a", t0 + 20 * S));
        clock.observe(&lease("2000-01-01T00:00:03Z", 10), t0 + 20 * S);
        assert!(clock.is_fresh("oxhorn-manager-a", t0 + 29 * S));
    }

    #[test]
    fn a_lease_not_yet_observed_is_fresh() {
        let t0 = Instant::now();
        assert!(LeaseClock::new(t0).is_fresh("oxhorn-manager-b", t0 + 100 * S));
    }

    #[test]
    fn warming_up_lasts_the_longest_lease_seen() {
        let t0 = Instant::now();
        let clock = LeaseClock::new(t0);
        assert!(clock.warming_up(t0 + 14 * S));
        assert!(
            !clock.warming_up(t0 + 15 * S),
            "the default before any lease"
        );
        clock.observe(&lease("2026-01-01T00:00:00Z", 30), t0);
        assert!(clock.warming_up(t0 + 29 * S));
        assert!(!clock.warming_up(t0 + 30 * S));
    }
}
