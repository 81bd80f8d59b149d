//! Cluster-wide settings: typed, with defaults, read from the Setting cache
//! at each use so a change takes effect on the next reconcile, no restart.
//! What each Setting's value may be is defined here, for the controllers and
//! the CSI services alike; the settings controller tells users whether
//! their value is in effect.

use std::time::Duration;

use kube::runtime::reflector::Store;

use crate::scheduler::SchedulerSettings;
use crate::types::Setting;

/// What a setting's value must look like.
enum Kind {
    Integer { min: i64, max: i64 },
    Boolean,
}

struct Definition {
    key: &'static str,
    kind: Kind,
    default: &'static str,
}

const DEFAULT_REPLICA_COUNT: &str = "default-replica-count";
const OVER_PROVISIONING: &str = "storage-over-provisioning-percentage";
const MINIMAL_AVAILABLE: &str = "storage-minimal-available-percentage";
const SOFT_ANTI_AFFINITY: &str = "replica-soft-anti-affinity";
const ZONE_SOFT_ANTI_AFFINITY: &str = "replica-zone-soft-anti-affinity";
const REPLENISHMENT_WAIT: &str = "replica-replenishment-wait-interval";
const STALE_REPLICA_TIMEOUT: &str = "stale-replica-timeout";
const AUTO_SALVAGE: &str = "auto-salvage";
const REBUILDS_PER_NODE: &str = "concurrent-replica-rebuild-per-node-limit";
const REBUILD_BANDWIDTH: &str = "replica-rebuild-bandwidth-limit";
/// Whether `oxhorn uninstall` may delete volumes, and their data.
pub const DELETING_CONFIRMATION: &str = "deleting-confirmation-flag";

const DEFINITIONS: &[Definition] = &[
    Definition {
        key: DEFAULT_REPLICA_COUNT,
        kind: Kind::Integer { min: 1, max: 20 },
        default: "3",
    },
    Definition {
        key: OVER_PROVISIONING,
        kind: Kind::Integer {
            min: 1,
            max: 10_000,
        },
        default: "100",
    },
    Definition {
        key: MINIMAL_AVAILABLE,
        kind: Kind::Integer { min: 0, max: 100 },
        default: "25",
    },
    Definition {
        key: SOFT_ANTI_AFFINITY,
        kind: Kind::Boolean,
        default: "false",
    },
    Definition {
        key: ZONE_SOFT_ANTI_AFFINITY,
        kind: Kind::Boolean,
        default: "true",
    },
    Definition {
        key: REPLENISHMENT_WAIT,
        kind: Kind::Integer {
            min: 0,
            max: 86_400,
        },
        default: "600",
    },
    Definition {
        key: STALE_REPLICA_TIMEOUT,
        kind: Kind::Integer {
            min: 1,
            max: 525_600,
        },
        default: "2880",
    },
    Definition {
        key: AUTO_SALVAGE,
        kind: Kind::Boolean,
        default: "true",
    },
    Definition {
        key: REBUILDS_PER_NODE,
        kind: Kind::Integer { min: 1, max: 100 },
        default: "5",
    },
    // MiB/s; 0: no limit. The engine's own default is the same.
    Definition {
        key: REBUILD_BANDWIDTH,
        kind: Kind::Integer {
            min: 0,
            max: 1_000_000,
        },
        default: "100",
    },
    Definition {
        key: DELETING_CONFIRMATION,
        kind: Kind::Boolean,
        default: "false",
    },
];

/// The settings in effect.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Replicas of a volume whose request names no count.
    pub default_replica_count: i32,
    pub scheduler: SchedulerSettings,
    /// How long a failed replica may come back before a new one replaces it.
    pub replenishment_wait: Duration,
    /// Minutes a failed replica is kept, for volumes created without a timeout.
    pub stale_replica_timeout: i64,
    /// Whether a volume whose replicas all failed is brought back from the
    /// most up-to-date ones.
    pub auto_salvage: bool,
    /// Replicas one node may be rebuilding at once; more wait their turn.
    pub rebuilds_per_node: usize,
    /// Bytes per second one rebuild (or one replica's fill from a
    /// snapshot) may average; 0: no limit.
    pub rebuild_bandwidth: u64,
}

