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
                Error::Failed(format!(
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

    /// Unmounts now; an error if the filesystem stays busy. EBUSY is tried
    /// again for up to 5 s: a path walk on the mount at that instant (by
    /// any process, e.g. another test's kubelet taking every filesystem's
    /// statfs) makes umount fail with it, and it passes at once.
    pub fn unmount(self) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match nix::mount::umount(&self.0) {
                Ok(()) => {
                    std::mem::forget(self);
                    return Ok(());
                }
                Err(nix::Error::EBUSY) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => {
                    return Err(Error::Failed(format!(
                        "unmounting {}: {e}",
                        self.0.display()
                    )));
                }
            }
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

/// This process's mount points; none if they cannot be read.
fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .collect()
}

/// Mount points under `root`, deepest first. Never panics: also used while
/// unwinding.
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let mut mounts: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|mount| mount.starts_with(root))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    mounts
}

/// The mount point of the mount `path` is on: the deepest mount point
/// `path` is under.
pub fn containing_mount(path: &Path) -> PathBuf {
    mount_points()
        .into_iter()
        .filter(|mount| path.starts_with(mount))
        .max_by_key(|mount| mount.as_os_str().len())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// Loop devices backed by files under `root`. Never panics: also used while
/// unwinding.
pub fn loop_devices_under(root: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.strip_prefix("loop")?.parse().ok())
        .filter(|&number| {
            oxhorn::frontend::loopdev::backing_file(number)
                .ok()
                .flatten()
                .is_some_and(|file| file.starts_with(root))
        })
        .collect()
}

/// Detaches every loop device backed by a file under `root`: each goes now,
/// or when its last user closes it. Best effort, never panics.
pub fn detach_loop_devices_under(root: &Path) {
    for number in loop_devices_under(root) {
        let _ = oxhorn::frontend::loopdev::detach_number(number);
    }
}

/// Detaches every loop device backed under `root` and unmounts (lazily)
/// everything mounted under it: what a failed test may leave. Best effort,
/// never panics.
pub fn release_under(root: &Path) {
    detach_loop_devices_under(root);
    for mount in mounts_under(root) {
        let _ = nix::mount::umount2(&mount, MntFlags::MNT_DETACH);
    }
}

/// Runs `command` in a mount namespace of its own where each `(source,
/// target)` of `binds` is bind-mounted over `target` (a file over a file, a
/// directory over a directory): a view of the host for one process that
/// changes nothing for the others. The mounts holding the targets are made
/// slaves there, so that a bind reaches no other namespace on a host whose
/// root is shared; every other mount keeps its propagation (a kubelet's node
/// directory stays a peer of the host's).
pub(crate) fn bind_in_own_namespace(
    command: &mut std::process::Command,
    binds: &[(PathBuf, PathBuf)],
) -> Result<()> {
    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;

    use nix::sched::{CloneFlags, unshare};

    let c_string = |path: &Path| {
        CString::new(path.as_os_str().as_bytes())
            .map_err(|_| Error::Failed(format!("{} holds a NUL", path.display())))
    };
    let mut holders = Vec::new();
    let mut pairs = Vec::new();
    for (source, target) in binds {
        // Resolved: a link on the way may lead to another mount.
        let resolved = std::fs::canonicalize(target).map_err(|e| Error::io(target, e))?;
        let holder = c_string(&containing_mount(&resolved))?;
        if !holders.contains(&holder) {
            holders.push(holder);
        }
        pairs.push((c_string(source)?, c_string(&resolved)?));
    }
    // SAFETY: only system calls on strings made before the fork run in the
    // child.
    unsafe {
        command.pre_exec(move || {
            unshare(CloneFlags::CLONE_NEWNS)?;
            for holder in &holders {
                nix::mount::mount(
                    None::<&CStr>,
                    holder.as_c_str(),
                    None::<&CStr>,
                    MsFlags::MS_SLAVE,
                    None::<&CStr>,
                )?;
            }
            for (source, target) in &pairs {
                nix::mount::mount(
                    Some(source.as_c_str()),
                    target.as_c_str(),
                    None::<&CStr>,
                    MsFlags::MS_BIND,
                    None::<&CStr>,
                )?;
            }
            Ok(())
        });
    }
    Ok(())
}
