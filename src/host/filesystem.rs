//! Filesystems on block devices: what a device holds, making one, growing
//! one, and how full a mounted one is.

use std::fmt;
use std::path::Path;

use super::command::failure;
use super::{Host, HostError, Result};

/// The filesystems the node plugin makes and mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "ext4" => Ok(FsType::Ext4),
            "xfs" => Ok(FsType::Xfs),
            other => Err(HostError::UnsupportedFilesystem(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What blkid found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// No signature at all: safe to format.
    Empty,
    /// A filesystem of this type (blkid's name: "ext4", "xfs", "swap", ...).
    Filesystem(String),
    /// Something else: a partition table, RAID member, LVM... never format it.
    Other(String),
}

/// blkid's exit status when it found no signature on the device.
const BLKID_NOTHING_FOUND: i32 = 2;

impl Host {
    /// Probes `device` directly (`-p`: no cache, which could be stale).
    pub async fn probe(&self, device: &Path) -> Result<Content> {
        let args = [
            "-p".as_ref(),
            "-o".as_ref(),
            "export".as_ref(),
            device.as_os_str(),
        ];
        let output = self.output("blkid", &args).await?;
        match output.status.code() {
            Some(0) => Ok(parse_blkid(&String::from_utf8_lossy(&output.stdout))),
            Some(BLKID_NOTHING_FOUND) => Ok(Content::Empty),
            _ => Err(failure("blkid", &args, &output)),
        }
    }

    /// Makes a filesystem on `device`. Call only on an [`Content::Empty`]
    /// device: the force flags are there because mkfs asks otherwise.
    pub async fn format(&self, device: &Path, fs: FsType) -> Result<()> {
        let dev = device.as_os_str();
        match fs {
            // Initialize inode tables and journal now rather than in the
            // background, where it would compete with the first workload.
            FsType::Ext4 => {
                let args = [
                    "-F".as_ref(),
                    "-E".as_ref(),
                    "lazy_itable_init=0,lazy_journal_init=0".as_ref(),
                    dev,
                ];
                self.run("mkfs.ext4", &args).await?;
            }
            FsType::Xfs => {
                self.run("mkfs.xfs", &["-f".as_ref(), dev]).await?;
            }
        }
        Ok(())
    }

    /// Grows the filesystem of `device`, mounted at `mount_point`, to fill
    /// the device.
    pub async fn grow(&self, device: &Path, mount_point: &Path, fs: FsType) -> Result<()> {
        match fs {
            FsType::Ext4 => self.run("resize2fs", &[device.as_os_str()]).await,
            FsType::Xfs => self.run("xfs_growfs", &[mount_point.as_os_str()]).await,
        }
        .map_err(explain_resize_failure)?;
        Ok(())
    }
}

/// ext4 online resize needs CAP_SYS_RESOURCE (the kernel's ext4_resize_begin
/// checks it); without it resize2fs only says "Permission denied".
fn explain_resize_failure(err: HostError) -> HostError {
    match err {
        HostError::Command {
            command,
            status,
            stderr,
        } if stderr.contains("Permission denied") && !has_cap_sys_resource() => {
            HostError::Command {
                command,
                status,
                stderr: format!(
                    "{stderr} (the plugin lacks CAP_SYS_RESOURCE, which ext4 online resize requires)"
                ),
            }
        }
        other => other,
    }
}

/// Bit 24 of the effective capability set in /proc/self/status.
fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Reads `blkid -o export` output: KEY=value lines.
fn parse_blkid(text: &str) -> Content {
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    match (value("TYPE"), value("PTTYPE")) {
        (Some(fs), _) => Content::Filesystem(fs),
        (None, Some(table)) => Content::Other(format!("a {table} partition table")),
        (None, None) => Content::Other(format!("an unknown signature ({})", text.trim())),
    }
}

/// Space and inodes of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes_total: u64,
    pub bytes_available: u64,
    pub bytes_used: u64,
    pub inodes_total: u64,
    pub inodes_available: u64,
    pub inodes_used: u64,
}

/// statvfs of the filesystem mounted at `path`. "Available" is what an
/// unprivileged writer can still use, so used + available may be less than
/// the total (reserved blocks).
pub fn usage(path: &Path) -> Result<Usage> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| HostError::io("statvfs", path, e))?;
    let block = st.fragment_size();
    Ok(Usage {
        bytes_total: st.blocks() * block,
        bytes_available: st.blocks_available() * block,
        bytes_used: st.blocks().saturating_sub(st.blocks_free()) * block,
        inodes_total: st.files(),
        inodes_available: st.files_available(),
        inodes_used: st.files().saturating_sub(st.files_free()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_output_is_read_by_kind() {
        let ext4 = "DEVNAME=/dev/loop0\nUUID=abc\nBLOCK_SIZE=4096\nTYPE=ext4\n";
        assert_eq!(parse_blkid(ext4), Content::Filesystem("ext4".into()));
        let table = "DEVNAME=/dev/loop0\nPTUUID=1\nPTTYPE=gpt\n";
        assert_eq!(
            parse_blkid(table),
            Content::Other("a gpt partition table".into())
        );
        assert!(matches!(parse_blkid("DEVNAME=/dev/x\n"), Content::Other(_)));
    }

    #[test]
    fn only_ext4_and_xfs_are_supported() {
        assert_eq!(FsType::parse("ext4").unwrap(), FsType::Ext4);
        assert_eq!(FsType::parse("xfs").unwrap(), FsType::Xfs);
        for bad in ["", "btrfs", "ext3", "EXT4"] {
            assert!(FsType::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn usage_of_a_mounted_filesystem_adds_up() {
        let usage = usage(Path::new("/")).unwrap();
        assert!(usage.bytes_total > 0);
        assert!(usage.bytes_used + usage.bytes_available <= usage.bytes_total);
    }
}
