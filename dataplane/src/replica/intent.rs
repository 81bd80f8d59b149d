//! Which of a layer's checksums a crash may have left stale: the regions
//! being written, recorded durably before their data is written.
//!
//! A block's data and its checksum are two writes to two files, made
//! durable together only by a flush. Between flushes the kernel may write
//! back either without the other, and a crash may land between the two
//! writes, so after an unclean stop a block written since the last flush
//! may hold new data under an old checksum, or the reverse. Both are
//! legitimate (the write was never acknowledged as durable), and neither
//! may read as corruption. So before a block is written, its region (256
//! blocks, 1 MiB) is marked open in `<layer>.intent` and the mark made
//! durable; a layer opened after a crash recomputes the checksums of
//! exactly its open regions' blocks, from whatever data they hold, before
//! serving anything. This is dm-integrity's bitmap mode.
//!
//! Opening a region costs an `fdatasync` of the intent file, shared by every
//! write that opens one meanwhile (group commit); writes to open regions
//! cost a mutex and a counter. Closing costs a sync of the checksums, shared
//! by all the regions one flush closes: once a flush has made a region's
//! writes and their checksums durable and it has been idle for
//! [`CLOSE_AFTER`], it is dropped from memory, and its bit is cleared the
//! next time its page of the bitmap is written. A stale bit only costs a
//! recompute. Busy regions stay open across flushes, so a workload that
//! flushes after every write does not pay a second sync for each, and a
//! volume written all over stays open all over (a crash then recomputes all
//! it wrote recently).
//!
//! A layer that takes bulk writes (a rebuild filling it, a snapshot merged
//! into it) is instead marked open whole once, and closed whole after the
//! writer flushed it.
//!
//! File: a 4 KiB header (`OXIB`, then 1 if the whole layer is open), then a
//! bitmap, bit `r % 8` of byte `r / 8` for region `r`. Only the bitmap pages
//! that changed are written. Every write sets bits of regions about to be
//! written and clears only those of closed ones, so a sector torn by a crash
//! during the write holds either state, both safe; a header that cannot be
//! read means the whole layer is recomputed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::dir::ReplicaDir;
use super::error::{Result, StorageError};
use super::naming::intent_file;

/// Blocks per region: 1 MiB.
pub const REGION_BLOCKS: u64 = 256;
/// How long a region stays open after its last write.
pub const CLOSE_AFTER: Duration = Duration::from_secs(10);

const MAGIC: &[u8; 4] = b"OXIB";
const HEADER: u64 = 4096;
/// Regions per bitmap page.
const PAGE_REGIONS: u64 = 4096 * 8;

/// What a crash may have left stale, as found when a layer is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stale {
    /// Nothing: the layer was closed cleanly or is new.
    Nothing,
    /// These regions, ascending.
    Regions(Vec<u64>),
    /// The whole layer: it was taking bulk writes, or the header is torn.
    Whole,
}

/// A layer's open regions and their on-disk bitmap.
#[derive(Debug)]
pub struct Intents {
    path: PathBuf,
    state: Mutex<State>,
    /// Signalled when a write of the bitmap ends.
    written: Condvar,
}

#[derive(Debug)]
struct State {
    file: File,
    whole: bool,
    open: BTreeMap<u64, Region>,
    /// Bitmap pages whose bits changed since they were last written.
    changed: BTreeSet<u64>,
    /// Writes of the bitmap: the next to start, the last to end well.
    next_write: u64,
    written: u64,
    writing: bool,
}

#[derive(Debug)]
struct Region {
    /// The bitmap write that makes its bit durable.
    durable_at: u64,
    in_flight: u32,
    last_write: Instant,
    /// Writes marked so far: tells whether one came while a flush ran.
    writes: u64,
}

/// Regions idle before a flush, with their write counts then.
pub struct Idle(Vec<(u64, u64)>);

impl Idle {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The regions of a write in flight; their counts drop with it.
#[must_use]
pub struct Marked<'a> {
    intents: &'a Intents,
    regions: Option<(u64, u64)>,
}

impl Drop for Marked<'_> {
    fn drop(&mut self) {
        let Some((first, last)) = self.regions else {
            return;
        };
        let mut state = self.intents.state();
        for region in state.open.range_mut(first..=last) {
            region.1.in_flight -= 1;
        }
    }
}

