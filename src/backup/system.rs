//! System backups in a store: under `system-backups/<name>/`, the objects
//! (`objects.json`) and then, last, what the backup is (`system-backup.json`:
//! its format and the Oxhorn version that took it). A system backup
//! without the latter does not exist.

use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use super::BackupError;
use super::store::{Backupstore, check_name, parse};

const DIR: &str = "system-backups";
const OBJECTS: &str = "objects.json";
const META: &str = "system-backup.json";

/// What a system backup is, as its store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemBackupMeta {
    pub name: String,
    /// The format of `objects.json`.
    pub format_version: i32,
    /// The Oxhorn version that took it.
    pub oxhorn_version: String,
    /// When it was completed (RFC 3339).
    pub created: String,
}

impl Backupstore {
    fn system_dir(&self, name: &str) -> Path {
        self.root.clone().join(DIR).join(name)
    }

    /// Stores system backup `meta.name`: its objects, then what it is.
    pub async fn put_system_backup(
        &self,
        meta: &SystemBackupMeta,
        objects: Bytes,
    ) -> Result<(), BackupError> {
        check_name("system backup name", &meta.name)?;
        let dir = self.system_dir(&meta.name);
        self.store
            .put(&dir.clone().join(OBJECTS), objects.into())
            .await?;
        self.put_json(&dir.join(META), meta).await
    }

    /// What system backup `name` is.
    pub async fn system_backup(&self, name: &str) -> Result<SystemBackupMeta, BackupError> {
        check_name("system backup name", name)?;
        let path = self.system_dir(name).join(META);
        match self.store.get(&path).await {
            Ok(got) => parse(&path, &got.bytes().await?),
            Err(object_store::Error::NotFound { .. }) => Err(BackupError::NotFound(
                name.to_owned(),
                "the system backups".to_owned(),
            )),
            Err(error) => Err(error.into()),
        }
    }

    /// The objects system backup `name` holds, as stored.
    pub async fn system_backup_objects(&self, name: &str) -> Result<Bytes, BackupError> {
        check_name("system backup name", name)?;
        let path = self.system_dir(name).join(OBJECTS);
        Ok(self.store.get(&path).await?.bytes().await?)
    }

    /// Deletes system backup `name`: what it is first, so that a deletion
    /// cut short leaves no system backup, then its objects. One already
    /// gone is no error.
    pub async fn delete_system_backup(&self, name: &str) -> Result<(), BackupError> {
        check_name("system backup name", name)?;
        let dir = self.system_dir(name);
        for file in [META, OBJECTS] {
            match self.store.delete(&dir.clone().join(file)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// The system backups in the store: those whose meta was written.
    pub async fn system_backups(&self) -> Result<Vec<String>, BackupError> {
        let listed = self
            .store
            .list_with_delimiter(Some(&self.root.clone().join(DIR)))
            .await?;
        let mut names = Vec::new();
        for prefix in &listed.common_prefixes {
            let Some(name) = prefix.filename() else {
                continue;
            };
            if self.exists(&prefix.clone().join(META)).await? {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }
}
