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
pub(in crate::controller) use target::request_sync;
pub use target::{AVAILABLE, backup_volume_name, go_duration, reconcile as reconcile_target};
pub use upload::reconcile as reconcile_backup;
pub use volume::{SYNCED, from_store, reconcile as reconcile_volume};

use std::collections::{BTreeMap, HashSet};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::{Resource, ResourceExt};

use super::Context;
use crate::backup::target::{TargetError, open as open_target};
use crate::backup::{BackupError, Backupstore, LockInfo};
use crate::types::BackupTarget;

/// Longest a sync waits on the store before it counts as unreachable.
const STORE_TIMEOUT: Duration = Duration::from_secs(60);
/// How soon a target, volume or backup that could not reach its store is
/// looked at again.
const RETRY: Duration = Duration::from_secs(5);

/// This run of this manager: a lock an earlier run left is its own to
/// break.
static LOCK_OWNER_RUN: LazyLock<String> = LazyLock::new(|| hex(&crate::protocol::random()[..8]));

/// The owners of the volume locks this run's operations are taking or
/// hold. A lock of this run owned by none of them was left by an operation
/// whose end was lost (a reply that never came, a call cut short by its
/// time limit): it is broken once it is [`LOCK_QUIET`] old.
static LOCKS_IN_USE: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Mutex::default);

/// How old a lock this run left must be before it is broken: whatever
/// its operation had sent has long landed by then, so that no deletion of
/// it can fall into the next operation's time.
const LOCK_QUIET: Duration = Duration::from_secs(120);

/// Who takes a volume's lock in a store: this node's manager, this run of
/// it, and one operation, which it names from before the lock is asked
/// for until it is dropped, after the operation ended.
pub(super) struct LockOwner(String);

impl LockOwner {
    fn new(node: &str) -> Self {
        let owner = format!(
            "{node}/{}/{}",
            *LOCK_OWNER_RUN,
            hex(&crate::protocol::random()[..4])
        );
        in_use().insert(owner.clone());
        Self(owner)
    }

    fn as_str(&self) -> &str {
        &self.0
    }
}

impl Drop for LockOwner {
    fn drop(&mut self) {
        in_use().remove(&self.0);
    }
}

fn in_use() -> std::sync::MutexGuard<'static, HashSet<String>> {
    // Poisoned only by a panic while inserting or removing a string.
    LOCKS_IN_USE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The node a lock's owner names.
fn lock_node(owner: &str) -> &str {
    owner.split_once('/').map_or(owner, |(node, _)| node)
}

/// Whether a volume's lock in a store was left by an operation that no
/// longer runs: one of a node that is down, of an earlier run of this
/// manager, or of this run and quiet for [`LOCK_QUIET`].
fn stale_lock(ctx: &Context, held: &LockInfo) -> bool {
    let node = lock_node(&held.owner);
    if node != ctx.node.node_id {
        return !ctx.liveness.is_up(node);
    }
    abandoned_here(held, jiff::Timestamp::now())
}

/// Whether a lock of this node's was left by an earlier run, or by an
/// operation of this run that has ended and was quiet long enough.
fn abandoned_here(held: &LockInfo, now: jiff::Timestamp) -> bool {
    let this_run = format!("{}/{}/", lock_node(&held.owner), *LOCK_OWNER_RUN);
    if !held.owner.starts_with(&this_run) {
        return true;
    }
    let quiet = held
        .acquired
        .parse::<jiff::Timestamp>()
        .ok()
        .and_then(|at| Duration::try_from(now.duration_since(at)).ok())
        .is_some_and(|age| age >= LOCK_QUIET);
    quiet && !in_use().contains(&held.owner)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Context {
    /// The store `target` names, with its credentials.
    pub(in crate::controller) fn open_store(
        &self,
        target: &BackupTarget,
    ) -> Result<Backupstore, TargetError> {
        let name = &target.spec.credential_secret;
        let data = if name.is_empty() {
            BTreeMap::new()
        } else {
            let secret =
                self.ds.secrets.get(name).ok_or_else(|| {
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
pub(in crate::controller) fn unavailable(error: &Unavailable) -> (&'static str, String) {
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
pub(in crate::controller) enum Unavailable {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Store(#[from] BackupError),
    #[error("the store did not answer within {}s", STORE_TIMEOUT.as_secs())]
    Timeout,
}

/// Opens `target`'s store and runs `call` on it, bounded by
/// [`STORE_TIMEOUT`].
pub(in crate::controller) async fn on_store<T, Fut>(
    ctx: &Context,
    target: &BackupTarget,
    call: impl FnOnce(Backupstore) -> Fut,
) -> Result<T, Unavailable>
where
    Fut: Future<Output = Result<T, BackupError>>,
{
    let store = ctx.open_store(target)?;
    bounded(call(store)).await
}

/// Runs `call` on the store, bounded by [`STORE_TIMEOUT`].
pub(in crate::controller) async fn bounded<T>(
    call: impl Future<Output = Result<T, BackupError>>,
) -> Result<T, Unavailable> {
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

pub(in crate::controller) fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// A reference making `owner` the owner of what it is put on, for the
/// garbage collector.
pub(in crate::controller) fn owned_by<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
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
    fn a_lock_names_the_node_the_run_and_the_operation_while_it_runs() {
        let (first, second) = (LockOwner::new("node-1"), LockOwner::new("node-1"));
        assert_eq!(lock_node(first.as_str()), "node-1");
        assert!(
            first
                .as_str()
                .starts_with(&format!("node-1/{}/", *LOCK_OWNER_RUN))
        );
        assert_ne!(first.as_str(), second.as_str());
        let name = first.as_str().to_owned();
        assert!(in_use().contains(&name));
        drop(first);
        assert!(!in_use().contains(&name));
        assert_eq!(lock_node("node-2"), "node-2");
    }

    #[test]
    fn a_lock_of_this_node_is_broken_once_no_operation_of_this_run_can_hold_it() {
        let now = jiff::Timestamp::now();
        let lock = |owner: &str, age: u64| LockInfo {
            owner: owner.to_owned(),
            operation: "backup b1".into(),
            acquired: (now - Duration::from_secs(age)).to_string(),
        };
        assert!(
            abandoned_here(&lock("node-1/0123abcd/01", 0), now),
            "an earlier run's"
        );
        assert!(
            abandoned_here(&lock("node-1", 0), now),
            "an older version's"
        );
        let running = LockOwner::new("node-1");
        assert!(!abandoned_here(&lock(running.as_str(), 600), now), "held");
        let ended = LockOwner::new("node-1").as_str().to_owned();
        assert!(
            !abandoned_here(&lock(&ended, 10), now),
            "its requests may land"
        );
        assert!(abandoned_here(&lock(&ended, 121), now));
    }
}
