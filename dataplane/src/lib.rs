//! Oxhorn's data plane: what holds and moves a volume's bytes, and nothing of
//! Kubernetes. The control plane (the `oxhorn` crate) starts these processes
//! and talks to them only through their control APIs.
//!
//! A write flows frontend -> engine -> protocol -> replica:
//! - [`frontend`]: the volume as a block device on its node (our iSCSI
//!   target, or a FUSE file attached to a loop device);
//! - [`engine`]: replicates a volume's I/O to its replicas, rebuilds them,
//!   and fences older engines out;
//! - [`protocol`]: the authenticated engine <-> replica data protocol and the
//!   processes' control APIs;
//! - [`replica`]: one copy of a volume's data, a chain of sparse-file layers
//!   on a node's disk;
//! - [`names`]: validation of names before they become paths or objects.

pub mod engine;
pub mod frontend;
pub mod names;
mod pace;
pub mod protocol;
pub mod replica;

/// The block size of every oxhorn volume: every I/O, at every layer, is in
/// whole blocks of this many bytes.
pub const BLOCK_SIZE: u64 = 4096;
