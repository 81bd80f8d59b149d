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
//! blocks, 1 MiB) is recorded as open in `<layer>.intent` and that record
//! made durable; a layer opened after a crash recomputes the checksums of
//! exactly its open regions' blocks, from whatever data they hold, before
//! serving anything. This is dm-integrity's bitmap mode.
//!
//! Opening a region costs one `fdatasync` of the small intent file; closing
//! one costs nothing: once a flush has made a region's writes durable and
//! it has been idle for [`CLOSE_AFTER`], it is dropped from memory, and the
//! next record written leaves it out. A stale "open" on disk only costs a
//! recompute. Busy regions therefore stay open across flushes, so a
//! workload that flushes after every write does not pay a second sync for
//! each. At most [`MAX_OPEN`] regions are open (1 GiB to recompute at
//! worst): opening one more first flushes the layer and closes the idle ones.
//!
//! A layer that takes bulk writes (a rebuild filling it, a snapshot merged
//! into it) is instead opened whole once, and closed whole after the writer
//! flushed it.
//!
//! Record: `OXIN`, a u32 count, that many u64 regions (`u64::MAX`: the whole
//! layer), then the CRC-32C of all of it; little-endian. A torn or otherwise
//! unreadable record means the whole layer is recomputed.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::dir::ReplicaDir;
use super::error::{Result, StorageError};
use super::naming::intent_file;

/// Blocks per region: 1 MiB.
pub const REGION_BLOCKS: u64 = 256;
/// Regions open at once, at most (soft: regions with writes in flight are
/// never closed early).
pub const MAX_OPEN: usize = 1024;
/// How long a region stays open after its last write.
pub const CLOSE_AFTER: Duration = Duration::from_secs(10);

const MAGIC: &[u8; 4] = b"OXIN";
const WHOLE: u64 = u64::MAX;

/// What a crash may have left stale, as found when a layer is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stale {
    /// Nothing: the layer was closed cleanly or is new.
    Nothing,
    /// These regions.
    Regions(Vec<u64>),
    /// The whole layer: it was taking bulk writes, or the record is torn.
    Whole,
}

/// A layer's open regions and their on-disk record.
#[derive(Debug)]
pub struct Intents {
    path: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    file: File,
    whole: bool,
    open: HashMap<u64, Region>,
}

#[derive(Debug)]
struct Region {
    in_flight: u32,
    last_write: Instant,
    /// Writes marked so far: tells whether one came while a flush ran.
    writes: u64,
}

/// Regions idle before a flush, with their write counts then.
pub struct Idle(Vec<(u64, u64)>);

/// The regions of a write in flight; their count drops with it.
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
        for r in first..=last {
            if let Some(region) = state.open.get_mut(&r) {
                region.in_flight -= 1;
            }
        }
    }
}

fn encode(whole: bool, open: impl Iterator<Item = u64>) -> Vec<u8> {
    let regions: Vec<u64> = if whole { vec![WHOLE] } else { open.collect() };
    let mut bytes = MAGIC.to_vec();
    let count = u32::try_from(regions.len()).unwrap_or(u32::MAX);
    bytes.extend(count.to_le_bytes());
    for r in regions {
        bytes.extend(r.to_le_bytes());
    }
    let crc = crc32c::crc32c(&bytes);
    bytes.extend(crc.to_le_bytes());
    bytes
}

fn decode(bytes: &[u8]) -> Stale {
    let parse = || -> Option<Vec<u64>> {
        let count = usize::try_from(u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?)).ok()?;
        let end = count.checked_mul(8)?.checked_add(8)?;
        let body = bytes.get(..end)?;
        let crc = u32::from_le_bytes(bytes.get(end..end + 4)?.try_into().ok()?);
        if &body[..4] != MAGIC || crc32c::crc32c(body) != crc {
            return None;
        }
        Some(
            body[8..]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        )
    };
    match parse() {
        Some(regions) if regions.is_empty() => Stale::Nothing,
        Some(regions) if !regions.contains(&WHOLE) => Stale::Regions(regions),
        _ => Stale::Whole,
    }
}

