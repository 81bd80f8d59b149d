//! Helpers shared by the replica tests.

use tempfile::TempDir;

use super::{BLOCK_SIZE, ReplicaStore};

pub const BS: usize = BLOCK_SIZE as usize;

/// A new store of `blocks` blocks in a fresh temp directory (under
/// `std::env::temp_dir()`), in a `replica` subdirectory so `create` makes it.
pub fn new_store(blocks: u64) -> (TempDir, ReplicaStore) {
    let tmp = tempfile::tempdir().unwrap();
    let store = ReplicaStore::create(tmp.path().join("replica"), blocks * BLOCK_SIZE).unwrap();
    (tmp, store)
}

/// A locked, empty replica directory in a fresh temp directory.
pub fn locked() -> (TempDir, super::dir::ReplicaDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = super::dir::ReplicaDir::lock(tmp.path()).unwrap();
    (tmp, dir)
}

/// `n` blocks filled with `byte`.
pub fn blocks(byte: u8, n: usize) -> Vec<u8> {
    vec![byte; n * BS]
}

pub fn read_all(store: &ReplicaStore) -> Vec<u8> {
    let mut buf = vec![0xee; usize::try_from(store.size().unwrap()).unwrap()];
    store.read_at(0, &mut buf).unwrap();
    buf
}

/// The byte each block of the volume starts with, for compact assertions.
pub fn block_bytes(store: &ReplicaStore) -> Vec<u8> {
    read_all(store).chunks(BS).map(|b| b[0]).collect()
}

/// The store's snapshot names, oldest first.
pub fn snapshot_names(store: &ReplicaStore) -> Vec<String> {
    store
        .snapshots()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// Drops the store and opens its directory again.
pub fn reopen(store: ReplicaStore) -> ReplicaStore {
    let path = store.path().to_path_buf();
    drop(store);
    ReplicaStore::open(path).unwrap()
}
