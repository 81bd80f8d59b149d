//! Group commit for a replica's flushes: a flush syncs only if a change
//! completed since the last sync began, and flushes that arrive while one
//! syncs share the next sync rather than pay one each. A database that
//! commits from several connections at once, or a filesystem's journal
//! and its fsyncs, issue many flushes a second; each sync is an
//! `fdatasync` that waits for the disk.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::Result;
use super::lock;

#[derive(Debug)]
pub struct GroupCommit {
    /// Changes (writes, repairs, unmaps) completed so far.
    changes: AtomicU64,
    /// How many of `changes` the last successful sync covered. Held while
    /// syncing, so that flushes take turns.
    synced: Mutex<u64>,
}

impl Default for GroupCommit {
    /// One change not yet synced: a process that ran before this one (and
    /// crashed) may have left writes in the page cache, which the first
    /// flush must make durable too.
    fn default() -> Self {
        Self {
            changes: AtomicU64::new(1),
            synced: Mutex::new(0),
        }
    }
}

impl GroupCommit {
    /// Counts a change, once its data is written: a flush that counts it
    /// syncs after it.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Runs `sync` unless every change completed before this call is
    /// already covered by a sync that began after it completed. A failed
    /// sync covers nothing: the next flush syncs again.
    pub fn flush(&self, sync: impl FnOnce() -> Result<()>) -> Result<()> {
        let wanted = self.changes.load(Ordering::Acquire);
        let mut synced = lock::mutex(&self.synced)?;
        if *synced >= wanted {
            return Ok(());
        }
        // Changes counted by now completed before the sync begins.
        let covered = self.changes.load(Ordering::Acquire);
        sync()?;
        *synced = covered;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::thread;

    use super::*;
    use crate::replica::StorageError;

    #[test]
    fn a_flush_with_nothing_new_does_not_sync_and_a_failed_sync_is_retried() {
        let commit = GroupCommit::default();
        let syncs = AtomicUsize::new(0);
        let count = || {
            syncs.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        commit.flush(count).unwrap();
        commit.flush(count).unwrap();
        assert_eq!(
            syncs.load(Ordering::Relaxed),
            1,
            "only the first syncs: a crash before may have left writes"
        );
        commit.changed();
        commit.flush(count).unwrap();
        commit.flush(count).unwrap();
        assert_eq!(syncs.load(Ordering::Relaxed), 2);
        commit.changed();
        let failed = commit.flush(|| Err(StorageError::Poisoned));
        assert!(failed.is_err());
        commit.flush(count).unwrap();
        assert_eq!(
            syncs.load(Ordering::Relaxed),
            3,
            "the failed sync covered nothing"
        );
    }

    /// Writers each mark a write done, then flush; a sync makes durable
    /// what is done when it begins. Every flush must return with its own
    /// write durable, however the flushes interleave and share syncs.
    #[test]
    fn every_flush_returns_with_the_writes_before_it_durable() {
        const WRITERS: usize = 8;
        const ROUNDS: usize = 200;
        let commit = Arc::new(GroupCommit::default());
        let done = Arc::new(Mutex::new(vec![0usize; WRITERS]));
        let durable = Arc::new(Mutex::new(vec![0usize; WRITERS]));
        let syncs = Arc::new(AtomicUsize::new(0));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (commit, done, durable, syncs) =
                    (commit.clone(), done.clone(), durable.clone(), syncs.clone());
                thread::spawn(move || {
                    for round in 1..=ROUNDS {
                        done.lock().unwrap()[w] = round;
                        commit.changed();
                        commit
                            .flush(|| {
                                let now = done.lock().unwrap().clone();
                                thread::yield_now();
                                *durable.lock().unwrap() = now;
                                syncs.fetch_add(1, Ordering::Relaxed);
                                Ok(())
                            })
                            .unwrap();
                        assert!(
                            durable.lock().unwrap()[w] >= round,
                            "writer {w} round {round}"
                        );
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        assert!(syncs.load(Ordering::Relaxed) <= WRITERS * ROUNDS);
    }
}
