//! INQUIRY (SPC-5 §6.7): the standard data, and the vital product data
//! pages an initiator reads to know the device: its serial number and
//! identifiers, its transfer and unmap limits, that it does not rotate, and
//! that it is thin-provisioned with unmapped blocks reading as zeros.

use super::sense::Sense;

/// Most blocks one command transfers (16 MiB of 4 KiB blocks), which also
/// bounds what the target buffers for one command.
pub const MAX_TRANSFER_BLOCKS: u32 = 4096;
/// Most blocks one UNMAP (all its descriptors together) or one WRITE SAME
/// names.
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 18;
/// Most descriptors one UNMAP carries.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// The VPD pages served, in order (page 0 lists them): a disk's, and a
/// controller's, which has no blocks to describe.
const PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2];
const CONTROLLER_PAGES: [u8; 3] = [0x00, 0x80, 0x83];

/// Peripheral device types (SPC-5 §6.7.2).
const DIRECT_ACCESS: u8 = 0x00;
const STORAGE_ARRAY_CONTROLLER: u8 = 0x0c;

/// Who the logical unit is: stable for a volume across engines and nodes,
/// so that multipath and udev name the same disk the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitIdentity {
    volume: String,
    /// The peripheral device type.
    kind: u8,
    /// An NAA "locally assigned" identifier (NAA 3): 60 bits from the
    /// volume's name.
    naa: u64,
}

impl UnitIdentity {
    /// The disk serving `volume`.
    pub fn new(volume: &str) -> Self {
        Self::of(volume, DIRECT_ACCESS)
    }

    /// The controller in front of `volume`'s disk, with an identity of its
    /// own.
    pub fn controller(volume: &str) -> Self {
        Self::of(&format!("{volume}/controller"), STORAGE_ARRAY_CONTROLLER)
    }

    fn of(name: &str, kind: u8) -> Self {
        let hash = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        Self {
            volume: name.to_owned(),
            kind,
            naa: (3 << 60) | (hash & ((1 << 60) - 1)),
        }
    }

    fn pages(&self) -> &'static [u8] {
        match self.kind {
            DIRECT_ACCESS => &PAGES,
            _ => &CONTROLLER_PAGES,
        }
    }

    /// The unit serial number: the NAA identifier in hex.
    pub fn serial(&self) -> String {
        format!("{:016x}", self.naa)
    }
}

