//! Rotten blocks on a replica's disk, and crashes between a block's data
//! and its checksum: what a read returns in each case.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::rebuild_store::ROTTEN_CHUNK;
use super::testutil::{BS, block_bytes, blocks, new_store, reopen};
use super::{BLOCK_SIZE, ReplicaStore, StorageError};

/// Changes one byte of `file` at `offset`, as a rotting disk would.
fn flip(file: &Path, offset: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, offset).unwrap();
    f.write_all_at(&[byte[0] ^ 0x04], offset).unwrap();
}

fn read_err(store: &ReplicaStore, block: u64, n: usize) -> StorageError {
    let mut buf = vec![0; n * BS];
    store.read_at(block * BLOCK_SIZE, &mut buf).unwrap_err()
}

fn rotten_blocks(err: StorageError) -> Vec<(u64, u64)> {
    match err {
        StorageError::ChecksumMismatch { blocks, .. } => blocks,
        other => panic!("expected a checksum mismatch, got {other}"),
    }
}

#[test]
fn a_flipped_bit_or_a_zeroed_block_is_named_and_the_rest_reads() {
    let (_tmp, store) = new_store(8);
    store.write_at(0, &blocks(1, 8)).unwrap();
    store.flush().unwrap();
    let head = store.path().join("head-1.img");
    flip(&head, 2 * BLOCK_SIZE + 100);
    let zeros = OpenOptions::new().write(true).open(&head).unwrap();
    zeros.write_all_at(&blocks(0, 1), 5 * BLOCK_SIZE).unwrap();

    assert_eq!(rotten_blocks(read_err(&store, 0, 8)), [(2, 3), (5, 6)]);
    let mut good = vec![0; 2 * BS];
    store.read_at(0, &mut good).unwrap();
    assert!(good.iter().all(|&b| b == 1));
    // The message names the replica and the blocks, for an operator.
    let message = read_err(&store, 2, 1).to_string();
    assert!(
        message.contains("block 2 does not match its checksum"),
        "{message}"
    );
    assert!(
        message.contains(&store.path().display().to_string()),
        "{message}"
    );
}

#[test]
fn rot_in_a_snapshot_is_caught_through_the_head_and_by_every_reader_of_the_layer() {
    let (_tmp, store) = new_store(8);
    store.write_at(0, &blocks(1, 4)).unwrap();
    store.snapshot("a", true, BTreeMap::new()).unwrap();
    store.write_at(0, &blocks(2, 1)).unwrap();
    flip(&store.path().join("snap-a.img"), BLOCK_SIZE);
    flip(&store.path().join("snap-a.img"), 0);
    // Block 0 is shadowed by the head: only block 1 shows.
    assert_eq!(rotten_blocks(read_err(&store, 0, 4)), [(1, 2)]);
    // A rebuild or a backup reading the layer never gets the rotten data.
    let err = store.read_layer("a", 0, 4 * BLOCK_SIZE).unwrap_err();
    assert_eq!(rotten_blocks(err), [(0, 2)]);
    // Its summary never matches another's, so a rebuild copies the chunk
    // (and the copy's read fails on a source; a target takes a good copy).
    let chunks = store.layer_chunks("a", 4 * BLOCK_SIZE, true).unwrap();
    assert_eq!(chunks[0].checksum, ROTTEN_CHUNK);
    // Nor does merging the snapshot into the head copy it; nothing changes.
    let err = store.remove_snapshot("a").unwrap_err();
    assert!(
        matches!(err, StorageError::ChecksumMismatch { .. }),
        "{err}"
    );
    assert_eq!(store.snapshots().unwrap().len(), 1);
}

#[test]
fn a_truncated_layer_reads_as_rotten_not_as_zeros() {
    let (_tmp, store) = new_store(8);
    store.write_at(0, &blocks(3, 8)).unwrap();
    store.flush().unwrap();
    let head = OpenOptions::new()
        .write(true)
        .open(store.path().join("head-1.img"))
        .unwrap();
    head.set_len(6 * BLOCK_SIZE).unwrap();
    assert_eq!(rotten_blocks(read_err(&store, 0, 8)), [(6, 8)]);
}

/// A stopped replica of 16 blocks of 1s in snapshot `a`, 2s over blocks
/// 8-11 in its head (`head-2.img`), flushed but not stopped cleanly.
fn stopped_over_a_snapshot() -> (tempfile::TempDir, std::path::PathBuf) {
    let (tmp, store) = new_store(16);
    store.write_at(0, &blocks(1, 16)).unwrap();
    store.snapshot("a", true, BTreeMap::new()).unwrap();
    store.write_at(8 * BLOCK_SIZE, &blocks(2, 4)).unwrap();
    store.flush().unwrap();
    let path = store.path().to_path_buf();
    drop(store);
    (tmp, path)
}

/// A layer file found cut short at open (after an unclean stop, whose
/// open regions are recomputed) opens: the blocks it lost read as rotten,
/// never as holes over the snapshot below; the blocks it never held read
/// through; and so again at the next open.
#[test]
fn a_layer_cut_short_opens_with_its_lost_blocks_rotten() {
    let (_tmp, path) = stopped_over_a_snapshot();
    let head = OpenOptions::new()
        .write(true)
        .open(path.join("head-2.img"))
        .unwrap();
    head.set_len(9 * BLOCK_SIZE + 2048).unwrap();
    let mut store = ReplicaStore::open(&path).unwrap();
    for _ in 0..2 {
        let mut buf = vec![0; 9 * BS];
        store.read_at(0, &mut buf).unwrap();
        assert!(buf[..8 * BS].iter().all(|&b| b == 1));
        assert!(buf[8 * BS..].iter().all(|&b| b == 2));
        assert_eq!(rotten_blocks(read_err(&store, 0, 16)), [(9, 12)]);
        let mut tail = vec![0; 4 * BS];
        store.read_at(12 * BLOCK_SIZE, &mut tail).unwrap();
        assert!(tail.iter().all(|&b| b == 1), "blocks the head never held");
        store = reopen(store);
    }
}

