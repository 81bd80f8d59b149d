//! The FUSE filesystem of one volume: a root directory holding one regular
//! file, [`FILE_NAME`], whose contents are the volume.
//!
//! The session's reader threads hand it their requests, one at a time per
//! thread. Every data request is therefore passed on to the tokio runtime
//! and answered from there, so that a slow replica never holds up the
//! requests behind it; metadata is answered on the spot.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use nix::libc;
use tokio::runtime::Handle;
use tracing::{Instrument, Span, debug};

use super::aligned::AlignedIo;
use super::fuse_abi::{Attr, InHeader, ROOT_ID, StatfsOut, WriteOut, fopen, init_flags, opcode};
use super::fuse_proto::{self, DirEntry, InitSettings, Request, Ttl};
use super::fuse_reply::Reply;
use super::fuse_session::Handler;
use super::{BLOCK_SIZE, BlockDevice};

/// The name of the volume's file in the mount.
pub const FILE_NAME: &str = "volume";

pub(crate) const FILE_INO: u64 = 2;

/// Largest read or write the kernel sends in one request. 1 MiB is the
/// kernel's default cap (`fs.fuse.max_pages_limit` = 256 pages) and large
/// enough that request overhead stops mattering.
pub const MAX_REQUEST: u32 = 1 << 20;

/// Requests the kernel keeps in flight to us at once (asynchronous direct I/O
/// from the loop device counts as background). The loop device's queue
/// holds 128 requests by default; matching it lets all of them through.
const MAX_BACKGROUND: u16 = 128;

const INIT_SETTINGS: InitSettings = InitSettings {
    max_write: MAX_REQUEST,
    max_background: MAX_BACKGROUND,
    congestion_threshold: MAX_BACKGROUND / 4 * 3,
    // Without it the kernel submits a loop device's direct I/O to us one
    // request at a time.
    flags: init_flags::ASYNC_DIO,
};

/// The inodes' attributes change only when the volume grows, and then the
/// frontend tells the kernel to drop them, so it may cache them for long.
const TTL: Ttl = Ttl {
    secs: 3600,
    nanos: 0,
};

const DT_DIR: u32 = 4;
const DT_REG: u32 = 8;

pub(crate) struct VolumeFs<D> {
    io: Arc<AlignedIo<D>>,
    runtime: Handle,
    span: Span,
}

impl<D: BlockDevice> VolumeFs<D> {
    pub(crate) fn new(device: Arc<D>, runtime: Handle, span: Span) -> Self {
        let io = Arc::new(AlignedIo::new(device));
        VolumeFs { io, runtime, span }
    }

    fn attr_of(&self, ino: u64) -> Option<Attr> {
        match ino {
            ROOT_ID => Some(attr(ROOT_ID, libc::S_IFDIR | 0o755, 0)),
            // Sized as the device is now.
            FILE_INO => Some(attr(FILE_INO, libc::S_IFREG | 0o600, self.io.size())),
            _ => None,
        }
    }

    /// Runs `request` on the runtime, inside this volume's span.
    fn spawn(&self, request: impl Future<Output = ()> + Send + 'static) {
        drop(self.runtime.spawn(request.instrument(self.span.clone())));
    }
}

fn attr(ino: u64, mode: u32, size: u64) -> Attr {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let (secs, nanos) = (now.as_secs(), now.subsec_nanos());
    Attr {
        ino,
        size,
        blocks: size / 512,
        atime: secs,
        mtime: secs,
        ctime: secs,
        atimensec: nanos,
        mtimensec: nanos,
        ctimensec: nanos,
        mode,
        nlink: if mode & libc::S_IFMT == libc::S_IFDIR {
            2
        } else {
            1
        },
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        rdev: 0,
        blksize: BLOCK_SIZE as u32,
        flags: 0,
    }
}

/// The errno the caller sees for a failed request: the device's own when it
/// has one (ENOSPC, EFBIG), EIO otherwise.
fn errno(op: &'static str, err: &io::Error) -> i32 {
    debug!(op, %err, "request failed");
    err.raw_os_error().unwrap_or(libc::EIO)
}

/// What an `fallocate(2)` mode asks of a fixed-size, thinly provisioned file.
#[derive(Debug, PartialEq, Eq)]
enum Allocate {
    /// Make the range read as zeros (punch hole, zero range).
    Discard,
    /// Reserve space: blocks are allocated on write anyway, so nothing to do.
    Nothing,
    /// The file would have to grow.
    TooBig,
    Unsupported,
}

fn allocate_action(mode: i32, end: u64, size: u64) -> Allocate {
    let known = libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
    let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
    if mode & !known != 0 {
        Allocate::Unsupported
    } else if end > size && !keep_size {
        Allocate::TooBig
    } else if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
        Allocate::Discard
    } else {
        Allocate::Nothing
    }
}

