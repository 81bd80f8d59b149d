//! The data of one write as it arrives (RFC 7143 §4.2.5, §11.7): immediate
//! data in the command PDU, then unsolicited Data-Out PDUs up to
//! FirstBurstLength, then a sequence for each R2T the target sends for the
//! rest. Data comes in order (DataPDUInOrder and DataSequenceInOrder are
//! Yes), so every PDU must start where the last one ended, within the
//! sequence it names, with the next DataSN of that sequence. Pure: the
//! connection feeds it PDUs and sends the R2Ts it asks for.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::negotiate::Parameters;

/// The Target Transfer Tag of data no R2T asked for.
pub const UNSOLICITED: u32 = 0xffff_ffff;

/// An R2T to send: which part of the data to send next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2t {
    pub ttt: u32,
    pub r2t_sn: u32,
    pub offset: u32,
    pub length: u32,
}

/// The fields of a Data-Out PDU this needs.
#[derive(Clone, Debug)]
pub struct DataOutPdu {
    pub ttt: u32,
    pub data_sn: u32,
    pub offset: u32,
    pub final_bit: bool,
    pub data: Bytes,
}

/// A Data-Out or immediate data that breaks the rules: the connection
/// cannot go on (ErrorRecoveryLevel 0).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("immediate data when ImmediateData=No")]
    ImmediateDataRefused,
    #[error("unsolicited data when InitialR2T=Yes")]
    UnsolicitedDataRefused,
    #[error("{0} bytes of unsolicited data exceed FirstBurstLength")]
    FirstBurstExceeded(u64),
    #[error("data at offset {offset} when {expected} was next")]
    OutOfOrder { offset: u32, expected: u32 },
    #[error("data up to {end} past the expected transfer length {expected}")]
    PastTransferLength { end: u64, expected: u32 },
    #[error("data with target transfer tag {0:#x}, which no R2T outstanding has")]
    UnknownTransferTag(u32),
    #[error("data up to {end} past the R2T's end {limit}")]
    PastR2t { end: u64, limit: u32 },
    #[error("DataSN {got} when {expected} was next")]
    DataSn { got: u32, expected: u32 },
    #[error("a sequence ended at {at}, before the {end} it was to reach")]
    ShortSequence { at: u32, end: u32 },
}

/// An R2T outstanding, and where its sequence is.
#[derive(Debug)]
struct Sequence {
    ttt: u32,
    end: u32,
    next_data_sn: u32,
}

/// One write's data being gathered.
#[derive(Debug)]
pub struct Gathering {
    /// The Expected Data Transfer Length: the most the initiator sends.
    expected: u32,
    /// The bytes the target asks for: those the command takes, up to
    /// `expected`. Unsolicited data past them is read and dropped.
    wanted: u32,
    buffer: BytesMut,
    /// Where the next byte belongs.
    received: u32,
    /// The unsolicited sequence while it is open: its next DataSN.
    unsolicited: Option<u32>,
    first_burst: u32,
    max_burst: u32,
    max_outstanding: usize,
    r2ts: VecDeque<Sequence>,
    /// Where the next R2T starts, and its R2TSN.
    next_r2t: u32,
    r2t_sn: u32,
}

impl Gathering {
    /// Starts gathering a write of `expected` bytes of which the command
    /// takes `wanted`, from what came with the command: `immediate` data,
    /// and `final_bit` clear if unsolicited Data-Out follows.
    pub fn new(
        parameters: &Parameters,
        expected: u32,
        wanted: u32,
        immediate: Bytes,
        final_bit: bool,
    ) -> Result<Self, ProtocolError> {
        let wanted = wanted.min(expected);
        let mut gathering = Self {
            expected,
            wanted,
            buffer: BytesMut::with_capacity(wanted as usize),
            received: 0,
            unsolicited: (!final_bit).then_some(0),
            first_burst: parameters.first_burst,
            max_burst: parameters.max_burst,
            max_outstanding: parameters.max_outstanding_r2t as usize,
            r2ts: VecDeque::new(),
            next_r2t: 0,
            r2t_sn: 0,
        };
        if !immediate.is_empty() && !parameters.immediate_data {
            return Err(ProtocolError::ImmediateDataRefused);
        }
        if !final_bit && parameters.initial_r2t {
            return Err(ProtocolError::UnsolicitedDataRefused);
        }
        gathering.take(&immediate, true)?;
        if final_bit {
            gathering.next_r2t = gathering.received.min(gathering.wanted);
        }
        Ok(gathering)
    }

