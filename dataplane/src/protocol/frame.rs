//! Frame layout, all integers big-endian:
//!
//! request  (24 bytes): magic u16 | version u8 | op u8 | length u32 | id u64 | offset u64
//!                      then `length` bytes of data for a write
//! response (16 bytes): magic u16 | version u8 | status u8 | length u32 | id u64
//!                      then `length` bytes: read data, an error message, or
//!                      for `Corrupt`: count u32 | count byte ranges that
//!                      failed their checksums (offset u64 | length u64) |
//!                      the read data, those ranges zeroed
//!
//! `length` is the byte count the op covers (read, write, unmap); a header
//! whose magic, version, op or length is out of bounds is a protocol error.

use std::io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

const MAGIC: u16 = 0x4f58; // "OX"
/// 2: connections open with the handshake in `handshake.rs`; `Fenced`.
const VERSION: u8 = 2;
const REQUEST_HEADER: usize = 24;
const RESPONSE_HEADER: usize = 16;

/// Frames read or written in one system call, at most: a connection's
/// read buffer and the bytes its writer gathers before sending. Small
/// writes come many at once (a queue depth of 32 is 32 frames); tokio's
/// default of 8 KiB cost a system call for every 4 KiB one.
pub const BATCH_BYTES: usize = 256 << 10;

/// The largest read or write one frame may carry.
pub const MAX_PAYLOAD: u32 = 8 << 20;
/// The largest response: a read's data and, for `Corrupt`, its ranges (at
/// most one per two blocks of it, as adjacent ones merge).
pub const MAX_RESPONSE: u32 = MAX_PAYLOAD + 4 + MAX_PAYLOAD / 4096 / 2 * 16 + 16;

impl Op {
    /// Whether the request carries `length` bytes of data.
    pub fn carries_data(self) -> bool {
        matches!(self, Op::Write | Op::Repair)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Read = 1,
    Write = 2,
    Flush = 3,
    Unmap = 4,
    Ping = 5,
    /// A write that restores blocks a read found rotten, with the data the
    /// other replicas hold: it changes nothing they do not already have, so
    /// it does not count as a write (the revision counter stays).
    Repair = 6,
}

impl Op {
    /// What the operation does, for messages.
    pub fn verb(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Unmap => "discard",
            Op::Ping => "ping",
            Op::Repair => "repair",
        }
    }

    fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Flush,
            4 => Op::Unmap,
            5 => Op::Ping,
            6 => Op::Repair,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub op: Op,
    pub offset: u64,
    /// Bytes covered: to read, to unmap, or `data.len()` for a write.
    pub length: u32,
    pub data: Bytes,
}

/// How a request ended. Errors carry a message as the response data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    /// Unaligned or out of range: the engine's bug, not the disk's.
    InvalidArgument = 1,
    /// The replica's disk is full.
    NoSpace = 2,
    /// Anything else that failed on the replica.
    IoError = 3,
    /// A newer engine generation has connected: this connection's engine
    /// is superseded and nothing it sends is applied any more.
    Fenced = 4,
    /// Part of a read failed its checksums: the replica's copy is rotten in
    /// the ranges the data names, and the rest of the data read is good.
    /// Added within version 2: only a replica that checksums sends it, and
    /// only in answer to a read.
    Corrupt = 5,
}

impl Status {
    fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            0 => Status::Ok,
            1 => Status::InvalidArgument,
            2 => Status::NoSpace,
            3 => Status::IoError,
            4 => Status::Fenced,
            5 => Status::Corrupt,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub id: u64,
    pub status: Status,
    pub data: Bytes,
}

impl Response {
    pub fn ok(id: u64, data: Bytes) -> Self {
        Self {
            id,
            status: Status::Ok,
            data,
        }
    }

    pub fn error(id: u64, status: Status, message: impl std::fmt::Display) -> Self {
        Self {
            id,
            status,
            data: Bytes::from(message.to_string()),
        }
    }
}

/// The data of a `Corrupt` response: the rotten byte ranges (offset,
/// length) and the data read.
pub fn encode_corrupt(ranges: &[(u64, u64)], read: &[u8]) -> Bytes {
    let mut data = BytesMut::with_capacity(4 + ranges.len() * 16 + read.len());
    data.put_u32(u32::try_from(ranges.len()).unwrap_or(u32::MAX));
    for &(offset, len) in ranges {
        data.put_u64(offset);
        data.put_u64(len);
    }
    data.put_slice(read);
    data.freeze()
}

