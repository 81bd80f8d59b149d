//! One layer: a sparse data file, its metadata, the set of blocks written
//! in it, and their checksums (`checksum.rs`, kept trustworthy across
//! crashes by `intent.rs`). Every block read from the file is checked
//! against its checksum: a mismatch is reported, never served.
//!
//! # Which blocks a layer holds
//!
//! A block present in a layer shadows every older layer, so the extent set
//! must be exact: a block reported present but never written would read as
//! zeros over older data. The set is kept in memory as writes land and is
//! rebuilt at open from the file's allocation, via `SEEK_DATA`/`SEEK_HOLE`.
//! That relies on the filesystem reporting allocation at 4 KiB granularity
//! and on `FALLOC_FL_PUNCH_HOLE` deallocating whole 4 KiB blocks. ext4 and
//! xfs with 4 KiB blocks and tmpfs (4 KiB pages) do; filesystems that
//! allocate in larger units (64 KiB-block ext4, compressed btrfs) do not.
//! [`probe_filesystem`] checks this on every create and open and refuses
//! filesystems that fail, rather than serve wrong data. Holes are punched
//! only by unmap, and only where no older layer holds the block, so even a
//! filesystem that ignored a punch would still read correctly.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, PosixFadviseAdvice, fallocate, posix_fadvise};
use nix::unistd::{Whence, lseek};

use super::BLOCK_SIZE;
use super::checksum::{Checksums, read_or_zeros};
use super::dir::ReplicaDir;
use super::error::{Result, StorageError};
use super::extents::ExtentSet;
use super::intent::{Intents, REGION_BLOCKS, Stale};
use super::lock;
use super::meta::LayerMeta;
use super::naming::PROBE_FILE;

/// Writes reach the page cache in pieces of at most this many bytes. The
/// kernel sizes a new page-cache folio by the write that creates it, and
/// every later write into a folio walks all of its block buffers: with the
/// 1 MiB folios of large writes, ext4 spent more CPU on that walk than the
/// rest of the data path together once writeback ran beside random 4 KiB
/// writes (bench/README.md, 2026-11-24).
const WRITE_PIECE: usize = 64 << 10;

/// Largest buffer used to copy or zero data: bounds memory per operation.
const CHUNK_BLOCKS: u64 = 256;

#[derive(Debug)]
pub struct Layer {
    /// File name inside the replica directory.
    pub file_name: String,
    pub path: PathBuf,
    pub meta: LayerMeta,
    file: File,
    /// Blocks written in this layer. Only the head's changes during normal
    /// I/O; those happen under the store's read lock, hence this lock.
    extents: RwLock<ExtentSet>,
    checksums: Checksums,
    intents: Intents,
}

/// Converts a byte offset to the kernel's `off_t`. Volume sizes are checked
/// to be at most `i64::MAX` (see `check_size`), so saturation never happens.
fn off_t(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Byte range of blocks `[start, end)` within a buffer that begins at block
/// `base`.
pub fn buf_range(base: u64, start: u64, end: u64) -> std::ops::Range<usize> {
    let to_usize =
        |blocks: u64| usize::try_from((blocks - base) * BLOCK_SIZE).unwrap_or(usize::MAX);
    to_usize(start)..to_usize(end)
}

/// Opens a layer file without readahead: the volume's own filesystem reads
/// ahead already, and readahead would fill the page cache with the large
/// folios [`WRITE_PIECE`] keeps out.
fn open_rw(path: &Path, create: bool) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .open(path)
        .map_err(|e| StorageError::io(path, e))?;
    posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_RANDOM)
        .map_err(|e| StorageError::io(path, e.into()))?;
    Ok(file)
}

impl Layer {
    /// Creates an empty (all-hole) layer of `size` bytes and its metadata.
    /// An unreferenced file of the same name is debris of a failed attempt
    /// and is replaced.
    pub fn create(dir: &ReplicaDir, size: u64, meta: LayerMeta) -> Result<Self> {
        let file_name = meta.name.clone();
        let path = dir.join(&file_name);
        dir.remove_if_exists(&file_name)?;
        let file = open_rw(&path, true)?;
        let io = |e| StorageError::io(&path, e);
        file.set_len(size).map_err(io)?;
        file.sync_all().map_err(io)?;
        let checksums = Checksums::create(dir, &file_name)?;
        let intents = Intents::create(dir, &file_name)?;
        // Also makes the files above durable: it syncs the directory.
        meta.save(dir)?;
        Ok(Self {
            file_name,
            path,
            meta,
            file,
            extents: RwLock::new(ExtentSet::new()),
            checksums,
            intents,
        })
    }

