//! The metric families written from a [`View`], on each scrape.
//!
//! Series per volume: capacity, actual size, 6 state and 4 robustness
//! series, wanted and healthy replicas, snapshot count and bytes, rebuild
//! limit, last backup time (once one exists), plus 3 mode series per
//! replica, one progress series per rebuilding replica and one per backup
//! state the volume has.

use std::fmt::Error;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Unit;

use super::view::{Flag, View, VolumeLabels};
use crate::protocol::control::{EngineMetrics, IoOpStats, LatencyHistogram};
use crate::types::{ReplicaMode, Robustness, VolumeState};

type Labels = Vec<(&'static str, String)>;

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
        processes(&mut encoder, &view)
    }
}

/// One gauge family: its descriptor, then each sample.
fn gauges<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<Unit>),
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), Error> {
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, value) in samples {
        family.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// One counter family: its descriptor, then each sample.
fn counters<V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<Unit>),
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), Error> {
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, value) in samples {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn volume_labels(labels: &VolumeLabels) -> Labels {
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
    let each = |value: fn(&super::view::VolumeRow) -> i64| {
        rows.iter()
            .map(move |v| (volume_labels(&v.labels), value(v)))
    };
    gauges(
        e,
        ("volume_capacity", "Size of the volume", Some(Unit::Bytes)),
        each(|v| v.capacity),
    )?;
    let actual = (
        "volume_actual_size",
        "Bytes the volume's data takes on a replica",
        Some(Unit::Bytes),
    );
    gauges(e, actual, each(|v| v.actual_size))?;
    let state = rows
        .iter()
        .flat_map(|v| one_hot(volume_labels(&v.labels), "state", &STATES, v.state));
    gauges(
        e,
        ("volume_state", "1 for the volume's current state", None),
        state,
    )?;
    let robustness = rows.iter().flat_map(|v| {
        one_hot(
            volume_labels(&v.labels),
            "robustness",
            &ROBUSTNESS,
            v.robustness,
        )
    });
    let help = "1 for the volume's current robustness";
    gauges(e, ("volume_robustness", help, None), robustness)?;
    let wanted = (
        "volume_replicas_wanted",
        "Replicas the volume should have",
        None,
    );
    gauges(e, wanted, each(|v| i64::from(v.replicas_wanted)))?;
    let healthy = (
        "volume_replicas_healthy",
        "Replicas in the volume's I/O path (RW)",
        None,
    );
    gauges(e, healthy, each(|v| v.replicas_healthy as i64))?;
    gauges(
        e,
        ("volume_snapshots", "Snapshots of the volume", None),
        each(|v| v.snapshots as i64),
    )?;
    let bytes = (
        "volume_snapshot_size",
        "Bytes the volume's snapshots hold",
        Some(Unit::Bytes),
    );
    gauges(e, bytes, each(|v| v.snapshot_bytes))?;
    let help = "Bytes per second each new rebuild of the volume may average; 0: no limit";
    gauges(
        e,
        ("volume_rebuild_limit_bytes_per_second", help, None),
        each(|v| v.rebuild_limit),
    )?;
    let backed_up = rows
        .iter()
        .filter_map(|v| Some((volume_labels(&v.labels), v.last_backup?)));
    let help = "When the volume's last backup was taken, in seconds since the epoch";
    gauges(
        e,
        ("volume_last_backup_timestamp_seconds", help, None),
        backed_up,
    )
}

/// One histogram family of latencies, in seconds.
fn histograms<'a>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    samples: impl IntoIterator<Item = (Labels, &'a LatencyHistogram)>,
) -> Result<(), Error> {
    let unit = Some(&Unit::Seconds);
    let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Histogram)?;
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

