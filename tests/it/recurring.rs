//! Recurring jobs on a real API server with `oxhorn manager` nodes whose
//! job clock runs 60 times faster (a cron minute each second, through the
//! same code). What a user would notice: snapshots and backups are made on
//! schedule on the volumes that join the job (by job label, group label, or
//! the default group), retention keeps exactly `retain` of what the job
//! made, a volume nothing was written to is skipped, no more than
//! `concurrency` volumes run at once, a failing target is a condition, an
//! Event and a metric and deletes nothing, and a schedule that makes no
//! sense is refused or said to be so; a run cut short by its managers'
//! deaths goes on once, making nothing twice; a claim can choose its
//! volume's jobs.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use oxhorn::types::*;
use oxhorn_testbed::ObjectServerKind;
use serde_json::json;

use crate::backup::{Store, store_as_default_target, until_backup_completed};
use crate::common::*;

const SIZE: i64 = 16 * MIB;
/// Cron minutes per real second.
pub(crate) const SCALE: u32 = 60;

pub(crate) async fn create_job(cluster: &Cluster, name: &str, spec: serde_json::Value) {
    let job = RecurringJob::new(name, serde_json::from_value(spec).unwrap());
    cluster
        .api::<RecurringJob>()
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
}

async fn job_status(cluster: &Cluster, name: &str) -> RecurringJobStatus {
    let job = cluster.api::<RecurringJob>().get(name).await.unwrap();
    job.status.unwrap_or_default()
}

/// The job's record on `volume`, once `check` holds of it.
pub(crate) async fn until_record(
    cluster: &Cluster,
    volume: &str,
    job: &str,
    what: &str,
    check: impl Fn(&VolumeJob) -> bool,
) -> VolumeJob {
    cluster
        .until(what, || async {
            let status = cluster.volume(volume).await?.status?;
            status
                .recurring_jobs
                .into_iter()
                .find(|r| r.name == job)
                .filter(|r| check(r))
        })
        .await
}

/// The Snapshots `job` made on `volume`, ready ones only.
pub(crate) async fn made_snapshots(cluster: &Cluster, volume: &str, job: &str) -> BTreeSet<String> {
    let by_job = ListParams::default().labels(&format!("{MADE_BY}={job}"));
    let snapshots = cluster.api::<Snapshot>().list(&by_job).await.unwrap();
    snapshots
        .into_iter()
        .filter(|s| s.spec.volume == volume && s.metadata.deletion_timestamp.is_none())
        .filter(|s| s.status.as_ref().is_some_and(|st| st.ready_to_use))
        .map(|s| s.name_any())
        .collect()
}

async fn made_backups(cluster: &Cluster, volume: &str, job: &str) -> Vec<Backup> {
    let by_job = ListParams::default().labels(&format!("{MADE_BY}={job}"));
    let backups = cluster.api::<Backup>().list(&by_job).await.unwrap();
    backups
        .into_iter()
        .filter(|b| b.spec.volume_name == volume && b.metadata.deletion_timestamp.is_none())
        .collect()
}

fn completed(backups: &[Backup]) -> BTreeSet<String> {
    backups
        .iter()
        .filter(|b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.state == BackupState::Completed)
        })
        .map(|b| b.name_any())
        .collect()
}

