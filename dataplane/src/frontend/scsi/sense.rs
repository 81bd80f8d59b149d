//! SCSI sense data (SPC-5 §4.4): why a command ended in CHECK CONDITION,
//! as a sense key and an additional sense code, in the fixed format or the
//! descriptor format the initiator asked for (the D_SENSE bit of the
//! control mode page), with a pointer to the field at fault when known.

/// A sense key, additional sense code and qualifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// The CDB field at fault (the sense-key specific field pointer of
    /// SPC-5 §4.4.2.4.2), when the error names one.
    pub field: Option<FieldPointer>,
}

/// A field of the CDB: its first byte and, if it does not start a byte,
/// its most significant bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldPointer {
    pub byte: u16,
    pub bit: Option<u8>,
}

impl FieldPointer {
    /// The three sense-key specific bytes: SKSV, C/D (a CDB field), BPV
    /// and the bit pointer, then the byte.
    fn encode(&self) -> [u8; 3] {
        let bit = match self.bit {
            Some(bit) => 0x08 | (bit & 0x07),
            None => 0,
        };
        let [high, low] = self.byte.to_be_bytes();
        [0x80 | 0x40 | bit, high, low]
    }
}

/// Sense keys (SPC-5 table 49).
pub mod key {
    pub const NOT_READY: u8 = 0x02;
    pub const MEDIUM_ERROR: u8 = 0x03;
    pub const HARDWARE_ERROR: u8 = 0x04;
    pub const ILLEGAL_REQUEST: u8 = 0x05;
    pub const UNIT_ATTENTION: u8 = 0x06;
    pub const DATA_PROTECT: u8 = 0x07;
    pub const ABORTED_COMMAND: u8 = 0x0b;
    pub const MISCOMPARE: u8 = 0x0e;
}

impl Sense {
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Self {
        Self {
            key,
            asc,
            ascq,
            field: None,
        }
    }

    /// This sense, naming the CDB field at `byte` (and `bit`) as the
    /// cause. Initiators that probe a command through a service action
    /// read a pointer to byte 1, or none, as "not implemented" (libiscsi
    /// does), so errors in a served command name their field.
    pub const fn at(self, byte: u16, bit: Option<u8>) -> Self {
        Self {
            field: Some(FieldPointer { byte, bit }),
            ..self
        }
    }

    pub const INVALID_OPCODE: Self = Self::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: Self = Self::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: Self = Self::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
    pub const LUN_NOT_SUPPORTED: Self = Self::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
    pub const PARAMETER_LIST_LENGTH: Self = Self::new(key::ILLEGAL_REQUEST, 0x1a, 0x00);
    /// The data sent does not fit the command: part of a block.
    pub const INVALID_FIELD_IN_INFORMATION_UNIT: Self = Self::new(key::ILLEGAL_REQUEST, 0x0e, 0x03);
    /// The transport delivered a command's data against its rules.
    pub const DATA_PHASE_ERROR: Self = Self::new(key::ABORTED_COMMAND, 0x4b, 0x00);
    pub const INVALID_FIELD_IN_PARAMETERS: Self = Self::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
    pub const SAVING_NOT_SUPPORTED: Self = Self::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
    pub const POWER_ON_RESET: Self = Self::new(key::UNIT_ATTENTION, 0x29, 0x00);
    pub const CAPACITY_CHANGED: Self = Self::new(key::UNIT_ATTENTION, 0x2a, 0x09);
    /// A write no replica took.
    pub const WRITE_ERROR: Self = Self::new(key::MEDIUM_ERROR, 0x0c, 0x00);
    /// A read no replica answered.
    pub const UNRECOVERED_READ: Self = Self::new(key::MEDIUM_ERROR, 0x11, 0x00);
    /// A flush or other command the volume failed without a medium cause.
    pub const INTERNAL_FAILURE: Self = Self::new(key::HARDWARE_ERROR, 0x44, 0x00);
    /// The replicas' disks are full (thin provisioning): Linux reports
    /// this one as ENOSPC rather than EIO.
    pub const SPACE_ALLOCATION_FAILED: Self = Self::new(key::DATA_PROTECT, 0x27, 0x07);
    pub const MISCOMPARE_DURING_VERIFY: Self = Self::new(key::MISCOMPARE, 0x1d, 0x00);
    pub const COMMAND_ABORTED: Self = Self::new(key::ABORTED_COMMAND, 0x00, 0x00);
    /// Nothing to report.
    pub const NO_SENSE: Self = Self::new(0, 0, 0);

