//! Read repair. A replica whose copy of some blocks fails their checksums
//! answers a read with the good part and the rotten ranges; the engine
//! fetches those ranges from the other RW replicas (which check theirs as
//! well), answers the read with good data and writes it back to each
//! replica that had it rotten. With no good copy left, the read fails with
//! EIO: rotten data is never served. A replica that rots is not failed: the
//! rest of its copy is good, and its repaired blocks are too.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::{Bytes, BytesMut};
use tracing::{error, info};

use super::member::{Member, Mode};
use super::{Engine, EngineError, keep_nearest};
use crate::protocol::ConnectionError;

/// Byte ranges (offset, length).
type Ranges = Vec<(u64, u64)>;

impl Engine {
    /// Completes a read of `data.len()` bytes at `offset` that `first`
    /// answered with `data`, good but for `rotten`.
    pub(super) async fn repair_read(
        &self,
        first: &Arc<Member>,
        offset: u64,
        rotten: Ranges,
        data: Bytes,
    ) -> Result<Bytes, EngineError> {
        // Writes overlapping the read in flight finish first and new ones
        // wait: the copy fetched is then the newest, and writing it back
        // overwrites nothing newer.
        let _range = self
            .in_flight
            .lock(offset, offset + data.len() as u64)
            .await;
        let mut buf = BytesMut::from(&data[..]);
        let stats = &self.io_stats.repair;
        stats.checksum_failed.fetch_add(total(&rotten), Relaxed);
        let mut found = vec![(first.clone(), rotten.clone())];
        let mut tried = vec![first.clone()];
        let mut pending = rotten;
        while !pending.is_empty() {
            let Some(member) = self.next_copy(&tried) else {
                stats.unrecoverable.fetch_add(total(&pending), Relaxed);
                error!(volume = %self.volume, ranges = ?pending, "no replica holds a copy of these blocks that passes its checksums: the read fails");
                return Err(EngineError::NoGoodCopy(pending));
            };
            tried.push(member.clone());
            let mut left = Vec::new();
            for (at, len) in pending {
                let start = (at - offset) as usize;
                let slot = start..start + len as usize;
                match member.data.read(at, len as u32).await {
                    Ok(good) => buf[slot].copy_from_slice(&good),
                    Err(ConnectionError::Corrupt { ranges, data, .. }) => {
                        buf[slot].copy_from_slice(&data);
                        stats.checksum_failed.fetch_add(total(&ranges), Relaxed);
                        found.push((member.clone(), ranges.clone()));
                        left.extend(ranges);
                    }
                    Err(error) => {
                        let error = EngineError::from(error);
                        if error.is_callers_fault() {
                            return Err(error);
                        }
                        self.fail(&member, &format!("read: {error}"));
                        left.push((at, len));
                    }
                }
            }
            pending = left;
        }
        let buf = buf.freeze();
        for (member, ranges) in found {
            self.write_back(&member, offset, &ranges, &buf).await;
        }
        Ok(buf)
    }

    /// The next RW replica to read from, not one of `tried`: on this node
    /// first, as reads are.
    fn next_copy(&self, tried: &[Arc<Member>]) -> Option<Arc<Member>> {
        let mut left: Vec<Arc<Member>> = self
            .members_in(&[Mode::ReadWrite])
            .into_iter()
            .filter(|m| !tried.iter().any(|t| Arc::ptr_eq(t, m)))
            .collect();
        keep_nearest(&mut left, |m| m.data.is_local());
        left.into_iter().next()
    }

    /// Writes the good data of `ranges` (within `buf`, the bytes at
    /// `offset`) back to `member`. A replica that cannot take it leaves the
    /// I/O path: it is failing more than its checksums.
    async fn write_back(&self, member: &Arc<Member>, offset: u64, ranges: &Ranges, buf: &Bytes) {
        for &(at, len) in ranges {
            let start = (at - offset) as usize;
            let good = buf.slice(start..start + len as usize);
            if let Err(error) = member.data.repair(at, good).await {
                self.fail(member, &format!("repair: {error}"));
                return;
            }
            self.io_stats.repair.repaired.fetch_add(len, Relaxed);
        }
        info!(volume = %self.volume, replica = %member.address, ?ranges, "repaired blocks that failed their checksums from another replica's copy");
    }
}

/// The bytes `ranges` (offset, length) cover.
pub(super) fn total(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|(_, len)| len).sum()
}
