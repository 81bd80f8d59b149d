//! The engine's I/O statistics, kept on the I/O path: per kind of op (read,
//! write, flush, unmap) the ops, bytes and errors, and for read, write and
//! flush a latency histogram with fixed buckets. Each op costs two clock
//! reads (unmap none) and a few relaxed atomic adds: no lock, no allocation. They count
//! from the engine's start, so a restarted engine starts from 0 (Prometheus
//! takes that as a counter reset).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::protocol::control::{EngineMetrics, IoOpStats, LatencyHistogram};

/// The latency buckets' upper bounds in nanoseconds, 25 us to 10 s; each is
/// inclusive, as Prometheus's `le`. One more bucket, +Inf, takes the rest.
const LATENCY_BOUNDS_NS: [u64; 18] = [
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

const BUCKETS: usize = LATENCY_BOUNDS_NS.len() + 1;

/// Latencies by bucket. Each bucket counts only its own observations: one
/// add per observation; the snapshot accumulates them.
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    /// Wraps after 584 years of summed latency: a counter reset to Prometheus.
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, latency: Duration) {
        // Saturates after 584 years.
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// The counts as Prometheus has them: cumulative per upper bound, the
    /// last (+Inf) being the count. The count is summed from the buckets
    /// read, so the two always agree, even while I/O runs.
    fn snapshot(&self) -> LatencyHistogram {
        let mut total = 0;
        let cumulative_counts = self
            .buckets
            .iter()
            .map(|bucket| {
                total += bucket.load(Relaxed);
                total
            })
            .collect();
        LatencyHistogram {
            bounds_ns: LATENCY_BOUNDS_NS.to_vec(),
            cumulative_counts,
            count: total,
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }
}

/// The bucket of a latency: the first whose bound is at least `ns`, else
/// +Inf.
fn bucket(ns: u64) -> usize {
    LATENCY_BOUNDS_NS.partition_point(|&bound| bound < ns)
}

/// One kind of op.
#[derive(Default)]
pub struct OpStats {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency: Option<Histogram>,
}

impl OpStats {
    fn timed() -> Self {
        Self {
            latency: Some(Histogram::default()),
            ..Self::default()
        }
    }

    /// Runs `op` and records it: every op counts, its `bytes` only if it
    /// succeeds, an error if it fails, and its latency (the time `op`
    /// takes, from the first poll) for kinds that keep a histogram.
    pub async fn measure<T>(
        &self,
        bytes: u64,
        op: impl Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        let started = self.latency.is_some().then(Instant::now);
        let result = op.await;
        if let (Some(histogram), Some(started)) = (&self.latency, started) {
            histogram.observe(started.elapsed());
        }
        self.count(bytes, result.is_ok());
        result
    }

    fn count(&self, bytes: u64, ok: bool) {
        self.ops.fetch_add(1, Relaxed);
        if ok {
            self.bytes.fetch_add(bytes, Relaxed);
        } else {
            self.errors.fetch_add(1, Relaxed);
        }
    }

    fn snapshot(&self) -> IoOpStats {
        IoOpStats {
            ops: self.ops.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            latency: self.latency.as_ref().map(Histogram::snapshot),
        }
    }
}

/// The engine's I/O as its frontend sees it, and what its rebuilds copied.
pub struct IoStats {
    pub read: OpStats,
    pub write: OpStats,
    pub flush: OpStats,
    pub unmap: OpStats,
    pub rebuild_copied: AtomicU64,
    pub repair: RepairStats,
}

/// What read repair found and did, in bytes (`repair.rs`).
#[derive(Default)]
pub struct RepairStats {
    pub checksum_failed: AtomicU64,
    pub repaired: AtomicU64,
    pub unrecoverable: AtomicU64,
}

impl Default for IoStats {
    fn default() -> Self {
        Self {
            read: OpStats::timed(),
            write: OpStats::timed(),
            flush: OpStats::timed(),
            unmap: OpStats::default(),
            rebuild_copied: AtomicU64::new(0),
            repair: RepairStats::default(),
        }
    }
}

impl IoStats {
    /// Each counter as it is now; counters are read one by one, so an op
    /// completing meanwhile may show in some and not yet in others.
    pub fn snapshot(&self) -> EngineMetrics {
        EngineMetrics {
            read: Some(self.read.snapshot()),
            write: Some(self.write.snapshot()),
            flush: Some(self.flush.snapshot()),
            unmap: Some(self.unmap.snapshot()),
            rebuild_bytes_copied: self.rebuild_copied.load(Relaxed),
            checksum_failed_bytes: self.repair.checksum_failed.load(Relaxed),
            repaired_bytes: self.repair.repaired.load(Relaxed),
            unrecoverable_bytes: self.repair.unrecoverable.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    fn observed(latencies_ns: &[u64]) -> LatencyHistogram {
        let histogram = Histogram::default();
        for &ns in latencies_ns {
            histogram.observe(Duration::from_nanos(ns));
        }
        histogram.snapshot()
    }

    #[test]
    fn an_observation_equal_to_a_bound_falls_in_that_bounds_bucket() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(25 * US), 0);
        assert_eq!(bucket(25 * US + 1), 1);
        assert_eq!(bucket(50 * US), 1);
        for (i, &bound) in LATENCY_BOUNDS_NS.iter().enumerate() {
            assert_eq!(bucket(bound), i, "{bound} ns");
            assert_eq!(bucket(bound + 1), i + 1, "{bound} ns + 1");
        }
        assert_eq!(bucket(10_000_000_000), BUCKETS - 2);
        assert_eq!(bucket(10_000_000_001), BUCKETS - 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn bounds_rise_from_25_us_to_10_s() {
        assert!(LATENCY_BOUNDS_NS.is_sorted_by(|a, b| a < b));
        assert_eq!(LATENCY_BOUNDS_NS[0], 25 * US);
        assert_eq!(LATENCY_BOUNDS_NS[BUCKETS - 2], 10_000_000_000);
    }

    #[test]
    fn the_snapshot_is_cumulative_with_the_count_last() {
        // Two at 25 us, one at 1 ms, one past 10 s.
        let snapshot = observed(&[10 * US, 25 * US, 1_000 * US, 11_000_000_000]);
        let mut expected = vec![2; 5];
        expected.extend([3; 13]);
        expected.push(4);
        assert_eq!(snapshot.cumulative_counts, expected);
        assert_eq!(snapshot.bounds_ns, LATENCY_BOUNDS_NS);
        assert_eq!(snapshot.count, 4);
        assert_eq!(
            snapshot.sum_ns,
            10 * US + 25 * US + 1_000 * US + 11_000_000_000
        );
    }

    #[test]
    fn an_empty_histogram_has_zero_everywhere() {
        let snapshot = observed(&[]);
        assert_eq!(snapshot.cumulative_counts, [0; BUCKETS]);
        assert_eq!((snapshot.count, snapshot.sum_ns), (0, 0));
    }

    #[tokio::test]
    async fn ops_count_bytes_on_success_and_errors_on_failure() {
        let stats = IoStats::default();
        stats.write.measure(4096, async { Ok(()) }).await.unwrap();
        stats.write.measure(8192, async { Ok(()) }).await.unwrap();
        let failed = stats
            .write
            .measure(4096, async { Err::<(), _>(io::Error::other("EIO")) })
            .await;
        assert!(failed.is_err());
        stats
            .unmap
            .measure(1 << 20, async { Ok(()) })
            .await
            .unwrap();
        let metrics = stats.snapshot();
        let write = metrics.write.unwrap();
        assert_eq!((write.ops, write.bytes, write.errors), (3, 12288, 1));
        let latency = write.latency.unwrap();
        assert_eq!(latency.count, 3);
        assert_eq!(latency.cumulative_counts.last(), Some(&3));
        let unmap = metrics.unmap.unwrap();
        assert_eq!((unmap.ops, unmap.bytes, unmap.errors), (1, 1 << 20, 0));
        assert!(unmap.latency.is_none());
        let read = metrics.read.unwrap();
        assert_eq!((read.ops, read.bytes, read.errors), (0, 0, 0));
        assert_eq!(read.latency.unwrap().count, 0);
    }
}