impl Settings {
    /// The values in `store`, each falling back to its default when unset or
    /// invalid.
    pub fn read(store: &Store<Setting>, namespace: &str) -> Self {
        let value = |key: &str| -> String {
            let object =
                store.get(&kube::runtime::reflector::ObjectRef::new(key).within(namespace));
            match object {
                Some(setting) if validate(key, &setting.spec.value).is_ok() => {
                    setting.spec.value.trim().to_owned()
                }
                _ => default_of(key).to_owned(),
            }
        };
        let int = |key: &str| value(key).parse::<i64>().unwrap_or_default();
        let boolean = |key: &str| value(key) == "true";
        Self {
            default_replica_count: i32::try_from(int(DEFAULT_REPLICA_COUNT)).unwrap_or(3),
            scheduler: SchedulerSettings {
                over_provisioning_percentage: int(OVER_PROVISIONING).unsigned_abs(),
                minimal_available_percentage: int(MINIMAL_AVAILABLE).unsigned_abs(),
                soft_node_anti_affinity: boolean(SOFT_ANTI_AFFINITY),
                soft_zone_anti_affinity: boolean(ZONE_SOFT_ANTI_AFFINITY),
            },
            replenishment_wait: Duration::from_secs(int(REPLENISHMENT_WAIT).unsigned_abs()),
            stale_replica_timeout: int(STALE_REPLICA_TIMEOUT),
            auto_salvage: boolean(AUTO_SALVAGE),
            rebuilds_per_node: usize::try_from(int(REBUILDS_PER_NODE)).unwrap_or(5),
            rebuild_bandwidth: int(REBUILD_BANDWIDTH).unsigned_abs() << 20,
        }
    }
}

fn default_of(key: &str) -> &'static str {
    DEFINITIONS
        .iter()
        .find(|d| d.key == key)
        .map_or("", |d| d.default)
}

/// Whether `value` is valid for setting `key`; the error is for users.
pub fn validate(key: &str, value: &str) -> Result<(), String> {
    let Some(definition) = DEFINITIONS.iter().find(|d| d.key == key) else {
        let known: Vec<&str> = DEFINITIONS.iter().map(|d| d.key).collect();
        return Err(format!(
            "unknown setting {key:?}; known settings: {}",
            known.join(", ")
        ));
    };
    let value = value.trim();
    match definition.kind {
        Kind::Boolean if value == "true" || value == "false" => Ok(()),
        Kind::Boolean => Err(format!("{key} must be true or false, not {value:?}")),
        Kind::Integer { min, max } => match value.parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(()),
            _ => Err(format!(
                "{key} must be a whole number from {min} to {max}, not {value:?}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_against_their_kind_and_range() {
        assert!(validate(DEFAULT_REPLICA_COUNT, "2").is_ok());
        assert!(validate(DEFAULT_REPLICA_COUNT, " 2 ").is_ok());
        let zero = validate(DEFAULT_REPLICA_COUNT, "0").unwrap_err();
        assert!(zero.contains("from 1 to 20"), "{zero}");
        assert!(
            validate(AUTO_SALVAGE, "yes")
                .unwrap_err()
                .contains("true or false")
        );
        let unknown = validate("replica-count", "3").unwrap_err();
        assert!(unknown.contains("unknown setting") && unknown.contains(DEFAULT_REPLICA_COUNT));
    }

    #[test]
    fn every_default_is_valid() {
        for definition in DEFINITIONS {
            assert_eq!(
                validate(definition.key, definition.default),
                Ok(()),
                "{}",
                definition.key
            );
        }
    }

    #[test]
    fn the_rebuild_bandwidth_default_is_the_engines() {
        let (store, _writer) = kube::runtime::reflector::store::<Setting>();
        let settings = Settings::read(&store, "oxhorn-system");
        assert_eq!(
            settings.rebuild_bandwidth,
            crate::engine::DEFAULT_REBUILD_LIMIT
        );
    }
}
