//! The store's part of a rebuild: summarising a snapshot layer in chunks, reading a layer's
//! own data, and, on the replica being rebuilt, patching or creating layers
//! and installing the source's chain.
//!
//! A chunk's summary hashes which blocks the layer holds in it and their
//! data, so two layers with equal summaries read identically through that
//! chunk, holes included; a rebuild copies only chunks whose summaries
//! differ. Layers not yet in the chain are "staged": they take writes but
//! serve no reads until [`ReplicaStore::install_chain`] links them in.

use std::collections::BTreeMap;

use xxhash_rust::xxh3::Xxh3;

use super::BLOCK_SIZE;
use super::error::{Result, StorageError};
use super::extents::ExtentSet;
use super::layer::{Layer, buf_range};
use super::lock;
use super::meta::LayerMeta;
use super::naming::{meta_file, snapshot_file, snapshot_name_of, validate_snapshot_name};
use super::store::{ReplicaStore, State};

/// The summary checksum of a chunk holding a block that fails its own
/// checksum: it never counts as matching, so a rebuild target copies the
/// chunk again, and a source's rotten block fails the copy's read rather
/// than reach the target.
pub const ROTTEN_CHUNK: u64 = u64::MAX;

/// What a chunk of a layer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSummary {
    pub index: u64,
    /// Zero when checksums were not asked for.
    pub checksum: u64,
    /// Bytes the layer holds in the chunk.
    pub bytes: u64,
}

/// A snapshot layer as the source describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    pub name: String,
    pub created: u64,
    pub user_created: bool,
    pub labels: BTreeMap<String, String>,
}

impl State {
    /// A snapshot layer in the chain or staged for it.
    fn layer(&self, name: &str) -> Option<&Layer> {
        let file = snapshot_file(name);
        self.snapshots
            .iter()
            .chain(self.staged.values())
            .find(|layer| layer.file_name == file)
    }

    pub(super) fn layer_or_err(&self, name: &str) -> Result<&Layer> {
        self.layer(name)
            .ok_or_else(|| StorageError::SnapshotNotFound(name.to_string()))
    }
}

fn chunk_blocks(chunk_size: u64) -> Result<u64> {
    if chunk_size == 0 || !chunk_size.is_multiple_of(BLOCK_SIZE) {
        return Err(StorageError::Unaligned {
            offset: 0,
            len: chunk_size,
        });
    }
    Ok(chunk_size / BLOCK_SIZE)
}

/// The layer's extents grouped by chunk index.
fn by_chunk(extents: &ExtentSet, per_chunk: u64) -> BTreeMap<u64, Vec<(u64, u64)>> {
    let mut chunks: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for (start, end) in extents.iter() {
        let mut s = start;
        while s < end {
            let index = s / per_chunk;
            let e = end.min((index + 1) * per_chunk);
            chunks.entry(index).or_default().push((s, e));
            s = e;
        }
    }
    chunks
}

impl ReplicaStore {
    /// Summaries of the chunks of snapshot `name` (or the head, as
    /// [`VOLUME_HEAD`](crate::replica::VOLUME_HEAD)) that hold data, in order.
    /// Checksums cost a full read of the layer; ask for them only when there
    /// is something to compare with.
    pub fn layer_chunks(
        &self,
        name: &str,
        chunk_size: u64,
        checksums: bool,
    ) -> Result<Vec<ChunkSummary>> {
        let per_chunk = chunk_blocks(chunk_size)?;
        let state = lock::read(&self.state)?;
        let layer = state.any_layer(name)?;
        let mut buf = Vec::new();
        by_chunk(&layer.extents()?, per_chunk)
            .into_iter()
            .map(|(index, runs)| {
                let blocks: u64 = runs.iter().map(|(s, e)| e - s).sum();
                let checksum = if checksums {
                    checksum(layer, &runs, &mut buf)?
                } else {
                    0
                };
                Ok(ChunkSummary {
                    index,
                    checksum,
                    bytes: blocks * BLOCK_SIZE,
                })
            })
            .collect()
    }