    /// Fixed-format sense data (SPC-5 §4.4.3): 18 bytes, current error.
    pub fn fixed(&self) -> [u8; 18] {
        let mut data = [0; 18];
        data[0] = 0x70;
        data[2] = self.key & 0x0f;
        // Additional sense length: the bytes after byte 7.
        data[7] = 10;
        data[12] = self.asc;
        data[13] = self.ascq;
        if let Some(field) = self.field {
            data[15..18].copy_from_slice(&field.encode());
        }
        data
    }

    /// Descriptor-format sense data (SPC-5 §4.4.2): 8 bytes, current
    /// error, and a sense-key specific descriptor when a field is named.
    pub fn descriptor(&self) -> Vec<u8> {
        let mut data = vec![0x72, self.key & 0x0f, self.asc, self.ascq, 0, 0, 0, 0];
        if let Some(field) = self.field {
            data.extend_from_slice(&[0x02, 0x06, 0, 0]);
            data.extend_from_slice(&field.encode());
            data.push(0);
            data[7] = 8;
        }
        data
    }

    /// The sense data in the format asked for.
    pub fn encode(&self, descriptor: bool) -> Vec<u8> {
        if descriptor {
            self.descriptor()
        } else {
            self.fixed().to_vec()
        }
    }
}

/// REQUEST SENSE (SPC-5 §6.39): `pending` (NO_SENSE when nothing is;
/// sense is otherwise returned with each failed command) in the format the
/// CDB asks, cut to its allocation length.
pub fn request_sense(cdb: &[u8], pending: Sense) -> Result<bytes::Bytes, Sense> {
    if cdb.len() < 6 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let mut data = pending.encode(cdb[1] & 0x01 != 0);
    data.truncate(usize::from(cdb[4]));
    Ok(bytes::Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_carry_the_key_and_codes_where_spc_puts_them() {
        let fixed = Sense::LBA_OUT_OF_RANGE.fixed();
        assert_eq!(fixed[0], 0x70);
        assert_eq!(fixed[2], 0x05);
        assert_eq!(usize::from(fixed[7]) + 8, fixed.len());
        assert_eq!((fixed[12], fixed[13]), (0x21, 0x00));
        let descriptor = Sense::CAPACITY_CHANGED.descriptor();
        assert_eq!(descriptor, [0x72, 0x06, 0x2a, 0x09, 0, 0, 0, 0]);
        assert_eq!(Sense::WRITE_ERROR.encode(true).len(), 8);
        assert_eq!(Sense::WRITE_ERROR.encode(false).len(), 18);
    }

    #[test]
    fn a_named_field_is_pointed_at_in_both_formats() {
        let sense = Sense::INVALID_FIELD_IN_CDB.at(2, Some(2));
        let fixed = sense.fixed();
        assert_eq!((fixed[12], fixed[13]), (0x24, 0x00));
        // SKSV, C/D (in the CDB), BPV with bit 2; byte 2.
        assert_eq!(&fixed[15..18], &[0x80 | 0x40 | 0x08 | 2, 0, 2]);
        assert_eq!(Sense::INVALID_FIELD_IN_CDB.fixed()[15], 0, "no SKSV");
        let descriptor = sense.descriptor();
        assert_eq!(usize::from(descriptor[7]) + 8, descriptor.len());
        assert_eq!(&descriptor[8..12], &[0x02, 0x06, 0, 0]);
        assert_eq!(&descriptor[12..15], &fixed[15..18]);
        let whole_byte = Sense::INVALID_FIELD_IN_CDB.at(0x0103, None).fixed();
        assert_eq!(&whole_byte[15..18], &[0xc0, 0x01, 0x03]);
    }
}
