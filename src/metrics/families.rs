//! The metric families written from a [`View`], on each scrape. Every
//! family's descriptor is written even when it has no series yet, so that
//! dashboards and alerts find it.
//!
//! Series per volume: 16 (6 gauges, 6 state and 4 robustness series), its
//! last backup's time once it has one, one per backup state it has, 7
//! for its scrub once it had one (6 while the first runs), 4 while it
//! is a standby volume, and 2 per recurring job it is in (1 until the job
//! first succeeds on it).
//! Attached (its engine running), 1 for its rebuild limit, 3 mode series
//! per replica, one progress series per rebuilding replica, and 75 for its
//! engine's I/O (8 counters, 4 error series, 3 histograms of 18 bounds,
//! +Inf, sum and count).

use std::fmt::Error;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Unit;

use super::view::{DiskRow, Flag, View, VolumeRow};
use crate::protocol::control::{EngineMetrics, IoOpStats, LatencyHistogram};
use crate::types::{
    ReplicaMode, Robustness, ScrubReport, StandbyStatus, VolumeJobState, VolumeState,
};

type Labels = Vec<(&'static str, String)>;

/// What a family's values measure: its unit, which Prometheus appends to
/// the name.
#[derive(Clone, Copy)]
enum Measure {
    Count,
    Bytes,
    Seconds,
}

/// A family: name (after `oxhorn_`), help, and what it measures.
type Family = (&'static str, &'static str, Measure);

/// A family (name, help, measure) whose one value per `T` is read with
/// the function.
type ValueOf<T, V> = (&'static str, &'static str, Measure, fn(&T) -> V);

use Measure::{Bytes, Count, Seconds};

const STATES: [(VolumeState, &str); 6] = [
    (VolumeState::Creating, "creating"),
    (VolumeState::Attaching, "attaching"),
    (VolumeState::Attached, "attached"),
    (VolumeState::Detaching, "detaching"),
    (VolumeState::Detached, "detached"),
    (VolumeState::Deleting, "deleting"),
];

const ROBUSTNESS: [(Robustness, &str); 4] = [
    (Robustness::Unknown, "unknown"),
    (Robustness::Healthy, "healthy"),
    (Robustness::Degraded, "degraded"),
    (Robustness::Faulted, "faulted"),
];

const MODES: [(ReplicaMode, &str); 3] = [
    (ReplicaMode::ReadWrite, "RW"),
    (ReplicaMode::WriteOnly, "WO"),
    (ReplicaMode::Error, "ERR"),
];

// Tables, one family a line.
#[rustfmt::skip]
const VOLUME_GAUGES: [ValueOf<VolumeRow, i64>; 6] = [
    ("volume_capacity", "Size of the volume", Bytes, |v| v.capacity),
    ("volume_actual_size", "Bytes its data takes on a replica", Bytes, |v| v.actual_size),
    ("volume_replicas_wanted", "Replicas it should have", Count, |v| i64::from(v.replicas_wanted)),
    ("volume_replicas_healthy", "Replicas in its I/O path (RW)", Count, |v| v.replicas_healthy as i64),
    ("volume_snapshots", "Its snapshots", Count, |v| v.snapshots as i64),
    ("volume_snapshot_size", "Bytes its snapshots hold", Bytes, |v| v.snapshot_bytes),
];

#[rustfmt::skip]
const SCRUB_GAUGES: [ValueOf<ScrubReport, i64>; 6] = [
    ("volume_scrub_running", "1 while a scrub of the volume runs", Count, |s| i64::from(s.running)),
    ("volume_last_scrub_checked", "Bytes its running or last scrub checked against their checksums, all replicas", Bytes, |s| s.checked_bytes),
    ("volume_last_scrub_rotten", "Bytes its running or last scrub found failing their checksums", Bytes, |s| s.rotten_bytes),
    ("volume_last_scrub_repaired", "Bytes its running or last scrub rewrote from another replica's intact copy", Bytes, |s| s.repaired_bytes),
    ("volume_last_scrub_unrepaired", "Rotten bytes its running or last scrub found no intact copy of", Bytes, |s| s.unrepaired_bytes),
    ("volume_last_scrub_unsettled_chunks", "Comparisons of a 1 MiB chunk of one layer its running or last scrub found differing and could not settle", Count, |s| s.mismatched_chunks.saturating_sub(s.resolved_chunks)),
];

#[rustfmt::skip]
const STANDBY_GAUGES: [ValueOf<StandbyStatus, i64>; 4] = [
    ("volume_standby_backups_behind", "Completed backups newer than the one the standby volume holds", Count, |s| s.backups_behind),
    ("volume_standby_lag_seconds", "Seconds between the completion of the backup the standby volume holds and that of the newest", Count, |s| s.lag_seconds),
    ("volume_standby_last_restored_backup_timestamp_seconds", "When the backup the standby volume holds was completed, in seconds since the epoch", Count, |s| s.last_restored_backup_at.as_ref().map_or(0, |t| t.0.as_second())),
    ("volume_standby_last_restore", "Bytes of block data the standby volume's last restore wrote", Bytes, |s| s.last_step.as_ref().map_or(0, |s| s.bytes_restored)),
];

const REBUILD_LIMIT: &str =
    "Bytes per second each new rebuild of the attached volume may average; 0: no limit";

type Op = fn(&EngineMetrics) -> &Option<IoOpStats>;

const READ: Op = |m| &m.read;
const WRITE: Op = |m| &m.write;
const FLUSH: Op = |m| &m.flush;
const UNMAP: Op = |m| &m.unmap;

fn ops(op: &Option<IoOpStats>) -> u64 {
    op.as_ref().map_or(0, |o| o.ops)
}

fn bytes(op: &Option<IoOpStats>) -> u64 {
    op.as_ref().map_or(0, |o| o.bytes)
}

#[rustfmt::skip]
const IO_COUNTERS: [ValueOf<EngineMetrics, u64>; 11] = [
    ("volume_read_ops", "Reads its engine answered", Count, |m| ops(&m.read)),
    ("volume_write_ops", "Writes its engine answered", Count, |m| ops(&m.write)),
    ("volume_flush_ops", "Flushes its engine answered", Count, |m| ops(&m.flush)),
    ("volume_unmap_ops", "Unmaps its engine answered", Count, |m| ops(&m.unmap)),
    ("volume_read", "Bytes read from it", Bytes, |m| bytes(&m.read)),
    ("volume_write", "Bytes written to it", Bytes, |m| bytes(&m.write)),
    ("volume_unmap", "Bytes unmapped (discarded) on it", Bytes, |m| bytes(&m.unmap)),
    ("volume_rebuild_copied", REBUILD_COPIED, Bytes, |m| m.rebuild_bytes_copied),
    ("volume_checksum_failed", "Bytes replicas read that failed their checksums", Bytes, |m| m.checksum_failed_bytes),
    ("volume_repaired", "Bytes written back to replicas from a good copy", Bytes, |m| m.repaired_bytes),
    ("volume_unrecoverable", "Bytes no replica held a good copy of: their reads failed", Bytes, |m| m.unrecoverable_bytes),
];

const REBUILD_COPIED: &str = "Bytes its rebuilds copied to the replicas they rebuilt";

#[rustfmt::skip]
const LATENCIES: [(Family, Op); 3] = [
    (("volume_read_latency", "From a read's arrival at the engine to its answer", Seconds), READ),
    (("volume_write_latency", "From a write's arrival to every replica's answer", Seconds), WRITE),
    (("volume_flush_latency", "From a flush's arrival to every replica's answer", Seconds), FLUSH),
];

#[rustfmt::skip]
const DISK_GAUGES: [ValueOf<DiskRow, i64>; 4] = [
    ("disk_capacity", "Size of the disk's file system", Bytes, |d| d.capacity),
    ("disk_usage", "Bytes used on the disk's file system", Bytes, |d| d.used),
    ("disk_reserved", "Bytes of the disk kept from replicas", Bytes, |d| d.reserved),
    ("disk_scheduled", "Bytes of the disk promised to replicas", Bytes, |d| d.scheduled),
];

/// Encodes what the last scrape put in the view.
#[derive(Debug)]
pub struct Owned {
    view: Arc<Mutex<View>>,
}

impl Owned {
    pub fn new(view: Arc<Mutex<View>>) -> Self {
        Self { view }
    }
}

impl Collector for Owned {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), Error> {
        let view = self.view.lock().unwrap_or_else(PoisonError::into_inner);
        volumes(&mut encoder, &view)?;
        io(&mut encoder, &view)?;
        replicas(&mut encoder, &view)?;
        node(&mut encoder, &view)?;
        backups(&mut encoder, &view)?;
        processes(&mut encoder, &view)?;
        retrying(&mut encoder, &view)
    }
}

