//! The FUSE protocol without any I/O: a request [`Frame`] parsed into a
//! [`Request`], the INIT negotiation, and the bytes of replies and
//! notifications. The transports (`/dev/fuse`, io_uring) only move
//! these bytes, so the parser sees the same frame from both: a header, the
//! opcode's fixed argument (`op_in`) and what follows it (`payload`: a name,
//! a write's data).
//!
//! Nothing here trusts the kernel's bytes: a frame that is short, says
//! another length than it has, or carries inconsistent sizes is a
//! [`ParseError`], which the transport answers with [`ParseError::errno`].

use nix::libc;
use zerocopy::{FromBytes, IntoBytes};

use super::fuse_abi::{
    Attr, AttrOut, BatchForgetIn, COMPAT_22_INIT_OUT_SIZE, COMPAT_INIT_IN_SIZE,
    COMPAT_INIT_OUT_SIZE, Dirent, EntryOut, FallocateIn, FlushIn, ForgetIn, ForgetOne, FsyncIn,
    GETATTR_FH, GetattrIn, InHeader, InitIn, InitOut, InterruptIn, KERNEL_MINOR_VERSION,
    KERNEL_VERSION, NOTIFY_INVAL_INODE, NotifyInvalInodeOut, OpenIn, OpenOut, OutHeader, ReadIn,
    ReleaseIn, SetattrIn, WriteIn, fattr, init_flags, opcode, uring,
};
use uring::EntInOut;

/// Why a frame is not a request we can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("request of {len} bytes is shorter than its header")]
    NoHeader { len: usize },
    #[error("request header says {declared} bytes, {actual} arrived")]
    Length { declared: u32, actual: usize },
    #[error("opcode {opcode}: {what} needs {need} bytes, {have} arrived")]
    Truncated {
        opcode: u32,
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("opcode {opcode}: {what}")]
    Invalid { opcode: u32, what: &'static str },
}

impl ParseError {
    /// What the request gets back: EIO when the frame itself is broken,
    /// EINVAL when its arguments are.
    pub fn errno(&self) -> i32 {
        match self {
            ParseError::NoHeader { .. } | ParseError::Length { .. } => libc::EIO,
            ParseError::Truncated { .. } | ParseError::Invalid { .. } => libc::EINVAL,
        }
    }
}

/// One request as the kernel laid it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub header: InHeader,
    /// The opcode's fixed argument structure (all of the body for opcodes
    /// this parser does not know).
    pub op_in: &'a [u8],
    /// What follows it: a name, a write's data, forget entries.
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Splits a request read from `/dev/fuse`: one buffer holding the header,
    /// the argument, the payload and any extensions, in that order.
    pub fn split_dev(buf: &'a [u8]) -> Result<Self, ParseError> {
        let (header, body) =
            InHeader::read_from_prefix(buf).map_err(|_| ParseError::NoHeader { len: buf.len() })?;
        if header.len as usize != buf.len() {
            return Err(ParseError::Length {
                declared: header.len,
                actual: buf.len(),
            });
        }
        let extensions = usize::from(header.total_extlen) * 8;
        let Some(body) = body.len().checked_sub(extensions).map(|len| &body[..len]) else {
            return Err(ParseError::Truncated {
                opcode: header.opcode,
                what: "extensions",
                need: extensions,
                have: body.len(),
            });
        };
        let at = op_in_size(header.opcode).map_or(body.len(), |size| size.min(body.len()));
        let (op_in, payload) = body.split_at(at);
        Ok(Frame {
            header,
            op_in,
            payload,
        })
    }

    /// Splits a request delivered through an io_uring entry: `headers` is
    /// the entry's `fuse_uring_req_header` (the in header, the opcode's
    /// argument, then the payload's length), `payload` its payload buffer,
    /// which holds what follows the argument and then any extensions.
    pub fn split_uring(headers: &'a [u8], payload: &'a [u8]) -> Result<Self, ParseError> {
        let area = |at: usize, len: usize| {
            headers
                .get(at..at + len)
                .ok_or(ParseError::NoHeader { len: headers.len() })
        };
        let (header, _) = InHeader::read_from_prefix(area(uring::IN_OUT, size_of::<InHeader>())?)
            .map_err(|_| ParseError::NoHeader { len: headers.len() })?;
        let (ent, _) = EntInOut::read_from_prefix(area(uring::ENT_IN_OUT, size_of::<EntInOut>())?)
            .map_err(|_| ParseError::NoHeader { len: headers.len() })?;
        let truncated = |what, need: usize, have: usize| ParseError::Truncated {
            opcode: header.opcode,
            what,
            need,
            have,
        };
        let filled = ent.payload_sz as usize;
        let payload = payload
            .get(..filled)
            .ok_or(truncated("payload", filled, payload.len()))?;
        // The kernel copies the argument into its own area and everything
        // else into the payload, so the argument's length is what the header
        // counts beyond those two.
        let op_in_len = (header.len as usize)
            .checked_sub(size_of::<InHeader>() + filled)
            .filter(|&len| len <= uring::OP_IN_SIZE)
            .ok_or(ParseError::Length {
                declared: header.len,
                actual: size_of::<InHeader>() + filled,
            })?;
        let extensions = usize::from(header.total_extlen) * 8;
        let payload = filled
            .checked_sub(extensions)
            .map(|len| &payload[..len])
            .ok_or(truncated("extensions", extensions, filled))?;
        Ok(Frame {
            header,
            op_in: area(uring::OP_IN, op_in_len)?,
            payload,
        })
    }
}

