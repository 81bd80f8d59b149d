//! What a CreateVolume asks for beyond its name: the StorageClass parameters,
//! parsed into typed values, and the capacity range, turned into a size.
//! Anything unknown or malformed is an INVALID_ARGUMENT naming the key.

use std::collections::{BTreeMap, HashMap};

use super::error::ControllerServiceError;
use crate::host::filesystem::FsType;
use crate::types::{
    DataLocality, ENABLED, GROUP_LABEL_PREFIX, JOB_LABEL_PREFIX, ReplicaAutoBalance, VolumeFrontend,
};

const MIB: i64 = 1 << 20;
/// Sizes are whole numbers of this: the data plane's rebuild chunk.
pub const SIZE_GRANULE: i64 = 2 * MIB;
/// The smallest volume: room for a filesystem's metadata and a little data.
pub const MIN_VOLUME_SIZE: i64 = 16 * MIB;
/// The size of a volume whose request names none.
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;

/// Keys the external-provisioner adds (PVC and PV names with
/// --extra-create-metadata); they describe the request, not the volume.
const PROVISIONER_PREFIX: &str = "csi.storage.k8s.io/";

const KNOWN_KEYS: &[&str] = &[
    "numberOfReplicas",
    "staleReplicaTimeout",
    "dataLocality",
    "diskSelector",
    "nodeSelector",
    "replicaAutoBalance",
    "fsType",
    "frontend",
    "chapSecret",
    "fromBackup",
    "recurringJobSelector",
];

/// A Backup's name, given as itself or as the URL in its status
/// (`<target URL>?backup=<name>&volume=<volume>`).
fn backup_name(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Ok(String::new());
    }
    let name = match value.split_once('?') {
        Some((_, query)) => query
            .split('&')
            .find_map(|pair| pair.strip_prefix("backup="))
            .unwrap_or_default(),
        None => value,
    };
    crate::names::validate_dns_subdomain("a Backup name", name)?;
    Ok(name.to_owned())
}

/// `recurringJobSelector`, as Longhorn's: a JSON list of jobs and groups,
/// `[{"name": "daily", "isGroup": false}, {"name": "gold", "isGroup": true}]`,
/// as the volume labels that join them.
fn recurring_job_selector(value: &str) -> Result<BTreeMap<String, String>, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Selected {
        name: String,
        #[serde(default)]
        is_group: bool,
    }
    let selected: Vec<Selected> = serde_json::from_str(value)
        .map_err(|e| format!("not a JSON list of {{\"name\": ..., \"isGroup\": ...}}: {e}"))?;
    selected
        .into_iter()
        .map(|s| {
            let label = s.name.len() <= 63 && !s.name.contains('.');
            crate::names::validate_dns_subdomain("a recurring job or group name", &s.name)?;
            if !label {
                return Err(format!("{:?} is longer than a label allows (63)", s.name));
            }
            let prefix = if s.is_group {
                GROUP_LABEL_PREFIX
            } else {
                JOB_LABEL_PREFIX
            };
            Ok((format!("{prefix}{}", s.name), ENABLED.to_owned()))
        })
        .collect()
}

/// The StorageClass parameters of a volume. Counts left out fall back to the
/// cluster's settings when the volume is made.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeParameters {
    pub number_of_replicas: Option<i32>,
    /// Minutes.
    pub stale_replica_timeout: Option<i64>,
    pub data_locality: DataLocality,
    pub disk_selector: Vec<String>,
    pub node_selector: Vec<String>,
    pub replica_auto_balance: ReplicaAutoBalance,
    pub fs_type: Option<FsType>,
    pub frontend: VolumeFrontend,
    /// The Secret, in oxhorn's namespace, with the iSCSI CHAP credentials.
    pub chap_secret: String,
    /// The Backup every volume of the class is restored from; empty: none.
    pub from_backup: String,
    /// The labels joining the class's volumes to recurring jobs and groups.
    pub recurring_jobs: BTreeMap<String, String>,
}

/// The namespace and name of the claim a CreateVolume is for, when the
/// external-provisioner says (--extra-create-metadata).
pub fn claim_of(parameters: &HashMap<String, String>) -> Option<(String, String)> {
    let get = |key: &str| parameters.get(&format!("{PROVISIONER_PREFIX}{key}"));
    Some((get("pvc/namespace")?.clone(), get("pvc/name")?.clone()))
}

