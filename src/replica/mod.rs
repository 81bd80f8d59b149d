//! One copy of a volume's data: a chain of sparse-file layers on a node's disk.
//!
//! # On-disk format
//!
//! A replica directory holds:
//! - `volume.meta`: JSON: size, block size
//!   (4096), head layer file, newest snapshot layer file, dirty and
//!   rebuilding flags;
//! - `revision.counter`: the persisted revision counter, 20 decimal digits
//!   and a newline;
//! - per layer, a sparse data file the size of the volume and its JSON
//!   metadata `<file>.meta` (name, parent layer file, created, user_created,
//!   labels). The head is `head-<n>.img`; snapshots are `snap-<name>.img`.
//!
//! A block belongs to a layer exactly when the layer's file has it allocated
//! (see `layer.rs` for why that is reliable, and checked). Metadata changes
//! are atomic renames; the chain is `volume.meta` -> head -> parent links.
//!
//! Modules: `extents` (block range sets), `layer` (one layer file), `store`
//! (open/create and I/O), `chain` (snapshot operations), `sync` (what a
//! rebuild copies), `rebuild` (pulling layers from another replica), `fence` (the volume, id, engine generation and I/O-path
//! record a replica keeps), `service` (the `oxhorn replica` process: data protocol
//! and control API), and small helpers for the directory, metadata, names
//! and the revision counter.

mod chain;
mod dir;
mod error;
mod extents;
mod fence;
mod layer;
mod lock;
mod meta;
mod naming;
mod rebuild;
mod revision;
mod service;
mod store;
mod sync;

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod testutil;

/// Every I/O is in whole blocks of this many bytes.
pub const BLOCK_SIZE: u64 = 4096;

pub use chain::SnapshotInfo;
pub use error::{Result, StorageError};
pub use extents::ExtentSet;
pub use meta::IoPath;
pub use naming::{SNAPSHOT_NAME_MAX, VOLUME_HEAD, validate_snapshot_name};
pub use service::{ReplicaConfig, run};
pub use store::{LayerFile, ReplicaStore};
pub use sync::{ChunkSummary, LayerSpec};