/// A snapshot job over a job label and a group: the labelled, attached
/// volume gets a snapshot per run it was written to and keeps the newest
/// two, the detached one a single snapshot and then skips, the volume of
/// neither none; never more than one volume runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_jobs_run_on_schedule_keep_retain_and_skip_what_did_not_change() {
    let cluster = Cluster::start_with_job_clock("rjsnap", 2, SCALE).await;
    let node = cluster.nodes[0].node_id().to_owned();
    let with_labels = |labels: serde_json::Value| json!({"metadata": {"labels": labels}});
    cluster.create_volume("written", SIZE, 1).await;
    cluster.create_volume("idle", SIZE, 1).await;
    cluster.create_volume("other", SIZE, 1).await;
    cluster
        .patch_volume(
            "written",
            with_labels(json!({"recurring-job.oxhorn.io/snap": "enabled"})),
        )
        .await;
    cluster
        .patch_volume(
            "idle",
            with_labels(json!({"recurring-job-group.oxhorn.io/gold": "enabled"})),
        )
        .await;
    let device = cluster.attach("written", &node).await;
    write_pattern(&device, 1 << 20, 1);
    create_job(
        &cluster,
        "snap",
        json!({"task": "snapshot", "cron": "* * * * *", "retain": 2, "groups": ["gold"],
               "concurrency": 1, "labels": {"team": "db"}}),
    )
    .await;

    // Each run takes a snapshot of the written volume only while it was
    // written to since the last: write three times, one run apart.
    let mut made = BTreeSet::new();
    for round in 0..3u64 {
        let before = made.len();
        write_pattern(&device, 1 << 20, 10 + round);
        let record = until_record(&cluster, "written", "snap", "a new snapshot", |r| {
            r.state == VolumeJobState::Succeeded && !made.contains(&r.made)
        })
        .await;
        made.insert(record.made.clone());
        assert_eq!(made.len(), before + 1);
        let status = job_status(&cluster, "snap").await;
        assert!(status.running.len() <= 1, "{status:?}");
    }
    // The run after the last write finds nothing new on it.
    let skipped = until_record(
        &cluster,
        "written",
        "snap",
        "the written volume skipped",
        |r| r.state == VolumeJobState::Skipped,
    )
    .await;
    assert!(
        skipped.message.contains("nothing was written"),
        "{skipped:?}"
    );
    // Names sort by their run's time: the newest two are kept.
    let kept = made_snapshots(&cluster, "written", "snap").await;
    assert_eq!(kept.len(), 2, "retain 2 keeps two: {kept:?} of {made:?}");
    let (oldest, newest) = (made.first().unwrap(), made.last().unwrap());
    assert!(
        kept.contains(newest) && !kept.contains(oldest),
        "{kept:?} of {made:?}"
    );
    let snapshot = cluster.api::<Snapshot>().get(newest).await.unwrap();
    assert_eq!(
        snapshot.labels().get("team").map(String::as_str),
        Some("db")
    );

    // The detached volume joins by its group: one snapshot, then skipped.
    until_record(&cluster, "idle", "snap", "the idle volume skipped", |r| {
        r.state == VolumeJobState::Skipped
    })
    .await;
    assert_eq!(made_snapshots(&cluster, "idle", "snap").await.len(), 1);
    // The volume of neither label is not in the job.
    let other = cluster.volume("other").await.unwrap().status.unwrap();
    assert!(other.recurring_jobs.is_empty(), "{other:?}");
    assert!(made_snapshots(&cluster, "other", "snap").await.is_empty());

    let status = job_status(&cluster, "snap").await;
    assert!(status.execution_count >= 4, "{status:?}");
    let run = status.last_run.unwrap();
    assert_eq!(run.volumes, 2, "{run:?}");
    assert!(status.next_run_at.is_some());
    assert!(Condition::is_true(&status.conditions, "Valid"));
    let volume = cluster.volume("written").await.unwrap().status.unwrap();
    assert!(
        Condition::is_true(&volume.conditions, "RecurringJobs"),
        "{volume:?}"
    );
    let scraped = cluster.scrape();
    let labels = [r#"volume="written""#, r#"job="snap""#];
    let failed = sample_sum(&scraped, "oxhorn_volume_recurring_job_failed", &labels);
    assert_eq!(failed, Some(0.0), "{scraped}");
}