    /// Opens an existing layer of a volume of `size` bytes, first
    /// recomputing the checksums an unclean stop may have left stale (and
    /// all of them for a layer written before checksums existed).
    pub fn open(dir: &ReplicaDir, file_name: &str, size: u64) -> Result<Self> {
        let mut meta = LayerMeta::load(dir, file_name)?;
        let path = dir.join(file_name);
        let file = open_rw(&path, false)?;
        let len = file
            .metadata()
            .map_err(|e| StorageError::io(&path, e))?
            .len();
        let adopting = !meta.checksums;
        if len < size && adopting {
            let reason = format!("layer file is {len} bytes, shorter than the {size}-byte volume");
            return Err(StorageError::corrupt(&path, reason));
        }
        let checksums = if adopting {
            Checksums::create(dir, file_name)?
        } else {
            Checksums::open(dir, file_name)?
        };
        // Cut now, or cut before and not yet restored when a crash came.
        let cut = meta.cut_at.or((len < size).then_some(len));
        let lost = match cut {
            Some(cut) => {
                if meta.cut_at.is_none() {
                    meta.cut_at = Some(cut);
                    meta.save(dir)?;
                }
                restore_length(&file, &path, &checksums, cut, size)?
            }
            None => ExtentSet::new(),
        };
        let extents = scan_extents(&file, &path, size)?;
        let (intents, stale) = Intents::load(dir, file_name)?;
        let mut layer = Self {
            file_name: file_name.to_string(),
            path,
            meta,
            file,
            extents: RwLock::new(extents),
            checksums,
            intents,
        };
        let stale = if adopting { Stale::Whole } else { stale };
        if stale != Stale::Nothing {
            layer.recompute(&stale, &lost)?;
        }
        if adopting || cut.is_some() {
            layer.meta.checksums = true;
            layer.meta.cut_at = None;
            layer.meta.save(dir)?;
        }
        Ok(layer)
    }

    /// Recomputes the checksums of the blocks `stale` covers from the data
    /// they hold, but for those `lost`, durably, then closes every region.
    fn recompute(&self, stale: &Stale, lost: &ExtentSet) -> Result<()> {
        let mut held = self.extents()?;
        for (start, end) in lost.iter() {
            held.remove(start, end);
        }
        let runs: Vec<(u64, u64)> = match stale {
            Stale::Nothing => Vec::new(),
            Stale::Whole => held.iter().collect(),
            Stale::Regions(regions) => regions
                .iter()
                .flat_map(|r| {
                    let start = r.saturating_mul(REGION_BLOCKS);
                    let end = r.saturating_add(1).saturating_mul(REGION_BLOCKS);
                    held.overlapping(start, end).collect::<Vec<_>>()
                })
                .collect(),
        };
        let mut buf = vec![0u8; buf_range(0, 0, CHUNK_BLOCKS).end];
        let mut blocks = 0;
        for (start, end) in runs {
            for (s, e) in chunks(start, end) {
                let chunk = &mut buf[buf_range(s, s, e)];
                read_or_zeros(&self.file, &self.path, s * BLOCK_SIZE, chunk)?;
                self.checksums.store(s, chunk)?;
                blocks += e - s;
            }
        }
        // The data the sums were computed from may be a crashed process's
        // writes, still in the page cache: durable before the sums are.
        self.sync_file()?;
        self.checksums.sync()?;
        self.intents.clear()?;
        tracing::info!(layer = %self.path.display(), ?stale, blocks, "recomputed the checksums a stop left unsure");
        Ok(())
    }

    /// Renames the in-memory layer after its file was linked under a new
    /// name (the head becoming a snapshot); the open file is unaffected.
    pub fn rename(&mut self, dir: &ReplicaDir, meta: LayerMeta) {
        self.file_name.clone_from(&meta.name);
        self.path = dir.join(&self.file_name);
        self.checksums.rename(dir, &self.file_name);
        self.intents.rename(dir, &self.file_name);
        self.meta = meta;
    }

    pub fn extents(&self) -> Result<ExtentSet> {
        Ok(lock::read(&self.extents)?.clone())
    }

