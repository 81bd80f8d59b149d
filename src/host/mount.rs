//! Mounts through mount(2), and the mount table read from mountinfo.

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

use super::device::DeviceNumber;
use super::{Host, HostError, Result};

/// One line of `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The device of the mounted filesystem.
    pub device: DeviceNumber,
    /// The directory of that filesystem mounted here ("/" unless a bind).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options: "ro" or "rw" first, then nosuid, noexec...
    pub options: String,
    pub fs_type: String,
    pub source: String,
}

impl MountEntry {
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

impl Host {
    /// Every mount of the host, in mount order.
    pub fn mounts(&self) -> Result<Vec<MountEntry>> {
        let path = self.mountinfo_path();
        let text =
            std::fs::read_to_string(&path).map_err(|e| HostError::io("reading", &path, e))?;
        text.lines()
            .map(|line| {
                parse_mountinfo_line(line).ok_or_else(|| HostError::Output {
                    program: path.display().to_string(),
                    detail: format!("cannot parse {line:?}"),
                })
            })
            .collect()
    }

    /// The mount visible at `path` (the last one mounted there), if any.
    pub fn mount_at(&self, path: &Path) -> Result<Option<MountEntry>> {
        // The table names mount points without links; kubelet's paths may have some.
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(self
            .mounts()?
            .into_iter()
            .rev()
            .find(|m| m.mount_point == path))
    }
}

/// Parses `36 35 98:0 /root /mnt rw,noatime master:1 - ext4 /dev/sda rw`.
fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (mount, filesystem) = line.split_once(" - ")?;
    let mut fields = mount.split(' ');
    let (_id, _parent) = (fields.next()?, fields.next()?);
    let (major, minor) = fields.next()?.split_once(':')?;
    let root = unescape(fields.next()?);
    let mount_point = unescape(fields.next()?);
    let options = fields.next()?.to_string();
    let mut filesystem = filesystem.split(' ');
    Some(MountEntry {
        device: DeviceNumber {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        },
        root: root.into(),
        mount_point: mount_point.into(),
        options,
        fs_type: filesystem.next()?.to_string(),
        source: unescape(filesystem.next()?),
    })
}

/// The kernel writes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            let digits = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(digits, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount options as a CSI request gives them (one option per string), split
/// into the generic flags of mount(2) and the filesystem's own options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub flags: MsFlags,
    /// Passed to the filesystem as its comma-separated data string.
    pub data: Vec<String>,
}

/// Options mount(8) turns into flags: (name, flag, whether it sets it).
const FLAG_OPTIONS: &[(&str, MsFlags, bool)] = &[
    ("ro", MsFlags::MS_RDONLY, true),
    ("rw", MsFlags::MS_RDONLY, false),
    ("nosuid", MsFlags::MS_NOSUID, true),
    ("suid", MsFlags::MS_NOSUID, false),
    ("nodev", MsFlags::MS_NODEV, true),
    ("dev", MsFlags::MS_NODEV, false),
    ("noexec", MsFlags::MS_NOEXEC, true),
    ("exec", MsFlags::MS_NOEXEC, false),
    ("sync", MsFlags::MS_SYNCHRONOUS, true),
    ("async", MsFlags::MS_SYNCHRONOUS, false),
    ("dirsync", MsFlags::MS_DIRSYNC, true),
    ("noatime", MsFlags::MS_NOATIME, true),
    ("atime", MsFlags::MS_NOATIME, false),
    ("nodiratime", MsFlags::MS_NODIRATIME, true),
    ("diratime", MsFlags::MS_NODIRATIME, false),
    ("relatime", MsFlags::MS_RELATIME, true),
    ("norelatime", MsFlags::MS_RELATIME, false),
    ("strictatime", MsFlags::MS_STRICTATIME, true),
    ("lazytime", MsFlags::MS_LAZYTIME, true),
    ("nolazytime", MsFlags::MS_LAZYTIME, false),
    ("defaults", MsFlags::empty(), true),
];

/// Options that would change what a mount call does rather than how the
/// filesystem behaves: never taken from a request.
const REFUSED_OPTIONS: &[&str] = &["bind", "rbind", "remount", "move", "loop"];

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            flags: MsFlags::empty(),
            data: Vec::new(),
        }
    }
}

impl MountOptions {
    pub fn parse(options: &[String]) -> Result<Self> {
        let mut parsed = MountOptions::default();
        for option in options {
            validate_option(option)?;
            match FLAG_OPTIONS.iter().find(|(name, ..)| name == option) {
                Some(&(_, flag, true)) => parsed.flags.insert(flag),
                Some(&(_, flag, false)) => parsed.flags.remove(flag),
                None => parsed.data.push(option.clone()),
            }
        }
        Ok(parsed)
    }

    /// Adds read-only when `read_only`; an "ro" among the options stays.
    pub fn or_read_only(mut self, read_only: bool) -> Self {
        if read_only {
            self.flags.insert(MsFlags::MS_RDONLY);
        }
        self
    }

