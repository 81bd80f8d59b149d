//! The kubelet's plugin watcher dials the registration socket by its path,
//! and grpc-go then sends that path, percent-encoded, as the HTTP/2
//! `:authority` (`tmp%2F...%2Fdriver.oxhorn.io-reg.sock`), which h2 under
//! tonic refuses as malformed (hyperium/h2#487). The kubelet's CSI client
//! sends `localhost` instead; its registration client does not.
//!
//! So each registration connection is relayed to the server with
//! `:authority` replaced by `localhost`: the header blocks the kubelet sends
//! are decoded and encoded again (each direction keeps its own HPACK
//! state); every other frame, and everything the server sends, passes
//! unchanged. A malformed frame or header block closes that connection.

use std::io::{Error, ErrorKind, Result};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame either side may send: HTTP/2's default
/// SETTINGS_MAX_FRAME_SIZE, which neither the kubelet nor tonic raises.
const MAX_FRAME: usize = 16_384;
/// A header block (HEADERS and its CONTINUATIONs) larger than this closes
/// the connection: a registration call's headers are a few hundred bytes.
const MAX_HEADER_BLOCK: usize = 64 << 10;
const AUTHORITY: &[u8] = b":authority";
const LOCALHOST: &[u8] = b"localhost";

fn malformed(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidData, what.into())
}

/// Relays one connection between `client` (the kubelet) and `server`
/// until either side closes it.
pub(super) async fn relay<C, S>(client: C, server: S) -> Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, server_write) = tokio::io::split(server);
    tokio::select! {
        forward = rewrite_authority(client_read, server_write) => forward,
        back = tokio::io::copy(&mut server_read, &mut client_write) => back.map(drop),
    }
}

/// One frame's header fields.
struct FrameHead {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

async fn read_head(from: &mut (impl AsyncRead + Unpin)) -> Result<Option<FrameHead>> {
    let mut head = [0u8; 9];
    match from.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    if length > MAX_FRAME {
        return Err(malformed(format!("a frame of {length} bytes")));
    }
    Ok(Some(FrameHead {
        length,
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
    }))
}

fn head_bytes(length: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    // At most MAX_FRAME, which fits in 24 bits.
    let length = (length as u32).to_be_bytes();
    let stream = stream.to_be_bytes();
    [
        length[1], length[2], length[3], kind, flags, stream[0], stream[1], stream[2], stream[3],
    ]
}

/// The header block fragment of a HEADERS frame: without its padding and
/// priority fields.
fn fragment(flags: u8, payload: &[u8]) -> Result<&[u8]> {
    let mut rest = payload;
    let mut padding = 0;
    if flags & PADDED != 0 {
        let (&length, after) = rest
            .split_first()
            .ok_or_else(|| malformed("a padded HEADERS frame without its pad length"))?;
        padding = usize::from(length);
        rest = after;
    }
    if flags & PRIORITY != 0 {
        rest = rest
            .get(5..)
            .ok_or_else(|| malformed("a HEADERS frame too short for its priority"))?;
    }
    let end = rest
        .len()
        .checked_sub(padding)
        .ok_or_else(|| malformed("HEADERS padding longer than the frame"))?;
    Ok(&rest[..end])
}

/// A header block being collected from HEADERS and CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    bytes: Vec<u8>,
}

