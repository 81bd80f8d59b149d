//! REPORT SUPPORTED OPERATION CODES (SPC-5 §6.35): the commands the disk
//! serves ([`super::disk`], and REPORT LUNS from [`super::luns`]), each
//! with a CDB usage map, all at once or one at a time, with command
//! timeouts descriptors when asked.
//!
//! A usage map has the opcode in its first byte, the service action in
//! the field of the commands that have one, and elsewhere a bit set where
//! the command acts on the CDB's bit: fields refused unless zero (the
//! protection fields, ANCHOR, SP), ignored (group numbers, the control
//! byte, obsolete fields) or reserved are clear. DPO is set: it is a
//! cache hint the DPOFUA bit of MODE SENSE promises to take.

use super::cdb::opcode::*;
use super::cdb::{self, action, big_endian};
use super::compare_write::COMPARE_AND_WRITE;
use super::luns::REPORT_LUNS;
use super::mode::{MODE_SELECT_6, MODE_SELECT_10, MODE_SENSE_6, MODE_SENSE_10};
use super::sense::Sense;
use super::unmap::{UNMAP, WRITE_SAME_10, WRITE_SAME_16};

/// A command served, as this report describes it.
struct Command {
    /// The service action, for an opcode that has them.
    action: Option<u16>,
    /// The CDB usage data; its length is the CDB's.
    usage: &'static [u8],
}

impl Command {
    const fn new(usage: &'static [u8]) -> Self {
        Self {
            action: None,
            usage,
        }
    }

    /// A service action of SERVICE ACTION IN (16) or MAINTENANCE IN,
    /// which is in byte 1 of its usage data.
    const fn action(usage: &'static [u8]) -> Self {
        Self {
            action: Some(usage[1] as u16),
            usage,
        }
    }

    fn opcode(&self) -> u8 {
        self.usage[0]
    }
}

const DPO: u8 = 0x10;
const FUA: u8 = 0x08;
/// BYTCHK, both bits (VERIFY takes 01b and 11b) or the low one (WRITE AND
/// VERIFY takes 01b only).
const BYTCHK: u8 = 0x06;
const BYTCHK_01: u8 = 0x02;
const IMMED: u8 = 0x02;
const ALL: u8 = 0xff;

