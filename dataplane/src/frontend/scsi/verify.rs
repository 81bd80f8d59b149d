//! VERIFY and WRITE AND VERIFY (SBC-4 §5.35, §5.44): blocks read back
//! from the volume and, when the BYTCHK field asks, compared with the data
//! the initiator sent; a difference is MISCOMPARE.

use bytes::Bytes;

use super::cdb::{self, Transfer};
use super::disk::Disk;
use super::sense::Sense;
use crate::frontend::{BLOCK_SIZE, BlockDevice};

/// What the BYTCHK field asks to compare the blocks with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteCheck {
    /// Nothing: the blocks are only read (00b).
    None,
    /// The data sent, block for block (01b).
    Each,
    /// One block sent, compared with every block (11b; VERIFY only).
    One,
}

/// The BYTCHK field of a VERIFY CDB (byte 1, bits 2-1); 10b is reserved.
pub fn byte_check(cdb: &[u8]) -> Result<ByteCheck, Sense> {
    let flags = cdb.get(1).ok_or(Sense::INVALID_FIELD_IN_CDB)?;
    match (flags >> 1) & 3 {
        0 => Ok(ByteCheck::None),
        1 => Ok(ByteCheck::Each),
        3 => Ok(ByteCheck::One),
        _ => Err(Sense::INVALID_FIELD_IN_CDB),
    }
}

/// The blocks a WRITE AND VERIFY names and whether it compares them with
/// the data: its BYTCHK takes 00b and 01b only, 11b being reserved for it.
pub fn write_and_verify_range(cdb: &[u8]) -> Result<(Transfer, bool), Sense> {
    let range = cdb::block_range(cdb)?;
    match byte_check(cdb)? {
        ByteCheck::None => Ok((range, false)),
        ByteCheck::Each => Ok((range, true)),
        ByteCheck::One => Err(Sense::INVALID_FIELD_IN_CDB),
    }
}

impl<D: BlockDevice> Disk<D> {
    /// VERIFY (10), (12) or (16): the blocks are read (BYTCHK 0), or
    /// compared with the data sent, block for block (1) or one block for
    /// all (3).
    pub(super) async fn verify(&self, cdb: &[u8], data: Bytes) -> Result<Bytes, Sense> {
        let transfer = cdb::block_range(cdb)?;
        self.admit(&transfer)?;
        let check = byte_check(cdb)?;
        let expected_len = match check {
            ByteCheck::None => 0,
            ByteCheck::Each => u64::from(transfer.blocks) * BLOCK_SIZE,
            ByteCheck::One => BLOCK_SIZE,
        };
        if data.len() as u64 != expected_len {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        if transfer.blocks == 0 {
            return Ok(Bytes::new());
        }
        let stored = self.read(transfer).await?;
        let same = match check {
            ByteCheck::None => true,
            ByteCheck::One => stored.chunks(BLOCK_SIZE as usize).all(|b| *b == data[..]),
            ByteCheck::Each => stored == data,
        };
        if same {
            Ok(Bytes::new())
        } else {
            Err(Sense::MISCOMPARE_DURING_VERIFY)
        }
    }

    /// WRITE AND VERIFY (10), (12) or (16): the data is written as WRITE
    /// writes it (fewer whole blocks than named when fewer came), made
    /// durable, since what is verified is the medium, then read back and,
    /// with BYTCHK 1, compared with what was sent.
    pub(super) async fn write_and_verify(&self, cdb: &[u8], data: Bytes) -> Result<Bytes, Sense> {
        let (range, compare) = write_and_verify_range(cdb)?;
        let durable = Transfer { fua: true, ..range };
        self.write(durable, data.clone()).await?;
        // `write` took whole blocks only, at most as many as named.
        let written = Transfer {
            blocks: (data.len() as u64 / BLOCK_SIZE) as u32,
            ..range
        };
        if written.blocks == 0 {
            return Ok(Bytes::new());
        }
        let stored = self.read(written).await?;
        if compare && stored != data {
            return Err(Sense::MISCOMPARE_DURING_VERIFY);
        }
        Ok(Bytes::new())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::frontend::scsi::cdb::opcode::*;
    use crate::frontend::scsi::disk::Completion;
    use crate::frontend::scsi::inquiry::MAX_TRANSFER_BLOCKS;
    use crate::frontend::scsi::memory::Memory;

    fn blocks(count: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; count * BLOCK_SIZE as usize])
    }

