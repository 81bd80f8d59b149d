//! A checksummed block writer that counts lost writes exactly, for the fault
//! tests.
//!
//! fio's saved verify state guesses which writes were in flight from the
//! queue depth, and reports false losses when completions reorder. This
//! writer records each acknowledgement itself: what each `pwrite` (or
//! discard) returned, per block. It never has two requests in flight to one
//! block (an extent waits until all its blocks are free), so after a fault a
//! block may read back as exactly one of: its last acknowledged content, or
//! the content of a request that was in flight or failed since then. Anything
//! else is a loss (older data, or zeros where a write was acknowledged) or a
//! corruption (a bad checksum, another block's data, a write this block never
//! got).
//!
//! Every written 4 KiB block carries a header: a magic, the run id, its own
//! byte offset, the sequence number of the request that wrote it, and an
//! xxh3 checksum over the whole block (the checksum field excluded); the rest
//! is pseudo-random bytes derived from the header. A discarded block reads as
//! zeros, as does one never written.
//!
//! Requests are random extents of 1 to `max_extent` blocks from several
//! worker threads with O_DIRECT on the device, so extents of different
//! workers overlap in time (never on a block in flight); some are discards
//! (BLKDISCARD on a block device, a punched hole in a file) and some are
//! followed by `fdatasync`.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::libc;
use xxhash_rust::xxh3::Xxh3;

use crate::{Error, Result};

/// The unit the writer works in; a multiple of any logical block size here.
pub const BLOCK: u64 = 4096;
const BLOCK_BYTES: usize = BLOCK as usize;
const MAGIC: [u8; 8] = *b"OXHFAULT";
/// Header: magic, run id, byte offset, sequence number, checksum.
const CHECKSUM_AT: usize = 32;
const HEADER: usize = 40;
/// How much [`Writer::verify`] reads at a time.
const READ_CHUNK: u64 = 1 << 20;
/// How many lost or corrupt blocks a verdict describes.
const BAD_SHOWN: usize = 16;
/// `_IO(0x12, 119)` from linux/fs.h.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// What a block holds as far as the writer knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// Never written: zeros.
    Unwritten,
    /// What the write with this sequence number put there.
    Write(u64),
    /// Zeros, from the discard with this sequence number.
    Discard(u64),
}

impl Content {
    fn reads_as_zeros(self) -> bool {
        !matches!(self, Content::Write(_))
    }
}

/// What a block read back as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Zeros,
    /// A well-formed block of this run, for this offset, from this write.
    Write(u64),
    /// Anything else, with why.
    Damaged(String),
}

/// A block's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Its last acknowledged content.
    Ok,
    /// The content of a request in flight (or failed) since its last
    /// acknowledgement: allowed.
    InFlight,
    /// An older content, or zeros where a write was acknowledged.
    Lost,
    /// Not a block this run wrote there.
    Corrupt,
}

#[derive(Clone, Debug)]
struct BlockState {
    /// A request is in flight on this block.
    busy: bool,
    acked: Content,
    /// Requests issued since `acked` that were not acknowledged (in flight,
    /// or failed: either may have landed).
    pending: Vec<Content>,
    /// Every write ever issued to this block, acknowledged or not.
    issued: Vec<u64>,
}

impl BlockState {
    fn new() -> Self {
        Self {
            busy: false,
            acked: Content::Unwritten,
            pending: Vec::new(),
            issued: Vec::new(),
        }
    }

    fn classify(&self, found: &Found) -> Class {
        match found {
            Found::Damaged(_) => Class::Corrupt,
            Found::Zeros if self.acked.reads_as_zeros() => Class::Ok,
            Found::Zeros if self.pending.iter().any(|c| c.reads_as_zeros()) => Class::InFlight,
            Found::Zeros => Class::Lost,
            Found::Write(seq) if self.acked == Content::Write(*seq) => Class::Ok,
            Found::Write(seq) if self.pending.contains(&Content::Write(*seq)) => Class::InFlight,
            // Written here once, and replaced since by an acknowledged request.
            Found::Write(seq) if self.issued.contains(seq) => Class::Lost,
            Found::Write(_) => Class::Corrupt,
        }
    }
}

