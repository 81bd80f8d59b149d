//! Bandwidth limits for background jobs.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Spaces out chunks of work (a rebuild's copies, a scrub's checks) so that
/// they average at most `rate` bytes per second. The first goes at once;
/// each one after starts when the bytes before it are paid for, so a
/// limited job never bursts.
pub(crate) struct Pace {
    /// Bytes per second; 0: no limit.
    rate: u64,
    /// When the next copy may start.
    next: Mutex<Instant>,
}

impl Pace {
    pub fn new(rate: u64) -> Self {
        Self {
            rate,
            next: Mutex::new(Instant::now()),
        }
    }

    /// Waits for the turn of a chunk of `bytes` bytes.
    pub async fn take(&self, bytes: u64) {
        if self.rate == 0 {
            return;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / self.rate as f64);
        let start = {
            // Poisoned only by a panic while adding two instants.
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*next).max(Instant::now());
            *next = start + cost;
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies start no faster than the limit pays for: ten 2 MiB chunks at
    /// 10 MiB/s, the first at once and each next 0.2 s later, whatever
    /// order they ask in (on the paused test clock, so exact).
    #[tokio::test(start_paused = true)]
    async fn copies_are_spaced_to_the_limit() {
        let pace = Pace::new(10 << 20);
        let begin = Instant::now();
        let starts = futures::future::join_all((0..10).map(|_| async {
            pace.take(2 << 20).await;
            begin.elapsed()
        }))
        .await;
        let mut starts: Vec<u128> = starts.iter().map(|d| d.as_millis()).collect();
        starts.sort_unstable();
        assert_eq!(
            starts,
            [0, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 1800]
        );
    }

    /// Without a limit nothing waits; a chunk with nothing to copy costs
    /// nothing either.
    #[tokio::test(start_paused = true)]
    async fn no_limit_and_empty_chunks_never_wait() {
        let begin = Instant::now();
        let unlimited = Pace::new(0);
        let limited = Pace::new(1 << 20);
        for _ in 0..100 {
            unlimited.take(2 << 20).await;
            limited.take(0).await;
        }
        assert_eq!(begin.elapsed(), Duration::ZERO);
    }

    /// Time spent idle is not saved up for a burst: after a pause the next
    /// copies are spaced again.
    #[tokio::test(start_paused = true)]
    async fn an_idle_spell_earns_no_burst() {
        let pace = Pace::new(10 << 20);
        pace.take(2 << 20).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let begin = Instant::now();
        pace.take(2 << 20).await;
        pace.take(2 << 20).await;
        assert_eq!(begin.elapsed().as_millis(), 200);
    }
}
