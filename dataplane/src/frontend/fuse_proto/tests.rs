use proptest::prelude::*;

use super::*;
use crate::frontend::fuse_abi::{EntryOut, WriteOut};

/// A request as `/dev/fuse` delivers it: header, `op_in`, `payload`.
fn request(op: u32, unique: u64, nodeid: u64, op_in: &[u8], payload: &[u8]) -> Vec<u8> {
    let len = size_of::<InHeader>() + op_in.len() + payload.len();
    let header = InHeader {
        len: len as u32,
        opcode: op,
        unique,
        nodeid,
        uid: 1000,
        gid: 1000,
        pid: 42,
        ..InHeader::default()
    };
    [header.as_bytes(), op_in, payload].concat()
}

fn parsed(bytes: &[u8]) -> Result<Request<'_>, ParseError> {
    parse(&Frame::split_dev(bytes)?)
}

fn ne32(v: u32) -> [u8; 4] {
    v.to_ne_bytes()
}

fn ne64(v: u64) -> [u8; 8] {
    v.to_ne_bytes()
}

#[test]
fn the_header_is_read_at_the_kernels_offsets() {
    let mut bytes = Vec::new();
    bytes.extend(ne32(40)); // len
    bytes.extend(ne32(opcode::STATFS));
    bytes.extend(ne64(0x1122_3344_5566_7788)); // unique
    bytes.extend(ne64(1)); // nodeid
    bytes.extend(ne32(7)); // uid
    bytes.extend(ne32(8)); // gid
    bytes.extend(ne32(9)); // pid
    bytes.extend([0; 4]); // total_extlen, padding
    let frame = Frame::split_dev(&bytes).unwrap();
    assert_eq!(frame.header.unique, 0x1122_3344_5566_7788);
    assert_eq!(
        (frame.header.uid, frame.header.gid, frame.header.pid),
        (7, 8, 9)
    );
    assert_eq!(parse(&frame), Ok(Request::Statfs));
}

