//! Whose turn it is in a job's run: the job's owner grants volumes their
//! turn, at most `concurrency` at once across the cluster, each no sooner
//! than its jitter allows, and counts how each one fared from the records
//! their owners keep. Pure, so that the bound is checked against every
//! order of events (tests below).

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::types::{
    DEFAULT_GROUP, ENABLED, GROUP_LABEL_PREFIX, JOB_LABEL_PREFIX, JobRun, VolumeJob, VolumeJobState,
};

/// Whether a volume with `labels` joins the job `job` of `groups`: by a
/// label naming the job or one of its groups, or, when it has no such
/// label at all, by the job being in the default group.
pub fn joins(labels: &BTreeMap<String, String>, job: &str, groups: &[String]) -> bool {
    let enabled = |key: &str| labels.get(key).is_some_and(|v| v == ENABLED);
    if enabled(&format!("{JOB_LABEL_PREFIX}{job}")) {
        return true;
    }
    if groups
        .iter()
        .any(|group| enabled(&format!("{GROUP_LABEL_PREFIX}{group}")))
    {
        return true;
    }
    let labelled = labels.iter().any(|(key, value)| {
        value == ENABLED
            && (key.starts_with(JOB_LABEL_PREFIX) || key.starts_with(GROUP_LABEL_PREFIX))
    });
    !labelled && groups.iter().any(|g| g == DEFAULT_GROUP)
}

/// A volume that joins the job, as the job's owner sees it.
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub name: &'a str,
    /// When the volume was made: a run is for the volumes made before it
    /// was due.
    pub created: Timestamp,
    /// The volume's record of this job.
    pub record: Option<&'a VolumeJob>,
}

/// Where a run stands after granting the turns it can.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Turns {
    /// The volumes whose turn it is now.
    pub running: Vec<String>,
    pub volumes: i32,
    pub succeeded: i32,
    pub failed: i32,
    pub skipped: i32,
    /// Volumes that failed in this run, and why.
    pub failures: Vec<(String, String)>,
    /// Every volume of the run has finished.
    pub finished: bool,
    /// When the next waiting volume may start, if one waits on its jitter.
    pub next_start: Option<Timestamp>,
}

/// The run `run` after granting turns: `running` as the job's status has
/// it, `members` the volumes joining the job now, `start_at` when each
/// volume may start at the earliest.
pub fn grant(
    run: &JobRun,
    running: &[String],
    members: &[Member<'_>],
    concurrency: usize,
    now: Timestamp,
    start_at: impl Fn(&str) -> Timestamp,
) -> Turns {
    let due = run.scheduled_at.0;
    let in_run: Vec<&Member<'_>> = members.iter().filter(|m| m.created <= due).collect();
    let finished_state = |m: &Member<'_>| {
        of_run(m.record, due)
            .map(|r| r.state)
            .filter(|s| s.finished())
    };
    let mut turns = Turns {
        volumes: i32::try_from(in_run.len()).unwrap_or(i32::MAX),
        ..Turns::default()
    };
    for member in &in_run {
        match finished_state(member) {
            Some(VolumeJobState::Succeeded) => turns.succeeded += 1,
            Some(VolumeJobState::Skipped) => turns.skipped += 1,
            Some(_) => {
                turns.failed += 1;
                let why = of_run(member.record, due).map_or("", |r| r.message.as_str());
                turns
                    .failures
                    .push((member.name.to_owned(), why.to_owned()));
            }
            None => {}
        }
    }
    // A turn ends when its volume finished, left the job or is gone.
    turns.running = running
        .iter()
        .filter(|name| {
            in_run
                .iter()
                .any(|m| m.name == name.as_str() && finished_state(m).is_none())
        })
        .cloned()
        .collect();
    let mut waiting: Vec<(Timestamp, &str)> = in_run
        .iter()
        .filter(|m| finished_state(m).is_none() && !turns.running.iter().any(|r| r == m.name))
        .map(|m| (start_at(m.name), m.name))
        .collect();
    waiting.sort();
    for (start, name) in waiting.iter().copied() {
        if turns.running.len() >= concurrency {
            break;
        }
        if start > now {
            turns.next_start = Some(start);
            break;
        }
        turns.running.push(name.to_owned());
    }
    turns.finished = waiting.is_empty() && turns.running.is_empty();
    turns
}

