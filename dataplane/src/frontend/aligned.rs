//! Byte-granular I/O on top of a [`BlockDevice`], which only takes whole
//! blocks. The kernel sends aligned requests through a loop device, but anyone
//! may `dd bs=512` on the FUSE file itself, so unaligned requests must work
//! too: their partial edge blocks go through read-modify-write.

use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::{try_join, try_join_all};
use nix::libc;
use tokio::sync::{Mutex, MutexGuard};

use super::{BLOCK_SIZE, BlockDevice};

/// Read-modify-write locks are striped: two unaligned writes to the same block
/// always share a stripe, while unrelated ones rarely do. 64 keeps the table
/// small and collisions between concurrent edge blocks unlikely.
const RMW_STRIPES: u64 = 64;

/// Zeros for the partial blocks at the edges of a discarded range.
static ZEROS: [u8; BLOCK_SIZE as usize] = [0; BLOCK_SIZE as usize];

/// A [`BlockDevice`] seen as a file of the device's current size: any offset
/// and length, reads clamped at the end, writes past the end refused.
pub(crate) struct AlignedIo<D> {
    device: Arc<D>,
    rmw_locks: Box<[Mutex<()>]>,
}

fn align_down(offset: u64) -> u64 {
    offset - offset % BLOCK_SIZE
}

fn align_up(offset: u64) -> u64 {
    align_down(offset.saturating_add(BLOCK_SIZE - 1))
}

