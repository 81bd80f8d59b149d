//! A FUSE connection: the INIT handshake through `/dev/fuse`, then reader
//! threads, each on its own descriptor of the connection (cloned with
//! `FUSE_DEV_IOC_CLONE`), parsing every request and handing it to the
//! [`Handler`] with the [`Reply`] that answers it on that descriptor; and,
//! where the kernel offers it, the io_uring rings (`fuse_uring`), which
//! then carry every request but INIT, FORGET and INTERRUPT. The session
//! ends when the kernel ends the connection (unmount, abort).

use std::io;
use std::ops::ControlFlow;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use nix::errno::Errno;
use nix::libc;
use tracing::{Span, debug, error, info, warn};
use zerocopy::FromBytes;

use super::fuse_abi::{InHeader, InitIn, MIN_READ_BUFFER, init_flags};
use super::fuse_dev::DevFuse;
use super::fuse_proto::{self, Frame, InitAnswer, InitReply, InitSettings, ParseError, Request};
use super::fuse_reply::{Reply, Sink};
use super::fuse_uring::{Rings, Running};

/// What answers the filesystem's requests.
pub(crate) trait Handler: Send + Sync + 'static {
    /// What to ask for at INIT.
    fn init_settings(&self) -> InitSettings;
    /// Answers `request` through `reply`, now or later from another thread.
    /// INIT and DESTROY never come here.
    fn handle(&self, header: &InHeader, request: Request<'_>, reply: Reply);
}

/// How requests reach us after INIT, which always comes through
/// `/dev/fuse`. `/dev/fuse` is the default: io_uring saves the system
/// calls but, answers being made on the runtime's threads, costs a wake-up
/// of the queue's thread per answer, and measured slower with 3 replicas
/// (bench/README.md, 2026-11-29).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FuseTransport {
    /// io_uring when the kernel offers it, else `/dev/fuse` (with a log
    /// line saying why).
    Auto,
    /// Reads and writes on `/dev/fuse`: a system call each per request.
    #[default]
    DevFuse,
    /// io_uring or nothing: starting fails where the kernel lacks it.
    IoUring,
}

/// A running session. Notifications go through its first descriptor.
#[derive(Debug)]
pub(crate) struct Session {
    dev: Arc<DevFuse>,
    readers: Vec<JoinHandle<io::Result<()>>>,
    rings: Option<Running>,
}

impl Session {
    /// Answers the kernel's INIT on `fd`, then serves the connection with
    /// `threads` readers (at least one) and, if `transport` allows and the
    /// kernel agrees, the io_uring rings, inside `span`.
    pub(crate) fn start<H: Handler>(
        fd: OwnedFd,
        handler: H,
        threads: usize,
        transport: FuseTransport,
        span: Span,
    ) -> io::Result<Self> {
        let dev = Arc::new(DevFuse::new(fd));
        let (max_write, rings) = handshake(&dev, &handler.init_settings(), transport)?;
        // The kernel refuses reads into buffers that could not take its
        // largest write.
        let buffer = (max_write as usize + 4096).max(MIN_READ_BUFFER);
        let handler = Arc::new(handler);
        let rings = rings
            .map(|rings| rings.start(handler.clone(), span.clone()))
            .transpose()?;
        let mut readers = Vec::new();
        for i in 0..threads.max(1) {
            let reader = if i == 0 {
                dev.clone()
            } else {
                Arc::new(dev.clone_connection()?)
            };
            let (handler, span) = (handler.clone(), span.clone());
            let thread = thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || span.in_scope(|| serve(&reader, &*handler, buffer)))?;
            readers.push(thread);
        }
        Ok(Session {
            dev,
            readers,
            rings,
        })
    }

    /// How requests reach us: [`FuseTransport::IoUring`] or
    /// [`FuseTransport::DevFuse`].
    pub(crate) fn transport(&self) -> FuseTransport {
        match self.rings {
            Some(_) => FuseTransport::IoUring,
            None => FuseTransport::DevFuse,
        }
    }

    /// The requests that arrived through io_uring so far.
    pub(crate) fn ring_requests(&self) -> u64 {
        self.rings.as_ref().map_or(0, Running::served)
    }

    /// Drops the kernel's cached attributes and data of inode `ino`.
    pub(crate) fn inval_inode(&self, ino: u64) -> io::Result<()> {
        self.dev.notify_inval_inode(ino)
    }

    /// Waits for the readers and the rings, which end once the connection
    /// is gone.
    pub(crate) fn join(self) -> io::Result<()> {
        let readers = join_all(self.readers, "a FUSE reader thread panicked");
        let rings = self.rings.map_or(Ok(()), Running::join);
        readers.and(rings)
    }
}

/// Waits for every thread; the first error, `panicked` for a panic.
pub(crate) fn join_all(
    threads: Vec<JoinHandle<io::Result<()>>>,
    panicked: &'static str,
) -> io::Result<()> {
    let mut result = Ok(());
    for thread in threads {
        let ended = thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other(panicked)));
        if result.is_ok() {
            result = ended;
        }
    }
    result
}

fn page_size() -> u32 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|size| u32::try_from(size).ok())
        .unwrap_or(4096)
}

