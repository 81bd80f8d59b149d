//! The logical units a target serves: LUN 0 is a storage array controller
//! (SPC-5 peripheral type 0x0c) that answers an initiator's scan, and LUN 1
//! is the volume's disk. REPORT LUNS lists both from any LUN. Unit
//! attentions are kept per I_T nexus ([`Nexus`]): each remembers the
//! capacity it last saw, so a grown volume is reported once to every
//! session.

use bytes::Bytes;

use super::disk::{Completion, Disk};
use super::inquiry::{self, UnitIdentity};
use super::sense::{self, Sense};
use crate::frontend::BlockDevice;

/// The LUN the volume is served as.
pub const DISK_LUN: u16 = 1;
const CONTROLLER_LUN: u16 = 0;

pub const REPORT_LUNS: u8 = 0xa0;
const INQUIRY: u8 = 0x12;
const REQUEST_SENSE: u8 = 0x03;
const TEST_UNIT_READY: u8 = 0x00;

/// What one I_T nexus has been told about the disk.
#[derive(Debug)]
pub struct Nexus {
    /// The capacity in blocks as this nexus last learnt it.
    capacity: u64,
}

/// The logical units of one target.
pub struct Luns<D> {
    disk: Disk<D>,
    controller: UnitIdentity,
}

/// A LUN as the SAM-5 8-byte field addresses it (§4.7): single level,
/// peripheral or flat addressing; `None` for any other form.
pub fn lun_number(field: u64) -> Option<u16> {
    let [method, low, rest @ ..] = field.to_be_bytes();
    if rest != [0; 6] {
        return None;
    }
    match method >> 6 {
        // Peripheral device addressing with bus 0.
        0 if method == 0 => Some(u16::from(low)),
        // Flat space addressing.
        1 => Some(u16::from_be_bytes([method & 0x3f, low])),
        _ => None,
    }
}

/// The 8-byte field of a LUN below 256, in peripheral addressing.
pub fn lun_field(lun: u16) -> u64 {
    u64::from(lun) << 48
}

impl<D: BlockDevice> Luns<D> {
    pub fn new(disk: Disk<D>, volume: &str) -> Self {
        Self {
            disk,
            controller: UnitIdentity::controller(volume),
        }
    }

    /// The state of a new I_T nexus: it has seen the disk as it is now.
    pub fn nexus(&self) -> Nexus {
        Nexus {
            capacity: self.disk.blocks(),
        }
    }

    /// The unit attention a command to `lun` reports instead of running, if
    /// one is pending for `nexus` (SAM-5 §5.14): INQUIRY and REPORT LUNS
    /// run regardless, and REQUEST SENSE returns it as its data. Called in
    /// the order commands arrive, which is the order attentions reach them.
    pub fn unit_attention(&self, lun: u64, cdb: &[u8], nexus: &mut Nexus) -> Option<Completion> {
        if lun_number(lun) != Some(DISK_LUN) {
            return None;
        }
        let capacity = self.disk.blocks();
        if capacity == nexus.capacity {
            return None;
        }
        match cdb.first() {
            Some(&INQUIRY | &REPORT_LUNS) => None,
            Some(&REQUEST_SENSE) => match sense::request_sense(cdb, Sense::CAPACITY_CHANGED) {
                Ok(data) => {
                    nexus.capacity = capacity;
                    Some(Completion::Good(data))
                }
                Err(sense) => Some(Completion::Check(sense)),
            },
            _ => {
                nexus.capacity = capacity;
                Some(Completion::Check(Sense::CAPACITY_CHANGED))
            }
        }
    }

    /// The bytes a command takes from the initiator, of the `expected`
    /// it sends, known before any arrive.
    pub fn data_out_len(&self, lun: u64, cdb: &[u8], expected: u32) -> Result<u32, Sense> {
        match lun_number(lun) {
            Some(DISK_LUN) => self.disk.data_out_len(cdb, expected),
            _ => Ok(0),
        }
    }

    /// Runs one command addressed to `lun`.
    pub async fn execute(&self, lun: u64, cdb: &[u8], data_out: Bytes) -> Completion {
        if cdb.first() == Some(&REPORT_LUNS) {
            return report_luns(cdb).map_or_else(Completion::Check, Completion::Good);
        }
        match lun_number(lun) {
            Some(DISK_LUN) => self.disk.execute(cdb, data_out).await,
            Some(CONTROLLER_LUN) => self.controller(cdb),
            _ => absent(cdb),
        }
    }

    /// LUN 0 answers what a scan asks and nothing else.
    fn controller(&self, cdb: &[u8]) -> Completion {
        let result = match cdb.first() {
            Some(&INQUIRY) => inquiry::inquiry(cdb, &self.controller).map(Bytes::from),
            Some(&TEST_UNIT_READY) => Ok(Bytes::new()),
            Some(&REQUEST_SENSE) => sense::request_sense(cdb, Sense::NO_SENSE),
            _ => Err(Sense::INVALID_OPCODE),
        };
        result.map_or_else(Completion::Check, Completion::Good)
    }
}

/// A LUN nothing is served at: INQUIRY says so (peripheral qualifier 3),
/// everything else fails with LOGICAL UNIT NOT SUPPORTED.
fn absent(cdb: &[u8]) -> Completion {
    if cdb.first() != Some(&INQUIRY) || cdb.len() < 6 {
        return Completion::Check(Sense::LUN_NOT_SUPPORTED);
    }
    let mut data = vec![0; 36];
    data[0] = 0x7f;
    data[4] = 31;
    data.truncate(usize::from(u16::from_be_bytes([cdb[3], cdb[4]])));
    Completion::Good(Bytes::from(data))
}

