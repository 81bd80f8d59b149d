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
//! (open/create and I/O), `group_commit` (flushes that share syncs),
//! `chain` (snapshot operations), `ownership` (the volume, id, highest
//! engine generation and I/O-path record a replica keeps), `fence`
//! (keeping superseded engines out of a running replica), `rebuild_store`
//! (the store's part of a rebuild: chunk summaries, layer reads, staged
//! layers), `rebuild_pull` (pulling a source replica's layers over its
//! control API), `service` (the `oxhorn replica` process: data
//! protocol and control API), and small helpers for the directory,
//! metadata, names and the revision counter. The engine's part of a rebuild
//! is `engine/rebuild.rs`.

mod chain;
mod checksum;
mod dir;
mod error;
mod extents;
mod fence;
mod group_commit;
mod intent;
mod layer;
mod lock;
mod meta;
mod naming;
mod ownership;
mod rebuild_pull;
mod rebuild_store;
mod revision;
mod scrub;
mod service;
mod store;

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod rot_tests;
#[cfg(test)]
mod testutil;

pub use crate::BLOCK_SIZE;

pub use chain::SnapshotInfo;
pub use error::{Result, StorageError};
pub use extents::ExtentSet;
pub use meta::IoPath;
pub use naming::{SNAPSHOT_NAME_MAX, VOLUME_HEAD, validate_snapshot_name};
pub use rebuild_store::{ChunkSummary, LayerSpec};
pub use scrub::LayerCheck;
pub use service::{ReplicaConfig, run, run_with_key};
pub use store::{LayerFile, ReplicaStore};