/// The volume's labels that choose its jobs, and `team`.
async fn job_labels(cluster: &Cluster, volume: &str) -> BTreeSet<(String, String)> {
    let volume = cluster.volume(volume).await.unwrap();
    volume
        .labels()
        .iter()
        .filter(|(key, _)| key.starts_with("recurring-job") || *key == "team")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn pairs(labels: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A claim labelled `recurring-job-source.oxhorn.io: enabled` gives its
/// volume its job and group labels, added and removed as the claim's
/// change and put back when someone changes the volume's; the volume's
/// other labels stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_chooses_the_jobs_of_its_volume() {
    let cluster = Cluster::start_with_job_clock("rjclaim", 1, SCALE).await;
    let ns = cluster.ns.name().to_owned();
    // The volume and its PV share a name, as the CSI provisioner makes
    // them; named after the namespace, the PV goes with it if this fails.
    let volume = format!("{ns}-pv");
    cluster.create_volume(&volume, SIZE, 1).await;
    cluster
        .patch_volume(&volume, json!({"metadata": {"labels": {"team": "db"}}}))
        .await;
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": SIZE.to_string()},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": ns, "name": "db"},
            "csi": {"driver": oxhorn::csi::DRIVER_NAME, "volumeHandle": volume},
        },
    }))
    .unwrap();
    let pvs: kube::Api<PersistentVolume> = kube::Api::all(cluster.client.clone());
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "db", "labels": {
            SOURCE_LABEL: "enabled",
            "recurring-job.oxhorn.io/nightly": "enabled",
        }},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": SIZE.to_string()}},
        },
    }))
    .unwrap();
    cluster.create(&claim).await;
    let until_labels = |what: &'static str, want: BTreeSet<(String, String)>| {
        let (cluster, volume) = (&cluster, &volume);
        async move {
            cluster
                .until(what, || async {
                    (job_labels(cluster, volume).await == want).then_some(())
                })
                .await;
        }
    };
    until_labels(
        "the claim's job on the volume",
        pairs(&[
            ("recurring-job.oxhorn.io/nightly", "enabled"),
            ("team", "db"),
        ]),
    )
    .await;

    let claims = cluster.api::<PersistentVolumeClaim>();
    let relabel = json!({"metadata": {"labels": {
        "recurring-job.oxhorn.io/nightly": null,
        "recurring-job-group.oxhorn.io/gold": "enabled",
    }}});
    claims
        .patch("db", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();
    let gold = pairs(&[
        ("recurring-job-group.oxhorn.io/gold", "enabled"),
        ("team", "db"),
    ]);
    until_labels("the claim's new group, its old job gone", gold.clone()).await;

    // Taken off the volume, the claim's group comes back.
    cluster
        .patch_volume(
            &volume,
            json!({"metadata": {"labels": {"recurring-job-group.oxhorn.io/gold": null}}}),
        )
        .await;
    until_labels("the claim's group put back", gold).await;

    claims.delete("db", &DeleteParams::default()).await.unwrap();
    // No controller manager runs here to lift the PV's protection.
    let released = json!({"metadata": {"finalizers": null}});
    pvs.patch(&volume, &PatchParams::default(), &Patch::Merge(&released))
        .await
        .unwrap();
    pvs.delete(&volume, &DeleteParams::default()).await.unwrap();
    cluster.delete_volume(&volume).await;
}

