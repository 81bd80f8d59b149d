//! Cluster-wide settings: typed, with defaults, read from the Setting cache
//! at each use so a change takes effect on the next reconcile, no restart.
//! What each Setting's value may be is defined here, for the controllers and
//! the CSI services alike; the settings controller tells users whether
//! their value is in effect.

use std::time::Duration;

use super::Cache;
use crate::backup::Compression;
use crate::backup::target::TargetUrl;
use crate::names::validate_dns_subdomain;
use crate::scheduler::SchedulerSettings;
use crate::types::Setting;

/// What a setting's value must look like.
enum Kind {
    Integer {
        min: i64,
        max: i64,
    },
    Boolean,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Text this function accepts; its error is for users.
    Text(fn(&str) -> Result<(), String>),
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
/// The default BackupTarget is made from these three (see
/// `controller::backup::default_target`).
pub const BACKUP_TARGET: &str = "backup-target";
pub const BACKUP_TARGET_CREDENTIAL_SECRET: &str = "backup-target-credential-secret";
pub const BACKUPSTORE_POLL_INTERVAL: &str = "backupstore-poll-interval";
const BACKUP_COMPRESSION: &str = "backup-compression-method";

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
    // Empty: no default target.
    Definition {
        key: BACKUP_TARGET,
        kind: Kind::Text(backup_target_url),
        default: "",
    },
    Definition {
        key: BACKUP_TARGET_CREDENTIAL_SECRET,
        kind: Kind::Text(secret_name),
        default: "",
    },
    // Seconds; 0: synced only when asked.
    Definition {
        key: BACKUPSTORE_POLL_INTERVAL,
        kind: Kind::Integer {
            min: 0,
            max: 31_536_000,
        },
        default: "300",
    },
    Definition {
        key: BACKUP_COMPRESSION,
        kind: Kind::Choice(Compression::NAMES),
        default: "lz4",
    },
];

fn backup_target_url(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    TargetUrl::parse(value)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn secret_name(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    validate_dns_subdomain("the Secret's name", value)
}

/// The default BackupTarget the settings describe: its URL (empty: none),
/// credential Secret and poll interval in seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultBackupTarget {
    pub url: String,
    pub credential_secret: String,
    pub poll_interval: u64,
}

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
    pub default_backup_target: DefaultBackupTarget,
    /// How new backup blocks are compressed.
    pub backup_compression: Compression,
}

impl Settings {
    /// The values in `settings`, each falling back to its default when unset
    /// or invalid.
    pub fn read(settings: &Cache<Setting>) -> Self {
        let value = |key: &str| -> String {
            match settings.get(key) {
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
            default_backup_target: DefaultBackupTarget {
                url: value(BACKUP_TARGET),
                credential_secret: value(BACKUP_TARGET_CREDENTIAL_SECRET),
                poll_interval: int(BACKUPSTORE_POLL_INTERVAL).unsigned_abs(),
            },
            backup_compression: Compression::from_name(&value(BACKUP_COMPRESSION))
                .unwrap_or_default(),
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
        Kind::Choice(words) if words.contains(&value) => Ok(()),
        Kind::Choice(words) => Err(format!(
            "{key} must be one of {}, not {value:?}",
            words.join(", ")
        )),
        Kind::Text(check) => check(value).map_err(|e| format!("{key}: {e}")),
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
        assert!(validate(BACKUP_TARGET, "").is_ok());
        assert!(validate(BACKUP_TARGET, "s3://bucket@us-east-1/path").is_ok());
        let url = validate(BACKUP_TARGET, "s3://bucket").unwrap_err();
        assert!(
            url.starts_with("backup-target: invalid backup target URL"),
            "{url}"
        );
        let secret = validate(BACKUP_TARGET_CREDENTIAL_SECRET, "My_Secret").unwrap_err();
        assert!(secret.contains("Secret"), "{secret}");
        let codec = validate(BACKUP_COMPRESSION, "gzip").unwrap_err();
        assert!(codec.contains("one of lz4, zstd, none"), "{codec}");
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
        let settings = Settings::read(&Cache::new(store, Some("oxhorn-system")));
        assert_eq!(
            settings.rebuild_bandwidth,
            crate::engine::DEFAULT_REBUILD_LIMIT
        );
    }
}