    /// Takes one Data-Out PDU.
    pub fn receive(&mut self, pdu: DataOutPdu) -> Result<(), ProtocolError> {
        let expected_data_sn = if pdu.ttt == UNSOLICITED {
            self.unsolicited
                .ok_or(ProtocolError::UnsolicitedDataRefused)?
        } else {
            let sequence = self
                .r2ts
                .iter()
                .find(|s| s.ttt == pdu.ttt)
                .ok_or(ProtocolError::UnknownTransferTag(pdu.ttt))?;
            let end = u64::from(pdu.offset) + pdu.data.len() as u64;
            if end > u64::from(sequence.end) {
                return Err(ProtocolError::PastR2t {
                    end,
                    limit: sequence.end,
                });
            }
            sequence.next_data_sn
        };
        if pdu.data_sn != expected_data_sn {
            return Err(ProtocolError::DataSn {
                got: pdu.data_sn,
                expected: expected_data_sn,
            });
        }
        if pdu.offset != self.received {
            return Err(ProtocolError::OutOfOrder {
                offset: pdu.offset,
                expected: self.received,
            });
        }
        self.take(&pdu.data, pdu.ttt == UNSOLICITED)?;
        if pdu.ttt == UNSOLICITED {
            self.unsolicited = (!pdu.final_bit).then_some(expected_data_sn + 1);
            if pdu.final_bit {
                self.next_r2t = self.received.min(self.wanted);
            }
            return Ok(());
        }
        // The sequence found above is still there: nothing removed it.
        let sequence = self.r2ts.iter_mut().find(|s| s.ttt == pdu.ttt);
        let Some(sequence) = sequence else {
            return Ok(());
        };
        sequence.next_data_sn += 1;
        if pdu.final_bit {
            if self.received != sequence.end {
                return Err(ProtocolError::ShortSequence {
                    at: self.received,
                    end: sequence.end,
                });
            }
            self.r2ts.retain(|s| s.ttt != pdu.ttt);
        }
        Ok(())
    }

    /// Appends data at `received`, keeping what the command takes.
    fn take(&mut self, data: &[u8], unsolicited: bool) -> Result<(), ProtocolError> {
        let end = u64::from(self.received) + data.len() as u64;
        if end > u64::from(self.expected) {
            return Err(ProtocolError::PastTransferLength {
                end,
                expected: self.expected,
            });
        }
        if unsolicited && end > u64::from(self.first_burst) {
            return Err(ProtocolError::FirstBurstExceeded(end));
        }
        let keep = (self.wanted as usize).saturating_sub(self.buffer.len());
        self.buffer.extend_from_slice(&data[..keep.min(data.len())]);
        // Within `expected`, a u32: checked above.
        self.received = end as u32;
        Ok(())
    }

    /// The R2Ts to send now: while unsolicited data is still coming, none;
    /// then up to MaxOutstandingR2T at a time, each for up to
    /// MaxBurstLength, until every wanted byte is asked for.
    /// `next_ttt` hands out transfer tags.
    pub fn r2ts(&mut self, mut next_ttt: impl FnMut() -> u32) -> Vec<R2t> {
        let mut r2ts = Vec::new();
        if self.unsolicited.is_some() {
            return r2ts;
        }
        while self.r2ts.len() < self.max_outstanding && self.next_r2t < self.wanted {
            let length = (self.wanted - self.next_r2t).min(self.max_burst);
            let r2t = R2t {
                ttt: next_ttt(),
                r2t_sn: self.r2t_sn,
                offset: self.next_r2t,
                length,
            };
            self.r2ts.push_back(Sequence {
                ttt: r2t.ttt,
                end: r2t.offset + length,
                next_data_sn: 0,
            });
            self.next_r2t += length;
            self.r2t_sn += 1;
            r2ts.push(r2t);
        }
        r2ts
    }

    /// Whether every wanted byte is here and no sequence is open.
    pub fn complete(&self) -> bool {
        self.unsolicited.is_none()
            && self.r2ts.is_empty()
            && self.buffer.len() == self.wanted as usize
    }

    /// The bytes still to solicit with R2Ts, once the unsolicited data is
    /// in (before, 0: R2Ts wait for it).
    pub fn to_solicit(&self) -> u32 {
        if self.unsolicited.is_some() {
            return 0;
        }
        self.wanted - self.next_r2t
    }

    /// The R2Ts sent so far.
    pub fn r2t_count(&self) -> u32 {
        self.r2t_sn
    }