/// Twenty volumes in a job of concurrency 3: every one gets its snapshot,
/// and the job's status never gives more than three a turn at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_volumes_run_at_once_than_the_concurrency() {
    let cluster = Cluster::start_with_job_clock("rjconc", 2, SCALE).await;
    let volumes: Vec<String> = (0..20).map(|i| format!("v{i:02}")).collect();
    for volume in &volumes {
        cluster.create_volume(volume, SIZE, 1).await;
    }
    cluster
        .until("every volume placed", || async {
            let replicas = cluster
                .api::<Replica>()
                .list(&Default::default())
                .await
                .unwrap();
            let placed = replicas
                .iter()
                .filter(|r| !r.spec.instance.node_id.is_empty())
                .count();
            (placed == volumes.len()).then_some(())
        })
        .await;
    // Volumes made before the job: its first run takes them all.
    create_job(
        &cluster,
        "every",
        json!({"task": "snapshot-force-create", "cron": "*/2 * * * *", "retain": 1,
               "groups": ["default"], "concurrency": 3}),
    )
    .await;
    let most = AtomicUsize::new(0);
    let run = cluster
        .until("a run over all twenty", || async {
            let status = job_status(&cluster, "every").await;
            most.fetch_max(status.running.len(), Ordering::Relaxed);
            let run = status.last_run?;
            (run.finished_at.is_some() && run.volumes == 20).then_some(run)
        })
        .await;
    let most = most.into_inner();
    assert!(most <= 3, "{most} volumes ran at once");
    assert!(most >= 2, "turns were given one at a time only ({most})");
    assert_eq!((run.succeeded, run.failed), (20, 0), "{run:?}");
    // The next run may be under way: a volume then holds its new snapshot
    // beside the last until the new one is ready.
    for volume in &volumes {
        let made = made_snapshots(&cluster, volume, "every").await.len();
        assert!((1..=2).contains(&made), "{volume}: {made}");
    }
}

/// A backup job against MinIO keeps exactly `retain` backups; while the
/// store is down its runs fail, which the volume's condition, an Event and
/// a metric say, and nothing is deleted; once it is back, the next run
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_jobs_keep_retain_and_a_failing_store_deletes_nothing() {
    let mut store = Store::start(ObjectServerKind::Minio);
    let cluster = Cluster::start_with_job_clock("rjbkup", 2, SCALE).await;
    let node = cluster.nodes[0].node_id().to_owned();
    store_as_default_target(&cluster, &store).await;
    cluster.create_volume("db", SIZE, 1).await;
    let device = cluster.attach("db", &node).await;
    write_pattern(&device, 2 << 20, 1);
    create_job(
        &cluster,
        "backups",
        json!({"task": "backup-force-create", "cron": "* * * * *", "retain": 2,
               "groups": ["default"]}),
    )
    .await;

    let three = cluster
        .until("three runs' backups completed", || async {
            let status = cluster.volume("db").await?.status?;
            let record = status.recurring_jobs.iter().find(|r| r.name == "backups")?;
            let backups = made_backups(&cluster, "db", "backups").await;
            let done = completed(&backups);
            // Retention ran after the third: two are left of three made.
            (record.state == VolumeJobState::Succeeded
                && done.len() == 2
                && record.made > *done.iter().next()?)
            .then_some(done)
        })
        .await;
    assert_eq!(three.len(), 2);

    store.stop();
    let failed = until_record(&cluster, "db", "backups", "a run failed", |r| {
        r.state == VolumeJobState::Failed
    })
    .await;
    assert!(!failed.last_failure.is_empty(), "{failed:?}");
    // What was complete once the store was down: a run that completed just
    // before it stopped rightly replaced the oldest.
    let before = completed(&made_backups(&cluster, "db", "backups").await);
    let status = cluster.volume("db").await.unwrap().status.unwrap();
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "RecurringJobs")
        .unwrap();
    assert_eq!(condition.status, ConditionStatus::False, "{condition:?}");
    assert!(condition.message.contains("backups"), "{condition:?}");
    assert!(cluster.event_reasons().await.contains("RecurringJobFailed"));
    // The managers' caches may show the failure a moment after the API.
    let labels = [r#"volume="db""#, r#"job="backups""#];
    cluster
        .until("the failure's metric", || async {
            let scraped = cluster.scrape();
            let metric = sample_sum(&scraped, "oxhorn_volume_recurring_job_failed", &labels);
            (metric == Some(1.0)).then_some(())
        })
        .await;
    let job = job_status(&cluster, "backups").await;
    assert!(job.last_run.is_some());
    // Nothing completed was deleted while the store was down, over a later
    // failed run too.
    until_record(&cluster, "db", "backups", "a later run failed", |r| {
        r.state == VolumeJobState::Failed && r.scheduled_at != failed.scheduled_at
    })
    .await;
    let kept = completed(&made_backups(&cluster, "db", "backups").await);
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before.is_subset(&kept), "{before:?} not all in {kept:?}");

    store.resume();
    until_record(&cluster, "db", "backups", "a run succeeded again", |r| {
        r.state == VolumeJobState::Succeeded
    })
    .await;
    let status = cluster.volume("db").await.unwrap().status.unwrap();
    assert!(
        Condition::is_true(&status.conditions, "RecurringJobs"),
        "{status:?}"
    );
}