/// The response to an INQUIRY CDB, cut to its allocation length.
pub fn inquiry(cdb: &[u8], unit: &UnitIdentity) -> Result<Vec<u8>, Sense> {
    if cdb.len() < 6 {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let evpd = cdb[1] & 0x01 != 0;
    let page = cdb[2];
    let allocation = usize::from(u16::from_be_bytes([cdb[3], cdb[4]]));
    let mut data = match (evpd, page) {
        (false, 0) => standard(unit.kind),
        (false, _) => return Err(Sense::INVALID_FIELD_IN_CDB),
        (true, page) => vpd(page, unit)?,
    };
    data.truncate(allocation);
    Ok(data)
}

fn standard(kind: u8) -> Vec<u8> {
    let mut data = vec![0; 96];
    // Byte 0: a connected device of its type.
    data[0] = kind;
    data[2] = 0x06; // SPC-4
    data[3] = 0x12; // HiSup, response data format 2
    data[4] = (data.len() - 5) as u8;
    data[7] = 0x02; // CmdQue: tasks are queued
    data[8..16].copy_from_slice(b"OXHORN  ");
    data[16..32].copy_from_slice(b"VOLUME          ");
    data[32..36].copy_from_slice(b"0001");
    // Version descriptors: SAM-5, iSCSI, SBC-3, SPC-4.
    for (i, version) in [0x00a0u16, 0x0960, 0x04c0, 0x0460].iter().enumerate() {
        data[58 + 2 * i..60 + 2 * i].copy_from_slice(&version.to_be_bytes());
    }
    data
}

fn vpd(page: u8, unit: &UnitIdentity) -> Result<Vec<u8>, Sense> {
    if !unit.pages().contains(&page) {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let body = match page {
        0x00 => unit.pages().to_vec(),
        0x80 => unit.serial().into_bytes(),
        0x83 => identifiers(unit),
        0xb0 => block_limits(),
        0xb1 => characteristics(),
        0xb2 => provisioning(),
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    let mut data = vec![unit.kind, page];
    // Every body here is far below 64 KiB.
    data.extend_from_slice(&(body.len() as u16).to_be_bytes());
    data.extend(body);
    Ok(data)
}

/// Page 0x83: the NAA identifier, and a T10 vendor identifier naming the
/// volume, both of the logical unit.
fn identifiers(unit: &UnitIdentity) -> Vec<u8> {
    let mut body = Vec::new();
    // Binary code set, association LU, type NAA.
    body.extend_from_slice(&[0x01, 0x03, 0x00, 0x08]);
    body.extend_from_slice(&unit.naa.to_be_bytes());
    let mut vendor = b"OXHORN  ".to_vec();
    vendor.extend_from_slice(unit.volume.as_bytes());
    // ASCII code set, association LU, type T10 vendor ID; at most 255
    // bytes (volume names are far shorter).
    vendor.truncate(255);
    body.extend_from_slice(&[0x02, 0x01, 0x00, vendor.len() as u8]);
    body.extend(vendor);
    body
}

/// Page 0xb0: what one command may transfer and unmap.
fn block_limits() -> Vec<u8> {
    let mut body = vec![0; 60];
    // WSNZ: a WRITE SAME of 0 blocks is refused, not taken as "to the end".
    body[0] = 0x01;
    body[1] = super::compare_write::MAX_COMPARE_WRITE_BLOCKS;
    // Optimal transfer length granularity: one block.
    body[2..4].copy_from_slice(&1u16.to_be_bytes());
    body[4..8].copy_from_slice(&MAX_TRANSFER_BLOCKS.to_be_bytes());
    // Optimal transfer length stays 0 (none): Linux would size readahead
    // from it.
    body[16..20].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
    body[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
    // Optimal unmap granularity: one block.
    body[24..28].copy_from_slice(&1u32.to_be_bytes());
    body[32..40].copy_from_slice(&u64::from(MAX_UNMAP_BLOCKS).to_be_bytes());
    body
}

/// Page 0xb1: a non-rotating medium.
fn characteristics() -> Vec<u8> {
    let mut body = vec![0; 60];
    body[0..2].copy_from_slice(&1u16.to_be_bytes());
    body
}

/// Page 0xb2: thin-provisioned; UNMAP and WRITE SAME with UNMAP free
/// blocks, which then read as zeros.
fn provisioning() -> Vec<u8> {
    // LBPU, LBPWS, LBPWS10 and LBPRZ; provisioning type 2 (thin).
    vec![0, 0xe4, 0x02, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdb(evpd: bool, page: u8, allocation: u16) -> [u8; 6] {
        let [high, low] = allocation.to_be_bytes();
        [0x12, u8::from(evpd), page, high, low, 0]
    }

    #[test]
    fn the_standard_data_names_a_block_device_with_queueing() {
        let unit = UnitIdentity::new("vol");
        let data = inquiry(&cdb(false, 0, 255), &unit).unwrap();
        assert_eq!(data.len(), 96);
        assert_eq!(data[0], 0x00);
        assert_eq!(usize::from(data[4]) + 5, data.len());
        assert_eq!(&data[8..16], b"OXHORN  ");
        assert_eq!(data[7] & 0x02, 0x02);
        // Cut to the allocation length.
        assert_eq!(inquiry(&cdb(false, 0, 36), &unit).unwrap().len(), 36);
        assert_eq!(
            inquiry(&cdb(false, 0x80, 255), &unit),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
    }

    #[test]
    fn vpd_pages_list_themselves_and_identify_the_volume_stably() {
        let unit = UnitIdentity::new("pvc-1");
        let supported = inquiry(&cdb(true, 0, 255), &unit).unwrap();
        assert_eq!(&supported[4..], &PAGES);
        for page in PAGES {
            let data = inquiry(&cdb(true, page, 1024), &unit).unwrap();
            assert_eq!(data[1], page);
            let length = usize::from(u16::from_be_bytes([data[2], data[3]]));
            assert_eq!(length + 4, data.len(), "page {page:#x}");
        }
        let ids = inquiry(&cdb(true, 0x83, 1024), &unit).unwrap();
        let naa = u64::from_be_bytes(ids[8..16].try_into().unwrap());
        assert_eq!(naa >> 60, 3, "NAA locally assigned");
        assert_eq!(UnitIdentity::new("pvc-1"), unit);
        assert_ne!(UnitIdentity::new("pvc-2").naa, unit.naa);
        let serial = inquiry(&cdb(true, 0x80, 1024), &unit).unwrap();
        assert_eq!(&serial[4..], format!("{naa:016x}").as_bytes());
        let provisioning = inquiry(&cdb(true, 0xb2, 1024), &unit).unwrap();
        assert_eq!(
            provisioning[5] & 0xe0,
            0xe0,
            "UNMAP and both WRITE SAMEs unmap"
        );
        assert_eq!(provisioning[5] & 0x04, 0x04, "unmapped blocks read zeros");
        assert_eq!(provisioning[6] & 0x07, 0x02, "thin");
        assert_eq!(
            inquiry(&cdb(true, 0x99, 255), &unit),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
        assert_eq!(inquiry(&[0x12, 1], &unit), Err(Sense::INVALID_FIELD_IN_CDB));
    }
}
