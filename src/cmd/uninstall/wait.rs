//! How long an uninstall waits for what it deleted to go: one deadline for
//! every step.

use std::time::{Duration, Instant};

use tracing::info;

use super::UninstallError;

const POLL: Duration = Duration::from_secs(2);

/// One deadline for all the steps.
pub(super) struct Wait {
    started: Instant,
    limit: Duration,
}

impl Wait {
    pub(super) fn new(limit: Duration) -> Self {
        Self {
            started: Instant::now(),
            limit,
        }
    }

    /// Polls `left` until it lists nothing, logging what remains now and
    /// then; past the deadline, an error listing it.
    pub(super) async fn until<F, Fut>(&self, what: &str, mut left: F) -> Result<(), UninstallError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Vec<String>, UninstallError>>,
    {
        let mut polls = 0u32;
        loop {
            let remaining = left().await?;
            if remaining.is_empty() {
                info!(step = what, "done");
                return Ok(());
            }
            if self.started.elapsed() > self.limit {
                return Err(UninstallError::Timeout {
                    after: self.limit,
                    left: format!("waiting for {what}: {}", remaining.join(", ")),
                });
            }
            if polls.is_multiple_of(10) {
                info!(step = what, left = %remaining.join(", "), "waiting");
            }
            polls += 1;
            tokio::time::sleep(POLL).await;
        }
    }
}