/// A run whose backup hangs on a store that stopped answering, and whose
/// managers are then killed: once they are back, the run goes on with the
/// backup it began (no backup is made twice, in the cluster or in the
/// store), and the times the job missed meanwhile are caught up with one
/// run, for the latest, not one each. While the run is held up past its
/// next time, the job says it overran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_managers_die_resumes_once_and_backs_nothing_up_twice() {
    let store = Store::start(ObjectServerKind::Minio);
    let mut cluster = Cluster::start_with_job_clock("rjkill", 2, SCALE).await;
    let node = cluster.nodes[0].node_id().to_owned();
    store_as_default_target(&cluster, &store).await;
    cluster.create_volume("db", SIZE, 2).await;
    let device = cluster.attach("db", &node).await;
    write_pattern(&device, 2 << 20, 1);
    // The store stops answering before the first run's backup can finish.
    store.freeze();
    let period = jiff::SignedDuration::from_secs(10);
    create_job(
        &cluster,
        "backups",
        json!({"task": "backup-force-create", "cron": "*/10 * * * *", "retain": 10,
               "groups": ["default"]}),
    )
    .await;
    let begun = until_record(&cluster, "db", "backups", "the run's backup begun", |r| {
        r.state == VolumeJobState::Running && !r.made.is_empty()
    })
    .await;
    let first = begun.scheduled_at.clone().unwrap().0;
    let runs = job_status(&cluster, "backups").await.execution_count;
    // Still going at its next time: the job says so, in its condition,
    // an Event and a metric, for an alert.
    let overrun = cluster
        .until("the job said to overrun", || async {
            let status = job_status(&cluster, "backups").await;
            let condition = status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "OnSchedule")?;
            (condition.status == ConditionStatus::False).then_some(condition)
        })
        .await;
    assert_eq!(overrun.reason, "Overrun");
    assert!(overrun.message.contains("db"), "{overrun:?}");
    assert!(cluster.event_reasons().await.contains("RunOverrun"));
    let labels = [r#"job="backups""#, r#"reason="Overrun""#];
    cluster
        .until("the overrun's metric", || async {
            let scraped = cluster.scrape();
            let metric = sample_sum(&scraped, "oxhorn_recurring_job_on_schedule", &labels);
            (metric == Some(0.0)).then_some(())
        })
        .await;
    let backup = cluster.api::<Backup>().get(&begun.made).await.unwrap();
    let state = backup.status.map(|s| s.state);
    assert_ne!(state, Some(BackupState::Completed), "{begun:?}");

    // Every manager dies mid-run, and stays down over two more of the
    // job's times; the store answers again meanwhile.
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.node_id().into()).collect();
    for name in &names {
        cluster.node_mut(name).kill();
    }
    store.thaw();
    let back_at = first + period * 2 + jiff::SignedDuration::from_secs(5);
    cluster
        .until("two of the job's times passed", || async {
            (jiff::Timestamp::now() >= back_at).then_some(())
        })
        .await;
    for name in &names {
        cluster
            .node_mut(name)
            .restart(std::path::Path::new(OXHORN))
            .unwrap();
    }

    // The run goes on with its backup; the next is the latest time missed.
    let next = cluster
        .until("the run after the first", || async {
            let run = job_status(&cluster, "backups").await.last_run?;
            (run.scheduled_at.0 > first).then_some(run)
        })
        .await;
    assert!(
        next.scheduled_at.0 >= first + period * 2,
        "a run for a time missed before the latest: {next:?} after {first}"
    );
    let status = job_status(&cluster, "backups").await;
    assert_eq!(
        status.execution_count,
        runs + 1,
        "the first run started again, or a run per time missed: {status:?}"
    );
    let backup = until_backup_completed(&cluster, &begun.made).await;
    assert!(backup.error.is_empty(), "{backup:?}");
    // No run after the catch-up one, so that its end can be looked at.
    let yearly = json!({"spec": {"cron": "0 0 1 1 *"}});
    cluster
        .api::<RecurringJob>()
        .patch("backups", &PatchParams::default(), &Patch::Merge(&yearly))
        .await
        .unwrap();

    // Once the catch-up run finished: a backup each for the two runs, the
    // same in the cluster and in the store.
    let (made, done) = cluster
        .until("the catch-up run finished", || async {
            let backups = made_backups(&cluster, "db", "backups").await;
            let run = job_status(&cluster, "backups").await.last_run?;
            (run.scheduled_at == next.scheduled_at && run.finished_at.is_some())
                .then_some((backups, run))
        })
        .await;
    assert_eq!((done.succeeded, done.failed), (1, 0), "{done:?}");
    let names: BTreeSet<String> = made.iter().map(|b| b.name_any()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&begun.made), "{names:?}");
    assert_eq!(completed(&made), names);
    let stored: BTreeSet<String> = store
        .backupstore()
        .backups("db")
        .await
        .unwrap()
        .into_iter()
        .map(|config| config.name)
        .collect();
    assert_eq!(stored, names, "the store holds another backup");
    let status = job_status(&cluster, "backups").await;
    assert!(
        Condition::is_true(&status.conditions, "OnSchedule"),
        "{status:?}"
    );
}