/// The commands served, by opcode then service action.
#[rustfmt::skip]
const COMMANDS: &[Command] = &[
    Command::new(&[TEST_UNIT_READY, 0, 0, 0, 0, 0]),
    // DESC; allocation length.
    Command::new(&[REQUEST_SENSE, 0x01, 0, 0, ALL, 0]),
    Command::new(&[READ_6, 0x1f, ALL, ALL, ALL, 0]),
    Command::new(&[WRITE_6, 0x1f, ALL, ALL, ALL, 0]),
    // EVPD, page code, allocation length.
    Command::new(&[INQUIRY, 0x01, ALL, ALL, ALL, 0]),
    // The parameter list length; PF is ignored, SP refused.
    Command::new(&[MODE_SELECT_6, 0, 0, 0, ALL, 0]),
    // DBD, PC and page code, subpage code, allocation length.
    Command::new(&[MODE_SENSE_6, 0x08, ALL, ALL, ALL, 0]),
    // The LBA and PMI are obsolete.
    Command::new(&[READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    Command::new(&[READ_10, DPO | FUA, ALL, ALL, ALL, ALL, 0, ALL, ALL, 0]),
    Command::new(&[WRITE_10, DPO | FUA, ALL, ALL, ALL, ALL, 0, ALL, ALL, 0]),
    Command::new(&[WRITE_AND_VERIFY_10, DPO | BYTCHK_01, ALL, ALL, ALL, ALL, 0, ALL, ALL, 0]),
    Command::new(&[VERIFY_10, DPO | BYTCHK, ALL, ALL, ALL, ALL, 0, ALL, ALL, 0]),
    Command::new(&[PRE_FETCH_10, IMMED, ALL, ALL, ALL, ALL, 0, ALL, ALL, 0]),
    // The whole cache is written, whatever the range.
    Command::new(&[SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    // REQ_PLIST, REQ_GLIST, format; allocation length.
    Command::new(&[READ_DEFECT_DATA_10, 0, 0x1f, 0, 0, 0, 0, ALL, ALL, 0]),
    // UNMAP; ANCHOR is refused.
    Command::new(&[WRITE_SAME_10, 0x08, ALL, ALL, ALL, ALL, 0, ALL, ALL, 0]),
    Command::new(&[UNMAP, 0, 0, 0, 0, 0, 0, ALL, ALL, 0]),
    Command::new(&[MODE_SELECT_10, 0, 0, 0, 0, 0, 0, ALL, ALL, 0]),
    // LLBAA and DBD.
    Command::new(&[MODE_SENSE_10, 0x18, ALL, ALL, 0, 0, 0, ALL, ALL, 0]),
    Command::new(&[READ_16, DPO | FUA, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    // LBA, then NUMBER OF LOGICAL BLOCKS in byte 13.
    Command::new(&[COMPARE_AND_WRITE, DPO | FUA, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0, 0, ALL, 0, 0]),
    Command::new(&[WRITE_16, DPO | FUA, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[WRITE_AND_VERIFY_16, DPO | BYTCHK_01, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[VERIFY_16, DPO | BYTCHK, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[PRE_FETCH_16, IMMED, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[SYNCHRONIZE_CACHE_16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    // UNMAP; ANCHOR and NDOB are refused.
    Command::new(&[WRITE_SAME_16, 0x08, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    // The LBA and PMI are obsolete; allocation length.
    Command::action(&[SERVICE_ACTION_IN_16, action::READ_CAPACITY_16 as u8, 0, 0, 0, 0, 0, 0, 0, 0, ALL, ALL, ALL, ALL, 0, 0]),
    // Starting LBA, allocation length; the report type is not looked at.
    Command::action(&[SERVICE_ACTION_IN_16, action::GET_LBA_STATUS as u8, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    // SELECT REPORT, allocation length.
    Command::new(&[REPORT_LUNS, 0, ALL, 0, 0, 0, ALL, ALL, ALL, ALL, 0, 0]),
    // RCTD and reporting options, requested opcode and service action,
    // allocation length.
    Command::action(&[MAINTENANCE_IN, action::REPORT_SUPPORTED_OPERATION_CODES as u8, 0x87, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[READ_12, DPO | FUA, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[WRITE_12, DPO | FUA, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[WRITE_AND_VERIFY_12, DPO | BYTCHK_01, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    Command::new(&[VERIFY_12, DPO | BYTCHK, ALL, ALL, ALL, ALL, ALL, ALL, ALL, ALL, 0, 0]),
    // REQ_PLIST, REQ_GLIST, format; the descriptor index is not looked at
    // (the lists are empty); allocation length.
    Command::new(&[READ_DEFECT_DATA_12, 0x1f, 0, 0, 0, 0, ALL, ALL, ALL, ALL, 0, 0]),
];

/// The command timeouts descriptor (SPC-5 §6.35.4): its length, 0x0a,
/// then no command-specific data and nominal and recommended timeouts of
/// 0, "not specified": a command takes as long as the replicas take.
const TIMEOUTS: [u8; 12] = [0, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// The SUPPORT field of the one-command format.
const NOT_SUPPORTED: u8 = 0x01;
const SUPPORTED: u8 = 0x03;

/// A reporting option that does not fit the opcode asked about, or none
/// of the standard's: the field at fault is REPORTING OPTIONS (byte 2,
/// bits 2-0). Initiators that probe (libiscsi) read a sense without a
/// field pointer as "command not implemented".
const BAD_REPORTING_OPTIONS: Sense = Sense::INVALID_FIELD_IN_CDB.at(2, Some(2));

/// The response to a REPORT SUPPORTED OPERATION CODES CDB, cut to its
/// allocation length.
pub fn report(cdb: &[u8]) -> Result<Vec<u8>, Sense> {
    let cdb = cdb::whole(cdb)?;
    let timeouts = cdb[2] & 0x80 != 0;
    let requested = cdb[3];
    let action = u16::from_be_bytes([cdb[4], cdb[5]]);
    let mut data = match cdb[2] & 0x07 {
        0 => all(timeouts),
        options @ 1..=3 => one(options, requested, action, timeouts)?,
        _ => return Err(BAD_REPORTING_OPTIONS),
    };
    data.truncate(usize::try_from(big_endian(&cdb[6..10])).unwrap_or(usize::MAX));
    Ok(data)
}

/// The all-commands format: a command descriptor for each.
fn all(timeouts: bool) -> Vec<u8> {
    let mut body = Vec::new();
    for command in COMMANDS {
        body.push(command.opcode());
        body.push(0);
        body.extend_from_slice(&command.action.unwrap_or(0).to_be_bytes());
        body.push(0);
        // CTDP and SERVACTV.
        body.push((u8::from(timeouts) << 1) | u8::from(command.action.is_some()));
        body.extend_from_slice(&(command.usage.len() as u16).to_be_bytes());
        if timeouts {
            body.extend_from_slice(&TIMEOUTS);
        }
    }
    let mut data = (body.len() as u32).to_be_bytes().to_vec();
    data.extend(body);
    data
}

/// The one-command format for the opcode (options 1), the opcode and
/// service action (2), or either as the opcode has service actions or
/// not (3; a non-zero action of an opcode without any is not supported).
fn one(options: u8, requested: u8, action: u16, timeouts: bool) -> Result<Vec<u8>, Sense> {
    let mut served = COMMANDS.iter().filter(|c| c.opcode() == requested);
    let has_actions = served.clone().next().map(|c| c.action.is_some());
    let wanted = match (options, has_actions) {
        (1, Some(true)) | (2, Some(false)) => return Err(BAD_REPORTING_OPTIONS),
        (3, Some(false)) if action != 0 => return Ok(vec![0, NOT_SUPPORTED, 0, 0]),
        (2 | 3, Some(true)) => Some(action),
        _ => None,
    };
    let Some(command) = served.find(|c| c.action == wanted) else {
        return Ok(vec![0, NOT_SUPPORTED, 0, 0]);
    };
    let mut data = vec![0, (u8::from(timeouts) << 7) | SUPPORTED];
    data.extend_from_slice(&(command.usage.len() as u16).to_be_bytes());
    data.extend_from_slice(command.usage);
    if timeouts {
        data.extend_from_slice(&TIMEOUTS);
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::frontend::scsi::disk::{Completion, Disk};
    use crate::frontend::scsi::luns::{DISK_LUN, Luns, lun_field};
    use crate::frontend::scsi::memory::Memory;

    fn rsoc(options: u8, requested: u8, action: u16, allocation: u32) -> [u8; 12] {
        let mut cdb = [0; 12];
        cdb[0] = MAINTENANCE_IN;
        cdb[1] = action::REPORT_SUPPORTED_OPERATION_CODES as u8;
        cdb[2] = options;
        cdb[3] = requested;
        cdb[4..6].copy_from_slice(&action.to_be_bytes());
        cdb[6..10].copy_from_slice(&allocation.to_be_bytes());
        cdb
    }

    /// (opcode, service action, SERVACTV, CTDP, CDB length) of each
    /// descriptor of the all-commands format.
    fn descriptors(data: &[u8]) -> Vec<(u8, u16, bool, bool, usize)> {
        let length = big_endian(&data[..4]) as usize;
        assert_eq!(length + 4, data.len());
        let mut at = 4;
        let mut found = Vec::new();
        while at < data.len() {
            let d = &data[at..at + 8];
            let ctdp = d[5] & 0x02 != 0;
            found.push((
                d[0],
                u16::from_be_bytes([d[2], d[3]]),
                d[5] & 0x01 != 0,
                ctdp,
                usize::from(u16::from_be_bytes([d[6], d[7]])),
            ));
            at += 8;
            if ctdp {
                assert_eq!(&data[at..at + 2], &[0, 0x0a], "timeouts length");
                at += 12;
            }
        }
        found
    }

    #[test]
    fn all_commands_are_listed_with_timeouts_only_when_asked() {
        for rctd in [false, true] {
            let data = report(&rsoc(u8::from(rctd) << 7, 0, 0, 65535)).unwrap();
            let found = descriptors(&data);
            assert_eq!(found.len(), COMMANDS.len());
            for (opcode, action, servactv, ctdp, length) in found {
                assert_eq!(ctdp, rctd);
                assert_eq!(Some(length), cdb::length(opcode), "{opcode:#x}");
                assert!(servactv || action == 0, "{opcode:#x}");
            }
        }
        // The order is by opcode then action, and each appears once.
        let keys: Vec<_> = COMMANDS.iter().map(|c| (c.opcode(), c.action)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(report(&rsoc(0, 0, 0, 10)).unwrap().len(), 10);
    }

    #[test]
    fn one_command_follows_the_opcodes_service_actions() {
        let read_10 = report(&rsoc(1, READ_10, 0, 512)).unwrap();
        assert_eq!(&read_10[..4], &[0, SUPPORTED, 0, 10]);
        assert_eq!(read_10[4], READ_10);
        assert_eq!(read_10[5] & 0x18, 0x18, "DPO and FUA");
        let verify = report(&rsoc(1, VERIFY_16, 0, 512)).unwrap();
        assert_eq!(verify[5] & 0x10, 0x10, "DPO");
        let timed = report(&rsoc(0x81, WRITE_16, 0, 512)).unwrap();
        assert_eq!(timed[1], 0x80 | SUPPORTED);
        assert_eq!(timed.len(), 4 + 16 + 12);
        assert_eq!(&timed[20..22], &[0, 0x0a]);
        let capacity = action::READ_CAPACITY_16;
        let rc16 = report(&rsoc(2, SERVICE_ACTION_IN_16, capacity, 512)).unwrap();
        assert_eq!(&rc16[4..6], &[SERVICE_ACTION_IN_16, capacity as u8]);
        assert_eq!(
            report(&rsoc(3, SERVICE_ACTION_IN_16, capacity, 512)),
            Ok(rc16)
        );
        // Options that do not fit the opcode point at themselves.
        assert_eq!(
            report(&rsoc(1, SERVICE_ACTION_IN_16, 0, 512)),
            Err(BAD_REPORTING_OPTIONS)
        );
        assert_eq!(
            report(&rsoc(2, READ_10, 0, 512)),
            Err(BAD_REPORTING_OPTIONS)
        );
        assert_eq!(
            report(&rsoc(4, READ_10, 0, 512)),
            Err(BAD_REPORTING_OPTIONS)
        );
        assert_eq!(report(&rsoc(3, READ_10, 0, 512)), Ok(read_10));
        // Commands not served are reported as such, without an error.
        let not_supported = Ok(vec![0, NOT_SUPPORTED, 0, 0]);
        assert_eq!(report(&rsoc(1, 0xc0, 0, 512)), not_supported);
        assert_eq!(report(&rsoc(2, 0x9f, 0x11, 512)), not_supported);
        assert_eq!(
            report(&rsoc(2, SERVICE_ACTION_IN_16, 0x05, 512)),
            not_supported
        );
        assert_eq!(report(&rsoc(3, READ_10, 1, 512)), not_supported);
        assert_eq!(
            report(&rsoc(0, 0, 0, 512)[..11]),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
    }

    fn luns() -> Luns<Memory> {
        Luns::new(Disk::new(Memory::new(256), "vol"), "vol")
    }

    /// The CDB that names `opcode` (and `action`) with every other field 0.
    fn bare(opcode: u8, action: Option<u16>) -> Vec<u8> {
        let mut cdb = vec![0; cdb::length(opcode).unwrap_or(16)];
        cdb[0] = opcode;
        if let Some(action) = action {
            cdb[1] = action as u8;
        }
        cdb
    }

    #[tokio::test]
    async fn the_list_is_exactly_what_the_disk_serves() {
        let luns = luns();
        let disk = lun_field(DISK_LUN);
        let listed = |opcode: u8, action: Option<u16>| {
            COMMANDS
                .iter()
                .any(|c| c.opcode() == opcode && c.action == action)
        };
        for opcode in 0..=255u8 {
            if matches!(opcode, SERVICE_ACTION_IN_16 | MAINTENANCE_IN) {
                assert!(!listed(opcode, None));
                for action in 0..32 {
                    let done = luns
                        .execute(disk, &bare(opcode, Some(action)), Bytes::new())
                        .await;
                    let unknown = Completion::Check(cdb::UNKNOWN_SERVICE_ACTION);
                    assert_eq!(
                        done != unknown,
                        listed(opcode, Some(action)),
                        "{opcode:#x}/{action:#x}: {done:?}"
                    );
                }
                continue;
            }
            let done = luns.execute(disk, &bare(opcode, None), Bytes::new()).await;
            let invalid = Completion::Check(Sense::INVALID_OPCODE);
            assert_eq!(
                done != invalid,
                listed(opcode, None),
                "{opcode:#x}: {done:?}"
            );
        }
    }

    #[tokio::test]
    async fn dpo_and_fua_are_taken_where_the_usage_data_says() {
        let luns = luns();
        let disk = lun_field(DISK_LUN);
        let takes_dpo = COMMANDS.iter().filter(|c| {
            matches!(
                c.opcode(),
                READ_10
                    | READ_12
                    | READ_16
                    | WRITE_10
                    | WRITE_12
                    | WRITE_16
                    | VERIFY_10
                    | VERIFY_12
                    | VERIFY_16
                    | WRITE_AND_VERIFY_10
                    | WRITE_AND_VERIFY_12
                    | WRITE_AND_VERIFY_16
            )
        });
        assert_eq!(takes_dpo.clone().count(), 12);
        for command in takes_dpo {
            assert_ne!(command.usage[1] & DPO, 0, "{:#x}", command.opcode());
            let mut cdb = bare(command.opcode(), None);
            cdb[1] = command.usage[1] & (DPO | FUA);
            // Zero blocks: no data either way.
            let done = luns.execute(disk, &cdb, Bytes::new()).await;
            assert_eq!(done, Completion::Good(Bytes::new()), "{cdb:02x?}");
        }
    }
}
