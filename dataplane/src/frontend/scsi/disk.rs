//! The volume as a SCSI direct-access block device: one command descriptor
//! block and its data in, a status with data or sense out. Every field is
//! checked before the volume is touched; an I/O error of the volume
//! becomes the sense that makes the initiator's kernel report it as the
//! volume did (EIO, or ENOSPC when the replicas' disks are full), never a
//! silent success.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::RwLock;

use super::blocks::defect_data;
use super::cdb::opcode::*;
use super::cdb::{self, Transfer, action};
use super::compare_write::{self, COMPARE_AND_WRITE};
use super::inquiry::{self, MAX_TRANSFER_BLOCKS, UnitIdentity};
use super::mode::{self, MODE_SELECT_6, MODE_SELECT_10, MODE_SENSE_6, MODE_SENSE_10};
use super::opcodes;
use super::sense::{self, Sense};
use super::unmap::{UNMAP, WRITE_SAME_10, WRITE_SAME_16};
use super::verify;
use crate::frontend::{BLOCK_SIZE, BlockDevice};

/// How a command ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// GOOD, with the data the command returns (none for a write).
    Good(Bytes),
    /// CHECK CONDITION, and why.
    Check(Sense),
}

/// A logical unit serving a volume.
pub struct Disk<D> {
    pub(super) device: Arc<D>,
    identity: UnitIdentity,
    /// Held shared by every command that writes, and alone by COMPARE AND
    /// WRITE, which no write may come between.
    pub(super) writes: RwLock<()>,
}

impl<D: BlockDevice> Disk<D> {
    pub fn new(device: Arc<D>, volume: &str) -> Self {
        Self {
            device,
            identity: UnitIdentity::new(volume),
            writes: RwLock::new(()),
        }
    }

    /// Runs one command; `data_out` is what the initiator sent with it.
    pub async fn execute(&self, cdb: &[u8], data_out: Bytes) -> Completion {
        match self.run(cdb, data_out).await {
            Ok(data) => Completion::Good(data),
            Err(sense) => Completion::Check(sense),
        }
    }

    async fn run(&self, cdb: &[u8], data_out: Bytes) -> Result<Bytes, Sense> {
        let code = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
        let writes = matches!(
            code,
            WRITE_6
                | WRITE_10
                | WRITE_12
                | WRITE_16
                | WRITE_AND_VERIFY_10
                | WRITE_AND_VERIFY_12
                | WRITE_AND_VERIFY_16
                | WRITE_SAME_10
                | WRITE_SAME_16
                | UNMAP
        );
        let _shared = if writes {
            Some(self.writes.read().await)
        } else {
            None
        };
        match code {
            TEST_UNIT_READY => Ok(Bytes::new()),
            REQUEST_SENSE => sense::request_sense(cdb, Sense::NO_SENSE),
            INQUIRY => inquiry::inquiry(cdb, &self.identity).map(Bytes::from),
            READ_CAPACITY_10 => Ok(self.capacity_10()),
            MODE_SENSE_6 | MODE_SENSE_10 => mode::mode_sense(cdb, self.blocks()).map(Bytes::from),
            MODE_SELECT_6 | MODE_SELECT_10 => {
                mode::mode_select(cdb, &data_out, self.blocks()).map(|()| Bytes::new())
            }
            SERVICE_ACTION_IN_16 => match cdb::service_action(cdb)? {
                action::READ_CAPACITY_16 => self.capacity_16(cdb),
                action::GET_LBA_STATUS => self.lba_status(cdb),
                _ => Err(cdb::UNKNOWN_SERVICE_ACTION),
            },
            MAINTENANCE_IN => match cdb::service_action(cdb)? {
                action::REPORT_SUPPORTED_OPERATION_CODES => opcodes::report(cdb).map(Bytes::from),
                _ => Err(cdb::UNKNOWN_SERVICE_ACTION),
            },
            READ_6 | READ_10 | READ_12 | READ_16 => self.read(cdb::transfer(cdb)?).await,
            WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 => {
                self.write(cdb::transfer(cdb)?, data_out).await
            }
            VERIFY_10 | VERIFY_12 | VERIFY_16 => self.verify(cdb, data_out).await,
            WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12 | WRITE_AND_VERIFY_16 => {
                self.write_and_verify(cdb, data_out).await
            }
            PRE_FETCH_10 | PRE_FETCH_16 => self.prefetch(cdb),
            READ_DEFECT_DATA_10 | READ_DEFECT_DATA_12 => defect_data(cdb).map(Bytes::from),
            UNMAP => self.unmap(cdb, data_out).await,
            WRITE_SAME_10 | WRITE_SAME_16 => self.write_same(cdb, data_out).await,
            COMPARE_AND_WRITE => self.compare_and_write(cdb, data_out).await,
            SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => {
                self.device.flush().await.map_err(write_error)?;
                Ok(Bytes::new())
            }
            _ => Err(Sense::INVALID_OPCODE),
        }
    }

