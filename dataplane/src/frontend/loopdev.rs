//! Loop devices: a regular file as a block device. There is no binding for
//! `<linux/loop.h>` in nix, so its structures are declared here with their
//! sizes checked at compile time.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;

const LOOP_CONTROL: &str = "/dev/loop-control";
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// How many times to ask for a free device when another process keeps
/// binding the one we were given first.
const GET_FREE_ATTEMPTS: usize = 64;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config`, the argument of `LOOP_CONFIGURE`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(size_of::<LoopInfo64>() == 232);
const _: () = assert!(size_of::<LoopConfig>() == 304);

nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);
nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
nix::ioctl_none_bad!(loop_set_capacity, 0x4C07);

/// A loop device we bound.
///
/// We never keep the block device open: the process serving the FUSE file
/// behind it must not hold it either, or dying would deadlock. Its last
/// close flushes the device's page cache, which waits for I/O that only the
/// dying process could answer. So the device is bound without autoclear and
/// detached explicitly; a crashed engine's device is found by its backing
/// file and detached by the next start.
#[derive(Debug)]
pub struct LoopDevice {
    number: u32,
}

/// What detaching a loop device achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detached {
    /// The device is unbound and has released its backing file.
    Now,
    /// Someone else still has the device open (a mounted filesystem, a
    /// process); the kernel unbinds it when they close it.
    WhenClosed,
}

impl LoopDevice {
    /// Binds a free loop device to `backing`, with `block_size`-byte logical
    /// blocks, reading and writing the backing file with direct I/O if
    /// `direct_io` (the kernel refuses if the file cannot do it).
    pub fn attach(
        backing: &File,
        path: &Path,
        block_size: u32,
        direct_io: bool,
    ) -> io::Result<Self> {
        let control = open_rw(Path::new(LOOP_CONTROL))?;
        let config = loop_config(backing, path, block_size, direct_io)?;
        for _ in 0..GET_FREE_ATTEMPTS {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument; the fd is open.
            let number = unsafe { loop_ctl_get_free(control.as_raw_fd()) }?;
            let number =
                u32::try_from(number).map_err(|_| io::Error::other("negative loop number"))?;
            let device = open_rw(&device_path(number))?;
            // SAFETY: `config` is a `struct loop_config` laid out as the kernel
            // expects (sizes asserted above) and outlives the call.
            match unsafe { loop_configure(device.as_raw_fd(), &config) } {
                Ok(_) => return Ok(LoopDevice { number }),
                // Another process bound it between GET_FREE and CONFIGURE.
                Err(Errno::EBUSY) => continue,
                Err(err) => return Err(err.into()),
            }
        }
        Err(io::Error::other(
            "no free loop device after repeated attempts",
        ))
    }

    /// `/dev/loopN`.
    pub fn path(&self) -> PathBuf {
        device_path(self.number)
    }

    /// Makes the device take the backing file's current size (after the
    /// volume grew). The device is opened only for the call: see the type.
    pub fn refresh_capacity(&self) -> io::Result<()> {
        let device = open_rw(&self.path())?;
        // SAFETY: LOOP_SET_CAPACITY takes no argument; the fd is open.
        unsafe { loop_set_capacity(device.as_raw_fd()) }?;
        Ok(())
    }

    /// Whether the kernel does direct I/O on the backing file.
    pub fn direct_io(&self) -> io::Result<bool> {
        Ok(sysfs_attribute(self.number, "loop/dio")? == "1")
    }

    /// Unbinds the device; if someone still has it open the kernel marks it
    /// for autoclear and unbinds it when they close it. Waits up to `grace`
    /// for other openers (a transient blkid, say) to go away.
    pub fn detach(self, grace: Duration) -> io::Result<Detached> {
        let ours = backing_file(self.number)?;
        detach_number(self.number)?;
        // Once released, the number may be bound again at once, to another file.
        let deadline = Instant::now() + grace;
        while ours.is_some() && backing_file(self.number)? == ours {
            if Instant::now() >= deadline {
                return Ok(Detached::WhenClosed);
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(Detached::Now)
    }
}

/// Numbers of the loop devices whose backing file is `path`, as the kernel
/// names it (an absolute path without symbolic links).
pub fn backed_by(path: &Path) -> io::Result<Vec<u32>> {
    let mut numbers = Vec::new();
    for entry in fs::read_dir("/sys/block")? {
        let name = entry?.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_prefix("loop")?.parse().ok())
        else {
            continue;
        };
        if backing_file(number)?.as_deref() == Some(path) {
            numbers.push(number);
        }
    }
    Ok(numbers)
}

/// Unbinds loop device `number`, which someone else bound (a previous run
/// of ours that crashed). If it is still open it goes when last closed.
pub fn detach_number(number: u32) -> io::Result<()> {
    let device = open_rw(&device_path(number))?;
    // SAFETY: LOOP_CLR_FD takes no argument; the fd is open.
    match unsafe { loop_clr_fd(device.as_raw_fd()) } {
        // ENXIO: it was unbound since we looked.
        Ok(_) | Err(Errno::ENXIO) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The backing file of loop device `number`, `None` if it is unbound.
pub fn backing_file(number: u32) -> io::Result<Option<PathBuf>> {
    match sysfs_attribute(number, "loop/backing_file") {
        Ok(path) => Ok(Some(PathBuf::from(path))),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

fn device_path(number: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{number}"))
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

fn sysfs_attribute(number: u32, attribute: &str) -> io::Result<String> {
    let text = fs::read_to_string(format!("/sys/block/loop{number}/{attribute}"))?;
    Ok(text.trim_end_matches('\n').to_string())
}

fn loop_config(
    backing: &File,
    path: &Path,
    block_size: u32,
    direct_io: bool,
) -> io::Result<LoopConfig> {
    let fd = u32::try_from(backing.as_raw_fd()).map_err(|_| io::Error::other("negative fd"))?;
    let mut lo_flags = 0;
    if direct_io {
        lo_flags |= LO_FLAGS_DIRECT_IO;
    }
    // Informational only (losetup shows it); the kernel keeps the real path.
    // Truncated to leave the terminating NUL.
    let mut lo_file_name = [0; LO_NAME_SIZE];
    let name = path.as_os_str().as_bytes();
    let len = name.len().min(LO_NAME_SIZE - 1);
    lo_file_name[..len].copy_from_slice(&name[..len]);
    Ok(LoopConfig {
        fd,
        block_size,
        info: LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags,
            lo_file_name,
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        },
        reserved: [0; 8],
    })
}