/// Copies frames from `from` to `to`, re-encoding every header block with
/// `:authority` set to `localhost`.
async fn rewrite_authority(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> Result<()> {
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(malformed("not an HTTP/2 connection preface"));
    }
    to.write_all(&preface).await?;
    let (mut decoder, mut encoder) = (Decoder::new(), Encoder::new());
    let mut block: Option<Block> = None;
    while let Some(head) = read_head(&mut from).await? {
        let mut payload = vec![0; head.length];
        from.read_exact(&mut payload).await?;
        match (head.kind, &mut block) {
            (HEADERS, None) => {
                block = Some(Block {
                    stream: head.stream,
                    end_stream: head.flags & END_STREAM != 0,
                    bytes: fragment(head.flags, &payload)?.to_vec(),
                })
            }
            (CONTINUATION, Some(open)) if open.stream == head.stream => {
                open.bytes.extend_from_slice(&payload);
                if open.bytes.len() > MAX_HEADER_BLOCK {
                    return Err(malformed("a header block over 64 KiB"));
                }
            }
            (_, Some(_)) | (CONTINUATION, None) => {
                return Err(malformed("a header block interrupted"));
            }
            (_, None) => {
                to.write_all(&head_bytes(head.length, head.kind, head.flags, head.stream))
                    .await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if head.flags & END_HEADERS != 0
            && let Some(done) = block.take()
        {
            let headers = decoder
                .decode(&done.bytes)
                .map_err(|e| malformed(format!("header block: {e}")))?;
            let encoded = encoder.encode(headers.iter().map(|(name, value)| {
                let value = if name == AUTHORITY { LOCALHOST } else { value };
                (name.as_slice(), value)
            }));
            write_block(&mut to, &done, &encoded).await?;
        }
    }
    to.shutdown().await
}

/// Writes `encoded` as a HEADERS frame and as many CONTINUATIONs as it
/// takes.
async fn write_block(
    to: &mut (impl AsyncWrite + Unpin),
    block: &Block,
    encoded: &[u8],
) -> Result<()> {
    let chunks: Vec<&[u8]> = if encoded.is_empty() {
        vec![encoded]
    } else {
        encoded.chunks(MAX_FRAME).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let (kind, mut flags) = if i == 0 {
            (HEADERS, if block.end_stream { END_STREAM } else { 0 })
        } else {
            (CONTINUATION, 0)
        };
        if i == last {
            flags |= END_HEADERS;
        }
        to.write_all(&head_bytes(chunk.len(), kind, flags, block.stream))
            .await?;
        to.write_all(chunk).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = head_bytes(payload.len(), kind, flags, stream).to_vec();
        out.extend_from_slice(payload);
        out
    }

    /// Runs `input` through the rewriting direction; what reaches the
    /// server.
    async fn rewritten(input: Vec<u8>) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        rewrite_authority(&input[..], &mut out).await?;
        Ok(out)
    }

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    /// The header blocks in `bytes` (after the preface), decoded, with their
    /// END_STREAM flag and stream.
    fn blocks(bytes: &[u8]) -> Vec<(u8, u32, Headers)> {
        let mut decoder = Decoder::new();
        let mut rest = &bytes[24..];
        let mut out = Vec::new();
        let mut pending = Vec::new();
        while rest.len() >= 9 {
            let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let (kind, flags) = (rest[3], rest[4]);
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            let payload = &rest[9..9 + length];
            if kind == HEADERS || kind == CONTINUATION {
                pending.extend_from_slice(payload);
                if flags & END_HEADERS != 0 {
                    let headers = decoder.decode(&pending).unwrap();
                    out.push((flags & END_STREAM, stream, headers));
                    pending.clear();
                }
            }
            rest = &rest[9 + length..];
        }
        out
    }

    fn request(authority: &[u8]) -> Vec<(&[u8], &[u8])> {
        vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
        ]
    }

    #[tokio::test]
    async fn the_authority_becomes_localhost_and_the_rest_is_kept() {
        let path = b"tmp%2Foxhorn-node-x%2Fkubelet%2Fplugins_registry%2Fdriver.oxhorn.io-reg.sock";
        let mut client = Encoder::new();
        let first = client.encode(request(path));
        // The second request's headers come from the dynamic table.
        let second = client.encode(request(path));
        let settings = frame(0x4, 0, 0, &[]);
        let data = frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0]);
        // The first block split over a padded HEADERS and a CONTINUATION.
        let (a, b) = first.split_at(10);
        let mut padded = vec![3];
        padded.extend_from_slice(a);
        padded.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(settings.clone());
        input.extend(frame(HEADERS, PADDED, 1, &padded));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(data.clone());
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));

        let out = rewritten(input).await.unwrap();
        let expected: Headers = request(LOCALHOST)
            .into_iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(
            blocks(&out),
            [(0, 1, expected.clone()), (END_STREAM, 3, expected)]
        );
        let contains = |needle: &[u8]| out.windows(needle.len()).any(|w| w == needle);
        assert!(
            contains(&settings) && contains(&data),
            "other frames pass as they were"
        );
    }

    #[tokio::test]
    async fn malformed_input_closes_the_connection() {
        let not_http2 = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert!(rewritten(not_http2).await.is_err(), "not HTTP/2");
        let mut oversized = PREFACE.to_vec();
        oversized.extend(head_bytes(MAX_FRAME, 0x0, 0, 1));
        oversized[24] = 0xff;
        assert!(
            rewritten(oversized).await.is_err(),
            "a frame over the maximum"
        );
        let mut garbage = PREFACE.to_vec();
        garbage.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff]));
        assert!(
            rewritten(garbage).await.is_err(),
            "an undecodable header block"
        );
        let mut interrupted = PREFACE.to_vec();
        interrupted.extend(frame(HEADERS, 0, 1, &[0x82]));
        interrupted.extend(frame(0x0, 0, 1, &[]));
        assert!(
            rewritten(interrupted).await.is_err(),
            "DATA inside a header block"
        );
        let mut padding = PREFACE.to_vec();
        padding.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[9, 0x82]));
        assert!(rewritten(padding).await.is_err(), "padding past the frame");
    }
}