    /// The data snapshot `name` (or the head, as
    /// [`VOLUME_HEAD`](crate::replica::VOLUME_HEAD)) itself holds in
    /// `[offset, offset + len)`, as (offset, bytes) runs. The range may pass
    /// the volume's end (nothing is held there), not 2^64.
    pub fn read_layer(&self, name: &str, offset: u64, len: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        check_aligned(offset, len)?;
        let state = lock::read(&self.state)?;
        let layer = state.any_layer(name)?;
        let end = offset.checked_add(len).ok_or(StorageError::OutOfRange {
            offset,
            len,
            size: state.meta.size,
        })?;
        let (start, end) = (offset / BLOCK_SIZE, end / BLOCK_SIZE);
        let mut held = ExtentSet::new();
        layer.add_held(start, end, &mut held)?;
        let runs: Vec<_> = held.iter().collect();
        runs.into_iter()
            .map(|(s, e)| {
                let mut data = vec![0; buf_range(s, s, e).end];
                layer.read_present(&[(s, e)], s, &mut data)?;
                Ok((s * BLOCK_SIZE, data))
            })
            .collect()
    }

    /// Makes snapshot `spec.name` exist for a rebuild to fill: an existing one
    /// (in the chain or staged) is kept for patching, otherwise an empty
    /// layer is staged.
    pub fn stage_layer(&self, spec: &LayerSpec) -> Result<()> {
        validate_snapshot_name(&spec.name)?;
        let mut state = lock::write(&self.state)?;
        if state.layer(&spec.name).is_some() {
            return Ok(());
        }
        let mut meta = LayerMeta::new(
            snapshot_file(&spec.name),
            String::new(),
            spec.user_created,
            spec.labels.clone(),
        );
        meta.created = spec.created;
        let layer = Layer::create(&self.dir, state.meta.size, meta)?;
        layer.open_whole()?;
        state.staged.insert(spec.name.clone(), layer);
        Ok(())
    }

    /// After a restart in the middle of a rebuild, takes back the layers it
    /// had staged, so that the next rebuild copies only their chunks that
    /// do not match the source yet and resumes where this one stopped,
    /// rather than from nothing. A partly copied chunk just does not match.
    /// Without a rebuild under way they are debris, left to the garbage
    /// collection, as is a layer that cannot be opened.
    pub(super) fn restage_after_restart(&self) -> Result<()> {
        let mut state = lock::write(&self.state)?;
        if !state.meta.rebuilding {
            return Ok(());
        }
        let referenced = state.referenced_files();
        for file in self.dir.entries()? {
            let Some(name) = snapshot_name_of(&file) else {
                continue;
            };
            if referenced.contains(&file) || !self.dir.join(&meta_file(&file)).exists() {
                continue;
            }
            match Layer::open(&self.dir, &file, state.meta.size) {
                Ok(layer) => {
                    layer.open_whole()?;
                    tracing::info!(
                        layer = name,
                        "taking back a layer the interrupted rebuild staged"
                    );
                    state.staged.insert(name.to_string(), layer);
                }
                Err(error) => {
                    tracing::warn!(layer = name, %error, "a layer the interrupted rebuild staged is unusable; it is deleted");
                }
            }
        }
        Ok(())
    }

    /// Replaces what snapshot `name` holds in the chunk range
    /// `[offset, offset + len)` with `runs` (offset, data) from the source.
    /// The chunk must lie in the volume and each run be whole blocks inside
    /// the chunk, all checked before the layer changes.
    pub fn patch_layer(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        runs: &[(u64, impl AsRef<[u8]>)],
    ) -> Result<()> {
        check_aligned(offset, len)?;
        let state = lock::read(&self.state)?;
        let layer = state.layer_or_err(name)?;
        layer.open_whole()?;
        replace_range(&state, layer, offset, len, runs)
    }