/// The size of an opcode's fixed argument; `None`: the whole body.
fn op_in_size(op: u32) -> Option<usize> {
    let size = match op {
        opcode::LOOKUP | opcode::STATFS | opcode::DESTROY => 0,
        opcode::FORGET => size_of::<ForgetIn>(),
        opcode::BATCH_FORGET => size_of::<BatchForgetIn>(),
        opcode::GETATTR => size_of::<GetattrIn>(),
        opcode::SETATTR => size_of::<SetattrIn>(),
        opcode::OPEN | opcode::OPENDIR => size_of::<OpenIn>(),
        opcode::READ | opcode::READDIR => size_of::<ReadIn>(),
        opcode::WRITE => size_of::<WriteIn>(),
        opcode::RELEASE | opcode::RELEASEDIR => size_of::<ReleaseIn>(),
        opcode::FLUSH => size_of::<FlushIn>(),
        opcode::FSYNC => size_of::<FsyncIn>(),
        opcode::FALLOCATE => size_of::<FallocateIn>(),
        opcode::INTERRUPT => size_of::<InterruptIn>(),
        _ => return None,
    };
    Some(size)
}

/// Whether the kernel waits for an answer to this opcode.
pub fn expects_reply(op: u32) -> bool {
    !matches!(op, opcode::FORGET | opcode::BATCH_FORGET)
}

/// A request, its node id being the header's `nodeid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Init(InitIn),
    Lookup {
        /// Without its terminating NUL; never empty.
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    /// That many nodes forgotten (we keep no lookup counts).
    BatchForget {
        count: u32,
    },
    Getattr {
        fh: Option<u64>,
    },
    /// The changes asked for; times and the rest are not kept.
    Setattr {
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
    },
    Open {
        flags: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
    },
    Flush {
        fh: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Release {
        fh: u64,
    },
    Opendir,
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
    },
    Statfs,
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: u32,
    },
    Interrupt {
        unique: u64,
    },
    Destroy,
    /// An opcode we do not implement.
    Unknown(u32),
}

