//! [`ReplicaStore`]: a replica's layers, opened from its directory, serving
//! block reads and writes.
//!
//! Reads and writes take `&self` and run concurrently under a read lock on
//! the layer chain; operations that change the chain (snapshot, remove,
//! revert, expand; see `chain.rs`) take the write lock.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::BLOCK_SIZE;
use super::dir::ReplicaDir;
use super::error::{Result, StorageError};
use super::extents::ExtentSet;
use super::group_commit::GroupCommit;
use super::layer::{Layer, buf_range, probe_filesystem};
use super::lock;
use super::meta::{LayerMeta, VolumeMeta, check_size};
use super::naming::{
    REVISION_FILE, VOLUME_HEAD, VOLUME_META, companion_files, head_file, is_layer_artifact,
    meta_file, snapshot_name_of,
};
use super::revision::RevisionCounter;

/// One copy of a volume's data: a writable head layer over a chain of
/// read-only snapshot layers. Share it behind an `Arc`; all I/O takes `&self`.
#[derive(Debug)]
pub struct ReplicaStore {
    pub(super) dir: ReplicaDir,
    pub(super) state: RwLock<State>,
    pub(super) revision: RevisionCounter,
    /// Fast-path copy of `meta.dirty`, so writes need not take the write lock.
    dirty: AtomicBool,
    /// The changes to sync at the next flush.
    commit: GroupCommit,
}

/// The layer chain and the metadata describing it.
#[derive(Debug)]
pub(super) struct State {
    pub meta: VolumeMeta,
    pub head: Layer,
    /// Oldest first; the last one is the head's parent.
    pub snapshots: Vec<Layer>,
    /// Layers a rebuild is filling, by snapshot name; not yet in the chain.
    pub staged: BTreeMap<String, Layer>,
}

/// A layer's file, for copying a replica's layers elsewhere (rebuild).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerFile {
    /// The snapshot's name; `None` for the head.
    pub snapshot: Option<String>,
    pub path: PathBuf,
    /// Blocks held by the layer: the only ranges worth copying.
    pub extents: ExtentSet,
}

impl State {
    /// Layers in lookup order from `view` (a snapshot, or the head as
    /// [`VOLUME_HEAD`]) down to the oldest.
    fn newest_first_from(&self, view: &str) -> Result<impl Iterator<Item = &Layer>> {
        let (head, below) = match view == VOLUME_HEAD {
            true => (Some(&self.head), self.snapshots.len()),
            false => (None, self.find_snapshot(view)? + 1),
        };
        Ok(head.into_iter().chain(self.snapshots[..below].iter().rev()))
    }

    /// Layers oldest first, head last.
    fn oldest_first(&self) -> impl Iterator<Item = &Layer> {
        self.snapshots.iter().chain(std::iter::once(&self.head))
    }

    /// Blocks `[start, end)` of an I/O at `offset` of `len` bytes, checked
    /// against alignment and the volume size.
    pub(super) fn blocks(&self, offset: u64, len: u64) -> Result<(u64, u64)> {
        if !offset.is_multiple_of(BLOCK_SIZE) || !len.is_multiple_of(BLOCK_SIZE) {
            return Err(StorageError::Unaligned { offset, len });
        }
        let size = self.meta.size;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok((offset / BLOCK_SIZE, end / BLOCK_SIZE)),
            _ => Err(StorageError::OutOfRange { offset, len, size }),
        }
    }

    /// Blocks in `[start, end)` held by any snapshot layer.
    fn snapshot_blocks(&self, start: u64, end: u64) -> Result<ExtentSet> {
        let mut held = ExtentSet::new();
        for layer in &self.snapshots {
            layer.add_held(start, end, &mut held)?;
        }
        Ok(held)
    }

    /// Changes `volume.meta` on disk, then in memory, so a failed write
    /// leaves memory matching the disk.
    pub fn update_meta(
        &mut self,
        dir: &ReplicaDir,
        change: impl FnOnce(&mut VolumeMeta),
    ) -> Result<()> {
        let mut meta = self.meta.clone();
        change(&mut meta);
        meta.save(dir)?;
        self.meta = meta;
        Ok(())
    }

    /// File names the chain references; anything else of ours is debris.
    pub(super) fn referenced_files(&self) -> HashSet<String> {
        let mut names: HashSet<String> = [VOLUME_META, REVISION_FILE].map(String::from).into();
        for layer in self.oldest_first().chain(self.staged.values()) {
            names.extend(companion_files(&layer.file_name));
            names.insert(layer.file_name.clone());
        }
        names
    }
}

