//! The revision counter: bumped in memory on every write or unmap, written
//! to its file after each flush's sync. On start the engine makes the
//! replicas with the highest value RW and rebuilds the others from them.
//!
//! The file never counts writes that are not on disk: a value is written
//! only after the data it counts was synced. It may count fewer: a flush
//! writes the record but does not sync it, a third `fdatasync` on every
//! flush (the data's is the one a flush promises); the kernel writes it
//! back within about half a minute (its dirty expiry), a clean stop syncs
//! it, and a process that dies leaves it in the page cache. Only a power
//! loss can leave it behind, by the writes of that last half minute, which
//! is safe: the engine compares the counters only of replicas of the
//! newest I/O path (`engine/io_path.rs`), and every one of those holds
//! every write a completed flush covered, so whichever it keeps, no write a
//! flush made durable is lost (after an unclean stop it keeps only one
//! anyway); a salvage ranks replicas by their records of the I/O path
//! before their counters.
//!
//! `revision.counter` holds one fixed-size record, 20 decimal digits and a
//! newline, rewritten in place. The record is far smaller than a disk
//! sector, and sector writes are atomic, so a crash leaves the old or the
//! new value; in-place rewriting avoids a rename and two fsyncs.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::dir::ReplicaDir;
use super::error::{Result, StorageError};
use super::lock;
use super::naming::REVISION_FILE;

const DIGITS: usize = 20;

#[derive(Debug)]
pub struct RevisionCounter {
    path: PathBuf,
    file: File,
    current: AtomicU64,
    /// The last value written to the file. The mutex also orders
    /// concurrent flushes, so a slow flush cannot write an older value over
    /// a newer.
    written: Mutex<u64>,
}

fn record(value: u64) -> String {
    format!("{value:0DIGITS$}\n")
}

impl RevisionCounter {
    pub fn create(dir: &ReplicaDir) -> Result<Self> {
        dir.write_atomic(REVISION_FILE, record(0).as_bytes())?;
        Self::open(dir)
    }

    pub fn open(dir: &ReplicaDir) -> Result<Self> {
        let path = dir.join(REVISION_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| StorageError::io(&path, e))?;
        let mut buf = [0u8; DIGITS + 2];
        let len = file
            .read_at(&mut buf, 0)
            .map_err(|e| StorageError::io(&path, e))?;
        let value = parse(&buf[..len]).ok_or_else(|| {
            StorageError::corrupt(
                &path,
                format!(
                    "expected {DIGITS} digits and a newline, found {:?}",
                    String::from_utf8_lossy(&buf[..len])
                ),
            )
        })?;
        Ok(Self {
            path,
            file,
            current: AtomicU64::new(value),
            written: Mutex::new(value),
        })
    }

    /// Counts one more write batch.
    pub fn bump(&self) {
        self.current.fetch_add(1, Ordering::AcqRel);
    }

    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }

    /// Sets the counter to `value` and makes it durable, even if lower: a
    /// rebuilt replica takes its source's counter while I/O is quiesced.
    pub fn persist_exact(&self, value: u64) -> Result<()> {
        let mut written = lock::mutex(&self.written)?;
        self.write(value)?;
        *written = value;
        self.sync()?;
        self.current.store(value, Ordering::Release);
        Ok(())
    }

    /// Writes `value` to the file, unless a value at least as new is
    /// there, without waiting for the disk. Callers read `current()` before
    /// syncing the data it counts, so the file never counts writes that are
    /// not on disk.
    pub fn note(&self, value: u64) -> Result<()> {
        let mut written = lock::mutex(&self.written)?;
        if value > *written {
            self.write(value)?;
            *written = value;
        }
        Ok(())
    }

    /// Notes `value` and makes the file durable (a clean stop).
    pub fn persist(&self, value: u64) -> Result<()> {
        self.note(value)?;
        self.sync()
    }

    fn write(&self, value: u64) -> Result<()> {
        self.file
            .write_all_at(record(value).as_bytes(), 0)
            .map_err(|e| StorageError::io(&self.path, e))
    }

    fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| StorageError::io(&self.path, e))
    }
}

fn parse(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.strip_suffix(b"\n")?;
    if digits.len() != DIGITS || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::replica::testutil::locked;

    #[test]
    fn persists_only_on_request_and_never_backwards() {
        let (_tmp, dir) = locked();
        let counter = RevisionCounter::create(&dir).unwrap();
        counter.bump();
        counter.bump();
        assert_eq!(counter.current(), 2);
        assert_eq!(RevisionCounter::open(&dir).unwrap().current(), 0);
        counter.note(1).unwrap();
        assert_eq!(RevisionCounter::open(&dir).unwrap().current(), 1);
        counter.persist(2).unwrap();
        counter.note(1).unwrap();
        counter.persist(1).unwrap();
        assert_eq!(RevisionCounter::open(&dir).unwrap().current(), 2);
        assert_eq!(
            fs::read_to_string(dir.join(REVISION_FILE)).unwrap(),
            "00000000000000000002\n"
        );
        counter.persist(u64::MAX).unwrap();
        assert_eq!(RevisionCounter::open(&dir).unwrap().current(), u64::MAX);
    }

    #[test]
    fn corrupt_counter_is_named() {
        let (_tmp, dir) = locked();
        let path = dir.join(REVISION_FILE);
        for bad in [
            &b""[..],
            b"12\n",
            b"0000000000000000000x\n",
            b"99999999999999999999\n",
            b"00000000000000000001",
        ] {
            fs::write(&path, bad).unwrap();
            let err = RevisionCounter::open(&dir).unwrap_err();
            assert!(
                matches!(err, StorageError::CorruptMetadata { path: ref p, .. } if *p == path),
                "{err}"
            );
        }
    }
}