/// Parses a frame into a request.
pub fn parse<'a>(frame: &Frame<'a>) -> Result<Request<'a>, ParseError> {
    let op = frame.header.opcode;
    let request = match op {
        opcode::INIT => Request::Init(init_in(frame.op_in)?),
        opcode::LOOKUP => Request::Lookup {
            name: name(op, frame.payload)?,
        },
        opcode::FORGET => Request::Forget {
            nlookup: arg::<ForgetIn>(frame, "forget")?.nlookup,
        },
        opcode::BATCH_FORGET => batch_forget(frame)?,
        opcode::GETATTR => {
            let arg = arg::<GetattrIn>(frame, "getattr")?;
            let fh = (arg.getattr_flags & GETATTR_FH != 0).then_some(arg.fh);
            Request::Getattr { fh }
        }
        opcode::SETATTR => setattr(arg::<SetattrIn>(frame, "setattr")?),
        opcode::OPEN => Request::Open {
            flags: arg::<OpenIn>(frame, "open")?.flags,
        },
        opcode::OPENDIR => {
            arg::<OpenIn>(frame, "opendir")?;
            Request::Opendir
        }
        opcode::READ => {
            let arg = arg::<ReadIn>(frame, "read")?;
            Request::Read {
                fh: arg.fh,
                offset: arg.offset,
                size: arg.size,
            }
        }
        opcode::READDIR => {
            let arg = arg::<ReadIn>(frame, "readdir")?;
            Request::Readdir {
                fh: arg.fh,
                offset: arg.offset,
                size: arg.size,
            }
        }
        opcode::WRITE => write(frame)?,
        opcode::FLUSH => Request::Flush {
            fh: arg::<FlushIn>(frame, "flush")?.fh,
        },
        opcode::FSYNC => {
            let arg = arg::<FsyncIn>(frame, "fsync")?;
            Request::Fsync {
                fh: arg.fh,
                datasync: arg.fsync_flags & super::fuse_abi::FSYNC_FDATASYNC != 0,
            }
        }
        opcode::RELEASE => Request::Release {
            fh: arg::<ReleaseIn>(frame, "release")?.fh,
        },
        opcode::RELEASEDIR => Request::Releasedir {
            fh: arg::<ReleaseIn>(frame, "releasedir")?.fh,
        },
        opcode::STATFS => Request::Statfs,
        opcode::FALLOCATE => {
            let arg = arg::<FallocateIn>(frame, "fallocate")?;
            Request::Fallocate {
                fh: arg.fh,
                offset: arg.offset,
                length: arg.length,
                mode: arg.mode,
            }
        }
        opcode::INTERRUPT => Request::Interrupt {
            unique: arg::<InterruptIn>(frame, "interrupt")?.unique,
        },
        opcode::DESTROY => Request::Destroy,
        other => Request::Unknown(other),
    };
    Ok(request)
}

/// The opcode's fixed argument, copied out of `op_in` (which may be longer
/// if a newer kernel grew the structure).
fn arg<T: FromBytes>(frame: &Frame<'_>, what: &'static str) -> Result<T, ParseError> {
    T::read_from_prefix(frame.op_in)
        .map(|(arg, _)| arg)
        .map_err(|_| ParseError::Truncated {
            opcode: frame.header.opcode,
            what,
            need: size_of::<T>(),
            have: frame.op_in.len(),
        })
}

/// INIT's argument: kernels before 7.36 send only its first 16 bytes; the
/// rest (`flags2`) then reads as zero.
fn init_in(op_in: &[u8]) -> Result<InitIn, ParseError> {
    if op_in.len() < COMPAT_INIT_IN_SIZE {
        return Err(ParseError::Truncated {
            opcode: opcode::INIT,
            what: "init",
            need: COMPAT_INIT_IN_SIZE,
            have: op_in.len(),
        });
    }
    let mut init = InitIn::default();
    let len = op_in.len().min(size_of::<InitIn>());
    init.as_mut_bytes()[..len].copy_from_slice(&op_in[..len]);
    Ok(init)
}

/// A NUL-terminated name.
fn name(op: u32, payload: &[u8]) -> Result<&[u8], ParseError> {
    match payload.iter().position(|&b| b == 0) {
        Some(0) => Err(ParseError::Invalid {
            opcode: op,
            what: "empty name",
        }),
        Some(end) => Ok(&payload[..end]),
        None => Err(ParseError::Invalid {
            opcode: op,
            what: "name without its terminating NUL",
        }),
    }
}

