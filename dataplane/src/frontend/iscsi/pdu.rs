//! iSCSI PDUs on the wire (RFC 7143 §11): the 48-byte Basic Header Segment,
//! additional header segments, the optional header digest, the data segment
//! padded to 4 bytes, the optional data digest.
//!
//! The codec frames and checks; what a PDU means is the session's business.
//! Anything that cannot be framed safely (a data segment longer than this
//! side declared it receives, a digest that does not match) is an error that
//! ends the connection: at ErrorRecoveryLevel 0, a connection whose byte
//! stream is in doubt is dropped and the initiator recovers the session.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// Length of a CRC32C digest.
const DIGEST_LEN: usize = 4;
/// The data segment a side receives before MaxRecvDataSegmentLength is
/// negotiated (RFC 7143 §13.12: the default, which also bounds login PDUs).
pub const DEFAULT_MAX_RECV_DATA: u32 = 8192;
/// The largest data segment the length field can express.
pub const MAX_DATA_SEGMENT: u32 = (1 << 24) - 1;

/// The opcodes (RFC 7143 §11.1.1), initiator's below 0x20, target's above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    NopOut = 0x00,
    ScsiCommand = 0x01,
    TaskManagement = 0x02,
    Login = 0x03,
    Text = 0x04,
    DataOut = 0x05,
    Logout = 0x06,
    Snack = 0x10,
    NopIn = 0x20,
    ScsiResponse = 0x21,
    TaskManagementResponse = 0x22,
    LoginResponse = 0x23,
    TextResponse = 0x24,
    DataIn = 0x25,
    LogoutResponse = 0x26,
    ReadyToTransfer = 0x31,
    AsyncMessage = 0x32,
    Reject = 0x3f,
}

impl Opcode {
    pub fn from_u8(value: u8) -> Option<Self> {
        use Opcode::*;
        Some(match value {
            0x00 => NopOut,
            0x01 => ScsiCommand,
            0x02 => TaskManagement,
            0x03 => Login,
            0x04 => Text,
            0x05 => DataOut,
            0x06 => Logout,
            0x10 => Snack,
            0x20 => NopIn,
            0x21 => ScsiResponse,
            0x22 => TaskManagementResponse,
            0x23 => LoginResponse,
            0x24 => TextResponse,
            0x25 => DataIn,
            0x26 => LogoutResponse,
            0x31 => ReadyToTransfer,
            0x32 => AsyncMessage,
            0x3f => Reject,
            _ => return None,
        })
    }
}

/// A Basic Header Segment. The fields every PDU shares have accessors; the
/// opcode-specific ones are read and written by offset (RFC 7143 §11) by
/// the layer that knows the opcode.
#[derive(Clone, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl Bhs {
    /// A header of `opcode` with every other field zero.
    pub fn new(opcode: Opcode) -> Self {
        let mut bytes = [0; BHS_LEN];
        bytes[0] = opcode as u8;
        Self(bytes)
    }

    /// The raw opcode (6 bits); [`Opcode::from_u8`] says whether it is known.
    pub fn raw_opcode(&self) -> u8 {
        self.0[0] & 0x3f
    }

    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.raw_opcode())
    }

    /// The I bit: an immediate command, outside the CmdSN window.
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }

    pub fn set_immediate(&mut self, on: bool) {
        set_bit(&mut self.0[0], 0x40, on);
    }

    /// The F bit: the final PDU of a sequence.
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }

    pub fn set_final(&mut self, on: bool) {
        set_bit(&mut self.0[1], 0x80, on);
    }

    /// Bytes of additional header segments, a multiple of 4.
    pub fn total_ahs_len(&self) -> usize {
        usize::from(self.0[4]) * 4
    }

    pub fn data_segment_len(&self) -> u32 {
        u32::from_be_bytes([0, self.0[5], self.0[6], self.0[7]])
    }

    /// Sets the data segment length; the encoder does it from the data.
    fn set_data_segment_len(&mut self, len: u32) {
        let [_, a, b, c] = len.to_be_bytes();
        self.0[5..8].copy_from_slice(&[a, b, c]);
    }

    pub fn lun(&self) -> u64 {
        self.u64_at(8)
    }

    pub fn set_lun(&mut self, lun: u64) {
        self.set_u64_at(8, lun);
    }

    pub fn initiator_task_tag(&self) -> u32 {
        self.u32_at(16)
    }

    pub fn set_initiator_task_tag(&mut self, tag: u32) {
        self.set_u32_at(16, tag);
    }

    /// The big-endian u32 at `offset`, one of the field offsets of RFC 7143
    /// §11 (each within the header, so the slice cannot fail).
    pub fn u32_at(&self, offset: usize) -> u32 {
        let mut field = [0; 4];
        field.copy_from_slice(&self.0[offset..offset + 4]);
        u32::from_be_bytes(field)
    }

    pub fn set_u32_at(&mut self, offset: usize, value: u32) {
        self.0[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
    }

    pub fn u64_at(&self, offset: usize) -> u64 {
        let mut field = [0; 8];
        field.copy_from_slice(&self.0[offset..offset + 8]);
        u64::from_be_bytes(field)
    }

    pub fn set_u64_at(&mut self, offset: usize, value: u64) {
        self.0[offset..offset + 8].copy_from_slice(&value.to_be_bytes());
    }
}

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bhs")
            .field("opcode", &format_args!("{:#04x}", self.raw_opcode()))
            .field("immediate", &self.immediate())
            .field("final", &self.final_bit())
            .field("ahs", &self.total_ahs_len())
            .field("data", &self.data_segment_len())
            .field("itt", &format_args!("{:#x}", self.initiator_task_tag()))
            .finish()
    }
}