/// The volumes' I/O as their engines counted it.
fn io(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let counted = || {
        view.volumes
            .iter()
            .filter_map(|v| Some((volume_labels(&v.labels), v.io.as_ref()?)))
    };
    type Pick = fn(&EngineMetrics) -> Option<&IoOpStats>;
    let ops = |pick: Pick| counted().map(move |(l, m)| (l, pick(m).map_or(0, |o| o.ops)));
    let bytes = |pick: Pick| counted().map(move |(l, m)| (l, pick(m).map_or(0, |o| o.bytes)));
    let latency =
        |pick: Pick| counted().filter_map(move |(l, m)| Some((l, pick(m)?.latency.as_ref()?)));
    let (read, write): (Pick, Pick) = (|m| m.read.as_ref(), |m| m.write.as_ref());
    let (flush, unmap): (Pick, Pick) = (|m| m.flush.as_ref(), |m| m.unmap.as_ref());
    counters(
        e,
        (
            "volume_read_ops",
            "Reads the volume's engine answered",
            None,
        ),
        ops(read),
    )?;
    counters(
        e,
        (
            "volume_write_ops",
            "Writes the volume's engine answered",
            None,
        ),
        ops(write),
    )?;
    counters(
        e,
        (
            "volume_flush_ops",
            "Flushes the volume's engine answered",
            None,
        ),
        ops(flush),
    )?;
    counters(
        e,
        (
            "volume_unmap_ops",
            "Unmaps (discards) the volume's engine answered",
            None,
        ),
        ops(unmap),
    )?;
    counters(
        e,
        (
            "volume_read",
            "Bytes read from the volume",
            Some(Unit::Bytes),
        ),
        bytes(read),
    )?;
    counters(
        e,
        (
            "volume_write",
            "Bytes written to the volume",
            Some(Unit::Bytes),
        ),
        bytes(write),
    )?;
    counters(
        e,
        (
            "volume_unmap",
            "Bytes unmapped (discarded) on the volume",
            Some(Unit::Bytes),
        ),
        bytes(unmap),
    )?;
    let help = "Bytes the volume's rebuilds copied to the replicas they rebuilt";
    let rebuilt = counted().map(|(labels, m)| (labels, m.rebuild_bytes_copied));
    counters(
        e,
        ("volume_rebuild_copied", help, Some(Unit::Bytes)),
        rebuilt,
    )?;
    let errors = counted().flat_map(|(labels, m)| {
        [
            ("read", read),
            ("write", write),
            ("flush", flush),
            ("unmap", unmap),
        ]
        .map(|(op, pick)| {
            let mut labels = labels.clone();
            labels.push(("op", op.to_owned()));
            (labels, pick(m).map_or(0, |o| o.errors))
        })
    });
    counters(
        e,
        (
            "volume_io_errors",
            "Operations on the volume that failed, by op",
            None,
        ),
        errors,
    )?;
    let help = "Time from a read's arrival at the engine to its answer";
    histograms(e, ("volume_read_latency", help), latency(read))?;
    let help = "Time from a write's arrival at the engine to its answer (every replica's)";
    histograms(e, ("volume_write_latency", help), latency(write))?;
    let help = "Time from a flush's arrival at the engine to its answer";
    histograms(e, ("volume_flush_latency", help), latency(flush))
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
    gauges(e, ("replica_mode", help, None), modes)?;
    let progress = view.rebuilds.iter().map(|r| {
        let labels = vec![("volume", r.volume.clone()), ("replica", r.replica.clone())];
        (labels, r.progress)
    });
    let help = "How far the replica's rebuild has got, 0 to 1";
    gauges(e, ("rebuild_progress_ratio", help, None), progress)
}

fn node(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let Some(node) = &view.own_node else {
        return Ok(());
    };
    let at = || vec![("node", view.node.clone())];
    let help = "1 when the node is ready for volumes, with the reason when not";
    gauges(e, ("node_ready", help, None), [flag(at(), &node.ready)])?;
    let help = "1 when new replicas may be placed on the node, with the reason when not";
    gauges(
        e,
        ("node_schedulable", help, None),
        [flag(at(), &node.schedulable)],
    )?;
    let disk =
        |d: &super::view::DiskRow| vec![("node", view.node.clone()), ("disk", d.disk.clone())];
    let each = |value: fn(&super::view::DiskRow) -> i64| {
        node.disks.iter().map(move |d| (disk(d), value(d)))
    };
    gauges(
        e,
        (
            "disk_capacity",
            "Size of the disk's file system",
            Some(Unit::Bytes),
        ),
        each(|d| d.capacity),
    )?;
    gauges(
        e,
        (
            "disk_usage",
            "Bytes used on the disk's file system",
            Some(Unit::Bytes),
        ),
        each(|d| d.used),
    )?;
    let reserved = (
        "disk_reserved",
        "Bytes of the disk kept from replicas",
        Some(Unit::Bytes),
    );
    gauges(e, reserved, each(|d| d.reserved))?;
    let scheduled = (
        "disk_scheduled",
        "Bytes of the disk promised to its replicas",
        Some(Unit::Bytes),
    );
    gauges(e, scheduled, each(|d| d.scheduled))?;
    let ready = node.disks.iter().map(|d| flag(disk(d), &d.ready));
    gauges(
        e,
        (
            "disk_ready",
            "1 when the disk is usable, with the reason when not",
            None,
        ),
        ready,
    )?;
    let schedulable = node.disks.iter().map(|d| flag(disk(d), &d.schedulable));
    let help = "1 when new replicas may be placed on the disk, with the reason when not";
    gauges(e, ("disk_schedulable", help, None), schedulable)
}

fn backups(e: &mut DescriptorEncoder, view: &View) -> Result<(), Error> {
    let targets = view
        .targets
        .iter()
        .map(|t| flag(vec![("backup_target", t.target.clone())], &t.available));
    let help = "1 when the backup target's store answers, with the reason when not";
    gauges(e, ("backup_target_available", help, None), targets)?;
    let backups = view.backups.iter().map(|((volume, state), count)| {
        let labels = vec![("volume", volume.clone()), ("state", (*state).to_owned())];
        (labels, *count as i64)
    });
    gauges(
        e,
        ("backups", "The volume's backups, by state", None),
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
        let name = format!("{process}_cpu");
        let help = format!(
            "CPU time the {} process has used",
            process.replace('_', " ")
        );
        counters(
            e,
            (&name, &help, Some(Unit::Seconds)),
            [(at(), usage.cpu.as_secs_f64())],
        )?;
        let name = format!("{process}_resident_memory");
        let help = format!(
            "Resident memory of the {} process",
            process.replace('_', " ")
        );
        gauges(
            e,
            (&name, &help, Some(Unit::Bytes)),
            [(at(), usage.resident)],
        )?;
    }
    Ok(())
}
