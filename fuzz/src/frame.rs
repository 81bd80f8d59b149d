//! The `frame` target: bytes from the network through the data protocol
//! decoders, as tokio's `FramedRead` drives them.
//!
//! Input: the first byte picks the decoder (bit 0: the replica's
//! `ServerCodec`, decoding requests, or the engine's `ClientCodec`, decoding
//! responses) and how many bytes each read delivers (the other bits); the
//! rest is the byte stream. After each read the decoder runs until it
//! wants more bytes or fails (which ends the stream, as in `FramedRead`); at
//! the end of the stream `decode_eof` runs the same way.
//!
//! Findings (panics): a panic in a decoder; a decoded frame that does not
//! re-encode to exactly the bytes it consumed, or whose data disagrees with
//! its length; a decoder that consumes bytes without yielding a frame; a
//! decode that reserves room for more than one header and `MAX_PAYLOAD`
//! (`MAX_RESPONSE` for a response, which may carry a `Corrupt` read's
//! ranges too).

use bytes::BytesMut;
use oxhorn_dataplane::protocol::{
    ClientCodec, MAX_PAYLOAD, MAX_RESPONSE, Request, Response, ServerCodec,
};
use tokio_util::codec::{Decoder, Encoder};

/// Header sizes of the frame layout (dataplane/src/protocol/frame.rs).
const REQUEST_HEADER: usize = 24;
const RESPONSE_HEADER: usize = 16;

/// Bytes per read; `usize::MAX` delivers the whole stream at once.
pub(crate) const READS: [usize; 12] = [usize::MAX, 1, 2, 3, 7, 16, 23, 24, 25, 64, 4096, 8192];

pub fn frame(data: &[u8]) {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let read = READS[usize::from(first >> 1) % READS.len()];
    if first & 1 == 0 {
        let frame = Frame {
            header: REQUEST_HEADER,
            limit: REQUEST_HEADER + MAX_PAYLOAD as usize,
        };
        drive(ServerCodec, stream, read, frame, check_request);
    } else {
        let frame = Frame {
            header: RESPONSE_HEADER,
            limit: RESPONSE_HEADER + MAX_RESPONSE as usize,
        };
        drive(ClientCodec, stream, read, frame, check_response);
    }
}

/// A decoded request re-encodes (as the engine encodes it) to `wire`.
fn check_request(request: Request, wire: &[u8]) {
    if request.op.carries_data() {
        assert_eq!(request.data.len(), request.length as usize, "{request:?}");
    } else {
        assert!(request.data.is_empty(), "{request:?} carries data");
    }
    let mut out = BytesMut::new();
    ClientCodec.encode(request, &mut out).unwrap();
    assert_eq!(&out[..], wire, "request re-encodes differently");
}

/// A decoded response re-encodes (as the replica encodes it) to `wire`.
fn check_response(response: Response, wire: &[u8]) {
    let mut out = BytesMut::new();
    ServerCodec.encode(response, &mut out).unwrap();
    assert_eq!(&out[..], wire, "response re-encodes differently");
}

/// The bounds of a decoder's frames: its header's length (every frame has
/// at least that), and the longest frame it may reserve room for.
pub(crate) struct Frame {
    pub header: usize,
    pub limit: usize,
}

/// Feeds `stream` to `decoder` `read` bytes at a time, checking each item
/// against the bytes it was decoded from.
pub(crate) fn drive<D: Decoder>(
    mut decoder: D,
    stream: &[u8],
    read: usize,
    frame: Frame,
    mut check: impl FnMut(D::Item, &[u8]),
) {
    let Frame { header, limit } = frame;
    let mut buf = BytesMut::new();
    // Stream offsets: where `buf` starts, and how much was delivered.
    let (mut start, mut fed) = (0, 0);
    // Bytes split off the front of `buf`: its allocation is at most this
    // plus its capacity (a reallocation keeps the data's offset, a reclaim
    // moves it to the front), so the bound below is loose, never too tight.
    let mut split = 0;
    loop {
        let at_eof = fed == stream.len();
        loop {
            let (len, capacity) = (buf.len(), buf.capacity());
            let result = if at_eof {
                decoder.decode_eof(&mut buf)
            } else {
                decoder.decode(&mut buf)
            };
            // Growth beyond what the allocation itself might double to is
            // room the decoder asked for: at most one whole frame.
            let allocation = capacity + split;
            assert!(
                buf.capacity() <= allocation.saturating_mul(2).max(limit),
                "decode reserved {} bytes (allocation was {allocation}, limit {limit})",
                buf.capacity()
            );
            match result {
                Ok(Some(item)) => {
                    let used = len - buf.len();
                    assert!(used >= header, "a frame of {used} bytes");
                    check(item, &stream[start..start + used]);
                    start += used;
                    split += used;
                }
                Ok(None) => {
                    assert_eq!(buf.len(), len, "bytes consumed without a frame");
                    break;
                }
                // A protocol error ends the stream (the connection closes).
                Err(_) => return,
            }
        }
        if at_eof {
            return;
        }
        let n = read.min(stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
    }
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, Bytes};
    use oxhorn_dataplane::protocol::Op;

    use super::*;

    fn request(op: Op, length: u32, data: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let request = Request {
            id: 7,
            op,
            offset: 4096,
            length,
            data: Bytes::copy_from_slice(data),
        };
        ClientCodec.encode(request, &mut out).unwrap();
        out.to_vec()
    }

    #[test]
    fn valid_streams_decode_at_every_read_size() {
        let mut stream = request(Op::Write, 5, b"hello");
        stream.extend(request(Op::Read, 4096, b""));
        stream.extend(request(Op::Unmap, u32::MAX, b""));
        for selector in 0..READS.len() as u8 {
            frame(&[[selector << 1].as_slice(), &stream].concat());
        }
        let mut response = BytesMut::new();
        ServerCodec
            .encode(Response::ok(3, Bytes::from_static(b"data")), &mut response)
            .unwrap();
        response.put_slice(b"\x4f\x58\x01");
        for selector in 0..READS.len() as u8 {
            frame(&[[selector << 1 | 1].as_slice(), &response].concat());
        }
    }

    #[test]
    fn a_frame_declaring_the_largest_payload_is_waited_for() {
        let mut header = request(Op::Write, MAX_PAYLOAD, b"");
        header.truncate(REQUEST_HEADER);
        frame(&[[0].as_slice(), &header].concat());
    }
}