fn is_aligned(offset: u64) -> bool {
    offset.is_multiple_of(BLOCK_SIZE)
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Widens a length that came from a `usize` (a buffer) or a `u32` (a FUSE
/// request); lossless on every 64-bit target.
fn to_u64(len: usize) -> u64 {
    len as u64
}

/// Narrows an offset inside one request (at most a few MiB) to an index.
fn to_usize(offset: u64) -> usize {
    usize::try_from(offset).expect("an offset inside one request fits in usize")
}

impl<D: BlockDevice> AlignedIo<D> {
    pub(crate) fn new(device: Arc<D>) -> Self {
        let rmw_locks = (0..RMW_STRIPES).map(|_| Mutex::new(())).collect();
        AlignedIo { device, rmw_locks }
    }

    /// The device's size now: it grows when the volume is expanded.
    pub(crate) fn size(&self) -> u64 {
        self.device.size()
    }

    /// Reads up to `len` bytes at `offset`; fewer at the end, none past it.
    pub(crate) async fn read(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let end = offset.saturating_add(to_u64(len)).min(self.size());
        if offset >= end {
            return Ok(Bytes::new());
        }
        let (first, last) = (align_down(offset), align_up(end));
        let blocks = self.read_blocks(first, last - first).await?;
        Ok(blocks.slice(to_usize(offset - first)..to_usize(end - first)))
    }

    /// Writes `data` at `offset` and returns how much was written: all of it,
    /// or up to the end of the device (a short write, as a file at its size
    /// limit does). Writing at or past the end fails with EFBIG.
    pub(crate) async fn write(&self, offset: u64, data: Bytes) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let size = self.size();
        if offset >= size {
            return Err(errno(libc::EFBIG));
        }
        let room = to_usize((size - offset).min(to_u64(data.len())));
        let data = data.slice(..room);
        if is_aligned(offset) && is_aligned(to_u64(room)) {
            self.device.write(offset, data).await?;
        } else {
            self.write_unaligned(offset, data).await?;
        }
        Ok(room)
    }

    /// Makes every completed write durable.
    pub(crate) async fn flush(&self) -> io::Result<()> {
        self.device.flush().await
    }

    /// Makes `len` bytes at `offset` read as zeros: whole blocks are unmapped,
    /// the partial blocks at the edges are overwritten with zeros. The part of
    /// the range past the end of the device is ignored.
    pub(crate) async fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = offset.saturating_add(len).min(self.size());
        if offset >= end {
            return Ok(());
        }
        let (inner_start, inner_end) = (align_up(offset), align_down(end));
        if inner_start >= inner_end {
            // No whole block inside: at most two partial ones.
            return self.write_zeros(offset, end).await;
        }
        let unmap = self.device.unmap(inner_start, inner_end - inner_start);
        let edges = try_join(
            self.write_zeros(offset, inner_start),
            self.write_zeros(inner_end, end),
        );
        try_join(unmap, edges).await.map(drop)
    }

    async fn write_zeros(&self, start: u64, end: u64) -> io::Result<()> {
        if start >= end {
            return Ok(());
        }
        // Both edges of a discard are shorter than a block; the no-whole-block
        // case spans at most two, which the loop handles a block at a time.
        let mut offset = start;
        while offset < end {
            let chunk = (end - offset).min(BLOCK_SIZE - offset % BLOCK_SIZE);
            let zeros = Bytes::from_static(&ZEROS[..to_usize(chunk)]);
            self.write(offset, zeros).await?;
            offset += chunk;
        }
        Ok(())
    }

    async fn read_blocks(&self, offset: u64, len: u64) -> io::Result<Bytes> {
        let data = self.device.read(offset, to_usize(len)).await?;
        if to_u64(data.len()) != len {
            tracing::error!(
                offset,
                len,
                got = data.len(),
                "block device returned a short read"
            );
            return Err(errno(libc::EIO));
        }
        Ok(data)
    }

    /// The whole blocks inside the range go straight to the device; the one or
    /// two partial blocks at its edges are read, patched and written back
    /// under their stripe locks so that two unaligned writes sharing a block
    /// cannot both read the old block and lose one update.
    ///
    /// Aligned writes take no lock: the loop device sends nothing else and
    /// must not pay for this. So an aligned write racing an unaligned one on
    /// the same block can be undone by the patch's older copy of the block;
    /// only someone mixing both kinds on the FUSE file at once can see that.
    async fn write_unaligned(&self, offset: u64, data: Bytes) -> io::Result<()> {
        let end = offset + to_u64(data.len());
        let (inner_start, inner_end) = (align_up(offset), align_down(end));
        let middle = async {
            if inner_start < inner_end {
                let inner =
                    data.slice(to_usize(inner_start - offset)..to_usize(inner_end - offset));
                self.device.write(inner_start, inner).await
            } else {
                Ok(())
            }
        };
        let mut edges = Vec::with_capacity(2);
        if !is_aligned(offset) {
            edges.push(align_down(offset));
        }
        if !is_aligned(end) && edges.last() != Some(&align_down(end)) {
            edges.push(align_down(end));
        }
        let patch_edges = async {
            let _locks = self.lock_blocks(&edges).await;
            let patches = edges
                .iter()
                .map(|&block| self.patch_block(block, offset, &data));
            try_join_all(patches).await
        };
        try_join(middle, patch_edges).await.map(drop)
    }

    /// Writes the part of `data` (which starts at `offset`) that falls into the
    /// block at `block`, keeping the rest of that block.
    async fn patch_block(&self, block: u64, offset: u64, data: &Bytes) -> io::Result<()> {
        let old = self.read_blocks(block, BLOCK_SIZE).await?;
        let from = offset.max(block);
        let to = (offset + to_u64(data.len())).min(block + BLOCK_SIZE);
        let mut new = BytesMut::from(&old[..]);
        new[to_usize(from - block)..to_usize(to - block)]
            .copy_from_slice(&data[to_usize(from - offset)..to_usize(to - offset)]);
        self.device.write(block, new.freeze()).await
    }

    /// Locks the stripes of `blocks` (at most two), in stripe order so that
    /// two writers never wait on each other crosswise.
    async fn lock_blocks(&self, blocks: &[u64]) -> Vec<MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = blocks
            .iter()
            .map(|block| to_usize(block / BLOCK_SIZE % RMW_STRIPES))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            guards.push(self.rmw_locks[stripe].lock().await);
        }
        guards
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Blocks in memory; counts requests that break the alignment contract.
    struct Blocks {
        data: StdMutex<Vec<u8>>,
        misaligned: AtomicUsize,
        unmapped: AtomicUsize,
    }

    impl Blocks {
        fn new(blocks: usize) -> Arc<Self> {
            let data = (0..blocks * BLOCK_SIZE as usize)
                .map(|i| (i % 251) as u8)
                .collect();
            Arc::new(Blocks {
                data: StdMutex::new(data),
                misaligned: AtomicUsize::new(0),
                unmapped: AtomicUsize::new(0),
            })
        }

        fn check(&self, offset: u64, len: u64) -> io::Result<()> {
            if is_aligned(offset) && is_aligned(len) {
                Ok(())
            } else {
                self.misaligned.fetch_add(1, Ordering::SeqCst);
                Err(errno(libc::EINVAL))
            }
        }

        fn contents(&self) -> Vec<u8> {
            self.data.lock().unwrap().clone()
        }
    }

    impl BlockDevice for Blocks {
        fn size(&self) -> u64 {
            self.data.lock().unwrap().len() as u64
        }

        async fn read(&self, offset: u64, len: usize) -> io::Result<Bytes> {
            self.check(offset, len as u64)?;
            tokio::task::yield_now().await;
            let data = self.data.lock().unwrap();
            Ok(Bytes::copy_from_slice(
                &data[offset as usize..offset as usize + len],
            ))
        }

        async fn write(&self, offset: u64, bytes: Bytes) -> io::Result<()> {
            self.check(offset, bytes.len() as u64)?;
            tokio::task::yield_now().await;
            let mut data = self.data.lock().unwrap();
            data[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
            Ok(())
        }

        async fn flush(&self) -> io::Result<()> {
            Ok(())
        }

        async fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
            self.check(offset, len)?;
            self.unmapped.fetch_add(1, Ordering::SeqCst);
            let mut data = self.data.lock().unwrap();
            data[offset as usize..(offset + len) as usize].fill(0);
            Ok(())
        }
    }

    fn pattern(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
            .collect()
    }

    #[tokio::test]
    async fn unaligned_reads_and_writes_match_a_plain_buffer() {
        let blocks = Blocks::new(8);
        let io = AlignedIo::new(blocks.clone());
        let mut expected = blocks.contents();
        let cases = [
            (0, 10),
            (100, 512),
            (4000, 200),
            (4096, 4096),
            (5000, 9000),
            (1, 32766),
        ];
        for (i, &(offset, len)) in cases.iter().enumerate() {
            let data = pattern(len, i as u8);
            assert_eq!(io.write(offset, data.clone()).await.unwrap(), len);
            expected[offset as usize..offset as usize + len].copy_from_slice(&data);
            assert_eq!(blocks.contents(), expected, "after write {offset}+{len}");
            let back = io.read(offset, len).await.unwrap();
            assert_eq!(back, data, "read {offset}+{len}");
        }
        assert_eq!(blocks.misaligned.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn reads_clamp_and_writes_stop_at_the_end() {
        let blocks = Blocks::new(2);
        let io = AlignedIo::new(blocks.clone());
        let size = io.size();
        assert_eq!(io.read(size - 10, 100).await.unwrap().len(), 10);
        assert!(io.read(size, 100).await.unwrap().is_empty());
        assert_eq!(io.write(size - 10, pattern(100, 1)).await.unwrap(), 10);
        let err = io.write(size, pattern(1, 1)).await.unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFBIG));
        assert_eq!(blocks.misaligned.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn discard_unmaps_whole_blocks_and_zeroes_the_edges() {
        let blocks = Blocks::new(8);
        let io = AlignedIo::new(blocks.clone());
        let mut expected = blocks.contents();
        for (offset, len) in [(100u64, 3 * BLOCK_SIZE), (20_000, 50), (12_000, 100_000)] {
            io.discard(offset, len).await.unwrap();
            let end = (offset + len).min(expected.len() as u64) as usize;
            expected[offset as usize..end].fill(0);
            assert_eq!(blocks.contents(), expected, "after discard {offset}+{len}");
        }
        assert_eq!(blocks.unmapped.load(Ordering::SeqCst), 2);
        assert_eq!(blocks.misaligned.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writes_sharing_blocks_lose_nothing() {
        let blocks = Blocks::new(16);
        let io = Arc::new(AlignedIo::new(blocks.clone()));
        // 100-byte pieces packed back to back: most blocks are shared by
        // several pieces written by different tasks at the same time.
        let pieces: Vec<(u64, Bytes)> = (0..600)
            .map(|i| (7 + i * 100, pattern(100, i as u8)))
            .collect();
        let tasks = pieces.iter().cloned().map(|(offset, data)| {
            let io = io.clone();
            tokio::spawn(async move { io.write(offset, data).await })
        });
        for result in futures::future::join_all(tasks).await {
            assert_eq!(result.unwrap().unwrap(), 100);
        }
        let contents = blocks.contents();
        for (offset, data) in &pieces {
            let at = *offset as usize;
            assert_eq!(&contents[at..at + 100], &data[..], "piece at {offset}");
        }
    }
}