/// Writes `family`'s descriptor as a `kind`; the encoder to write its
/// series with.
fn descriptor<'a>(
    encoder: &'a mut DescriptorEncoder,
    (name, help, measure): (&'a str, &str, Measure),
    kind: MetricType,
) -> Result<prometheus_client::encoding::MetricEncoder<'a>, Error> {
    static BYTES: Unit = Unit::Bytes;
    static SECONDS: Unit = Unit::Seconds;
    let unit = match measure {
        Count => None,
        Bytes => Some(&BYTES),
        Seconds => Some(&SECONDS),
    };
    encoder.encode_descriptor(name, help, unit, kind)
}

/// One gauge family: its descriptor, then each sample.
fn gauges<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    family: (&str, &str, Measure),
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), Error> {
    let mut family = descriptor(encoder, family, MetricType::Gauge)?;
    for (labels, value) in samples {
        family.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// One counter family: its descriptor, then each sample.
fn counters<V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    family: (&str, &str, Measure),
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), Error> {
    let mut family = descriptor(encoder, family, MetricType::Counter)?;
    for (labels, value) in samples {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One histogram family of the engines' latencies, in seconds.
fn histograms<'a>(
    encoder: &mut DescriptorEncoder,
    family: Family,
    samples: impl IntoIterator<Item = (Labels, &'a LatencyHistogram)>,
) -> Result<(), Error> {
    let mut family = descriptor(encoder, family, MetricType::Histogram)?;
    for (labels, histogram) in samples {
        let sum = histogram.sum_ns as f64 / 1e9;
        family
            .encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(sum, histogram.count, &buckets(histogram), None)?;
    }
    Ok(())
}

/// The engine's cumulative counts per bound (ns) as the encoder wants
/// them: per bucket, bounds in seconds, +Inf last (the encoder sums them).
fn buckets(histogram: &LatencyHistogram) -> Vec<(f64, u64)> {
    let bounds = histogram.bounds_ns.iter().map(|ns| *ns as f64 / 1e9);
    let mut below = 0;
    bounds
        .chain(std::iter::once(f64::INFINITY))
        .zip(&histogram.cumulative_counts)
        .map(|(bound, cumulative)| {
            let in_bucket = cumulative.saturating_sub(below);
            below = below.max(*cumulative);
            (bound, in_bucket)
        })
        .collect()
}

fn volume_labels(row: &VolumeRow) -> Labels {
    let labels = &row.labels;
    vec![
        ("volume", labels.volume.clone()),
        ("pvc", labels.pvc.clone()),
        ("pvc_namespace", labels.pvc_namespace.clone()),
        ("node", labels.node.clone()),
    ]
}

/// `labels` plus `key`, one sample per value in `all`: 1 for `current`.
fn one_hot<'a, T: PartialEq + Copy + 'a>(
    labels: Labels,
    key: &'static str,
    all: &'a [(T, &'static str)],
    current: T,
) -> impl Iterator<Item = (Labels, i64)> + 'a {
    all.iter().map(move |(value, name)| {
        let mut labels = labels.clone();
        labels.push((key, (*name).to_owned()));
        (labels, i64::from(*value == current))
    })
}