    /// The bytes a command takes from the initiator, known from its CDB
    /// (and for COMPARE AND WRITE, which takes exactly its buffer, the
    /// `expected` length the initiator sends), so that the transport asks
    /// for no more; a transfer above the block limits is refused before
    /// any data moves.
    pub fn data_out_len(&self, cdb: &[u8], expected: u32) -> Result<u32, Sense> {
        let code = *cdb.first().ok_or(Sense::INVALID_OPCODE)?;
        let bytes_of = |transfer: Transfer| {
            if transfer.blocks > MAX_TRANSFER_BLOCKS {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            // At most 4096 blocks of 4 KiB: fits in 32 bits.
            Ok(transfer.blocks * BLOCK_SIZE as u32)
        };
        match code {
            WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 => bytes_of(cdb::transfer(cdb)?),
            VERIFY_10 | VERIFY_12 | VERIFY_16 => match verify::byte_check(cdb)? {
                verify::ByteCheck::Each => bytes_of(cdb::block_range(cdb)?),
                verify::ByteCheck::One => Ok(BLOCK_SIZE as u32),
                verify::ByteCheck::None => Ok(0),
            },
            WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12 | WRITE_AND_VERIFY_16 => {
                bytes_of(verify::write_and_verify_range(cdb)?.0)
            }
            MODE_SELECT_6 | MODE_SELECT_10 => mode::parameter_list_length(cdb),
            UNMAP => match cdb.get(7..9) {
                Some(length) => Ok(u32::from(u16::from_be_bytes([length[0], length[1]]))),
                None => Err(Sense::INVALID_FIELD_IN_CDB),
            },
            WRITE_SAME_10 | WRITE_SAME_16 => Ok(BLOCK_SIZE as u32),
            COMPARE_AND_WRITE => compare_write::data_out_len(cdb, expected),
            _ => Ok(0),
        }
    }

    /// The number of logical blocks.
    pub(super) fn blocks(&self) -> u64 {
        self.device.size() / BLOCK_SIZE
    }

    /// Checks a transfer against the volume and the block limits page.
    pub(super) fn admit(&self, transfer: &Transfer) -> Result<(), Sense> {
        if transfer.blocks > MAX_TRANSFER_BLOCKS {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        transfer.within(self.blocks())
    }

    pub(super) async fn read(&self, transfer: Transfer) -> Result<Bytes, Sense> {
        self.admit(&transfer)?;
        if transfer.blocks == 0 {
            return Ok(Bytes::new());
        }
        let len = u64::from(transfer.blocks) * BLOCK_SIZE;
        // Within MAX_TRANSFER_BLOCKS: 16 MiB fits in usize.
        self.device
            .read(transfer.lba * BLOCK_SIZE, len as usize)
            .await
            .map_err(|_| Sense::UNRECOVERED_READ)
    }

    /// Writes the data the transport gathered for the command: the blocks
    /// the CDB names, or fewer whole blocks when the initiator expected to
    /// send fewer (its Expected Data Transfer Length below the CDB's, which
    /// the transport reports as an overflow): those are written, the rest
    /// untouched. With FUA, durable before GOOD.
    pub(super) async fn write(&self, transfer: Transfer, data: Bytes) -> Result<Bytes, Sense> {
        self.admit(&transfer)?;
        let len = data.len() as u64;
        if len > u64::from(transfer.blocks) * BLOCK_SIZE {
            return Err(Sense::INVALID_FIELD_IN_CDB);
        }
        if !len.is_multiple_of(BLOCK_SIZE) {
            return Err(Sense::INVALID_FIELD_IN_INFORMATION_UNIT);
        }
        if len == 0 {
            return Ok(Bytes::new());
        }
        let offset = transfer.lba * BLOCK_SIZE;
        self.device.write(offset, data).await.map_err(write_error)?;
        if transfer.fua {
            self.device.flush().await.map_err(write_error)?;
        }
        Ok(Bytes::new())
    }

    /// READ CAPACITY (10): the last block (all ones when it does not fit
    /// in 32 bits: the initiator then asks the 16-byte form) and its size.
    fn capacity_10(&self) -> Bytes {
        let last = self.blocks().saturating_sub(1);
        let last = u32::try_from(last).unwrap_or(u32::MAX);
        let mut data = Vec::with_capacity(8);
        data.extend_from_slice(&last.to_be_bytes());
        data.extend_from_slice(&(BLOCK_SIZE as u32).to_be_bytes());
        Bytes::from(data)
    }

    /// READ CAPACITY (16): the last block, its size, and thin provisioning
    /// (LBPME) with unmapped blocks reading zeros (LBPRZ).
    fn capacity_16(&self, cdb: &[u8]) -> Result<Bytes, Sense> {
        let allocation = cdb.get(10..14).ok_or(Sense::INVALID_FIELD_IN_CDB)?;
        let allocation =
            u32::from_be_bytes([allocation[0], allocation[1], allocation[2], allocation[3]]);
        let mut data = vec![0; 32];
        data[0..8].copy_from_slice(&self.blocks().saturating_sub(1).to_be_bytes());
        data[8..12].copy_from_slice(&(BLOCK_SIZE as u32).to_be_bytes());
        data[14] = 0x80 | 0x40;
        data.truncate(allocation as usize);
        Ok(Bytes::from(data))
    }
}

/// A failed write or flush: the disks are full, or no replica took it.
pub(super) fn write_error(error: io::Error) -> Sense {
    if error.kind() == io::ErrorKind::StorageFull {
        Sense::SPACE_ALLOCATION_FAILED
    } else {
        Sense::WRITE_ERROR
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use nix::libc;

    use super::*;
    use crate::frontend::scsi::memory::Memory;

    fn write_16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
        let mut cdb = [0; 16];
        cdb[0] = WRITE_16;
        cdb[1] = if fua { 0x08 } else { 0 };
        cdb[2..10].copy_from_slice(&lba.to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        cdb
    }

    fn read_10(lba: u32, blocks: u16) -> [u8; 10] {
        let mut cdb = [0; 10];
        cdb[0] = READ_10;
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        cdb
    }

    fn blocks(count: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; count * BLOCK_SIZE as usize])
    }

    #[tokio::test]
    async fn written_blocks_read_back_and_fua_flushes_before_good() {
        let memory = Memory::new(64);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let written = disk.execute(&write_16(3, 2, false), blocks(2, 7)).await;
        assert_eq!(written, Completion::Good(Bytes::new()));
        assert_eq!(memory.flushes.load(Ordering::SeqCst), 0);
        assert_eq!(
            disk.execute(&read_10(3, 2), Bytes::new()).await,
            Completion::Good(blocks(2, 7))
        );
        disk.execute(&write_16(5, 1, true), blocks(1, 9)).await;
        assert_eq!(memory.flushes.load(Ordering::SeqCst), 1, "FUA flushed");
        let sync = [SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            disk.execute(&sync, Bytes::new()).await,
            Completion::Good(Bytes::new())
        );
        assert_eq!(memory.flushes.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_write_given_fewer_whole_blocks_than_it_names_writes_only_those() {
        let memory = Memory::new(8);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let command = write_16(2, 3, false);
        assert_eq!(
            disk.execute(&command, blocks(1, 0xbb)).await,
            Completion::Good(Bytes::new())
        );
        let data = memory.data.lock().unwrap();
        assert!(data[2 * 4096..3 * 4096].iter().all(|b| *b == 0xbb));
        assert!(data[3 * 4096..].iter().all(|b| *b == 0));
    }

    #[tokio::test]
    async fn transfers_past_the_end_or_with_wrong_data_touch_nothing() {
        let memory = Memory::new(64);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        let cases = [
            (
                write_16(63, 2, false).to_vec(),
                blocks(2, 1),
                Sense::LBA_OUT_OF_RANGE,
            ),
            (
                write_16(0, 1, false).to_vec(),
                blocks(2, 1),
                Sense::INVALID_FIELD_IN_CDB,
            ),
            (
                write_16(0, 2, false).to_vec(),
                Bytes::from(vec![1; 4096 + 512]),
                Sense::INVALID_FIELD_IN_INFORMATION_UNIT,
            ),
            (
                read_10(64, 1).to_vec(),
                Bytes::new(),
                Sense::LBA_OUT_OF_RANGE,
            ),
            (
                write_16(0, MAX_TRANSFER_BLOCKS + 1, false).to_vec(),
                Bytes::new(),
                Sense::INVALID_FIELD_IN_CDB,
            ),
            (vec![0xff; 16], Bytes::new(), Sense::INVALID_OPCODE),
            (vec![], Bytes::new(), Sense::INVALID_OPCODE),
        ];
        for (cdb, data, sense) in cases {
            assert_eq!(
                disk.execute(&cdb, data).await,
                Completion::Check(sense),
                "{cdb:02x?}"
            );
        }
        assert!(
            !memory.touched.load(Ordering::SeqCst),
            "the volume was touched"
        );
    }

    #[tokio::test]
    async fn a_failing_volume_fails_the_command_with_the_matching_sense() {
        let memory = Memory::new(64);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        *memory.failing.lock().unwrap() = Some(libc::EIO);
        assert_eq!(
            disk.execute(&write_16(0, 1, false), blocks(1, 1)).await,
            Completion::Check(Sense::WRITE_ERROR)
        );
        assert_eq!(
            disk.execute(&read_10(0, 1), Bytes::new()).await,
            Completion::Check(Sense::UNRECOVERED_READ)
        );
        *memory.failing.lock().unwrap() = Some(libc::ENOSPC);
        assert_eq!(
            disk.execute(&write_16(0, 1, false), blocks(1, 1)).await,
            Completion::Check(Sense::SPACE_ALLOCATION_FAILED)
        );
    }

    #[tokio::test]
    async fn capacity_is_reported_in_4k_blocks_with_thin_provisioning() {
        let disk = Disk::new(Memory::new(64), "vol");
        let Completion::Good(data) = disk
            .execute(&[READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0], Bytes::new())
            .await
        else {
            panic!("READ CAPACITY (10) failed");
        };
        assert_eq!(&data[..], &[0, 0, 0, 63, 0, 0, 0x10, 0]);
        let mut cdb = [0; 16];
        cdb[0] = SERVICE_ACTION_IN_16;
        cdb[1] = action::READ_CAPACITY_16 as u8;
        cdb[13] = 32;
        let Completion::Good(data) = disk.execute(&cdb, Bytes::new()).await else {
            panic!("READ CAPACITY (16) failed");
        };
        assert_eq!(data.len(), 32);
        assert_eq!(u64::from_be_bytes(data[0..8].try_into().unwrap()), 63);
        assert_eq!(data[14] & 0xc0, 0xc0, "LBPME and LBPRZ");
        let sense = disk
            .execute(&[REQUEST_SENSE, 0, 0, 0, 18, 0], Bytes::new())
            .await;
        assert_eq!(
            sense,
            Completion::Good(Bytes::from(Sense::new(0, 0, 0).fixed().to_vec()))
        );
        let ready = disk
            .execute(&[TEST_UNIT_READY, 0, 0, 0, 0, 0], Bytes::new())
            .await;
        assert_eq!(ready, Completion::Good(Bytes::new()));
    }

    #[tokio::test]
    async fn mode_select_data_is_asked_for_and_what_mode_sense_gave_is_taken_back() {
        let disk = Disk::new(Memory::new(64), "vol");
        let sense_6 = [MODE_SENSE_6, 0, 0x3f, 0, 255, 0];
        let Completion::Good(sensed) = disk.execute(&sense_6, Bytes::new()).await else {
            panic!("MODE SENSE (6) failed");
        };
        let mut list = sensed.to_vec();
        list[0] = 0;
        let select_6 = [MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0];
        assert_eq!(
            disk.data_out_len(&select_6, u32::MAX),
            Ok(list.len() as u32)
        );
        let taken = disk.execute(&select_6, Bytes::from(list.clone())).await;
        assert_eq!(taken, Completion::Good(Bytes::new()));
        // Clearing WCE in the caching page, after the block descriptor.
        list[4 + 8 + 2] &= !0x04;
        assert_eq!(
            disk.execute(&select_6, Bytes::from(list)).await,
            Completion::Check(Sense::INVALID_FIELD_IN_PARAMETERS)
        );
        let select_10 = [MODE_SELECT_10, 0x10, 0, 0, 0, 0, 0, 0x01, 0x2c, 0];
        assert_eq!(disk.data_out_len(&select_10, u32::MAX), Ok(300));
        let mut saving = select_10;
        saving[1] |= 0x01;
        assert_eq!(
            disk.execute(&saving, Bytes::new()).await,
            Completion::Check(Sense::INVALID_FIELD_IN_CDB.at(1, Some(0)))
        );
    }
}