/// A crash while an open restored a cut layer, after its file got its
/// length back and before the lost blocks were marked: the next open
/// finishes the job from the cut the metadata recorded, and the lost
/// blocks do not read as holes over the snapshot below.
#[test]
fn a_crash_while_restoring_a_cut_layer_leaves_its_lost_blocks_rotten() {
    let (_tmp, path) = stopped_over_a_snapshot();
    let head = OpenOptions::new()
        .write(true)
        .open(path.join("head-2.img"))
        .unwrap();
    head.set_len(10 * BLOCK_SIZE).unwrap();
    head.set_len(16 * BLOCK_SIZE).unwrap();
    let meta_path = path.join("head-2.img.meta");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    meta["cut_at"] = (10 * BLOCK_SIZE).into();
    fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let store = ReplicaStore::open(&path).unwrap();
    assert_eq!(rotten_blocks(read_err(&store, 0, 16)), [(10, 12)]);
    let store = reopen(store);
    assert_eq!(rotten_blocks(read_err(&store, 0, 16)), [(10, 12)]);
}

#[test]
fn a_repair_restores_the_blocks_without_counting_as_a_write() {
    let (_tmp, store) = new_store(8);
    store.write_at(0, &blocks(4, 2)).unwrap();
    store.snapshot("a", true, BTreeMap::new()).unwrap();
    flip(&store.path().join("snap-a.img"), 10);
    let revision = store.revision();
    store.repair_at(0, &blocks(4, 1)).unwrap();
    assert_eq!(store.revision(), revision);
    assert_eq!(block_bytes(&store)[..2], [4, 4]);
    assert_eq!(block_bytes(&reopen(store))[..2], [4, 4]);
}

/// The crash the intent record exists for: data written, its checksum not
/// (here: the checksum file rewritten to what it held before), then an
/// unclean stop. The block must read, with whatever data it holds.
#[test]
fn a_crash_between_data_and_checksum_reads_back_without_a_false_alarm() {
    let (_tmp, store) = new_store(1024);
    store.write_at(0, &blocks(1, 1)).unwrap();
    store.mark_clean().unwrap();
    let crc = store.path().join("head-1.img.crc");
    let before = fs::read(&crc).unwrap();
    store.write_at(0, &blocks(2, 1)).unwrap();
    store.write_at(700 * BLOCK_SIZE, &blocks(5, 1)).unwrap();
    let dir = store.path().to_path_buf();
    drop(store);
    fs::write(&crc, &before).unwrap();
    let store = ReplicaStore::open(&dir).unwrap();
    assert_eq!(block_bytes(&store)[0], 2);
    assert_eq!(block_bytes(&store)[700], 5);
}

/// The other side: a block whose region was closed by a clean stop is
/// checked after the next open, not blessed by a recompute.
#[test]
fn rot_found_after_a_clean_stop_is_not_recomputed_away() {
    let (_tmp, store) = new_store(8);
    store.write_at(0, &blocks(1, 2)).unwrap();
    store.mark_clean().unwrap();
    let dir = store.path().to_path_buf();
    drop(store);
    flip(&dir.join("head-1.img"), BLOCK_SIZE + 1);
    let store = ReplicaStore::open(&dir).unwrap();
    assert_eq!(rotten_blocks(read_err(&store, 0, 2)), [(1, 2)]);
}

/// A replica written before checksums existed gets them on its next open.
#[test]
fn a_layer_without_checksums_gets_them_when_opened() {
    let (_tmp, store) = new_store(8);
    store.write_at(0, &blocks(6, 3)).unwrap();
    store.snapshot("old", true, BTreeMap::new()).unwrap();
    let dir = store.path().to_path_buf();
    drop(store);
    for layer in ["head-2.img", "snap-old.img"] {
        fs::remove_file(dir.join(format!("{layer}.crc"))).unwrap();
        fs::remove_file(dir.join(format!("{layer}.intent"))).unwrap();
        let meta = dir.join(format!("{layer}.meta"));
        let mut json: serde_json::Value =
            serde_json::from_slice(&fs::read(&meta).unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("checksums").unwrap();
        fs::write(&meta, serde_json::to_vec(&json).unwrap()).unwrap();
    }
    let store = ReplicaStore::open(&dir).unwrap();
    assert_eq!(block_bytes(&store)[..3], [6, 6, 6]);
    assert!(dir.join("snap-old.img.crc").exists());
    flip(&dir.join("snap-old.img"), 2 * BLOCK_SIZE);
    assert_eq!(rotten_blocks(read_err(&store, 0, 3)), [(2, 3)]);
}

/// Reads racing writes of the same blocks see old or new data, never a
/// mismatch between a block and its checksum written a moment apart.
#[test]
fn reads_racing_writes_of_the_same_block_never_see_a_false_mismatch() {
    let (_tmp, store) = new_store(4);
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut byte = 0u8;
            while !stop.load(Ordering::Relaxed) {
                byte = byte.wrapping_add(1);
                store.write_at(0, &blocks(byte, 2)).unwrap();
            }
        })
    };
    let mut buf = vec![0; 2 * BS];
    for _ in 0..20_000 {
        store.read_at(0, &mut buf).unwrap();
        assert!(buf[..BS].iter().all(|&b| b == buf[0]), "a block is torn");
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}
