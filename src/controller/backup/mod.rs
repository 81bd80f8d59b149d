//! The backup controllers (seed 002): a BackupTarget's owner syncs the
//! store's volumes into BackupVolumes, each BackupVolume's owner syncs its
//! backups into Backups, and a Backup's owner uploads it or, when it is
//! deleted, deletes it from the store. Only these controllers talk to a
//! backup store; every other reader takes what they wrote in the resources.
//!
//! Deleting a BackupTarget forgets its resources and never touches the
//! store: the BackupVolumes and Backups synced from it are its dependents
//! (Kubernetes' garbage collector removes them), and a Backup whose target
//! is gone or going lets go without deleting anything.

mod default_target;
mod reader;
mod target;
mod upload;
mod volume;

pub use default_target::{FROM_SETTINGS, run as run_default_target};
pub use reader::SnapshotReader;
pub use target::reconcile as reconcile_target;
pub use upload::reconcile as reconcile_backup;
pub use volume::{from_store, reconcile as reconcile_volume};

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::Context;
use crate::backup::target::{TargetError, open as open_target};
use crate::backup::{BackupError, Backupstore};
use crate::types::BackupTarget;

/// Longest a sync waits on the store before it counts as unreachable.
const STORE_TIMEOUT: Duration = Duration::from_secs(60);
/// How soon a target, volume or backup that could not reach its store is
/// looked at again.
const RETRY: Duration = Duration::from_secs(5);

/// Who holds a volume's lock in a store: this node's manager, this run of
/// it. A lock left by an earlier run of the same manager is its own to
/// break; one held by this run belongs to an operation under way.
static LOCK_OWNER_RUN: LazyLock<String> = LazyLock::new(|| {
    let nonce = crate::protocol::random();
    nonce[..8].iter().map(|b| format!("{b:02x}")).collect()
});

fn lock_owner(node: &str) -> String {
    format!("{node}/{}", *LOCK_OWNER_RUN)
}

/// The node a lock's owner names.
fn lock_node(owner: &str) -> &str {
    owner.split_once('/').map_or(owner, |(node, _)| node)
}

impl Context {
    /// The BackupTarget `name`, as cached.
    pub(in crate::controller) fn cached_target(
        &self,
        name: &str,
    ) -> Option<std::sync::Arc<BackupTarget>> {
        let key = ObjectRef::new(name).within(&self.ds.namespace);
        self.ds.backup_targets.store.get(&key)
    }

    /// The store `target` names, with its credentials.
    pub(in crate::controller) fn open_store(
        &self,
        target: &BackupTarget,
    ) -> Result<Backupstore, TargetError> {
        let name = &target.spec.credential_secret;
        let data = if name.is_empty() {
            BTreeMap::new()
        } else {
            let key = ObjectRef::new(name).within(&self.ds.namespace);
            let secret =
                self.ds.secrets.store.get(&key).ok_or_else(|| {
                    TargetError::Credentials(name.clone(), "does not exist".into())
                })?;
            secret_strings(&secret)
        };
        open_target(&target.spec.backup_target_url, name, &data)
    }
}

/// A Secret's values as text (stringData is folded into data by the API
/// server); values that are not UTF-8 are left out.
fn secret_strings(secret: &k8s_openapi::api::core::v1::Secret) -> BTreeMap<String, String> {
    secret
        .data
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.0.clone()).ok()?)))
        .collect()
}

/// Why a store could not be used, as a condition's reason and message.
fn unavailable(error: &Unavailable) -> (&'static str, String) {
    let reason = match error {
        Unavailable::Target(TargetError::Url(..)) => "InvalidURL",
        Unavailable::Target(TargetError::Credentials(..)) => "InvalidCredentials",
        Unavailable::Target(TargetError::Store(_)) => "InvalidTarget",
        Unavailable::Timeout => "Unreachable",
        Unavailable::Store(BackupError::Store(e)) => return store_refusal(e),
        Unavailable::Store(_) => "StoreError",
    };
    (reason, error.to_string())
}