/// `record` if it is about the run due at `due`.
fn of_run(record: Option<&VolumeJob>, due: Timestamp) -> Option<&VolumeJob> {
    record.filter(|r| r.scheduled_at.as_ref().is_some_and(|t| t.0 == due))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn volumes_join_by_job_or_group_label_or_the_default_group() {
        let groups = vec!["default".to_owned(), "gold".to_owned()];
        let none = labels(&[("app", "db")]);
        assert!(
            joins(&none, "daily", &groups),
            "no job label: default group"
        );
        assert!(!joins(&none, "daily", &["gold".to_owned()]));
        let other_job = labels(&[("recurring-job.oxhorn.io/hourly", "enabled")]);
        assert!(
            !joins(&other_job, "daily", &groups),
            "labelled: not default"
        );
        assert!(joins(&other_job, "hourly", &[]));
        let gold = labels(&[("recurring-job-group.oxhorn.io/gold", "enabled")]);
        assert!(joins(&gold, "daily", &groups));
        assert!(!joins(&gold, "daily", &["default".to_owned()]));
        let disabled = labels(&[("recurring-job.oxhorn.io/daily", "disabled")]);
        assert!(
            joins(&disabled, "daily", &groups),
            "only enabled labels count"
        );
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn run(due: i64) -> JobRun {
        JobRun::new(Time(at(due)), Time(at(due)))
    }

    fn record(due: i64, state: VolumeJobState) -> VolumeJob {
        VolumeJob {
            name: "job".into(),
            scheduled_at: Some(Time(at(due))),
            state,
            message: format!("{state:?}"),
            ..VolumeJob::default()
        }
    }

    #[test]
    fn turns_are_granted_up_to_the_concurrency_and_counted_when_finished() {
        let done = record(100, VolumeJobState::Succeeded);
        let failed = record(100, VolumeJobState::Failed);
        let earlier = record(40, VolumeJobState::Succeeded);
        let names = ["a", "b", "c", "d", "e"];
        let members: Vec<Member<'_>> = vec![
            Member {
                name: names[0],
                created: at(0),
                record: Some(&done),
            },
            Member {
                name: names[1],
                created: at(0),
                record: Some(&failed),
            },
            Member {
                name: names[2],
                created: at(0),
                record: Some(&earlier),
            },
            Member {
                name: names[3],
                created: at(0),
                record: None,
            },
            // Made after the run was due: not in it.
            Member {
                name: names[4],
                created: at(150),
                record: None,
            },
        ];
        let turns = grant(&run(100), &["a".into()], &members, 1, at(200), |_| at(100));
        assert_eq!(turns.running, ["c"]);
        assert_eq!((turns.volumes, turns.succeeded, turns.failed), (4, 1, 1));
        assert_eq!(turns.failures, [("b".to_owned(), "Failed".to_owned())]);
        assert!(!turns.finished);
        let turns = grant(&run(100), &["c".into()], &members, 5, at(200), |_| at(100));
        assert_eq!(turns.running, ["c", "d"], "a turn held is kept");
    }

    #[test]
    fn a_volume_waits_for_its_jitter() {
        let members = vec![
            Member {
                name: "a",
                created: at(0),
                record: None,
            },
            Member {
                name: "b",
                created: at(0),
                record: None,
            },
        ];
        let start = |name: &str| if name == "a" { at(101) } else { at(130) };
        let turns = grant(&run(100), &[], &members, 5, at(110), start);
        assert_eq!(turns.running, ["a"]);
        assert_eq!(turns.next_start, Some(at(130)));
    }

    proptest! {
        /// Whatever the records say and whatever was running, no more than
        /// `concurrency` volumes hold a turn, none holds one once finished,
        /// and a run is finished exactly when every volume in it is.
        #[test]
        fn never_more_turns_than_the_concurrency(
            states in proptest::collection::vec(0u8..6, 0..30),
            held in proptest::collection::vec(0usize..30, 0..40),
            concurrency in 1usize..8,
        ) {
            let names: Vec<String> = (0..states.len()).map(|i| format!("v{i}")).collect();
            let records: Vec<Option<VolumeJob>> = states.iter().map(|s| match s {
                0 => None,
                1 => Some(record(100, VolumeJobState::Running)),
                2 => Some(record(100, VolumeJobState::Succeeded)),
                3 => Some(record(100, VolumeJobState::Failed)),
                4 => Some(record(100, VolumeJobState::Skipped)),
                _ => Some(record(40, VolumeJobState::Succeeded)),
            }).collect();
            let members: Vec<Member<'_>> = names.iter().zip(&records)
                .map(|(name, r)| Member { name, created: at(0), record: r.as_ref() })
                .collect();
            // What a status written under another concurrency might hold.
            let running: Vec<String> = held.iter().filter_map(|i| names.get(*i).cloned())
                .take(concurrency).collect();
            let turns = grant(&run(100), &running, &members, concurrency, at(200), |_| at(100));
            prop_assert!(turns.running.len() <= concurrency);
            let finished = |s: &u8| (2..=4).contains(s);
            for name in &turns.running {
                let i: usize = name[1..].parse().unwrap();
                prop_assert!(!finished(&states[i]));
            }
            prop_assert_eq!(turns.finished, states.iter().all(finished));
            let done = states.iter().filter(|s| finished(s)).count();
            prop_assert_eq!((turns.succeeded + turns.failed + turns.skipped) as usize, done);
        }
    }
}
