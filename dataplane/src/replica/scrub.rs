//! The store's part of a scrub (`engine/scrub.rs`): checking a range of one
//! layer's own blocks against their checksums (with a digest of them, to
//! compare replicas' copies of a snapshot), a digest of what a range of the
//! volume reads now or at a snapshot, and replacing a range of one layer
//! with another replica's copy of it.

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

use super::BLOCK_SIZE;
use super::error::{Result, StorageError};
use super::extents::ExtentSet;
use super::layer::{Layer, buf_range};
use super::lock;
use super::naming::VOLUME_HEAD;
use super::rebuild_store::{check_aligned, hash_run, replace_range};
use super::store::{ReplicaStore, State};

/// The most one check or digest reads: each holds its range in memory.
const MAX_RANGE: u64 = 8 << 20;

fn within_limit(len: u64) -> Result<()> {
    if len > MAX_RANGE {
        return Err(StorageError::TooLong {
            len,
            max: MAX_RANGE,
        });
    }
    Ok(())
}

/// What a check of a layer's range found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayerCheck {
    /// Bytes of the range the layer holds, all checked.
    pub held_bytes: u64,
    /// Byte ranges (offset, length) that failed their checksums.
    pub rotten: Vec<(u64, u64)>,
    /// A digest of which blocks of the range the layer holds and their
    /// data: replicas whose copies of a snapshot agree digest it alike.
    pub digest: u64,
}

impl State {
    /// The head (as [`VOLUME_HEAD`]) or a snapshot layer, staged included.
    pub(super) fn any_layer(&self, name: &str) -> Result<&Layer> {
        if name == VOLUME_HEAD {
            Ok(&self.head)
        } else {
            self.layer_or_err(name)
        }
    }
}

/// Reads the blocks `layer` holds in `[start, end)` and checks them.
fn check(state: &State, layer: &Layer, offset: u64, len: u64) -> Result<LayerCheck> {
    let (start, end) = state.blocks(offset, len)?;
    let mut held = ExtentSet::new();
    layer.add_held(start, end, &mut held)?;
    let runs: Vec<(u64, u64)> = held.iter().collect();
    let mut buf = vec![0u8; buf_range(start, start, end).end];
    let mut bad = ExtentSet::new();
    layer.read_checked(&runs, start, &mut buf, &mut bad)?;
    let mut digest = Xxh3::new();
    for &(s, e) in &runs {
        hash_run(&mut digest, s, e, &buf[buf_range(start, s, e)]);
    }
    Ok(LayerCheck {
        held_bytes: held.block_count() * BLOCK_SIZE,
        rotten: bad
            .iter()
            .map(|(s, e)| (s * BLOCK_SIZE, (e - s) * BLOCK_SIZE))
            .collect(),
        digest: digest.digest(),
    })
}

impl ReplicaStore {
    /// Checks the blocks layer `name` itself holds in `[offset, offset +
    /// len)` against their checksums. As a read does, a mismatch is checked
    /// again with no write in flight before it counts.
    pub fn verify_layer(&self, name: &str, offset: u64, len: u64) -> Result<LayerCheck> {
        within_limit(len)?;
        let found = {
            let state = lock::read(&self.state)?;
            check(&state, state.any_layer(name)?, offset, len)?
        };
        if found.rotten.is_empty() {
            return Ok(found);
        }
        let state = lock::write(&self.state)?;
        check(&state, state.any_layer(name)?, offset, len)
    }

    /// A digest of what `[offset, offset + len)` of the volume read when
    /// snapshot `view` was taken (the head, [`VOLUME_HEAD`]: reads now); a
    /// block failing its checksum fails it.
    pub fn digest_range(&self, view: &str, offset: u64, len: u64) -> Result<u64> {
        within_limit(len)?;
        let mut buf = vec![0u8; len as usize];
        self.read_view(view, offset, &mut buf)?;
        Ok(xxh3_64(&buf))
    }

