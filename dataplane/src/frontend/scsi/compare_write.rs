//! COMPARE AND WRITE (SBC-4 §5.3): the blocks named are read and compared
//! with the first half of the data sent, and only if they match is the
//! second half written. Atomic for every initiator of the target: it holds
//! the disk's write lock alone, where every other command that writes
//! holds it shared, so no write lands between its read and its write; the
//! engine then writes the new blocks to every replica as any write.

use bytes::Bytes;

use super::cdb::{self, Transfer};
use super::disk::{Disk, write_error};
use super::sense::Sense;
use crate::frontend::{BLOCK_SIZE, BlockDevice};

pub const COMPARE_AND_WRITE: u8 = 0x89;
/// The most blocks one COMPARE AND WRITE takes (the Block Limits page's
/// MAXIMUM COMPARE AND WRITE LENGTH): any the one-byte field can name.
pub const MAX_COMPARE_WRITE_BLOCKS: u8 = 255;

const CDB_LEN: usize = 16;
/// Byte 13: NUMBER OF LOGICAL BLOCKS.
const BLOCKS: usize = 13;

/// The blocks a COMPARE AND WRITE names, and its FUA bit. Protection
/// information (WRPROTECT) is refused, as for every write.
fn range(cdb: &[u8]) -> Result<Transfer, Sense> {
    if cdb.len() < CDB_LEN {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    if cdb[1] & 0xe0 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB.at(1, Some(7)));
    }
    Ok(Transfer {
        lba: cdb::big_endian(&cdb[2..10]),
        blocks: u32::from(cdb[BLOCKS]),
        fua: cdb[1] & 0x08 != 0,
    })
}

/// The data a COMPARE AND WRITE takes: the blocks to compare, then those
/// to write. SBC-4 wants exactly that buffer: `expected`, the length the
/// initiator sends, must be it.
pub fn data_out_len(cdb: &[u8], expected: u32) -> Result<u32, Sense> {
    let blocks = range(cdb)?.blocks;
    // At most 2 x 255 blocks of 4 KiB: fits in 32 bits.
    let len = 2 * blocks * BLOCK_SIZE as u32;
    if expected != len {
        return Err(Sense::INVALID_FIELD_IN_CDB.at(BLOCKS as u16, None));
    }
    Ok(len)
}