    /// Makes the snapshot chain `chain` (oldest first; every layer in the
    /// chain or staged), under the current head. Snapshots this replica took
    /// after the newest layer of `chain` stay on top of it: the engine
    /// snapshots a rebuild target with the other replicas, and such a
    /// snapshot holds writes the source's layer list, read before it, does
    /// not know of. Other snapshots not in `chain` are deleted. The replica
    /// must be marked rebuilding: the layer metadata is rewritten one file
    /// at a time.
    pub fn install_chain(&self, chain: &[String]) -> Result<()> {
        let mut state = lock::write(&self.state)?;
        let keep_from = match chain.last() {
            Some(last) => state.find_snapshot(last).map_or(0, |i| i + 1),
            None => 0,
        };
        // Everything is checked before anything changes: a chain that fails
        // half way through relinking would leave memory and disk apart.
        for (i, name) in chain.iter().enumerate() {
            state.layer_or_err(name)?;
            let newer_here =
                keep_from > 0 && state.find_snapshot(name).is_ok_and(|i| i >= keep_from);
            if newer_here || chain[..i].contains(name) {
                return Err(StorageError::ChainOrder(name.clone()));
            }
        }
        let state = &mut *state;
        let newer = if keep_from > 0 {
            state.snapshots.split_off(keep_from)
        } else {
            Vec::new()
        };
        let mut old: BTreeMap<String, Layer> = state
            .snapshots
            .drain(..)
            .map(|layer| (layer.file_name.clone(), layer))
            .chain(
                std::mem::take(&mut state.staged)
                    .into_values()
                    .map(|l| (l.file_name.clone(), l)),
            )
            .collect();
        let mut parent = String::new();
        for name in chain {
            let file = snapshot_file(name);
            let layer = old
                .remove(&file)
                .ok_or_else(|| StorageError::SnapshotNotFound(name.clone()))?;
            layer.settle()?;
            parent = self.link(state, layer, parent)?;
        }
        for layer in newer {
            parent = self.link(state, layer, parent)?;
        }
        state.head.meta.parent.clone_from(&parent);
        state.head.meta.save(&self.dir)?;
        state.update_meta(&self.dir, |meta| meta.parent = parent)?;
        let unused: Vec<String> = old.into_keys().collect();
        self.delete_layer_files(&unused);
        Ok(())
    }

    /// Appends `layer` to the chain on top of `parent`, rewriting its
    /// metadata only when its parent changes; returns its file name, the
    /// next layer's parent.
    fn link(&self, state: &mut State, mut layer: Layer, parent: String) -> Result<String> {
        if layer.meta.parent != parent {
            layer.meta.parent = parent;
            layer.meta.save(&self.dir)?;
        }
        let file = layer.file_name.clone();
        state.snapshots.push(layer);
        Ok(file)
    }

    /// Sets the revision counter (a rebuilt replica taking its source's).
    pub fn set_revision(&self, revision: u64) -> Result<()> {
        self.revision.persist_exact(revision)
    }
}

/// A range of whole blocks: checked before the layer is looked up, so that
/// a bad request is refused as such whatever it names.
pub(super) fn check_aligned(offset: u64, len: u64) -> Result<()> {
    if !offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE) {
        return Err(StorageError::Unaligned { offset, len });
    }
    Ok(())
}

