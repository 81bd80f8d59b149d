//! What the scheduler's tests build: nodes, volumes, replicas and a world
//! to schedule in.

use std::collections::{BTreeMap, BTreeSet};

use super::super::*;
use crate::types::{DesireState, InstanceSpec, NodeSpec, NodeStatus, ReplicaSpec, VolumeSpec};

pub(super) const GIB: i64 = 1 << 30;
pub(super) const VOLUME: &str = "vol";

/// Builds a Node: ready, allowing scheduling, with the disks added by `disk`.
pub(super) struct NodeBuilder(pub(super) Node);

/// A ready, schedulable node without disks.
pub(super) fn bare_node(name: &str) -> NodeBuilder {
    let spec = NodeSpec {
        disks: BTreeMap::new(),
        allow_scheduling: true,
        tags: vec![],
        eviction_requested: false,
    };
    let mut node = Node::new(name, spec);
    node.status = Some(NodeStatus {
        conditions: vec![condition("Ready", ConditionStatus::True)],
        ..NodeStatus::default()
    });
    NodeBuilder(node)
}

/// A ready, schedulable node with one empty 100 GiB disk "default" whose fsid is "{name}-fs".
pub(super) fn node(name: &str) -> NodeBuilder {
    bare_node(name).disk("default", &format!("{name}-fs"), 100 * GIB, 100 * GIB)
}

impl NodeBuilder {
    pub(super) fn status(&mut self) -> &mut NodeStatus {
        self.0.status.get_or_insert_with(NodeStatus::default)
    }

    /// Adds (or replaces) a schedulable, ready disk with `maximum` bytes, `available` free.
    pub(super) fn disk(mut self, name: &str, fsid: &str, maximum: i64, available: i64) -> Self {
        let spec = DiskSpec {
            path: format!("/var/lib/oxhorn/{name}"),
            allow_scheduling: true,
            storage_reserved: 0,
            tags: vec![],
            eviction_requested: false,
        };
        self.0.spec.disks.insert(name.to_string(), spec);
        let status = DiskStatus {
            storage_available: available,
            storage_maximum: maximum,
            storage_scheduled: 0,
            fsid: fsid.to_string(),
            scheduled_replicas: 0,
            conditions: vec![
                condition("Ready", ConditionStatus::True),
                condition("Schedulable", ConditionStatus::True),
            ],
        };
        self.status().disk_status.insert(name.to_string(), status);
        self
    }

    pub(super) fn disk_spec(mut self, name: &str, edit: impl FnOnce(&mut DiskSpec)) -> Self {
        if let Some(disk) = self.0.spec.disks.get_mut(name) {
            edit(disk);
        }
        self
    }

    pub(super) fn disk_status(mut self, name: &str, edit: impl FnOnce(&mut DiskStatus)) -> Self {
        if let Some(disk) = self.status().disk_status.get_mut(name) {
            edit(disk);
        }
        self
    }

    pub(super) fn zone(mut self, zone: &str) -> Self {
        self.status().zone = zone.to_string();
        self
    }

    pub(super) fn tags(mut self, tags: &[&str]) -> Self {
        self.0.spec.tags = strings(tags);
        self
    }

    pub(super) fn allow_scheduling(mut self, allow: bool) -> Self {
        self.0.spec.allow_scheduling = allow;
        self
    }

    pub(super) fn evicting(mut self, evicting: bool) -> Self {
        self.0.spec.eviction_requested = evicting;
        self
    }

    pub(super) fn ready(mut self, status: ConditionStatus) -> Self {
        self.status().conditions = vec![condition("Ready", status)];
        self
    }
}

pub(super) fn condition(type_: &str, status: ConditionStatus) -> Condition {
    Condition {
        type_: type_.to_string(),
        status,
        reason: String::new(),
        message: String::new(),
        last_transition_time: None,
        observed_generation: None,
    }
}

pub(super) fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

pub(super) fn volume(size: i64, replicas: i32) -> Volume {
    Volume::new(
        VOLUME,
        VolumeSpec {
            size,
            number_of_replicas: replicas,
            frontend: Default::default(),
            chap_secret: String::new(),
            node_id: String::new(),
            data_locality: Default::default(),
            stale_replica_timeout: 2880,
            from_backup: String::new(),
            salvage_request: String::new(),
            disk_selector: vec![],
            node_selector: vec![],
            replica_auto_balance: Default::default(),
            access_mode: Default::default(),
            data_source: None,
            revert: None,
            standby: false,
        },
    )
}

