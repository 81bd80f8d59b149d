//! The answer to one FUSE request, whichever transport brought it: a
//! [`Reply`] owns the request's unique id and where the answer goes, and is
//! used up by answering. One dropped unanswered answers EIO, so that no
//! request is left waiting in the kernel.

use std::sync::Arc;

use nix::errno::Errno;
use nix::libc;
use tracing::{debug, warn};
use zerocopy::{Immutable, IntoBytes};

use super::fuse_dev::DevFuse;
use super::fuse_proto;
use super::fuse_uring::Queue;

/// Where a reply goes: the transport that brought its request.
#[derive(Debug)]
pub(crate) enum Sink {
    /// The `/dev/fuse` descriptor the request was read from.
    Dev(Arc<DevFuse>),
    /// The io_uring entry the request arrived in, which the reply owns:
    /// made only by the queue's thread (`fuse_uring`), for that entry.
    Uring { queue: Arc<Queue>, slot: u16 },
}

impl Sink {
    fn send(&self, unique: u64, errno: i32, body: &[u8]) {
        let header = fuse_proto::out_header(unique, errno, body.len());
        let sent = match self {
            Sink::Dev(dev) => dev.reply(&header, body),
            // SAFETY: only the queue's thread makes a `Sink::Uring`, for
            // the entry it hands to the reply, which sends once (`Reply`
            // takes its sink to send).
            Sink::Uring { queue, slot } => unsafe { queue.answer(*slot, &header, body) },
        };
        match sent {
            Ok(()) => {}
            // The kernel no longer waits for it: interrupted, or the
            // connection is gone (unmounted, aborted).
            Err(err @ (Errno::ENOENT | Errno::ENODEV)) => {
                debug!(unique, %err, "FUSE reply not taken");
            }
            Err(err) => warn!(unique, %err, "cannot send a FUSE reply"),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Reply {
    unique: u64,
    sink: Option<Sink>,
}

impl Reply {
    pub(crate) fn new(unique: u64, sink: Sink) -> Self {
        Reply {
            unique,
            sink: Some(sink),
        }
    }

    /// Success without a body.
    pub(crate) fn ok(self) {
        self.send(0, &[]);
    }

    /// Failure with `errno` (positive).
    pub(crate) fn error(self, errno: i32) {
        self.send(errno, &[]);
    }

    /// Success with `data` as the body (READ, READDIR).
    pub(crate) fn data(self, data: &[u8]) {
        self.send(0, data);
    }

    /// Success with a reply structure as the body.
    pub(crate) fn value<T: IntoBytes + Immutable>(self, value: &T) {
        self.send(0, value.as_bytes());
    }

    /// For the requests the kernel expects no answer to (FORGET). An
    /// io_uring entry goes back to the kernel only with an answer, so one
    /// gets ENOSYS (the kernel sends these through `/dev/fuse` only).
    pub(crate) fn none(mut self) {
        if let Some(sink @ Sink::Uring { .. }) = self.sink.take() {
            sink.send(self.unique, libc::ENOSYS, &[]);
        }
    }

    fn send(mut self, errno: i32, body: &[u8]) {
        if let Some(sink) = self.sink.take() {
            sink.send(self.unique, errno, body);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take() {
            warn!(
                unique = self.unique,
                "FUSE request left unanswered; answering EIO"
            );
            sink.send(self.unique, libc::EIO, &[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use zerocopy::FromBytes;

    use super::*;
    use crate::frontend::fuse_abi::{OutHeader, WriteOut};

    /// A sink writing into a pipe instead of /dev/fuse, and the pipe's other
    /// end, holding what it was sent.
    fn pipe_sink() -> (Sink, std::fs::File) {
        let (read, write) = nix::unistd::pipe().unwrap();
        (Sink::Dev(Arc::new(DevFuse::new(write))), read.into())
    }

    fn sent(sink: Sink, mut read: std::fs::File) -> Vec<u8> {
        drop(sink);
        let mut bytes = Vec::new();
        read.read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn a_reply_is_its_header_then_its_body() {
        let (sink, read) = pipe_sink();
        let Sink::Dev(dev) = &sink else {
            unreachable!()
        };
        Reply::new(7, Sink::Dev(dev.clone())).value(&WriteOut {
            size: 4096,
            padding: 0,
        });
        let bytes = sent(sink, read);
        let (header, body) = OutHeader::read_from_prefix(&bytes).unwrap();
        assert_eq!((header.len, header.error, header.unique), (24, 0, 7));
        assert_eq!(body, 4096u64.to_ne_bytes());
    }

    #[test]
    fn a_reply_dropped_unanswered_answers_eio_and_a_forget_nothing() {
        let (sink, read) = pipe_sink();
        let Sink::Dev(dev) = &sink else {
            unreachable!()
        };
        drop(Reply::new(9, Sink::Dev(dev.clone())));
        Reply::new(10, Sink::Dev(dev.clone())).none();
        let bytes = sent(sink, read);
        let (header, rest) = OutHeader::read_from_prefix(&bytes).unwrap();
        assert_eq!(
            (header.len, header.error, header.unique),
            (16, -libc::EIO, 9)
        );
        assert!(rest.is_empty(), "{rest:?}");
    }
}
