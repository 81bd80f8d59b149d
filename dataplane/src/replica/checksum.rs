//! A layer's block checksums: the CRC-32C of each 4 KiB block it holds,
//! stored as 4 little-endian bytes at offset `4 * block` of `<layer>.crc`, a
//! sparse file beside the layer's data (1/1024 of the data it covers).
//!
//! CRC-32C because the CPU computes it (SSE 4.2, ARMv8 CRC): tens of GB/s,
//! against a few for xxh3 at 64 bits, and 32 bits detect every burst error
//! up to 32 bits and all but 2^-32 of the rest, which is what a rotten
//! sector or a misdirected write looks like. Only blocks the layer holds are
//! ever checked; the sums of holes are whatever was last written there. So
//! a recorded sum says the layer holds the block, or held it until an
//! unmap: what a layer file cut short lost is told by them (`Layer::open`),
//! erring towards calling a block lost.
//!
//! Which sums can be trusted after a crash is `intent.rs`'s business.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::BLOCK_SIZE;
use super::dir::ReplicaDir;
use super::error::{Result, StorageError};
use super::extents::ExtentSet;
use super::naming::checksum_file;

const SUM_BYTES: u64 = 4;
const BS: usize = BLOCK_SIZE as usize;

/// The checksums of one layer.
#[derive(Debug)]
pub struct Checksums {
    file: File,
    path: PathBuf,
}

/// The checksum of every block of `data` (whole blocks), in file format.
fn sums_of(data: &[u8]) -> Vec<u8> {
    data.chunks(BS)
        .flat_map(|block| crc32c::crc32c(block).to_le_bytes())
        .collect()
}

/// Reads as much of `buf` as the file holds at `offset`; the rest, past its
/// end, reads as zeros (a truncated file), which no written block's sum or
/// data matches unless it was all zeros anyway.
pub fn read_or_zeros(file: &File, path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StorageError::io(path, e)),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

impl Checksums {
    /// Creates the empty checksum file of layer `layer_file`, replacing any
    /// left over.
    pub fn create(dir: &ReplicaDir, layer_file: &str) -> Result<Self> {
        let name = checksum_file(layer_file);
        dir.remove_if_exists(&name)?;
        Self::open_file(dir.join(&name), true)
    }

    /// Opens the checksum file of layer `layer_file`; a missing one is
    /// [`StorageError::MissingFile`].
    pub fn open(dir: &ReplicaDir, layer_file: &str) -> Result<Self> {
        Self::open_file(dir.join(&checksum_file(layer_file)), false)
    }

    fn open_file(path: PathBuf, create: bool) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create)
            .open(&path)
            .map_err(|e| StorageError::io(&path, e))?;
        Ok(Self { file, path })
    }

    /// The file's new path after the layer was linked under a new name.
    pub fn rename(&mut self, dir: &ReplicaDir, layer_file: &str) {
        self.path = dir.join(&checksum_file(layer_file));
    }

    /// Records the checksums of `data`, whole blocks starting at block
    /// `start`.
    pub fn store(&self, start: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(&sums_of(data), start * SUM_BYTES)
            .map_err(|e| StorageError::io(&self.path, e))
    }

    /// Adds to `bad` the blocks of `data` (whole blocks starting at block
    /// `start`) whose content does not match their recorded checksum.
    pub fn verify(&self, start: u64, data: &[u8], bad: &mut ExtentSet) -> Result<()> {
        let mut stored = vec![0u8; data.len() / BS * SUM_BYTES as usize];
        read_or_zeros(&self.file, &self.path, start * SUM_BYTES, &mut stored)?;
        let computed = sums_of(data);
        for (i, (want, got)) in stored
            .chunks(SUM_BYTES as usize)
            .zip(computed.chunks(SUM_BYTES as usize))
            .enumerate()
        {
            if want != got {
                let block = start + i as u64;
                bad.insert(block, block + 1);
            }
        }
        Ok(())
    }

    /// The blocks of `[start, end)` that have a checksum recorded: those
    /// the layer holds or held before an unmap (a block whose sum happens
    /// to be 0, one in 2^32, looks never written).
    pub fn recorded(&self, start: u64, end: u64) -> Result<ExtentSet> {
        const PER_READ: u64 = 1 << 16;
        let mut found = ExtentSet::new();
        let mut buf = vec![0u8; (PER_READ * SUM_BYTES) as usize];
        let mut at = start;
        while at < end {
            let n = PER_READ.min(end - at);
            let sums = &mut buf[..(n * SUM_BYTES) as usize];
            read_or_zeros(&self.file, &self.path, at * SUM_BYTES, sums)?;
            for (i, sum) in sums.chunks(SUM_BYTES as usize).enumerate() {
                if sum.iter().any(|&b| b != 0) {
                    let block = at + i as u64;
                    found.insert(block, block + 1);
                }
            }
            at += n;
        }
        Ok(found)
    }

    /// Makes recorded checksums durable.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| StorageError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_or_a_lost_sum_is_caught_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let sums = Checksums::create(&dir, "head-1.img").unwrap();
        let mut data: Vec<u8> = (0..4 * BS).map(|i| (i % 251) as u8).collect();
        sums.store(10, &data).unwrap();
        let mut bad = ExtentSet::new();
        sums.verify(10, &data, &mut bad).unwrap();
        assert!(bad.is_empty());

        data[BS + 7] ^= 0x10;
        data[3 * BS..].fill(0);
        sums.verify(10, &data, &mut bad).unwrap();
        assert_eq!(bad.iter().collect::<Vec<_>>(), [(11, 12), (13, 14)]);

        // Past the end of the file, sums read as zeros: a block stored
        // nowhere fails, whatever its content.
        let mut beyond = ExtentSet::new();
        sums.verify(100, &data[..BS], &mut beyond).unwrap();
        assert_eq!(beyond.iter().collect::<Vec<_>>(), [(100, 101)]);
        let reopened = Checksums::open(&dir, "head-1.img").unwrap();
        let mut none = ExtentSet::new();
        reopened
            .verify(12, &data[2 * BS..3 * BS], &mut none)
            .unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn a_missing_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ReplicaDir::lock(tmp.path()).unwrap();
        let err = Checksums::open(&dir, "snap-a.img").unwrap_err();
        assert!(
            matches!(err, StorageError::MissingFile { ref path } if *path == dir.join("snap-a.img.crc")),
            "{err}"
        );
    }
}
