//! The RecurringJob controller: the job's owner starts a run each time its
//! schedule comes due (only the latest time missed, once, after a manager
//! was down), grants the run's volumes their turns ([`turns`]) and counts
//! how each fared from the volumes' records. The task itself runs in the
//! owner of each volume (the volume controller's `recurring` step), which
//! acts while the job's status lists the volume as running.
//!
//! A run starts only once the previous one finished, so that a slow backup
//! never runs twice over itself; a run's turns are its status, so that a
//! new owner of the job carries on where the last one stopped.

mod retention;
mod schedule;
mod turns;

pub use retention::{Item, ItemState, to_delete, with_complete};
pub use schedule::{JobClock, Schedule, jitter};
pub use turns::joins;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use super::{Context, ControllerError, update_status};
use crate::types::{
    Condition, ConditionStatus, JobRun, RecurringJob, RecurringJobStatus, Volume, VolumeJob,
};
use turns::{Member, Turns, grant};

/// The condition saying whether the job's schedule parses.
pub const VALID: &str = "Valid";
/// The condition saying whether the job's runs finish before their next
/// time: a run that is still going then (a volume's turn stuck, its
/// owner down) holds back every later one, which an alert must say.
pub const ON_SCHEDULE: &str = "OnSchedule";

pub async fn reconcile(
    job: Arc<RecurringJob>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let Some(job) = ctx.claim(&*job).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("recurring_job", job = %job.name_any());
    async move {
        let mut status = job.status.clone().unwrap_or_default();
        let schedule = match Schedule::parse(&job.spec.cron) {
            Ok(schedule) => schedule,
            Err(why) => return invalid(&ctx, &job, status, why).await,
        };
        valid(&job, &mut status);
        let clock = ctx.node.job_clock;
        let now = Timestamp::now();
        let next_start = step(&ctx, &job, &schedule, clock, now, &mut status).await;
        let overrun_at = on_schedule(&ctx, &job, &schedule, clock, now, &mut status).await;
        let next_run = schedule.next_on(clock, now);
        status.next_run_at = next_run.map(whole_seconds);
        update_status(&ctx.api(), &job, status).await?;
        let wake = [next_run, next_start, overrun_at]
            .into_iter()
            .flatten()
            .min()
            .map_or(Duration::from_secs(3600), |at| until(now, at));
        Ok(Action::requeue(wake.max(Duration::from_millis(200))))
    }
    .instrument(span)
    .await
}

/// Starts a run when one is due and the last finished, grants turns in the
/// run going on, and returns when a waiting volume's jitter ends.
async fn step(
    ctx: &Context,
    job: &RecurringJob,
    schedule: &Schedule,
    clock: JobClock,
    now: Timestamp,
    status: &mut RecurringJobStatus,
) -> Option<Timestamp> {
    let finished = status
        .last_run
        .as_ref()
        .is_none_or(|run| run.finished_at.is_some());
    if finished {
        let due = schedule
            .latest(clock.to_job(now))
            .map(|at| whole_seconds(clock.to_real(at)));
        let since = status
            .last_run
            .as_ref()
            .map_or(created(job), |run| run.scheduled_at.0);
        let due = due.filter(|due| due.0 > since)?;
        info!(scheduled_at = %due.0, "run started");
        status.execution_count += 1;
        status.running.clear();
        status.last_run = Some(JobRun::new(due, whole_seconds(now)));
    }
    let run = status.last_run.as_mut()?;
    let volumes = members(ctx, job);
    let members: Vec<Member<'_>> = volumes
        .iter()
        .map(|(volume, record)| Member {
            name: volume.metadata.name.as_deref().unwrap_or_default(),
            created: volume
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            record: record.as_ref(),
        })
        .collect();
    let period = schedule
        .next_after(clock.to_job(run.scheduled_at.0))
        .and_then(|next| {
            Duration::try_from(next.duration_since(clock.to_job(run.scheduled_at.0))).ok()
        })
        .map_or(Duration::ZERO, |job_period| clock.real_duration(job_period));
    let name = job.name_any();
    let due = run.scheduled_at.0;
    let start_at = |volume: &str| {
        let delay =
            jiff::SignedDuration::try_from(jitter(&name, volume, period)).unwrap_or_default();
        due.checked_add(delay).unwrap_or(due)
    };
    let concurrency = usize::try_from(job.spec.concurrency.max(1)).unwrap_or(1);
    let turns = grant(run, &status.running, &members, concurrency, now, start_at);
    record_turns(run, &turns);
    status.running = turns.running.clone();
    if turns.finished && run.finished_at.is_none() {
        run.finished_at = Some(whole_seconds(now));
        finished_event(ctx, job, run, &turns).await;
    }
    turns.next_start
}

fn record_turns(run: &mut JobRun, turns: &Turns) {
    run.volumes = turns.volumes;
    run.succeeded = turns.succeeded;
    run.failed = turns.failed;
    run.skipped = turns.skipped;
}