#[test]
fn a_write_is_its_argument_then_its_data() {
    let data = b"hello, volume";
    let mut write_in = Vec::new();
    write_in.extend(ne64(7)); // fh
    write_in.extend(ne64(4096)); // offset
    write_in.extend(ne32(data.len() as u32)); // size
    write_in.extend(ne32(0)); // write_flags
    write_in.extend(ne64(0)); // lock_owner
    write_in.extend(ne32(0o2)); // flags
    write_in.extend(ne32(0)); // padding
    let bytes = request(opcode::WRITE, 5, 2, &write_in, data);
    let frame = Frame::split_dev(&bytes).unwrap();
    assert_eq!((frame.op_in.len(), frame.payload), (40, &data[..]));
    assert_eq!(
        parse(&frame),
        Ok(Request::Write {
            fh: 7,
            offset: 4096,
            data
        })
    );

    let short = request(opcode::WRITE, 5, 2, &write_in, &data[1..]);
    assert_eq!(parsed(&short).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn a_read_is_parsed_from_its_argument() {
    let mut read_in = Vec::new();
    read_in.extend(ne64(3)); // fh
    read_in.extend(ne64(1 << 20)); // offset
    read_in.extend(ne32(131_072)); // size
    read_in.extend([0; 20]); // read_flags, lock_owner, flags, padding
    let bytes = request(opcode::READ, 9, 2, &read_in, &[]);
    assert_eq!(
        parsed(&bytes),
        Ok(Request::Read {
            fh: 3,
            offset: 1 << 20,
            size: 131_072
        })
    );
    let bytes = request(opcode::READDIR, 9, 1, &read_in, &[]);
    assert_eq!(
        parsed(&bytes),
        Ok(Request::Readdir {
            fh: 3,
            offset: 1 << 20,
            size: 131_072
        })
    );
}

#[test]
fn every_request_kind_parses() {
    let getattr = GetattrIn {
        getattr_flags: GETATTR_FH,
        fh: 4,
        ..Default::default()
    };
    let setattr = SetattrIn {
        valid: fattr::SIZE | fattr::MODE,
        size: 99,
        mode: 0o644,
        uid: 5,
        ..Default::default()
    };
    let fsync = FsyncIn {
        fh: 1,
        fsync_flags: 1,
        padding: 0,
    };
    let fallocate = FallocateIn {
        fh: 1,
        offset: 8192,
        length: 4096,
        mode: 3,
        padding: 0,
    };
    let release = ReleaseIn {
        fh: 6,
        ..Default::default()
    };
    let flush = FlushIn {
        fh: 6,
        ..Default::default()
    };
    let open = OpenIn {
        flags: 0o100002,
        open_flags: 0,
    };
    let forgets = [ForgetOne {
        nodeid: 2,
        nlookup: 1,
    }; 2];
    let batch = BatchForgetIn { count: 2, dummy: 0 };
    let cases: Vec<(Vec<u8>, Request<'_>)> = vec![
        (
            request(opcode::LOOKUP, 1, 1, &[], b"volume\0"),
            Request::Lookup { name: b"volume" },
        ),
        (
            request(
                opcode::FORGET,
                1,
                2,
                ForgetIn { nlookup: 3 }.as_bytes(),
                &[],
            ),
            Request::Forget { nlookup: 3 },
        ),
        (
            request(
                opcode::BATCH_FORGET,
                1,
                0,
                batch.as_bytes(),
                forgets.as_bytes(),
            ),
            Request::BatchForget { count: 2 },
        ),
        (
            request(opcode::GETATTR, 1, 2, getattr.as_bytes(), &[]),
            Request::Getattr { fh: Some(4) },
        ),
        (
            request(opcode::SETATTR, 1, 2, setattr.as_bytes(), &[]),
            Request::Setattr {
                mode: Some(0o644),
                uid: None,
                gid: None,
                size: Some(99),
            },
        ),
        (
            request(opcode::OPEN, 1, 2, open.as_bytes(), &[]),
            Request::Open { flags: 0o100002 },
        ),
        (
            request(opcode::OPENDIR, 1, 1, open.as_bytes(), &[]),
            Request::Opendir,
        ),
        (
            request(opcode::FLUSH, 1, 2, flush.as_bytes(), &[]),
            Request::Flush { fh: 6 },
        ),
        (
            request(opcode::FSYNC, 1, 2, fsync.as_bytes(), &[]),
            Request::Fsync {
                fh: 1,
                datasync: true,
            },
        ),
        (
            request(opcode::RELEASE, 1, 2, release.as_bytes(), &[]),
            Request::Release { fh: 6 },
        ),
        (
            request(opcode::RELEASEDIR, 1, 1, release.as_bytes(), &[]),
            Request::Releasedir { fh: 6 },
        ),
        (
            request(opcode::FALLOCATE, 1, 2, fallocate.as_bytes(), &[]),
            Request::Fallocate {
                fh: 1,
                offset: 8192,
                length: 4096,
                mode: 3,
            },
        ),
        (
            request(
                opcode::INTERRUPT,
                1,
                0,
                InterruptIn { unique: 77 }.as_bytes(),
                &[],
            ),
            Request::Interrupt { unique: 77 },
        ),
        (request(opcode::DESTROY, 1, 0, &[], &[]), Request::Destroy),
        (
            request(opcode::SYMLINK, 1, 1, &[], b"a\0b\0"),
            Request::Unknown(6),
        ),
        (request(4096, 1, 1, &[], &[]), Request::Unknown(4096)),
    ];
    for (bytes, expected) in &cases {
        assert_eq!(parsed(bytes).as_ref(), Ok(expected));
    }
}

#[test]
fn init_from_an_old_kernel_has_no_flags2() {
    let mut init = InitIn {
        major: 7,
        minor: 31,
        max_readahead: 4096,
        flags: 1,
        flags2: 0xffff,
        ..Default::default()
    };
    let bytes = request(opcode::INIT, 1, 0, &init.as_bytes()[..16], &[]);
    init.flags2 = 0;
    assert_eq!(parsed(&bytes), Ok(Request::Init(init)));
    let bytes = request(opcode::INIT, 1, 0, &init.as_bytes()[..15], &[]);
    assert_eq!(parsed(&bytes).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn inconsistent_frames_are_errors() {
    assert_eq!(
        Frame::split_dev(&[0; 39]),
        Err(ParseError::NoHeader { len: 39 })
    );
    let mut bytes = request(opcode::STATFS, 1, 1, &[], &[]);
    bytes.push(0);
    assert_eq!(parsed(&bytes).unwrap_err().errno(), libc::EIO);

    let no_nul = request(opcode::LOOKUP, 1, 1, &[], b"volume");
    assert!(matches!(parsed(&no_nul), Err(ParseError::Invalid { .. })));
    let empty = request(opcode::LOOKUP, 1, 1, &[], b"\0");
    assert!(matches!(parsed(&empty), Err(ParseError::Invalid { .. })));

    let batch = BatchForgetIn { count: 3, dummy: 0 };
    let forgets = [ForgetOne::default(); 2];
    let bytes = request(
        opcode::BATCH_FORGET,
        1,
        0,
        batch.as_bytes(),
        forgets.as_bytes(),
    );
    assert!(matches!(parsed(&bytes), Err(ParseError::Truncated { .. })));

    // Extensions longer than the body.
    let mut bytes = request(opcode::GETATTR, 1, 2, &[0; 16], &[]);
    bytes[36..38].copy_from_slice(&3u16.to_ne_bytes());
    assert!(matches!(parsed(&bytes), Err(ParseError::Truncated { .. })));
}

#[test]
fn extensions_are_left_out_of_the_request() {
    let getattr = GetattrIn::default();
    let mut bytes = request(opcode::GETATTR, 1, 2, getattr.as_bytes(), &[0xee; 16]);
    bytes[36..38].copy_from_slice(&2u16.to_ne_bytes());
    let frame = Frame::split_dev(&bytes).unwrap();
    assert_eq!((frame.op_in.len(), frame.payload.len()), (16, 0));
}

#[test]
fn every_prefix_of_a_valid_request_is_an_error_not_a_panic() {
    let write = WriteIn {
        size: 8,
        ..Default::default()
    };
    let valid = [
        request(opcode::WRITE, 1, 2, write.as_bytes(), &[1; 8]),
        request(opcode::LOOKUP, 1, 1, &[], b"volume\0"),
        request(opcode::SETATTR, 1, 2, SetattrIn::default().as_bytes(), &[]),
    ];
    for bytes in &valid {
        assert!(parsed(bytes).is_ok());
        for len in 0..bytes.len() {
            let mut prefix = bytes[..len].to_vec();
            // With its length fixed up too, so that the body is what is short.
            if len >= 4 {
                prefix[..4].copy_from_slice(&ne32(len as u32));
            }
            assert!(parsed(&prefix).is_err(), "{len} bytes parsed");
        }
    }
}

proptest! {
    #[test]
    fn garbage_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 0..200), op in 0u32..60) {
        if bytes.len() >= 8 {
            let len = bytes.len() as u32;
            bytes[..4].copy_from_slice(&len.to_ne_bytes());
            bytes[4..8].copy_from_slice(&op.to_ne_bytes());
        }
        let _ = parsed(&bytes);
    }
}

/// The same request as an io_uring entry holds it: the in header and the
/// opcode's argument in the entry's header area, the rest in its payload
/// buffer (`capacity` bytes), the payload's length after them.
fn uring_entry(dev: &[u8], capacity: usize) -> (Vec<u8>, Vec<u8>) {
    let (header, body) = InHeader::read_from_prefix(dev).unwrap();
    let op_in = op_in_size(header.opcode).map_or(0, |size| size.min(body.len()));
    let (op_in, rest) = body.split_at(op_in);
    let mut headers = vec![0xee; uring::REQ_HEADER_SIZE];
    headers[..40].copy_from_slice(header.as_bytes());
    headers[uring::OP_IN..uring::OP_IN + op_in.len()].copy_from_slice(op_in);
    let ent = EntInOut {
        payload_sz: rest.len() as u32,
        commit_id: header.unique,
        ..EntInOut::default()
    };
    headers[uring::ENT_IN_OUT..].copy_from_slice(ent.as_bytes());
    let mut payload = vec![0xdd; capacity];
    payload[..rest.len()].copy_from_slice(rest);
    (headers, payload)
}

#[test]
fn an_io_uring_write_parses_as_it_does_from_dev_fuse() {
    let mut write_in = WriteIn {
        fh: 7,
        offset: 8192,
        size: 4096,
        ..WriteIn::default()
    };
    let data = vec![0x5a; 4096];
    let dev = request(opcode::WRITE, 9, 2, write_in.as_bytes(), &data);
    let (headers, payload) = uring_entry(&dev, 1 << 20);
    let frame = Frame::split_uring(&headers, &payload).unwrap();
    assert_eq!(frame, Frame::split_dev(&dev).unwrap());
    assert_eq!(
        parse(&frame),
        Ok(Request::Write {
            fh: 7,
            offset: 8192,
            data: &data
        })
    );

    write_in.size = 1;
    let dev = request(opcode::WRITE, 9, 2, write_in.as_bytes(), &data);
    let (headers, payload) = uring_entry(&dev, 1 << 20);
    let frame = Frame::split_uring(&headers, &payload).unwrap();
    assert_eq!(parse(&frame).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn an_io_uring_entry_with_inconsistent_lengths_is_an_error() {
    let dev = request(opcode::LOOKUP, 3, 1, &[], b"volume\0");
    let (mut headers, payload) = uring_entry(&dev, 8);
    assert!(Frame::split_uring(&headers, &payload).is_ok());
    // More payload than the buffer holds.
    assert!(matches!(
        Frame::split_uring(&headers, &payload[..4]),
        Err(ParseError::Truncated { .. })
    ));
    // A header shorter than its payload.
    headers[..4].copy_from_slice(&ne32(41));
    assert_eq!(
        Frame::split_uring(&headers, &payload).unwrap_err().errno(),
        libc::EIO
    );
    // An argument longer than its area.
    headers[..4].copy_from_slice(&ne32(40 + 129 + 7));
    assert!(Frame::split_uring(&headers, &payload).is_err());
    // A header area shorter than the kernel's.
    assert!(Frame::split_uring(&headers[..200], &payload).is_err());
}

proptest! {
    #[test]
    fn both_framings_of_a_request_parse_alike(
        op in prop::sample::select(vec![
            opcode::LOOKUP, opcode::GETATTR, opcode::SETATTR, opcode::OPEN, opcode::READ,
            opcode::WRITE, opcode::STATFS, opcode::RELEASE, opcode::FSYNC, opcode::FLUSH,
            opcode::OPENDIR, opcode::READDIR, opcode::RELEASEDIR, opcode::FALLOCATE, 99,
        ]),
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let dev = request(op, 11, 2, &body, &[]);
        let (headers, payload) = uring_entry(&dev, 512);
        let uring = Frame::split_uring(&headers, &payload).unwrap();
        let dev = Frame::split_dev(&dev).unwrap();
        prop_assert_eq!(parse(&uring), parse(&dev));
    }
}

const SETTINGS: InitSettings = InitSettings {
    max_write: 1 << 20,
    max_background: 128,
    congestion_threshold: 96,
    flags: init_flags::ASYNC_DIO,
};

fn kernel_init(minor: u32, flags: u64) -> InitIn {
    InitIn {
        major: 7,
        minor,
        max_readahead: 128 << 10,
        flags: flags as u32,
        flags2: (flags >> 32) as u32,
        ..Default::default()
    }
}

#[test]
fn init_takes_only_what_the_kernel_offers() {
    let offered = init_flags::ASYNC_READ | init_flags::BIG_WRITES | init_flags::INIT_EXT;
    let InitAnswer::Accepted { reply, missing } =
        negotiate(&kernel_init(45, offered), &SETTINGS, 4096)
    else {
        panic!("refused");
    };
    assert_eq!(missing, init_flags::ASYNC_DIO);
    assert_eq!(reply.flags(), offered);
    assert_eq!(reply.bytes().len(), 64);
    // 1 MiB in pages, the readahead being smaller.
    assert_eq!(reply.out.max_pages, 256);
    assert_eq!(reply.out.max_readahead, 128 << 10);

    // Without INIT_EXT the kernel ignores flags2: we leave it empty.
    let all = !init_flags::INIT_EXT;
    let InitAnswer::Accepted { reply, missing } = negotiate(&kernel_init(45, all), &SETTINGS, 4096)
    else {
        panic!("refused");
    };
    assert_eq!(missing, 0);
    assert_eq!(reply.out.flags2, 0);
    assert_eq!(reply.flags() & init_flags::INIT_EXT, 0);
}

#[test]
fn init_follows_the_kernels_version() {
    let newer = InitIn {
        major: 8,
        ..Default::default()
    };
    let InitAnswer::OurVersion(ours) = negotiate(&newer, &SETTINGS, 4096) else {
        panic!("not asked for another INIT");
    };
    assert_eq!((ours.out.major, ours.out.minor), (7, 40));
    assert_eq!(ours.flags(), 0);
    assert_eq!(
        negotiate(&kernel_init(5, 0), &SETTINGS, 4096),
        InitAnswer::Unsupported { major: 7, minor: 5 }
    );
    let InitAnswer::Accepted { reply, .. } = negotiate(&kernel_init(22, 0), &SETTINGS, 4096) else {
        panic!("refused");
    };
    assert_eq!(reply.bytes().len(), 24);
}

#[test]
fn replies_carry_their_length_and_negative_errno() {
    let header = out_header(9, libc::ENOENT, 0);
    let mut expected = Vec::new();
    expected.extend(ne32(16));
    expected.extend((-libc::ENOENT).to_ne_bytes());
    expected.extend(ne64(9));
    assert_eq!(header.as_bytes(), expected);
    assert_eq!(out_header(9, 0, size_of::<WriteOut>()).len, 24);
}

#[test]
fn an_entry_is_the_node_then_its_validity_then_its_attributes() {
    let attr = Attr {
        ino: 2,
        size: 1 << 30,
        mode: libc::S_IFREG | 0o600,
        ..Default::default()
    };
    let entry: EntryOut = entry_out(
        attr,
        Ttl {
            secs: 3600,
            nanos: 5,
        },
    );
    let bytes = entry.as_bytes();
    assert_eq!(bytes[..8], ne64(2)); // nodeid
    assert_eq!(bytes[16..24], ne64(3600)); // entry_valid
    assert_eq!(bytes[24..32], ne64(3600)); // attr_valid
    assert_eq!(bytes[32..36], ne32(5)); // entry_valid_nsec
    assert_eq!(bytes[48..56], ne64(1 << 30)); // attr.size
    assert_eq!(bytes[40 + 60..40 + 64], ne32(libc::S_IFREG | 0o600)); // attr.mode
    let out = attr_out(attr, Ttl { secs: 1, nanos: 0 });
    assert_eq!(out.as_bytes()[16..24], ne64(2)); // attr.ino
}

#[test]
fn directory_entries_resume_at_their_offset_and_fit_the_buffer() {
    let entries = [
        DirEntry {
            ino: 1,
            kind: 4,
            name: b".",
        },
        DirEntry {
            ino: 1,
            kind: 4,
            name: b"..",
        },
        DirEntry {
            ino: 2,
            kind: 8,
            name: b"volume",
        },
    ];
    let all = dir_entries(&entries, 0, 4096);
    assert_eq!(all.len(), 3 * 32);
    // The third entry: ino, next offset, name length, type, padded name.
    let third = &all[64..];
    assert_eq!(third[..8], ne64(2));
    assert_eq!(third[8..16], ne64(3));
    assert_eq!(third[16..20], ne32(6));
    assert_eq!(third[20..24], ne32(8));
    assert_eq!(&third[24..32], b"volume\0\0");
    assert_eq!(dir_entries(&entries, 2, 4096), third);
    assert_eq!(dir_entries(&entries, 3, 4096), b"");
    assert_eq!(dir_entries(&entries, 0, 63).len(), 32);
    assert_eq!(dir_entries(&entries, 0, 31), b"");
}

#[test]
fn an_inode_invalidation_is_a_notification_with_unique_zero() {
    let mut expected = Vec::new();
    expected.extend(ne32(40));
    expected.extend(ne32(2)); // FUSE_NOTIFY_INVAL_INODE
    expected.extend(ne64(0));
    expected.extend(ne64(2)); // ino
    expected.extend(ne64(0)); // off: from the start
    expected.extend(ne64(0)); // len: to the end
    assert_eq!(notify_inval_inode(2, 0, 0), expected);
}
