//! The engine controller's part of data integrity (docs/integrity.md):
//! starting a scrub when the scrub-interval Setting says one is due,
//! reporting scrubs and read repair in the Engine's status, and telling the
//! volume's users, with Events on the Volume, when their data was found
//! rotten, repaired, or lost.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::Context;
use crate::protocol::control::{EngineMetrics, ScrubStatus};
use crate::types::{Engine, ReadRepair, ScrubReport};

const CHECKSUM_REPAIRED: &str = "ChecksumRepaired";
const DATA_UNRECOVERABLE: &str = "DataUnrecoverable";
const SCRUB_DONE: &str = "ScrubDone";
const SCRUB_FOUND_DAMAGE: &str = "ScrubFoundDamage";

fn seconds(time: &Time) -> i64 {
    time.0.as_second()
}

fn time(unix: i64) -> Option<Time> {
    (unix > 0)
        .then(|| jiff::Timestamp::from_second(unix).ok().map(Time))
        .flatten()
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn count(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The engine's scrub as the Engine's status shows it; none before its
/// first.
pub(super) fn report(scrub: Option<&ScrubStatus>) -> Option<ScrubReport> {
    let scrub = scrub.filter(|s| s.started_unix > 0)?;
    Some(ScrubReport {
        running: scrub.running,
        started: time(scrub.started_unix),
        finished: time(scrub.finished_unix),
        checked_bytes: count(scrub.checked_bytes),
        rotten_bytes: count(scrub.rotten_bytes),
        repaired_bytes: count(scrub.repaired_bytes),
        unrepaired_bytes: count(scrub.unrepaired_bytes),
        mismatched_chunks: count(scrub.mismatched_chunks),
        resolved_chunks: count(scrub.resolved_chunks),
        error: scrub.error.clone(),
    })
}

pub(super) fn read_repair(metrics: &EngineMetrics) -> ReadRepair {
    ReadRepair {
        checksum_failed_bytes: count(metrics.checksum_failed_bytes),
        repaired_bytes: count(metrics.repaired_bytes),
        unrecoverable_bytes: count(metrics.unrecoverable_bytes),
    }
}

/// Whether a scrub is due at `now` (seconds): `interval` (zero: never) has
/// passed since the latest of `starts` (the last scrubs' starts, the
/// volume's creation), and none runs.
pub(super) fn scrub_due(interval: Duration, now: i64, running: bool, starts: &[i64]) -> bool {
    if interval.is_zero() || running {
        return false;
    }
    let last = starts.iter().copied().max().unwrap_or(0);
    let interval = i64::try_from(interval.as_secs()).unwrap_or(i64::MAX);
    now.saturating_sub(last) >= interval
}

/// Whether `engine`'s volume is due a scrub, as `scrub` (the running
/// engine's) and the Volume's last one say.
pub(super) fn due(ctx: &Context, engine: &Engine, scrub: Option<&ScrubStatus>) -> bool {
    let Some(volume) = ctx.ds.volumes.get(&engine.spec.instance.volume_name) else {
        return false;
    };
    let running = scrub.is_some_and(|s| s.running);
    let mut starts: Vec<i64> = scrub.map(|s| s.started_unix).into_iter().collect();
    let last = volume.status.as_ref().and_then(|s| s.last_scrub.as_ref());
    starts.extend(last.and_then(|s| s.started.as_ref()).map(seconds));
    starts.extend(volume.metadata.creation_timestamp.as_ref().map(seconds));
    scrub_due(ctx.settings().scrub_interval, now(), running, &starts)
}

/// Events on the Volume for what the engine found since the last poll:
/// blocks read repair rewrote or could not, a scrub that ended.
pub(super) async fn announce(
    ctx: &Context,
    engine: &Engine,
    before: Option<&crate::types::EngineStatus>,
    after: &crate::types::EngineStatus,
) {
    let Some(volume) = ctx.ds.volumes.get(&engine.spec.instance.volume_name) else {
        return;
    };
    for (type_, reason, note) in findings(before, after) {
        match type_ {
            EventType::Warning => warn!(reason, note, "volume data integrity"),
            EventType::Normal => info!(reason, note, "volume data integrity"),
        }
        ctx.event(&*volume, type_, reason, note).await;
    }
}

/// What changed between two statuses of an engine that users should hear
/// of. Counters that went down belong to a restarted engine: nothing new.
fn findings(
    before: Option<&crate::types::EngineStatus>,
    after: &crate::types::EngineStatus,
) -> Vec<(EventType, &'static str, String)> {
    let mut found = Vec::new();
    let old = before.map(|s| s.read_repair.clone()).unwrap_or_default();
    let new = &after.read_repair;
    if new.repaired_bytes > old.repaired_bytes {
        found.push((
            EventType::Warning,
            CHECKSUM_REPAIRED,
            format!(
                "a replica returned {} bytes that failed their checksums (its disk damaged them); they were rewritten from another replica's copy",
                new.repaired_bytes - old.repaired_bytes
            ),
        ));
    }
    if new.unrecoverable_bytes > old.unrecoverable_bytes {
        found.push((
            EventType::Warning,
            DATA_UNRECOVERABLE,
            format!(
                "{} bytes failed their checksums on every replica: reads of them failed with EIO; restore the files they belong to from a backup",
                new.unrecoverable_bytes - old.unrecoverable_bytes
            ),
        ));
    }
    let was_running = before
        .and_then(|s| s.scrub.as_ref())
        .is_some_and(|s| s.running);
    if let Some(scrub) = after.scrub.as_ref().filter(|s| was_running && !s.running) {
        found.push(scrub_event(scrub));
    }
    found
}

fn scrub_event(scrub: &ScrubReport) -> (EventType, &'static str, String) {
    let mut note = format!(
        "scrub checked {} bytes: {} failed their checksums, {} repaired, {} unrepaired; {} chunks read differently on some replica, {} settled",
        scrub.checked_bytes,
        scrub.rotten_bytes,
        scrub.repaired_bytes,
        scrub.unrepaired_bytes,
        scrub.mismatched_chunks,
        scrub.resolved_chunks
    );
    if !scrub.error.is_empty() {
        note.push_str(&format!("; stopped early: {}", scrub.error));
    }
    let damage = scrub.rotten_bytes > 0 || scrub.mismatched_chunks > 0 || !scrub.error.is_empty();
    match damage {
        true => (EventType::Warning, SCRUB_FOUND_DAMAGE, note),
        false => (EventType::Normal, SCRUB_DONE, note),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::EngineStatus;

    #[test]
    fn a_scrub_is_due_an_interval_after_the_latest_start_and_never_twice_at_once() {
        let week = Duration::from_secs(7 * 86_400);
        let t = 1_800_000_000;
        assert!(!scrub_due(week, t, false, &[t - 86_400, t - 3 * 86_400]));
        assert!(scrub_due(
            week,
            t,
            false,
            &[t - 7 * 86_400, t - 30 * 86_400]
        ));
        assert!(!scrub_due(week, t, true, &[t - 30 * 86_400]));
        assert!(!scrub_due(Duration::ZERO, t, false, &[0]));
        assert!(scrub_due(week, t, false, &[]));
    }

    fn status(repaired: i64, unrecoverable: i64, scrub: Option<ScrubReport>) -> EngineStatus {
        EngineStatus {
            read_repair: ReadRepair {
                checksum_failed_bytes: repaired + unrecoverable,
                repaired_bytes: repaired,
                unrecoverable_bytes: unrecoverable,
            },
            scrub,
            ..EngineStatus::default()
        }
    }

    #[test]
    fn repairs_losses_and_a_finished_scrub_are_told_once() {
        let reasons = |before: Option<&EngineStatus>, after: &EngineStatus| {
            findings(before, after)
                .into_iter()
                .map(|(_, reason, _)| reason)
                .collect::<Vec<_>>()
        };
        let quiet = status(4096, 0, None);
        assert_eq!(reasons(None, &quiet), [CHECKSUM_REPAIRED]);
        assert!(reasons(Some(&quiet), &quiet).is_empty());
        // A restarted engine counts from zero: nothing new.
        assert!(reasons(Some(&quiet), &status(0, 0, None)).is_empty());
        assert_eq!(
            reasons(Some(&quiet), &status(8192, 4096, None)),
            [CHECKSUM_REPAIRED, DATA_UNRECOVERABLE]
        );
        let running = ScrubReport {
            running: true,
            ..ScrubReport::default()
        };
        let clean = ScrubReport {
            checked_bytes: 1 << 30,
            ..ScrubReport::default()
        };
        let rotten = ScrubReport {
            rotten_bytes: 4096,
            repaired_bytes: 4096,
            ..clean.clone()
        };
        let scrubbing = status(4096, 0, Some(running));
        assert_eq!(
            reasons(Some(&scrubbing), &status(4096, 0, Some(clean.clone()))),
            [SCRUB_DONE]
        );
        assert_eq!(
            reasons(Some(&scrubbing), &status(4096, 0, Some(rotten))),
            [SCRUB_FOUND_DAMAGE]
        );
        let done = status(4096, 0, Some(clean));
        assert!(reasons(Some(&done), &done).is_empty());
    }
}
