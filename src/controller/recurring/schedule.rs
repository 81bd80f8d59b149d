//! When a job's runs are due: its cron schedule, in UTC, read on the job
//! clock. The clock is real time, except in tests, which may run it faster
//! (`--recurring-time-scale`) so that a minute's schedule runs each second
//! through the same code.

use std::time::Duration;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;

/// A job's parsed cron schedule.
#[derive(Clone, Debug)]
pub struct Schedule(Cron);

impl Schedule {
    /// Five fields (minute hour day-of-month month day-of-week) or an `@`
    /// shorthand; the error says what is wrong, for the job's condition.
    pub fn parse(cron: &str) -> Result<Self, String> {
        CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(cron.trim())
            .map(Self)
            .map_err(|error| format!("cron {cron:?} is not a schedule: {error}"))
    }

    /// The latest time the schedule names at or before `at`.
    pub fn latest(&self, at: Timestamp) -> Option<Timestamp> {
        let at = to_chrono(at)?;
        self.0
            .find_previous_occurrence(&at, true)
            .ok()
            .and_then(|t| from_chrono(&t))
    }

    /// The first time the schedule names after `at`.
    pub fn next_after(&self, at: Timestamp) -> Option<Timestamp> {
        let at = to_chrono(at)?;
        self.0
            .find_next_occurrence(&at, false)
            .ok()
            .and_then(|t| from_chrono(&t))
    }

    /// [`next_after`](Self::next_after) real time `at`, on `clock`, in real
    /// time.
    pub fn next_on(&self, clock: JobClock, at: Timestamp) -> Option<Timestamp> {
        self.next_after(clock.to_job(at))
            .map(|next| clock.to_real(next))
    }
}

fn to_chrono(at: Timestamp) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(at.as_second(), at.subsec_nanosecond().unsigned_abs())
}

fn from_chrono(at: &DateTime<Utc>) -> Option<Timestamp> {
    Timestamp::new(
        at.timestamp(),
        i32::try_from(at.timestamp_subsec_nanos()).ok()?,
    )
    .ok()
}

/// The clock jobs' schedules and retention ages are read on: real time,
/// or, at a scale above 1, real time running `scale` times faster from a
/// fixed instant, the same for every manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobClock {
    scale: u32,
}

/// Where a scaled clock agrees with real time.
const ANCHOR_SECONDS: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

impl JobClock {
    pub const REAL: Self = Self { scale: 1 };

    /// A clock `scale` times faster than real time (1: real time).
    pub fn scaled(scale: u32) -> Self {
        Self {
            scale: scale.max(1),
        }
    }

    /// The job time at real time `real`.
    pub fn to_job(self, real: Timestamp) -> Timestamp {
        if self.scale == 1 {
            return real;
        }
        let since = real.as_nanosecond() - anchor_nanos();
        nanos(anchor_nanos() + since * i128::from(self.scale)).unwrap_or(real)
    }

    /// The real time at job time `job`, to the nanosecond below.
    pub fn to_real(self, job: Timestamp) -> Timestamp {
        if self.scale == 1 {
            return job;
        }
        let since = job.as_nanosecond() - anchor_nanos();
        nanos(anchor_nanos() + since.div_euclid(i128::from(self.scale))).unwrap_or(job)
    }

    /// How long `job` of job time lasts in real time.
    pub fn real_duration(self, job: Duration) -> Duration {
        job / self.scale
    }
}

fn anchor_nanos() -> i128 {
    i128::from(ANCHOR_SECONDS) * 1_000_000_000
}

fn nanos(value: i128) -> Option<Timestamp> {
    Timestamp::from_nanosecond(value).ok()
}

/// How long after its run is due a volume may start it: a share of the
/// schedule's period (a tenth, at most a minute) spread over volumes by a
/// hash of their name and the job's, so that a thousand volumes do not all
/// start in the same second. The same for every manager.
pub fn jitter(job: &str, volume: &str, period: Duration) -> Duration {
    let spread = (period / 10).min(Duration::from_secs(60));
    let spread_ms = u64::try_from(spread.as_millis()).unwrap_or(u64::MAX);
    if spread_ms == 0 {
        return Duration::ZERO;
    }
    let hash = xxhash_rust::xxh3::xxh3_64(format!("{job}/{volume}").as_bytes());
    Duration::from_millis(hash % spread_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn five_fields_and_shorthands_parse_and_the_rest_say_why() {
        for good in [
            "*/5 * * * *",
            "0 3 * * SUN",
            "30 1 1,15 * *",
            "@daily",
            "0 */6 * * 1-5",
        ] {
            assert!(Schedule::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "* * * *",
            "61 * * * *",
            "0 0 32 * *",
            "0 0 * * * *",
            "banana",
        ] {
            let error = Schedule::parse(bad).unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn the_latest_slot_is_at_or_before_now_and_the_next_after_it() {
        let every_5 = Schedule::parse("*/5 * * * *").unwrap();
        let now = at("2026-11-28T21:47:13Z");
        assert_eq!(every_5.latest(now), Some(at("2026-11-28T21:45:00Z")));
        assert_eq!(every_5.next_after(now), Some(at("2026-11-28T21:50:00Z")));
        let on_slot = at("2026-11-28T21:45:00Z");
        assert_eq!(every_5.latest(on_slot), Some(on_slot));
        assert_eq!(
            every_5.next_after(on_slot),
            Some(at("2026-11-28T21:50:00Z"))
        );
    }

    #[test]
    fn a_scaled_clock_runs_a_minute_each_second_and_maps_back() {
        let clock = JobClock::scaled(60);
        let real = at("2026-11-28T21:00:00Z");
        let job = clock.to_job(real);
        assert_eq!(
            clock.to_job(at("2026-11-28T21:00:01Z")),
            job.checked_add(jiff::SignedDuration::from_secs(60))
                .unwrap()
        );
        assert_eq!(clock.to_real(job), real);
        let every_minute = Schedule::parse("* * * * *").unwrap();
        let slot = every_minute.latest(job).unwrap();
        assert_eq!(
            clock.to_real(slot),
            real,
            "slots fall on whole real seconds"
        );
        assert_eq!(
            clock.real_duration(Duration::from_secs(3600)),
            Duration::from_secs(60)
        );
        assert_eq!(JobClock::REAL.to_job(real), real);
    }

    #[test]
    fn jitter_stays_within_a_tenth_of_the_period_and_a_minute() {
        let hour = Duration::from_secs(3600);
        let minute = Duration::from_secs(60);
        for volume in ["a", "b", "pvc-0b9d", "volume-1000"] {
            assert!(jitter("daily", volume, hour) < Duration::from_secs(60));
            assert!(jitter("daily", volume, minute) < Duration::from_secs(6));
            assert_eq!(jitter("daily", volume, hour), jitter("daily", volume, hour));
        }
        let spread: std::collections::BTreeSet<_> = (0..100)
            .map(|i| jitter("daily", &format!("v{i}"), hour))
            .collect();
        assert!(spread.len() > 90, "volumes spread over the window");
    }
}