/// REPORT LUNS (SPC-5 §6.33): LUNs 0 and 1 for the select reports that
/// list logical units, none for the well-known ones.
fn report_luns(cdb: &[u8]) -> Result<Bytes, Sense> {
    if cdb.len() < 12 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let allocation = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]);
    // SPC-5: an allocation length under 16 is an invalid field.
    if allocation < 16 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let luns: &[u16] = match cdb[2] {
        0x00 | 0x02 => &[CONTROLLER_LUN, DISK_LUN],
        0x01 | 0x10..=0x12 => &[],
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    let mut data = Vec::with_capacity(8 + 8 * luns.len());
    data.extend_from_slice(&(8 * luns.len() as u32).to_be_bytes());
    data.extend_from_slice(&[0; 4]);
    for lun in luns {
        data.extend_from_slice(&lun_field(*lun).to_be_bytes());
    }
    data.truncate(allocation as usize);
    Ok(Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::frontend::scsi::memory::Memory;

    fn luns(blocks: u64) -> (Arc<Memory>, Luns<Memory>) {
        let memory = Memory::new(blocks);
        let disk = Disk::new(Arc::clone(&memory), "vol");
        (memory, Luns::new(disk, "vol"))
    }

    fn good(completion: Completion) -> Bytes {
        match completion {
            Completion::Good(data) => data,
            Completion::Check(sense) => panic!("CHECK CONDITION {sense:?}"),
        }
    }

    #[test]
    fn luns_are_read_in_peripheral_and_flat_addressing() {
        assert_eq!(lun_number(lun_field(1)), Some(1));
        assert_eq!(lun_number(0x4001 << 48), Some(1));
        assert_eq!(lun_number(0x4101 << 48), Some(0x101));
        assert_eq!(lun_number(0), Some(0));
        // Bus 1, or a second level: not addressed here.
        assert_eq!(lun_number(0x0101 << 48), None);
        assert_eq!(lun_number(0x0001_0001 << 32), None);
    }

    #[tokio::test]
    async fn report_luns_lists_the_controller_and_the_disk_from_any_lun() {
        let (_, luns) = luns(16);
        let mut cdb = [0; 12];
        cdb[0] = REPORT_LUNS;
        cdb[6..10].copy_from_slice(&64u32.to_be_bytes());
        for lun in [0, 1, 7] {
            let data = good(luns.execute(lun_field(lun), &cdb, Bytes::new()).await);
            assert_eq!(&data[..4], &16u32.to_be_bytes());
            assert_eq!(&data[8..16], &lun_field(0).to_be_bytes());
            assert_eq!(&data[16..24], &lun_field(1).to_be_bytes());
        }
        cdb[6..10].copy_from_slice(&8u32.to_be_bytes());
        assert_eq!(
            luns.execute(0, &cdb, Bytes::new()).await,
            Completion::Check(Sense::INVALID_FIELD_IN_CDB)
        );
    }

    #[tokio::test]
    async fn lun_0_is_a_controller_and_other_luns_are_absent() {
        let (memory, luns) = luns(16);
        let inquiry = [INQUIRY, 0, 0, 0, 96, 0];
        let data = good(luns.execute(0, &inquiry, Bytes::new()).await);
        assert_eq!(data[0], 0x0c);
        let data = good(luns.execute(lun_field(1), &inquiry, Bytes::new()).await);
        assert_eq!(data[0], 0x00);
        let data = good(luns.execute(lun_field(2), &inquiry, Bytes::new()).await);
        assert_eq!(data[0], 0x7f);
        let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        assert_eq!(
            luns.execute(0, &read, Bytes::new()).await,
            Completion::Check(Sense::INVALID_OPCODE)
        );
        assert_eq!(
            luns.execute(lun_field(2), &read, Bytes::new()).await,
            Completion::Check(Sense::LUN_NOT_SUPPORTED)
        );
        assert!(!memory.touched.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn a_grown_disk_is_reported_once_to_each_nexus() {
        let (memory, luns) = luns(16);
        let mut first = luns.nexus();
        let mut second = luns.nexus();
        let tur = [TEST_UNIT_READY, 0, 0, 0, 0, 0];
        let disk = lun_field(DISK_LUN);
        assert!(luns.unit_attention(disk, &tur, &mut first).is_none());
        memory.data.lock().unwrap().resize(32 * 4096, 0);
        // INQUIRY runs and leaves the attention pending.
        let inquiry = [INQUIRY, 0, 0, 0, 96, 0];
        assert!(luns.unit_attention(disk, &inquiry, &mut first).is_none());
        assert_eq!(
            luns.unit_attention(disk, &tur, &mut first),
            Some(Completion::Check(Sense::CAPACITY_CHANGED))
        );
        assert!(luns.unit_attention(disk, &tur, &mut first).is_none());
        // The other nexus learns it through REQUEST SENSE.
        let request_sense = [REQUEST_SENSE, 0, 0, 0, 18, 0];
        let Some(Completion::Good(sense)) = luns.unit_attention(disk, &request_sense, &mut second)
        else {
            panic!("REQUEST SENSE did not return the attention");
        };
        assert_eq!((sense[2], sense[12], sense[13]), (0x06, 0x2a, 0x09));
        assert!(luns.unit_attention(disk, &tur, &mut second).is_none());
        // The controller has no attentions.
        assert!(luns.unit_attention(0, &tur, &mut luns.nexus()).is_none());
    }
}
