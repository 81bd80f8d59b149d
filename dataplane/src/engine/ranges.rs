//! The order of overlapping writes.
//!
//! The block layer lets overlapping writes that are in flight together
//! complete in any order, but every replica must apply them in the same
//! order, or the replicas diverge where they overlap. Each replica applies
//! the requests of one connection concurrently, and the engine sends to all
//! replicas at once, so nothing else orders them: a write or discard waits
//! here until every earlier one overlapping it has completed on every
//! replica. Requests that touch different blocks never wait for each other.

use std::sync::Mutex;

use tokio::sync::watch;

/// Byte ranges with a write or discard in flight, in arrival order.
#[derive(Default)]
pub(super) struct RangeLocks {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    held: Vec<Held>,
}

struct Held {
    id: u64,
    start: u64,
    end: u64,
    /// Dropped on release: waiters see their receiver close.
    released: watch::Sender<()>,
}

/// A range taken by [`RangeLocks::lock`]; released on drop, also when the
/// request is cancelled while it waits.
pub(super) struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    id: u64,
}

impl RangeLocks {
    /// Takes `[start, end)` once every earlier request overlapping it is done.
    /// The request is queued at once, so a later overlapping one waits for
    /// it even before it runs: arrival order is kept.
    pub(super) async fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let (id, earlier) = {
            let mut inner = self.inner();
            let earlier: Vec<watch::Receiver<()>> = inner
                .held
                .iter()
                .filter(|h| h.start < end && start < h.end)
                .map(|h| h.released.subscribe())
                .collect();
            let id = inner.next_id;
            inner.next_id += 1;
            let (released, _) = watch::channel(());
            inner.held.push(Held {
                id,
                start,
                end,
                released,
            });
            (id, earlier)
        };
        let guard = RangeGuard { locks: self, id };
        for mut released in earlier {
            // Nothing is ever sent: the channel closes when that request ends.
            let _ = released.changed().await;
        }
        guard
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change below is one push or one remove: never left torn.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.locks.inner().held.retain(|h| h.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn an_overlapping_request_waits_for_the_earlier_one() {
        let locks = RangeLocks::default();
        let first = locks.lock(0, 8192).await;
        assert!(locks.lock(4096, 12288).now_or_never().is_none());
        let apart = locks.lock(8192, 16384).now_or_never();
        assert!(apart.is_some(), "no overlap, no wait");
        drop(first);
        assert!(locks.lock(4096, 8192).now_or_never().is_some());
    }

    #[tokio::test]
    async fn arrival_order_is_kept_for_chained_overlaps() {
        let locks = RangeLocks::default();
        let first = locks.lock(0, 4096).await;
        let mut second = Box::pin(locks.lock(0, 8192));
        assert!(futures::poll!(&mut second).is_pending());
        // The third overlaps only the second, which has not run yet.
        let mut third = Box::pin(locks.lock(4096, 8192));
        assert!(futures::poll!(&mut third).is_pending());
        drop(first);
        assert!(futures::poll!(&mut third).is_pending());
        let second = second.await;
        assert!(futures::poll!(&mut third).is_pending());
        drop(second);
        third.await;
    }

    #[tokio::test]
    async fn a_cancelled_waiter_lets_later_ones_through() {
        let locks = RangeLocks::default();
        let first = locks.lock(0, 4096).await;
        let mut waiting = Box::pin(locks.lock(0, 4096));
        assert!(futures::poll!(&mut waiting).is_pending());
        drop(waiting);
        drop(first);
        assert!(locks.lock(0, 4096).now_or_never().is_some());
        assert!(locks.inner().held.is_empty());
    }
}