fn batch_forget<'a>(frame: &Frame<'a>) -> Result<Request<'a>, ParseError> {
    let count = arg::<BatchForgetIn>(frame, "batch_forget")?.count;
    let need = (count as usize).saturating_mul(size_of::<ForgetOne>());
    if frame.payload.len() < need {
        return Err(ParseError::Truncated {
            opcode: opcode::BATCH_FORGET,
            what: "forget entries",
            need,
            have: frame.payload.len(),
        });
    }
    Ok(Request::BatchForget { count })
}

fn setattr<'a>(arg: SetattrIn) -> Request<'a> {
    let set = |bit: u32| arg.valid & bit != 0;
    Request::Setattr {
        mode: set(fattr::MODE).then_some(arg.mode),
        uid: set(fattr::UID).then_some(arg.uid),
        gid: set(fattr::GID).then_some(arg.gid),
        size: set(fattr::SIZE).then_some(arg.size),
    }
}

/// A write whose data is exactly the size its argument declares.
fn write<'a>(frame: &Frame<'a>) -> Result<Request<'a>, ParseError> {
    let arg = arg::<WriteIn>(frame, "write")?;
    if arg.size as usize != frame.payload.len() {
        return Err(ParseError::Invalid {
            opcode: opcode::WRITE,
            what: "data of another size than declared",
        });
    }
    Ok(Request::Write {
        fh: arg.fh,
        offset: arg.offset,
        data: frame.payload,
    })
}

/// What we ask of the kernel at INIT beyond what fuser asked by default
/// (asynchronous reads, big writes, large requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitSettings {
    pub max_write: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    /// `init_flags` bits wanted if the kernel has them.
    pub flags: u64,
}

/// How to answer an INIT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitAnswer {
    /// The kernel speaks a newer major version: tell it ours, it then sends
    /// another INIT.
    OurVersion(InitReply),
    /// Too old a kernel: answer EPROTO and give up.
    Unsupported { major: u32, minor: u32 },
    Accepted {
        reply: InitReply,
        /// Flags of [`InitSettings::flags`] the kernel lacks.
        missing: u64,
    },
}

/// An INIT reply, as long as the kernel's minor version takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitReply {
    pub out: InitOut,
    len: usize,
}

impl InitReply {
    pub fn bytes(&self) -> &[u8] {
        &self.out.as_bytes()[..self.len]
    }

    /// Accepts `flags` too (the caller knows the kernel offered them).
    pub fn add_flags(&mut self, flags: u64) {
        self.out.flags |= flags as u32;
        self.out.flags2 |= (flags >> 32) as u32;
    }

    /// The flags the connection has, `flags2` included.
    pub fn flags(&self) -> u64 {
        u64::from(self.out.flags) | u64::from(self.out.flags2) << 32
    }
}

/// Answers the kernel's INIT as fuser 0.18 did for our settings: its default
/// flags plus ours, each only if the kernel offers it; the kernel's
/// readahead; nanosecond timestamps; requests of up to
/// max(max_write, readahead) in pages of `page_size`.
pub fn negotiate(init: &InitIn, settings: &InitSettings, page_size: u32) -> InitAnswer {
    let ours = |out: InitOut, len| InitReply { out, len };
    let version_only = InitOut {
        major: KERNEL_VERSION,
        minor: KERNEL_MINOR_VERSION,
        ..InitOut::default()
    };
    if init.major > KERNEL_VERSION {
        return InitAnswer::OurVersion(ours(version_only, size_of::<InitOut>()));
    }
    if init.major < KERNEL_VERSION || init.minor < 6 {
        return InitAnswer::Unsupported {
            major: init.major,
            minor: init.minor,
        };
    }
    let offered = offered_flags(init);
    let mut wanted = init_flags::ASYNC_READ | init_flags::BIG_WRITES | settings.flags;
    if offered & init_flags::MAX_PAGES != 0 {
        wanted |= init_flags::MAX_PAGES;
    }
    let flags = (wanted | init_flags::INIT_EXT) & offered;
    let largest = settings.max_write.max(init.max_readahead).max(1);
    let pages = (largest - 1) / page_size.max(1) + 1;
    let out = InitOut {
        max_readahead: init.max_readahead,
        flags: flags as u32,
        max_background: settings.max_background,
        congestion_threshold: settings.congestion_threshold.min(settings.max_background),
        max_write: settings.max_write,
        time_gran: 1,
        max_pages: u16::try_from(pages).unwrap_or(u16::MAX),
        flags2: (flags >> 32) as u32,
        ..version_only
    };
    let len = if init.minor < 5 {
        COMPAT_INIT_OUT_SIZE
    } else if init.minor < 23 {
        COMPAT_22_INIT_OUT_SIZE
    } else {
        size_of::<InitOut>()
    };
    InitAnswer::Accepted {
        reply: ours(out, len),
        missing: settings.flags & !offered,
    }
}