    /// Replaces what layer `name` (the head as [`VOLUME_HEAD`]) holds in
    /// `[offset, offset + len)` with another replica's copy, `runs`
    /// (offset, data). Readers wait meanwhile: the range is punched before
    /// it is rewritten. Not a write of the volume's: the revision counter
    /// stays. Durable when it returns.
    pub fn repair_layer(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        runs: &[(u64, impl AsRef<[u8]>)],
    ) -> Result<()> {
        check_aligned(offset, len)?;
        if name == VOLUME_HEAD {
            self.mark_dirty()?;
        }
        let state = lock::write(&self.state)?;
        let layer = state.any_layer(name)?;
        layer.open_whole()?;
        replace_range(&state, layer, offset, len, runs)?;
        layer.settle()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::replica::testutil::{BS, block_bytes, blocks, new_store, reopen};

    #[test]
    fn a_check_names_the_rotten_blocks_of_the_layer_asked_only() {
        let (_tmp, store) = new_store(8);
        store.write_at(0, &blocks(1, 4)).unwrap();
        store.snapshot("a", true, BTreeMap::new()).unwrap();
        store.write_at(2 * BLOCK_SIZE, &blocks(2, 2)).unwrap();
        let snap = OpenOptions::new()
            .write(true)
            .open(store.path().join("snap-a.img"))
            .unwrap();
        snap.write_all_at(&[9], BLOCK_SIZE + 5).unwrap();
        let a = store.verify_layer("a", 0, 8 * BLOCK_SIZE).unwrap();
        assert_eq!(a.held_bytes, 4 * BLOCK_SIZE);
        assert_eq!(a.rotten, [(BLOCK_SIZE, BLOCK_SIZE)]);
        let head = store.verify_layer(VOLUME_HEAD, 0, 8 * BLOCK_SIZE).unwrap();
        assert_eq!(
            head,
            LayerCheck {
                held_bytes: 2 * BLOCK_SIZE,
                rotten: vec![],
                digest: head.digest,
            }
        );
        assert!(matches!(
            store.verify_layer("zz", 0, BLOCK_SIZE),
            Err(StorageError::SnapshotNotFound(_))
        ));
        assert!(matches!(
            store.digest_range(VOLUME_HEAD, 0, 4 * BLOCK_SIZE),
            Err(StorageError::ChecksumMismatch { .. })
        ));
        // Repaired in the snapshot layer itself, from another copy.
        let revision = store.revision();
        store
            .repair_layer("a", BLOCK_SIZE, BLOCK_SIZE, &[(BLOCK_SIZE, blocks(1, 1))])
            .unwrap();
        assert_eq!(store.revision(), revision);
        assert!(
            store
                .verify_layer("a", 0, 8 * BLOCK_SIZE)
                .unwrap()
                .rotten
                .is_empty()
        );
        let store = reopen(store);
        assert_eq!(block_bytes(&store), [1, 1, 2, 2, 0, 0, 0, 0]);
    }

    /// A check or digest holds its range in memory: one asking for more
    /// than a scrub's chunk is refused before anything is allocated.
    #[test]
    fn a_range_too_long_is_refused_not_allocated() {
        let (_tmp, store) = new_store(8);
        for len in [MAX_RANGE + BLOCK_SIZE, u64::MAX - 4095] {
            assert!(matches!(
                store.verify_layer(VOLUME_HEAD, 0, len),
                Err(StorageError::TooLong { .. })
            ));
            assert!(matches!(
                store.digest_range(VOLUME_HEAD, 0, len),
                Err(StorageError::TooLong { .. })
            ));
        }
    }

    /// Replicas compare a snapshot by what it reads and by what its layer
    /// holds, whatever their heads hold since.
    #[test]
    fn a_snapshot_digests_as_it_was_taken() {
        let (_tmp, a) = new_store(8);
        let (_tmp2, b) = new_store(8);
        for store in [&a, &b] {
            store.write_at(0, &blocks(3, 2)).unwrap();
            store.snapshot("s", true, BTreeMap::new()).unwrap();
        }
        a.write_at(BLOCK_SIZE, &blocks(4, 1)).unwrap();
        let whole = 8 * BLOCK_SIZE;
        let view = |store: &ReplicaStore, view| store.digest_range(view, 0, whole).unwrap();
        assert_eq!(view(&a, "s"), view(&b, "s"));
        assert_ne!(view(&a, VOLUME_HEAD), view(&b, VOLUME_HEAD));
        let layer = |store: &ReplicaStore| store.verify_layer("s", 0, whole).unwrap().digest;
        assert_eq!(layer(&a), layer(&b));
        // The same data, held as one block more: the layers differ.
        let runs = [(0, blocks(3, 2)), (2 * BLOCK_SIZE, blocks(0, 1))];
        b.repair_layer("s", 0, whole, &runs).unwrap();
        assert_ne!(layer(&a), layer(&b));
        assert_eq!(view(&a, "s"), view(&b, "s"));
        assert!(matches!(
            a.digest_range("zz", 0, whole),
            Err(StorageError::SnapshotNotFound(_))
        ));
    }

    #[test]
    fn equal_content_digests_equal_and_a_repaired_head_matches_its_copy() {
        let (_tmp, a) = new_store(4);
        let (_tmp2, b) = new_store(4);
        a.write_at(0, &blocks(5, 2)).unwrap();
        b.write_at(0, &blocks(5, 1)).unwrap();
        b.write_at(BLOCK_SIZE, &blocks(6, 1)).unwrap();
        let whole = 4 * BLOCK_SIZE;
        assert_ne!(
            a.digest_range(VOLUME_HEAD, 0, whole).unwrap(),
            b.digest_range(VOLUME_HEAD, 0, whole).unwrap()
        );
        // B takes A's copy of its head's blocks 0-3: block 1, and holes.
        let copy = vec![(0, blocks(5, 2))];
        b.repair_layer(VOLUME_HEAD, 0, whole, &copy).unwrap();
        assert_eq!(
            a.digest_range(VOLUME_HEAD, 0, whole).unwrap(),
            b.digest_range(VOLUME_HEAD, 0, whole).unwrap()
        );
        assert_eq!(
            b.verify_layer(VOLUME_HEAD, 0, whole).unwrap().held_bytes,
            2 * BS as u64
        );
    }
}