    /// A 16-byte CDB of READ's layout: `flags` in byte 1.
    fn cdb_16(code: u8, flags: u8, lba: u64, blocks: u32) -> [u8; 16] {
        let mut cdb = [0; 16];
        cdb[0] = code;
        cdb[1] = flags;
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        cdb
    }

    fn verify_16(lba: u64, blocks: u32, bytchk: u8) -> [u8; 16] {
        cdb_16(VERIFY_16, bytchk << 1, lba, blocks)
    }

    fn write_and_verify_10(lba: u32, blocks: u16, flags: u8) -> [u8; 10] {
        let mut cdb = [0; 10];
        cdb[0] = WRITE_AND_VERIFY_10;
        cdb[1] = flags;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        cdb
    }

    fn good() -> Completion {
        Completion::Good(Bytes::new())
    }

    #[tokio::test]
    async fn verify_compares_what_is_stored_with_what_is_sent() {
        let disk = Disk::new(Memory::new(16), "vol");
        disk.execute(&cdb_16(WRITE_16, 0, 4, 2), blocks(2, 3)).await;
        assert_eq!(
            disk.execute(&verify_16(4, 2, 0), Bytes::new()).await,
            good()
        );
        assert_eq!(
            disk.execute(&verify_16(4, 2, 1), blocks(2, 3)).await,
            good()
        );
        assert_eq!(
            disk.execute(&verify_16(4, 2, 3), blocks(1, 3)).await,
            good()
        );
        let miscompare = Completion::Check(Sense::MISCOMPARE_DURING_VERIFY);
        assert_eq!(
            disk.execute(&verify_16(4, 2, 1), blocks(2, 4)).await,
            miscompare
        );
        assert_eq!(
            disk.execute(&verify_16(3, 2, 3), blocks(1, 3)).await,
            miscompare
        );
        let invalid = Completion::Check(Sense::INVALID_FIELD_IN_CDB);
        assert_eq!(
            disk.execute(&verify_16(4, 2, 2), Bytes::new()).await,
            invalid
        );
        assert_eq!(
            disk.execute(&verify_16(4, 2, 1), blocks(1, 3)).await,
            invalid
        );
        let beyond = Completion::Check(Sense::LBA_OUT_OF_RANGE);
        assert_eq!(
            disk.execute(&verify_16(15, 2, 0), Bytes::new()).await,
            beyond
        );
    }

    #[tokio::test]
    async fn verify_12_takes_its_own_layout_and_the_dpo_hint() {
        let disk = Disk::new(Memory::new(16), "vol");
        disk.execute(&cdb_16(WRITE_16, 0, 5, 1), blocks(1, 9)).await;
        let mut cdb = [0; 12];
        cdb[0] = VERIFY_12;
        // DPO and BYTCHK 01b.
        cdb[1] = 0x10 | 0x02;
        cdb[5] = 5;
        cdb[9] = 1;
        assert_eq!(disk.execute(&cdb, blocks(1, 9)).await, good());
        assert_eq!(disk.data_out_len(&cdb, u32::MAX), Ok(4096));
        assert_eq!(
            disk.execute(&cdb, blocks(1, 8)).await,
            Completion::Check(Sense::MISCOMPARE_DURING_VERIFY)
        );
        // VRPROTECT: no protection information.
        cdb[1] |= 0x20;
        assert_eq!(
            disk.execute(&cdb, blocks(1, 9)).await,
            Completion::Check(Sense::INVALID_FIELD_IN_CDB)
        );
    }