/// How a [`Writer`] writes.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// Threads, each with one request in flight.
    pub workers: usize,
    /// Extents are 1 to this many blocks.
    pub max_extent: u64,
    /// Half of the extents fall within the first this many blocks, so that
    /// extents of different workers overlap often (0: none do on purpose).
    pub hot_blocks: u64,
    /// Out of 100 requests, how many are discards.
    pub discard_percent: u64,
    /// Out of 100 requests, how many are followed by an fdatasync.
    pub sync_percent: u64,
    pub seed: u64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            workers: 4,
            max_extent: 16,
            hot_blocks: 256,
            discard_percent: 5,
            sync_percent: 2,
            seed: 1,
        }
    }
}

/// What the writer did so far.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Acknowledged writes (requests, not blocks).
    pub writes: u64,
    /// Blocks those writes covered.
    pub blocks_written: u64,
    /// Acknowledged discards.
    pub discards: u64,
    /// Successful fdatasyncs.
    pub syncs: u64,
    /// Requests that failed: their blocks may hold the old or the new content.
    pub failed: u64,
    /// Requests whose extent overlapped one in flight, and waited for it.
    pub overlapped: u64,
    /// The first few errors, with the request that got them.
    pub errors: Vec<String>,
    /// The longest any acknowledged request took.
    pub max_latency: Duration,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} writes ({} blocks), {} discards, {} syncs acknowledged, {} failed, \
             {} overlapping one in flight, longest {:?}",
            self.writes,
            self.blocks_written,
            self.discards,
            self.syncs,
            self.failed,
            self.overlapped,
            self.max_latency
        )?;
        for error in &self.errors {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}

/// A lost or corrupt block, as found.
#[derive(Clone, Debug)]
pub struct BadBlock {
    pub block: u64,
    pub class: Class,
    pub found: Found,
    pub acked: Content,
    pub pending: Vec<Content>,
}

/// The read-back of every block.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Blocks read back.
    pub blocks: u64,
    pub ok: u64,
    pub in_flight: u64,
    pub lost: u64,
    pub corrupt: u64,
    /// Of the blocks read, how many hold a write this run made (the rest
    /// read as zeros).
    pub holding_writes: u64,
    /// The first lost or corrupt blocks.
    pub bad: Vec<BadBlock>,
}

impl Verdict {
    /// No acknowledged write lost and nothing corrupt.
    pub fn is_clean(&self) -> bool {
        self.lost == 0 && self.corrupt == 0
    }

    fn count(&mut self, block: u64, state: &BlockState, found: Found) {
        let class = state.classify(&found);
        self.blocks += 1;
        if matches!(found, Found::Write(_)) {
            self.holding_writes += 1;
        }
        match class {
            Class::Ok => self.ok += 1,
            Class::InFlight => self.in_flight += 1,
            Class::Lost => self.lost += 1,
            Class::Corrupt => self.corrupt += 1,
        }
        if matches!(class, Class::Lost | Class::Corrupt) && self.bad.len() < BAD_SHOWN {
            self.bad.push(BadBlock {
                block,
                class,
                found,
                acked: state.acked,
                pending: state.pending.clone(),
            });
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} blocks: {} ok ({} holding writes), {} in flight, {} lost, {} corrupt",
            self.blocks, self.ok, self.holding_writes, self.in_flight, self.lost, self.corrupt
        )?;
        for bad in &self.bad {
            write!(
                f,
                "\n  block {}: {:?}, found {:?}, last acknowledged {:?}, in flight {:?}",
                bad.block, bad.class, bad.found, bad.acked, bad.pending
            )?;
        }
        Ok(())
    }
}

struct State {
    blocks: Vec<BlockState>,
    next_seq: u64,
    stats: Stats,
}

