//! A SCSI block device (SBC-4) over a volume, for the iSCSI target:
//! [`disk`] runs commands against the volume, from the fields of their
//! descriptor blocks ([`cdb`]); [`inquiry`] says what the device is,
//! [`mode`] how it caches, and [`sense`] why a command failed; [`unmap`]
//! frees blocks. [`luns`] puts the disk behind a controller, as the
//! logical units of a target.

pub mod cdb;
pub mod disk;
pub mod inquiry;
pub mod luns;
#[cfg(test)]
pub(crate) mod memory;
pub mod mode;
pub mod sense;
pub mod unmap;