/// Replaces what `layer` holds in `[offset, offset + len)` (whole blocks,
/// [`check_aligned`]) with `runs` (offset, data): the range must lie in the
/// volume and each run be whole blocks inside it, all checked before the
/// layer changes. The caller has opened the layer for bulk writes.
pub(super) fn replace_range(
    state: &State,
    layer: &Layer,
    offset: u64,
    len: u64,
    runs: &[(u64, impl AsRef<[u8]>)],
) -> Result<()> {
    let (start, end) = state.blocks(offset, len)?;
    let chunk_end = offset + len;
    for (at, data) in runs {
        let run_len = data.as_ref().len() as u64;
        if !at.is_multiple_of(BLOCK_SIZE) || !run_len.is_multiple_of(BLOCK_SIZE) {
            return Err(StorageError::Unaligned {
                offset: *at,
                len: run_len,
            });
        }
        if *at < offset || at.checked_add(run_len).is_none_or(|e| e > chunk_end) {
            return Err(StorageError::OutOfRange {
                offset: *at,
                len: run_len,
                size: chunk_end,
            });
        }
    }
    let mut held = ExtentSet::new();
    layer.add_held(start, end, &mut held)?;
    if !held.is_empty() {
        layer.punch(start, end)?;
    }
    for (at, data) in runs {
        layer.write_blocks(at / BLOCK_SIZE, data.as_ref())?;
    }
    Ok(())
}

/// Hashes the runs a layer holds in one chunk and their data.
fn checksum(layer: &Layer, runs: &[(u64, u64)], buf: &mut Vec<u8>) -> Result<u64> {
    let mut hasher = Xxh3::new();
    for &(start, end) in runs {
        buf.resize(buf_range(start, start, end).end, 0);
        match layer.read_present(&[(start, end)], start, buf) {
            Err(StorageError::ChecksumMismatch { .. }) => return Ok(ROTTEN_CHUNK),
            other => other?,
        };
        hash_run(&mut hasher, start, end, buf);
    }
    Ok(hasher.digest())
}

