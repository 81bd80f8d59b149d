//! The `fuse` target: requests as `/dev/fuse` delivers them through the
//! FUSE frame splitter and parser, each parsed request through what answers
//! it without a device (the INIT negotiation, the directory listing).
//!
//! Input: the first byte's bit 0 set makes the header's length that of the
//! input (so that most inputs get past the length check); the rest is one
//! request.
//!
//! Findings (panics): a panic anywhere; a frame whose parts do not add up
//! to the request it came from; a write whose data is not the size it
//! declares; an empty name or one holding a NUL; an INIT answer that asks
//! for flags the kernel did not offer, or is not as long as its minor
//! version takes; a directory listing longer than asked for or not in
//! whole 8-byte records; an error answered with another errno than EIO or
//! EINVAL.

use oxhorn_dataplane::frontend::fuse_abi::{InHeader, init_flags};
use oxhorn_dataplane::frontend::fuse_proto::{
    DirEntry, Frame, InitAnswer, InitSettings, Request, dir_entries, negotiate, offered_flags,
    parse,
};

/// What the volume's filesystem asks for at INIT.
const SETTINGS: InitSettings = InitSettings {
    max_write: 1 << 20,
    max_background: 128,
    congestion_threshold: 96,
    flags: init_flags::ASYNC_DIO,
};

const HEADER: usize = size_of::<InHeader>();

pub fn fuse(data: &[u8]) {
    let Some((&first, request)) = data.split_first() else {
        return;
    };
    let mut request = request.to_vec();
    if first & 1 != 0 && request.len() >= 4 {
        let len = u32::try_from(request.len()).unwrap_or(u32::MAX);
        request[..4].copy_from_slice(&len.to_ne_bytes());
    }
    let frame = match Frame::split_dev(&request) {
        Ok(frame) => frame,
        Err(err) => return assert_errno(err.errno()),
    };
    let extensions = usize::from(frame.header.total_extlen) * 8;
    assert_eq!(
        HEADER + frame.op_in.len() + frame.payload.len() + extensions,
        request.len(),
        "the parts do not add up"
    );
    assert_eq!(&request[HEADER..HEADER + frame.op_in.len()], frame.op_in);
    match parse(&frame) {
        Ok(parsed) => check(&parsed, &frame),
        Err(err) => assert_errno(err.errno()),
    }
}

fn assert_errno(errno: i32) {
    assert!(errno == 5 || errno == 22, "errno {errno}");
}

fn check(request: &Request<'_>, frame: &Frame<'_>) {
    match request {
        Request::Write { data, .. } => assert_eq!(data.len(), frame.payload.len()),
        Request::Lookup { name } => assert!(!name.is_empty() && !name.contains(&0)),
        Request::Init(init) => match negotiate(init, &SETTINGS, 4096) {
            InitAnswer::Accepted { reply, missing } => {
                let offered = offered_flags(init);
                assert_eq!(reply.flags() & !offered, 0, "flags not offered");
                assert_eq!(missing & offered, 0);
                let len = match init.minor {
                    0..5 => 8,
                    5..23 => 24,
                    _ => 64,
                };
                assert_eq!(reply.bytes().len(), len);
                assert!(reply.out.max_pages >= 1);
                assert!(reply.out.congestion_threshold <= reply.out.max_background);
            }
            InitAnswer::OurVersion(ours) => assert_eq!(ours.bytes().len(), 64),
            InitAnswer::Unsupported { major, minor } => assert!(major < 7 || minor < 6),
        },
        Request::Readdir { offset, size, .. } => {
            let entries = [
                DirEntry {
                    ino: 1,
                    kind: 4,
                    name: b".",
                },
                DirEntry {
                    ino: 2,
                    kind: 8,
                    name: b"volume",
                },
            ];
            let listing = dir_entries(&entries, *offset, *size as usize);
            assert!(listing.len() <= *size as usize && listing.len().is_multiple_of(8));
        }
        _ => {}
    }
}