/// The kernel's INIT flags, `flags2` included when it says it is valid.
pub fn offered_flags(init: &InitIn) -> u64 {
    let flags = u64::from(init.flags);
    if flags & init_flags::INIT_EXT != 0 {
        flags | u64::from(init.flags2) << 32
    } else {
        flags
    }
}

/// The header of a reply carrying `body_len` bytes; `errno` positive or 0.
pub fn out_header(unique: u64, errno: i32, body_len: usize) -> OutHeader {
    OutHeader {
        len: u32::try_from(size_of::<OutHeader>() + body_len).unwrap_or(u32::MAX),
        error: -errno,
        unique,
    }
}

/// How long the kernel may cache a name or attributes.
#[derive(Debug, Clone, Copy)]
pub struct Ttl {
    pub secs: u64,
    pub nanos: u32,
}

pub fn entry_out(attr: Attr, ttl: Ttl) -> EntryOut {
    EntryOut {
        nodeid: attr.ino,
        generation: 0,
        entry_valid: ttl.secs,
        attr_valid: ttl.secs,
        entry_valid_nsec: ttl.nanos,
        attr_valid_nsec: ttl.nanos,
        attr,
    }
}

pub fn attr_out(attr: Attr, ttl: Ttl) -> AttrOut {
    AttrOut {
        attr_valid: ttl.secs,
        attr_valid_nsec: ttl.nanos,
        dummy: 0,
        attr,
    }
}

pub fn open_out(fh: u64, open_flags: u32) -> OpenOut {
    OpenOut {
        fh,
        open_flags,
        backing_id: 0,
    }
}

/// One directory entry of a READDIR reply; `kind` is a `DT_*` type.
#[derive(Debug, Clone, Copy)]
pub struct DirEntry<'n> {
    pub ino: u64,
    pub kind: u32,
    pub name: &'n [u8],
}

/// The READDIR reply resuming after the first `offset` of `entries`, as many
/// whole entries as fit in `max` bytes. Each entry carries the offset to
/// resume after it.
pub fn dir_entries(entries: &[DirEntry<'_>], offset: u64, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let skip = usize::try_from(offset).unwrap_or(usize::MAX);
    for (next, entry) in (1u64..).zip(entries).skip(skip) {
        let len = size_of::<Dirent>() + entry.name.len();
        let padded = len.next_multiple_of(8);
        if out.len() + padded > max {
            break;
        }
        let dirent = Dirent {
            ino: entry.ino,
            off: next,
            namelen: entry.name.len() as u32,
            kind: entry.kind,
        };
        out.extend_from_slice(dirent.as_bytes());
        out.extend_from_slice(entry.name);
        out.resize(out.len() + padded - len, 0);
    }
    out
}

/// A NOTIFY_INVAL_INODE message: header and body.
pub fn notify_inval_inode(ino: u64, off: i64, len: i64) -> Vec<u8> {
    let body = NotifyInvalInodeOut { ino, off, len };
    // A notification has unique 0 and its code where a reply's error goes.
    let header = OutHeader {
        error: NOTIFY_INVAL_INODE,
        ..out_header(0, 0, size_of::<NotifyInvalInodeOut>())
    };
    [header.as_bytes(), body.as_bytes()].concat()
}

#[cfg(test)]
mod tests;