    /// The data the command takes.
    pub fn into_data(self) -> Bytes {
        self.buffer.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parameters(initial_r2t: bool, first_burst: u32, max_burst: u32) -> Parameters {
        Parameters {
            initial_r2t,
            first_burst,
            max_burst,
            max_outstanding_r2t: 2,
            ..Parameters::default()
        }
    }

    fn data_out(ttt: u32, data_sn: u32, offset: u32, len: usize, final_bit: bool) -> DataOutPdu {
        DataOutPdu {
            ttt,
            data_sn,
            offset,
            final_bit,
            data: Bytes::from(
                (0..len)
                    .map(|i| (offset as usize + i) as u8)
                    .collect::<Vec<_>>(),
            ),
        }
    }

    fn counter() -> impl FnMut() -> u32 {
        let mut next = 100;
        move || {
            next += 1;
            next
        }
    }

    #[test]
    fn immediate_then_unsolicited_then_r2t_sequences_assemble_in_order() {
        let parameters = parameters(false, 8192, 8192);
        let immediate = data_out(0, 0, 0, 4096, false).data;
        let mut write = Gathering::new(&parameters, 20480, 20480, immediate, false).unwrap();
        let mut ttts = counter();
        assert!(
            write.r2ts(&mut ttts).is_empty(),
            "unsolicited data is still coming"
        );
        write
            .receive(data_out(UNSOLICITED, 0, 4096, 4096, true))
            .unwrap();
        let r2ts = write.r2ts(&mut ttts);
        assert_eq!(
            r2ts,
            [
                R2t {
                    ttt: 101,
                    r2t_sn: 0,
                    offset: 8192,
                    length: 8192
                },
                R2t {
                    ttt: 102,
                    r2t_sn: 1,
                    offset: 16384,
                    length: 4096
                },
            ]
        );
        write.receive(data_out(101, 0, 8192, 4096, false)).unwrap();
        write.receive(data_out(101, 1, 12288, 4096, true)).unwrap();
        assert!(!write.complete());
        assert!(write.r2ts(&mut ttts).is_empty());
        write.receive(data_out(102, 0, 16384, 4096, true)).unwrap();
        assert!(write.complete());
        assert_eq!(write.r2t_count(), 2);
        let data = write.into_data();
        assert_eq!(data.len(), 20480);
        assert!(data.iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    #[test]
    fn only_the_bytes_the_command_takes_are_kept_and_asked_for() {
        let parameters = parameters(true, 65536, 262144);
        // EDTL 3 blocks, the CDB 1: one R2T for one block.
        let mut write = Gathering::new(&parameters, 12288, 4096, Bytes::new(), true).unwrap();
        let r2ts = write.r2ts(counter());
        assert_eq!(r2ts.len(), 1);
        assert_eq!((r2ts[0].offset, r2ts[0].length), (0, 4096));
        write
            .receive(data_out(r2ts[0].ttt, 0, 0, 4096, true))
            .unwrap();
        assert!(write.complete());
        // Immediate data past what the command takes is read and dropped.
        let more = data_out(0, 0, 0, 8192, true).data;
        let write = Gathering::new(&parameters, 12288, 4096, more, true).unwrap();
        assert!(write.complete());
        assert_eq!(write.into_data().len(), 4096);
    }

    #[test]
    fn data_that_breaks_the_rules_is_a_protocol_error() {
        let strict = parameters(true, 8192, 8192);
        let four_k = || data_out(0, 0, 0, 4096, true).data;
        assert_eq!(
            Gathering::new(&strict, 8192, 8192, Bytes::new(), false).unwrap_err(),
            ProtocolError::UnsolicitedDataRefused
        );
        let no_immediate = Parameters {
            immediate_data: false,
            ..strict.clone()
        };
        assert_eq!(
            Gathering::new(&no_immediate, 8192, 8192, four_k(), true).unwrap_err(),
            ProtocolError::ImmediateDataRefused
        );
        assert!(matches!(
            Gathering::new(&strict, 2048, 2048, four_k(), true),
            Err(ProtocolError::PastTransferLength { .. })
        ));

        let mut write = Gathering::new(&strict, 16384, 16384, Bytes::new(), true).unwrap();
        let r2ts = write.r2ts(counter());
        let ttt = r2ts[0].ttt;
        assert_eq!(
            write.receive(data_out(UNSOLICITED, 0, 0, 4096, true)),
            Err(ProtocolError::UnsolicitedDataRefused)
        );
        assert_eq!(
            write.receive(data_out(7, 0, 0, 4096, true)),
            Err(ProtocolError::UnknownTransferTag(7))
        );
        assert_eq!(
            write.receive(data_out(ttt, 1, 0, 4096, false)),
            Err(ProtocolError::DataSn {
                got: 1,
                expected: 0
            })
        );
        assert_eq!(
            write.receive(data_out(ttt, 0, 4096, 4096, false)),
            Err(ProtocolError::OutOfOrder {
                offset: 4096,
                expected: 0
            })
        );
        assert!(matches!(
            write.receive(data_out(ttt, 0, 0, 12288, false)),
            Err(ProtocolError::PastR2t { .. })
        ));
        assert_eq!(
            write.receive(data_out(ttt, 0, 0, 4096, true)),
            Err(ProtocolError::ShortSequence {
                at: 4096,
                end: 8192
            })
        );

        let mut burst = Gathering::new(
            &parameters(false, 4096, 8192),
            16384,
            16384,
            Bytes::new(),
            false,
        )
        .unwrap();
        assert_eq!(
            burst.receive(data_out(UNSOLICITED, 0, 0, 8192, true)),
            Err(ProtocolError::FirstBurstExceeded(8192))
        );
    }
}