/// Adds a run of blocks `[start, end)` a layer holds, and their data, to a
/// digest of what the layer holds: equal digests, equal runs and data.
pub(super) fn hash_run(hasher: &mut Xxh3, start: u64, end: u64, data: &[u8]) {
    hasher.update(&start.to_le_bytes());
    hasher.update(&end.to_le_bytes());
    hasher.update(data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::testutil::{block_bytes, blocks, new_store, reopen, snapshot_names};

    fn spec(name: &str) -> LayerSpec {
        LayerSpec {
            name: name.to_string(),
            created: 1,
            user_created: false,
            labels: BTreeMap::new(),
        }
    }

    /// A standby volume's restore asks which chunks the head holds.
    #[test]
    fn the_heads_chunks_are_listed_like_a_snapshots() {
        let (_tmp, store) = new_store(8);
        store.write_at(0, &blocks(1, 1)).unwrap();
        store.snapshot("s1", true, BTreeMap::new()).unwrap();
        store.write_at(5 * BLOCK_SIZE, &blocks(2, 2)).unwrap();
        let indexes = |layer: &str| -> Vec<u64> {
            let chunks = store.layer_chunks(layer, 2 * BLOCK_SIZE, false).unwrap();
            chunks.iter().map(|c| c.index).collect()
        };
        assert_eq!(indexes(crate::replica::VOLUME_HEAD), [2, 3]);
        assert_eq!(indexes("s1"), [0]);
    }

    /// The engine snapshots a rebuild target with every other replica; a
    /// snapshot taken after the source's layer list was read holds writes
    /// that exist nowhere else on this replica.
    #[test]
    fn a_snapshot_taken_during_a_rebuild_keeps_its_writes() {
        let (_tmp, store) = new_store(8);
        store.set_rebuilding(true).unwrap();
        store.snapshot("r1", false, BTreeMap::new()).unwrap();
        store.write_at(2 * BLOCK_SIZE, &blocks(7, 1)).unwrap();
        store.snapshot("s2", true, BTreeMap::new()).unwrap();
        store.write_at(3 * BLOCK_SIZE, &blocks(8, 1)).unwrap();
        store.install_chain(&["r1".to_string()]).unwrap();
        store.set_rebuilding(false).unwrap();
        assert_eq!(block_bytes(&store), [0, 0, 7, 8, 0, 0, 0, 0]);
        assert_eq!(snapshot_names(&store), ["r1", "s2"]);
        let store = reopen(store);
        assert_eq!(block_bytes(&store), [0, 0, 7, 8, 0, 0, 0, 0]);
        assert_eq!(snapshot_names(&store), ["r1", "s2"]);
    }

    /// Two rebuilds back to back: the first one's chain ends at its own
    /// rebuild snapshot, and the second rebuild's snapshot, taken on this
    /// replica meanwhile, stays on top of it with the writes it holds.
    #[test]
    fn a_second_rebuild_snapshot_survives_the_first_rebuild() {
        let (_tmp, store) = new_store(8);
        store.set_rebuilding(true).unwrap();
        store.snapshot("rebuild-1", false, BTreeMap::new()).unwrap();
        store.write_at(0, &blocks(1, 1)).unwrap();
        store.snapshot("rebuild-2", false, BTreeMap::new()).unwrap();
        store.write_at(BLOCK_SIZE, &blocks(2, 1)).unwrap();
        store.stage_layer(&spec("base")).unwrap();
        store
            .patch_layer("base", 0, 8 * BLOCK_SIZE, &[(4 * BLOCK_SIZE, blocks(4, 1))])
            .unwrap();
        let chain = ["base".to_string(), "rebuild-1".to_string()];
        store.install_chain(&chain).unwrap();
        assert_eq!(snapshot_names(&store), ["base", "rebuild-1", "rebuild-2"]);
        assert_eq!(block_bytes(&reopen(store)), [1, 2, 0, 0, 4, 0, 0, 0]);
    }

    /// A rebuild interrupted by a restart resumes: the layer it staged is
    /// back after the reopen with the chunks it had copied, which compare
    /// equal and are not copied again. Before, the reopen deleted it as
    /// debris and the next rebuild copied everything again.
    #[test]
    fn a_restart_mid_rebuild_keeps_the_layers_it_staged() {
        const CHUNK: u64 = 4 * BLOCK_SIZE;
        let (_tmp, store) = new_store(8);
        store.set_rebuilding(true).unwrap();
        store.stage_layer(&spec("base")).unwrap();
        store
            .patch_layer("base", 0, CHUNK, &[(BLOCK_SIZE, blocks(5, 2))])
            .unwrap();
        let copied = store.layer_chunks("base", CHUNK, true).unwrap();
        assert_eq!(copied.len(), 1);

        let store = reopen(store);
        assert_eq!(store.layer_chunks("base", CHUNK, true).unwrap(), copied);
        store.install_chain(&["base".to_string()]).unwrap();
        store.set_rebuilding(false).unwrap();
        assert_eq!(block_bytes(&store), [0, 5, 5, 0, 0, 0, 0, 0]);
        assert_eq!(snapshot_names(&reopen(store)), ["base"]);
    }

    /// Without a rebuild under way, a staged layer left by a restart is
    /// debris: the reopen deletes it.
    #[test]
    fn a_staged_layer_without_a_rebuild_is_deleted_at_reopen() {
        let (tmp, store) = new_store(8);
        store.stage_layer(&spec("base")).unwrap();
        store
            .patch_layer("base", 0, 8 * BLOCK_SIZE, &[(0, blocks(5, 1))])
            .unwrap();
        let store = reopen(store);
        assert!(matches!(
            store.layer_chunks("base", 8 * BLOCK_SIZE, false),
            Err(StorageError::SnapshotNotFound(_))
        ));
        assert!(
            !tmp.path()
                .join("replica")
                .join(snapshot_file("base"))
                .exists()
        );
    }

    /// A chain that lists below its newest layer a snapshot this replica
    /// holds above it would reorder history: refused, and nothing changes.
    #[test]
    fn a_chain_out_of_order_is_refused() {
        let (_tmp, store) = new_store(8);
        store.snapshot("a", false, BTreeMap::new()).unwrap();
        store.snapshot("b", false, BTreeMap::new()).unwrap();
        let err = store
            .install_chain(&["b".to_string(), "a".to_string()])
            .unwrap_err();
        assert!(
            matches!(err, StorageError::ChainOrder(ref n) if n == "b"),
            "{err}"
        );
        assert_eq!(snapshot_names(&reopen(store)), ["a", "b"]);
    }

    /// A chain naming a layer twice is refused before anything changes.
    /// It used to fail half way through relinking, with the layers not yet
    /// relinked dropped from memory: the replica then read zeros where they
    /// held data, and listed a chain its disk did not have.
    #[test]
    fn a_chain_listing_a_layer_twice_is_refused() {
        let (_tmp, store) = new_store(8);
        store.write_at(0, &blocks(1, 1)).unwrap();
        store.snapshot("a", false, BTreeMap::new()).unwrap();
        store.write_at(BLOCK_SIZE, &blocks(2, 1)).unwrap();
        store.snapshot("b", false, BTreeMap::new()).unwrap();
        let err = store
            .install_chain(&["a".to_string(), "a".to_string()])
            .unwrap_err();
        assert!(
            matches!(err, StorageError::ChainOrder(ref n) if n == "a"),
            "{err}"
        );
        assert_eq!(snapshot_names(&store), ["a", "b"]);
        assert_eq!(block_bytes(&store), [1, 2, 0, 0, 0, 0, 0, 0]);
    }

    /// A patch is checked whole before it changes the layer: a chunk beyond
    /// the volume, a run outside its chunk or not in whole blocks is refused
    /// and leaves the layer as it was. Data past the volume's end would
    /// otherwise show in the space a later expand adds, and a partial block
    /// would be held after a reopen but not before.
    #[test]
    fn a_patch_out_of_bounds_is_refused_and_changes_nothing() {
        const BS: u64 = BLOCK_SIZE;
        let (_tmp, store) = new_store(8);
        store.stage_layer(&spec("base")).unwrap();
        store
            .patch_layer("base", 0, 8 * BS, &[(0, blocks(1, 2))])
            .unwrap();
        let err = store
            .patch_layer("base", 4 * BS, 8 * BS, &[(8 * BS, blocks(2, 1))])
            .unwrap_err();
        assert!(
            matches!(err, StorageError::OutOfRange { offset, len, size }
                if (offset, len, size) == (4 * BS, 8 * BS, 8 * BS)),
            "{err}"
        );
        let err = store
            .patch_layer("base", 0, 2 * BS, &[(0, blocks(3, 1)), (BS, blocks(3, 2))])
            .unwrap_err();
        assert!(
            matches!(err, StorageError::OutOfRange { offset, len, .. } if (offset, len) == (BS, 2 * BS)),
            "{err}"
        );
        let err = store
            .patch_layer("base", 0, 2 * BS, &[(0, vec![4; 100])])
            .unwrap_err();
        assert!(
            matches!(
                err,
                StorageError::Unaligned {
                    offset: 0,
                    len: 100
                }
            ),
            "{err}"
        );
        let err = store
            .patch_layer("base", u64::MAX - BS + 1, 2 * BS, &[(0, blocks(5, 1))])
            .unwrap_err();
        assert!(matches!(err, StorageError::OutOfRange { .. }), "{err}");
        assert_eq!(
            store.read_layer("base", 0, 8 * BS).unwrap(),
            [(0, blocks(1, 2))]
        );
    }

    /// A snapshot cannot take the name of a staged layer. It used to: the
    /// snapshot replaced the staged layer's file while the staged layer
    /// lived on in memory, and installing the chain then served the staged
    /// data under a name whose file held the snapshot's, until a reopen.
    #[test]
    fn a_snapshot_cannot_take_a_staged_layers_name() {
        let (_tmp, store) = new_store(8);
        store.set_rebuilding(true).unwrap();
        store.stage_layer(&spec("x")).unwrap();
        let data = [(4 * BLOCK_SIZE, blocks(4, 1))];
        store.patch_layer("x", 0, 8 * BLOCK_SIZE, &data).unwrap();
        store.write_at(0, &blocks(1, 1)).unwrap();
        let err = store.snapshot("x", false, BTreeMap::new()).unwrap_err();
        assert!(
            matches!(err, StorageError::SnapshotExists(ref n) if n == "x"),
            "{err}"
        );
        store.install_chain(&["x".to_string()]).unwrap();
        store.set_rebuilding(false).unwrap();
        assert_eq!(block_bytes(&store), [1, 0, 0, 0, 4, 0, 0, 0]);
        assert_eq!(block_bytes(&reopen(store)), [1, 0, 0, 0, 4, 0, 0, 0]);
    }

    /// A layer read whose range passes 2^64 is out of range (it was an
    /// overflow: a panic in debug builds, an empty answer in release ones).
    /// A range past the volume's end still reads what the layer holds up to
    /// the end: the last sync chunk of a volume that is not whole chunks.
    #[test]
    fn a_layer_read_past_2_64_is_out_of_range() {
        let (_tmp, store) = new_store(8);
        store.write_at(7 * BLOCK_SIZE, &blocks(7, 1)).unwrap();
        store.snapshot("a", false, BTreeMap::new()).unwrap();
        let offset = u64::MAX - BLOCK_SIZE + 1;
        let err = store.read_layer("a", offset, 2 * BLOCK_SIZE).unwrap_err();
        assert!(
            matches!(err, StorageError::OutOfRange { offset: o, len, size }
                if (o, len, size) == (offset, 2 * BLOCK_SIZE, 8 * BLOCK_SIZE)),
            "{err}"
        );
        let runs = store
            .read_layer("a", 4 * BLOCK_SIZE, 8 * BLOCK_SIZE)
            .unwrap();
        assert_eq!(runs, [(7 * BLOCK_SIZE, blocks(7, 1))]);
    }

    /// A discard that reaches a rebuild target before the layers below it
    /// are filled must not let the data filled in later show through.
    #[test]
    fn a_discard_during_a_rebuild_stays_discarded() {
        let (_tmp, store) = new_store(8);
        store.set_rebuilding(true).unwrap();
        store.snapshot("r1", false, BTreeMap::new()).unwrap();
        store.unmap(2 * BLOCK_SIZE, 2 * BLOCK_SIZE).unwrap();
        store.stage_layer(&spec("base")).unwrap();
        let old = [(2 * BLOCK_SIZE, blocks(5, 1))];
        store.patch_layer("base", 0, 8 * BLOCK_SIZE, &old).unwrap();
        store.stage_layer(&spec("r1")).unwrap();
        let old = [(3 * BLOCK_SIZE, blocks(6, 2))];
        store.patch_layer("r1", 0, 8 * BLOCK_SIZE, &old).unwrap();
        store
            .install_chain(&["base".to_string(), "r1".to_string()])
            .unwrap();
        store.set_rebuilding(false).unwrap();
        assert_eq!(block_bytes(&store), [0, 0, 0, 0, 6, 0, 0, 0]);
        assert_eq!(block_bytes(&reopen(store)), [0, 0, 0, 0, 6, 0, 0, 0]);
    }

    /// A volume grown while a rebuild fills staged layers: the staged layers
    /// grow too, and the replica opens again at the new size.
    #[test]
    fn expanding_during_a_rebuild_grows_the_staged_layers() {
        let (_tmp, store) = new_store(8);
        store.set_rebuilding(true).unwrap();
        store.stage_layer(&spec("base")).unwrap();
        store.expand(16 * BLOCK_SIZE).unwrap();
        let data = [(12 * BLOCK_SIZE, blocks(3, 1))];
        store
            .patch_layer("base", 8 * BLOCK_SIZE, 8 * BLOCK_SIZE, &data)
            .unwrap();
        store.install_chain(&["base".to_string()]).unwrap();
        store.set_rebuilding(false).unwrap();
        let store = reopen(store);
        assert_eq!(store.size().unwrap(), 16 * BLOCK_SIZE);
        assert_eq!(block_bytes(&store)[12], 3);
    }
}