/// The volumes joining `job`, with their record of it.
fn members(ctx: &Context, job: &RecurringJob) -> Vec<(Arc<Volume>, Option<VolumeJob>)> {
    let name = job.name_any();
    let mut volumes: Vec<_> = ctx
        .ds
        .volumes
        .store
        .state()
        .into_iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        // A standby's data comes from another volume's backups: it takes no
        // snapshot or backup, and is trimmed by no one, until activated.
        .filter(|v| !v.is_standby())
        .filter(|v| joins(v.labels(), &name, &job.spec.groups))
        .map(|v| {
            let record = v
                .status
                .as_ref()
                .and_then(|s| s.recurring_jobs.iter().find(|r| r.name == name).cloned());
            (v, record)
        })
        .collect();
    volumes.sort_by_key(|(v, _)| v.name_any());
    volumes
}

async fn finished_event(ctx: &Context, job: &RecurringJob, run: &JobRun, turns: &Turns) {
    let summary = format!(
        "run of {} finished: {} volumes, {} succeeded, {} skipped, {} failed",
        run.scheduled_at.0, run.volumes, run.succeeded, run.skipped, run.failed
    );
    info!(
        volumes = run.volumes,
        succeeded = run.succeeded,
        skipped = run.skipped,
        failed = run.failed,
        "run finished"
    );
    if turns.failures.is_empty() {
        return;
    }
    let failures: Vec<String> = turns
        .failures
        .iter()
        .take(10)
        .map(|(volume, why)| format!("{volume}: {why}"))
        .collect();
    let note = format!("{summary} ({})", failures.join("; "));
    ctx.event(job, EventType::Warning, "RunFailed", note).await;
}

/// A job whose schedule does not parse runs nothing; its condition says why.
async fn invalid(
    ctx: &Context,
    job: &RecurringJob,
    mut status: RecurringJobStatus,
    why: String,
) -> Result<Action, ControllerError> {
    let flipped = Condition::set(
        &mut status.conditions,
        VALID,
        ConditionStatus::False,
        "InvalidCron",
        why.clone(),
    );
    status.next_run_at = None;
    status.running.clear();
    status.conditions.retain(|c| c.type_ != ON_SCHEDULE);
    if flipped {
        ctx.event(job, EventType::Warning, "InvalidCron", why).await;
    }
    update_status(&ctx.api(), job, status).await?;
    Ok(Action::await_change())
}

/// Sets `OnSchedule`: False while the run going on has passed the next
/// time it is due, with a Warning Event when it turns so. Returns that
/// time while it is still ahead.
async fn on_schedule(
    ctx: &Context,
    job: &RecurringJob,
    schedule: &Schedule,
    clock: JobClock,
    now: Timestamp,
    status: &mut RecurringJobStatus,
) -> Option<Timestamp> {
    let going = status
        .last_run
        .as_ref()
        .filter(|run| run.finished_at.is_none());
    let next_time = going.and_then(|run| Some((run, schedule.next_on(clock, run.scheduled_at.0)?)));
    let Some((run, due)) = next_time.filter(|(_, due)| *due <= now) else {
        Condition::set(
            &mut status.conditions,
            ON_SCHEDULE,
            ConditionStatus::True,
            "OnTime",
            "no run is going past the next time it was due",
        );
        return next_time.map(|(_, due)| due);
    };
    let waiting = run.volumes - run.succeeded - run.failed - run.skipped;
    // An Event's note is at most 1 KiB: ten names, as a failed run's.
    let holding: Vec<&str> = status.running.iter().take(10).map(String::as_str).collect();
    let message = format!(
        "the run of {} is still going at the next time, {due}: {} volumes to finish, \
         {} holding their turns ({}); no later run starts until it is done",
        run.scheduled_at.0,
        waiting,
        status.running.len(),
        holding.join(", ")
    );
    let turned = Condition::set(
        &mut status.conditions,
        ON_SCHEDULE,
        ConditionStatus::False,
        "Overrun",
        message.clone(),
    );
    if turned {
        warn!(%message, "run overran");
        ctx.event(job, EventType::Warning, "RunOverrun", message)
            .await;
    }
    None
}

fn valid(job: &RecurringJob, status: &mut RecurringJobStatus) {
    Condition::set(
        &mut status.conditions,
        VALID,
        ConditionStatus::True,
        "Scheduled",
        format!("runs at {:?} (UTC)", job.spec.cron),
    );
}

fn created(job: &RecurringJob) -> Timestamp {
    job.metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

/// `at` as status holds it: Kubernetes writes times to the second.
pub fn whole_seconds(at: Timestamp) -> Time {
    Time(Timestamp::from_second(at.as_second()).unwrap_or(at))
}

fn until(now: Timestamp, at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(now)).unwrap_or_default()
}
