//! Frontends: how a volume served by its engine becomes a block device on the
//! node it is attached to.

mod aligned;
pub mod device_link;
mod error;
pub mod fuse;
pub mod fuse_abi;
mod fuse_dev;
pub mod fuse_proto;
mod fuse_reply;
mod fuse_session;
mod fuse_uring;
mod fusefs;
pub mod iscsi;
pub mod loopdev;
pub mod scsi;

pub use error::{FrontendError, Result};
pub use fuse::{DEFAULT_DEV_DIR, FuseFrontend, FuseOptions, StopOutcome};
pub use fuse_session::{ENABLE_URING, FuseTransport};
pub use fusefs::FILE_NAME;

use std::future::Future;
use std::io;

use bytes::Bytes;

/// A volume's contents as the engine serves them. Offsets and lengths are in
/// bytes; callers keep them within [`BlockDevice::size`]. Errors are I/O errors
/// so that a frontend can hand them to the kernel as they are (EIO when no
/// replica is left, ENOSPC when a disk is full).
pub trait BlockDevice: Send + Sync + 'static {
    /// Size of the device in bytes, a multiple of [`BLOCK_SIZE`].
    fn size(&self) -> u64;
    /// Reads `len` bytes at `offset`; both multiples of [`BLOCK_SIZE`].
    fn read(&self, offset: u64, len: usize) -> impl Future<Output = io::Result<Bytes>> + Send;
    /// Writes `data` at `offset`; both multiples of [`BLOCK_SIZE`]. Durable
    /// once a later [`BlockDevice::flush`] completes.
    fn write(&self, offset: u64, data: Bytes) -> impl Future<Output = io::Result<()>> + Send;
    /// Makes every completed write durable.
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Discards `len` bytes at `offset` (both multiples of [`BLOCK_SIZE`]):
    /// they read as zeros afterwards.
    fn unmap(&self, offset: u64, len: u64) -> impl Future<Output = io::Result<()>> + Send;
}

pub use crate::BLOCK_SIZE;
