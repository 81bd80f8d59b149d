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
    /// Text `check` accepts (its error is for users), described by `what`.
    Text {
        what: &'static str,
        check: fn(&str) -> Result<(), String>,
    },
}

struct Definition {
    key: &'static str,
    kind: Kind,
    default: &'static str,
    /// What the setting does, for users: docs/settings.md is made of these.
    description: &'static str,
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
const SCRUB_INTERVAL: &str = "scrub-interval";
const SCRUB_BANDWIDTH: &str = "scrub-bandwidth-limit";
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
        description: "Replicas of a volume whose StorageClass names no `numberOfReplicas`.",
    },
    Definition {
        key: OVER_PROVISIONING,
        kind: Kind::Integer {
            min: 1,
            max: 10_000,
        },
        default: "100",
        description: "How much of a disk (its size less its reserved space), in percent, may be promised to replicas: 100 promises no more than the disk holds, 200 twice as much.",
    },
    Definition {
        key: MINIMAL_AVAILABLE,
        kind: Kind::Integer { min: 0, max: 100 },
        default: "25",
        description: "A disk whose free space would drop below this percentage of its size takes no new replica.",
    },
    Definition {
        key: SOFT_ANTI_AFFINITY,
        kind: Kind::Boolean,
        default: "false",
        description: "`false`: two replicas of one volume never share a node. `true`: they may, when no other node fits.",
    },
    Definition {
        key: ZONE_SOFT_ANTI_AFFINITY,
        kind: Kind::Boolean,
        default: "true",
        description: "`true`: replicas go to distinct zones when they can. `false`: they must (among nodes that have a zone).",
    },
    Definition {
        key: REPLENISHMENT_WAIT,
        kind: Kind::Integer {
            min: 0,
            max: 86_400,
        },
        default: "600",
        description: "Seconds a failed replica may come back before a new one replaces it.",
    },
    Definition {
        key: STALE_REPLICA_TIMEOUT,
        kind: Kind::Integer {
            min: 1,
            max: 525_600,
        },
        default: "2880",
        description: "Minutes a failed replica is kept, once its volume has enough healthy ones, for volumes whose StorageClass names no `staleReplicaTimeout`.",
    },
    Definition {
        key: AUTO_SALVAGE,
        kind: Kind::Boolean,
        default: "true",
        description: "When every replica of a volume failed, restart it from the most up-to-date ones. It never serves replicas that miss acknowledged writes: that takes a salvage request (see [volumes](volumes.md)).",
    },
    Definition {
        key: REBUILDS_PER_NODE,
        kind: Kind::Integer { min: 1, max: 100 },
        default: "5",
        description: "Replicas one node rebuilds at once; a replica added beyond it waits, so a node coming back does not rebuild all its volumes at once. The count comes from the Engines' statuses, a poll (2 s) old, so managers adding replicas in the same moment may pass it briefly.",
    },
    // MiB/s; 0: no limit. The engine's own default is the same.
    Definition {
        key: REBUILD_BANDWIDTH,
        kind: Kind::Integer {
            min: 0,
            max: 1_000_000,
        },
        default: "100",
        description: "MiB/s one rebuild (or one replica's fill from a snapshot) may average, so that rebuilds leave the volumes' own I/O room; 0: no limit. It applies to rebuilds that start after the change; an Engine shows the value it took in `status.rebuildBandwidthLimit`.",
    },
    Definition {
        key: SCRUB_INTERVAL,
        kind: Kind::Integer {
            min: 0,
            max: 525_600,
        },
        default: "10080",
        description: "Minutes between scrubs of an attached volume, counted from its last scrub (or its creation); 0: none. A scrub checks every block of every replica against its checksum, rewrites rotten ones from another replica, and compares what the replicas read (see [integrity](integrity.md)); the Volume's `status.lastScrub` says what it found.",
    },
    Definition {
        key: SCRUB_BANDWIDTH,
        kind: Kind::Integer {
            min: 0,
            max: 1_000_000,
        },
        default: "50",
        description: "MiB/s a scrub reads on each replica, on average; 0: no limit.",
    },
    Definition {
        key: DELETING_CONFIRMATION,
        kind: Kind::Boolean,
        default: "false",
        description: "`true` lets `oxhorn uninstall` delete the volumes that exist, and their data (see [install](install.md)); it is `false` again after one uninstall.",
    },
    // Empty: no default target.
    Definition {
        key: BACKUP_TARGET,
        kind: Kind::Text {
            what: "empty, or a URL: `s3://bucket@region/path`, `azblob://container@account/path`, `nfs://server:/export/path`, `file:///path`",
            check: backup_target_url,
        },
        default: "",
        description: "The URL of the BackupTarget `default`, which the settings then make and keep (see [backups](backups.md)). Empty: none, and a `default` target the settings made is deleted (forgotten; its store is untouched).",
    },
    Definition {
        key: BACKUP_TARGET_CREDENTIAL_SECRET,
        kind: Kind::Text {
            what: "empty, or a Secret's name",
            check: secret_name,
        },
        default: "",
        description: "The credential Secret of the `default` BackupTarget, in Oxhorn's namespace.",
    },
    // Seconds; 0: synced only when asked.
    Definition {
        key: BACKUPSTORE_POLL_INTERVAL,
        kind: Kind::Integer {
            min: 0,
            max: 31_536_000,
        },
        default: "300",
        description: "Seconds between syncs of the `default` BackupTarget; 0: only when asked.",
    },
    Definition {
        key: BACKUP_COMPRESSION,
        kind: Kind::Choice(Compression::NAMES),
        default: "lz4",
        description: "How new backup blocks are compressed. A block is stored raw when that is smaller, and read back by the encoding it was stored with.",
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
    /// Time between scrubs of an attached volume; zero: none.
    pub scrub_interval: Duration,
    /// Bytes per second a scrub reads on each replica; 0: no limit.
    pub scrub_bandwidth: u64,
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
            scrub_interval: Duration::from_secs(int(SCRUB_INTERVAL).unsigned_abs() * 60),
            scrub_bandwidth: int(SCRUB_BANDWIDTH).unsigned_abs() << 20,
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

/// One setting as users see it: what its value may be, its default and
/// what it does (the REST API lists these).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub key: &'static str,
    /// `integer`, `boolean`, `choice` or `text`.
    pub kind: &'static str,
    /// What the value may be, in words.
    pub allowed: String,
    /// The range of an integer.
    pub range: Option<(i64, i64)>,
    /// The words a choice takes.
    pub choices: &'static [&'static str],
    pub default: &'static str,
    pub description: &'static str,
}