/// Reads INIT and answers it; returns the negotiated largest write, and the
/// rings if the answer accepted io_uring.
fn handshake(
    dev: &Arc<DevFuse>,
    settings: &InitSettings,
    transport: FuseTransport,
) -> io::Result<(u32, Option<Rings>)> {
    let mut buf = vec![0; MIN_READ_BUFFER];
    let page_size = page_size();
    loop {
        let len = match receive(dev, &mut buf)? {
            Some(len) => len,
            None => {
                let gone = "FUSE connection ended before INIT";
                return Err(io::Error::new(io::ErrorKind::NotConnected, gone));
            }
        };
        let frame = Frame::split_dev(&buf[..len]).map_err(io::Error::other)?;
        let reply = Reply::new(frame.header.unique, Sink::Dev(dev.clone()));
        let init = match fuse_proto::parse(&frame) {
            Ok(Request::Init(init)) => init,
            other => {
                reply.error(libc::EIO);
                let what = format!("expected FUSE INIT, got {other:?}");
                return Err(io::Error::new(io::ErrorKind::InvalidData, what));
            }
        };
        match fuse_proto::negotiate(&init, settings, page_size) {
            InitAnswer::OurVersion(ours) => {
                debug!(
                    major = init.major,
                    "kernel speaks a newer FUSE; offering ours"
                );
                reply.data(ours.bytes());
            }
            InitAnswer::Unsupported { major, minor } => {
                reply.error(libc::EPROTO);
                let what = format!("FUSE protocol {major}.{minor} is too old");
                return Err(io::Error::new(io::ErrorKind::Unsupported, what));
            }
            InitAnswer::Accepted {
                reply: mut ours,
                missing,
            } => {
                if missing != 0 {
                    warn!(
                        missing = format!("{missing:#x}"),
                        "kernel lacks FUSE features we ask for"
                    );
                }
                let rings = match transport {
                    FuseTransport::DevFuse => None,
                    _ => build_rings(dev, &init, &ours, page_size, transport)?,
                };
                if rings.is_some() {
                    ours.add_flags(init_flags::OVER_IO_URING);
                }
                info!(
                    kernel = format!("{}.{}", init.major, init.minor),
                    flags = format!("{:#x}", ours.flags()),
                    max_write = ours.out.max_write,
                    max_pages = ours.out.max_pages,
                    io_uring = rings.is_some(),
                    "FUSE connection initialised"
                );
                let max_write = ours.out.max_write;
                reply.data(ours.bytes());
                return Ok((max_write, rings));
            }
        }
    }
}

/// The rings for FUSE over io_uring if the kernel offers it and they can be
/// built; else an error if `transport` insists on them, or `None` and a log
/// line saying why.
fn build_rings(
    dev: &DevFuse,
    init: &InitIn,
    ours: &InitReply,
    page_size: u32,
    transport: FuseTransport,
) -> io::Result<Option<Rings>> {
    let built = if fuse_proto::offered_flags(init) & init_flags::OVER_IO_URING == 0 {
        Err(format!(
            "the kernel does not offer it: FUSE {}.{}, or {ENABLE_URING} is off",
            init.major, init.minor
        ))
    } else {
        // The kernel's size for an entry's payload buffer.
        let pages = usize::from(ours.out.max_pages) * page_size as usize;
        let payload = (ours.out.max_write as usize)
            .max(pages)
            .max(MIN_READ_BUFFER);
        Rings::build(dev, payload).map_err(|e| format!("cannot set up the rings: {e}"))
    };
    match built {
        Ok(rings) => Ok(Some(rings)),
        Err(why) if transport == FuseTransport::IoUring => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("FUSE over io_uring unavailable: {why}"),
        )),
        Err(why) => {
            info!("FUSE over io_uring unavailable ({why}); serving through /dev/fuse");
            Ok(None)
        }
    }
}

/// The switch of the kernel's FUSE over io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// One request, or `None` once the connection is gone.
fn receive(dev: &DevFuse, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match dev.receive(buf) {
            Ok(len) => return Ok(Some(len)),
            // ENOENT: the request was interrupted before we got it.
            Err(Errno::ENOENT | Errno::EINTR | Errno::EAGAIN) => continue,
            Err(Errno::ENODEV) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// A reader thread: requests from `dev` until the connection ends.
fn serve(dev: &Arc<DevFuse>, handler: &impl Handler, buffer: usize) -> io::Result<()> {
    let mut buf = vec![0; buffer];
    while let Some(len) = receive(dev, &mut buf)? {
        if dispatch_dev(dev, handler, &buf[..len]).is_break() {
            break;
        }
    }
    debug!("FUSE reader done");
    Ok(())
}

/// Parses and hands on one request read from `/dev/fuse`.
fn dispatch_dev(dev: &Arc<DevFuse>, handler: &impl Handler, bytes: &[u8]) -> ControlFlow<()> {
    let parsed = Frame::split_dev(bytes).and_then(|frame| {
        let request = fuse_proto::parse(&frame)?;
        Ok((frame.header, request))
    });
    dispatch(handler, parsed, bytes, Sink::Dev(dev.clone()))
}

/// Hands a parsed request to `handler` with the reply that answers it
/// through `sink`, or answers a malformed one (`raw` starts with its
/// header) with its error; breaks after DESTROY.
pub(crate) fn dispatch(
    handler: &impl Handler,
    parsed: Result<(InHeader, Request<'_>), ParseError>,
    raw: &[u8],
    sink: Sink,
) -> ControlFlow<()> {
    let (header, request) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => {
            warn!(%err, "malformed FUSE request");
            if let Ok((header, _)) = InHeader::read_from_prefix(raw) {
                let reply = Reply::new(header.unique, sink);
                if fuse_proto::expects_reply(header.opcode) {
                    reply.error(err.errno());
                } else {
                    reply.none();
                }
            }
            return ControlFlow::Continue(());
        }
    };
    let reply = Reply::new(header.unique, sink);
    match request {
        Request::Init(_) => {
            error!("FUSE INIT after the handshake");
            reply.error(libc::EIO);
        }
        Request::Destroy => {
            reply.ok();
            return ControlFlow::Break(());
        }
        request => handler.handle(&header, request, reply),
    }
    ControlFlow::Continue(())
}