fn set_bit(byte: &mut u8, mask: u8, on: bool) {
    if on {
        *byte |= mask;
    } else {
        *byte &= !mask;
    }
}

/// One PDU: its header, additional header segments and data segment
/// (without padding or digests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: Bhs,
    pub ahs: Bytes,
    pub data: Bytes,
}

impl Pdu {
    pub fn new(bhs: Bhs, data: Bytes) -> Self {
        Self {
            bhs,
            ahs: Bytes::new(),
            data,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PduError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("a data segment of {len} bytes exceeds the {max} bytes declared")]
    DataSegmentTooLong { len: u32, max: u32 },
    #[error("header digest {got:#010x} does not match the header's {computed:#010x}")]
    HeaderDigest { got: u32, computed: u32 },
    #[error("data digest {got:#010x} does not match the data's {computed:#010x}")]
    DataDigest { got: u32, computed: u32 },
    #[error("additional header segments of {0} bytes: not a multiple of 4, or over 1020")]
    AhsLength(usize),
    #[error("the stream ended inside a PDU")]
    Truncated,
}

/// Frames PDUs in both directions. Digests start once the login that
/// negotiated them completes, and the data segment limit changes with the
/// negotiation: the session sets both as it goes.
#[derive(Clone, Debug)]
pub struct PduCodec {
    /// The longest data segment this side accepts: what it declared as its
    /// MaxRecvDataSegmentLength.
    pub max_recv_data: u32,
    pub header_digest: bool,
    pub data_digest: bool,
}

impl Default for PduCodec {
    fn default() -> Self {
        Self {
            max_recv_data: DEFAULT_MAX_RECV_DATA,
            header_digest: false,
            data_digest: false,
        }
    }
}

/// Bytes the data segment takes on the wire, padded to 4.
fn padded(len: usize) -> usize {
    len.next_multiple_of(4)
}

/// The CRC32C digest as RFC 7143 §13.1 sends it: least significant byte
/// first.
pub fn digest(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}

impl PduCodec {
    /// Bytes of the whole PDU whose header is `bhs`.
    fn wire_len(&self, bhs: &Bhs) -> usize {
        let data = bhs.data_segment_len() as usize;
        let mut len = BHS_LEN + bhs.total_ahs_len() + padded(data);
        if self.header_digest {
            len += DIGEST_LEN;
        }
        if self.data_digest && data > 0 {
            len += DIGEST_LEN;
        }
        len
    }
}

impl Decoder for PduCodec {
    type Item = Pdu;
    type Error = PduError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Pdu>, PduError> {
        if src.len() < BHS_LEN {
            src.reserve(BHS_LEN - src.len());
            return Ok(None);
        }
        let mut header = [0; BHS_LEN];
        header.copy_from_slice(&src[..BHS_LEN]);
        let bhs = Bhs(header);
        let data_len = bhs.data_segment_len();
        // Checked before waiting for the data, so a bad length never makes
        // the connection buffer it.
        if data_len > self.max_recv_data {
            return Err(PduError::DataSegmentTooLong {
                len: data_len,
                max: self.max_recv_data,
            });
        }
        let whole = self.wire_len(&bhs);
        if src.len() < whole {
            src.reserve(whole - src.len());
            return Ok(None);
        }
        let mut pdu = src.split_to(whole).freeze();
        let headers = pdu.split_to(BHS_LEN + bhs.total_ahs_len());
        if self.header_digest {
            let got = pdu.get_u32_le();
            let computed = digest(&[&headers]);
            if got != computed {
                return Err(PduError::HeaderDigest { got, computed });
            }
        }
        let ahs = headers.slice(BHS_LEN..);
        let data_len = data_len as usize;
        let mut data = pdu.split_to(padded(data_len));
        if self.data_digest && data_len > 0 {
            let got = pdu.get_u32_le();
            let computed = digest(&[&data]);
            if got != computed {
                return Err(PduError::DataDigest { got, computed });
            }
        }
        data.truncate(data_len);
        Ok(Some(Pdu { bhs, ahs, data }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Pdu>, PduError> {
        match self.decode(src)? {
            Some(pdu) => Ok(Some(pdu)),
            None if src.is_empty() => Ok(None),
            None => Err(PduError::Truncated),
        }
    }
}

impl Encoder<Pdu> for PduCodec {
    type Error = PduError;

    /// Writes `pdu` with its lengths set from its segments. The data
    /// segment is bounded by what the peer declared it receives, which the
    /// session checks when it splits data into PDUs.
    fn encode(&mut self, mut pdu: Pdu, dst: &mut BytesMut) -> Result<(), PduError> {
        if !pdu.ahs.len().is_multiple_of(4) || pdu.ahs.len() > 255 * 4 {
            return Err(PduError::AhsLength(pdu.ahs.len()));
        }
        let data_len = u32::try_from(pdu.data.len()).unwrap_or(u32::MAX);
        if data_len > MAX_DATA_SEGMENT {
            return Err(PduError::DataSegmentTooLong {
                len: data_len,
                max: MAX_DATA_SEGMENT,
            });
        }
        pdu.bhs.set_data_segment_len(data_len);
        // At most 255 words, checked above.
        pdu.bhs.0[4] = (pdu.ahs.len() / 4) as u8;
        dst.reserve(self.wire_len(&pdu.bhs));
        let start = dst.len();
        dst.put_slice(&pdu.bhs.0);
        dst.put_slice(&pdu.ahs);
        if self.header_digest {
            let crc = digest(&[&dst[start..]]);
            dst.put_u32_le(crc);
        }
        if pdu.data.is_empty() {
            return Ok(());
        }
        let pad = padded(pdu.data.len()) - pdu.data.len();
        let data_start = dst.len();
        dst.put_slice(&pdu.data);
        dst.put_bytes(0, pad);
        if self.data_digest {
            let crc = digest(&[&dst[data_start..]]);
            dst.put_u32_le(crc);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(codec: &mut PduCodec, pdu: Pdu) -> BytesMut {
        let mut wire = BytesMut::new();
        codec.encode(pdu.clone(), &mut wire).unwrap();
        let mut decoding = wire.clone();
        let decoded = codec.decode(&mut decoding).unwrap().unwrap();
        assert!(decoding.is_empty());
        assert_eq!(decoded.ahs, pdu.ahs);
        assert_eq!(decoded.data, pdu.data);
        assert_eq!(decoded.bhs.data_segment_len() as usize, pdu.data.len());
        wire
    }

    fn command(data: &'static [u8]) -> Pdu {
        let mut bhs = Bhs::new(Opcode::ScsiCommand);
        bhs.set_final(true);
        bhs.set_initiator_task_tag(0x1234_5678);
        bhs.set_lun(1 << 48);
        Pdu::new(bhs, Bytes::from_static(data))
    }

    #[test]
    fn the_digest_is_rfc_7143s_crc32c_least_significant_byte_first() {
        // RFC 3720 §B.4: 32 bytes of zeros give aa 36 91 8a on the wire.
        let crc = digest(&[&[0; 32]]);
        assert_eq!(crc.to_le_bytes(), [0xaa, 0x36, 0x91, 0x8a]);
        // The ascending bytes 0..31 give 4e 79 dd 46.
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(
            digest(&[&ascending]).to_le_bytes(),
            [0x4e, 0x79, 0xdd, 0x46]
        );
    }

    #[test]
    fn a_pdu_is_its_header_then_its_data_padded_to_four_bytes() {
        let wire = round_trip(&mut PduCodec::default(), command(b"hello"));
        assert_eq!(wire.len(), BHS_LEN + 8);
        assert_eq!(&wire[5..8], &[0, 0, 5]);
        assert_eq!(&wire[BHS_LEN..], b"hello\0\0\0");
        assert_eq!(wire[0], 0x01);
        assert_eq!(wire[1], 0x80);
        assert_eq!(&wire[16..20], &[0x12, 0x34, 0x56, 0x78]);
    }

    #[test]
    fn digests_cover_the_headers_and_the_padded_data() {
        let mut codec = PduCodec {
            header_digest: true,
            data_digest: true,
            ..Default::default()
        };
        let wire = round_trip(&mut codec, command(b"hello"));
        assert_eq!(wire.len(), BHS_LEN + 4 + 8 + 4);
        let header_crc = u32::from_le_bytes(wire[BHS_LEN..BHS_LEN + 4].try_into().unwrap());
        assert_eq!(header_crc, digest(&[&wire[..BHS_LEN]]));
        let data_crc = u32::from_le_bytes(wire[wire.len() - 4..].try_into().unwrap());
        assert_eq!(data_crc, digest(&[b"hello\0\0\0"]));
        // No data, no data digest.
        let wire = round_trip(&mut codec, command(b""));
        assert_eq!(wire.len(), BHS_LEN + 4);
    }

    #[test]
    fn a_flipped_bit_under_a_digest_fails_the_pdu() {
        let mut codec = PduCodec {
            header_digest: true,
            data_digest: true,
            ..Default::default()
        };
        let wire = round_trip(&mut codec, command(b"data"));
        let mut header = wire.clone();
        header[20] ^= 1;
        assert!(matches!(
            codec.decode(&mut header),
            Err(PduError::HeaderDigest { .. })
        ));
        let mut data = wire.clone();
        data[BHS_LEN + 4] ^= 1;
        assert!(matches!(
            codec.decode(&mut data),
            Err(PduError::DataDigest { .. })
        ));
    }

    #[test]
    fn a_data_segment_over_the_declared_limit_is_refused_before_it_arrives() {
        let mut codec = PduCodec::default();
        let mut bhs = Bhs::new(Opcode::DataOut);
        bhs.set_data_segment_len(DEFAULT_MAX_RECV_DATA + 1);
        let mut wire = BytesMut::from(&bhs.0[..]);
        assert!(matches!(
            codec.decode(&mut wire),
            Err(PduError::DataSegmentTooLong {
                len: 8193,
                max: 8192
            })
        ));
        codec.max_recv_data = 1 << 18;
        assert!(
            codec.decode(&mut wire).unwrap().is_none(),
            "waits for the data"
        );
    }

    #[test]
    fn a_pdu_arriving_a_byte_at_a_time_is_framed_once_whole() {
        let mut codec = PduCodec::default();
        let mut ahs_pdu = command(b"xyz");
        ahs_pdu.ahs = Bytes::from_static(&[0, 4, 1, 0, 9, 9, 9, 9]);
        let mut wire = BytesMut::new();
        codec.encode(ahs_pdu.clone(), &mut wire).unwrap();
        codec.encode(command(b""), &mut wire).unwrap();
        let mut buffer = BytesMut::new();
        let mut decoded = Vec::new();
        for byte in wire.iter() {
            buffer.put_u8(*byte);
            while let Some(pdu) = codec.decode(&mut buffer).unwrap() {
                decoded.push(pdu);
            }
        }
        assert_eq!(decoded.len(), 2);
        assert_eq!(decoded[0].ahs, ahs_pdu.ahs);
        assert_eq!(decoded[0].data, ahs_pdu.data);
        assert!(codec.decode_eof(&mut buffer).unwrap().is_none());
        buffer.put_slice(&wire[..10]);
        assert!(matches!(
            codec.decode_eof(&mut buffer),
            Err(PduError::Truncated)
        ));
    }

    #[test]
    fn every_opcode_reads_back_and_unknown_ones_are_none() {
        for value in 0..=0x3f {
            if let Some(opcode) = Opcode::from_u8(value) {
                assert_eq!(opcode as u8, value);
                assert_eq!(Bhs::new(opcode).opcode(), Some(opcode));
            }
        }
        assert_eq!(Opcode::from_u8(0x07), None);
        let mut bhs = Bhs::new(Opcode::NopOut);
        bhs.set_immediate(true);
        assert!(bhs.immediate());
        assert_eq!(bhs.opcode(), Some(Opcode::NopOut));
    }
}