/// `labels` plus the flag's reason, and the flag as 0/1.
fn flag(mut labels: Labels, flag: &Flag) -> (Labels, i64) {
    labels.push(("reason", flag.reason.clone()));
    (labels, i64::from(flag.on))
}

fn volumes(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let rows = &view.volumes;
    for (name, help, measure, value) in VOLUME_GAUGES {
        let samples = rows.iter().map(|v| (volume_labels(v), value(v)));
        gauges(e, (name, help, measure), samples)?;
    }
    let state = rows
        .iter()
        .flat_map(|v| one_hot(volume_labels(v), "state", &STATES, v.state));
    let help = "1 for the volume's current state";
    gauges(e, ("volume_state", help, Count), state)?;
    let robustness = rows
        .iter()
        .flat_map(|v| one_hot(volume_labels(v), "robustness", &ROBUSTNESS, v.robustness));
    let help = "1 for the volume's current robustness";
    gauges(e, ("volume_robustness", help, Count), robustness)?;
    let limits = rows
        .iter()
        .filter_map(|v| Some((volume_labels(v), v.rebuild_limit?)));
    let name = "volume_rebuild_limit_bytes_per_second";
    gauges(e, (name, REBUILD_LIMIT, Count), limits)?;
    let backed_up = rows
        .iter()
        .filter_map(|v| Some((volume_labels(v), v.last_backup?)));
    let help = "When the volume's newest completed backup was taken, in seconds since the epoch";
    gauges(
        e,
        ("volume_last_backup_timestamp_seconds", help, Count),
        backed_up,
    )?;
    for (name, help, measure, value) in STANDBY_GAUGES {
        let samples = rows
            .iter()
            .filter_map(|v| Some((volume_labels(v), value(v.standby.as_ref()?))));
        gauges(e, (name, help, measure), samples)?;
    }
    scrubs(e, rows)?;
    recurring_jobs(e, rows)
}

