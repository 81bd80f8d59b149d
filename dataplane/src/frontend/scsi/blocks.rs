//! Commands about blocks that move none of their data (SBC-4 §5.11,
//! §5.12, §5.22): PRE-FETCH, which has nothing to load (the volume has no
//! cache of its own to fill), GET LBA STATUS, which cannot tell mapped
//! blocks from unmapped ones, and READ DEFECT DATA, for a volume without
//! defects.

use bytes::Bytes;

use super::cdb::{self, big_endian, opcode};
use super::disk::Disk;
use super::sense::Sense;
use crate::frontend::BlockDevice;

/// Bytes of a GET LBA STATUS descriptor, and of the header before it.
const LBA_STATUS_HEADER: usize = 8;
const LBA_STATUS_DESCRIPTOR: usize = 16;

impl<D: BlockDevice> Disk<D> {
    /// PRE-FETCH (10) or (16): the range checked, then GOOD, which SBC-4
    /// allows when the blocks are not kept in a cache (CONDITION MET is
    /// for those that are). Any length is fine: nothing is transferred.
    pub(super) fn prefetch(&self, cdb: &[u8]) -> Result<Bytes, Sense> {
        cdb::block_range(cdb)?.within(self.blocks())?;
        Ok(Bytes::new())
    }

    /// GET LBA STATUS: one descriptor from the LBA asked to the end of the
    /// volume, with provisioning status 0, "mapped or unknown": the volume
    /// does not say which blocks it has allocated.
    pub(super) fn lba_status(&self, cdb: &[u8]) -> Result<Bytes, Sense> {
        let cdb = cdb::whole(cdb)?;
        let lba = big_endian(&cdb[2..10]);
        let allocation = big_endian(&cdb[10..14]);
        let blocks = self.blocks();
        if lba >= blocks {
            return Err(Sense::LBA_OUT_OF_RANGE);
        }
        // A longer extent is reported up to what the field holds; the
        // initiator asks again from where it ends.
        let extent = u32::try_from(blocks - lba).unwrap_or(u32::MAX);
        let mut data = vec![0; LBA_STATUS_HEADER + LBA_STATUS_DESCRIPTOR];
        let following = (data.len() - 4) as u32;
        data[0..4].copy_from_slice(&following.to_be_bytes());
        data[8..16].copy_from_slice(&lba.to_be_bytes());
        data[16..20].copy_from_slice(&extent.to_be_bytes());
        data.truncate(usize::try_from(allocation).unwrap_or(usize::MAX));
        Ok(Bytes::from(data))
    }
}

