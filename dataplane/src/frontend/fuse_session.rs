//! A FUSE connection served through `/dev/fuse`: the INIT handshake, then
//! reader threads, each on its own descriptor of the connection (cloned with
//! `FUSE_DEV_IOC_CLONE`), parsing every request and handing it to the
//! [`Handler`] with the [`Reply`] that answers it on that descriptor. The
//! session ends when the kernel ends the connection (unmount, abort).

use std::io;
use std::ops::ControlFlow;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use nix::errno::Errno;
use nix::libc;
use tracing::{Span, debug, error, info, warn};
use zerocopy::FromBytes;

use super::fuse_abi::{InHeader, MIN_READ_BUFFER};
use super::fuse_dev::DevFuse;
use super::fuse_proto::{self, Frame, InitAnswer, InitSettings, Request};
use super::fuse_reply::{Reply, Sink};

/// What answers the filesystem's requests.
pub(crate) trait Handler: Send + Sync + 'static {
    /// What to ask for at INIT.
    fn init_settings(&self) -> InitSettings;
    /// Answers `request` through `reply`, now or later from another thread.
    /// INIT and DESTROY never come here.
    fn handle(&self, header: &InHeader, request: Request<'_>, reply: Reply);
}

/// A running session. Notifications go through its first descriptor.
#[derive(Debug)]
pub(crate) struct Session {
    dev: Arc<DevFuse>,
    readers: Vec<JoinHandle<io::Result<()>>>,
}

impl Session {
    /// Answers the kernel's INIT on `fd`, then serves the connection with
    /// `threads` readers (at least one), inside `span`.
    pub(crate) fn start<H: Handler>(
        fd: OwnedFd,
        handler: H,
        threads: usize,
        span: Span,
    ) -> io::Result<Self> {
        let dev = Arc::new(DevFuse::new(fd));
        let max_write = handshake(&dev, &handler.init_settings())?;
        // The kernel refuses reads into buffers that could not take its
        // largest write.
        let buffer = (max_write as usize + 4096).max(MIN_READ_BUFFER);
        let handler = Arc::new(handler);
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
        Ok(Session { dev, readers })
    }

    /// Drops the kernel's cached attributes and data of inode `ino`.
    pub(crate) fn inval_inode(&self, ino: u64) -> io::Result<()> {
        self.dev.notify_inval_inode(ino)
    }

    /// Waits for the readers, which return once the connection is gone.
    pub(crate) fn join(self) -> io::Result<()> {
        let mut result = Ok(());
        for reader in self.readers {
            let ended = reader
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a FUSE reader thread panicked")));
            if result.is_ok() {
                result = ended;
            }
        }
        result
    }
}

/// Reads INIT and answers it; returns the negotiated largest write.
fn handshake(dev: &Arc<DevFuse>, settings: &InitSettings) -> io::Result<u32> {
    let mut buf = vec![0; MIN_READ_BUFFER];
    let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|size| u32::try_from(size).ok())
        .unwrap_or(4096);
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
                reply: ours,
                missing,
            } => {
                if missing != 0 {
                    warn!(
                        missing = format!("{missing:#x}"),
                        "kernel lacks FUSE features we ask for"
                    );
                }
                info!(
                    kernel = format!("{}.{}", init.major, init.minor),
                    flags = format!("{:#x}", ours.flags()),
                    max_write = ours.out.max_write,
                    max_pages = ours.out.max_pages,
                    "FUSE connection initialised"
                );
                let max_write = ours.out.max_write;
                reply.data(ours.bytes());
                return Ok(max_write);
            }
        }
    }
}

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
        if dispatch(dev, handler, &buf[..len]).is_break() {
            break;
        }
    }
    debug!("FUSE reader done");
    Ok(())
}

/// Parses and hands on one request; breaks after DESTROY.
fn dispatch(dev: &Arc<DevFuse>, handler: &impl Handler, bytes: &[u8]) -> ControlFlow<()> {
    let parsed = Frame::split_dev(bytes).and_then(|frame| {
        let request = fuse_proto::parse(&frame)?;
        Ok((frame.header, request))
    });
    let (header, request) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => {
            warn!(%err, "malformed FUSE request");
            if let Ok((header, _)) = InHeader::read_from_prefix(bytes)
                && fuse_proto::expects_reply(header.opcode)
            {
                Reply::new(header.unique, Sink::Dev(dev.clone())).error(err.errno());
            }
            return ControlFlow::Continue(());
        }
    };
    let reply = Reply::new(header.unique, Sink::Dev(dev.clone()));
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