/// The ranges and read data of a `Corrupt` response; `None` if malformed.
pub fn decode_corrupt(mut data: Bytes) -> Option<(Vec<(u64, u64)>, Bytes)> {
    if data.len() < 4 {
        return None;
    }
    let count = usize::try_from(data.get_u32()).ok()?;
    if count == 0 || data.len() < count.checked_mul(16)? {
        return None;
    }
    let ranges = (0..count)
        .map(|_| (data.get_u64(), data.get_u64()))
        .collect();
    Some((ranges, data))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

fn check_header(magic: u16, version: u8) -> io::Result<()> {
    if magic != MAGIC {
        return Err(invalid(format!("bad magic {magic:#06x}")));
    }
    if version != VERSION {
        return Err(invalid(format!("unsupported protocol version {version}")));
    }
    Ok(())
}

/// The replica's side: decodes requests, encodes responses.
#[derive(Default)]
pub struct ServerCodec;

impl Decoder for ServerCodec {
    type Item = Request;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<Request>> {
        if src.len() < REQUEST_HEADER {
            return Ok(None);
        }
        let mut header = &src[..REQUEST_HEADER];
        check_header(header.get_u16(), header.get_u8())?;
        let op_byte = header.get_u8();
        let op = Op::from_u8(op_byte).ok_or_else(|| invalid(format!("unknown op {op_byte}")))?;
        let length = header.get_u32();
        let (id, offset) = (header.get_u64(), header.get_u64());
        if (op == Op::Read || op.carries_data()) && length > MAX_PAYLOAD {
            return Err(invalid(format!(
                "{op:?} of {length} bytes exceeds {MAX_PAYLOAD}"
            )));
        }
        let payload = if op.carries_data() {
            length as usize
        } else {
            0
        };
        if src.len() < REQUEST_HEADER + payload {
            src.reserve(REQUEST_HEADER + payload - src.len());
            return Ok(None);
        }
        src.advance(REQUEST_HEADER);
        let data = src.split_to(payload).freeze();
        Ok(Some(Request {
            id,
            op,
            offset,
            length,
            data,
        }))
    }
}

impl Encoder<Response> for ServerCodec {
    type Error = io::Error;

    fn encode(&mut self, response: Response, dst: &mut BytesMut) -> io::Result<()> {
        let length =
            u32::try_from(response.data.len()).map_err(|_| invalid("response too large".into()))?;
        dst.reserve(RESPONSE_HEADER + response.data.len());
        dst.put_u16(MAGIC);
        dst.put_u8(VERSION);
        dst.put_u8(response.status as u8);
        dst.put_u32(length);
        dst.put_u64(response.id);
        dst.put_slice(&response.data);
        Ok(())
    }
}

/// The engine's side: encodes requests, decodes responses.
#[derive(Default)]
pub struct ClientCodec;

impl Decoder for ClientCodec {
    type Item = Response;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<Response>> {
        if src.len() < RESPONSE_HEADER {
            return Ok(None);
        }
        let mut header = &src[..RESPONSE_HEADER];
        check_header(header.get_u16(), header.get_u8())?;
        let status_byte = header.get_u8();
        let status = Status::from_u8(status_byte)
            .ok_or_else(|| invalid(format!("unknown status {status_byte}")))?;
        let length = header.get_u32();
        let id = header.get_u64();
        if length > MAX_RESPONSE {
            return Err(invalid(format!(
                "response of {length} bytes exceeds {MAX_RESPONSE}"
            )));
        }
        let total = RESPONSE_HEADER + length as usize;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(RESPONSE_HEADER);
        let data = src.split_to(length as usize).freeze();
        Ok(Some(Response { id, status, data }))
    }
}

impl Encoder<Request> for ClientCodec {
    type Error = io::Error;

    fn encode(&mut self, request: Request, dst: &mut BytesMut) -> io::Result<()> {
        dst.reserve(REQUEST_HEADER + request.data.len());
        dst.put_u16(MAGIC);
        dst.put_u8(VERSION);
        dst.put_u8(request.op as u8);
        dst.put_u32(request.length);
        dst.put_u64(request.id);
        dst.put_u64(request.offset);
        dst.put_slice(&request.data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ops() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Read),
            Just(Op::Write),
            Just(Op::Flush),
            Just(Op::Unmap),
            Just(Op::Ping),
            Just(Op::Repair)
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip_even_when_split(op in ops(), id: u64, offset: u64,
                data in proptest::collection::vec(any::<u8>(), 0..9000), split in 0usize..9100) {
            let length = if op.carries_data() { data.len() as u32 } else { 4096 };
            let data = if op.carries_data() { Bytes::from(data) } else { Bytes::new() };
            let request = Request { id, op, offset, length, data };
            let mut wire = BytesMut::new();
            ClientCodec.encode(request.clone(), &mut wire).unwrap();
            let mut codec = ServerCodec;
            let split = split.min(wire.len());
            let mut buffer = BytesMut::from(&wire[..split]);
            let early = codec.decode(&mut buffer).unwrap();
            if split < wire.len() {
                prop_assert!(early.is_none());
                buffer.extend_from_slice(&wire[split..]);
                prop_assert_eq!(codec.decode(&mut buffer).unwrap(), Some(request));
            } else {
                prop_assert_eq!(early, Some(request));
            }
            prop_assert!(buffer.is_empty());
        }

        #[test]
        fn responses_round_trip(id: u64, data in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let response = Response::ok(id, Bytes::from(data));
            let mut wire = BytesMut::new();
            ServerCodec.encode(response.clone(), &mut wire).unwrap();
            prop_assert_eq!(ClientCodec.decode(&mut wire).unwrap(), Some(response));
        }

        #[test]
        fn garbage_is_an_error_or_a_wait_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut buffer = BytesMut::from(&bytes[..]);
            let _ = ServerCodec.decode(&mut buffer);
            let mut buffer = BytesMut::from(&bytes[..]);
            let _ = ClientCodec.decode(&mut buffer);
        }
    }

    fn header(magic: u16, version: u8, op: u8, length: u32) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_u16(magic);
        b.put_u8(version);
        b.put_u8(op);
        b.put_u32(length);
        b.put_u64(7);
        b.put_u64(0);
        b
    }

    #[test]
    fn rejects_bad_headers_with_a_reason() {
        let cases = [
            (header(0xdead, VERSION, 1, 4096), "bad magic"),
            (header(MAGIC, 9, 1, 4096), "unsupported protocol version 9"),
            (header(MAGIC, VERSION, 42, 4096), "unknown op 42"),
            (header(MAGIC, VERSION, 2, MAX_PAYLOAD + 1), "exceeds"),
        ];
        for (mut frame, reason) in cases {
            let error = ServerCodec.decode(&mut frame).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData);
            assert!(error.to_string().contains(reason), "{error}");
        }
    }

    #[test]
    fn a_corrupt_answer_carries_its_ranges_and_the_good_data() {
        let ranges = [(4096, 8192), (1 << 40, 4096)];
        let read = Bytes::from(vec![7u8; 3 * 4096]);
        let response = Response {
            id: 3,
            status: Status::Corrupt,
            data: encode_corrupt(&ranges, &read),
        };
        let mut wire = BytesMut::new();
        ServerCodec.encode(response, &mut wire).unwrap();
        let decoded = ClientCodec.decode(&mut wire).unwrap().unwrap();
        assert_eq!(decoded.status, Status::Corrupt);
        assert_eq!(decode_corrupt(decoded.data), Some((ranges.to_vec(), read)));
        for malformed in [&b""[..], &[0, 0, 0, 0], &[0, 0, 0, 2, 1]] {
            assert_eq!(decode_corrupt(Bytes::copy_from_slice(malformed)), None);
        }
    }

    /// The largest read, every other block rotten, still fits one answer.
    #[test]
    fn the_largest_corrupt_answer_fits() {
        let ranges: Vec<(u64, u64)> = (0..u64::from(MAX_PAYLOAD) / 4096)
            .step_by(2)
            .map(|b| (b * 4096, 4096))
            .collect();
        let data = encode_corrupt(&ranges, &vec![0; MAX_PAYLOAD as usize]);
        assert!(data.len() <= MAX_RESPONSE as usize, "{}", data.len());
    }

    #[test]
    fn a_large_unmap_is_not_a_payload() {
        let mut frame = header(MAGIC, VERSION, Op::Unmap as u8, u32::MAX);
        let request = ServerCodec.decode(&mut frame).unwrap().unwrap();
        assert_eq!(
            (request.op, request.length, request.data.len()),
            (Op::Unmap, u32::MAX, 0)
        );
    }
}
