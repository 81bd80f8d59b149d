//! The stable name of a volume's device: `<dev_dir>/<volume>`, a symbolic
//! link to whatever device node the frontend produced (`/dev/loop3`).

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::error::{FrontendError, Result};

/// A link we made; removed by [`DeviceLink::remove`].
#[derive(Debug)]
pub struct DeviceLink {
    link: PathBuf,
    target: PathBuf,
}

impl DeviceLink {
    /// Points `link` at `target`, replacing a link left by an earlier run.
    /// The new link appears atomically (made aside, then renamed over).
    pub fn publish(link: &Path, target: &Path) -> Result<Self> {
        let dir = link.parent().unwrap_or(Path::new("/"));
        fs::create_dir_all(dir).map_err(|e| FrontendError::io("creating", dir, e))?;
        refuse_non_link(link)?;
        let aside = aside_path(link);
        remove_if_exists(&aside).map_err(|e| FrontendError::io("removing", &aside, e))?;
        symlink(target, &aside).map_err(|e| FrontendError::io("linking", &aside, e))?;
        fs::rename(&aside, link).map_err(|e| FrontendError::io("renaming onto", link, e))?;
        Ok(DeviceLink {
            link: link.to_path_buf(),
            target: target.to_path_buf(),
        })
    }

    /// Removes the link, unless it has been pointed elsewhere since (a newer
    /// frontend for the same volume owns it then).
    pub fn remove(self) -> Result<()> {
        match fs::read_link(&self.link) {
            Ok(target) if target == self.target => fs::remove_file(&self.link)
                .map_err(|e| FrontendError::io("removing", &self.link, e)),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(FrontendError::io("reading", &self.link, e)),
        }
    }
}

/// Removes a link left at `link` by a run that did not clean up.
pub fn remove_stale(link: &Path) -> Result<()> {
    refuse_non_link(link)?;
    remove_if_exists(link).map_err(|e| FrontendError::io("removing", link, e))
}

/// The link's path is ours to replace only if it is a link: a file or
/// directory there was put by someone else.
fn refuse_non_link(link: &Path) -> Result<()> {
    match fs::symlink_metadata(link) {
        Ok(meta) if meta.file_type().is_symlink() => Ok(()),
        Ok(_) => Err(FrontendError::NotALink {
            path: link.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FrontendError::io("inspecting", link, e)),
    }
}

/// `.<name>.new` next to `link`: volume names never start with a dot, so it
/// cannot be another volume's link.
fn aside_path(link: &Path) -> PathBuf {
    let name = link.file_name().unwrap_or_default().to_string_lossy();
    link.with_file_name(format!(".{name}.new"))
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}