/// How each recurring job last ran on each volume: a failure stays 1 until
/// a later run of the job succeeds or skips the volume.
fn recurring_jobs(e: &mut DescriptorEncoder, rows: &[VolumeRow]) -> Result<(), Error> {
    let jobs = || {
        rows.iter().flat_map(|v| {
            v.jobs.iter().map(move |job| {
                let mut labels = volume_labels(v);
                labels.push(("job", job.name.clone()));
                (labels, job)
            })
        })
    };
    let failed =
        jobs().map(|(labels, job)| (labels, i64::from(job.state == VolumeJobState::Failed)));
    let help = "1 while the recurring job's last run on the volume failed";
    gauges(e, ("volume_recurring_job_failed", help, Count), failed)?;
    let succeeded = jobs()
        .filter_map(|(labels, job)| Some((labels, job.last_success_at.as_ref()?.0.as_second())));
    let help = "When the recurring job last succeeded on the volume, in seconds since the epoch";
    gauges(
        e,
        (
            "volume_recurring_job_last_success_timestamp_seconds",
            help,
            Count,
        ),
        succeeded,
    )
}

/// The volumes' running or last scrubs, as their status reports them.
fn scrubs(e: &mut DescriptorEncoder, rows: &[VolumeRow]) -> Result<(), Error> {
    let scrubbed = || {
        rows.iter()
            .filter_map(|v| Some((volume_labels(v), v.scrub.as_ref()?)))
    };
    for (name, help, measure, value) in SCRUB_GAUGES {
        let samples = scrubbed().map(|(labels, s)| (labels, value(s)));
        gauges(e, (name, help, measure), samples)?;
    }
    let finished =
        scrubbed().filter_map(|(labels, s)| Some((labels, s.finished.as_ref()?.0.as_second())));
    let help = "When the volume's last scrub finished, in seconds since the epoch";
    gauges(
        e,
        ("volume_last_scrub_timestamp_seconds", help, Count),
        finished,
    )
}

/// The volumes' I/O as their engines counted it.
fn io(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let counted = || {
        view.volumes
            .iter()
            .filter_map(|v| Some((volume_labels(v), v.io.as_ref()?)))
    };
    for (name, help, measure, value) in IO_COUNTERS {
        let samples = counted().map(|(labels, m)| (labels, value(m)));
        counters(e, (name, help, measure), samples)?;
    }
    let errors = counted().flat_map(|(labels, m)| {
        [
            ("read", READ),
            ("write", WRITE),
            ("flush", FLUSH),
            ("unmap", UNMAP),
        ]
        .map(|(op, pick)| {
            let mut labels = labels.clone();
            labels.push(("op", op.to_owned()));
            (labels, pick(m).as_ref().map_or(0, |o| o.errors))
        })
    });
    let help = "Operations on the volume that failed, by op";
    counters(e, ("volume_io_errors", help, Count), errors)?;
    for (family, pick) in LATENCIES {
        let latencies =
            counted().filter_map(|(labels, m)| Some((labels, pick(m).as_ref()?.latency.as_ref()?)));
        histograms(e, family, latencies)?;
    }
    Ok(())
}

