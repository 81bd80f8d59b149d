//! The `store` target: the input is a sequence of operations on a real
//! [`ReplicaStore`] of a few blocks, each applied also to an in-memory model,
//! with the whole store compared to the model after every step.
//!
//! The model keeps what each layer holds, block by block (as
//! `dataplane/src/replica/model_tests.rs` keeps the volume's bytes per snapshot), so
//! that the rebuild operations, which relink layers, are predictable: a
//! block reads from the newest layer holding it. It follows the documented
//! contract of each operation (see `dataplane/src/replica/`): unmap holds zeros where
//! a snapshot holds the block or the replica is being rebuilt, and punches a
//! hole elsewhere; removing a snapshot merges it into its child; staged
//! layers serve no reads and a reopen forgets them unless the replica is
//! being rebuilt; while the store is
//! open, a second one cannot open its directory; and so on.
//!
//! Input: one byte picks the operation, the following bytes its arguments
//! (missing bytes read as zero); at most [`MAX_OPS`] operations run. Errors
//! the model predicts (unaligned, out of range, unknown or existing
//! snapshot, invalid name or size, chain order) must be exactly those the
//! store returns; any other difference, or a panic, is a finding.
//!
//! Each input gets a fresh replica directory under `$OXHORN_FUZZ_DIR`, or
//! `/dev/shm` (tmpfs: fsync is free), or the temp directory, removed at the
//! end of the input.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use oxhorn_dataplane::replica::{
    BLOCK_SIZE, LayerSpec, ReplicaStore, StorageError, VOLUME_HEAD, validate_snapshot_name,
};

const BS: usize = BLOCK_SIZE as usize;
/// The volume's size in blocks when created, and the most it grows to.
const START_BLOCKS: u64 = 12;
const MAX_BLOCKS: u64 = 28;
/// Longest run of blocks one operation covers.
const MAX_RUN: u64 = 8;
/// Operations per input: bounds the time one input takes.
pub const MAX_OPS: usize = 32;
/// Snapshot names: six valid ones, then names the store must refuse.
const NAMES: [&str; 6] = ["s0", "s1", "s2", "s3", "s4", "s5"];
const INVALID_NAMES: [&str; 5] = [
    "",
    "S1",
    "a/b",
    "..",
    "a123456789012345678901234567890123456789012345678901234567890123",
];

pub fn store(data: &[u8]) {
    let dir = ScratchDir::new();
    let store = ReplicaStore::create(dir.path(), START_BLOCKS * BLOCK_SIZE).unwrap();
    let mut run = Run {
        store: Some(store),
        model: Model::new(START_BLOCKS),
        step: 0,
    };
    let mut input = Input(data);
    while !input.0.is_empty() && run.step < MAX_OPS {
        let op = Op::decode(&mut input);
        if trace() {
            eprintln!("step {}: {op:?}", run.step);
        }
        run.apply(&op);
        // Reads compare what they read themselves and change nothing.
        if !matches!(
            op,
            Op::Read { .. } | Op::ReadLayer { .. } | Op::LayerChunks { .. }
        ) {
            run.check(&op);
        }
        run.step += 1;
    }
}

/// Whether to print each operation (`OXHORN_FUZZ_TRACE=1`), to follow a
/// finding: `OXHORN_FUZZ_TRACE=1 cargo test -p oxhorn-fuzz` replays the corpus.
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("OXHORN_FUZZ_TRACE").is_some_and(|v| v == "1"))
}

