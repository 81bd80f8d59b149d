//! The kernel's FUSE wire structures (`include/uapi/linux/fuse.h`), only
//! those the volume's filesystem uses. All fields are in the host's byte
//! order, as the kernel writes them; every structure is `repr(C)` with its
//! padding spelled out, so [`zerocopy`] reads one from any byte slice of the
//! right length (a copy, no alignment needed) and writes one as its bytes.
//! Sizes are checked at compile time against the kernel's.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol version we speak: 7.40, as fuser 0.18 announced.
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 40;

/// The root directory's node id.
pub const ROOT_ID: u64 = 1;

/// Opcodes (`enum fuse_opcode`).
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const SYMLINK: u32 = 6;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
}

/// `FUSE_INIT` flags, bits 32..63 travelling in `flags2`.
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const MAX_PAGES: u64 = 1 << 22;
    /// `flags2` is valid (in both directions).
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is set.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_fsync_in.fsync_flags`: only the data.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `enum fuse_notify_code`.
pub const NOTIFY_INVAL_INODE: i32 = 2;
/// The smallest read buffer the kernel accepts.
pub const MIN_READ_BUFFER: usize = 8192;
/// `fuse_init_out` as kernels before 7.5 and before 7.23 take it.
pub const COMPAT_INIT_OUT_SIZE: usize = 8;
pub const COMPAT_22_INIT_OUT_SIZE: usize = 24;
/// `fuse_init_in` before 7.36 (no `flags2`).
pub const COMPAT_INIT_IN_SIZE: usize = 16;

/// Derives for every wire structure.
macro_rules! wire {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident: $ty:ty),* $(,)? } = $size:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
        #[repr(C)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty),*
        }
        const _: () = assert!(size_of::<$name>() == $size);
    };
}

wire!(
    /// `fuse_in_header`: starts every request.
    InHeader {
        /// The whole request, this header included.
        len: u32,
        opcode: u32,
        unique: u64,
        nodeid: u64,
        uid: u32,
        gid: u32,
        pid: u32,
        /// Extensions at the end of the request, in units of 8 bytes.
        total_extlen: u16,
        padding: u16,
    } = 40
);

wire!(
    /// `fuse_out_header`: starts every reply and notification.
    OutHeader { len: u32, error: i32, unique: u64 } = 16
);

wire!(
    /// `fuse_init_in`.
    InitIn {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u32,
        flags2: u32,
        unused: [u32; 11],
    } = 64
);

wire!(
    /// `fuse_init_out`.
    InitOut {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u32,
        max_background: u16,
        congestion_threshold: u16,
        max_write: u32,
        time_gran: u32,
        max_pages: u16,
        map_alignment: u16,
        flags2: u32,
        max_stack_depth: u32,
        request_timeout: u16,
        unused: [u16; 11],
    } = 64
);

wire!(
    /// `fuse_attr`.
    Attr {
        ino: u64,
        size: u64,
        blocks: u64,
        atime: u64,
        mtime: u64,
        ctime: u64,
        atimensec: u32,
        mtimensec: u32,
        ctimensec: u32,
        mode: u32,
        nlink: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        blksize: u32,
        flags: u32,
    } = 88
);

wire!(
    /// `fuse_entry_out`: the reply to LOOKUP.
    EntryOut {
        nodeid: u64,
        generation: u64,
        entry_valid: u64,
        attr_valid: u64,
        entry_valid_nsec: u32,
        attr_valid_nsec: u32,
        attr: Attr,
    } = 128
);

wire!(
    /// `fuse_attr_out`: the reply to GETATTR and SETATTR.
    AttrOut {
        attr_valid: u64,
        attr_valid_nsec: u32,
        dummy: u32,
        attr: Attr,
    } = 104
);

wire!(
    /// `fuse_getattr_in`.
    GetattrIn { getattr_flags: u32, dummy: u32, fh: u64 } = 16
);

wire!(
    /// `fuse_setattr_in`; `valid` says which fields are set.
    SetattrIn {
        valid: u32,
        padding: u32,
        fh: u64,
        size: u64,
        lock_owner: u64,
        atime: u64,
        mtime: u64,
        ctime: u64,
        atimensec: u32,
        mtimensec: u32,
        ctimensec: u32,
        mode: u32,
        unused4: u32,
        uid: u32,
        gid: u32,
        unused5: u32,
    } = 88
);

wire!(
    /// `fuse_open_in`, also OPENDIR's.
    OpenIn { flags: u32, open_flags: u32 } = 8
);

wire!(
    /// `fuse_open_out`, also OPENDIR's.
    OpenOut { fh: u64, open_flags: u32, backing_id: u32 } = 16
);

wire!(
    /// `fuse_release_in`, also RELEASEDIR's.
    ReleaseIn { fh: u64, flags: u32, release_flags: u32, lock_owner: u64 } = 24
);

wire!(
    /// `fuse_flush_in`.
    FlushIn { fh: u64, unused: u32, padding: u32, lock_owner: u64 } = 24
);

wire!(
    /// `fuse_read_in`, also READDIR's.
    ReadIn {
        fh: u64,
        offset: u64,
        size: u32,
        read_flags: u32,
        lock_owner: u64,
        flags: u32,
        padding: u32,
    } = 40
);

wire!(
    /// `fuse_write_in`; the data follows it.
    WriteIn {
        fh: u64,
        offset: u64,
        size: u32,
        write_flags: u32,
        lock_owner: u64,
        flags: u32,
        padding: u32,
    } = 40
);

wire!(
    /// `fuse_write_out`.
    WriteOut { size: u32, padding: u32 } = 8
);

wire!(
    /// `fuse_fsync_in`.
    FsyncIn { fh: u64, fsync_flags: u32, padding: u32 } = 16
);

wire!(
    /// `fuse_fallocate_in`.
    FallocateIn { fh: u64, offset: u64, length: u64, mode: u32, padding: u32 } = 32
);

wire!(
    /// `fuse_kstatfs`, the whole of `fuse_statfs_out`.
    StatfsOut {
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
        padding: u32,
        spare: [u32; 6],
    } = 80
);

wire!(
    /// `fuse_dirent` without its name, which follows it, padded to 8 bytes.
    Dirent { ino: u64, off: u64, namelen: u32, kind: u32 } = 24
);

wire!(
    /// `fuse_forget_in`.
    ForgetIn { nlookup: u64 } = 8
);

wire!(
    /// `fuse_batch_forget_in`; `count` [`ForgetOne`]s follow it.
    BatchForgetIn { count: u32, dummy: u32 } = 8
);

wire!(
    /// `fuse_forget_one`.
    ForgetOne { nodeid: u64, nlookup: u64 } = 16
);

wire!(
    /// `fuse_interrupt_in`.
    InterruptIn { unique: u64 } = 8
);

wire!(
    /// `fuse_notify_inval_inode_out`: drop an inode's cached attributes, and
    /// its cached data from `off` (negative: none of it) for `len` bytes (0 or
    /// less: to the end).
    NotifyInvalInodeOut { ino: u64, off: i64, len: i64 } = 24
);

/// FUSE over io_uring (protocol 7.42): what the kernel and the daemon
/// exchange in a ring entry's buffers and commands.
pub mod uring {
    use super::{FromBytes, Immutable, IntoBytes, KnownLayout};

    /// `FUSE_IO_URING_CMD_REGISTER`: hands the kernel an entry's buffers.
    pub const CMD_REGISTER: u32 = 1;
    /// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: answers the entry's request and
    /// makes the entry available for the next one.
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;
    /// `fuse_uring_req_header`'s parts: the in (or out) header, the opcode's
    /// fixed argument, then [`EntInOut`].
    pub const IN_OUT: usize = 0;
    pub const OP_IN: usize = 128;
    pub const OP_IN_SIZE: usize = 128;
    pub const ENT_IN_OUT: usize = 256;
    pub const REQ_HEADER_SIZE: usize = 288;

    wire!(
        /// `fuse_uring_ent_in_out`: the request's id and the length of what
        /// is in the payload buffer, in either direction.
        EntInOut {
            flags: u64,
            commit_id: u64,
            payload_sz: u32,
            padding: u32,
            reserved: u64,
        } = 32
    );

    wire!(
        /// `fuse_uring_cmd_req`: a command's argument, in the SQE's command
        /// area.
        CmdReq {
            flags: u64,
            commit_id: u64,
            qid: u16,
            padding: [u8; 6],
        } = 24
    );

    const _: () = assert!(ENT_IN_OUT + size_of::<EntInOut>() == REQ_HEADER_SIZE);
}
