//! `/dev/fuse`: mounting a FUSE filesystem on a descriptor of it, and that
//! descriptor's reads and writes. One read is one whole request; one write
//! one whole reply or notification.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::mount::MsFlags;
use nix::sys::stat::Mode;
use zerocopy::IntoBytes;

use super::error::{FrontendError, Result};
use super::fuse_abi::OutHeader;
use super::fuse_proto;

const DEV_FUSE: &str = "/dev/fuse";

/// `FUSE_DEV_IOC_CLONE`: attaches a new `/dev/fuse` descriptor to the
/// connection of the one whose number it is given.
mod ioctl {
    nix::ioctl_read!(dev_clone, 229, 0, u32);
}

/// A `/dev/fuse` descriptor of one connection.
#[derive(Debug)]
pub(crate) struct DevFuse(File);

impl DevFuse {
    pub(crate) fn new(fd: OwnedFd) -> Self {
        DevFuse(File::from(fd))
    }

    /// Another descriptor of the same connection, with its own queue of
    /// requests being processed: a request read from it is answered on it.
    pub(crate) fn clone_connection(&self) -> io::Result<DevFuse> {
        let fd = nix::fcntl::open(DEV_FUSE, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())?;
        let mut source = u32::try_from(self.0.as_raw_fd()).map_err(io::Error::other)?;
        // SAFETY: `fd` is an open /dev/fuse descriptor, and the ioctl only
        // reads the u32 it is given, which lives across the call.
        unsafe { ioctl::dev_clone(fd.as_raw_fd(), &mut source) }?;
        Ok(DevFuse::new(fd))
    }

    /// Reads one request into `buf`. Errors as the kernel gives them: ENODEV
    /// once the connection is gone; ENOENT, EINTR and EAGAIN mean try again.
    pub(crate) fn receive(&self, buf: &mut [u8]) -> nix::Result<usize> {
        nix::unistd::read(&self.0, buf)
    }

    /// Writes one reply: ENOENT if the kernel no longer waits for it (the
    /// request was interrupted or the connection aborted), ENODEV once the
    /// connection is gone.
    pub(crate) fn reply(&self, header: &OutHeader, body: &[u8]) -> nix::Result<()> {
        let parts = [IoSlice::new(header.as_bytes()), IoSlice::new(body)];
        // The kernel takes a message in one write or refuses it: no partial
        // writes to resume.
        nix::sys::uio::writev(&self.0, &parts).map(drop)
    }

    /// Tells the kernel to drop the inode's cached attributes and data.
    pub(crate) fn notify_inval_inode(&self, ino: u64) -> io::Result<()> {
        let message = fuse_proto::notify_inval_inode(ino, 0, 0);
        match nix::unistd::write(&self.0, &message) {
            // Nothing cached for it: nothing to drop.
            Ok(_) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl AsFd for DevFuse {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Mounts a FUSE filesystem at `mount_point` and returns the `/dev/fuse`
/// descriptor that serves it. We are root, so mount(2) directly rather than
/// through fusermount, which also leaves unmounting entirely to us.
pub(crate) fn mount(mount_point: &Path) -> Result<OwnedFd> {
    let dev = Path::new(DEV_FUSE);
    let fuse = nix::fcntl::open(dev, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| FrontendError::io("opening", dev, e))?;
    // allow_other: the volume's users are not only us (the loop driver, pods);
    // default_permissions: so the kernel enforces the file's 0600.
    let options = format!(
        "fd={},rootmode={:o},user_id={},group_id={},allow_other,default_permissions",
        fuse.as_raw_fd(),
        libc::S_IFDIR | 0o755,
        nix::unistd::geteuid(),
        nix::unistd::getegid(),
    );
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    nix::mount::mount(
        Some("oxhorn"),
        mount_point,
        Some("fuse.oxhorn"),
        flags,
        Some(options.as_str()),
    )
    .map_err(|e| FrontendError::io("mounting FUSE at", mount_point, e))?;
    Ok(fuse)
}