/// READ DEFECT DATA (10) or (12): no defects. The lists asked for are
/// returned, empty, in the format asked for (any describes no entries);
/// the reserved format 111b is refused.
pub fn defect_data(cdb: &[u8]) -> Result<Vec<u8>, Sense> {
    let cdb = cdb::whole(cdb)?;
    let twelve = cdb[0] == opcode::READ_DEFECT_DATA_12;
    let (flags_at, header, allocation) = if twelve {
        (1, 8, big_endian(&cdb[6..10]))
    } else {
        (2, 4, big_endian(&cdb[7..9]))
    };
    // REQ_PLIST, REQ_GLIST and the defect list format.
    let flags = cdb[flags_at] & 0x1f;
    if flags & 0x07 == 0x07 {
        return Err(Sense::INVALID_FIELD_IN_CDB.at(flags_at as u16, Some(2)));
    }
    // PLISTV and GLISTV say the lists asked for are here: they are empty.
    // The length (and, in the 12-byte form, the generation code, 0: not
    // kept) stays 0.
    let mut data = vec![0; header];
    data[1] = flags;
    data.truncate(usize::try_from(allocation).unwrap_or(usize::MAX));
    Ok(data)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::frontend::scsi::cdb::action;
    use crate::frontend::scsi::cdb::opcode::*;
    use crate::frontend::scsi::disk::Completion;
    use crate::frontend::scsi::memory::Memory;

    fn get_lba_status(lba: u64, allocation: u32) -> [u8; 16] {
        let mut cdb = [0; 16];
        cdb[0] = SERVICE_ACTION_IN_16;
        cdb[1] = action::GET_LBA_STATUS as u8;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&allocation.to_be_bytes());
        cdb
    }

    fn prefetch_16(lba: u64, blocks: u32, flags: u8) -> [u8; 16] {
        let mut cdb = [0; 16];
        cdb[0] = PRE_FETCH_16;
        cdb[1] = flags;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        cdb
    }

    fn good(completion: Completion) -> Bytes {
        match completion {
            Completion::Good(data) => data,
            Completion::Check(sense) => panic!("CHECK CONDITION {sense:?}"),
        }
    }

    #[tokio::test]
    async fn prefetch_checks_its_range_and_touches_nothing() {
        let memory = Memory::new(64);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        // IMMED, and a group number.
        let mut ten = [PRE_FETCH_10, 0x02, 0, 0, 0, 60, 0x03, 0, 4, 0];
        assert!(good(disk.execute(&ten, Bytes::new()).await).is_empty());
        ten[8] = 5;
        assert_eq!(
            disk.execute(&ten, Bytes::new()).await,
            Completion::Check(Sense::LBA_OUT_OF_RANGE)
        );
        let past_limit = prefetch_16(0, 64, 0);
        assert!(good(disk.execute(&past_limit, Bytes::new()).await).is_empty());
        assert!(good(disk.execute(&prefetch_16(0, 0, 0), Bytes::new()).await).is_empty());
        for (lba, blocks) in [(65, 0), (1 << 63, 0), (u64::MAX, 1), (63, 2)] {
            assert_eq!(
                disk.execute(&prefetch_16(lba, blocks, 0), Bytes::new())
                    .await,
                Completion::Check(Sense::LBA_OUT_OF_RANGE),
                "{lba} {blocks}"
            );
        }
        assert_eq!(disk.data_out_len(&past_limit, u32::MAX), Ok(0));
        assert!(!memory.touched.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn lba_status_reports_one_extent_to_the_end_as_mapped_or_unknown() {
        let disk = Disk::new(Memory::new(64), "vol");
        let data = good(disk.execute(&get_lba_status(10, 24), Bytes::new()).await);
        assert_eq!(data.len(), 24);
        assert_eq!(&data[0..4], &20u32.to_be_bytes(), "bytes that follow");
        assert_eq!(&data[8..16], &10u64.to_be_bytes());
        assert_eq!(&data[16..20], &54u32.to_be_bytes());
        assert_eq!(data[20] & 0x0f, 0, "mapped or unknown");
        let last = good(disk.execute(&get_lba_status(63, 24), Bytes::new()).await);
        assert_eq!(&last[16..20], &1u32.to_be_bytes());
        let short = good(disk.execute(&get_lba_status(0, 8), Bytes::new()).await);
        assert_eq!(&short[..], &[0, 0, 0, 20, 0, 0, 0, 0]);
        for lba in [64, 65, 1 << 63, u64::MAX] {
            assert_eq!(
                disk.execute(&get_lba_status(lba, 24), Bytes::new()).await,
                Completion::Check(Sense::LBA_OUT_OF_RANGE),
                "{lba}"
            );
        }
    }

    #[test]
    fn defect_data_is_empty_in_the_format_asked_for() {
        // REQ_PLIST, REQ_GLIST, format 101b.
        let ten = [READ_DEFECT_DATA_10, 0, 0x18 | 0x05, 0, 0, 0, 0, 0, 32, 0];
        assert_eq!(defect_data(&ten), Ok(vec![0, 0x1d, 0, 0]));
        let mut twelve = [0; 12];
        twelve[0] = READ_DEFECT_DATA_12;
        twelve[9] = 32;
        assert_eq!(defect_data(&twelve), Ok(vec![0; 8]));
        twelve[9] = 2;
        assert_eq!(defect_data(&twelve), Ok(vec![0; 2]));
        twelve[1] = 0x07;
        assert_eq!(
            defect_data(&twelve),
            Err(Sense::INVALID_FIELD_IN_CDB.at(1, Some(2)))
        );
        assert_eq!(defect_data(&ten[..9]), Err(Sense::INVALID_FIELD_IN_CDB));
    }
}