impl<D: BlockDevice> Handler for VolumeFs<D> {
    fn init_settings(&self) -> InitSettings {
        INIT_SETTINGS
    }

    fn handle(&self, header: &InHeader, request: Request<'_>, reply: Reply) {
        let ino = header.nodeid;
        match request {
            Request::Lookup { name } => self.lookup(ino, name, reply),
            Request::Getattr { .. } => match self.attr_of(ino) {
                Some(attr) => reply.value(&fuse_proto::attr_out(attr, TTL)),
                None => reply.error(libc::ENOENT),
            },
            Request::Setattr {
                mode,
                uid,
                gid,
                size,
            } => self.setattr(
                ino,
                size,
                mode.is_some() || uid.is_some() || gid.is_some(),
                reply,
            ),
            Request::Open { .. } => self.open(ino, reply),
            Request::Read { offset, size, .. } => self.read(offset, size, reply),
            Request::Write { offset, data, .. } => self.write(offset, data, reply),
            // FLUSH comes on every close(2) of the file: makes its writes
            // durable, so that closing after writing is enough, as on a disk.
            Request::Flush { .. } => self.flush("flush", reply),
            Request::Fsync { .. } => self.flush("fsync", reply),
            Request::Readdir { offset, size, .. } => self.readdir(ino, offset, size, reply),
            Request::Statfs => self.statfs(reply),
            Request::Fallocate {
                offset,
                length,
                mode,
                ..
            } => self.fallocate(offset, length, mode as i32, reply),
            Request::Opendir => reply.value(&fuse_proto::open_out(0, 0)),
            Request::Release { .. } | Request::Releasedir { .. } => reply.ok(),
            // We keep no lookup counts.
            Request::Forget { .. } | Request::BatchForget { .. } => reply.none(),
            // The kernel then stops sending them.
            Request::Interrupt { .. } => reply.error(libc::ENOSYS),
            // fuser's answers to these, kept.
            Request::Unknown(opcode::SYMLINK | opcode::LINK) => reply.error(libc::EPERM),
            Request::Unknown(_) => reply.error(libc::ENOSYS),
            // The session answers these itself.
            Request::Init(_) | Request::Destroy => reply.error(libc::EIO),
        }
    }
}

impl<D: BlockDevice> VolumeFs<D> {
    fn lookup(&self, parent: u64, name: &[u8], reply: Reply) {
        match self.attr_of(FILE_INO) {
            Some(attr) if parent == ROOT_ID && name == FILE_NAME.as_bytes() => {
                reply.value(&fuse_proto::entry_out(attr, TTL));
            }
            _ => reply.error(libc::ENOENT),
        }
    }

    /// Only no-op changes succeed: the size is the volume's, and ownership and
    /// permissions are fixed (root only).
    fn setattr(&self, ino: u64, size: Option<u64>, owner_or_mode: bool, reply: Reply) {
        let Some(attr) = self.attr_of(ino) else {
            return reply.error(libc::ENOENT);
        };
        let changes_size = size.is_some_and(|size| size != attr.size);
        if changes_size || owner_or_mode {
            return reply.error(libc::EPERM);
        }
        reply.value(&fuse_proto::attr_out(attr, TTL));
    }

    /// Direct I/O: the kernel must not cache the volume a second time (the
    /// block device on top caches it), and every read must see the device.
    fn open(&self, ino: u64, reply: Reply) {
        if ino != FILE_INO {
            return reply.error(libc::EISDIR);
        }
        let flags = fopen::DIRECT_IO | fopen::PARALLEL_DIRECT_WRITES;
        reply.value(&fuse_proto::open_out(0, flags));
    }

    fn read(&self, offset: u64, size: u32, reply: Reply) {
        let io = self.io.clone();
        self.spawn(async move {
            match io.read(offset, size as usize).await {
                Ok(data) => reply.data(&data),
                Err(err) => reply.error(errno("read", &err)),
            }
        });
    }

    fn write(&self, offset: u64, data: &[u8], reply: Reply) {
        // The request buffer is reused for the next request: copy out.
        let data = Bytes::copy_from_slice(data);
        let io = self.io.clone();
        self.spawn(async move {
            match io.write(offset, data).await {
                // At most MAX_REQUEST bytes: fits.
                Ok(written) => reply.value(&WriteOut {
                    size: written as u32,
                    padding: 0,
                }),
                Err(err) => reply.error(errno("write", &err)),
            }
        });
    }

    fn flush(&self, op: &'static str, reply: Reply) {
        let io = self.io.clone();
        self.spawn(async move {
            match io.flush().await {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(errno(op, &err)),
            }
        });
    }

