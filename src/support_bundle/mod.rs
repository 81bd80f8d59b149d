//! The support bundle (docs/support-bundle.md): one tar.gz with what it
//! takes to understand a problem: every oxhorn.io object, the Events, the
//! Kubernetes objects Oxhorn works with, the versions, the settings, each
//! manager's metrics and every container's recent log in oxhorn's
//! namespace, with every Secret value and credential redacted. `oxhorn
//! support-bundle` writes it with the user's kubeconfig; the REST API's
//! `GET /v1/support-bundle` streams it, read with the manager's account
//! once its caller is allowed every read it makes ([`READS`]).
//!
//! A step that fails is recorded in the bundle's `summary.txt`; the rest
//! is collected all the same. Modules: `collect.rs` the order of the steps
//! and what they share, one module per part (`resources.rs`, `events.rs`,
//! `logs.rs`, `metrics.rs`, `versions.rs`), `redact.rs` what never leaves,
//! `archive.rs` the tar.gz, `report.rs` its summary.

mod archive;
mod collect;
pub mod events;
mod logs;
mod metrics;
pub mod redact;
mod report;
mod resources;
mod versions;

use std::time::Duration;

pub use collect::write;
pub use metrics::Scrape;
pub use report::{Outcome, Report};

/// How long `--since` reaches back unless told.
pub const SINCE_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// The most of one container's log kept (its newest part), unless told.
pub const LOG_LIMIT_DEFAULT: u64 = 10 << 20;

/// How a bundle is made.
pub struct Options {
    /// Where Oxhorn is installed.
    pub namespace: String,
    /// How far back the containers' logs reach.
    pub since: Duration,
    /// The most of one container's log kept: its newest part.
    pub log_limit: u64,
    /// Who makes it, for its summary ("oxhorn support-bundle 0.1.0").
    pub made_by: String,
    /// Whether the namespace's Secrets are listed (names, types and keys).
    pub secret_names: bool,
    /// How the managers' /metrics are reached.
    pub scrape: Scrape,
    /// When it is made: its name's time.
    pub created: jiff::Timestamp,
}

/// Where a read is made: oxhorn's namespace, or the whole cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    Namespace,
    Cluster,
}

/// A read a bundle makes, as RBAC names it: the REST API makes the bundle
/// only for a caller allowed every one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: Option<&'static str>,
    pub scope: Where,
}

const fn read(group: &'static str, resource: &'static str, scope: Where) -> Read {
    Read {
        verb: "list",
        group,
        resource,
        subresource: None,
        scope,
    }
}

/// Every oxhorn.io resource (a test checks it against the CRDs).
pub const OXHORN_RESOURCES: &[&str] = &[
    "volumes",
    "engines",
    "replicas",
    "nodes",
    "settings",
    "snapshots",
    "backuptargets",
    "backupvolumes",
    "backups",
    "recurringjobs",
    "systembackups",
    "systemrestores",
];

/// What a bundle reads, the oxhorn.io kinds aside (`list` on each, in
/// the namespace). The Secrets of the namespace are read too, with the
/// manager's own account when the API makes it, only to scrub their
/// values; listing their names needs `list secrets` of the caller.
pub const READS: &[Read] = &[
    read("", "pods", Where::Namespace),
    Read {
        verb: "get",
        group: "",
        resource: "pods",
        subresource: Some("log"),
        scope: Where::Namespace,
    },
    read("", "events", Where::Cluster),
    read("", "nodes", Where::Cluster),
    read("", "persistentvolumes", Where::Cluster),
    read("", "persistentvolumeclaims", Where::Cluster),
    read("apps", "daemonsets", Where::Namespace),
    read("apps", "deployments", Where::Namespace),
    read("coordination.k8s.io", "leases", Where::Namespace),
    read("storage.k8s.io", "storageclasses", Where::Cluster),
    read("storage.k8s.io", "csidrivers", Where::Cluster),
    read("storage.k8s.io", "csinodes", Where::Cluster),
    read("storage.k8s.io", "volumeattachments", Where::Cluster),
];

/// Listing the namespace's Secrets' names, types and keys.
pub const SECRET_NAMES: Read = read("", "secrets", Where::Namespace);

/// Every read a bundle makes, for the REST API to authorize.
pub fn reads() -> impl Iterator<Item = Read> {
    let oxhorn = OXHORN_RESOURCES
        .iter()
        .map(|resource| read(crate::types::GROUP, resource, Where::Namespace));
    oxhorn.chain(READS.iter().copied())
}

/// The bundle's name at `now`: its file's, less `.tar.gz`, and its root
/// directory's.
pub fn name(now: jiff::Timestamp) -> String {
    format!("oxhorn-support-bundle-{}", now.strftime("%Y-%m-%dT%H%M%SZ"))
}

/// A duration as `--since` and `?since=` take it: `90s`, `30m`, `24h`,
/// `1h30m`, `7d`; at least a second.
pub fn parse_since(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || format!("since must be a duration such as 30m, 24h or 7d, not {text:?}");
    let parsed = match text.strip_suffix('d').map(str::parse::<u64>) {
        Some(Ok(days)) => days
            .checked_mul(24 * 3600)
            .map(Duration::from_secs)
            .ok_or_else(invalid)?,
        _ => {
            let duration: jiff::SignedDuration = text.parse().map_err(|_| invalid())?;
            Duration::try_from(duration).map_err(|_| invalid())?
        }
    };
    if parsed < Duration::from_secs(1) {
        return Err(invalid());
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_oxhorn_kind_is_collected() {
        let plurals: Vec<String> = crate::types::crds()
            .into_iter()
            .map(|crd| crd.spec.names.plural)
            .collect();
        assert_eq!(plurals, OXHORN_RESOURCES);
    }

    #[test]
    fn since_takes_what_a_user_writes() {
        let hours = |h: u64| Duration::from_secs(h * 3600);
        assert_eq!(parse_since("24h"), Ok(hours(24)));
        assert_eq!(parse_since("7d"), Ok(hours(168)));
        assert_eq!(parse_since("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_since("90s"), Ok(Duration::from_secs(90)));
        for bad in ["", "0s", "-1h", "soon", "5"] {
            let error = parse_since(bad).unwrap_err();
            assert!(error.contains("such as 30m"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_name_sorts_by_time_and_holds_no_colon() {
        let at: jiff::Timestamp = "2026-11-28T20:46:47Z".parse().unwrap();
        assert_eq!(name(at), "oxhorn-support-bundle-2026-11-28T204647Z");
    }
}
