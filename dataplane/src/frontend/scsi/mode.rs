//! MODE SENSE (6) and (10) (SPC-5 §6.13, §6.14): the caching page (a
//! write cache that SYNCHRONIZE CACHE and FUA empty, so the initiator's
//! kernel sends them), the control page and the informational exceptions
//! page, none of them changeable; and MODE SELECT (6) and (10) (§6.11,
//! §6.12), which therefore takes only what changes nothing.

use super::cdb;
use super::sense::Sense;
use crate::frontend::BLOCK_SIZE;

pub const MODE_SENSE_6: u8 = 0x1a;
pub const MODE_SENSE_10: u8 = 0x5a;
pub const MODE_SELECT_6: u8 = 0x15;
pub const MODE_SELECT_10: u8 = 0x55;

const CACHING: u8 = 0x08;
const CONTROL: u8 = 0x0a;
const INFORMATIONAL_EXCEPTIONS: u8 = 0x1c;
const ALL_PAGES: u8 = 0x3f;
/// The device-specific parameter of a block device: DPOFUA, FUA honoured.
const DPOFUA: u8 = 0x10;

/// The page control field: which values are asked for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Values {
    Current,
    Changeable,
    Default,
}

/// The response to a MODE SENSE CDB of either size for a device of
/// `blocks` blocks, cut to its allocation length.
pub fn mode_sense(cdb: &[u8], blocks: u64) -> Result<Vec<u8>, Sense> {
    let ten = cdb.first() == Some(&MODE_SENSE_10);
    let length = if ten { 10 } else { 6 };
    if cdb.len() < length {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let without_descriptor = cdb[1] & 0x08 != 0;
    let long = ten && cdb[1] & 0x10 != 0;
    let values = match cdb[2] >> 6 {
        0 => Values::Current,
        1 => Values::Changeable,
        2 => Values::Default,
        _ => return Err(Sense::SAVING_NOT_SUPPORTED),
    };
    let (page, subpage) = (cdb[2] & 0x3f, cdb[3]);
    let pages = pages(page, subpage, values)?;
    let descriptor = if without_descriptor {
        Vec::new()
    } else {
        block_descriptor(blocks, long)
    };
    let mut data = if ten {
        header_10(&descriptor, &pages, long)
    } else {
        header_6(&descriptor, &pages)
    };
    data.extend(descriptor);
    data.extend(pages);
    let allocation = if ten {
        usize::from(u16::from_be_bytes([cdb[7], cdb[8]]))
    } else {
        usize::from(cdb[4])
    };
    data.truncate(allocation);
    Ok(data)
}

fn pages(page: u8, subpage: u8, values: Values) -> Result<Vec<u8>, Sense> {
    let all = page == ALL_PAGES && (subpage == 0 || subpage == 0xff);
    if subpage != 0 && !all {
        return Err(Sense::INVALID_FIELD_IN_CDB);
    }
    let wanted = match page {
        ALL_PAGES => vec![CACHING, CONTROL, INFORMATIONAL_EXCEPTIONS],
        CACHING | CONTROL | INFORMATIONAL_EXCEPTIONS => vec![page],
        _ => return Err(Sense::INVALID_FIELD_IN_CDB),
    };
    Ok(wanted
        .into_iter()
        .flat_map(|page| one_page(page, values))
        .collect())
}

/// A page's bytes; its changeable values are all zero: nothing changes.
fn one_page(page: u8, values: Values) -> Vec<u8> {
    let mut data = match page {
        CACHING => vec![0; 20],
        _ => vec![0; 12],
    };
    data[0] = page;
    data[1] = (data.len() - 2) as u8;
    if values == Values::Changeable {
        return data;
    }
    match page {
        // WCE: a write is durable once flushed.
        CACHING => data[2] = 0x04,
        // Unrestricted reordering: the engine orders overlapping writes.
        CONTROL => data[3] = 0x10,
        _ => {}
    }
    data
}

fn block_descriptor(blocks: u64, long: bool) -> Vec<u8> {
    if long {
        let mut descriptor = vec![0; 16];
        descriptor[0..8].copy_from_slice(&blocks.to_be_bytes());
        descriptor[12..16].copy_from_slice(&(BLOCK_SIZE as u32).to_be_bytes());
        return descriptor;
    }
    let mut descriptor = vec![0; 8];
    let count = u32::try_from(blocks).unwrap_or(u32::MAX);
    descriptor[0..4].copy_from_slice(&count.to_be_bytes());
    descriptor[5..8].copy_from_slice(&(BLOCK_SIZE as u32).to_be_bytes()[1..]);
    descriptor
}

fn header_6(descriptor: &[u8], pages: &[u8]) -> Vec<u8> {
    // The three pages fit well within the one-byte length.
    let length = (3 + descriptor.len() + pages.len()) as u8;
    vec![length, 0, DPOFUA, descriptor.len() as u8]
}

fn header_10(descriptor: &[u8], pages: &[u8], long: bool) -> Vec<u8> {
    let length = (6 + descriptor.len() + pages.len()) as u16;
    let mut header = vec![0; 8];
    header[0..2].copy_from_slice(&length.to_be_bytes());
    header[3] = DPOFUA;
    header[4] = u8::from(long);
    header[6..8].copy_from_slice(&(descriptor.len() as u16).to_be_bytes());
    header
}

/// The bytes a MODE SELECT CDB of either size sends: its parameter list
/// length.
pub fn parameter_list_length(cdb: &[u8]) -> Result<u32, Sense> {
    let cdb = cdb::whole(cdb)?;
    Ok(if cdb[0] == MODE_SELECT_10 {
        u32::from(u16::from_be_bytes([cdb[7], cdb[8]]))
    } else {
        u32::from(cdb[4])
    })
}

/// MODE SELECT of either size with its parameter list, for a device of
/// `blocks` blocks: accepted when every value it carries is the current
/// one (nothing is changeable), refused with INVALID FIELD IN PARAMETER
/// LIST otherwise, and with PARAMETER LIST LENGTH ERROR when the list ends
/// inside a header, descriptor or page. PF is not looked at: the pages are
/// read in the standard's format either way.
pub fn mode_select(cdb: &[u8], list: &[u8], blocks: u64) -> Result<(), Sense> {
    let declared = parameter_list_length(cdb)? as usize;
    // SP: there are no saved pages to save to (SPC-5 §6.11).
    if cdb[1] & 0x01 != 0 {
        return Err(Sense::INVALID_FIELD_IN_CDB.at(1, Some(0)));
    }
    if declared == 0 {
        return Ok(());
    }
    let list = list.get(..declared).ok_or(Sense::PARAMETER_LIST_LENGTH)?;
    let ten = cdb[0] == MODE_SELECT_10;
    let header = if ten { 8 } else { 4 };
    if list.len() < header {
        return Err(Sense::PARAMETER_LIST_LENGTH);
    }
    // The mode data length is reserved here, and so, for a block device,
    // are the device-specific parameter's WP and DPOFUA bits.
    let (medium, long, descriptors) = if ten {
        let length = u16::from_be_bytes([list[6], list[7]]);
        (list[2], list[4] & 0x01 != 0, usize::from(length))
    } else {
        (list[1], false, usize::from(list[3]))
    };
    if medium != 0 {
        return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
    }
    let pages_at = header + descriptors;
    let descriptor = list
        .get(header..pages_at)
        .ok_or(Sense::PARAMETER_LIST_LENGTH)?;
    if !descriptor.is_empty() && !changes_nothing(descriptor, blocks, long) {
        return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
    }
    let mut pages = &list[pages_at..];
    while !pages.is_empty() {
        let length = usize::from(*pages.get(1).ok_or(Sense::PARAMETER_LIST_LENGTH)?) + 2;
        let page = pages.get(..length).ok_or(Sense::PARAMETER_LIST_LENGTH)?;
        // SPF: no page here has subpages. PS is reserved in MODE SELECT.
        let code = page[0] & 0x7f;
        if !matches!(code, CACHING | CONTROL | INFORMATIONAL_EXCEPTIONS)
            || page[1..] != one_page(code, Values::Current)[1..]
        {
            return Err(Sense::INVALID_FIELD_IN_PARAMETERS);
        }
        pages = &pages[length..];
    }
    Ok(())
}

/// Whether a block descriptor sent keeps the block size and the block
/// count (a count of 0 means "unchanged"): one descriptor at most, of the
/// size LONGLBA says.
fn changes_nothing(sent: &[u8], blocks: u64, long: bool) -> bool {
    let ours = block_descriptor(blocks, long);
    let count = if long { 8 } else { 4 };
    sent.len() == ours.len()
        && (sent[..count] == ours[..count] || sent[..count].iter().all(|b| *b == 0))
        && sent[count..] == ours[count..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caching_page_says_writes_are_cached_until_flushed() {
        let data = mode_sense(&[MODE_SENSE_6, 0, CACHING, 0, 255, 0], 64).unwrap();
        assert_eq!(usize::from(data[0]) + 1, data.len());
        assert_eq!(data[2] & DPOFUA, DPOFUA, "FUA honoured");
        assert_eq!(data[3], 8, "a short block descriptor");
        assert_eq!(&data[4..8], &64u32.to_be_bytes());
        assert_eq!(&data[9..12], &[0, 0x10, 0x00]);
        let page = &data[12..];
        assert_eq!((page[0], page[1]), (CACHING, 18));
        assert_eq!(page[2] & 0x04, 0x04, "WCE");
    }

    #[test]
    fn all_pages_in_the_ten_byte_form_with_a_long_descriptor() {
        let cdb = [MODE_SENSE_10, 0x10, ALL_PAGES, 0, 0, 0, 0, 0x10, 0, 0];
        let data = mode_sense(&cdb, 1 << 33).unwrap();
        let length = usize::from(u16::from_be_bytes([data[0], data[1]]));
        assert_eq!(length + 2, data.len());
        assert_eq!(data[4] & 1, 1, "LONGLBA");
        assert_eq!(u16::from_be_bytes([data[6], data[7]]), 16);
        assert_eq!(&data[8..16], &(1u64 << 33).to_be_bytes());
        let pages: Vec<u8> = {
            let mut at = 24;
            let mut codes = Vec::new();
            while at < data.len() {
                codes.push(data[at]);
                at += usize::from(data[at + 1]) + 2;
            }
            codes
        };
        assert_eq!(pages, [CACHING, CONTROL, INFORMATIONAL_EXCEPTIONS]);
    }

    #[test]
    fn nothing_is_changeable_saved_values_and_unknown_pages_are_refused() {
        let changeable = mode_sense(&[MODE_SENSE_6, 0x08, 0x40 | CACHING, 0, 255, 0], 64).unwrap();
        assert_eq!(changeable[3], 0, "no block descriptor with DBD");
        assert!(changeable[6..].iter().all(|b| *b == 0));
        assert_eq!(
            mode_sense(&[MODE_SENSE_6, 0, 0xc0 | CACHING, 0, 255, 0], 64),
            Err(Sense::SAVING_NOT_SUPPORTED)
        );
        assert_eq!(
            mode_sense(&[MODE_SENSE_6, 0, 0x19, 0, 255, 0], 64),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
        assert_eq!(
            mode_sense(&[MODE_SENSE_6, 0, CACHING, 1, 255, 0], 64),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
        assert_eq!(
            mode_sense(&[MODE_SENSE_6, 0, CACHING, 0, 4, 0], 64)
                .unwrap()
                .len(),
            4
        );
    }

    /// What MODE SENSE returns for all pages, as MODE SELECT sends it back.
    fn sensed(ten: bool) -> Vec<u8> {
        let cdb = if ten {
            vec![MODE_SENSE_10, 0, ALL_PAGES, 0, 0, 0, 0, 0x10, 0, 0]
        } else {
            vec![MODE_SENSE_6, 0, ALL_PAGES, 0, 255, 0]
        };
        let mut data = mode_sense(&cdb, 64).unwrap();
        // The mode data length is reserved in MODE SELECT.
        data[0] = 0;
        if ten {
            data[1] = 0;
        }
        data
    }

    fn select(ten: bool, flags: u8, list: &[u8]) -> Result<(), Sense> {
        let cdb = if ten {
            let [high, low] = (list.len() as u16).to_be_bytes();
            vec![MODE_SELECT_10, flags, 0, 0, 0, 0, 0, high, low, 0]
        } else {
            vec![MODE_SELECT_6, flags, 0, 0, list.len() as u8, 0]
        };
        assert_eq!(parameter_list_length(&cdb), Ok(list.len() as u32));
        mode_select(&cdb, list, 64)
    }

    #[test]
    fn mode_select_takes_back_what_mode_sense_gave() {
        for ten in [false, true] {
            let mut list = sensed(ten);
            assert_eq!(select(ten, 0x10, &list), Ok(()));
            // Without the block descriptor, with PS set as sensed pages
            // carry it, and with a count of 0 ("unchanged").
            let header = if ten { 8 } else { 4 };
            let mut without = list[..header].to_vec();
            without[header - 1] = 0;
            without.extend_from_slice(&list[header + 8..]);
            assert_eq!(select(ten, 0x10, &without), Ok(()));
            assert_eq!(select(ten, 0x10, &without[..header]), Ok(()));
            list[header + 8] |= 0x80;
            list[header..header + 4].fill(0);
            assert_eq!(select(ten, 0x10, &list), Ok(()));
        }
        assert_eq!(
            mode_select(&[MODE_SELECT_6, 0x10, 0, 0, 0, 0], &[], 64),
            Ok(())
        );
    }

    #[test]
    fn mode_select_refuses_any_change_and_saving() {
        let list = sensed(false);
        let refused = |at: usize, value: u8| {
            let mut changed = list.clone();
            changed[at] ^= value;
            select(false, 0x10, &changed)
        };
        let invalid = Err(Sense::INVALID_FIELD_IN_PARAMETERS);
        // Medium type, block count, block size.
        assert_eq!(refused(1, 0x01), invalid);
        assert_eq!(refused(7, 0x01), invalid);
        assert_eq!(refused(10, 0x01), invalid);
        // The caching page's WCE; the control page's SWP (byte 4 bit 3).
        let caching = 12;
        assert_eq!(refused(caching + 2, 0x04), invalid);
        let control = caching + 20;
        assert_eq!(refused(control + 4, 0x08), invalid);
        // A page with subpages, an unknown page, a page of another length.
        assert_eq!(refused(control, 0x40), invalid);
        assert_eq!(refused(control, 0x01), invalid);
        assert_eq!(refused(control + 1, 0x02), invalid);
        // A list that ends inside its header or a page.
        assert_eq!(
            select(false, 0x10, &list[..3]),
            Err(Sense::PARAMETER_LIST_LENGTH)
        );
        assert_eq!(
            select(false, 0x10, &list[..list.len() - 1]),
            Err(Sense::PARAMETER_LIST_LENGTH)
        );
        // Fewer bytes than the CDB declares.
        let cdb = [MODE_SELECT_6, 0x10, 0, 0, list.len() as u8 + 1, 0];
        assert_eq!(
            mode_select(&cdb, &list, 64),
            Err(Sense::PARAMETER_LIST_LENGTH)
        );
        // SP: nothing is saved.
        assert_eq!(
            select(false, 0x11, &list),
            Err(Sense::INVALID_FIELD_IN_CDB.at(1, Some(0)))
        );
        assert_eq!(
            mode_select(&[MODE_SELECT_10, 0, 0], &[], 64),
            Err(Sense::INVALID_FIELD_IN_CDB)
        );
    }
}
