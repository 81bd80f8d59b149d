//! The FUSE filesystem of one volume: a root directory holding one regular
//! file, [`FILE_NAME`], whose contents are the volume.
//!
//! fuser calls these methods on its session threads, one request at a time
//! per thread. Every data request is therefore handed to the tokio runtime
//! and answered from there, so that a slow replica never holds up the
//! requests behind it; metadata is answered on the spot.

use std::ffi::OsStr;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};
use nix::libc;
use tokio::runtime::Handle;
use tracing::{Instrument, Span, debug, warn};

use super::aligned::AlignedIo;
use super::{BLOCK_SIZE, BlockDevice};

/// The name of the volume's file in the mount.
pub const FILE_NAME: &str = "volume";

pub(crate) const FILE_INO: INodeNo = INodeNo(2);

/// Largest read or write the kernel sends in one request. 1 MiB is the
/// kernel's default cap (`fs.fuse.max_pages_limit` = 256 pages) and large
/// enough that request overhead stops mattering.
pub const MAX_REQUEST: u32 = 1 << 20;

/// Requests the kernel keeps in flight to us at once (asynchronous direct I/O
/// from the loop device counts as background). The loop device's queue
/// holds 128 requests by default; matching it lets all of them through.
const MAX_BACKGROUND: u16 = 128;

/// The inodes' attributes change only when the volume grows, and then the
/// frontend tells the kernel to drop them, so it may cache them for long.
const TTL: Duration = Duration::from_secs(3600);

pub(crate) struct VolumeFs<D> {
    io: Arc<AlignedIo<D>>,
    runtime: Handle,
    span: Span,
    root: FileAttr,
}

impl<D: BlockDevice> VolumeFs<D> {
    pub(crate) fn new(device: Arc<D>, runtime: Handle, span: Span) -> Self {
        let io = Arc::new(AlignedIo::new(device));
        let root = attr(INodeNo::ROOT, FileType::Directory, 0o755, 0);
        VolumeFs {
            io,
            runtime,
            span,
            root,
        }
    }

    /// The volume file's attributes, sized as the device is now.
    fn file_attr(&self) -> FileAttr {
        attr(FILE_INO, FileType::RegularFile, 0o600, self.io.size())
    }

    fn attr_of(&self, ino: INodeNo) -> Option<FileAttr> {
        match ino {
            INodeNo::ROOT => Some(self.root),
            FILE_INO => Some(self.file_attr()),
            _ => None,
        }
    }

    /// Runs `request` on the runtime, inside this volume's span.
    fn spawn(&self, request: impl Future<Output = ()> + Send + 'static) {
        drop(self.runtime.spawn(request.instrument(self.span.clone())));
    }
}

fn attr(ino: INodeNo, kind: FileType, perm: u16, size: u64) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino,
        size,
        blocks: size / 512,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        rdev: 0,
        blksize: BLOCK_SIZE as u32,
        flags: 0,
    }
}

/// The errno the caller sees for a failed request: the device's own when it
/// has one (ENOSPC, EFBIG), EIO otherwise.
fn errno(op: &'static str, err: &io::Error) -> Errno {
    debug!(op, %err, "request failed");
    Errno::from_i32(err.raw_os_error().unwrap_or(libc::EIO))
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

impl<D: BlockDevice> Filesystem for VolumeFs<D> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(max) = config.set_max_write(MAX_REQUEST) {
            warn!(max, "kernel caps FUSE writes lower than wanted");
            let _ = config.set_max_write(max);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND / 4 * 3);
        // Without it the kernel submits a loop device's direct I/O to us one
        // request at a time.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO) {
            warn!(?missing, "kernel lacks asynchronous direct I/O for FUSE");
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == FILE_NAME {
            reply.entry(&TTL, &self.file_attr(), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Only no-op changes succeed: the size is the volume's, and ownership and
    /// permissions are fixed (root only).
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(attr) = self.attr_of(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let changes_size = size.is_some_and(|size| size != attr.size);
        if changes_size || mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &attr);
    }

    /// Direct I/O: the kernel must not cache the volume a second time (the
    /// block device on top caches it), and every read must see the device.
    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        let flags = FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        reply.opened(FileHandle(0), flags);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let io = self.io.clone();
        self.spawn(async move {
            match io.read(offset, size as usize).await {
                Ok(data) => reply.data(&data),
                Err(err) => reply.error(errno("read", &err)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The request buffer is reused for the next request: copy out.
        let data = Bytes::copy_from_slice(data);
        let io = self.io.clone();
        self.spawn(async move {
            match io.write(offset, data).await {
                // At most MAX_REQUEST bytes: fits.
                Ok(written) => reply.written(written as u32),
                Err(err) => reply.error(errno("write", &err)),
            }
        });
    }

    /// Called on every close(2) of the file: makes its writes durable, so that
    /// closing after writing is enough, as on a disk.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.fsync_reply("flush", reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_reply("fsync", reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, FILE_NAME),
        ];
        // An entry's offset is the one to resume after it.
        for (next, (ino, kind, name)) in (1..).zip(entries).skip(offset as usize) {
            if reply.add(ino, next, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// Block size and capacity of the volume: the loop driver takes its
    /// discard granularity from the block size.
    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.io.size() / BLOCK_SIZE;
        let block = BLOCK_SIZE as u32;
        reply.statfs(blocks, 0, 0, 2, 0, block, 255, block);
    }

    /// Loop devices turn discards and write-zeroes into punch hole and zero
    /// range; both become an unmap.
    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let end = offset.saturating_add(length);
        match allocate_action(mode, end, self.io.size()) {
            Allocate::Nothing => reply.ok(),
            Allocate::TooBig => reply.error(Errno::EFBIG),
            Allocate::Unsupported => reply.error(Errno::EOPNOTSUPP),
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

impl<D: BlockDevice> VolumeFs<D> {
    fn fsync_reply(&self, op: &'static str, reply: ReplyEmpty) {
        let io = self.io.clone();
        self.spawn(async move {
            match io.flush().await {
                Ok(()) => reply.ok(),
                Err(err) => reply.error(errno(op, &err)),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