fn decode(bytes: &[u8]) -> Stale {
    if bytes.is_empty() {
        // Created, but nothing recorded before the stop.
        return Stale::Nothing;
    }
    if bytes.len() < 5 || &bytes[..4] != MAGIC || bytes[4] > 1 {
        return Stale::Whole;
    }
    if bytes[4] == 1 {
        return Stale::Whole;
    }
    let bitmap = bytes.get(HEADER as usize..).unwrap_or_default();
    let regions: Vec<u64> = bitmap
        .iter()
        .enumerate()
        .flat_map(|(i, &byte)| {
            (0..8)
                .filter(move |bit| byte & (1 << bit) != 0)
                .map(move |bit| i as u64 * 8 + bit)
        })
        .collect();
    match regions.is_empty() {
        true => Stale::Nothing,
        false => Stale::Regions(regions),
    }
}

impl Intents {
    /// Opens the intent file of layer `layer_file`, creating an empty one
    /// if there is none, and says what it leaves stale. The caller
    /// recomputes that, then calls [`Intents::clear`].
    pub fn load(dir: &ReplicaDir, layer_file: &str) -> Result<(Self, Stale)> {
        let path = dir.join(&intent_file(layer_file));
        let stale = match std::fs::read(&path) {
            Ok(bytes) => decode(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Stale::Nothing,
            Err(e) => return Err(StorageError::io(&path, e)),
        };
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StorageError::io(&path, e))?;
        if !existed {
            dir.sync()?;
        }
        let state = State {
            file,
            whole: false,
            open: BTreeMap::new(),
            changed: BTreeSet::new(),
            next_write: 1,
            written: 0,
            writing: false,
        };
        let intents = Self {
            path,
            state: Mutex::new(state),
            written: Condvar::new(),
        };
        Ok((intents, stale))
    }

    /// An empty intent file for a new layer, replacing any left over.
    pub fn create(dir: &ReplicaDir, layer_file: &str) -> Result<Self> {
        dir.remove_if_exists(&intent_file(layer_file))?;
        Ok(Self::load(dir, layer_file)?.0)
    }

    /// The path after the layer was linked under a new name.
    pub fn rename(&mut self, dir: &ReplicaDir, layer_file: &str) {
        self.path = dir.join(&intent_file(layer_file));
    }