/// A replica directory for one input, removed when dropped.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> Self {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::var_os("OXHORN_FUZZ_DIR")
            .map(PathBuf::from)
            .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
            .unwrap_or_else(std::env::temp_dir);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("oxhorn-fuzz-store-{}-{n}", std::process::id()));
        // Left over by a run that crashed with the same pid: not ours to keep.
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The input bytes, read front to back; exhausted input reads as zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) << 32 | u64::from(self.u32())
    }

    fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// A snapshot name: mostly valid ones, sometimes one to be refused.
    fn name(&mut self) -> String {
        let b = self.byte();
        if b < 0xf0 {
            NAMES[usize::from(b) % NAMES.len()].to_string()
        } else {
            INVALID_NAMES[usize::from(b) % INVALID_NAMES.len()].to_string()
        }
    }

    /// A byte range: mostly whole blocks near the volume (some beyond its
    /// end), sometimes raw values (unaligned, huge, overflowing).
    fn range(&mut self) -> (u64, u64) {
        let mode = self.byte();
        if mode < 0xe0 {
            let start = u64::from(self.byte()) % (MAX_BLOCKS + 4);
            let len = u64::from(self.byte()) % (MAX_RUN + 1);
            (start * BLOCK_SIZE, len * BLOCK_SIZE)
        } else if mode < 0xf0 {
            (
                self.u64(),
                u64::from(self.u16()) % (MAX_RUN * BLOCK_SIZE + 1),
            )
        } else {
            (self.u64(), self.u64())
        }
    }

    /// A buffer length from a range: huge raw lengths are capped (the
    /// store checks the range before touching the buffer either way).
    fn buffer(len: u64) -> u64 {
        len.min(MAX_RUN * BLOCK_SIZE + 1)
    }
}

#[derive(Debug)]
enum Op {
    Write {
        offset: u64,
        len: u64,
        seed: u8,
    },
    Read {
        offset: u64,
        len: u64,
    },
    Unmap {
        offset: u64,
        len: u64,
    },
    Flush,
    Snapshot {
        name: String,
        user_created: bool,
        label: u8,
    },
    Remove {
        name: String,
    },
    Revert {
        name: String,
    },
    Expand {
        size: Grow,
    },
    /// Drop without closing (as a crash, minus the page cache), then open.
    Reopen,
    CloseReopen,
    MarkClean,
    SetRebuilding(bool),
    SetRevision(u64),
    Stage {
        name: String,
        user_created: bool,
        created: u64,
    },
    Patch {
        name: String,
        offset: u64,
        len: u64,
        runs: Vec<(u64, u64, u8)>,
    },
    Install {
        chain: Vec<String>,
    },
    ReadLayer {
        name: String,
        offset: u64,
        len: u64,
    },
    LayerChunks {
        name: String,
        chunk_size: u64,
        checksums: bool,
    },
}

/// How an expand picks its new size.
#[derive(Debug)]
enum Grow {
    /// Blocks more than the current size (capped at `MAX_BLOCKS`).
    By(u64),
    /// A size in bytes, for the error cases.
    To(u64),
}

impl Op {
    fn decode(input: &mut Input) -> Op {
        match input.byte() % 32 {
            0..=7 => {
                let (offset, len) = input.range();
                let seed = input.byte();
                Op::Write {
                    offset,
                    len: Input::buffer(len),
                    seed,
                }
            }
            8 | 9 => {
                let (offset, len) = input.range();
                Op::Read {
                    offset,
                    len: Input::buffer(len),
                }
            }
            10..=12 => {
                let (offset, len) = input.range();
                Op::Unmap { offset, len }
            }
            13 => Op::Flush,
            14 | 15 => Op::Snapshot {
                name: input.name(),
                user_created: input.bool(),
                label: input.byte(),
            },
            16 => Op::Remove { name: input.name() },
            17 => Op::Revert { name: input.name() },
            18 => {
                let b = input.byte();
                let size = if b < 0xf0 {
                    Grow::By(u64::from(b) % (MAX_RUN + 1))
                } else {
                    Grow::To(input.u64())
                };
                Op::Expand { size }
            }
            19 => Op::Reopen,
            20 => Op::CloseReopen,
            21 => Op::MarkClean,
            22 => Op::SetRebuilding(input.bool()),
            23 => Op::SetRevision(u64::from(input.u32())),
            24 | 25 => Op::Stage {
                name: input.name(),
                user_created: input.bool(),
                created: u64::from(input.byte()),
            },
            26 | 27 => {
                let name = input.name();
                let (offset, len) = input.range();
                let count = input.byte() % 4;
                let runs = (0..count)
                    .map(|_| {
                        let (at, len) = input.range();
                        (at, Input::buffer(len), input.byte())
                    })
                    .collect();
                Op::Patch {
                    name,
                    offset,
                    len,
                    runs,
                }
            }
            28 | 29 => {
                let count = input.byte() % 5;
                Op::Install {
                    chain: (0..count).map(|_| input.name()).collect(),
                }
            }
            30 => {
                let name = input.name();
                let (offset, len) = input.range();
                Op::ReadLayer { name, offset, len }
            }
            _ => {
                let name = input.name();
                let b = input.byte();
                let chunk_size = if b < 0xf0 {
                    u64::from(b % 8 + 1) * BLOCK_SIZE
                } else {
                    u64::from(input.u16())
                };
                Op::LayerChunks {
                    name,
                    chunk_size,
                    checksums: input.bool(),
                }
            }
        }
    }
}