impl VolumeParameters {
    pub fn parse(parameters: &HashMap<String, String>) -> Result<Self, ControllerServiceError> {
        let mut parsed = Self::default();
        let mut keys: Vec<&String> = parameters.keys().collect();
        keys.sort();
        for key in keys {
            let value = parameters[key].trim();
            if key.starts_with(PROVISIONER_PREFIX) {
                continue;
            }
            parsed.set(key, value).map_err(|why| {
                ControllerServiceError::InvalidArgument(format!("parameter {key}={value:?}: {why}"))
            })?;
        }
        if !parsed.chap_secret.is_empty() && parsed.frontend == VolumeFrontend::Fuse {
            return Err(ControllerServiceError::InvalidArgument(
                "parameter chapSecret: CHAP authenticates iSCSI logins; frontend fuse has none"
                    .into(),
            ));
        }
        Ok(parsed)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "numberOfReplicas" => {
                self.number_of_replicas = Some(
                    whole(value, 1, 20)?
                        .try_into()
                        .map_err(|_| "out of range")?,
                )
            }
            "staleReplicaTimeout" => self.stale_replica_timeout = Some(whole(value, 1, i64::MAX)?),
            "dataLocality" => self.data_locality = data_locality(value)?,
            "diskSelector" => self.disk_selector = tags(value)?,
            "nodeSelector" => self.node_selector = tags(value)?,
            "replicaAutoBalance" => self.replica_auto_balance = auto_balance(value)?,
            "fsType" => self.fs_type = Some(fs_type(value)?),
            "frontend" => self.frontend = frontend(value)?,
            "chapSecret" => {
                crate::names::validate_dns_subdomain("a Secret name", value)?;
                self.chap_secret = value.to_owned();
            }
            "fromBackup" => self.from_backup = backup_name(value)?,
            "recurringJobSelector" => self.recurring_jobs = recurring_job_selector(value)?,
            _ => {
                return Err(format!(
                    "unknown parameter; the known ones are {}",
                    KNOWN_KEYS.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// What the node service needs to know of the volume: the filesystem
    /// to make when the capability names none.
    pub fn volume_context(&self) -> HashMap<String, String> {
        self.fs_type
            .map(|fs| ("fsType".to_owned(), fs.name().to_owned()))
            .into_iter()
            .collect()
    }
}

fn whole(value: &str, min: i64, max: i64) -> Result<i64, String> {
    value
        .parse::<i64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            if max == i64::MAX {
                format!("must be a whole number of at least {min}")
            } else {
                format!("must be a whole number from {min} to {max}")
            }
        })
}

fn data_locality(value: &str) -> Result<DataLocality, String> {
    match value {
        "" | "disabled" => Ok(DataLocality::Disabled),
        "best-effort" | "strict-local" => Err(format!(
            "data locality {value} is not available yet; use disabled"
        )),
        _ => Err("must be disabled, best-effort or strict-local".into()),
    }
}

fn auto_balance(value: &str) -> Result<ReplicaAutoBalance, String> {
    match value {
        "" | "ignored" => Ok(ReplicaAutoBalance::Ignored),
        "disabled" => Ok(ReplicaAutoBalance::Disabled),
        "least-effort" | "best-effort" => Err(format!(
            "replica auto-balance {value} is not available yet; use ignored or disabled"
        )),
        _ => Err("must be ignored, disabled, least-effort or best-effort".into()),
    }
}

pub fn fs_type(value: &str) -> Result<FsType, String> {
    FsType::parse(value).map_err(|_| "must be ext4 or xfs".to_owned())
}

fn frontend(value: &str) -> Result<VolumeFrontend, String> {
    match value {
        "" | "auto" => Ok(VolumeFrontend::Auto),
        "fuse" => Ok(VolumeFrontend::Fuse),
        "iscsi" => Ok(VolumeFrontend::Iscsi),
        _ => Err("must be auto, fuse or iscsi".into()),
    }
}

/// "ssd, fast" -> ["ssd", "fast"]; tags are what node and disk tags may be.
fn tags(value: &str) -> Result<Vec<String>, String> {
    let tags: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    let valid = |t: &str| {
        t.len() <= 63
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    match tags.iter().find(|t| !valid(t)) {
        Some(bad) => Err(format!(
            "tag {bad:?} may hold only letters, digits, '-', '_' and '.', at most 63 of them"
        )),
        None => Ok(tags),
    }
}

/// The size of a new volume from a CSI capacity range: at least
/// `required_bytes` (and [`MIN_VOLUME_SIZE`]), rounded up to a whole number of
/// [`SIZE_GRANULE`], at most `limit_bytes`. OUT_OF_RANGE when no such size exists.
pub fn volume_size(required: i64, limit: i64) -> Result<i64, ControllerServiceError> {
    if required < 0 || limit < 0 {
        return Err(ControllerServiceError::InvalidArgument(
            "capacity_range bytes cannot be negative".into(),
        ));
    }
    if limit > 0 && required > limit {
        return Err(ControllerServiceError::OutOfRange(format!(
            "required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    let wanted = if required > 0 {
        required
    } else if limit > 0 {
        DEFAULT_VOLUME_SIZE.min(limit)
    } else {
        DEFAULT_VOLUME_SIZE
    };
    let size = round_up(wanted.max(MIN_VOLUME_SIZE)).ok_or_else(|| {
        ControllerServiceError::OutOfRange(format!("{wanted} bytes is too large"))
    })?;
    if limit > 0 && size > limit {
        return Err(ControllerServiceError::OutOfRange(format!(
            "limit_bytes {limit} is below {size}, the smallest size oxhorn can give: volumes are at least {MIN_VOLUME_SIZE} bytes, in whole multiples of {SIZE_GRANULE}"
        )));
    }
    Ok(size)
}

fn round_up(bytes: i64) -> Option<i64> {
    bytes
        .checked_add(SIZE_GRANULE - 1)
        .map(|b| b / SIZE_GRANULE * SIZE_GRANULE)
}

#[cfg(test)]
mod tests {
    use tonic::Status;

    use super::*;
    use tonic::Code;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_recurring_job_selector_becomes_the_labels_that_join_them() {
        let selector =
            r#"[{"name": "daily", "isGroup": false}, {"name": "gold", "isGroup": true}]"#;
        let parsed =
            VolumeParameters::parse(&params(&[("recurringJobSelector", selector)])).unwrap();
        let labels: Vec<(&str, &str)> = parsed
            .recurring_jobs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("recurring-job-group.oxhorn.io/gold", "enabled"),
                ("recurring-job.oxhorn.io/daily", "enabled")
            ]
        );
        for bad in [
            r#"{"name": "daily"}"#,
            r#"[{"name": "Daily!"}]"#,
            r#"[{"nam": "x"}]"#,
        ] {
            let error = VolumeParameters::parse(&params(&[("recurringJobSelector", bad)]));
            let status: Status = error.unwrap_err().into();
            assert_eq!(status.code(), Code::InvalidArgument, "{bad}");
            assert!(
                status.message().contains("recurringJobSelector"),
                "{}",
                status.message()
            );
        }
    }

    #[test]
    fn the_claim_is_read_from_the_provisioners_keys() {
        let both = params(&[
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "apps"),
            ("csi.storage.k8s.io/pv/name", "pvc-1"),
        ]);
        assert_eq!(claim_of(&both), Some(("apps".into(), "data".into())));
        assert_eq!(
            claim_of(&params(&[("csi.storage.k8s.io/pvc/name", "data")])),
            None
        );
    }

    #[test]
    fn parses_every_known_key_into_typed_values() {
        let parsed = VolumeParameters::parse(&params(&[
            ("numberOfReplicas", "2"),
            ("staleReplicaTimeout", "30"),
            ("dataLocality", "disabled"),
            ("diskSelector", "ssd, fast"),
            ("nodeSelector", "storage"),
            ("replicaAutoBalance", "disabled"),
            ("fsType", "xfs"),
            ("frontend", "fuse"),
            ("fromBackup", ""),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]))
        .unwrap();
        assert_eq!(parsed.number_of_replicas, Some(2));
        assert_eq!(parsed.stale_replica_timeout, Some(30));
        assert_eq!(parsed.disk_selector, vec!["ssd", "fast"]);
        assert_eq!(parsed.node_selector, vec!["storage"]);
        assert_eq!(parsed.replica_auto_balance, ReplicaAutoBalance::Disabled);
        assert_eq!(parsed.fs_type, Some(FsType::Xfs));
        assert_eq!(parsed.volume_context()["fsType"], "xfs");
        let iscsi = VolumeParameters::parse(&params(&[
            ("frontend", "iscsi"),
            ("chapSecret", "volume-chap"),
        ]))
        .unwrap();
        assert_eq!(iscsi.frontend, VolumeFrontend::Iscsi);
        assert_eq!(iscsi.chap_secret, "volume-chap");
        let auto = VolumeParameters::parse(&params(&[("frontend", "auto")])).unwrap();
        assert_eq!(auto.frontend, VolumeFrontend::Auto);
        assert_eq!(
            VolumeParameters::parse(&params(&[])).unwrap(),
            VolumeParameters::default()
        );
    }

    #[test]
    fn unknown_or_malformed_keys_are_invalid_arguments_naming_the_key() {
        for (key, value, says) in [
            ("numberOfReplica", "2", "unknown parameter"),
            ("numberOfReplicas", "two", "whole number from 1 to 20"),
            ("numberOfReplicas", "0", "whole number from 1 to 20"),
            ("staleReplicaTimeout", "-1", "at least 1"),
            ("fsType", "btrfs", "ext4 or xfs"),
            ("diskSelector", "a b", "tag \"a b\""),
            ("dataLocality", "strict-local", "not available yet"),
            ("frontend", "nbd", "auto, fuse or iscsi"),
            ("chapSecret", "Not/A/Name", "a Secret name"),
            ("fromBackup", "s3://bucket@r/p?volume=v", "a Backup name"),
            ("fromBackup", "Nightly/1", "a Backup name"),
        ] {
            let error = VolumeParameters::parse(&params(&[(key, value)]))
                .map_err(Status::from)
                .unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{key}");
            assert!(error.message().contains(key), "{}", error.message());
            assert!(error.message().contains(says), "{}", error.message());
        }
    }

    #[test]
    fn from_backup_takes_a_backup_name_or_its_url() {
        for (value, name) in [
            ("", ""),
            ("nightly-1", "nightly-1"),
            (
                "s3://b@us-east-1/p?backup=nightly-1&volume=pvc-1",
                "nightly-1",
            ),
            (
                "nfs://nas:/export?nfsport=2049&mountport=20048&backup=nightly-1&volume=pvc-1",
                "nightly-1",
            ),
        ] {
            let parsed = VolumeParameters::parse(&params(&[("fromBackup", value)])).unwrap();
            assert_eq!(parsed.from_backup, name, "{value}");
        }
    }

    #[test]
    fn chap_is_refused_for_fuse() {
        let error = VolumeParameters::parse(&params(&[
            ("frontend", "fuse"),
            ("chapSecret", "volume-chap"),
        ]))
        .map_err(Status::from)
        .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument);
        assert!(
            error.message().contains("frontend fuse"),
            "{}",
            error.message()
        );
    }

    /// The gRPC code a refused size answers with.
    fn code(size: Result<i64, ControllerServiceError>) -> Code {
        Status::from(size.unwrap_err()).code()
    }

    #[test]
    fn sizes_round_up_to_two_mib_and_respect_the_limit() {
        assert_eq!(volume_size(0, 0).unwrap(), DEFAULT_VOLUME_SIZE);
        assert_eq!(volume_size(1, 0).unwrap(), MIN_VOLUME_SIZE);
        assert_eq!(volume_size(100 * MIB + 1, 0).unwrap(), 102 * MIB);
        assert_eq!(volume_size(0, 64 * MIB).unwrap(), 64 * MIB);
        assert_eq!(volume_size(20 * MIB, 21 * MIB).unwrap(), 20 * MIB);
        assert_eq!(
            code(volume_size(21 * MIB, 21 * MIB + MIB / 2)),
            Code::OutOfRange
        );
        assert_eq!(code(volume_size(0, MIB)), Code::OutOfRange);
        assert_eq!(code(volume_size(2, 1)), Code::OutOfRange);
        assert_eq!(code(volume_size(i64::MAX, 0)), Code::OutOfRange);
        assert_eq!(code(volume_size(-1, 0)), Code::InvalidArgument);
    }
}