/// What every worker of a writer shares: the per-block record.
struct Ledger {
    run: u64,
    state: Mutex<State>,
    /// Signalled when blocks stop being busy.
    freed: Condvar,
    acknowledged: AtomicU64,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker that panicked holding the lock left whole records: every
        // update below completes before anything can panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every block of `range` is free, then marks them busy with
    /// a new request; None if `stop` is set meanwhile.
    fn begin(&self, range: Range<u64>, discard: bool, stop: &AtomicBool) -> Option<Content> {
        let blocks = range.start as usize..range.end as usize;
        let mut state = self.lock();
        let mut waited = false;
        while state.blocks[blocks.clone()].iter().any(|b| b.busy) {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            waited = true;
            state = self
                .freed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        state.next_seq += 1;
        state.stats.overlapped += u64::from(waited);
        let seq = state.next_seq;
        let content = if discard {
            Content::Discard(seq)
        } else {
            Content::Write(seq)
        };
        for block in &mut state.blocks[blocks] {
            block.busy = true;
            block.pending.push(content);
            if !discard {
                block.issued.push(seq);
            }
        }
        Some(content)
    }

    /// Records what the request `begin` handed out returned.
    fn finish(
        &self,
        range: Range<u64>,
        content: Content,
        result: std::io::Result<()>,
        took: Duration,
    ) {
        let mut state = self.lock();
        let ok = result.is_ok();
        for block in &mut state.blocks[range.start as usize..range.end as usize] {
            block.busy = false;
            if ok {
                block.acked = content;
                block.pending.clear();
            }
        }
        let stats = &mut state.stats;
        match (result, content) {
            (Ok(()), Content::Write(_)) => {
                stats.writes += 1;
                stats.blocks_written += range.end - range.start;
                self.acknowledged.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(()), _) => stats.discards += 1,
            (Err(error), _) => {
                stats.failed += 1;
                if stats.errors.len() < 8 {
                    stats.errors.push(format!(
                        "{content:?} of blocks {range:?} after {took:?}: {error}"
                    ));
                }
            }
        }
        if ok {
            stats.max_latency = stats.max_latency.max(took);
        }
        drop(state);
        self.freed.notify_all();
    }

    fn synced(&self, result: &std::io::Result<()>) {
        let mut state = self.lock();
        match result {
            Ok(()) => state.stats.syncs += 1,
            Err(error) => {
                state.stats.failed += 1;
                if state.stats.errors.len() < 8 {
                    state.stats.errors.push(format!("fdatasync: {error}"));
                }
            }
        }
    }

    /// Writes or discards `range` on `file`, as one request, recording it.
    fn request(
        &self,
        target: &Target,
        range: Range<u64>,
        discard: bool,
        buf: &mut AlignedBuf,
        stop: &AtomicBool,
    ) -> Option<bool> {
        let content = self.begin(range.clone(), discard, stop)?;
        let bytes = (range.end - range.start) * BLOCK;
        let started = Instant::now();
        let result = match content {
            Content::Write(seq) => {
                let data = &mut buf.as_mut()[..bytes as usize];
                for (i, block) in data.chunks_exact_mut(BLOCK_BYTES).enumerate() {
                    fill_block(block, self.run, range.start + i as u64, seq);
                }
                target.file.write_all_at(data, range.start * BLOCK)
            }
            _ => target.discard(range.start * BLOCK, bytes),
        };
        let ok = result.is_ok();
        self.finish(range, content, result, started.elapsed());
        Some(ok)
    }
}

/// The device (or file) the workers share.
struct Target {
    file: File,
    block_device: bool,
}

impl Target {
    fn open(path: &Path, write: bool) -> Result<Self> {
        let open = |flags| {
            OpenOptions::new()
                .read(true)
                .write(write)
                .custom_flags(flags)
                .open(path)
        };
        let file = match open(libc::O_DIRECT) {
            Ok(file) => Ok(file),
            // tmpfs and some others refuse O_DIRECT; block devices never do.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0),
            Err(e) => Err(e),
        }
        .map_err(|e| Error::io(path, e))?;
        let block_device = file
            .metadata()
            .map_err(|e| Error::io(path, e))?
            .file_type()
            .is_block_device();
        Ok(Self { file, block_device })
    }

    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let fd = self.file.as_raw_fd();
        // SAFETY: plain syscalls on an open descriptor; the ioctl reads a
        // two-u64 array that lives across the call.
        let rc = unsafe {
            if self.block_device {
                let range: [u64; 2] = [offset, len];
                libc::ioctl(fd, BLKDISCARD, range.as_ptr())
            } else {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// Writes checksummed blocks and verifies what reads back; see the module
/// documentation. Runs ([`Writer::start`]) may follow one another against
/// different devices of the same volume (an engine restarted between them):
/// the record carries over.
pub struct Writer {
    ledger: Arc<Ledger>,
    options: WriterOptions,
    runs: AtomicU64,
}

impl Writer {
    /// A writer for a volume of `size` bytes (a multiple of [`BLOCK`]), all
    /// zeros: a fresh volume.
    pub fn new(size: u64, options: WriterOptions) -> Self {
        assert!(
            size.is_multiple_of(BLOCK) && size > 0,
            "size {size} is not a positive multiple of {BLOCK}"
        );
        let blocks = (0..size / BLOCK).map(|_| BlockState::new()).collect();
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32;
        Self {
            ledger: Arc::new(Ledger {
                run,
                state: Mutex::new(State {
                    blocks,
                    next_seq: 0,
                    stats: Stats::default(),
                }),
                freed: Condvar::new(),
                acknowledged: AtomicU64::new(0),
            }),
            options,
            runs: AtomicU64::new(0),
        }
    }

    /// The size of a device or file, in bytes.
    pub fn size_of(path: &Path) -> Result<u64> {
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        file.seek(SeekFrom::End(0)).map_err(|e| Error::io(path, e))
    }

    fn blocks(&self) -> u64 {
        self.ledger.lock().blocks.len() as u64
    }

    /// Starts the workers against `device`; they go on until stopped or
    /// until a request fails (each worker stops at its first failure).
    pub fn start(&self, device: &Path) -> Result<Running> {
        let size = Self::size_of(device)?;
        let blocks = self.blocks();
        if size < blocks * BLOCK {
            return Err(Error::Failed(format!(
                "{} has {size} bytes, the writer covers {}",
                device.display(),
                blocks * BLOCK
            )));
        }
        let target = Arc::new(Target::open(device, true)?);
        let stop = Arc::new(AtomicBool::new(false));
        let run = self.runs.fetch_add(1, Ordering::Relaxed);
        let mut threads = Vec::new();
        for worker in 0..self.options.workers {
            let (ledger, target, stop) = (self.ledger.clone(), target.clone(), stop.clone());
            let options = self.options.clone();
            let seed = options.seed
                ^ (run << 32)
                ^ (worker as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let thread = std::thread::Builder::new()
                .name(format!("writer-{worker}"))
                .spawn(move || work(&ledger, &target, &options, blocks, seed, &stop))
                .map_err(|e| Error::io("writer thread", e))?;
            threads.push(thread);
        }
        Ok(Running {
            stop,
            threads,
            ledger: self.ledger.clone(),
        })
    }

    /// Acknowledged writes so far.
    pub fn acknowledged(&self) -> u64 {
        self.ledger.acknowledged.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> Stats {
        self.ledger.lock().stats.clone()
    }

    /// Reads every block of `device` back (O_DIRECT) and classifies it.
    /// Call it with no run going.
    pub fn verify(&self, device: &Path) -> Result<Verdict> {
        let target = Target::open(device, false)?;
        let size = self.blocks() * BLOCK;
        let mut buf = AlignedBuf::new(READ_CHUNK as usize);
        let mut verdict = Verdict::default();
        for offset in (0..size).step_by(READ_CHUNK as usize) {
            let len = READ_CHUNK.min(size - offset) as usize;
            let data = &mut buf.as_mut()[..len];
            target
                .file
                .read_exact_at(data, offset)
                .map_err(|e| Error::io(device, e))?;
            self.classify(offset / BLOCK, data, &mut verdict);
        }
        Ok(verdict)
    }

    /// Classifies every block of `image`, the whole volume's bytes (e.g. read
    /// from one replica).
    pub fn verify_image(&self, image: &[u8]) -> Verdict {
        assert_eq!(
            image.len() as u64,
            self.blocks() * BLOCK,
            "the image is not the volume's size"
        );
        let mut verdict = Verdict::default();
        self.classify(0, image, &mut verdict);
        verdict
    }

    fn classify(&self, first: u64, data: &[u8], verdict: &mut Verdict) {
        let state = self.ledger.lock();
        for (i, block) in data.chunks_exact(BLOCK_BYTES).enumerate() {
            let index = first + i as u64;
            let found = decode(block, self.ledger.run, index);
            verdict.count(index, &state.blocks[index as usize], found);
        }
    }
}

/// Workers writing to a device; dropping it stops and joins them.
pub struct Running {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    ledger: Arc<Ledger>,
}

impl Running {
    /// Workers still going (a worker stops at its first failed request).
    pub fn workers_left(&self) -> usize {
        self.threads.iter().filter(|t| !t.is_finished()).count()
    }

    /// Acknowledged writes so far, this run and earlier ones.
    pub fn acknowledged(&self) -> u64 {
        self.ledger.acknowledged.load(Ordering::Relaxed)
    }

    /// Stops the workers after their request in flight, and returns what
    /// the writer did so far (all runs).
    pub fn stop(mut self) -> Stats {
        self.join();
        self.ledger.lock().stats.clone()
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.ledger.freed.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.join();
    }
}

fn work(
    ledger: &Ledger,
    target: &Target,
    options: &WriterOptions,
    blocks: u64,
    seed: u64,
    stop: &AtomicBool,
) {
    let mut rng = Rng(seed | 1);
    let max_extent = options.max_extent.clamp(1, blocks);
    let mut buf = AlignedBuf::new((max_extent * BLOCK) as usize);
    while !stop.load(Ordering::Relaxed) {
        let count = 1 + rng.below(max_extent);
        let span = if options.hot_blocks >= count && rng.below(2) == 0 {
            options.hot_blocks.min(blocks)
        } else {
            blocks
        };
        let first = rng.below(span - count + 1);
        let discard = rng.below(100) < options.discard_percent;
        match ledger.request(target, first..first + count, discard, &mut buf, stop) {
            None | Some(false) => return,
            Some(true) => {}
        }
        if rng.below(100) < options.sync_percent {
            let result = target.file.sync_data();
            ledger.synced(&result);
            if result.is_err() {
                return;
            }
        }
    }
}

/// Writes block `index`'s content from write `seq` of run `run` into `block`.
fn fill_block(block: &mut [u8], run: u64, index: u64, seq: u64) {
    let offset = index * BLOCK;
    block[..8].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&run.to_le_bytes());
    block[16..24].copy_from_slice(&offset.to_le_bytes());
    block[24..32].copy_from_slice(&seq.to_le_bytes());
    let mut rng = Rng((run ^ offset.rotate_left(17) ^ seq.wrapping_mul(0x2545_f491_4f6c_dd1d)) | 1);
    for word in block[HEADER..].chunks_exact_mut(8) {
        word.copy_from_slice(&rng.next().to_le_bytes());
    }
    let checksum = checksum(block);
    block[CHECKSUM_AT..HEADER].copy_from_slice(&checksum.to_le_bytes());
}

/// xxh3 over the whole block but its checksum field.
fn checksum(block: &[u8]) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(&block[..CHECKSUM_AT]);
    hasher.update(&block[HEADER..]);
    hasher.digest()
}

fn field(block: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes"))
}

/// What block `index` of run `run` reads as.
fn decode(block: &[u8], run: u64, index: u64) -> Found {
    if block.iter().all(|&b| b == 0) {
        return Found::Zeros;
    }
    if block[..8] != MAGIC {
        return Found::Damaged("no header".into());
    }
    let (found_run, offset, seq) = (field(block, 8), field(block, 16), field(block, 24));
    if field(block, CHECKSUM_AT) != checksum(block) {
        return Found::Damaged(format!(
            "checksum mismatch (header: run {found_run:x}, offset {offset}, seq {seq})"
        ));
    }
    if found_run != run {
        return Found::Damaged(format!("written by another run ({found_run:x})"));
    }
    if offset != index * BLOCK {
        return Found::Damaged(format!("holds block {}'s write {seq}", offset / BLOCK));
    }
    Found::Write(seq)
}

/// A zeroed buffer whose start is aligned for O_DIRECT.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let storage = vec![0; len + BLOCK_BYTES];
        let start = storage.as_ptr().align_offset(BLOCK_BYTES);
        Self {
            storage,
            start,
            len,
        }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// xorshift64: deterministic, cheap.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCKS: u64 = 64;

    /// A file of `BLOCKS` zero blocks and a writer for it.
    fn setup() -> (tempfile::TempDir, std::path::PathBuf, Writer) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("volume");
        File::create(&path)
            .unwrap()
            .set_len(BLOCKS * BLOCK)
            .unwrap();
        (
            dir,
            path,
            Writer::new(BLOCKS * BLOCK, WriterOptions::default()),
        )
    }

    /// One request through the workers' own path, succeeding.
    fn request(writer: &Writer, path: &Path, range: Range<u64>, discard: bool) {
        let target = Target::open(path, true).unwrap();
        let mut buf = AlignedBuf::new((BLOCKS * BLOCK) as usize);
        let stop = AtomicBool::new(false);
        assert_eq!(
            writer
                .ledger
                .request(&target, range, discard, &mut buf, &stop),
            Some(true)
        );
    }

    fn block_bytes(path: &Path, index: u64) -> Vec<u8> {
        let mut block = vec![0; BLOCK_BYTES];
        File::open(path)
            .unwrap()
            .read_exact_at(&mut block, index * BLOCK)
            .unwrap();
        block
    }

    fn put_block(path: &Path, index: u64, block: &[u8]) {
        OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .write_all_at(block, index * BLOCK)
            .unwrap();
    }

    fn written(writer: &Writer, index: u64, seq: u64) -> Vec<u8> {
        let mut block = vec![0; BLOCK_BYTES];
        fill_block(&mut block, writer.ledger.run, index, seq);
        block
    }

    fn last_write(writer: &Writer, index: u64) -> u64 {
        match writer.ledger.lock().blocks[index as usize].acked {
            Content::Write(seq) => seq,
            other => panic!("block {index} holds {other:?}"),
        }
    }

    #[test]
    fn concurrent_workers_read_back_clean() {
        let (_dir, path, writer) = setup();
        let running = writer.start(&path).unwrap();
        while running.acknowledged() < 2000 {
            std::thread::yield_now();
        }
        let stats = running.stop();
        assert_eq!(stats.failed, 0, "{stats}");
        assert!(
            stats.discards > 0 && stats.syncs > 0 && stats.overlapped > 0,
            "{stats}"
        );
        let verdict = writer.verify(&path).unwrap();
        assert!(verdict.is_clean(), "{verdict}");
        assert_eq!(verdict.ok, BLOCKS, "{verdict}");
        assert!(verdict.holding_writes > BLOCKS / 2, "{verdict}");
    }

    #[test]
    fn an_older_write_reads_as_lost() {
        let (_dir, path, writer) = setup();
        request(&writer, &path, 3..5, false);
        let old = block_bytes(&path, 3);
        request(&writer, &path, 2..4, false);
        put_block(&path, 3, &old);
        let verdict = writer.verify(&path).unwrap();
        assert_eq!((verdict.lost, verdict.corrupt), (1, 0), "{verdict}");
        assert_eq!(verdict.bad[0].block, 3);
        assert_eq!(verdict.ok, BLOCKS - 1);
    }

    #[test]
    fn zeros_where_a_write_was_acknowledged_read_as_lost() {
        let (_dir, path, writer) = setup();
        request(&writer, &path, 10..12, false);
        put_block(&path, 11, &[0; BLOCK_BYTES]);
        let verdict = writer.verify(&path).unwrap();
        assert_eq!((verdict.lost, verdict.corrupt), (1, 0), "{verdict}");
        assert_eq!(verdict.bad[0].block, 11);
    }

    #[test]
    fn a_discard_reads_as_zeros_and_old_data_under_it_as_lost() {
        let (_dir, path, writer) = setup();
        request(&writer, &path, 0..8, false);
        let old = block_bytes(&path, 6);
        request(&writer, &path, 4..8, true);
        assert_eq!(block_bytes(&path, 5), vec![0; BLOCK_BYTES]);
        let verdict = writer.verify(&path).unwrap();
        assert!(verdict.is_clean(), "{verdict}");
        assert_eq!(verdict.holding_writes, 4);
        // The discard undone: the old data shows through.
        put_block(&path, 6, &old);
        let verdict = writer.verify(&path).unwrap();
        assert_eq!((verdict.lost, verdict.corrupt), (1, 0), "{verdict}");
        assert_eq!(verdict.bad[0].block, 6);
    }

    #[test]
    fn damaged_or_misplaced_blocks_read_as_corrupt() {
        let (_dir, path, writer) = setup();
        request(&writer, &path, 20..24, false);
        // A flipped bit in the payload.
        let mut block = block_bytes(&path, 20);
        block[2000] ^= 1;
        put_block(&path, 20, &block);
        // Block 22's data at block 21 (a misdirected write).
        put_block(&path, 21, &block_bytes(&path, 22));
        // A well-formed write this block never got.
        let phantom = last_write(&writer, 23) + 100;
        put_block(&path, 23, &written(&writer, 23, phantom));
        // Garbage where nothing was written.
        put_block(&path, 40, &[0xa5; BLOCK_BYTES]);
        let verdict = writer.verify(&path).unwrap();
        assert_eq!((verdict.lost, verdict.corrupt), (0, 4), "{verdict}");
        let bad: Vec<u64> = verdict.bad.iter().map(|b| b.block).collect();
        assert_eq!(bad, [20, 21, 23, 40]);
        assert!(
            matches!(&verdict.bad[0].found, Found::Damaged(why) if why.contains("checksum")),
            "{verdict}"
        );
    }

    #[test]
    fn a_failed_request_may_read_old_or_new_and_nothing_else() {
        let (_dir, path, writer) = setup();
        request(&writer, &path, 30..32, false);
        let acked = last_write(&writer, 30);
        // A write and a discard that fail: either may have landed.
        let stop = AtomicBool::new(false);
        let write = writer.ledger.begin(30..31, false, &stop).unwrap();
        let error = || Err(std::io::Error::from_raw_os_error(libc::EIO));
        writer.ledger.finish(30..31, write, error(), Duration::ZERO);
        let discard = writer.ledger.begin(31..32, true, &stop).unwrap();
        writer
            .ledger
            .finish(31..32, discard, error(), Duration::ZERO);
        let Content::Write(new) = write else {
            panic!("{write:?}")
        };
        assert_eq!(writer.stats().failed, 2);
        // Neither landed.
        let verdict = writer.verify(&path).unwrap();
        assert_eq!((verdict.ok, verdict.in_flight), (BLOCKS, 0), "{verdict}");
        // Both landed.
        put_block(&path, 30, &written(&writer, 30, new));
        put_block(&path, 31, &[0; BLOCK_BYTES]);
        let verdict = writer.verify(&path).unwrap();
        assert!(verdict.is_clean(), "{verdict}");
        assert_eq!(verdict.in_flight, 2, "{verdict}");
        // Once a later write is acknowledged, the failed one is old data.
        request(&writer, &path, 30..31, false);
        assert!(last_write(&writer, 30) > new && new > acked);
        put_block(&path, 30, &written(&writer, 30, new));
        let verdict = writer.verify(&path).unwrap();
        assert_eq!(verdict.lost, 1, "{verdict}");
    }

    #[test]
    fn an_image_is_classified_as_a_device_is() {
        let (_dir, path, writer) = setup();
        request(&writer, &path, 0..BLOCKS, false);
        let mut image = std::fs::read(&path).unwrap();
        assert!(writer.verify_image(&image).is_clean());
        image[5 * BLOCK_BYTES + 100] ^= 0xff;
        let verdict = writer.verify_image(&image);
        assert_eq!(verdict.corrupt, 1, "{verdict}");
    }
}
