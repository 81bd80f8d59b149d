//! Thin provisioning's commands (SBC-4 §5.31, §5.48, §5.49): UNMAP frees
//! ranges of blocks, WRITE SAME fills a range with one block, or frees it
//! when asked to and the block is zeros (freed blocks read as zeros).
//! Every range is checked before any is touched.

use bytes::{Bytes, BytesMut};

use super::cdb::{self, Transfer};
use super::disk::{Disk, write_error};
use super::inquiry::{MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS};
use super::sense::Sense;
use crate::frontend::{BLOCK_SIZE, BlockDevice};

pub const UNMAP: u8 = 0x42;
pub const WRITE_SAME_10: u8 = 0x41;
pub const WRITE_SAME_16: u8 = 0x93;

/// Bytes of an UNMAP block descriptor, and of the list's header.
const DESCRIPTOR: usize = 16;
const HEADER: usize = 8;
/// Largest single write of a WRITE SAME's fill.
const FILL_CHUNK: u64 = 1 << 20;

impl<D: BlockDevice> Disk<D> {
    /// UNMAP: the parameter list's ranges, all checked, then freed.
    pub(super) async fn unmap(&self, cdb: &[u8], list: Bytes) -> Result<Bytes, Sense> {
        if cdb.len() < 10 {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        // ANCHOR: anchored blocks are not supported (ANC_SUP is 0).
        if cdb[1] & 0x01 != 0 {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        let declared = usize::from(u16::from_be_bytes([cdb[7], cdb[8]]));
        if declared == 0 {
            return Ok(Bytes::new());
        }
        let ranges = ranges(&list, declared)?;
        let total: u64 = ranges.iter().map(|r| u64::from(r.blocks)).sum();
        if total > u64::from(MAX_UNMAP_BLOCKS) {
            return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
        }
        for range in &ranges {
            range.within(self.blocks())?;
        }
        for range in ranges.iter().filter(|r| r.blocks > 0) {
            let length = u64::from(range.blocks) * BLOCK_SIZE;
            self.device
                .unmap(range.lba * BLOCK_SIZE, length)
                .await
                .map_err(write_error)?;
        }
        Ok(Bytes::new())
    }

    /// WRITE SAME (10) or (16): `block` over the range, freed instead when
    /// the UNMAP bit asks and the block is zeros.
    pub(super) async fn write_same(&self, cdb: &[u8], block: Bytes) -> Result<Bytes, Sense> {
        let range = cdb::block_range(cdb)?;
        // ANCHOR: anchored blocks are not supported (ANC_SUP is 0).
        if cdb[1] & 0x10 != 0 {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        // WSNZ is set: zero blocks is not "to the end of the device".
        if range.blocks == 0 || range.blocks > MAX_UNMAP_BLOCKS {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        range.within(self.blocks())?;
        if block.len() as u64 != BLOCK_SIZE {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        let start = range.lba * BLOCK_SIZE;
        let end = start + u64::from(range.blocks) * BLOCK_SIZE;
        let unmap = cdb[1] & 0x08 != 0;
        if unmap && block.iter().all(|b| *b == 0) {
            self.device
                .unmap(start, end - start)
                .await
                .map_err(write_error)?;
            return Ok(Bytes::new());
        }
        let chunk = repeated(&block, FILL_CHUNK.min(end - start));
        let mut at = start;
        while at < end {
            let length = (end - at).min(chunk.len() as u64) as usize;
            self.device
                .write(at, chunk.slice(..length))
                .await
                .map_err(write_error)?;
            at += length as u64;
        }
        Ok(Bytes::new())
    }
}

/// The ranges of an UNMAP parameter list of `declared` bytes.
fn ranges(list: &[u8], declared: usize) -> Result<Vec<Transfer>, Sense> {
    if declared < HEADER || list.len() < declared {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    let descriptors = usize::from(u16::from_be_bytes([list[2], list[3]]));
    if !descriptors.is_multiple_of(DESCRIPTOR) || HEADER + descriptors > declared {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    if descriptors / DESCRIPTOR > MAX_UNMAP_DESCRIPTORS as usize {
        return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
    }
    let body = &list[HEADER..HEADER + descriptors];
    Ok(body
        .chunks_exact(DESCRIPTOR)
        .map(|d| {
            let mut lba = [0; 8];
            lba.copy_from_slice(&d[0..8]);
            Transfer {
                lba: u64::from_be_bytes(lba),
                blocks: u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
                fua: false,
            }
        })
        .collect())
}

/// `block` repeated to `length` bytes (a multiple of the block size).
fn repeated(block: &[u8], length: u64) -> Bytes {
    let mut out = BytesMut::with_capacity(length as usize);
    while (out.len() as u64) < length {
        out.extend_from_slice(block);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::frontend::scsi::disk::Completion;
    use crate::frontend::scsi::memory::Memory;

    const BLOCK: usize = BLOCK_SIZE as usize;

    fn unmap_list(ranges: &[(u64, u32)]) -> (Vec<u8>, Bytes) {
        let mut list = vec![0; HEADER];
        let descriptors = (ranges.len() * DESCRIPTOR) as u16;
        list[0..2].copy_from_slice(&(descriptors + 6).to_be_bytes());
        list[2..4].copy_from_slice(&descriptors.to_be_bytes());
        for (lba, blocks) in ranges {
            list.extend_from_slice(&lba.to_be_bytes());
            list.extend_from_slice(&blocks.to_be_bytes());
            list.extend_from_slice(&[0; 4]);
        }
        let mut cdb = vec![0; 10];
        cdb[0] = UNMAP;
        cdb[7..9].copy_from_slice(&(list.len() as u16).to_be_bytes());
        (cdb, Bytes::from(list))
    }

    fn write_same_16(lba: u64, blocks: u32, unmap: bool) -> Vec<u8> {
        let mut cdb = vec![0; 16];
        cdb[0] = WRITE_SAME_16;
        cdb[1] = if unmap { 0x08 } else { 0 };
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        cdb
    }

    fn filled(memory: &Memory, value: u8) {
        memory.data.lock().unwrap().fill(value);
    }

    fn block_values(memory: &Memory) -> Vec<u8> {
        let data = memory.data.lock().unwrap();
        data.chunks(BLOCK).map(|b| b[0]).collect()
    }

    #[tokio::test]
    async fn unmap_frees_every_listed_range_and_nothing_else() {
        let memory = Memory::new(16);
        filled(&memory, 5);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let (cdb, list) = unmap_list(&[(1, 2), (10, 1), (12, 0)]);
        assert_eq!(
            disk.execute(&cdb, list).await,
            Completion::Good(Bytes::new())
        );
        let expected: Vec<u8> = (0..16)
            .map(|b| if [1, 2, 10].contains(&b) { 0 } else { 5 })
            .collect();
        assert_eq!(block_values(&memory), expected);
    }

    #[tokio::test]
    async fn a_bad_unmap_list_frees_nothing() {
        let memory = Memory::new(16);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let (cdb, list) = unmap_list(&[(1, 2), (15, 2)]);
        assert_eq!(
            disk.execute(&cdb, list).await,
            Completion::Check(Sense::LBA_OUT_OF_RANGE)
        );
        let (cdb, list) = unmap_list(&[(0, MAX_UNMAP_BLOCKS), (0, 1)]);
        assert_eq!(
            disk.execute(&cdb, list).await,
            Completion::Check(Sense::INVALID_FIELD_IN_PARAMETERS)
        );
        let (cdb, list) = unmap_list(&[(1, 1)]);
        let short = list.slice(..HEADER + 4);
        assert_eq!(
            disk.execute(&cdb, short).await,
            Completion::Check(Sense::PARAMETER_LIST_LENGTH)
        );
        assert!(!memory.touched.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn write_same_fills_with_its_block_or_frees_zeros_when_asked() {
        let anchored = |mut cdb: Vec<u8>| {
            cdb[1] |= 0x10;
            cdb
        };
        let memory = Memory::new(16);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let block = Bytes::from(vec![7; BLOCK]);
        let done = disk.execute(&write_same_16(2, 3, false), block).await;
        assert_eq!(done, Completion::Good(Bytes::new()));
        let expected: Vec<u8> = (0..16)
            .map(|b| if (2..5).contains(&b) { 7 } else { 0 })
            .collect();
        assert_eq!(block_values(&memory), expected);
        let zeros = Bytes::from(vec![0; BLOCK]);
        let done = disk.execute(&write_same_16(3, 1, true), zeros).await;
        assert_eq!(done, Completion::Good(Bytes::new()));
        assert_eq!(block_values(&memory)[3], 0);
        for (cdb, data) in [
            (write_same_16(0, 0, false), Bytes::from(vec![1; BLOCK])),
            (write_same_16(16, 1, false), Bytes::from(vec![1; BLOCK])),
            (write_same_16(0, 1, false), Bytes::from(vec![1; 512])),
            (
                anchored(write_same_16(0, 1, true)),
                Bytes::from(vec![0; BLOCK]),
            ),
        ] {
            assert!(matches!(
                disk.execute(&cdb, data).await,
                Completion::Check(_)
            ));
        }
    }
}