impl Definition {
    fn described(&self) -> Described {
        let (kind, range, choices) = match self.kind {
            Kind::Integer { min, max } => ("integer", Some((min, max)), &[][..]),
            Kind::Boolean => ("boolean", None, &["true", "false"][..]),
            Kind::Choice(words) => ("choice", None, words),
            Kind::Text { .. } => ("text", None, &[][..]),
        };
        Described {
            key: self.key,
            kind,
            allowed: allowed(&self.kind),
            range,
            choices,
            default: self.default,
            description: self.description,
        }
    }
}

/// What a value of `kind` may be, in words (Markdown).
fn allowed(kind: &Kind) -> String {
    match kind {
        Kind::Integer { min, max } => format!("whole number, {min} to {max}"),
        Kind::Boolean => "`true` or `false`".to_owned(),
        Kind::Choice(words) => {
            let words: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
            format!("one of {}", words.join(", "))
        }
        Kind::Text { what, .. } => (*what).to_owned(),
    }
}

/// Every setting, in the order docs/settings.md lists them.
pub fn described() -> impl Iterator<Item = Described> {
    DEFINITIONS.iter().map(Definition::described)
}

/// The setting `key`, if there is one.
pub fn describe(key: &str) -> Option<Described> {
    DEFINITIONS
        .iter()
        .find(|d| d.key == key)
        .map(Definition::described)
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
        Kind::Text { check, .. } => check(value).map_err(|e| format!("{key}: {e}")),
    }
}

/// The top of docs/settings.md; the table follows.
const SETTINGS_PAGE_INTRO: &str = r#"<!-- Generated by `oxhorn docs settings` from src/datastore/settings.rs: edit the definitions there, then run `cargo run -- docs settings > docs/settings.md`. -->
# Settings

Cluster-wide settings are `Setting` objects in the `oxhorn-system`
namespace, each named by its key, with its value as a string in
`spec.value`. A setting with no object has its default. A change applies
on the next reconcile, without a restart. Each Setting's status says
whether its value is in effect (`applied`) and, when it is not, why
(`message`): an invalid value leaves the default in effect.

```sh
kubectl -n oxhorn-system apply --server-side -f - <<'EOF'
apiVersion: oxhorn.io/v1beta1
kind: Setting
metadata: {name: default-replica-count}
spec: {value: "2"}
EOF
kubectl -n oxhorn-system get settings.oxhorn.io   # or: kubectl -n oxhorn-system get oxs
```

| setting | value | default | what it does |
|---|---|---|---|
"#;

/// docs/settings.md: every setting with what it may be, its default and
/// what it does, from the definitions above. `oxhorn docs settings` prints
/// it; a unit test fails when the committed page differs.
pub fn markdown() -> String {
    let mut page = String::from(SETTINGS_PAGE_INTRO);
    for definition in DEFINITIONS {
        let value = allowed(&definition.kind);
        let default = match definition.default {
            "" => "(empty)".to_owned(),
            default => format!("`{default}`"),
        };
        page.push_str(&format!(
            "| `{}` | {value} | {default} | {} |\n",
            definition.key, definition.description
        ));
    }
    page
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
    fn docs_settings_md_is_what_the_definitions_make() {
        let committed = include_str!("../../docs/settings.md");
        assert!(
            committed == markdown(),
            "docs/settings.md is stale: run `cargo run -- docs settings > docs/settings.md`"
        );
        for definition in DEFINITIONS {
            assert!(
                !definition.description.contains('|') && !definition.description.contains('\n'),
                "{}: a description is one table cell",
                definition.key
            );
        }
    }

    #[test]
    fn every_setting_is_described_with_its_range_or_words() {
        let all: Vec<Described> = described().collect();
        assert_eq!(all.len(), DEFINITIONS.len());
        let count = describe(DEFAULT_REPLICA_COUNT).unwrap();
        assert_eq!(
            (count.kind, count.range, count.default),
            ("integer", Some((1, 20)), "3")
        );
        assert_eq!(count.allowed, "whole number, 1 to 20");
        let codec = describe(BACKUP_COMPRESSION).unwrap();
        assert_eq!((codec.kind, codec.choices), ("choice", Compression::NAMES));
        assert_eq!(describe(AUTO_SALVAGE).unwrap().choices, ["true", "false"]);
        assert_eq!(describe(BACKUP_TARGET).unwrap().kind, "text");
        assert_eq!(describe("replica-count"), None);
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