/// What a layer holds at one block: nothing, or the data written with
/// `seed` (seed 0 is zeros).
type Block = Option<u8>;

/// The content of block `block` written with `seed`: the block number and
/// the seed in every block, so misplaced or stale blocks show.
fn pattern(seed: u8, block: u64, out: &mut [u8]) {
    out.copy_from_slice(template(seed));
    if seed != 0 {
        out[..8].copy_from_slice(&block.to_le_bytes());
    }
}

/// Whether `got` is block `block` written with `seed`.
fn is_pattern(got: &[u8], seed: u8, block: u64) -> bool {
    let expected = template(seed);
    if seed == 0 {
        got == expected
    } else {
        got[..8] == block.to_le_bytes() && got[8..] == expected[8..]
    }
}

/// A block written with `seed`, its number left out: zeros for seed 0,
/// else the seed and its complement as the last byte.
fn template(seed: u8) -> &'static [u8] {
    static TEMPLATES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let all = TEMPLATES.get_or_init(|| {
        let mut all = vec![0; 256 * BS];
        for (seed, block) in all.chunks_mut(BS).enumerate().skip(1) {
            block.fill(seed as u8);
            block[BS - 1] = !(seed as u8);
        }
        all
    });
    &all[usize::from(seed) * BS..][..BS]
}

/// `blocks` blocks from block `first` written with `seed`.
fn data(first: u64, blocks: u64, seed: u8) -> Vec<u8> {
    let mut out = vec![0; usize::try_from(blocks).unwrap() * BS];
    for (i, chunk) in out.chunks_mut(BS).enumerate() {
        pattern(seed, first + i as u64, chunk);
    }
    out
}

#[derive(Clone, Debug)]
struct Layer {
    blocks: Vec<Block>,
    user_created: bool,
    /// Set by the caller (staged layers); `None` for snapshots, stamped now.
    created: Option<u64>,
    labels: BTreeMap<String, String>,
}

impl Layer {
    fn empty(blocks: u64) -> Self {
        Self {
            blocks: vec![None; usize::try_from(blocks).unwrap()],
            user_created: false,
            created: None,
            labels: BTreeMap::new(),
        }
    }

    fn held(&self) -> u64 {
        self.blocks.iter().filter(|b| b.is_some()).count() as u64
    }

    /// Maximal runs of held blocks in `[start, end)`.
    fn runs(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for b in start..end.min(self.blocks.len() as u64) {
            if self.blocks[b as usize].is_some() {
                match runs.last_mut() {
                    Some((_, e)) if *e == b => *e = b + 1,
                    _ => runs.push((b, b + 1)),
                }
            }
        }
        runs
    }
}

#[derive(Debug)]
struct Model {
    size: u64,
    head: Layer,
    /// Oldest first.
    snapshots: Vec<(String, Layer)>,
    staged: BTreeMap<String, Layer>,
    revision: u64,
    flushed: u64,
    dirty: bool,
    rebuilding: bool,
}

impl Model {
    fn new(blocks: u64) -> Self {
        Self {
            size: blocks,
            head: Layer::empty(blocks),
            snapshots: Vec::new(),
            staged: BTreeMap::new(),
            revision: 0,
            flushed: 0,
            dirty: false,
            rebuilding: false,
        }
    }

    fn bytes(&self) -> u64 {
        self.size * BLOCK_SIZE
    }

    /// What block `b` of the volume reads: its seed, 0 for zeros.
    fn read(&self, b: u64) -> u8 {
        std::iter::once(&self.head)
            .chain(self.snapshots.iter().rev().map(|(_, l)| l))
            .find_map(|l| l.blocks[b as usize])
            .unwrap_or(0)
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.snapshots.iter().position(|(n, _)| n == name)
    }