pub(super) fn replica(
    name: &str,
    volume: &str,
    size: i64,
    node_id: &str,
    disk_id: &str,
) -> Replica {
    Replica::new(
        name,
        ReplicaSpec {
            instance: InstanceSpec {
                volume_name: volume.to_string(),
                volume_size: size,
                node_id: node_id.to_string(),
                desire_state: DesireState::Stopped,
                image: String::new(),
            },
            engine_name: String::new(),
            disk_id: disk_id.to_string(),
            disk_path: String::new(),
            data_directory_name: String::new(),
            healthy_at: None,
            failed_at: None,
            rejoins: 0,
        },
    )
}

/// A cluster: nodes, every replica, and which nodes are down.
#[derive(Default)]
pub(super) struct World {
    pub(super) nodes: Vec<Arc<Node>>,
    pub(super) replicas: Vec<Arc<Replica>>,
    pub(super) down: Vec<String>,
}

impl World {
    pub(super) fn new(nodes: impl IntoIterator<Item = NodeBuilder>) -> Self {
        Self {
            nodes: nodes.into_iter().map(|b| Arc::new(b.0)).collect(),
            ..Self::default()
        }
    }

    pub(super) fn with_replica(mut self, r: Replica) -> Self {
        self.replicas.push(Arc::new(r));
        self
    }

    pub(super) fn down(mut self, node: &str) -> Self {
        self.down.push(node.to_string());
        self
    }

    /// Schedules a replica of `volume`; its siblings are the replicas of the same volume name.
    pub(super) fn schedule(
        &self,
        volume: &Volume,
        settings: &SchedulerSettings,
        rng: &mut fastrand::Rng,
    ) -> Result<Placement, Unschedulable> {
        let name = volume.metadata.name.as_deref().unwrap_or_default();
        let siblings: Vec<&Replica> = self
            .replicas
            .iter()
            .filter(|r| r.spec.instance.volume_name == name)
            .map(|r| &**r)
            .collect();
        let up = |node: &str| !self.down.iter().any(|d| d == node);
        let cluster = Cluster {
            nodes: &self.nodes,
            replicas: &self.replicas,
            node_up: &up,
        };
        schedule(&cluster, volume, &siblings, settings, rng)
    }

    /// Schedules with a fresh rng seeded with `seed`.
    pub(super) fn schedule_seeded(
        &self,
        volume: &Volume,
        settings: &SchedulerSettings,
        seed: u64,
    ) -> Result<Placement, Unschedulable> {
        self.schedule(volume, settings, &mut fastrand::Rng::with_seed(seed))
    }

    /// Schedules with the default settings and seed 0.
    pub(super) fn schedule_default(&self, volume: &Volume) -> Result<Placement, Unschedulable> {
        self.schedule_seeded(volume, &SchedulerSettings::default(), 0)
    }

    /// The nodes chosen over 50 seeds: which nodes the rules leave in the running.
    pub(super) fn chosen_nodes(
        &self,
        volume: &Volume,
        settings: &SchedulerSettings,
    ) -> BTreeSet<String> {
        (0..50)
            .filter_map(|seed| self.schedule_seeded(volume, settings, seed).ok())
            .map(|p| p.node_id)
            .collect()
    }

    /// Schedules a replica of `volume` and records it, as the volume controller would.
    pub(super) fn place(
        &mut self,
        volume: &Volume,
        settings: &SchedulerSettings,
        rng: &mut fastrand::Rng,
    ) -> Result<Placement, Unschedulable> {
        let placement = self.schedule(volume, settings, rng)?;
        let name = format!("{VOLUME}-r-{}", self.replicas.len());
        let r = replica(
            &name,
            VOLUME,
            volume.spec.size,
            &placement.node_id,
            &placement.disk_id,
        );
        self.replicas.push(Arc::new(r));
        Ok(placement)
    }

    /// Nodes holding a replica of the test volume, in order of placement.
    pub(super) fn volume_nodes(&self) -> Vec<String> {
        self.replicas
            .iter()
            .filter(|r| r.spec.instance.volume_name == VOLUME)
            .map(|r| r.spec.instance.node_id.clone())
            .collect()
    }
}

pub(super) fn four_nodes() -> World {
    World::new(["node-a", "node-b", "node-c", "node-d"].map(node))
}

pub(super) fn soft_node() -> SchedulerSettings {
    SchedulerSettings {
        soft_node_anti_affinity: true,
        ..SchedulerSettings::default()
    }
}

pub(super) fn hard_zone() -> SchedulerSettings {
    SchedulerSettings {
        soft_zone_anti_affinity: false,
        ..SchedulerSettings::default()
    }
}

pub(super) fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

pub(super) fn distinct(nodes: &[String]) -> usize {
    nodes.iter().collect::<HashSet<_>>().len()
}
