//! Command descriptor blocks: the fields of the data-transfer commands
//! (SBC-4 §5), checked before anything is read or written.

use super::sense::Sense;

/// The operation codes of the disk's commands (SPC-5 and SBC-4), but for
/// MODE SENSE/SELECT ([`super::mode`]), UNMAP and WRITE SAME
/// ([`super::unmap`]) and REPORT LUNS ([`super::luns`]).
pub mod opcode {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const READ_16: u8 = 0x88;
    pub const WRITE_16: u8 = 0x8a;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// SERVICE ACTION IN (16): READ CAPACITY (16), GET LBA STATUS.
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    /// MAINTENANCE IN: REPORT SUPPORTED OPERATION CODES.
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;
    pub const READ_DEFECT_DATA_12: u8 = 0xb7;
}

/// Service actions of SERVICE ACTION IN (16) and MAINTENANCE IN.
pub mod action {
    pub const READ_CAPACITY_16: u16 = 0x10;
    pub const GET_LBA_STATUS: u16 = 0x12;
    pub const REPORT_SUPPORTED_OPERATION_CODES: u16 = 0x0c;
}

/// The service action of a CDB that has one (in byte 1, bits 4-0).
pub fn service_action(cdb: &[u8]) -> Result<u16, Sense> {
    cdb.get(1)
        .map(|byte| u16::from(byte & 0x1f))
        .ok_or(Sense::INVALID_FIELD_IN_CDB)
}

/// A service action this device does not serve: the field at fault is
/// the action (SPC-5 §4.2.5.2).
pub const UNKNOWN_SERVICE_ACTION: Sense = Sense::INVALID_FIELD_IN_CDB.at(1, Some(4));

/// A CDB cut to the length of its opcode's group, or refused when shorter.
pub fn whole(cdb: &[u8]) -> Result<&[u8], Sense> {
    let code = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
    let needed = length(code).ok_or(Sense::INVALID_OPCODE)?;
    cdb.get(..needed).ok_or(Sense::INVALID_FIELD_IN_CDB)
}

/// A read or write of `blocks` logical blocks from `lba`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub lba: u64,
    pub blocks: u32,
    /// Force unit access: the write is durable, or the read comes from the
    /// medium, before the command completes.
    pub fua: bool,
}

impl Transfer {
    /// Checks that the transfer lies within `capacity` blocks.
    pub fn within(&self, capacity: u64) -> Result<(), Sense> {
        match self.lba.checked_add(u64::from(self.blocks)) {
            Some(end) if end <= capacity => Ok(()),
            _ => Err(Sense::LBA_OUT_OF_RANGE),
        }
    }
}

/// The length of a CDB by its opcode's group (SPC-5 §4.2.5.1); `None` for
/// the groups of variable or vendor-specific length.
pub fn length(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// The transfer a READ or WRITE of any size names.
pub fn transfer(cdb: &[u8]) -> Result<Transfer, Sense> {
    let code = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
    match code {
        opcode::READ_6 | opcode::WRITE_6 => block_range(cdb),
        opcode::READ_10
        | opcode::WRITE_10
        | opcode::READ_12
        | opcode::WRITE_12
        | opcode::READ_16
        | opcode::WRITE_16 => Ok(Transfer {
            fua: cdb[1] & 0x08 != 0,
            ..block_range(cdb)?
        }),
        _ => Err(Sense::INVALID_OPCODE),
    }
}

/// The blocks a CDB laid out as READ's of its size names (VERIFY and WRITE
/// SAME share the layout), without FUA.
pub fn block_range(cdb: &[u8]) -> Result<Transfer, Sense> {
    let code = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
    let needed = length(code).ok_or(Sense::INVALID_OPCODE)?;
    if cdb.len() < needed {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    // RDPROTECT, WRPROTECT or VRPROTECT: the volume keeps no protection
    // information, so any but 0 is refused (SBC-4 §5.16.2).
    if needed > 6 && cdb[1] & 0xe0 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let (lba, blocks) = match needed {
        // A length of 0 means 256 blocks in the 6-byte commands.
        6 => (
            (u64::from(cdb[1] & 0x1f) << 16) | big_endian(&cdb[2..4]),
            match cdb[4] {
                0 => 256,
                n => u64::from(n),
            },
        ),
        10 => (big_endian(&cdb[2..6]), big_endian(&cdb[7..9])),
        12 => (big_endian(&cdb[2..6]), big_endian(&cdb[6..10])),
        _ => (big_endian(&cdb[2..10]), big_endian(&cdb[10..14])),
    };
    Ok(Transfer {
        lba,
        // Counts of at most 4 bytes: the cast cannot truncate.
        blocks: blocks as u32,
        fua: false,
    })
}

/// A big-endian field of at most 8 bytes.
pub fn big_endian(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0, |value, byte| (value << 8) | u64::from(*byte))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_size_of_read_and_write_names_its_blocks() {
        let read6 = [opcode::READ_6, 0x01, 0x02, 0x03, 0, 0];
        assert_eq!(
            transfer(&read6),
            Ok(Transfer {
                lba: 0x010203,
                blocks: 256,
                fua: false
            })
        );
        let write10 = [opcode::WRITE_10, 0x08, 0, 0, 0x10, 0, 0, 0x00, 0x08, 0];
        assert_eq!(
            transfer(&write10),
            Ok(Transfer {
                lba: 0x1000,
                blocks: 8,
                fua: true
            })
        );
        let read12 = [opcode::READ_12, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0];
        assert_eq!(transfer(&read12).unwrap().blocks, 0x10000);
        let mut write16 = [0; 16];
        write16[0] = opcode::WRITE_16;
        write16[2..10].copy_from_slice(&(1u64 << 40).to_be_bytes());
        write16[10..14].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(
            transfer(&write16),
            Ok(Transfer {
                lba: 1 << 40,
                blocks: 3,
                fua: false
            })
        );
    }

    #[test]
    fn short_or_unknown_cdbs_and_ranges_past_the_end_are_refused() {
        assert_eq!(transfer(&[]), Err(Sense::INVALID_OPCODE));
        assert_eq!(
            transfer(&[opcode::READ_16, 0, 0]),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
        assert_eq!(transfer(&[0x12, 0, 0, 0, 0, 0]), Err(Sense::INVALID_OPCODE));
        assert_eq!(transfer(&[0xc0; 16]), Err(Sense::INVALID_OPCODE));
        let protected = [opcode::READ_10, 0x20, 0, 0, 0, 0, 0, 0, 1, 0];
        assert_eq!(transfer(&protected), Err(Sense::INVALID_FIELD_IN_CDB));
        let at = |lba, blocks| Transfer {
            lba,
            blocks,
            fua: false,
        };
        assert_eq!(at(90, 10).within(100), Ok(()));
        assert_eq!(at(91, 10).within(100), Err(Sense::LBA_OUT_OF_RANGE));
        assert_eq!(at(u64::MAX, 2).within(100), Err(Sense::LBA_OUT_OF_RANGE));
    }
}