    #[tokio::test]
    async fn write_and_verify_writes_durably_and_reads_back() {
        let memory = Memory::new(16);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        // BYTCHK 01b with DPO, then 00b.
        let command = write_and_verify_10(2, 2, 0x10 | 0x02);
        assert_eq!(disk.data_out_len(&command, u32::MAX), Ok(2 * 4096));
        assert_eq!(disk.execute(&command, blocks(2, 0xa6)).await, good());
        assert_eq!(memory.flushes.load(Ordering::SeqCst), 1, "durable");
        let read = disk.execute(&cdb_16(READ_16, 0, 2, 2), Bytes::new()).await;
        assert_eq!(read, Completion::Good(blocks(2, 0xa6)));
        let command = write_and_verify_10(15, 1, 0);
        assert_eq!(disk.execute(&command, blocks(1, 1)).await, good());
        // The 12- and 16-byte forms.
        let mut twelve = [0; 12];
        twelve[0] = WRITE_AND_VERIFY_12;
        twelve[1] = 0x02;
        twelve[5] = 7;
        twelve[9] = 1;
        assert_eq!(disk.execute(&twelve, blocks(1, 7)).await, good());
        let sixteen = cdb_16(WRITE_AND_VERIFY_16, 0x02, 8, 1);
        assert_eq!(disk.execute(&sixteen, blocks(1, 8)).await, good());
        let data = memory.data.lock().unwrap();
        assert_eq!((data[7 * 4096], data[8 * 4096], data[15 * 4096]), (7, 8, 1));
    }

    #[tokio::test]
    async fn write_and_verify_given_fewer_blocks_writes_and_checks_those() {
        let memory = Memory::new(16);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let command = write_and_verify_10(0, 2, 0x02);
        assert_eq!(disk.execute(&command, blocks(1, 0x62)).await, good());
        {
            let data = memory.data.lock().unwrap();
            assert!(data[..4096].iter().all(|b| *b == 0x62));
            assert!(data[4096..2 * 4096].iter().all(|b| *b == 0));
        }
        // No data at all: nothing written, nothing compared.
        assert_eq!(disk.execute(&command, Bytes::new()).await, good());
    }

    #[tokio::test]
    async fn write_and_verify_refuses_bad_fields_before_writing() {
        let memory = Memory::new(16);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let invalid = Sense::INVALID_FIELD_IN_CDB;
        let cases = [
            // BYTCHK 10b and 11b are reserved here.
            (write_and_verify_10(0, 1, 0x04).to_vec(), invalid),
            (write_and_verify_10(0, 1, 0x06).to_vec(), invalid),
            // WRPROTECT.
            (write_and_verify_10(0, 1, 0x22).to_vec(), invalid),
            (
                write_and_verify_10(16, 1, 0x02).to_vec(),
                Sense::LBA_OUT_OF_RANGE,
            ),
            (
                cdb_16(WRITE_AND_VERIFY_16, 0x02, u64::MAX, 1).to_vec(),
                Sense::LBA_OUT_OF_RANGE,
            ),
            (
                cdb_16(WRITE_AND_VERIFY_16, 0, u64::MAX, 0).to_vec(),
                Sense::LBA_OUT_OF_RANGE,
            ),
            (
                cdb_16(WRITE_AND_VERIFY_16, 0, 0, MAX_TRANSFER_BLOCKS + 1).to_vec(),
                invalid,
            ),
        ];
        for (cdb, sense) in cases {
            assert_eq!(
                disk.execute(&cdb, blocks(1, 1)).await,
                Completion::Check(sense),
                "{cdb:02x?}"
            );
        }
        assert_eq!(
            disk.data_out_len(&write_and_verify_10(0, 1, 0x06), u32::MAX),
            Err(invalid)
        );
        assert_eq!(
            disk.data_out_len(
                &cdb_16(WRITE_AND_VERIFY_16, 0, 0, MAX_TRANSFER_BLOCKS + 1),
                u32::MAX
            ),
            Err(invalid)
        );
        assert!(!memory.touched.load(Ordering::SeqCst));
    }
}