    /// Adds the blocks of `[start, end)` this layer holds to `out`.
    pub fn add_held(&self, start: u64, end: u64, out: &mut ExtentSet) -> Result<()> {
        for (s, e) in lock::read(&self.extents)?.overlapping(start, end) {
            out.insert(s, e);
        }
        Ok(())
    }

    pub fn allocated_bytes(&self) -> Result<u64> {
        Ok(lock::read(&self.extents)?.block_count() * BLOCK_SIZE)
    }

    /// Reads the blocks of `pending` this layer holds into `buf` (which
    /// starts at block `base`), one pread per contiguous run, and returns the
    /// runs it does not hold, for older layers to fill. Any block that does
    /// not match its checksum fails the read with
    /// [`StorageError::ChecksumMismatch`].
    pub fn read_present(
        &self,
        pending: &[(u64, u64)],
        base: u64,
        buf: &mut [u8],
    ) -> Result<Vec<(u64, u64)>> {
        let mut bad = ExtentSet::new();
        let missing = self.read_checked(pending, base, buf, &mut bad)?;
        if !bad.is_empty() {
            return Err(StorageError::ChecksumMismatch {
                path: self.path.clone(),
                blocks: bad.iter().collect(),
            });
        }
        Ok(missing)
    }

    /// [`Self::read_present`], adding the blocks that fail their checksum
    /// to `bad` rather than failing.
    pub fn read_checked(
        &self,
        pending: &[(u64, u64)],
        base: u64,
        buf: &mut [u8],
        bad: &mut ExtentSet,
    ) -> Result<Vec<(u64, u64)>> {
        let (present, missing) = {
            let extents = lock::read(&self.extents)?;
            let mut present = Vec::new();
            let mut missing = Vec::new();
            for &(start, end) in pending {
                present.extend(extents.overlapping(start, end));
                missing.extend(extents.gaps(start, end));
            }
            (present, missing)
        };
        for (start, end) in present {
            let chunk = &mut buf[buf_range(base, start, end)];
            self.read_blocks(start, chunk)?;
            self.checksums.verify(start, chunk, bad)?;
        }
        Ok(missing)
    }

    /// Reads whole blocks; those past the end of a truncated file read as
    /// zeros, for the checksums to catch.
    fn read_blocks(&self, start: u64, buf: &mut [u8]) -> Result<()> {
        read_or_zeros(&self.file, &self.path, start * BLOCK_SIZE, buf)
    }

    /// Writes whole blocks at block `start`, with their checksums, and
    /// records them. Their region is recorded as open first (`intent.rs`).
    /// The extent is recorded after the data is written, so a concurrent
    /// reader never resolves a block here before it holds the new data.
    pub fn write_blocks(&self, start: u64, data: &[u8]) -> Result<()> {
        let end = start + data.len() as u64 / BLOCK_SIZE;
        let _open = self.intents.mark(start, end)?;
        self.checksums.store(start, data)?;
        let mut at = start * BLOCK_SIZE;
        for piece in data.chunks(WRITE_PIECE) {
            self.file
                .write_all_at(piece, at)
                .map_err(|e| StorageError::io(&self.path, e))?;
            at += piece.len() as u64;
        }
        lock::write(&self.extents)?.insert(start, end);
        Ok(())
    }

    /// Writes zeros over blocks `[start, end)`: an unmap that must still
    /// shadow older layers.
    pub fn write_zeros(&self, start: u64, end: u64) -> Result<()> {
        let zeros = vec![0u8; buf_range(0, 0, CHUNK_BLOCKS.min(end - start)).end];
        for (s, e) in chunks(start, end) {
            self.write_blocks(s, &zeros[buf_range(s, s, e)])?;
        }
        Ok(())
    }

    /// Deallocates blocks `[start, end)`. They are forgotten first, so a
    /// concurrent reader falls through to older layers (which the caller
    /// guarantees hold nothing there) rather than read a half-punched range.
    pub fn punch(&self, start: u64, end: u64) -> Result<()> {
        lock::write(&self.extents)?.remove(start, end);
        punch_hole(
            &self.file,
            &self.path,
            start * BLOCK_SIZE,
            (end - start) * BLOCK_SIZE,
        )
    }

