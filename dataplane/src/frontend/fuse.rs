//! `--frontend fuse`: the volume as a file in a FUSE mount, with a loop device
//! on top of it, published as `<dev_dir>/<volume>`.
//!
//! ```text
//! /dev/oxhorn/<volume> -> /dev/loopN -> <run_dir>/fuse/<volume>/volume -> BlockDevice
//! ```
//!
//! The loop device does direct I/O on the file and the file is opened with
//! FOPEN_DIRECT_IO, so the only page cache is the block device's own.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;
use nix::mount::MntFlags;
use tokio::runtime::Handle;
use tracing::{Span, info, info_span, warn};

use super::device_link::{self, DeviceLink};
use super::error::{FrontendError, Result};
use super::fuse_dev;
use super::fuse_session::{FuseTransport, Session};
use super::fusefs::{FILE_INO, FILE_NAME, VolumeFs};
use super::loopdev::{self, Detached, LoopDevice};
use super::{BLOCK_SIZE, BlockDevice};

/// Where volume links go unless told otherwise.
pub const DEFAULT_DEV_DIR: &str = "/dev/oxhorn";

/// How long stop waits for a transient opener of the loop device or the
/// FUSE file (blkid, a closing process) before detaching lazily.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// Where and how to set the frontend up.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    /// The volume is mounted at `<run_dir>/fuse/<volume>`.
    pub run_dir: PathBuf,
    /// The device link is `<dev_dir>/<volume>`.
    pub dev_dir: PathBuf,
    /// Threads reading requests from the kernel. They only parse requests and
    /// hand them to the runtime, so few are needed.
    pub session_threads: usize,
    /// How the kernel's requests reach us.
    pub transport: FuseTransport,
}

impl FuseOptions {
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        FuseOptions {
            run_dir: run_dir.into(),
            dev_dir: PathBuf::from(DEFAULT_DEV_DIR),
            session_threads: 2,
            transport: FuseTransport::DevFuse,
        }
    }
}

/// How far [`FuseFrontend::stop`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// Device detached, FUSE unmounted, nothing of the volume left.
    Complete,
    /// The device (or the FUSE file) is still open, by a mounted filesystem
    /// say: it was detached lazily and keeps serving I/O to the
    /// [`BlockDevice`] until its last user closes it; then the loop device and
    /// the FUSE mount disappear by themselves.
    DeviceStillOpen,
}

/// The paths of one volume's frontend.
#[derive(Debug)]
struct Paths {
    mount_point: PathBuf,
    backing_file: PathBuf,
    link: PathBuf,
}

impl Paths {
    /// Creates `<run_dir>/fuse` and resolves it: the kernel reports loop
    /// backing files by their resolved path, which is how stale ones are found.
    fn new(options: &FuseOptions, volume: &str) -> Result<Self> {
        let base = options.run_dir.join("fuse");
        fs::create_dir_all(&base).map_err(|e| FrontendError::io("creating", &base, e))?;
        let base = base
            .canonicalize()
            .map_err(|e| FrontendError::io("resolving", &base, e))?;
        let mount_point = base.join(volume);
        Ok(Paths {
            backing_file: mount_point.join(FILE_NAME),
            mount_point,
            link: options.dev_dir.join(volume),
        })
    }
}

/// A volume exposed through FUSE and a loop device. Tear it down with
/// [`FuseFrontend::stop`]; dropping it does the same, reporting errors only
/// in the log.
///
/// Starting and stopping block (mount, ioctls, waiting for the kernel), and
/// the kernel's requests are answered on the runtime given to `start`: call
/// them outside that runtime's worker threads (`spawn_blocking`).
#[derive(Debug)]
pub struct FuseFrontend {
    span: Span,
    paths: Paths,
    session: Option<Session>,
    mounted: bool,
    loop_device: Option<LoopDevice>,
    device_path: PathBuf,
    direct_io: bool,
    link: Option<DeviceLink>,
}

