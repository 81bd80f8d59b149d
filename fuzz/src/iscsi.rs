//! The `iscsi` target: bytes from an initiator through the iSCSI target's
//! PDU decoder, as tokio's `FramedRead` drives it, the data of each Login
//! and Text PDU through the text parser, and the PDUs through a login, as
//! a connection would until its login fails or completes; after a login
//! that completes, the Data-Out PDUs through the gathering of one write's
//! data with the negotiated values, as the full feature phase would.
//!
//! Input: the first byte picks the digests (bit 0: header, bit 1: data),
//! the declared MaxRecvDataSegmentLength (bits 2-3) and how many bytes each
//! read delivers (the other bits); the rest is the byte stream.
//!
//! Findings (panics): a panic in the decoder or the parser; a decoded PDU
//! whose headers differ from the bytes it came from, that re-encodes to
//! another length or decodes back to another PDU; a data segment longer
//! than declared; a parsed text that does not parse back to itself from its
//! encoding; a decoder that consumes bytes without yielding a PDU or
//! reserves room for more than one PDU; a login answering with anything
//! but a Login Response, or with more than 8192 bytes of text; a write
//! keeping more than its command takes, asking for data past it, or
//! complete with another length.

use bytes::{Bytes, BytesMut};
use oxhorn_dataplane::frontend::iscsi::data_out::{DataOutPdu, Gathering};
use oxhorn_dataplane::frontend::iscsi::login::{Login, Step, TargetIdentity};
use oxhorn_dataplane::frontend::iscsi::negotiate::Parameters;
use oxhorn_dataplane::frontend::iscsi::pdu::{
    BHS_LEN, DEFAULT_MAX_RECV_DATA, Opcode, Pdu, PduCodec,
};
use oxhorn_dataplane::frontend::iscsi::text::Text;
use tokio_util::codec::{Decoder, Encoder};

use crate::frame::{Frame, READS, drive};

/// MaxRecvDataSegmentLength values: the smallest allowed, the default, a
/// usual one, the largest.
const MAX_RECV: [u32; 4] = [512, 8192, 262_144, (1 << 24) - 1];
/// Additional header segments, both digests and padding.
const BEYOND_DATA: usize = 255 * 4 + 4 + 4 + 3;

pub fn iscsi(data: &[u8]) {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let codec = PduCodec {
        header_digest: first & 1 != 0,
        data_digest: first & 2 != 0,
        max_recv_data: MAX_RECV[usize::from(first >> 2) & 3],
    };
    let read = READS[usize::from(first >> 4) % READS.len()];
    let frame = Frame {
        header: BHS_LEN,
        limit: BHS_LEN + codec.max_recv_data as usize + BEYOND_DATA,
    };
    let checker = codec.clone();
    let target = TargetIdentity {
        name: "iqn.2026-01.io.oxhorn:vol".into(),
        chap: None,
    };
    // Until its login ends, the connection hands every PDU to the login;
    // then Data-Out PDUs go to a write of 64 KiB taking 40 KiB.
    let mut login = Some(Login::new(target, 1, 0));
    let mut write = None;
    drive(codec, stream, read, frame, |pdu, wire| {
        check(&checker, pdu.clone(), wire);
        if let Some(running) = &mut login {
            match log_in(running, &pdu) {
                Phase::LoggingIn => {}
                Phase::Failed => login = None,
                Phase::Done(parameters) => {
                    login = None;
                    write = Gathering::new(
                        &parameters,
                        EXPECTED,
                        WANTED,
                        Bytes::new(),
                        first & 0x80 != 0,
                    )
                    .ok();
                }
            }
        } else if let Some(gathering) = &mut write
            && pdu.bhs.opcode() == Some(Opcode::DataOut)
            && gather(gathering, pdu)
            && let Some(done) = write.take()
        {
            assert_eq!(done.into_data().len(), WANTED as usize);
        }
    });
}

const EXPECTED: u32 = 64 << 10;
const WANTED: u32 = 40 << 10;

enum Phase {
    LoggingIn,
    Failed,
    Done(Box<Parameters>),
}

/// One step of the login.
fn log_in(login: &mut Login, pdu: &Pdu) -> Phase {
    let (response, phase) = match login.step(pdu) {
        Step::Continue(response) => (response, Phase::LoggingIn),
        Step::Complete {
            response,
            parameters,
            ..
        } => (response, Phase::Done(parameters)),
        Step::Fail(response, _) => (response, Phase::Failed),
    };
    assert_eq!(response.bhs.opcode(), Some(Opcode::LoginResponse));
    assert!(response.data.len() <= DEFAULT_MAX_RECV_DATA as usize);
    phase
}

/// One Data-Out PDU into a write's gathering, which must never ask for
/// data past what the command takes; true once it is complete.
fn gather(gathering: &mut Gathering, pdu: Pdu) -> bool {
    let received = gathering.receive(DataOutPdu {
        ttt: pdu.bhs.u32_at(20),
        data_sn: pdu.bhs.u32_at(36),
        offset: pdu.bhs.u32_at(40),
        final_bit: pdu.bhs.final_bit(),
        data: pdu.data,
    });
    if received.is_err() {
        return false;
    }
    let mut ttt = 0;
    for r2t in gathering.r2ts(|| {
        ttt += 1;
        ttt
    }) {
        assert!(
            r2t.length > 0 && r2t.offset + r2t.length <= WANTED,
            "{r2t:?}"
        );
    }
    gathering.complete()
}

fn check(codec: &PduCodec, pdu: Pdu, wire: &[u8]) {
    assert!(pdu.data.len() <= codec.max_recv_data as usize);
    let headers = BHS_LEN + pdu.ahs.len();
    assert_eq!(&wire[..BHS_LEN], &pdu.bhs.0[..], "the header changed");
    assert_eq!(&wire[BHS_LEN..headers], &pdu.ahs[..], "the AHS changed");
    let mut out = BytesMut::new();
    let mut codec = codec.clone();
    codec.encode(pdu.clone(), &mut out).unwrap();
    assert_eq!(out.len(), wire.len(), "re-encodes to another length");
    let again = codec.decode(&mut out).unwrap().unwrap();
    assert_eq!(again, pdu, "decodes back differently");
    if matches!(pdu.bhs.opcode(), Some(Opcode::Login | Opcode::Text))
        && let Ok(text) = Text::parse(&pdu.data)
    {
        assert_eq!(Text::parse(&text.encode()), Ok(text));
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use oxhorn_dataplane::frontend::iscsi::pdu::Bhs;

    use super::*;

    #[test]
    fn valid_streams_decode_at_every_read_size_and_setting() {
        let mut login = Bhs::new(Opcode::Login);
        login.set_final(true);
        let text = b"InitiatorName=iqn.x\0SessionType=Discovery\0";
        for selector in 0..=u8::MAX {
            let codec = PduCodec {
                header_digest: selector & 1 != 0,
                data_digest: selector & 2 != 0,
                max_recv_data: MAX_RECV[usize::from(selector >> 2) & 3],
            };
            let mut stream = BytesMut::new();
            let mut encoder = codec.clone();
            let pdu = Pdu::new(login.clone(), Bytes::from_static(text));
            encoder.encode(pdu, &mut stream).unwrap();
            let empty = Pdu::new(Bhs::new(Opcode::NopOut), Bytes::new());
            encoder.encode(empty, &mut stream).unwrap();
            iscsi(&[&[selector], &stream[..]].concat());
        }
    }
}
