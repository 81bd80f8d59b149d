//! The cluster key an `oxhorn instance-manager` hands its instances: the
//! manager, which reads it from its Secret, leaves it in a root-only file
//! beside the instance records, so the instance manager needs no access to
//! the Kubernetes API.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;

use super::{InstanceError, state_dir};
use crate::protocol::Key;

/// How often the instance manager looks for the key while the manager has
/// not written it yet.
const KEY_POLL: Duration = Duration::from_millis(500);
/// The key's file in the instance state directory.
const KEY_FILE: &str = "cluster.key";

fn key_file(data_dir: &Path) -> PathBuf {
    state_dir(data_dir).join(KEY_FILE)
}

/// Writes the cluster key for the node's instance manager: readable by
/// root only, and in place at once (renamed), never half written.
pub fn write_cluster_key(data_dir: &Path, key: &Key) -> Result<(), InstanceError> {
    let path = key_file(data_dir);
    let dir = state_dir(data_dir);
    std::fs::create_dir_all(&dir).map_err(|e| InstanceError::io("creating", &dir, e))?;
    let tmp = dir.join(format!(".{KEY_FILE}.{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut file| file.write_all(key.to_hex().as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| InstanceError::io("writing", &path, e))
}

/// The cluster key, once the manager has written it.
pub async fn read_cluster_key(data_dir: &Path) -> Result<Key, InstanceError> {
    let path = key_file(data_dir);
    let mut told = false;
    loop {
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                return Key::from_hex(&text).map_err(|e| InstanceError::Remote {
                    code: "InvalidArgument".into(),
                    message: format!("{}: {e}", path.display()),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !told {
                    info!(path = %path.display(), "waiting for the manager to write the cluster key");
                    told = true;
                }
                tokio::time::sleep(KEY_POLL).await;
            }
            Err(e) => return Err(InstanceError::io("reading", &path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn the_key_reaches_the_instance_manager_readable_by_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let key = Key::generate();
        let reader = tokio::spawn({
            let data = dir.path().to_path_buf();
            async move { read_cluster_key(&data).await }
        });
        write_cluster_key(dir.path(), &key).unwrap();
        assert_eq!(reader.await.unwrap().unwrap(), key);
        let mode = std::fs::metadata(key_file(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