fn replicas(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let modes = view.replicas.iter().flat_map(|r| {
        let labels = vec![
            ("volume", r.volume.clone()),
            ("replica", r.replica.clone()),
            ("node", r.node.clone()),
        ];
        one_hot(labels, "mode", &MODES, r.mode)
    });
    let help = "1 for the replica's mode in its engine: RW (in the I/O path), WO (rebuilding), ERR";
    gauges(e, ("replica_mode", help, Count), modes)?;
    let progress = view.rebuilds.iter().map(|r| {
        let labels = vec![
            ("volume", r.volume.clone()),
            ("replica", r.replica.clone()),
            ("source", r.source.clone()),
        ];
        (labels, r.progress)
    });
    let help = "How far the replica's rebuild has got, 0 to 1";
    gauges(e, ("rebuild_progress_ratio", help, Count), progress)
}

fn node(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let Some(node) = &view.own_node else {
        return Ok(());
    };
    let at = || vec![("node", view.node.clone())];
    let help = "1 when the node is ready for volumes, with the reason when not";
    gauges(e, ("node_ready", help, Count), [flag(at(), &node.ready)])?;
    let help = "1 when new replicas may be placed on the node, with the reason when not";
    gauges(
        e,
        ("node_schedulable", help, Count),
        [flag(at(), &node.schedulable)],
    )?;
    let disk = |d: &DiskRow| vec![("node", view.node.clone()), ("disk", d.disk.clone())];
    for (name, help, measure, value) in DISK_GAUGES {
        let samples = node.disks.iter().map(|d| (disk(d), value(d)));
        gauges(e, (name, help, measure), samples)?;
    }
    let ready = node.disks.iter().map(|d| flag(disk(d), &d.ready));
    let help = "1 when the disk is usable, with the reason when not";
    gauges(e, ("disk_ready", help, Count), ready)?;
    let schedulable = node.disks.iter().map(|d| flag(disk(d), &d.schedulable));
    let help = "1 when new replicas may be placed on the disk, with the reason when not";
    gauges(e, ("disk_schedulable", help, Count), schedulable)
}

fn backups(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let targets = view
        .targets
        .iter()
        .map(|t| flag(vec![("backup_target", t.target.clone())], &t.available));
    let help = "1 when the backup target's store answers, with the reason when not";
    gauges(e, ("backup_target_available", help, Count), targets)?;
    let jobs = view
        .jobs
        .iter()
        .map(|j| flag(vec![("job", j.job.clone())], &j.on_schedule));
    let help =
        "1 while the recurring job's runs finish before their next time, with the reason when not";
    gauges(e, ("recurring_job_on_schedule", help, Count), jobs)?;
    let backups = view.backups.iter().map(|((volume, state), count)| {
        let labels = vec![("volume", volume.clone()), ("state", (*state).to_owned())];
        (labels, *count as i64)
    });
    gauges(
        e,
        ("backups", "The volume's backups, by state", Count),
        backups,
    )
}

/// The CPU time and memory of the node's manager and instance manager.
fn processes(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let at = || vec![("node", view.node.clone())];
    for (process, usage) in [
        ("manager", view.manager),
        ("instance_manager", view.instance_manager),
    ] {
        let Some(usage) = usage else { continue };
        let what = process.replace('_', " ");
        let (name, help) = (
            format!("{process}_cpu"),
            format!("CPU time the {what} process has used"),
        );
        counters(
            e,
            (&name, &help, Seconds),
            [(at(), usage.cpu.as_secs_f64())],
        )?;
        let name = format!("{process}_resident_memory");
        let help = format!("Resident memory of the {what} process");
        gauges(e, (&name, &help, Bytes), [(at(), usage.resident)])?;
    }
    Ok(())
}

/// Objects waiting to retry after a failed reconcile, per controller (as
/// the reconcile counters name them).
fn retrying(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let waiting = view.retrying.iter().map(|(kind, count)| {
        let labels = vec![("controller", kind.to_lowercase())];
        (labels, *count as i64)
    });
    let help = "Objects whose last reconcile failed, waiting to be retried";
    gauges(e, ("controller_retrying_objects", help, Count), waiting)
}