impl FuseFrontend {
    /// Mounts the volume's FUSE file, attaches a loop device to it and links
    /// `<dev_dir>/<volume>` to that device, after clearing whatever a previous
    /// run for this volume left behind (a dead mount, loop devices, the link).
    /// Requests from the kernel run on `runtime`.
    pub fn start<D: BlockDevice>(
        device: Arc<D>,
        volume: &str,
        options: &FuseOptions,
        runtime: Handle,
    ) -> Result<Self> {
        crate::names::validate_dns_subdomain("volume name", volume)
            .map_err(FrontendError::InvalidVolume)?;
        let span = info_span!("fuse_frontend", volume);
        let _entered = span.enter();
        let paths = Paths::new(options, volume)?;
        clean_stale(&paths)?;
        let mut frontend = FuseFrontend {
            span: span.clone(),
            paths,
            session: None,
            mounted: false,
            loop_device: None,
            device_path: PathBuf::new(),
            direct_io: false,
            link: None,
        };
        // From here on, dropping `frontend` on an error undoes what was done.
        let fs = VolumeFs::new(device, runtime, span.clone());
        frontend.mount(fs, options)?;
        frontend.attach_loop()?;
        frontend.link = Some(DeviceLink::publish(
            &frontend.paths.link,
            &frontend.device_path,
        )?);
        info!(
            device = %frontend.device_path.display(),
            link = %frontend.paths.link.display(),
            direct_io = frontend.direct_io,
            transport = ?frontend.transport(),
            "volume exposed"
        );
        Ok(frontend)
    }

    /// Clears what an engine that died without stopping its frontend left for
    /// `volume`: the device link, loop devices on the dead FUSE file, and the
    /// dead mount. [`FuseFrontend::start`] does this first too.
    pub fn clean_up(volume: &str, options: &FuseOptions) -> Result<()> {
        crate::names::validate_dns_subdomain("volume name", volume)
            .map_err(FrontendError::InvalidVolume)?;
        clean_stale(&Paths::new(options, volume)?)
    }

    /// The block device: `/dev/loopN`.
    pub fn device_path(&self) -> &Path {
        &self.device_path
    }

    /// `<dev_dir>/<volume>`, the link to [`FuseFrontend::device_path`].
    pub fn link_path(&self) -> &Path {
        &self.paths.link
    }

