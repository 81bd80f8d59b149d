//! A SCSI block device (SBC-4) over a volume, for the iSCSI target: the
//! fields of the commands' descriptor blocks ([`cdb`]), what INQUIRY tells
//! of the device ([`inquiry`]), and the sense data that says why a command
//! failed ([`sense`]).

pub mod cdb;
pub mod inquiry;
pub mod sense;
