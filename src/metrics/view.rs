//! What one manager reports, read from the shared caches at scrape time:
//! plain rows, so that what is owned and how it is counted is tested without
//! a cluster, and encoding ([`super::families`]) only writes them out.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::datastore::Datastore;
use crate::protocol::control::EngineMetrics;
use crate::types::{
    Backup, BackupState, BackupTarget, Condition, ConditionStatus, Engine, EngineStatus,
    InstanceState, Node, PVC_NAME, PVC_NAMESPACE, RecurringJob, Replica, ReplicaMode, Robustness,
    ScrubReport, StandbyStatus, Volume, VolumeState,
};

use super::process::{self, Usage};
use crate::controller::ON_SCHEDULE;
use crate::controller::backup::AVAILABLE as TARGET_AVAILABLE;

/// Labels of a volume's series.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeLabels {
    pub volume: String,
    pub pvc: String,
    pub pvc_namespace: String,
    /// The manager reporting it: the volume's owner.
    pub node: String,
}

#[derive(Debug, Default)]
pub struct VolumeRow {
    pub labels: VolumeLabels,
    pub capacity: i64,
    pub actual_size: i64,
    pub state: VolumeState,
    pub robustness: Robustness,
    pub replicas_wanted: i32,
    /// Replicas the engine reports in RW mode.
    pub replicas_healthy: usize,
    /// When its newest completed backup was taken, in seconds since the
    /// epoch.
    pub last_backup: Option<f64>,
    /// Snapshots the engine reports (not removed), and their bytes.
    pub snapshots: usize,
    pub snapshot_bytes: i64,
    /// Bytes per second each new rebuild may average (0: no limit), while
    /// its engine runs.
    pub rebuild_limit: Option<i64>,
    /// Its engine, through which its I/O figures are read.
    pub engine: Option<Arc<Engine>>,
    /// What its engine counted, when it runs here and answered.
    pub io: Option<EngineMetrics>,
    /// Its running or last scrub, once it had one.
    pub scrub: Option<ScrubReport>,
    /// How each recurring job it is in last ran on it.
    pub jobs: Vec<crate::types::VolumeJob>,
    /// What it holds and follows, while it is a standby volume.
    pub standby: Option<StandbyStatus>,
}

#[derive(Debug, PartialEq)]
pub struct ReplicaRow {
    pub volume: String,
    pub replica: String,
    pub node: String,
    pub mode: ReplicaMode,
}

#[derive(Debug, PartialEq)]
pub struct RebuildRow {
    pub volume: String,
    pub replica: String,
    /// The replica it copies from.
    pub source: String,
    pub progress: f64,
}

/// A condition as a 0/1 value with its reason.
#[derive(Debug, Default, PartialEq)]
pub struct Flag {
    pub on: bool,
    pub reason: String,
}

impl Flag {
    fn of(conditions: &[Condition], type_: &str) -> Self {
        let found = conditions.iter().find(|c| c.type_ == type_);
        Self {
            on: found.is_some_and(|c| c.status == ConditionStatus::True),
            reason: found.map(|c| c.reason.clone()).unwrap_or_default(),
        }
    }
}

#[derive(Debug, Default, PartialEq)]
pub struct DiskRow {
    pub disk: String,
    pub capacity: i64,
    pub used: i64,
    pub reserved: i64,
    pub scheduled: i64,
    pub ready: Flag,
    pub schedulable: Flag,
}

#[derive(Debug, Default, PartialEq)]
pub struct NodeRow {
    pub ready: Flag,
    pub schedulable: Flag,
    pub disks: Vec<DiskRow>,
}

#[derive(Debug, PartialEq)]
pub struct TargetRow {
    pub target: String,
    pub available: Flag,
}

/// A recurring job whose runs this manager starts.
#[derive(Debug, PartialEq)]
pub struct JobRow {
    pub job: String,
    /// Its `OnSchedule` condition: off while a run is still going at the
    /// next time it is due.
    pub on_schedule: Flag,
}