impl ReplicaStore {
    /// Creates a replica of `size` bytes in `path`, which must be empty or
    /// absent. `volume.meta` is written last: a crash part way leaves a
    /// directory that `open` rejects rather than a half-made replica.
    pub fn create(path: impl AsRef<Path>, size: u64) -> Result<Self> {
        let path = path.as_ref();
        check_size(size)?;
        fs::create_dir_all(path).map_err(|e| StorageError::io(path, e))?;
        let dir = ReplicaDir::lock(path)?;
        if !dir.entries()?.is_empty() {
            return Err(StorageError::DirectoryNotEmpty {
                path: path.to_path_buf(),
            });
        }
        probe_filesystem(&dir)?;
        let head_name = head_file(1);
        let head = Layer::create(
            &dir,
            size,
            LayerMeta::new(head_name.clone(), String::new(), false, BTreeMap::new()),
        )?;
        let revision = RevisionCounter::create(&dir)?;
        let meta = VolumeMeta::new(size, head_name);
        meta.save(&dir)?;
        Ok(Self::assemble(dir, meta, head, Vec::new(), revision))
    }

    /// Opens the replica in `path`. Missing or corrupt metadata is an error
    /// naming the file: a replica that cannot prove its layout serves nothing.
    /// Debris of interrupted operations (unreferenced layer files, temp
    /// files) is deleted, except the layers an interrupted rebuild staged.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let dir = ReplicaDir::lock(path.as_ref())?;
        let mut meta = VolumeMeta::load(&dir)?;
        probe_filesystem(&dir)?;
        let head = Layer::open(&dir, &meta.head, meta.size)?;
        let snapshots = open_chain(&dir, &head, meta.size)?;
        if meta.parent != head.meta.parent {
            // A crash between relinking the head and rewriting volume.meta.
            meta.parent.clone_from(&head.meta.parent);
            meta.save(&dir)?;
        }
        let revision = RevisionCounter::open(&dir)?;
        let store = Self::assemble(dir, meta, head, snapshots, revision);
        store.restage_after_restart()?;
        store.collect_garbage()?;
        Ok(store)
    }

    fn assemble(
        dir: ReplicaDir,
        meta: VolumeMeta,
        head: Layer,
        snapshots: Vec<Layer>,
        revision: RevisionCounter,
    ) -> Self {
        Self {
            dir,
            dirty: AtomicBool::new(meta.dirty),
            commit: GroupCommit::default(),
            state: RwLock::new(State {
                meta,
                head,
                snapshots,
                staged: BTreeMap::new(),
            }),
            revision,
        }
    }

    /// Deletes our files that the chain does not reference.
    pub(super) fn collect_garbage(&self) -> Result<()> {
        let referenced = lock::read(&self.state)?.referenced_files();
        let mut removed = false;
        for name in self.dir.entries()? {
            if !referenced.contains(&name) && is_layer_artifact(&name) {
                tracing::info!(dir = %self.dir.path().display(), file = name, "removing unreferenced replica file");
                self.dir.remove_if_exists(&name)?;
                removed = true;
            }
        }
        if removed {
            self.dir.sync()?;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset`; both must be multiples of 4096.
    /// Each block comes from the newest layer holding it; blocks no layer
    /// holds read as zeros. Blocks that fail their checksum fail the read
    /// with [`StorageError::ChecksumMismatch`], naming all of them.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_view(VOLUME_HEAD, offset, buf)
    }

    /// Reads as [`read_at`](Self::read_at) does, but what the volume read
    /// when snapshot `view` was taken (the head, [`VOLUME_HEAD`]: now).
    pub fn read_view(&self, view: &str, offset: u64, buf: &mut [u8]) -> Result<()> {
        let bad = Self::read_layers(&*lock::read(&self.state)?, view, offset, buf)?;
        if bad.is_empty() {
            return Ok(());
        }
        // A write to the same blocks may have been in flight, its data
        // written and its checksum not yet (or the reverse): read them again
        // with no write in flight before calling them rotten.
        let bad = Self::read_layers(&*lock::write(&self.state)?, view, offset, buf)?;
        if bad.is_empty() {
            return Ok(());
        }
        Err(StorageError::ChecksumMismatch {
            path: self.dir.path().to_path_buf(),
            blocks: bad.iter().collect(),
        })
    }

    /// Reads through the chain from `view` down, returning the blocks that
    /// failed their checksum.
    fn read_layers(state: &State, view: &str, offset: u64, buf: &mut [u8]) -> Result<ExtentSet> {
        let (start, end) = state.blocks(offset, buf.len() as u64)?;
        let mut pending = vec![(start, end)];
        let mut bad = ExtentSet::new();
        for layer in state.newest_first_from(view)? {
            if pending.is_empty() {
                break;
            }
            pending = layer.read_checked(&pending, start, buf, &mut bad)?;
        }
        for (s, e) in pending {
            buf[buf_range(start, s, e)].fill(0);
        }
        Ok(bad)
    }

    /// Writes `data` at `offset` into the head; both must be multiples of
    /// 4096. Durable after [`flush`](Self::flush).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_head(offset, data)?;
        // Counted before a flush may see it done, so that the flush that
        // syncs it notes it too.
        self.revision.bump();
        self.commit.changed();
        Ok(())
    }

    /// Writes blocks a read found rotten, with the data the other replicas
    /// hold, into the head (which shadows a rotten block of a snapshot
    /// too). Not a write of the volume's: the revision counter stays, so
    /// that this replica does not look newer than the others.
    pub fn repair_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_head(offset, data)?;
        self.commit.changed();
        Ok(())
    }

    fn write_head(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.mark_dirty()?;
        let state = lock::read(&self.state)?;
        let (start, _) = state.blocks(offset, data.len() as u64)?;
        state.head.write_blocks(start, data)
    }

    /// Discards `len` bytes at `offset`: they read as zeros afterwards. Holes
    /// are punched only where no snapshot holds the block; elsewhere zeros
    /// are written, since a hole would let the older data show through. A
    /// replica being rebuilt writes zeros everywhere: the layers below its
    /// head are still being filled, and a hole would show what they receive.
    pub fn unmap(&self, offset: u64, len: u64) -> Result<()> {
        self.mark_dirty()?;
        let state = lock::read(&self.state)?;
        let (start, end) = state.blocks(offset, len)?;
        let shadowing = if state.meta.rebuilding {
            let mut all = ExtentSet::new();
            all.insert(start, end);
            all
        } else {
            state.snapshot_blocks(start, end)?
        };
        for (s, e) in shadowing.gaps(start, end) {
            state.head.punch(s, e)?;
        }
        for (s, e) in shadowing.iter() {
            state.head.write_zeros(s, e)?;
        }
        self.revision.bump();
        self.commit.changed();
        Ok(())
    }

    /// Makes all completed writes durable, then the revision counter.
    pub fn flush(&self) -> Result<()> {
        self.flush_locked(&*lock::read(&self.state)?)
    }

    /// Flush with the chain lock already held (by either kind of guard),
    /// a no-op if nothing changed since the last (`group_commit.rs`). The
    /// counter is read before the sync, so it never counts writes the sync
    /// may have missed, and written after it, durable later (`revision.rs`).
    /// A layer that stops being the head is flushed first (`chain.rs`), so
    /// syncing the head covers every change.
    pub(super) fn flush_locked(&self, state: &State) -> Result<()> {
        self.commit.flush(|| {
            let revision = self.revision.current();
            state.head.sync_data()?;
            self.revision.note(revision)
        })
    }

    /// Flushes and clears the dirty flag: the persisted revision counter now
    /// matches the data exactly.
    pub fn close(self) -> Result<()> {
        self.mark_clean()
    }

    /// Flushes and clears the dirty flag while staying open (an engine that
    /// stopped cleanly); the next write sets it again.
    pub fn mark_clean(&self) -> Result<()> {
        let mut state = lock::write(&self.state)?;
        // No write is in flight: settling syncs every one (and their
        // checksums), which the counter may then count exactly.
        state.head.settle()?;
        self.revision.persist(self.revision.current())?;
        state.update_meta(&self.dir, |meta| meta.dirty = false)?;
        self.dirty.store(false, Ordering::Release);
        Ok(())
    }

    /// Persists the dirty flag before the first write after open, so that a
    /// crash with unflushed writes is visible at the next open.
    pub(super) fn mark_dirty(&self) -> Result<()> {
        if self.dirty.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut state = lock::write(&self.state)?;
        if !state.meta.dirty {
            state.update_meta(&self.dir, |meta| meta.dirty = true)?;
        }
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Marks the replica as being rebuilt (its data incomplete) or done.
    pub fn set_rebuilding(&self, rebuilding: bool) -> Result<()> {
        let mut state = lock::write(&self.state)?;
        state.update_meta(&self.dir, |meta| meta.rebuilding = rebuilding)
    }

    pub fn rebuilding(&self) -> Result<bool> {
        Ok(lock::read(&self.state)?.meta.rebuilding)
    }

    /// Whether the replica was written since its last clean [`close`](Self::close).
    pub fn dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// The revision counter, including writes not yet flushed.
    pub fn revision(&self) -> u64 {
        self.revision.current()
    }

    /// Volume size in bytes.
    pub fn size(&self) -> Result<u64> {
        Ok(lock::read(&self.state)?.meta.size)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Every layer's file and extents, oldest snapshot first, head last.
    pub fn layer_files(&self) -> Result<Vec<LayerFile>> {
        let state = lock::read(&self.state)?;
        state
            .oldest_first()
            .map(|layer| {
                Ok(LayerFile {
                    snapshot: snapshot_name_of(&layer.file_name).map(String::from),
                    path: layer.path.clone(),
                    extents: layer.extents()?,
                })
            })
            .collect()
    }

    /// Bytes held by all layers together: the replica's disk usage.
    pub fn extents_allocated_bytes(&self) -> Result<u64> {
        let state = lock::read(&self.state)?;
        state.oldest_first().map(Layer::allocated_bytes).sum()
    }
}

/// Opens the snapshots below `head` by following parent links, returning
/// them oldest first. A cycle would loop forever, so it is corruption.
fn open_chain(dir: &ReplicaDir, head: &Layer, size: u64) -> Result<Vec<Layer>> {
    let mut chain: Vec<Layer> = Vec::new();
    let mut seen = HashSet::new();
    let mut parent = head.meta.parent.clone();
    while !parent.is_empty() {
        if !seen.insert(parent.clone()) {
            let child = chain.last().unwrap_or(head);
            return Err(StorageError::corrupt(
                &dir.join(&meta_file(&child.file_name)),
                format!("parent {parent:?} forms a cycle"),
            ));
        }
        let layer = Layer::open(dir, &parent, size)?;
        parent.clone_from(&layer.meta.parent);
        chain.push(layer);
    }
    chain.reverse();
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::replica::testutil::{BS, block_bytes, blocks, new_store, read_all, reopen};

    #[test]
    fn new_replica_reads_zeros_and_has_documented_files() {
        let (tmp, store) = new_store(8);
        assert_eq!(store.size().unwrap(), 8 * BLOCK_SIZE);
        assert!(read_all(&store).iter().all(|&b| b == 0));
        assert_eq!(store.revision(), 0);
        assert!(!store.dirty());
        let mut files = fs::read_dir(tmp.path().join("replica"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect::<Vec<_>>();
        files.sort();
        assert_eq!(
            files,
            [
                "head-1.img",
                "head-1.img.crc",
                "head-1.img.intent",
                "head-1.img.meta",
                "revision.counter",
                "volume.meta"
            ]
        );
    }

    #[test]
    fn create_refuses_a_non_empty_directory() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("x"), b"").unwrap();
        let err = ReplicaStore::create(tmp.path(), 8 * BLOCK_SIZE).unwrap_err();
        assert!(
            matches!(err, StorageError::DirectoryNotEmpty { ref path } if path == tmp.path()),
            "{err}"
        );
    }

    #[test]
    fn create_rejects_invalid_sizes() {
        let tmp = tempfile::tempdir().unwrap();
        for size in [0, 100, BLOCK_SIZE + 1] {
            let err = ReplicaStore::create(tmp.path(), size).unwrap_err();
            assert!(
                matches!(err, StorageError::InvalidSize { size: s } if s == size),
                "{err}"
            );
        }
    }

    #[test]
    fn writes_read_back_and_survive_reopen() {
        let (_tmp, store) = new_store(8);
        store.write_at(BLOCK_SIZE, &blocks(1, 2)).unwrap();
        store.write_at(6 * BLOCK_SIZE, &blocks(2, 1)).unwrap();
        let mut buf = blocks(0xee, 3);
        store.read_at(2 * BLOCK_SIZE, &mut buf).unwrap();
        assert_eq!(buf, [blocks(1, 1), blocks(0, 2)].concat());
        assert_eq!(block_bytes(&store), [0, 1, 1, 0, 0, 0, 2, 0]);
        store.flush().unwrap();
        let store = reopen(store);
        assert_eq!(block_bytes(&store), [0, 1, 1, 0, 0, 0, 2, 0]);
    }

    #[test]
    fn unaligned_io_is_rejected() {
        let (_tmp, store) = new_store(8);
        let mut buf = vec![0; BS];
        for (offset, len) in [(1, BS), (0, BS - 1), (512, 512)] {
            let unaligned = |r: Result<()>| matches!(r, Err(StorageError::Unaligned { offset: o, len: l }) if o == offset && l == len as u64);
            assert!(unaligned(store.read_at(offset, &mut buf[..len])));
            assert!(unaligned(store.write_at(offset, &buf[..len])));
            assert!(unaligned(store.unmap(offset, len as u64)));
        }
    }

    #[test]
    fn out_of_range_io_is_rejected() {
        let (_tmp, store) = new_store(8);
        let mut buf = vec![0; 2 * BS];
        let size = 8 * BLOCK_SIZE;
        for offset in [7 * BLOCK_SIZE, 8 * BLOCK_SIZE, u64::MAX - BLOCK_SIZE + 1] {
            let out = |r: Result<()>| matches!(r, Err(StorageError::OutOfRange { offset: o, size: s, .. }) if o == offset && s == size);
            assert!(out(store.read_at(offset, &mut buf)));
            assert!(out(store.write_at(offset, &buf)));
            assert!(out(store.unmap(offset, 2 * BLOCK_SIZE)));
        }
        assert!(matches!(
            store.unmap(0, u64::MAX - 4095),
            Err(StorageError::OutOfRange { .. })
        ));
        assert_eq!(store.revision(), 0, "failed I/O does not count");
    }

    #[test]
    fn empty_io_is_a_no_op() {
        let (_tmp, store) = new_store(8);
        store.read_at(8 * BLOCK_SIZE, &mut []).unwrap();
        store.write_at(0, &[]).unwrap();
        assert_eq!(block_bytes(&store), [0; 8]);
    }

    #[test]
    fn unmap_without_snapshots_punches_holes() {
        let (_tmp, store) = new_store(8);
        store.write_at(0, &blocks(1, 8)).unwrap();
        store.unmap(2 * BLOCK_SIZE, 3 * BLOCK_SIZE).unwrap();
        assert_eq!(block_bytes(&store), [1, 1, 0, 0, 0, 1, 1, 1]);
        assert_eq!(store.extents_allocated_bytes().unwrap(), 5 * BLOCK_SIZE);
        let store = reopen(store);
        assert_eq!(store.extents_allocated_bytes().unwrap(), 5 * BLOCK_SIZE);
    }

    #[test]
    fn unmap_over_snapshot_data_writes_zeros() {
        let (_tmp, store) = new_store(8);
        store.write_at(0, &blocks(1, 4)).unwrap();
        store.snapshot("s", true, BTreeMap::new()).unwrap();
        store.write_at(4 * BLOCK_SIZE, &blocks(2, 4)).unwrap();
        store.unmap(2 * BLOCK_SIZE, 4 * BLOCK_SIZE).unwrap();
        assert_eq!(block_bytes(&store), [1, 1, 0, 0, 0, 0, 2, 2]);
        let head = store.layer_files().unwrap().pop().unwrap();
        let held: Vec<_> = head.extents.iter().collect();
        assert_eq!(
            held,
            vec![(2, 4), (6, 8)],
            "zeros over the snapshot, holes elsewhere"
        );
        assert_eq!(block_bytes(&reopen(store)), [1, 1, 0, 0, 0, 0, 2, 2]);
    }

    #[test]
    fn revision_counts_writes_and_persists_on_flush() {
        let (_tmp, store) = new_store(8);
        store.write_at(0, &blocks(1, 1)).unwrap();
        store.unmap(0, BLOCK_SIZE).unwrap();
        assert_eq!(store.revision(), 2);
        let store = reopen(store);
        assert_eq!(store.revision(), 0, "not flushed");
        store.write_at(0, &blocks(1, 1)).unwrap();
        store.flush().unwrap();
        assert_eq!(reopen(store).revision(), 1);
    }

    #[test]
    fn dirty_is_set_by_writes_and_cleared_by_close() {
        let (_tmp, store) = new_store(8);
        let path = store.path().to_path_buf();
        let store = reopen(store);
        assert!(!store.dirty(), "opening alone does not dirty");
        store.write_at(0, &blocks(1, 1)).unwrap();
        assert!(store.dirty());
        let store = reopen(store);
        assert!(store.dirty(), "crash without close");
        assert_eq!(store.revision(), 0, "the lost write was never flushed");
        store.write_at(0, &blocks(1, 1)).unwrap();
        store.close().unwrap();
        let store = ReplicaStore::open(&path).unwrap();
        assert!(!store.dirty());
        assert_eq!(store.revision(), 1, "close flushes");
    }

    #[test]
    fn rebuilding_flag_persists() {
        let (_tmp, store) = new_store(8);
        assert!(!store.rebuilding().unwrap());
        store.set_rebuilding(true).unwrap();
        let store = reopen(store);
        assert!(store.rebuilding().unwrap());
        store.set_rebuilding(false).unwrap();
        assert!(!reopen(store).rebuilding().unwrap());
    }

    #[test]
    fn a_replica_opens_only_once() {
        let (_tmp, store) = new_store(8);
        let err = ReplicaStore::open(store.path()).unwrap_err();
        assert!(
            matches!(err, StorageError::Busy { ref path } if path == store.path()),
            "{err}"
        );
    }

    #[test]
    fn corrupt_volume_meta_is_named() {
        let (_tmp, store) = new_store(8);
        let path = store.path().join(VOLUME_META);
        drop(store);
        fs::write(&path, b"{\"size\": garbage").unwrap();
        let err = ReplicaStore::open(path.parent().unwrap()).unwrap_err();
        assert!(
            matches!(err, StorageError::CorruptMetadata { path: ref p, .. } if *p == path),
            "{err}"
        );
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn missing_files_are_named() {
        // A missing intent record is not: it only ever lists what to
        // recompute, so none is recreated empty.
        for name in [
            VOLUME_META,
            "head-1.img",
            "head-1.img.crc",
            "head-1.img.meta",
            REVISION_FILE,
        ] {
            let (_tmp, store) = new_store(8);
            let path = store.path().join(name);
            drop(store);
            fs::remove_file(&path).unwrap();
            let err = ReplicaStore::open(path.parent().unwrap()).unwrap_err();
            assert!(
                matches!(err, StorageError::MissingFile { path: ref p } if *p == path),
                "{name}: {err}"
            );
        }
    }

    #[test]
    fn missing_snapshot_layer_is_an_error() {
        let (_tmp, store) = new_store(8);
        store.snapshot("s", true, BTreeMap::new()).unwrap();
        let path = store.path().join("snap-s.img");
        drop(store);
        fs::remove_file(&path).unwrap();
        let err = ReplicaStore::open(path.parent().unwrap()).unwrap_err();
        assert!(
            matches!(err, StorageError::MissingFile { path: ref p } if *p == path),
            "{err}"
        );
    }

    #[test]
    fn a_parent_cycle_is_corrupt() {
        let (_tmp, store) = new_store(8);
        store.snapshot("a", true, BTreeMap::new()).unwrap();
        let dir = store.path().to_path_buf();
        drop(store);
        let meta_path = dir.join("snap-a.img.meta");
        let meta = fs::read_to_string(&meta_path)
            .unwrap()
            .replace("\"parent\": \"\"", "\"parent\": \"snap-a.img\"");
        fs::write(&meta_path, meta).unwrap();
        let err = ReplicaStore::open(&dir).unwrap_err();
        assert!(
            matches!(err, StorageError::CorruptMetadata { ref path, .. } if *path == meta_path),
            "{err}"
        );
    }

    #[test]
    fn open_removes_debris_and_repairs_the_parent_mirror() {
        let (_tmp, store) = new_store(8);
        store.write_at(0, &blocks(1, 1)).unwrap();
        store.snapshot("a", true, BTreeMap::new()).unwrap();
        let dir = store.path().to_path_buf();
        drop(store);
        for debris in [
            "head-1.img",
            "head-7.img.crc",
            "head-7.img.intent",
            "head-7.img.meta",
            "snap-b.img",
            "volume.meta.tmp",
            "probe.tmp",
        ] {
            fs::write(dir.join(debris), b"x").unwrap();
        }
        fs::write(dir.join("notes.txt"), b"not ours").unwrap();
        let meta = fs::read_to_string(dir.join(VOLUME_META))
            .unwrap()
            .replace("snap-a.img", "");
        fs::write(dir.join(VOLUME_META), meta).unwrap();

        let store = ReplicaStore::open(&dir).unwrap();
        let mut files: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        let expected = [
            "head-2.img",
            "head-2.img.crc",
            "head-2.img.intent",
            "head-2.img.meta",
            "notes.txt",
            "revision.counter",
            "snap-a.img",
            "snap-a.img.crc",
            "snap-a.img.intent",
            "snap-a.img.meta",
            "volume.meta",
        ];
        assert_eq!(files, expected);
        assert_eq!(VolumeMeta::load(&store.dir).unwrap().parent, "snap-a.img");
        assert_eq!(block_bytes(&store)[0], 1);
    }

    #[test]
    fn layer_files_and_allocation() {
        let (_tmp, store) = new_store(16);
        store.write_at(0, &blocks(1, 4)).unwrap();
        store.snapshot("a", true, BTreeMap::new()).unwrap();
        store.write_at(2 * BLOCK_SIZE, &blocks(2, 4)).unwrap();
        let files = store.layer_files().unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].snapshot.as_deref(), Some("a"));
        assert_eq!(files[0].path, store.path().join("snap-a.img"));
        assert_eq!(files[0].extents.iter().collect::<Vec<_>>(), vec![(0, 4)]);
        assert_eq!(files[1].snapshot, None);
        assert_eq!(files[1].extents.iter().collect::<Vec<_>>(), vec![(2, 6)]);
        assert_eq!(store.extents_allocated_bytes().unwrap(), 8 * BLOCK_SIZE);
    }

    /// The block map is O(extents): 256 scattered 64 KiB writes in a 1 TiB
    /// replica are 256 map entries after reopening (a byte-per-block map
    /// would be 256 MiB).
    #[test]
    fn extent_map_grows_with_extents_not_volume_size() {
        const TIB: u64 = 1 << 40;
        let (_tmp, store) = new_store(TIB / BLOCK_SIZE);
        let data = blocks(7, 16);
        for i in 0..256 {
            store.write_at(i * (TIB / 256), &data).unwrap();
        }
        store.flush().unwrap();
        let store = reopen(store);
        let head = store.layer_files().unwrap().pop().unwrap();
        assert_eq!(head.extents.extent_count(), 256);
        assert_eq!(
            store.extents_allocated_bytes().unwrap(),
            256 * 16 * BLOCK_SIZE
        );
        let mut buf = blocks(0, 17);
        store.read_at(TIB / 2 - BLOCK_SIZE, &mut buf).unwrap();
        assert_eq!(buf, [blocks(0, 1), data].concat());
    }

    #[test]
    fn concurrent_writers_and_readers_share_the_store() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ReplicaStore>();
        let (_tmp, store) = new_store(64);
        let store = Arc::new(store);
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for round in 0..50u64 {
                        let block = u64::from(t) * 16 + round % 16;
                        store
                            .write_at(block * BLOCK_SIZE, &blocks(t + 1, 1))
                            .unwrap();
                        let mut buf = blocks(0, 1);
                        store.read_at(block * BLOCK_SIZE, &mut buf).unwrap();
                        assert_eq!(buf, blocks(t + 1, 1));
                        if round == 25 && t == 0 {
                            store.snapshot("mid", true, BTreeMap::new()).unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.revision(), 200);
        let expected: Vec<u8> = (0..64).map(|b| (b / 16) as u8 + 1).collect();
        assert_eq!(block_bytes(&store), expected);
    }
}
