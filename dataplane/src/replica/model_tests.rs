//! Model-based test: random operation sequences applied to a real
//! [`ReplicaStore`] and to an in-memory model (the volume's bytes plus a copy
//! per snapshot); after every step the whole volume must read as the model.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::testutil::{BS, new_store, read_all, reopen};
use super::{BLOCK_SIZE, ReplicaStore, StorageError};

const START_BLOCKS: usize = 64;
const MAX_BLOCKS: usize = 96;
const MAX_RUN: usize = 8;

#[derive(Clone, Debug)]
enum Op {
    Write { start: usize, len: usize, seed: u8 },
    Unmap { start: usize, len: usize },
    Snapshot { name: u8 },
    Remove { pick: usize },
    Revert { pick: usize },
    Flush,
    Reopen,
    Expand { blocks: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<usize>(), any::<usize>(), any::<u8>()).prop_map(|(start, len, seed)| Op::Write { start, len, seed }),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(start, len)| Op::Unmap { start, len }),
        2 => (0u8..6).prop_map(|name| Op::Snapshot { name }),
        1 => any::<usize>().prop_map(|pick| Op::Remove { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Revert { pick }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => (1usize..=MAX_RUN).prop_map(|blocks| Op::Expand { blocks }),
    ]
}

#[derive(Debug)]
struct Model {
    data: Vec<u8>,
    /// Oldest first, each with the volume's bytes when it was taken.
    snapshots: Vec<(String, Vec<u8>)>,
    revision: u64,
    flushed: u64,
}

impl Model {
    fn blocks(&self) -> usize {
        self.data.len() / BS
    }

    /// A run of blocks inside the volume from arbitrary numbers.
    fn run(&self, start: usize, len: usize) -> (usize, usize) {
        let start = start % self.blocks();
        (start, (1 + len % MAX_RUN).min(self.blocks() - start))
    }

    fn pick(&self, pick: usize) -> Option<String> {
        (!self.snapshots.is_empty()).then(|| self.snapshots[pick % self.snapshots.len()].0.clone())
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.snapshots.iter().position(|(n, _)| n == name)
    }
}

/// Block contents that differ per block and per byte, so misplaced or
/// partially copied data shows.
fn pattern(start: usize, len: usize, seed: u8) -> Vec<u8> {
    (0..len * BS)
        .map(|i| seed.wrapping_add((start + i / BS) as u8).wrapping_mul(31) ^ (i % 251) as u8)
        .collect()
}

fn offset(block: usize) -> u64 {
    block as u64 * BLOCK_SIZE
}

/// Applies `op` to both; returns the store (replaced on reopen).
fn apply(store: ReplicaStore, model: &mut Model, op: &Op) -> ReplicaStore {
    match *op {
        Op::Write { start, len, seed } => {
            let (start, len) = model.run(start, len);
            let data = pattern(start, len, seed);
            store.write_at(offset(start), &data).unwrap();
            model.data[start * BS..(start + len) * BS].copy_from_slice(&data);
            model.revision += 1;
        }
        Op::Unmap { start, len } => {
            let (start, len) = model.run(start, len);
            store.unmap(offset(start), offset(len)).unwrap();
            model.data[start * BS..(start + len) * BS].fill(0);
            model.revision += 1;
        }
        Op::Snapshot { name } => {
            let name = format!("s{name}");
            match store.snapshot(&name, true, BTreeMap::new()) {
                Err(StorageError::SnapshotExists(n)) => {
                    assert!(n == name && model.position(&name).is_some())
                }
                result => {
                    result.unwrap();
                    model.snapshots.push((name, model.data.clone()));
                    model.flushed = model.revision;
                }
            }
        }
        Op::Remove { pick } => match model.pick(pick) {
            None => assert!(matches!(
                store.remove_snapshot("s0"),
                Err(StorageError::SnapshotNotFound(_))
            )),
            Some(name) => {
                store.remove_snapshot(&name).unwrap();
                model.snapshots.retain(|(n, _)| *n != name);
                model.flushed = model.revision;
            }
        },
        Op::Revert { pick } => match model.pick(pick) {
            None => assert!(matches!(
                store.revert("s0"),
                Err(StorageError::SnapshotNotFound(_))
            )),
            Some(name) => {
                store.revert(&name).unwrap();
                let index = model.position(&name).unwrap_or_default();
                model.snapshots.truncate(index + 1);
                model.data.clone_from(&model.snapshots[index].1);
                model.flushed = model.revision;
            }
        },
        Op::Flush => {
            store.flush().unwrap();
            model.flushed = model.revision;
        }
        Op::Reopen => {
            let before = store.layer_files().unwrap();
            let store = reopen(store);
            assert_eq!(
                store.layer_files().unwrap(),
                before,
                "extents rebuilt from SEEK_DATA/SEEK_HOLE"
            );
            model.revision = model.flushed;
            return store;
        }
        Op::Expand { blocks } => {
            let new_blocks = (model.blocks() + blocks).min(MAX_BLOCKS);
            store.expand(offset(new_blocks)).unwrap();
            if new_blocks > model.blocks() {
                model.flushed = model.revision;
            }
            for image in
                std::iter::once(&mut model.data).chain(model.snapshots.iter_mut().map(|(_, d)| d))
            {
                image.resize(new_blocks * BS, 0);
            }
        }
    }
    store
}

fn check(store: &ReplicaStore, model: &Model, step: usize, op: &Op) {
    assert_eq!(
        store.size().unwrap(),
        model.data.len() as u64,
        "step {step} {op:?}"
    );
    assert!(
        read_all(store) == model.data,
        "volume differs from model after step {step} {op:?}"
    );
    let names: Vec<String> = store
        .snapshots()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    let expected: Vec<&String> = model.snapshots.iter().map(|(n, _)| n).collect();
    assert_eq!(
        names.iter().collect::<Vec<_>>(),
        expected,
        "step {step} {op:?}"
    );
    assert_eq!(store.revision(), model.revision, "step {step} {op:?}");
}

proptest! {
    // No regression files: they would land outside this module's directory.
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn store_behaves_like_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let (_tmp, mut store) = new_store(START_BLOCKS as u64);
        let mut model = Model { data: vec![0; START_BLOCKS * BS], snapshots: Vec::new(), revision: 0, flushed: 0 };
        for (step, op) in ops.iter().enumerate() {
            store = apply(store, &mut model, op);
            check(&store, &model, step, op);
        }
    }
}
