//! A SCSI block device (SBC-4) over a volume, for the iSCSI target:
//! [`disk`] runs commands against the volume, from the fields of their
//! descriptor blocks ([`cdb`]); [`inquiry`] says what the device is,
//! [`mode`] how it caches, [`opcodes`] which commands it serves, and
//! [`sense`] why a command failed; [`unmap`] frees blocks, [`verify`]
//! reads them back to compare, [`compare_write`] swaps them atomically, and [`blocks`] answers about blocks
//! without moving them. [`luns`] puts the disk behind a controller, as
//! the logical units of a target.

pub mod blocks;
pub mod cdb;
pub mod compare_write;
pub mod disk;
pub mod inquiry;
pub mod luns;
#[cfg(test)]
pub(crate) mod memory;
pub mod mode;
pub mod opcodes;
pub mod sense;
pub mod unmap;
pub mod verify;