    /// `<run_dir>/fuse/<volume>`, where the FUSE filesystem is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.paths.mount_point
    }

    /// The FUSE file the loop device reads and writes.
    pub fn backing_file(&self) -> &Path {
        &self.paths.backing_file
    }

    /// Whether the loop device does direct I/O on the FUSE file (it does
    /// unless the kernel refused; see the warning logged at start then).
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// How the kernel's requests reach us: [`FuseTransport::IoUring`] or
    /// [`FuseTransport::DevFuse`].
    pub fn transport(&self) -> FuseTransport {
        self.session
            .as_ref()
            .map_or(FuseTransport::DevFuse, Session::transport)
    }

    /// The requests that arrived through io_uring so far.
    pub fn ring_requests(&self) -> u64 {
        self.session.as_ref().map_or(0, Session::ring_requests)
    }

    /// Shows a grown volume: the kernel drops the file's cached attributes
    /// (so it sees the device's new size) and the loop device re-reads it.
    pub fn refresh_size(&self) -> Result<()> {
        if let Some(session) = &self.session {
            session.inval_inode(FILE_INO).map_err(|e| {
                FrontendError::io("invalidating the size of", &self.paths.backing_file, e)
            })?;
        }
        if let Some(device) = &self.loop_device {
            device
                .refresh_capacity()
                .map_err(|e| FrontendError::io("resizing", &self.device_path, e))?;
        }
        info!(device = %self.device_path.display(), "volume size refreshed");
        Ok(())
    }

    /// Removes the link, detaches the loop device and unmounts the FUSE
    /// filesystem. Does not wait for a device that is still open: see
    /// [`StopOutcome::DeviceStillOpen`].
    pub fn stop(mut self) -> Result<StopOutcome> {
        let span = self.span.clone();
        let _entered = span.enter();
        self.teardown()
    }

    fn mount<D: BlockDevice>(&mut self, fs: VolumeFs<D>, options: &FuseOptions) -> Result<()> {
        let mount_point = &self.paths.mount_point;
        fs::create_dir_all(mount_point)
            .map_err(|e| FrontendError::io("creating", mount_point, e))?;
        let fuse = fuse_dev::mount(mount_point)?;
        self.mounted = true;
        let span = self.span.clone();
        let session = Session::start(fuse, fs, options.session_threads, options.transport, span)
            .map_err(|e| FrontendError::io("serving FUSE at", mount_point, e))?;
        self.session = Some(session);
        Ok(())
    }

    fn attach_loop(&mut self) -> Result<()> {
        let path = &self.paths.backing_file;
        let backing = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| FrontendError::io("opening", path, e))?;
        let device = attach_preferring_direct_io(&backing, path)?;
        self.direct_io = device
            .direct_io()
            .map_err(|e| FrontendError::io("reading direct I/O state of", &device.path(), e))?;
        if !self.direct_io {
            warn!("loop device does buffered I/O on the FUSE file: the kernel refused direct I/O");
        }
        self.device_path = device.path();
        self.loop_device = Some(device);
        Ok(())
    }

    /// Undoes start, newest first. Goes on after an error so that as much as
    /// possible is cleaned up, and returns the first error.
    fn teardown(&mut self) -> Result<StopOutcome> {
        let link = self.link.take().map_or(Ok(()), DeviceLink::remove);
        let released = self.detach_loop();
        let unmounted = self.unmount_fuse(!matches!(released, Ok(false)));
        // Even after a lazy unmount the mount point is a plain directory again.
        let removed = remove_dir(&self.paths.mount_point);
        let complete = matches!(released, Ok(true)) && matches!(unmounted, Ok(true));
        let errors = [link.err(), released.err(), unmounted.err(), removed.err()];
        let mut errors = errors.into_iter().flatten();
        if let Some(first) = errors.next() {
            for other in errors {
                warn!(%other, "tearing down");
            }
            return Err(first);
        }
        if complete {
            info!("volume frontend stopped");
            Ok(StopOutcome::Complete)
        } else {
            warn!("volume still open: detached lazily, it goes when its last user closes it");
            Ok(StopOutcome::DeviceStillOpen)
        }
    }

    fn is_torn_down(&self) -> bool {
        self.link.is_none() && self.loop_device.is_none() && !self.mounted
    }

    /// Whether the loop device let go of the FUSE file (it has not if someone
    /// still has the device open).
    fn detach_loop(&mut self) -> Result<bool> {
        let Some(device) = self.loop_device.take() else {
            return Ok(true);
        };
        let path = device.path();
        match device.detach(RELEASE_GRACE) {
            Ok(Detached::Now) => Ok(true),
            Ok(Detached::WhenClosed) => Ok(false),
            Err(e) => Err(FrontendError::io("detaching", &path, e)),
        }
    }

    /// Whether the FUSE filesystem is gone (rather than detached lazily
    /// because its file is still open). No point waiting for the file to be
    /// closed if the loop device still holds it.
    fn unmount_fuse(&mut self, file_released: bool) -> Result<bool> {
        if !std::mem::take(&mut self.mounted) {
            return Ok(true);
        }
        let grace = if file_released {
            RELEASE_GRACE
        } else {
            Duration::ZERO
        };
        match unmount(&self.paths.mount_point, grace)? {
            Unmount::Done => self.join_session().map(|()| true),
            Unmount::Lazy => Ok(false),
        }
    }

    /// After a complete unmount the kernel ends the connection and the
    /// session threads see the end of their requests and return.
    fn join_session(&mut self) -> Result<()> {
        match self.session.take() {
            Some(session) => session.join().map_err(|e| {
                FrontendError::io("ending FUSE session at", &self.paths.mount_point, e)
            }),
            None => Ok(()),
        }
    }
}

impl Drop for FuseFrontend {
    fn drop(&mut self) {
        if self.is_torn_down() {
            return;
        }
        let span = self.span.clone();
        let _entered = span.enter();
        if let Err(err) = self.teardown() {
            warn!(%err, "frontend dropped; cleanup incomplete");
        }
    }
}

