//! The CSI endpoint: a `unix:///absolute/path` socket, created so that a
//! half-made or world-accessible socket is never visible at that path.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::{Error, Result};

/// Socket permissions: the owner and its group (kubelet, the sidecars) only.
const SOCKET_MODE: u32 = 0o660;

/// Parses `unix:///abs/path` into the socket path.
pub fn parse(endpoint: &str) -> Result<PathBuf> {
    let invalid = |reason| Error::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let path = endpoint
        .strip_prefix("unix://")
        .ok_or_else(|| invalid("only unix:// endpoints are supported"))?;
    if !path.starts_with('/') {
        return Err(invalid("the socket path must be absolute (unix:///path)"));
    }
    if path.ends_with('/') {
        return Err(invalid("the socket path names a directory"));
    }
    Ok(PathBuf::from(path))
}

/// Removes the socket file when dropped, unless another process has since
/// replaced it.
pub struct SocketGuard {
    path: PathBuf,
    inode: u64,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Binds the socket at `path` with mode 0660. A stale socket left by a dead
/// process is replaced; a live one, or a file that is not a socket, is an error.
/// The socket is bound under a temporary name and renamed into place, so it
/// never appears at `path` with looser permissions.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketGuard)> {
    refuse_live_or_foreign(path)?;
    let dir = path
        .parent()
        .ok_or_else(|| Error::NotASocket(path.to_path_buf()))?;
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let placed = fs::set_permissions(&tmp, fs::Permissions::from_mode(SOCKET_MODE))
        .and_then(|()| fs::rename(&tmp, path))
        .and_then(|()| fs::symlink_metadata(path));
    match placed {
        Ok(meta) => Ok((
            listener,
            SocketGuard {
                path: path.to_path_buf(),
                inode: meta.ino(),
            },
        )),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(Error::io(path, e))
        }
    }
}

fn refuse_live_or_foreign(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(path, e)),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket(path.to_path_buf()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(Error::SocketInUse(path.to_path_buf())),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_absolute_unix_endpoints_only() {
        assert_eq!(
            parse("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        for bad in [
            "/csi/csi.sock",
            "tcp://127.0.0.1:1",
            "unix://csi.sock",
            "unix:///csi/",
            "unix://",
        ] {
            assert!(
                matches!(parse(bad), Err(Error::InvalidEndpoint { .. })),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn binds_with_group_only_mode_and_removes_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let bound = bind(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        drop(bound);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn replaces_a_stale_socket_but_not_a_live_one_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(
            path.exists(),
            "a dead listener leaves its socket file behind"
        );
        let live = bind(&path).expect("stale socket is replaced");
        assert!(matches!(bind(&path), Err(Error::SocketInUse(_))));
        drop(live);

        fs::write(&path, b"not a socket").unwrap();
        assert!(matches!(bind(&path), Err(Error::NotASocket(_))));
        assert_eq!(fs::read(&path).unwrap(), b"not a socket");
    }
}