    /// Copies the blocks in `runs` from this layer into `dst` (merging a
    /// removed snapshot into its child). A block failing its checksum stops
    /// the copy: it is never copied.
    pub fn copy_into(&self, dst: &Layer, runs: &ExtentSet) -> Result<()> {
        let mut buf = vec![0u8; buf_range(0, 0, CHUNK_BLOCKS).end];
        for (start, end) in runs.iter() {
            for (s, e) in chunks(start, end) {
                let chunk = &mut buf[buf_range(s, s, e)];
                self.read_present(&[(s, e)], s, chunk)?;
                dst.write_blocks(s, chunk)?;
            }
        }
        Ok(())
    }

    /// Makes written data durable, and closes the regions that have been
    /// idle a while (`intent.rs`), their checksums made durable first. A
    /// crash recomputes the checksums of open regions from their data, so
    /// the checksums need be durable only when a region closes: a flush
    /// with none to close costs one `fdatasync`, not two.
    pub fn sync_data(&self) -> Result<()> {
        let idle = self.intents.idle();
        self.sync_file()?;
        if !idle.is_empty() {
            self.checksums.sync()?;
            self.intents.close(idle);
        }
        Ok(())
    }

    fn sync_files(&self) -> Result<()> {
        self.sync_file()?;
        self.checksums.sync()
    }

    /// Makes the written data durable, not the checksums.
    fn sync_file(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| StorageError::io(&self.path, e))
    }

    /// Makes written data and checksums durable and closes every region:
    /// for a caller that knows no write is in flight.
    pub fn settle(&self) -> Result<()> {
        self.sync_files()?;
        self.intents.clear()
    }

    /// Marks the whole layer as being written, until [`Self::settle`]: for
    /// bulk writers (a rebuild, a snapshot merge), so that they pay one
    /// record for the layer rather than one per region.
    pub fn open_whole(&self) -> Result<()> {
        self.intents.open_whole()
    }

    /// Grows the file (sparsely) to `size` bytes, durably.
    pub fn grow(&self, size: u64) -> Result<()> {
        let io = |e| StorageError::io(&self.path, e);
        self.file.set_len(size).map_err(io)?;
        self.file.sync_all().map_err(io)
    }
}

