//! The replica directory: an exclusive lock on it, and crash-safe file
//! replacement inside it.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::error::{Result, StorageError};
use super::naming::TMP_SUFFIX;

/// An open, exclusively locked replica directory.
///
/// The flock keeps two processes (or two stores in one process) from serving
/// the same replica, which would corrupt both the data and the metadata. The
/// same handle is fsynced to make renames and unlinks durable.
#[derive(Debug)]
pub struct ReplicaDir {
    path: PathBuf,
    handle: Flock<File>,
}

impl ReplicaDir {
    pub fn lock(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| StorageError::io(path, e))?;
        let handle = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            if errno == Errno::EWOULDBLOCK {
                StorageError::Busy {
                    path: path.to_path_buf(),
                }
            } else {
                StorageError::errno(path, errno)
            }
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            handle,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Makes earlier creates, renames and unlinks in the directory durable.
    pub fn sync(&self) -> Result<()> {
        self.handle
            .sync_all()
            .map_err(|e| StorageError::io(&self.path, e))
    }

    /// Replaces `name` with `bytes` so that after a crash it holds either the
    /// old or the new content: write a temp file, fsync, rename, fsync dir.
    pub fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let tmp = self.join(&format!("{name}{TMP_SUFFIX}"));
        let target = self.join(name);
        fs::write(&tmp, bytes).map_err(|e| StorageError::io(&tmp, e))?;
        let file = File::open(&tmp).map_err(|e| StorageError::io(&tmp, e))?;
        file.sync_all().map_err(|e| StorageError::io(&tmp, e))?;
        fs::rename(&tmp, &target).map_err(|e| StorageError::io(&target, e))?;
        self.sync()
    }

    /// Deletes `name`; a file that is already gone is not an error, so that
    /// cleanups can be retried. The caller syncs the directory.
    pub fn remove_if_exists(&self, name: &str) -> Result<()> {
        let path = self.join(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(StorageError::io(&path, e)),
            _ => Ok(()),
        }
    }

    /// Names of the directory's entries (non-UTF-8 names are not ours and
    /// are skipped).
    pub fn entries(&self) -> Result<Vec<String>> {
        let read = fs::read_dir(&self.path).map_err(|e| StorageError::io(&self.path, e))?;
        let mut names = Vec::new();
        for entry in read {
            let entry = entry.map_err(|e| StorageError::io(&self.path, e))?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_busy() {
        let tmp = tempfile::tempdir().unwrap();
        let first = ReplicaDir::lock(tmp.path()).unwrap();
        let err = ReplicaDir::lock(tmp.path()).unwrap_err();
        assert!(matches!(err, StorageError::Busy { ref path } if path == tmp.path()));
        drop(first);
        ReplicaDir::lock(tmp.path()).unwrap();
    }

    #[test]
    fn missing_directory_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = tmp.path().join("gone");
        let err = ReplicaDir::lock(&gone).unwrap_err();
        assert!(matches!(err, StorageError::MissingFile { ref path } if *path == gone));
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        dir.write_atomic("a", b"one").unwrap();
        dir.write_atomic("a", b"two").unwrap();
        assert_eq!(fs::read(dir.join("a")).unwrap(), b"two");
        assert_eq!(dir.entries().unwrap(), vec!["a".to_string()]);
        dir.remove_if_exists("a").unwrap();
        dir.remove_if_exists("a").unwrap();
        assert!(dir.entries().unwrap().is_empty());
    }
}