    fn readdir(&self, ino: u64, offset: u64, size: u32, reply: Reply) {
        if ino != ROOT_ID {
            return reply.error(libc::ENOTDIR);
        }
        let entries = [
            (ROOT_ID, DT_DIR, "."),
            (ROOT_ID, DT_DIR, ".."),
            (FILE_INO, DT_REG, FILE_NAME),
        ]
        .map(|(ino, kind, name)| DirEntry {
            ino,
            kind,
            name: name.as_bytes(),
        });
        reply.data(&fuse_proto::dir_entries(&entries, offset, size as usize));
    }

    /// Block size and capacity of the volume: the loop driver takes its
    /// discard granularity from the block size.
    fn statfs(&self, reply: Reply) {
        let block = BLOCK_SIZE as u32;
        reply.value(&StatfsOut {
            blocks: self.io.size() / BLOCK_SIZE,
            files: 2,
            bsize: block,
            namelen: 255,
            frsize: block,
            ..StatfsOut::default()
        });
    }

    /// Loop devices turn discards and write-zeroes into punch hole and zero
    /// range; both become an unmap.
    fn fallocate(&self, offset: u64, length: u64, mode: i32, reply: Reply) {
        let end = offset.saturating_add(length);
        match allocate_action(mode, end, self.io.size()) {
            Allocate::Nothing => reply.ok(),
            Allocate::TooBig => reply.error(libc::EFBIG),
            Allocate::Unsupported => reply.error(libc::EOPNOTSUPP),
            Allocate::Discard => {
                let io = self.io.clone();
                self.spawn(async move {
                    match io.discard(offset, length).await {
                        Ok(()) => reply.ok(),
                        Err(err) => reply.error(errno("discard", &err)),
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use zerocopy::IntoBytes;

    use super::*;
    use crate::frontend::fuse_proto::{Frame, InitAnswer};

    /// The INIT a 6.18 kernel sent at mount (protocol 7.45, 104 bytes) and
    /// fuser 0.18's reply to it with our settings (80 bytes), as strace
    /// showed them on /dev/fuse (x86_64); all bytes after these are zero.
    const KERNEL_INIT: &[u8] = &[
        0x68, 0, 0, 0, 0x1a, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0x2d, 0, 0, 0, 0, 0, 2, 0, 0xfb, 0xff,
        0xff, 0x73, 0xfd, 0x05, 0, 0,
    ];
    const FUSER_REPLY: &[u8] = &[
        0x50, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0x28, 0, 0, 0, 0, 0, 2, 0,
        0x21, 0x80, 0x40, 0x40, 0x80, 0, 0x60, 0, 0, 0, 0x10, 0, 1, 0, 0, 0, 0, 1,
    ];

    fn padded(bytes: &[u8], len: usize) -> Vec<u8> {
        let mut padded = bytes.to_vec();
        padded.resize(len, 0);
        padded
    }

    #[test]
    fn init_is_answered_as_fuser_answered_it() {
        let kernel_init = padded(KERNEL_INIT, 104);
        let frame = Frame::split_dev(&kernel_init).unwrap();
        let Ok(Request::Init(init)) = fuse_proto::parse(&frame) else {
            panic!("not an INIT");
        };
        let InitAnswer::Accepted { reply, missing } =
            fuse_proto::negotiate(&init, &INIT_SETTINGS, 4096)
        else {
            panic!("INIT refused");
        };
        assert_eq!(missing, 0);
        let header = fuse_proto::out_header(frame.header.unique, 0, reply.bytes().len());
        let ours = [header.as_bytes(), reply.bytes()].concat();
        assert_eq!(ours, padded(FUSER_REPLY, 80));
    }

    #[test]
    fn fallocate_modes_map_to_what_a_fixed_size_thin_file_can_do() {
        let (keep, punch, zero) = (
            libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_PUNCH_HOLE,
            libc::FALLOC_FL_ZERO_RANGE,
        );
        let size = 8192;
        assert_eq!(allocate_action(keep | punch, 4096, size), Allocate::Discard);
        assert_eq!(
            allocate_action(keep | punch, 1 << 20, size),
            Allocate::Discard
        );
        assert_eq!(allocate_action(zero, 4096, size), Allocate::Discard);
        assert_eq!(allocate_action(zero, 1 << 20, size), Allocate::TooBig);
        assert_eq!(allocate_action(0, 4096, size), Allocate::Nothing);
        assert_eq!(allocate_action(0, 1 << 20, size), Allocate::TooBig);
        assert_eq!(allocate_action(keep, 1 << 20, size), Allocate::Nothing);
        let collapse = 0x08;
        assert_eq!(allocate_action(collapse, 4096, size), Allocate::Unsupported);
    }
}
