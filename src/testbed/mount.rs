//! A filesystem mounted for a test, unmounted (lazily if busy) when dropped,
//! so a failing test leaves no mount behind.

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::{Error, Result};

pub struct Mounted(PathBuf);

impl Mounted {
    /// Mounts `source` (a device, or e.g. "tmpfs") of type `fstype` at `at`,
    /// creating the directory, with filesystem `options` if any.
    pub fn new(source: &Path, at: &Path, fstype: &str, options: Option<&str>) -> Result<Self> {
        std::fs::create_dir_all(at).map_err(|e| Error::io(at, e))?;
        nix::mount::mount(Some(source), at, Some(fstype), MsFlags::empty(), options).map_err(
            |e| {
                Error::Testbed(format!(
                    "mounting {fstype} {} at {}: {e}",
                    source.display(),
                    at.display()
                ))
            },
        )?;
        Ok(Self(at.to_path_buf()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Unmounts now; an error if the filesystem is busy.
    pub fn unmount(self) -> Result<()> {
        let result = nix::mount::umount(&self.0)
            .map_err(|e| Error::Testbed(format!("unmounting {}: {e}", self.0.display())));
        if result.is_ok() {
            std::mem::forget(self);
        }
        result
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, MntFlags::MNT_DETACH);
    }
}
