//! Block devices: which one a path is, and how large it is.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use super::{HostError, Result};

/// A device number split as the mount table shows it (`major:minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceNumber {
    pub major: u64,
    pub minor: u64,
}

impl DeviceNumber {
    pub fn from_raw(rdev: u64) -> Self {
        Self {
            major: nix::sys::stat::major(rdev),
            minor: nix::sys::stat::minor(rdev),
        }
    }
}

/// The device number of the block device at `path` (links followed), None
/// if `path` is not a block device.
pub fn block_device_number(path: &Path) -> Result<Option<DeviceNumber>> {
    let meta = std::fs::metadata(path).map_err(|e| HostError::io("inspecting", path, e))?;
    Ok(meta
        .file_type()
        .is_block_device()
        .then(|| DeviceNumber::from_raw(meta.rdev())))
}

/// The size in bytes of the block device at `path`. Seeking to the end gives
/// the size the kernel has now, after a capacity change too.
pub fn size(path: &Path) -> Result<u64> {
    let mut file = File::open(path).map_err(|e| HostError::io("opening", path, e))?;
    file.seek(SeekFrom::End(0))
        .map_err(|e| HostError::io("measuring", path, e))
}