/// What an object store's error means for a user. Its clients report an
/// HTTP refusal as text with the status and the service's XML error body,
/// so that is what is read; the message keeps the service's error code and
/// text, without the XML.
fn store_refusal(error: &object_store::Error) -> (&'static str, String) {
    let text = error.to_string();
    let head = text
        .split("<?xml")
        .next()
        .unwrap_or_default()
        .trim_end_matches([':', ' ']);
    let tag = |name: &str| {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&close)?;
        Some(text[start..start + len].to_owned())
    };
    let service = match (tag("Code"), tag("Message")) {
        (Some(code), Some(message)) => format!(" ({code}: {message})"),
        (Some(code), None) => format!(" ({code})"),
        _ => String::new(),
    };
    let mut message = format!("{head}{service}");
    let cause = root_cause(error);
    if cause.contains("certificate") {
        // The client's own text says little more than "error sending
        // request"; the TLS library's says what is wrong.
        message = format!("{message}: {cause}");
        return ("CertificateUntrusted", message);
    }
    let reason = match error {
        object_store::Error::Unauthenticated { .. }
        | object_store::Error::PermissionDenied { .. } => "AccessDenied",
        _ if text.contains("NoSuchBucket") || text.contains("ContainerNotFound") => {
            "BucketNotFound"
        }
        _ if text.contains("403 Forbidden") || text.contains("401 Unauthorized") => "AccessDenied",
        _ if text.contains("status code") => "StoreError",
        _ => "Unreachable",
    };
    (reason, message)
}

/// The innermost error under `error`, as text.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// What kept a sync from the store.
#[derive(Debug, thiserror::Error)]
enum Unavailable {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Store(#[from] BackupError),
    #[error("the store did not answer within {}s", STORE_TIMEOUT.as_secs())]
    Timeout,
}

/// Runs `call` on the store, bounded by [`STORE_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = Result<T, BackupError>>) -> Result<T, Unavailable> {
    match tokio::time::timeout(STORE_TIMEOUT, call).await {
        Ok(result) => result.map_err(Unavailable::Store),
        Err(_) => Err(Unavailable::Timeout),
    }
}

/// Whether a sync was asked for since the last one.
fn sync_due(requested: Option<&MicroTime>, last: Option<&MicroTime>) -> bool {
    match (requested, last) {
        (_, None) => true,
        (Some(requested), Some(last)) => requested.0 > last.0,
        (None, Some(_)) => false,
    }
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// A reference making `owner` the owner of what it is put on, for the
/// garbage collector.
fn owned_by<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        ..OwnerReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> MicroTime {
        MicroTime(s.parse().unwrap())
    }

    #[test]
    fn a_sync_is_due_first_and_then_only_when_asked_since() {
        let earlier = at("2026-01-01T00:00:00.100000Z");
        let later = at("2026-01-01T00:00:00.200000Z");
        assert!(sync_due(None, None), "never synced");
        assert!(sync_due(Some(&later), Some(&earlier)));
        assert!(!sync_due(Some(&earlier), Some(&later)));
        assert!(!sync_due(Some(&earlier), Some(&earlier)));
        assert!(!sync_due(None, Some(&earlier)));
    }

    fn refusal(text: &str) -> (&'static str, String) {
        let error = object_store::Error::Generic {
            store: "S3",
            source: text.into(),
        };
        store_refusal(&error)
    }

    #[test]
    fn a_store_refusal_is_named_by_its_status_and_service_code() {
        let xml = |code: &str| {
            format!(
                "<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>No.</Message></Error>"
            )
        };
        let (reason, message) = refusal(&format!(
            "Error performing list request: Server returned non-2xx status code: 403 Forbidden: {}",
            xml("InvalidAccessKeyId")
        ));
        assert_eq!(reason, "AccessDenied");
        assert!(
            message.ends_with("403 Forbidden (InvalidAccessKeyId: No.)"),
            "{message}"
        );
        let (reason, _) = refusal(&format!(
            "status code: 404 Not Found: {}",
            xml("NoSuchBucket")
        ));
        assert_eq!(reason, "BucketNotFound");
        let (reason, _) = refusal("status code: 500 Internal Server Error");
        assert_eq!(reason, "StoreError");
        let (reason, _) = refusal("error sending request: Connection refused");
        assert_eq!(reason, "Unreachable");
    }

    #[test]
    fn an_untrusted_certificate_is_named_by_its_cause() {
        let tls = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let error = object_store::Error::Generic {
            store: "S3",
            source: Box::new(tls),
        };
        let (reason, message) = store_refusal(&error);
        assert_eq!(reason, "CertificateUntrusted");
        assert!(message.ends_with("UnknownIssuer"), "{message}");
    }

    #[test]
    fn a_lock_names_the_node_and_the_run() {
        let owner = lock_owner("node-1");
        assert_eq!(lock_node(&owner), "node-1");
        assert_ne!(owner, "node-1");
        assert_eq!(lock_node("node-2"), "node-2");
    }
}