impl<D: BlockDevice> Disk<D> {
    /// Compares, then writes if the blocks match; MISCOMPARE, and nothing
    /// written, if they do not. With FUA, durable before GOOD.
    pub(super) async fn compare_and_write(&self, cdb: &[u8], data: Bytes) -> Result<Bytes, Sense> {
        let transfer = range(cdb)?;
        self.admit(&transfer)?;
        let half = transfer.blocks as usize * BLOCK_SIZE as usize;
        if data.len() != 2 * half {
            return Err(Sense::INVALID_FIELD_IN_CDB.at(BLOCKS as u16, None));
        }
        if transfer.blocks == 0 {
            return Ok(Bytes::new());
        }
        let _alone = self.writes.write().await;
        let stored = self.read(transfer).await?;
        if stored[..] != data[..half] {
            return Err(Sense::MISCOMPARE_DURING_VERIFY);
        }
        let offset = transfer.lba * BLOCK_SIZE;
        self.device
            .write(offset, data.slice(half..))
            .await
            .map_err(write_error)?;
        if transfer.fua {
            self.device.flush().await.map_err(write_error)?;
        }
        Ok(Bytes::new())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::frontend::scsi::disk::Completion;
    use crate::frontend::scsi::memory::Memory;

    fn cdb(lba: u64, blocks: u8, flags: u8) -> [u8; 16] {
        let mut cdb = [0; 16];
        cdb[0] = COMPARE_AND_WRITE;
        cdb[1] = flags;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[BLOCKS] = blocks;
        cdb
    }

    fn buffer(compare: u8, write: u8, blocks: usize) -> Bytes {
        let half = blocks * BLOCK_SIZE as usize;
        let mut data = vec![compare; 2 * half];
        data[half..].fill(write);
        Bytes::from(data)
    }

    fn stored(memory: &Memory, lba: usize) -> u8 {
        memory.data.lock().unwrap()[lba * BLOCK_SIZE as usize]
    }

    #[tokio::test]
    async fn a_match_writes_the_second_half_and_a_miscompare_writes_nothing() {
        let memory = Memory::new(16);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let swap = disk.execute(&cdb(3, 2, 0), buffer(0, 7, 2)).await;
        assert_eq!(swap, Completion::Good(Bytes::new()));
        assert_eq!((stored(&memory, 3), stored(&memory, 4)), (7, 7));
        let stale = disk.execute(&cdb(3, 2, 0), buffer(0, 9, 2)).await;
        assert_eq!(stale, Completion::Check(Sense::MISCOMPARE_DURING_VERIFY));
        assert_eq!((stored(&memory, 3), stored(&memory, 4)), (7, 7));
        assert_eq!(memory.flushes.load(Ordering::SeqCst), 0);
        let durable = disk.execute(&cdb(3, 2, 0x08), buffer(7, 8, 2)).await;
        assert_eq!(durable, Completion::Good(Bytes::new()));
        assert_eq!(memory.flushes.load(Ordering::SeqCst), 1, "FUA flushed");
    }

    #[tokio::test]
    async fn wrong_fields_and_buffers_are_refused_before_anything_is_read() {
        let memory = Memory::new(16);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let invalid = |byte| Completion::Check(Sense::INVALID_FIELD_IN_CDB.at(byte, None));
        let cases = [
            (
                cdb(15, 2, 0),
                buffer(0, 1, 2),
                Completion::Check(Sense::LBA_OUT_OF_RANGE),
            ),
            (
                cdb(0, 1, 0x20),
                buffer(0, 1, 1),
                Completion::Check(Sense::INVALID_FIELD_IN_CDB.at(1, Some(7))),
            ),
            (cdb(0, 2, 0), buffer(0, 1, 1), invalid(13)),
        ];
        for (command, data, expected) in cases {
            assert_eq!(
                disk.execute(&command, data).await,
                expected,
                "{command:02x?}"
            );
        }
        assert!(memory.data.lock().unwrap().iter().all(|b| *b == 0));
        assert_eq!(data_out_len(&cdb(0, 3, 0), 6 * 4096), Ok(6 * 4096));
        // 256 blocks wrap the one-byte field to 0: the buffer gives it away.
        assert_eq!(
            data_out_len(&cdb(0, 0, 0), 512 * 4096),
            Err(Sense::INVALID_FIELD_IN_CDB.at(13, None))
        );
        assert_eq!(data_out_len(&cdb(0, 0, 0), 0), Ok(0));
    }

    #[tokio::test]
    async fn no_write_lands_between_the_compare_and_the_write() {
        let memory = Memory::new(16);
        let disk = Arc::new(Disk::new(Arc::clone(&memory), "vol"));
        // The compare-and-write is held in its read of block 5...
        memory.reads_open.send_replace(false);
        let swap = tokio::spawn({
            let disk = Arc::clone(&disk);
            async move { disk.execute(&cdb(5, 1, 0), buffer(0, 7, 1)).await }
        });
        while memory.reads_open.receiver_count() == 0 {
            tokio::task::yield_now().await;
        }
        // ...while a WRITE of that block comes, and must wait for it.
        let write = tokio::spawn({
            let disk = Arc::clone(&disk);
            let mut cdb = [0u8; 10];
            cdb[0] = cdb::opcode::WRITE_10;
            cdb[5] = 5;
            cdb[8] = 1;
            async move {
                disk.execute(&cdb, Bytes::from(vec![9; BLOCK_SIZE as usize]))
                    .await
            }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            !write.is_finished(),
            "a write landed inside a compare-and-write"
        );
        memory.reads_open.send_replace(true);
        assert_eq!(swap.await.unwrap(), Completion::Good(Bytes::new()));
        assert_eq!(write.await.unwrap(), Completion::Good(Bytes::new()));
        assert_eq!(stored(&memory, 5), 9, "the write came after");
    }
}