/// Everything one scrape reports.
#[derive(Debug, Default)]
pub struct View {
    pub node: String,
    pub volumes: Vec<VolumeRow>,
    pub replicas: Vec<ReplicaRow>,
    pub rebuilds: Vec<RebuildRow>,
    pub own_node: Option<NodeRow>,
    pub targets: Vec<TargetRow>,
    pub jobs: Vec<JobRow>,
    /// Backups of owned volumes by (volume, state).
    pub backups: BTreeMap<(String, &'static str), u64>,
    pub manager: Option<Usage>,
    /// The node's instance manager, when it is a process of its own.
    pub instance_manager: Option<Usage>,
    /// Objects per kind waiting to retry after a failed reconcile.
    pub retrying: BTreeMap<String, usize>,
}

/// The objects a view is made of, as the caches hold them.
pub struct Objects<'a> {
    pub volumes: &'a [Arc<Volume>],
    pub engines: &'a [Arc<Engine>],
    pub replicas: &'a [Arc<Replica>],
    pub nodes: &'a [Arc<Node>],
    pub targets: &'a [Arc<BackupTarget>],
    pub backups: &'a [Arc<Backup>],
    pub jobs: &'a [Arc<RecurringJob>],
}

impl View {
    /// What the manager of `node` owns, as its caches have it now.
    pub fn of(ds: &Datastore, node: &str) -> Self {
        let objects = Objects {
            volumes: &ds.volumes.store.state(),
            engines: &ds.engines.store.state(),
            replicas: &ds.replicas.store.state(),
            nodes: &ds.nodes.store.state(),
            targets: &ds.backup_targets.store.state(),
            backups: &ds.backups.store.state(),
            jobs: &ds.recurring_jobs.store.state(),
        };
        Self {
            manager: process::usage(std::process::id()),
            ..Self::from_objects(node, &objects)
        }
    }

    /// What the manager of `node` owns among `objects`.
    pub fn from_objects(node: &str, objects: &Objects) -> Self {
        let mut view = Self {
            node: node.to_owned(),
            ..Self::default()
        };
        let index = Index::of(objects);
        let owned = objects.volumes.iter().filter(|v| {
            v.status
                .as_ref()
                .is_some_and(|s| s.owner_id == node && v.metadata.deletion_timestamp.is_none())
        });
        for volume in owned {
            view.add_volume(volume, &index);
        }
        view.own_node = objects
            .nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(node))
            .map(|n| node_row(n));
        view.targets = objects
            .targets
            .iter()
            .filter(|t| t.status.as_ref().is_some_and(|s| s.owner_id == node))
            .map(|t| target_row(t))
            .collect();
        view.jobs = objects
            .jobs
            .iter()
            .filter_map(|j| {
                let status = j.status.as_ref().filter(|s| s.owner_id == node)?;
                // None before its first look, or while its schedule does
                // not parse (no run goes on).
                status.conditions.iter().find(|c| c.type_ == ON_SCHEDULE)?;
                Some(JobRow {
                    job: j.metadata.name.clone().unwrap_or_default(),
                    on_schedule: Flag::of(&status.conditions, ON_SCHEDULE),
                })
            })
            .collect();
        view
    }

    fn add_volume(&mut self, volume: &Volume, index: &Index) {
        let name = volume.metadata.name.clone().unwrap_or_default();
        let status = volume.status.clone().unwrap_or_default();
        let annotation = |key: &str| {
            let annotations = volume.metadata.annotations.as_ref();
            annotations
                .and_then(|a| a.get(key))
                .cloned()
                .unwrap_or_default()
        };
        let engine = index.engines.get(name.as_str()).copied();
        // A stopped engine's status is emptied: nothing to report of it.
        let running = engine
            .and_then(|e| e.status.as_ref())
            .filter(|s| s.instance.current_state == InstanceState::Running);
        let engine_status = running.cloned().unwrap_or_default();
        let snapshots = engine_status.snapshots.values().filter(|s| !s.removed);
        let backups = index
            .backups
            .get(name.as_str())
            .map_or(&[][..], Vec::as_slice);
        // The newest completed backup's: the Backups say it, whichever
        // target they are in.
        let last_backup = backups
            .iter()
            .filter_map(|b| b.status.as_ref())
            .filter(|s| s.state == BackupState::Completed)
            .filter_map(|s| s.backup_created_at.as_ref())
            .map(|created| created.0.as_millisecond() as f64 / 1000.0)
            .reduce(f64::max);
        self.volumes.push(VolumeRow {
            labels: VolumeLabels {
                volume: name.clone(),
                pvc: annotation(PVC_NAME),
                pvc_namespace: annotation(PVC_NAMESPACE),
                node: self.node.clone(),
            },
            capacity: volume.spec.size,
            actual_size: status.actual_size,
            state: status.state,
            robustness: status.robustness,
            replicas_wanted: volume.spec.number_of_replicas,
            replicas_healthy: engine_status
                .replica_mode_map
                .values()
                .filter(|m| **m == ReplicaMode::ReadWrite)
                .count(),
            last_backup,
            snapshots: snapshots.clone().count(),
            snapshot_bytes: snapshots.map(|s| s.size).sum(),
            rebuild_limit: running.map(|s| s.rebuild_bandwidth_limit << 20),
            engine: engine.cloned(),
            io: None,
            scrub: status.last_scrub.clone(),
            jobs: status.recurring_jobs.clone(),
            standby: status.standby.clone().filter(|_| volume.is_standby()),
        });
        if let (Some(engine), Some(status)) = (engine, running) {
            self.add_replicas(&name, engine, status, index);
        }
        for backup in backups {
            let state = backup_state(backup.status.as_ref().map(|s| s.state));
            *self.backups.entry((name.clone(), state)).or_default() += 1;
        }
    }

    fn add_replicas(
        &mut self,
        volume: &str,
        engine: &Engine,
        status: &EngineStatus,
        index: &Index,
    ) {
        for (replica, mode) in &status.replica_mode_map {
            let node = index.replica_nodes.get(replica.as_str());
            self.replicas.push(ReplicaRow {
                volume: volume.to_owned(),
                replica: replica.clone(),
                node: node.map(|n| (*n).to_owned()).unwrap_or_default(),
                mode: *mode,
            });
        }
        // Rebuilds name replicas by address.
        let name_of = |address: &str| {
            let mut named = engine.spec.replica_address_map.iter();
            named
                .find(|(_, a)| *a == address)
                .map_or_else(|| address.to_owned(), |(name, _)| name.clone())
        };
        for (address, rebuild) in &status.rebuild_status {
            if rebuild.is_rebuilding {
                self.rebuilds.push(RebuildRow {
                    volume: volume.to_owned(),
                    replica: name_of(address),
                    source: name_of(&rebuild.from_replica_address),
                    progress: f64::from(rebuild.progress.clamp(0, 100)) / 100.0,
                });
            }
        }
    }
}