    /// A layer in the chain or staged, as the sync operations find it.
    fn layer_mut(&mut self, name: &str) -> Option<&mut Layer> {
        match self.position(name) {
            Some(i) => Some(&mut self.snapshots[i].1),
            None => self.staged.get_mut(name),
        }
    }

    fn layer(&self, name: &str) -> Option<&Layer> {
        match self.position(name) {
            Some(i) => Some(&self.snapshots[i].1),
            None => self.staged.get(name),
        }
    }

    /// Block range `[start, end)` of an I/O, or the store's error for it.
    fn io(&self, offset: u64, len: u64) -> Result<(u64, u64), StorageError> {
        if !offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE) {
            return Err(StorageError::Unaligned { offset, len });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes() => Ok((offset / BLOCK_SIZE, end / BLOCK_SIZE)),
            _ => Err(StorageError::OutOfRange {
                offset,
                len,
                size: self.bytes(),
            }),
        }
    }

    fn flush(&mut self) {
        self.flushed = self.revision;
    }
}

struct Run {
    /// `None` only while reopening.
    store: Option<ReplicaStore>,
    model: Model,
    step: usize,
}

impl Run {
    fn store(&self) -> &ReplicaStore {
        self.store.as_ref().unwrap()
    }

    /// Compares the store's answer with the model's: both succeed (the
    /// store's value is returned) or both fail with the same error.
    fn expect<T: Debug>(
        &self,
        op: &Op,
        got: Result<T, StorageError>,
        want: Result<(), StorageError>,
    ) -> Option<T> {
        match (got, want) {
            (Ok(value), Ok(())) => Some(value),
            (Err(got), Err(want)) if format!("{got:?}") == format!("{want:?}") => None,
            (got, want) => panic!(
                "step {} {op:?}: the store returned {got:?}, the model expects {want:?}",
                self.step
            ),
        }
    }