    /// The state is counters and sets, consistent after every statement,
    /// so a panic elsewhere while it was held leaves nothing half done.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn io(&self, e: std::io::Error) -> StorageError {
        StorageError::io(&self.path, e)
    }

    /// Writes the header and the changed bitmap pages, as `state` has them,
    /// and syncs them, without the lock: writers of open regions go on.
    /// Whoever comes meanwhile waits for this write, then may start the
    /// next, which carries all they opened (group commit).
    fn write<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        let generation = state.next_write;
        state.next_write += 1;
        state.writing = true;
        let whole = state.whole;
        let changed = std::mem::take(&mut state.changed);
        let pages = pages(&state.open, changed);
        let file = state.file.try_clone();
        drop(state);
        let result = file
            .map_err(|e| self.io(e))
            .and_then(|file| self.write_file(&file, whole, &pages));
        let mut state = self.state();
        state.writing = false;
        match &result {
            Ok(()) => state.written = state.written.max(generation),
            // Written again with the next write.
            Err(_) => state.changed.extend(pages.iter().map(|(page, _)| *page)),
        }
        self.written.notify_all();
        (state, result)
    }

    /// Records blocks `[start, end)` as being written, durably if their
    /// regions were not open yet, until the returned guard drops.
    pub fn mark(&self, start: u64, end: u64) -> Result<Marked<'_>> {
        let mut state = self.state();
        if state.whole || start >= end {
            return Ok(Marked {
                intents: self,
                regions: None,
            });
        }
        let (first, last) = (start / REGION_BLOCKS, (end - 1) / REGION_BLOCKS);
        let now = Instant::now();
        for r in first..=last {
            if !state.open.contains_key(&r) {
                let durable_at = state.next_write;
                state.open.insert(
                    r,
                    Region {
                        durable_at,
                        in_flight: 0,
                        last_write: now,
                        writes: 0,
                    },
                );
                state.changed.insert(r / PAGE_REGIONS);
            }
        }
        loop {
            let needed = state
                .open
                .range(first..=last)
                .map(|(_, region)| region.durable_at)
                .max()
                .unwrap_or(0);
            if needed <= state.written {
                break;
            }
            if state.writing {
                state = self
                    .written
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // This write carries every region opened so far, the ones a
            // failed write left too.
            let (after, result) = self.write(state);
            state = after;
            result?;
        }
        for (_, region) in state.open.range_mut(first..=last) {
            region.in_flight += 1;
            region.last_write = now;
            region.writes += 1;
        }
        Ok(Marked {
            intents: self,
            regions: Some((first, last)),
        })
    }

    /// Before a flush: the regions with nothing in flight and no write for
    /// [`CLOSE_AFTER`]. A region whose bit is not yet durable is not idle:
    /// a write is waiting for it in [`Self::mark`], not yet counted.
    pub fn idle(&self) -> Idle {
        let state = self.state();
        let now = Instant::now();
        Idle(
            state
                .open
                .iter()
                .filter(|(_, region)| {
                    region.in_flight == 0
                        && region.durable_at <= state.written
                        && now.duration_since(region.last_write) >= CLOSE_AFTER
                })
                .map(|(&r, region)| (r, region.writes))
                .collect(),
        )
    }

    /// After that flush: closes those of `idle` that took no write since.
    /// Their bits go with the next write of their pages.
    pub fn close(&self, idle: Idle) {
        let mut state = self.state();
        for (r, writes) in idle.0 {
            if state
                .open
                .get(&r)
                .is_some_and(|region| region.writes == writes)
            {
                state.open.remove(&r);
                state.changed.insert(r / PAGE_REGIONS);
            }
        }
    }

    /// Marks the whole layer open for bulk writes, durably.
    pub fn open_whole(&self) -> Result<()> {
        let mut state = self.state();
        if state.whole {
            return Ok(());
        }
        state.whole = true;
        self.write_file(&state.file, true, &[])
    }

    /// Closes everything, durably: the layer was just flushed with no write
    /// in flight (or its stale checksums were just recomputed).
    pub fn clear(&self) -> Result<()> {
        let mut state = self.state();
        while state.writing {
            state = self
                .written
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.whole = false;
        state.open.retain(|_, region| region.in_flight > 0);
        state.changed.clear();
        state.file.set_len(0).map_err(|e| self.io(e))?;
        // Invariant: nothing is left open for the callers, who flushed with
        // no write in flight; what were is kept open, on disk too.
        let left: BTreeSet<u64> = state.open.keys().map(|r| r / PAGE_REGIONS).collect();
        if left.is_empty() {
            return state.file.sync_data().map_err(|e| self.io(e));
        }
        self.write_file(&state.file, false, &pages(&state.open, left))
    }

    /// Writes the header (with the whole-layer flag `whole`) and `pages`
    /// of the bitmap into `file`, and syncs them.
    fn write_file(&self, file: &File, whole: bool, pages: &[(u64, Vec<u8>)]) -> Result<()> {
        let header = [&MAGIC[..], &[u8::from(whole)]].concat();
        file.write_all_at(&header, 0).map_err(|e| self.io(e))?;
        for (page, bytes) in pages {
            file.write_all_at(bytes, HEADER + page * 4096)
                .map_err(|e| self.io(e))?;
        }
        file.sync_data().map_err(|e| self.io(e))
    }

    #[cfg(test)]
    pub fn open_regions(&self) -> usize {
        self.state().open.len()
    }
}

/// Bitmap pages `numbers` as `open` has them, with their numbers.
fn pages(open: &BTreeMap<u64, Region>, numbers: BTreeSet<u64>) -> Vec<(u64, Vec<u8>)> {
    numbers
        .into_iter()
        .map(|page| (page, page_bytes(open, page)))
        .collect()
}

/// Bitmap page `page` as `open` has it.
fn page_bytes(open: &BTreeMap<u64, Region>, page: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; 4096];
    let first = page * PAGE_REGIONS;
    for (&r, _) in open.range(first..first + PAGE_REGIONS) {
        let bit = r - first;
        bytes[(bit / 8) as usize] |= 1 << (bit % 8);
    }
    bytes
}