/// The objects looked up per volume, indexed once per scrape: a scrape of
/// a thousand volumes makes no search per volume.
struct Index<'a> {
    /// Engine by its volume.
    engines: HashMap<&'a str, &'a Arc<Engine>>,
    /// A replica's node by the replica's name.
    replica_nodes: HashMap<&'a str, &'a str>,
    /// Backups by their volume.
    backups: HashMap<&'a str, Vec<&'a Arc<Backup>>>,
}

impl<'a> Index<'a> {
    fn of(objects: &'a Objects) -> Self {
        let engines = objects.engines.iter();
        let replicas = objects.replicas.iter();
        let mut backups: HashMap<&str, Vec<&Arc<Backup>>> = HashMap::new();
        for backup in objects.backups {
            backups
                .entry(&backup.spec.volume_name)
                .or_default()
                .push(backup);
        }
        Self {
            engines: engines
                .map(|e| (e.spec.instance.volume_name.as_str(), e))
                .collect(),
            replica_nodes: replicas
                .filter_map(|r| {
                    Some((
                        r.metadata.name.as_deref()?,
                        r.spec.instance.node_id.as_str(),
                    ))
                })
                .collect(),
            backups,
        }
    }
}

fn backup_state(state: Option<BackupState>) -> &'static str {
    match state.unwrap_or_default() {
        BackupState::Pending => "pending",
        BackupState::InProgress => "in_progress",
        BackupState::Completed => "completed",
        BackupState::Error => "error",
    }
}

fn node_row(node: &Node) -> NodeRow {
    let Some(status) = &node.status else {
        return NodeRow::default();
    };
    let disks = status
        .disk_status
        .iter()
        .map(|(disk, s)| DiskRow {
            disk: disk.clone(),
            capacity: s.storage_maximum,
            used: s.storage_maximum.saturating_sub(s.storage_available),
            reserved: node.spec.disks.get(disk).map_or(0, |d| d.storage_reserved),
            scheduled: s.storage_scheduled,
            ready: Flag::of(&s.conditions, "Ready"),
            schedulable: Flag::of(&s.conditions, "Schedulable"),
        })
        .collect();
    NodeRow {
        ready: Flag::of(&status.conditions, "Ready"),
        schedulable: Flag::of(&status.conditions, "Schedulable"),
        disks,
    }
}

fn target_row(target: &BackupTarget) -> TargetRow {
    let status = target.status.clone().unwrap_or_default();
    TargetRow {
        target: target.metadata.name.clone().unwrap_or_default(),
        available: Flag {
            on: status.available,
            ..Flag::of(&status.conditions, TARGET_AVAILABLE)
        },
    }
}
