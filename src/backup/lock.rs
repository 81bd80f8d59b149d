//! The volume's lock in the backup store: one object, created only if it is
//! absent (a conditional put: S3's and Azure's If-None-Match, a hard link on
//! a filesystem), so that one backup or deletion of the volume runs at a
//! time and a deletion never removes a block a backup being written counts
//! on.
//!
//! It has no lease: a holder that dies leaves it behind, and the volume's
//! backups wait ([`BackupError::Busy`] names the holder). It is broken only
//! by whoever owns the operation it names, which the controllers' ownership
//! rule makes one manager at a time: two could not break it in a race.

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};
use serde::{Deserialize, Serialize};

use super::BackupError;

/// What a lock says of its holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// Who took it, e.g. the manager of a node.
    pub owner: String,
    /// What for, e.g. "backup b1".
    pub operation: String,
    /// When (RFC 3339).
    pub acquired: String,
}

/// A lock taken; [`release`](Held::release) gives it back.
pub(super) struct Held<'a> {
    store: &'a dyn ObjectStore,
    path: Path,
}

/// Takes the lock at `path` for `owner` and `operation`, or says who holds
/// it.
pub(super) async fn take<'a>(
    store: &'a dyn ObjectStore,
    path: Path,
    volume: &str,
    owner: &str,
    operation: String,
) -> Result<Held<'a>, BackupError> {
    let info = LockInfo {
        owner: owner.to_owned(),
        operation,
        acquired: jiff::Timestamp::now().to_string(),
    };
    let body = serde_json::to_vec(&info).map_err(|e| malformed(&path, e))?;
    let create = PutOptions::from(PutMode::Create);
    match store.put_opts(&path, body.into(), create).await {
        Ok(_) => Ok(Held { store, path }),
        Err(object_store::Error::AlreadyExists { .. }) => Err(BackupError::Busy {
            volume: volume.to_owned(),
            held: read(store, &path).await?.unwrap_or(LockInfo {
                owner: "?".into(),
                operation: "released meanwhile".into(),
                acquired: "?".into(),
            }),
        }),
        Err(error) => Err(error.into()),
    }
}

/// The lock at `path`, if it is held.
pub(super) async fn read(
    store: &dyn ObjectStore,
    path: &Path,
) -> Result<Option<LockInfo>, BackupError> {
    match store.get(path).await {
        Ok(got) => {
            let bytes = got.bytes().await?;
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| malformed(path, e))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Removes the lock at `path` if `owner` holds it; whether it did.
pub(super) async fn break_for(
    store: &dyn ObjectStore,
    path: &Path,
    owner: &str,
) -> Result<bool, BackupError> {
    match read(store, path).await? {
        Some(info) if info.owner == owner => {
            delete(store, path).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

impl Held<'_> {
    pub async fn release(self) -> Result<(), BackupError> {
        delete(self.store, &self.path).await
    }
}

async fn delete(store: &dyn ObjectStore, path: &Path) -> Result<(), BackupError> {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn malformed(path: &Path, error: serde_json::Error) -> BackupError {
    BackupError::Malformed(path.to_string(), error.to_string())
}