/// Specs that make no sense are refused by the schema with a message, and
/// a schedule the schema cannot judge is said to be invalid in the job's
/// condition, running nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_makes_no_sense_is_refused_or_said_to_be_invalid() {
    let cluster = Cluster::start_with_job_clock("rjbad", 1, SCALE).await;
    let refused = [
        (json!({"task": "snapshot", "cron": "* * * *"}), "spec.cron"),
        (
            json!({"task": "snapshot", "cron": "* * * * *", "retain": 0}),
            "retain at least 1",
        ),
        (
            json!({"task": "backup", "cron": "@daily", "retentionPolicy": "age-based"}),
            "retainAge",
        ),
        (
            json!({"task": "snapshot", "cron": "@daily", "backupTargetName": "t"}),
            "backup tasks only",
        ),
        (json!({"task": "defragment", "cron": "@daily"}), "spec.task"),
        (
            json!({"task": "snapshot", "cron": "@daily", "concurrency": 0}),
            "spec.concurrency",
        ),
    ];
    let raw: kube::Api<DynamicObject> = kube::Api::namespaced_with(
        cluster.client.clone(),
        cluster.ns.name(),
        &ApiResource::erase::<RecurringJob>(&()),
    );
    for (spec, says) in refused {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "RecurringJob",
            "metadata": {"name": "bad"}, "spec": spec,
        }))
        .unwrap();
        let error = raw
            .create(&PostParams::default(), &object)
            .await
            .expect_err(&format!("{spec} accepted"))
            .to_string();
        assert!(error.contains(says), "{spec}: {error}");
    }
    create_job(
        &cluster,
        "never",
        json!({"task": "snapshot", "cron": "61 * * * *"}),
    )
    .await;
    let status = cluster
        .until("the job said invalid", || async {
            let status = job_status(&cluster, "never").await;
            let valid = status.conditions.iter().find(|c| c.type_ == "Valid")?;
            (valid.status == ConditionStatus::False).then_some(status)
        })
        .await;
    let valid = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Valid")
        .unwrap();
    assert_eq!(valid.reason, "InvalidCron");
    assert!(valid.message.contains("61 * * * *"), "{valid:?}");
    assert!(status.next_run_at.is_none() && status.last_run.is_none());
}
