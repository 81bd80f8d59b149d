//! The `fuse` target: requests as `/dev/fuse` delivers them through the
//! FUSE frame splitter and parser, each parsed request through what answers
//! it without a device (the INIT negotiation, the directory listing).
//!
//! Input: the first byte's bit 0 set makes the header's length that of the
//! input (so that most inputs get past the length check); the rest is one
//! request. The same bytes go through the io_uring splitter too, as an
//! entry's header area (the first 288) and payload buffer (the rest); and
//! a request that splits from `/dev/fuse` is laid out as the kernel lays it
//! in an io_uring entry, where it must parse the same.
//!
//! Findings (panics): a panic anywhere; a frame whose parts do not add up
//! to the request it came from; a write whose data is not the size it
//! declares; an empty name or one holding a NUL; an INIT answer that asks
//! for flags the kernel did not offer, or is not as long as its minor
//! version takes; a directory listing longer than asked for or not in
//! whole 8-byte records; an error answered with another errno than EIO or
//! EINVAL; an io_uring frame larger than its buffers, or a request that
//! parses otherwise from an io_uring entry than from `/dev/fuse`.

use oxhorn_dataplane::frontend::fuse_abi::uring::{self, EntInOut};
use oxhorn_dataplane::frontend::fuse_abi::{InHeader, init_flags};
use oxhorn_dataplane::frontend::fuse_proto::{
    DirEntry, Frame, InitAnswer, InitSettings, Request, dir_entries, negotiate, offered_flags,
    parse,
};
use zerocopy::IntoBytes;

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
    as_ring_entry(&request);
    let frame = match Frame::split_dev(&request) {
        Ok(frame) => frame,
        Err(err) => return assert_errno(err.errno()),
    };
    same_from_a_ring(&frame);
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

/// The bytes as an io_uring entry's header area and payload buffer.
fn as_ring_entry(bytes: &[u8]) {
    let (headers, payload) = bytes.split_at(bytes.len().min(uring::REQ_HEADER_SIZE));
    match Frame::split_uring(headers, payload) {
        Ok(frame) => {
            assert!(frame.op_in.len() <= uring::OP_IN_SIZE);
            assert!(frame.payload.len() <= payload.len());
            match parse(&frame) {
                Ok(parsed) => check(&parsed, &frame),
                Err(err) => assert_errno(err.errno()),
            }
        }
        Err(err) => assert_errno(err.errno()),
    }
}

/// `frame` laid out as the kernel puts it in an io_uring entry parses as it
/// did from `/dev/fuse`.
fn same_from_a_ring(frame: &Frame<'_>) {
    if frame.op_in.len() > uring::OP_IN_SIZE {
        return;
    }
    let extensions = usize::from(frame.header.total_extlen) * 8;
    let mut payload = frame.payload.to_vec();
    payload.resize(payload.len() + extensions, 0);
    let mut headers = vec![0; uring::REQ_HEADER_SIZE];
    headers[..HEADER].copy_from_slice(frame.header.as_bytes());
    headers[uring::OP_IN..uring::OP_IN + frame.op_in.len()].copy_from_slice(frame.op_in);
    let ent = EntInOut {
        payload_sz: payload.len() as u32,
        ..EntInOut::default()
    };
    headers[uring::ENT_IN_OUT..].copy_from_slice(ent.as_bytes());
    let ring =
        Frame::split_uring(&headers, &payload).expect("a ring entry that split from /dev/fuse");
    assert_eq!(parse(&ring), parse(frame));
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