    fn apply(&mut self, op: &Op) {
        let m = &self.model;
        match *op {
            Op::Write { offset, len, seed } => {
                let want = m.io(offset, len);
                let range = want.as_ref().ok().copied();
                let buf = match range {
                    Some((start, end)) => data(start, end - start, seed),
                    None => vec![seed; len as usize],
                };
                self.model.dirty = true;
                let got = self.store().write_at(offset, &buf);
                if let Some(()) = self.expect(op, got, want.map(drop)) {
                    let (start, end) = range.unwrap();
                    for b in start..end {
                        self.model.head.blocks[b as usize] = Some(seed);
                    }
                    self.model.revision += 1;
                }
            }
            Op::Read { offset, len } => {
                let want = m.io(offset, len);
                let range = want.as_ref().ok().copied();
                let mut buf = vec![0xee; len as usize];
                let got = self.store().read_at(offset, &mut buf);
                if let Some(()) = self.expect(op, got, want.map(drop)) {
                    let (start, _) = range.unwrap();
                    self.compare_volume(op, start, &buf);
                }
            }
            Op::Unmap { offset, len } => {
                let want = m.io(offset, len);
                let range = want.as_ref().ok().copied();
                self.model.dirty = true;
                let got = self.store().unmap(offset, len);
                if let Some(()) = self.expect(op, got, want.map(drop)) {
                    let (start, end) = range.unwrap();
                    let m = &mut self.model;
                    for b in start..end {
                        let shadowing = m.rebuilding
                            || m.snapshots
                                .iter()
                                .any(|(_, l)| l.blocks[b as usize].is_some());
                        m.head.blocks[b as usize] = shadowing.then_some(0);
                    }
                    m.revision += 1;
                }
            }
            Op::Flush => {
                let got = self.store().flush();
                self.expect(op, got, Ok(()));
                self.model.flush();
            }
            Op::Snapshot {
                ref name,
                user_created,
                label,
            } => {
                let labels = if label == 0 {
                    BTreeMap::new()
                } else {
                    BTreeMap::from([("k".to_string(), format!("v{label}"))])
                };
                let want = if validate_snapshot_name(name).is_err() {
                    Err(StorageError::InvalidName(name.clone()))
                } else if m.position(name).is_some() || m.staged.contains_key(name) {
                    Err(StorageError::SnapshotExists(name.clone()))
                } else {
                    Ok(())
                };
                let got = self.store().snapshot(name, user_created, labels.clone());
                if let Some(()) = self.expect(op, got, want) {
                    let m = &mut self.model;
                    let mut layer = std::mem::replace(&mut m.head, Layer::empty(m.size));
                    layer.user_created = user_created;
                    layer.labels = labels;
                    m.snapshots.push((name.clone(), layer));
                    m.flush();
                }
            }
            Op::Remove { ref name } => {
                let index = m.position(name);
                let want = match index {
                    Some(_) => Ok(()),
                    None => Err(StorageError::SnapshotNotFound(name.clone())),
                };
                let got = self.store().remove_snapshot(name);
                if let Some(()) = self.expect(op, got, want) {
                    let m = &mut self.model;
                    let (_, removed) = m.snapshots.remove(index.unwrap());
                    let child = match m.snapshots.get_mut(index.unwrap()) {
                        Some((_, layer)) => layer,
                        None => &mut m.head,
                    };
                    for (mine, theirs) in child.blocks.iter_mut().zip(removed.blocks) {
                        if mine.is_none() {
                            *mine = theirs;
                        }
                    }
                    m.flush();
                }
            }
            Op::Revert { ref name } => {
                let index = m.position(name);
                let want = match index {
                    Some(_) => Ok(()),
                    None => Err(StorageError::SnapshotNotFound(name.clone())),
                };
                let got = self.store().revert(name);
                if let Some(()) = self.expect(op, got, want) {
                    let m = &mut self.model;
                    m.snapshots.truncate(index.unwrap() + 1);
                    m.head = Layer::empty(m.size);
                    m.flush();
                }
            }
            Op::Expand { ref size } => {
                let new_size = match *size {
                    Grow::By(blocks) => (m.size + blocks).min(MAX_BLOCKS) * BLOCK_SIZE,
                    Grow::To(bytes) => bytes,
                };
                let want = if new_size == 0
                    || !new_size.is_multiple_of(BLOCK_SIZE)
                    || new_size > i64::MAX as u64
                {
                    Err(StorageError::InvalidSize { size: new_size })
                } else if new_size < m.bytes() {
                    Err(StorageError::CannotShrink {
                        size: m.bytes(),
                        requested: new_size,
                    })
                } else if new_size > MAX_BLOCKS * BLOCK_SIZE {
                    // Valid but too large to check by reading it all.
                    return;
                } else {
                    Ok(())
                };
                let got = self.store().expand(new_size);
                if let Some(()) = self.expect(op, got, want) {
                    let m = &mut self.model;
                    let blocks = new_size / BLOCK_SIZE;
                    if blocks > m.size {
                        m.size = blocks;
                        m.flush();
                        let layers = std::iter::once(&mut m.head)
                            .chain(m.snapshots.iter_mut().map(|(_, l)| l))
                            .chain(m.staged.values_mut());
                        for layer in layers {
                            layer.blocks.resize(blocks as usize, None);
                        }
                    }
                }
            }
            Op::Reopen | Op::CloseReopen => {
                let store = self.store.take().unwrap();
                let path = store.path().to_path_buf();
                // While open, the directory is locked against a second store.
                let second = ReplicaStore::open(&path).map(drop);
                self.expect(op, second, Err(StorageError::Busy { path: path.clone() }));
                if matches!(op, Op::CloseReopen) {
                    store.close().unwrap();
                    self.model.flush();
                    self.model.dirty = false;
                } else {
                    drop(store);
                    // Unflushed writes are still in the files (no crash of
                    // the machine), but the counter is the persisted one.
                    self.model.revision = self.model.flushed;
                }
                // Staged layers are not in the chain: open deletes them,
                // unless a rebuild is under way, which then resumes.
                if !self.model.rebuilding {
                    self.model.staged.clear();
                }
                self.store = Some(ReplicaStore::open(&path).unwrap());
            }
            Op::MarkClean => {
                let got = self.store().mark_clean();
                self.expect(op, got, Ok(()));
                self.model.flush();
                self.model.dirty = false;
            }
            Op::SetRebuilding(rebuilding) => {
                let got = self.store().set_rebuilding(rebuilding);
                self.expect(op, got, Ok(()));
                self.model.rebuilding = rebuilding;
            }
            Op::SetRevision(revision) => {
                let got = self.store().set_revision(revision);
                self.expect(op, got, Ok(()));
                self.model.revision = revision;
                self.model.flushed = revision;
            }
            Op::Stage {
                ref name,
                user_created,
                created,
            } => {
                let spec = LayerSpec {
                    name: name.clone(),
                    created,
                    user_created,
                    labels: BTreeMap::new(),
                };
                let want = if validate_snapshot_name(name).is_err() {
                    Err(StorageError::InvalidName(name.clone()))
                } else {
                    Ok(())
                };
                let got = self.store().stage_layer(&spec);
                if let Some(()) = self.expect(op, got, want) {
                    let m = &mut self.model;
                    if m.layer(name).is_none() {
                        let mut layer = Layer::empty(m.size);
                        layer.user_created = user_created;
                        layer.created = Some(created);
                        m.staged.insert(name.clone(), layer);
                    }
                }
            }
            Op::Patch {
                ref name,
                offset,
                len,
                ref runs,
            } => self.patch(op, name, offset, len, runs),
            Op::Install { ref chain } => self.install(op, chain),
            Op::ReadLayer {
                ref name,
                offset,
                len,
            } => {
                let want = if !offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE)
                {
                    Err(StorageError::Unaligned { offset, len })
                } else if m.layer(name).is_none() {
                    Err(StorageError::SnapshotNotFound(name.clone()))
                } else if offset.checked_add(len).is_none() {
                    Err(StorageError::OutOfRange {
                        offset,
                        len,
                        size: m.bytes(),
                    })
                } else {
                    Ok(())
                };
                let got = self.store().read_layer(name, offset, len);
                if let Some(runs) = self.expect(op, got, want) {
                    let layer = self.model.layer(name).unwrap();
                    let (start, end) = (offset / BLOCK_SIZE, (offset + len) / BLOCK_SIZE);
                    self.compare_layer(op, name, layer, start, end, &runs);
                }
            }
            Op::LayerChunks {
                ref name,
                chunk_size,
                checksums,
            } => {
                let want = if chunk_size == 0 || !chunk_size.is_multiple_of(BLOCK_SIZE) {
                    Err(StorageError::Unaligned {
                        offset: 0,
                        len: chunk_size,
                    })
                } else if m.layer(name).is_none() {
                    Err(StorageError::SnapshotNotFound(name.clone()))
                } else {
                    Ok(())
                };
                let got = self.store().layer_chunks(name, chunk_size, checksums);
                if let Some(chunks) = self.expect(op, got, want) {
                    self.check_chunks(op, name, chunk_size, checksums, &chunks);
                }
            }
        }
    }

    fn patch(&mut self, op: &Op, name: &str, offset: u64, len: u64, runs: &[(u64, u64, u8)]) {
        let m = &self.model;
        let range = |m: &Model| -> Result<(u64, u64), StorageError> {
            if !offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE) {
                return Err(StorageError::Unaligned { offset, len });
            }
            if m.layer(name).is_none() {
                return Err(StorageError::SnapshotNotFound(name.to_string()));
            }
            let (start, end) = match offset.checked_add(len) {
                Some(end) if end <= m.bytes() => (offset / BLOCK_SIZE, end / BLOCK_SIZE),
                _ => {
                    return Err(StorageError::OutOfRange {
                        offset,
                        len,
                        size: m.bytes(),
                    });
                }
            };
            for &(at, run_len, _) in runs {
                if !at.is_multiple_of(BLOCK_SIZE) || !run_len.is_multiple_of(BLOCK_SIZE) {
                    return Err(StorageError::Unaligned {
                        offset: at,
                        len: run_len,
                    });
                }
                let inside =
                    at >= offset && at.checked_add(run_len).is_some_and(|e| e <= offset + len);
                if !inside {
                    return Err(StorageError::OutOfRange {
                        offset: at,
                        len: run_len,
                        size: offset + len,
                    });
                }
            }
            Ok((start, end))
        };
        let want = range(m);
        let blocks = want.as_ref().ok().copied();
        let payload: Vec<(u64, Vec<u8>)> = runs
            .iter()
            .map(|&(at, run_len, seed)| match blocks {
                Some(_) => (at, data(at / BLOCK_SIZE, run_len / BLOCK_SIZE, seed)),
                None => (at, vec![seed; run_len as usize]),
            })
            .collect();
        let got = self.store().patch_layer(name, offset, len, &payload);
        if let Some(()) = self.expect(op, got, want.map(drop)) {
            let (start, end) = blocks.unwrap();
            let layer = self.model.layer_mut(name).unwrap();
            for b in start..end {
                layer.blocks[b as usize] = None;
            }
            for &(at, run_len, seed) in runs {
                for b in at / BLOCK_SIZE..(at + run_len) / BLOCK_SIZE {
                    layer.blocks[b as usize] = Some(seed);
                }
            }
        }
    }

    fn install(&mut self, op: &Op, chain: &[String]) {
        let m = &self.model;
        let keep_from = chain
            .last()
            .and_then(|last| m.position(last))
            .map_or(0, |i| i + 1);
        let mut want = Ok(());
        for (i, name) in chain.iter().enumerate() {
            if m.layer(name).is_none() {
                want = Err(StorageError::SnapshotNotFound(name.clone()));
                break;
            }
            let newer = keep_from > 0 && m.position(name).is_some_and(|p| p >= keep_from);
            if newer || chain[..i].contains(name) {
                want = Err(StorageError::ChainOrder(name.clone()));
                break;
            }
        }
        let got = self.store().install_chain(chain);
        if let Some(()) = self.expect(op, got, want) {
            let m = &mut self.model;
            // Without the chain's newest layer in this replica's chain, no
            // snapshot here is known to be newer: all are replaced.
            let newer = if keep_from > 0 {
                m.snapshots.split_off(keep_from)
            } else {
                Vec::new()
            };
            let mut pool: BTreeMap<String, Layer> = m.snapshots.drain(..).collect();
            pool.append(&mut m.staged);
            for name in chain {
                let layer = pool.remove(name).unwrap();
                m.snapshots.push((name.clone(), layer));
            }
            m.snapshots.extend(newer);
        }
    }

    /// `buf` read from block `start` matches the model's volume.
    fn compare_volume(&self, op: &Op, start: u64, buf: &[u8]) {
        for (i, got) in buf.chunks(BS).enumerate() {
            let b = start + i as u64;
            assert!(
                is_pattern(got, self.model.read(b), b),
                "step {} {op:?}: block {b} reads differently from the model (first bytes {:?}, model seed {})",
                self.step,
                &got[..16],
                self.model.read(b)
            );
        }
    }

    /// `runs` read from layer `name` over blocks `[start, end)` are what
    /// the model's layer holds there.
    fn compare_layer(
        &self,
        op: &Op,
        name: &str,
        layer: &Layer,
        start: u64,
        end: u64,
        runs: &[(u64, Vec<u8>)],
    ) {
        let got: Vec<(u64, u64)> = runs
            .iter()
            .map(|(at, data)| (at / BLOCK_SIZE, (at + data.len() as u64) / BLOCK_SIZE))
            .collect();
        assert_eq!(
            got,
            layer.runs(start, end),
            "step {} {op:?}: layer {name} holds other runs than the model",
            self.step
        );
        for (at, data) in runs {
            for (i, got) in data.chunks(BS).enumerate() {
                let b = at / BLOCK_SIZE + i as u64;
                assert!(
                    is_pattern(got, layer.blocks[b as usize].unwrap(), b),
                    "step {} {op:?}: layer {name} block {b} differs from the model",
                    self.step
                );
            }
        }
    }

    /// Chunk summaries of `name` count the blocks the model's layer holds;
    /// with checksums, a chunk's checksum equals another layer's at the same
    /// index exactly when both hold the same blocks with the same data.
    fn check_chunks(
        &self,
        op: &Op,
        name: &str,
        chunk_size: u64,
        checksums: bool,
        chunks: &[oxhorn_dataplane::replica::ChunkSummary],
    ) {
        let per_chunk = chunk_size / BLOCK_SIZE;
        let layer = self.model.layer(name).unwrap();
        let content = |layer: &Layer, index: u64| -> Vec<(u64, u8)> {
            let start = index * per_chunk;
            let end = (start + per_chunk).min(layer.blocks.len() as u64);
            (start..end)
                .filter_map(|b| layer.blocks[b as usize].map(|s| (b, s)))
                .collect()
        };
        let expected: Vec<(u64, u64)> = (0..self.model.size.div_ceil(per_chunk))
            .map(|index| (index, content(layer, index).len() as u64 * BLOCK_SIZE))
            .filter(|&(_, bytes)| bytes > 0)
            .collect();
        let got: Vec<(u64, u64)> = chunks.iter().map(|c| (c.index, c.bytes)).collect();
        assert_eq!(got, expected, "step {} {op:?}: chunks", self.step);
        if !checksums {
            assert!(
                chunks.iter().all(|c| c.checksum == 0),
                "step {} {op:?}",
                self.step
            );
            return;
        }
        let others: Vec<&str> = self
            .model
            .snapshots
            .iter()
            .map(|(n, _)| n.as_str())
            .chain(self.model.staged.keys().map(String::as_str))
            .collect();
        for other in others {
            let theirs = self.store().layer_chunks(other, chunk_size, true).unwrap();
            let other_layer = self.model.layer(other).unwrap();
            for mine in chunks {
                let Some(their) = theirs.iter().find(|c| c.index == mine.index) else {
                    continue;
                };
                let same = content(layer, mine.index) == content(other_layer, mine.index);
                assert_eq!(
                    mine.checksum == their.checksum,
                    same,
                    "step {} {op:?}: chunk {} checksums of {name} and {other}",
                    self.step,
                    mine.index
                );
            }
        }
    }

    /// The whole store against the model.
    fn check(&self, op: &Op) {
        let (store, m, step) = (self.store(), &self.model, self.step);
        assert_eq!(store.size().unwrap(), m.bytes(), "step {step} {op:?}: size");
        let mut buf = vec![0xee; m.bytes() as usize];
        store.read_at(0, &mut buf).unwrap();
        self.compare_volume(op, 0, &buf);
        assert_eq!(store.revision(), m.revision, "step {step} {op:?}: revision");
        assert_eq!(store.dirty(), m.dirty, "step {step} {op:?}: dirty");
        assert_eq!(
            store.rebuilding().unwrap(),
            m.rebuilding,
            "step {step} {op:?}: rebuilding"
        );

        let infos = store.snapshots().unwrap();
        let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
        let expected: Vec<&str> = m.snapshots.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, expected, "step {step} {op:?}: snapshots");
        for (i, (info, (_, layer))) in infos.iter().zip(&m.snapshots).enumerate() {
            let parent = i.checked_sub(1).map(|p| expected[p].to_string());
            let child = expected.get(i + 1).copied().unwrap_or(VOLUME_HEAD);
            assert_eq!(info.parent, parent, "step {step} {op:?}: {info:?}");
            assert_eq!(info.children, [child], "step {step} {op:?}: {info:?}");
            assert_eq!(
                info.size,
                layer.held() * BLOCK_SIZE,
                "step {step} {op:?}: {info:?}"
            );
            assert_eq!(
                info.user_created, layer.user_created,
                "step {step} {op:?}: {info:?}"
            );
            assert_eq!(info.labels, layer.labels, "step {step} {op:?}: {info:?}");
            if let Some(created) = layer.created {
                assert_eq!(info.created, created, "step {step} {op:?}: {info:?}");
            }
        }

        let files = store.layer_files().unwrap();
        let layers: Vec<(Option<&str>, &Layer)> = m
            .snapshots
            .iter()
            .map(|(n, l)| (Some(n.as_str()), l))
            .chain([(None, &m.head)])
            .collect();
        assert_eq!(files.len(), layers.len(), "step {step} {op:?}: layer files");
        for (file, (name, layer)) in files.iter().zip(layers) {
            assert_eq!(file.snapshot.as_deref(), name, "step {step} {op:?}");
            let extents: Vec<(u64, u64)> = file.extents.iter().collect();
            assert_eq!(
                extents,
                layer.runs(0, m.size),
                "step {step} {op:?}: extents of {name:?}"
            );
        }
        let held: u64 = m.snapshots.iter().map(|(_, l)| l.held()).sum::<u64>() + m.head.held();
        assert_eq!(
            store.extents_allocated_bytes().unwrap(),
            held * BLOCK_SIZE,
            "step {step} {op:?}: allocated bytes"
        );

        for (name, layer) in &m.staged {
            let runs = store.read_layer(name, 0, m.bytes()).unwrap();
            self.compare_layer(op, name, layer, 0, m.size, &runs);
        }
    }
}