/// What a crash now would leave stale, read from the file (for tests).
#[cfg(test)]
fn on_disk(path: &std::path::Path) -> Stale {
    decode(&std::fs::read(path).unwrap())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn load(dir: &ReplicaDir) -> (Intents, Stale) {
        Intents::load(dir, "head-1.img").unwrap()
    }

    #[test]
    fn open_regions_are_durable_before_the_write_and_found_after_a_crash() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let (intents, stale) = load(&dir);
        assert_eq!(stale, Stale::Nothing);
        let a = intents.mark(10, 20).unwrap();
        // A write across a region boundary opens both; one far away lands
        // on another page of the bitmap.
        let b = intents
            .mark(REGION_BLOCKS * 3 - 1, REGION_BLOCKS * 3 + 1)
            .unwrap();
        let far = PAGE_REGIONS * 2 + 5;
        let c = intents
            .mark(far * REGION_BLOCKS, far * REGION_BLOCKS + 1)
            .unwrap();
        // Read while the writes are in flight: the crash case.
        let path = dir.join("head-1.img.intent");
        assert_eq!(on_disk(&path), Stale::Regions(vec![0, 2, 3, far]));
        drop((a, b, c));
        intents.clear().unwrap();
        assert_eq!(on_disk(&path), Stale::Nothing);
        assert_eq!(load(&dir).1, Stale::Nothing);
    }

    #[test]
    fn a_busy_region_stays_open_across_flushes_and_an_idle_one_closes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let (intents, _) = load(&dir);
        drop(intents.mark(0, 1).unwrap());
        drop(intents.mark(REGION_BLOCKS, REGION_BLOCKS + 1).unwrap());
        // Written just now: not idle yet.
        let idle = intents.idle();
        assert!(idle.0.is_empty());
        intents.close(idle);
        assert_eq!(intents.open_regions(), 2);
        // Age region 0 only; a write in flight keeps region 1 open anyway.
        intents.state().open.get_mut(&0).unwrap().last_write -= CLOSE_AFTER;
        let in_flight = intents.mark(REGION_BLOCKS, REGION_BLOCKS + 1).unwrap();
        intents.state().open.get_mut(&1).unwrap().last_write -= CLOSE_AFTER;
        let idle = intents.idle();
        assert_eq!(idle.0.len(), 1);
        intents.close(idle);
        assert_eq!(intents.open_regions(), 1);
        drop(in_flight);
        // A write during the flush keeps its region open.
        intents.state().open.get_mut(&1).unwrap().last_write -= CLOSE_AFTER;
        let idle = intents.idle();
        drop(intents.mark(REGION_BLOCKS, REGION_BLOCKS + 1).unwrap());
        intents.close(idle);
        assert_eq!(intents.open_regions(), 1);
        // A closed region's bit goes with the next write of its page.
        drop(
            intents
                .mark(5 * REGION_BLOCKS, 5 * REGION_BLOCKS + 1)
                .unwrap(),
        );
        let path = dir.join("head-1.img.intent");
        assert_eq!(on_disk(&path), Stale::Regions(vec![1, 5]));
    }

    /// Writers opening regions at once share bitmap writes, and each finds
    /// its region durable when its mark returns.
    #[test]
    fn concurrent_opens_are_each_durable_when_marked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let intents = Arc::new(load(&dir).0);
        let path = dir.join("head-1.img.intent");
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (intents, path) = (intents.clone(), path.clone());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let r = t * 1000 + i;
                        let marked = intents
                            .mark(r * REGION_BLOCKS, r * REGION_BLOCKS + 1)
                            .unwrap();
                        let Stale::Regions(on) = on_disk(&path) else {
                            panic!("nothing on disk for region {r}");
                        };
                        assert!(on.contains(&r), "region {r} not durable when marked");
                        drop(marked);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(intents.open_regions(), 400);
    }

    #[test]
    fn bulk_writes_open_the_whole_layer_and_a_torn_header_means_the_whole_layer() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let (intents, _) = load(&dir);
        intents.open_whole().unwrap();
        drop(intents.mark(5, 6).unwrap());
        assert_eq!(load(&dir).1, Stale::Whole);
        intents.clear().unwrap();
        drop(intents.mark(5, 6).unwrap());
        assert_eq!(load(&dir).1, Stale::Regions(vec![0]));
        let path = dir.join("head-1.img.intent");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[1] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(&dir).1, Stale::Whole);
        std::fs::write(&path, b"OX").unwrap();
        assert_eq!(load(&dir).1, Stale::Whole);
    }
}