impl Intents {
    /// Opens the record of layer `layer_file`, creating an empty one if
    /// there is none, and says what it leaves stale. The caller recomputes
    /// that, then calls [`Intents::clear`].
    pub fn load(dir: &ReplicaDir, layer_file: &str) -> Result<(Self, Stale)> {
        let path = dir.join(&intent_file(layer_file));
        let stale = match std::fs::read(&path) {
            // Created, but nothing recorded before the stop.
            Ok(bytes) if bytes.is_empty() => Stale::Nothing,
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
            open: HashMap::new(),
        };
        Ok((
            Self {
                path,
                state: Mutex::new(state),
            },
            stale,
        ))
    }

    /// An empty record for a new layer, replacing any left over.
    pub fn create(dir: &ReplicaDir, layer_file: &str) -> Result<Self> {
        dir.remove_if_exists(&intent_file(layer_file))?;
        Ok(Self::load(dir, layer_file)?.0)
    }

    /// The path after the layer was linked under a new name.
    pub fn rename(&mut self, dir: &ReplicaDir, layer_file: &str) {
        self.path = dir.join(&intent_file(layer_file));
    }

    /// The state is a set of counters, consistent after every statement, so
    /// a panic elsewhere while it was held leaves nothing half done.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn persist(&self, state: &State) -> Result<()> {
        let bytes = encode(state.whole, state.open.keys().copied());
        let io = |e| StorageError::io(&self.path, e);
        state.file.write_all_at(&bytes, 0).map_err(io)?;
        state.file.sync_data().map_err(io)
    }

    /// Records blocks `[start, end)` as being written, durably if their
    /// regions were not open yet, until the returned guard drops. `flush`
    /// makes the layer's completed writes durable; it runs when too many
    /// regions are open.
    pub fn mark(
        &self,
        start: u64,
        end: u64,
        flush: impl FnOnce() -> Result<()>,
    ) -> Result<Marked<'_>> {
        let mut state = self.state();
        if state.whole || start >= end {
            return Ok(Marked {
                intents: self,
                regions: None,
            });
        }
        let (first, last) = (start / REGION_BLOCKS, (end - 1) / REGION_BLOCKS);
        let new = (first..=last)
            .filter(|r| !state.open.contains_key(r))
            .count();
        if new > 0 {
            if state.open.len() + new > MAX_OPEN {
                // Whatever has no write in flight now had its writes
                // complete before this flush, so the flush covers them.
                flush()?;
                state.open.retain(|_, region| region.in_flight > 0);
            }
            let now = Instant::now();
            for r in first..=last {
                state.open.entry(r).or_insert(Region {
                    in_flight: 0,
                    last_write: now,
                    writes: 0,
                });
            }
            self.persist(&state)?;
        }
        let now = Instant::now();
        for r in first..=last {
            if let Some(region) = state.open.get_mut(&r) {
                region.in_flight += 1;
                region.last_write = now;
                region.writes += 1;
            }
        }
        Ok(Marked {
            intents: self,
            regions: Some((first, last)),
        })
    }

    /// Before a flush: the regions with nothing in flight and no write for
    /// [`CLOSE_AFTER`].
    pub fn idle(&self) -> Idle {
        let state = self.state();
        let now = Instant::now();
        Idle(
            state
                .open
                .iter()
                .filter(|(_, region)| {
                    region.in_flight == 0 && now.duration_since(region.last_write) >= CLOSE_AFTER
                })
                .map(|(&r, region)| (r, region.writes))
                .collect(),
        )
    }

    /// After that flush: closes those of `idle` that took no write since.
    pub fn close(&self, idle: Idle) {
        let mut state = self.state();
        for (r, writes) in idle.0 {
            if state
                .open
                .get(&r)
                .is_some_and(|region| region.writes == writes)
            {
                state.open.remove(&r);
            }
        }
    }

    /// Opens the whole layer for bulk writes, durably.
    pub fn open_whole(&self) -> Result<()> {
        let mut state = self.state();
        if !state.whole {
            state.whole = true;
            self.persist(&state)?;
        }
        Ok(())
    }

    /// Closes everything, durably: the layer was just flushed with no write
    /// in flight (or its stale checksums were just recomputed).
    pub fn clear(&self) -> Result<()> {
        let mut state = self.state();
        state.whole = false;
        state.open.retain(|_, region| region.in_flight > 0);
        self.persist(&state)
    }

    #[cfg(test)]
    pub fn open_regions(&self) -> usize {
        self.state().open.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn load(dir: &ReplicaDir) -> (Intents, Stale) {
        Intents::load(dir, "head-1.img").unwrap()
    }

    fn regions(stale: Stale) -> Vec<u64> {
        match stale {
            Stale::Regions(mut r) => {
                r.sort_unstable();
                r
            }
            other => panic!("expected regions, got {other:?}"),
        }
    }

    #[test]
    fn open_regions_are_durable_before_the_write_and_found_after_a_crash() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let (intents, stale) = load(&dir);
        assert_eq!(stale, Stale::Nothing);
        let never = || panic!("no flush needed");
        let a = intents.mark(10, 20, never).unwrap();
        // A write across a region boundary opens both.
        let b = intents
            .mark(REGION_BLOCKS * 3 - 1, REGION_BLOCKS * 3 + 1, never)
            .unwrap();
        // Read while the writes are in flight: the crash case.
        let (_, stale) = Intents::load(&dir, "head-1.img").unwrap();
        assert_eq!(regions(stale), [0, 2, 3]);
        drop((a, b));
        intents.clear().unwrap();
        assert_eq!(load(&dir).1, Stale::Nothing);
    }

    #[test]
    fn a_busy_region_stays_open_across_flushes_and_an_idle_one_closes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let (intents, _) = load(&dir);
        drop(intents.mark(0, 1, || Ok(())).unwrap());
        drop(
            intents
                .mark(REGION_BLOCKS, REGION_BLOCKS + 1, || Ok(()))
                .unwrap(),
        );
        // Written just now: not idle yet.
        let idle = intents.idle();
        assert!(idle.0.is_empty());
        intents.close(idle);
        assert_eq!(intents.open_regions(), 2);
        // Age region 0 only; a write in flight keeps region 1 open anyway.
        intents.state().open.get_mut(&0).unwrap().last_write -= CLOSE_AFTER;
        let in_flight = intents
            .mark(REGION_BLOCKS, REGION_BLOCKS + 1, || Ok(()))
            .unwrap();
        intents.state().open.get_mut(&1).unwrap().last_write -= CLOSE_AFTER;
        let idle = intents.idle();
        assert_eq!(idle.0.len(), 1);
        intents.close(idle);
        assert_eq!(intents.open_regions(), 1);
        drop(in_flight);
        // A write during the flush keeps its region open.
        intents.state().open.get_mut(&1).unwrap().last_write -= CLOSE_AFTER;
        let idle = intents.idle();
        drop(
            intents
                .mark(REGION_BLOCKS, REGION_BLOCKS + 1, || Ok(()))
                .unwrap(),
        );
        intents.close(idle);
        assert_eq!(intents.open_regions(), 1);
    }

    #[test]
    fn past_the_limit_the_layer_is_flushed_and_idle_regions_close() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let (intents, _) = load(&dir);
        let held = intents.mark(0, 1, || Ok(())).unwrap();
        for r in 1..MAX_OPEN as u64 {
            drop(
                intents
                    .mark(r * REGION_BLOCKS, r * REGION_BLOCKS + 1, || Ok(()))
                    .unwrap(),
            );
        }
        assert_eq!(intents.open_regions(), MAX_OPEN);
        let flushed = Cell::new(false);
        let far = MAX_OPEN as u64 * REGION_BLOCKS;
        drop(
            intents
                .mark(far, far + 1, || {
                    flushed.set(true);
                    Ok(())
                })
                .unwrap(),
        );
        assert!(flushed.get());
        assert_eq!(
            intents.open_regions(),
            2,
            "region 0, in flight, and the new one"
        );
        drop(held);
        assert_eq!(regions(load(&dir).1), [0, MAX_OPEN as u64]);
    }

    #[test]
    fn bulk_writes_open_the_whole_layer_and_a_torn_record_means_the_whole_layer() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let (intents, _) = load(&dir);
        intents.open_whole().unwrap();
        drop(intents.mark(5, 6, || Ok(())).unwrap());
        assert_eq!(load(&dir).1, Stale::Whole);
        intents.clear().unwrap();
        drop(intents.mark(5, 6, || Ok(())).unwrap());
        let path = dir.join("head-1.img.intent");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(&dir).1, Stale::Whole);
        std::fs::write(&path, b"OX").unwrap();
        assert_eq!(load(&dir).1, Stale::Whole);
    }
}