/// Attaches with direct I/O, or buffered if the kernel refuses direct I/O on
/// this file (EINVAL); any other error is returned.
fn attach_preferring_direct_io(backing: &File, path: &Path) -> Result<LoopDevice> {
    let block_size = BLOCK_SIZE as u32;
    match LoopDevice::attach(backing, path, block_size, true) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            warn!(%e, "loop device refused direct I/O; retrying buffered");
            LoopDevice::attach(backing, path, block_size, false)
        }
        other => other,
    }
    .map_err(|e| FrontendError::io("attaching a loop device to", path, e))
}

enum Unmount {
    Done,
    /// Still in use: detached from the tree, goes when no longer used.
    Lazy,
}

/// Unmounts `mount_point`, retrying for `grace` while it is busy, then lazily.
fn unmount(mount_point: &Path, grace: Duration) -> Result<Unmount> {
    let deadline = Instant::now() + grace;
    loop {
        match nix::mount::umount2(mount_point, MntFlags::empty()) {
            // EINVAL: not mounted any more (someone unmounted it for us).
            Ok(()) | Err(Errno::EINVAL) => return Ok(Unmount::Done),
            Err(Errno::EBUSY) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(Errno::EBUSY) => break,
            Err(e) => return Err(FrontendError::io("unmounting", mount_point, e)),
        }
    }
    nix::mount::umount2(mount_point, MntFlags::MNT_DETACH)
        .map_err(|e| FrontendError::io("lazily unmounting", mount_point, e))?;
    Ok(Unmount::Lazy)
}

fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(FrontendError::io("removing", dir, e)),
        _ => Ok(()),
    }
}

/// Clears what a run that did not stop cleanly left: the link, loop devices
/// still bound to the old FUSE file, and the dead mount itself ("Transport
/// endpoint is not connected"). The engine is the only user of its volume's
/// paths, so whatever is there is stale.
fn clean_stale(paths: &Paths) -> Result<()> {
    device_link::remove_stale(&paths.link)?;
    let stale = loopdev::backed_by(&paths.backing_file)
        .map_err(|e| FrontendError::io("listing loop devices backed by", &paths.backing_file, e))?;
    for number in stale {
        // A stale device only holds a dead file: failing to detach it does
        // not keep us from serving the volume on a new one.
        match loopdev::detach_number(number) {
            Ok(()) => warn!(number, "detached a loop device left by an earlier run"),
            Err(err) => warn!(number, %err, "cannot detach a loop device left by an earlier run"),
        }
    }
    // Mounts may be stacked; each lazy unmount removes the top one.
    while is_mount_point(&paths.mount_point)? {
        warn!(mount_point = %paths.mount_point.display(), "unmounting a mount left by an earlier run");
        nix::mount::umount2(&paths.mount_point, MntFlags::MNT_DETACH)
            .map_err(|e| FrontendError::io("unmounting", &paths.mount_point, e))?;
    }
    Ok(())
}

/// Whether something is mounted at `path`, from /proc/self/mountinfo: a dead
/// FUSE mount cannot even be stat(2)ed.
fn is_mount_point(path: &Path) -> Result<bool> {
    let mountinfo = Path::new("/proc/self/mountinfo");
    let text =
        fs::read_to_string(mountinfo).map_err(|e| FrontendError::io("reading", mountinfo, e))?;
    let wanted = path.as_os_str().as_encoded_bytes();
    Ok(text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mount_point| unescape_octal(mount_point) == wanted))
}

/// Undoes mountinfo's escaping of space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                out.push(
                    digits
                        .iter()
                        .fold(0u8, |acc, d| acc.wrapping_mul(8) + (d - b'0')),
                );
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_octal(r"/run/a\040b\134c"), b"/run/a b\\c");
        assert_eq!(unescape_octal(r"/plain\x"), b"/plain\\x");
        assert_eq!(unescape_octal(r"/end\04"), b"/end\\04");
    }
}