/// Splits `[start, end)` into runs of at most [`CHUNK_BLOCKS`].
fn chunks(start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> {
    (start..end)
        .step_by(usize::try_from(CHUNK_BLOCKS).unwrap_or(usize::MAX))
        .map(move |s| (s, (s + CHUNK_BLOCKS).min(end)))
}

fn punch_hole(file: &File, path: &Path, offset: u64, len: u64) -> Result<()> {
    let mode = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    fallocate(file, mode, off_t(offset), off_t(len)).map_err(|e| StorageError::errno(path, e))
}

/// Makes a layer file cut short (by a filesystem repair, a slip of the
/// hand) `size` bytes long again. The blocks from the one its old end cut
/// that have a checksum recorded were held (or unmapped since: no telling,
/// so they count too), and are lost: zeros are written over them, so that
/// they stay held and fail their checksums (to be repaired from another
/// replica, or fail their reads) rather than read as holes, through to
/// older layers. Returns those blocks.
fn restore_length(
    file: &File,
    path: &Path,
    checksums: &Checksums,
    len: u64,
    size: u64,
) -> Result<ExtentSet> {
    let io = |e| StorageError::io(path, e);
    let lost = checksums.recorded(len / BLOCK_SIZE, size / BLOCK_SIZE)?;
    // Never shorter: the cut may be an earlier open's, restored in part.
    if file.metadata().map_err(io)?.len() < size {
        file.set_len(size).map_err(io)?;
    }
    let zeros = vec![0u8; buf_range(0, 0, CHUNK_BLOCKS).end];
    for (start, end) in lost.iter() {
        for (s, e) in chunks(start, end) {
            file.write_all_at(&zeros[buf_range(s, s, e)], s * BLOCK_SIZE)
                .map_err(io)?;
        }
    }
    file.sync_data().map_err(io)?;
    tracing::warn!(layer = %path.display(), len, size, lost_blocks = lost.block_count(), "a layer file was cut short: the blocks it lost read as rotten");
    Ok(lost)
}

/// The blocks of the first `size` bytes of `file` that hold data, from
/// `SEEK_DATA`/`SEEK_HOLE`. Partial blocks round outwards, so a block is
/// never wrongly reported as a hole.
pub fn scan_extents(file: &File, path: &Path, size: u64) -> Result<ExtentSet> {
    let mut extents = ExtentSet::new();
    let end = off_t(size);
    let mut pos = 0;
    while pos < end {
        let data = match lseek(file, pos, Whence::SeekData) {
            Ok(data) => data,
            // No data at or after `pos`.
            Err(Errno::ENXIO) => break,
            Err(e) => return Err(StorageError::errno(path, e)),
        };
        if data >= end {
            break;
        }
        // There is always a hole at end of file, so SEEK_HOLE succeeds here.
        let hole = lseek(file, data, Whence::SeekHole)
            .map_err(|e| StorageError::errno(path, e))?
            .min(end);
        let (data, hole) = (data.unsigned_abs(), hole.unsigned_abs());
        extents.insert(data / BLOCK_SIZE, hole.div_ceil(BLOCK_SIZE));
        pos = off_t(hole);
    }
    Ok(extents)
}

/// Checks that the filesystem under `dir` reports data and holes at 4 KiB
/// granularity and supports punching holes (see the module docs).
pub fn probe_filesystem(dir: &ReplicaDir) -> Result<()> {
    let path = dir.join(PROBE_FILE);
    let result = probe_file(&path);
    dir.remove_if_exists(PROBE_FILE)?;
    result
}

fn probe_file(path: &Path) -> Result<()> {
    let unsupported = |reason: String| StorageError::UnsupportedFilesystem {
        path: path.to_path_buf(),
        reason,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| StorageError::io(path, e))?;
    let io = |e| StorageError::io(path, e);
    file.set_len(4 * BLOCK_SIZE).map_err(io)?;
    file.write_all_at(&[0xa5; BLOCK_SIZE as usize * 2], BLOCK_SIZE)
        .map_err(io)?;
    let mut expected = ExtentSet::new();
    expected.insert(1, 3);
    let found = scan_extents(&file, path, 4 * BLOCK_SIZE)?;
    if found != expected {
        return Err(unsupported(format!(
            "wrote blocks 1..3, found {:?}",
            found.iter().collect::<Vec<_>>()
        )));
    }
    punch_hole(&file, path, BLOCK_SIZE, BLOCK_SIZE)
        .map_err(|e| unsupported(format!("punching a hole: {e}")))?;
    expected.remove(1, 2);
    let found = scan_extents(&file, path, 4 * BLOCK_SIZE)?;
    if found != expected {
        return Err(unsupported(format!(
            "punched block 1 of 1..3, found {:?}",
            found.iter().collect::<Vec<_>>()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const BS: usize = BLOCK_SIZE as usize;

    /// The filesystems replicas may live on here: `/tmp` (the test default)
    /// and `/dev/shm` when present.
    fn test_dirs() -> Vec<tempfile::TempDir> {
        let mut dirs = vec![tempfile::tempdir().unwrap()];
        if Path::new("/dev/shm").is_dir() {
            dirs.push(tempfile::tempdir_in("/dev/shm").unwrap());
        }
        dirs
    }

    fn new_layer(dir: &ReplicaDir, blocks: u64) -> Layer {
        let meta = LayerMeta::new("head-1.img".into(), String::new(), false, BTreeMap::new());
        Layer::create(dir, blocks * BLOCK_SIZE, meta).unwrap()
    }

    #[test]
    fn filesystems_here_pass_the_probe() {
        for tmp in test_dirs() {
            probe_filesystem(&ReplicaDir::lock(tmp.path()).unwrap()).unwrap();
            assert!(!tmp.path().join(PROBE_FILE).exists());
        }
    }

    /// The assumption in the module docs: SEEK_DATA/SEEK_HOLE report exactly
    /// the 4 KiB blocks written, including scattered single blocks, runs,
    /// blocks written with zeros and blocks around punched holes.
    #[test]
    fn seek_data_reports_exactly_the_blocks_written() {
        for tmp in test_dirs() {
            let dir = ReplicaDir::lock(tmp.path()).unwrap();
            let layer = new_layer(&dir, 256);
            let mut expected = ExtentSet::new();
            for (start, len) in [(0, 1), (2, 1), (5, 3), (17, 1), (64, 40), (255, 1)] {
                layer
                    .write_blocks(start, &vec![0x11; BS * len as usize])
                    .unwrap();
                expected.insert(start, start + len);
            }
            layer.write_zeros(120, 124).unwrap();
            expected.insert(120, 124);
            layer.punch(70, 72).unwrap();
            expected.remove(70, 72);
            assert_eq!(layer.extents().unwrap(), expected);
            let reopened = Layer::open(&dir, "head-1.img", 256 * BLOCK_SIZE).unwrap();
            assert_eq!(
                reopened.extents().unwrap(),
                expected,
                "in {}",
                tmp.path().display()
            );
        }
    }

    #[test]
    fn a_write_of_several_pieces_lands_whole_and_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let layer = new_layer(&dir, 128);
        // Two whole pieces and a part of one, each block telling its own.
        let blocks = 2 * WRITE_PIECE / BS + 3;
        let data: Vec<u8> = (0..blocks * BS).map(|i| (i / BS) as u8).collect();
        layer.write_blocks(5, &data).unwrap();
        let mut read = vec![0; data.len()];
        layer.read_blocks(5, &mut read).unwrap();
        assert!(read == data, "read back what was written");
        let mut expected = ExtentSet::new();
        expected.insert(5, 5 + blocks as u64);
        assert_eq!(layer.extents().unwrap(), expected);
        assert_eq!(
            scan_extents(&layer.file, &layer.path, 128 * BLOCK_SIZE).unwrap(),
            expected
        );
    }

    #[test]
    fn read_present_fills_held_runs_and_returns_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let layer = new_layer(&dir, 16);
        layer.write_blocks(2, &[7; BS * 2]).unwrap();
        layer.write_blocks(6, &[8; BS]).unwrap();
        let mut buf = vec![0xff; BS * 8];
        let missing = layer.read_present(&[(1, 5), (6, 8)], 1, &mut buf).unwrap();
        assert_eq!(missing, vec![(1, 2), (4, 5), (7, 8)]);
        assert!(buf[BS..3 * BS].iter().all(|&b| b == 7));
        assert!(buf[5 * BS..6 * BS].iter().all(|&b| b == 8));
        assert!(
            buf[..BS].iter().all(|&b| b == 0xff),
            "untouched where missing"
        );
    }

    #[test]
    fn copy_into_copies_only_the_given_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let src = new_layer(&dir, 600);
        let dst_meta = LayerMeta::new("head-2.img".into(), String::new(), false, BTreeMap::new());
        let dst = Layer::create(&dir, 600 * BLOCK_SIZE, dst_meta).unwrap();
        src.write_blocks(0, &vec![3; BS * 600]).unwrap();
        let mut runs = ExtentSet::new();
        runs.insert(10, 20);
        runs.insert(100, 500);
        src.copy_into(&dst, &runs).unwrap();
        assert_eq!(dst.extents().unwrap(), runs);
        let mut buf = vec![0; BS * 600];
        let missing = dst.read_present(&[(0, 600)], 0, &mut buf).unwrap();
        assert_eq!(missing, vec![(0, 10), (20, 100), (500, 600)]);
        assert!(buf[100 * BS..500 * BS].iter().all(|&b| b == 3));
    }

    /// A file cut short, of a layer without checksums to tell what it
    /// lost (written before they existed), is refused.
    #[test]
    fn short_layer_file_without_checksums_is_corrupt() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let mut layer = new_layer(&dir, 4);
        layer.meta.checksums = false;
        layer.meta.save(&dir).unwrap();
        let err = Layer::open(&dir, "head-1.img", 8 * BLOCK_SIZE).unwrap_err();
        assert!(
            matches!(err, StorageError::CorruptMetadata { ref path, .. } if *path == dir.join("head-1.img")),
            "{err}"
        );
    }

    #[test]
    fn grow_keeps_data_and_adds_holes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let layer = new_layer(&dir, 4);
        layer.write_blocks(3, &[1; BS]).unwrap();
        layer.grow(1 << 30).unwrap();
        let reopened = Layer::open(&dir, "head-1.img", 1 << 30).unwrap();
        assert_eq!(
            reopened.extents().unwrap().iter().collect::<Vec<_>>(),
            vec![(3, 4)]
        );
    }

    #[test]
    fn chunks_cover_the_range() {
        let got: Vec<_> = chunks(10, 10 + 2 * CHUNK_BLOCKS + 1).collect();
        assert_eq!(
            got,
            vec![
                (10, 10 + CHUNK_BLOCKS),
                (10 + CHUNK_BLOCKS, 10 + 2 * CHUNK_BLOCKS),
                (10 + 2 * CHUNK_BLOCKS, 11 + 2 * CHUNK_BLOCKS)
            ]
        );
        assert_eq!(chunks(5, 5).count(), 0);
    }
}