    pub fn is_read_only(&self) -> bool {
        self.flags.contains(MsFlags::MS_RDONLY)
    }

    fn data(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }
}

fn validate_option(option: &str) -> Result<()> {
    let refuse = |reason| {
        Err(HostError::MountOption {
            option: option.to_string(),
            reason,
        })
    };
    if option.is_empty() {
        return refuse("empty");
    }
    if option.contains(',') {
        return refuse("one option per entry: no commas");
    }
    if option.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("no whitespace or control characters");
    }
    if REFUSED_OPTIONS.contains(&option) {
        return refuse("it changes the kind of mount");
    }
    Ok(())
}

/// Mounts the filesystem `fs_type` on `device` at `at`.
pub async fn mount_filesystem(
    device: &Path,
    at: &Path,
    fs_type: &'static str,
    options: &MountOptions,
) -> Result<()> {
    let (device, at, options) = (device.to_owned(), at.to_owned(), options.clone());
    off_runtime("mounting", at.clone(), move || {
        nix::mount::mount(
            Some(&device),
            &at,
            Some(fs_type),
            options.flags,
            options.data().as_deref(),
        )
        .map_err(|e| HostError::io("mounting", &at, e))
    })
    .await
}

/// Bind-mounts `source` (a directory or a device node) at `at`, then applies
/// `options`' flags, which a bind mount only takes on a remount.
pub async fn bind(source: &Path, at: &Path, options: &MountOptions) -> Result<()> {
    let (source, at, flags) = (source.to_owned(), at.to_owned(), options.flags);
    off_runtime("bind-mounting onto", at.clone(), move || {
        let none: Option<&str> = None;
        nix::mount::mount(Some(&source), &at, none, MsFlags::MS_BIND, none)
            .map_err(|e| HostError::io("bind-mounting onto", &at, e))?;
        if flags.is_empty() {
            return Ok(());
        }
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags;
        nix::mount::mount(none, &at, none, flags, none).map_err(|e| {
            // Leave nothing half done: a writable mount where a read-only one was asked.
            let _ = nix::mount::umount(&at);
            HostError::io("remounting", &at, e)
        })
    })
    .await
}

/// Unmounts the filesystem at `at`; nothing to do if none is mounted there.
pub async fn unmount(at: &Path) -> Result<()> {
    let at = at.to_owned();
    off_runtime("unmounting", at.clone(), move || match nix::mount::umount2(
        &at,
        MntFlags::UMOUNT_NOFOLLOW,
    ) {
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(HostError::io("unmounting", &at, e)),
    })
    .await
}

/// Runs a mount system call on tokio's blocking pool. mount(2) reads the
/// superblock and umount(2) flushes dirty pages, both through the volume's
/// engine: seconds when it is slow, and on an async worker that would stall
/// every other CSI call and the plugin's caches with it.
async fn off_runtime(
    action: &'static str,
    path: PathBuf,
    call: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<()> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or_else(|e| Err(HostError::io(action, &path, std::io::Error::other(e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_parsed_with_escapes() {
        let line = r"36 35 7:3 / /var/lib/kubelet/a\040b rw,noatime shared:1 master:2 - ext4 /dev/loop3 rw,errors=remount-ro";
        let entry = parse_mountinfo_line(line).unwrap();
        assert_eq!(entry.device, DeviceNumber { major: 7, minor: 3 });
        assert_eq!(entry.root, Path::new("/"));
        assert_eq!(entry.mount_point, Path::new("/var/lib/kubelet/a b"));
        assert_eq!(entry.fs_type, "ext4");
        assert_eq!(entry.source, "/dev/loop3");
        assert!(!entry.read_only());
        assert_eq!(unescape(r"a\134b\011"), "a\\b\t");
        assert_eq!(unescape(r"trailing\04"), r"trailing\04");
    }

    #[test]
    fn our_own_mount_table_parses() {
        let mounts = Host::default().mounts().unwrap();
        assert!(mounts.iter().any(|m| m.mount_point == Path::new("/")));
        assert!(Host::default().mount_at(Path::new("/")).unwrap().is_some());
    }

    #[test]
    fn options_split_into_flags_and_filesystem_data() {
        let options: Vec<String> = ["ro", "noexec", "discard", "noatime", "exec", "data=ordered"]
            .map(String::from)
            .into();
        let parsed = MountOptions::parse(&options).unwrap();
        assert_eq!(parsed.flags, MsFlags::MS_RDONLY | MsFlags::MS_NOATIME);
        assert_eq!(parsed.data(), Some("discard,data=ordered".to_string()));
        assert!(parsed.clone().or_read_only(false).is_read_only());
        assert!(MountOptions::default().or_read_only(true).is_read_only());
    }

    #[test]
    fn dangerous_options_are_refused() {
        for bad in ["a,b", "", "x y", "a\nb", "bind", "remount"] {
            let err = MountOptions::parse(&[bad.to_string()]).unwrap_err();
            assert!(matches!(err, HostError::MountOption { .. }), "{bad}: {err}");
        }
    }
}
