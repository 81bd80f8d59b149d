//! Where a volume's replicas go.
//!
//! [`schedule`] is a pure function of what the caller shows it (nodes, every
//! replica, which nodes are up, the settings) and a random number generator, so
//! the volume controller stays the only place that reads the cluster and every
//! placement rule can be tested without one.
//!
//! The rules are Longhorn's. Candidates are narrowed in stages (schedulable
//! nodes, node selector, anti-affinity, usable disks, disk selector, room), and
//! the first stage that leaves nothing names the failure, so the user is told
//! the most fundamental reason first: a cluster with no ready node is not
//! reported as "disk full". Among the survivors, soft anti-affinity ranks the
//! (node, disk) pairs and ties are broken at random so replicas of many volumes
//! spread over equal nodes instead of piling onto the first one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::types::{Condition, ConditionStatus, DiskSpec, DiskStatus, Node, Replica, Volume};

/// Cluster-wide knobs that affect placement (from the Setting objects).
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerSettings {
    /// Percentage of (maximum - reserved) that may be promised to replicas; 100 = no over-provisioning, 200 = twice.
    pub over_provisioning_percentage: u64,
    /// A disk whose free space (storage_available - size) would drop below this percentage of storage_maximum takes no new replica.
    pub minimal_available_percentage: u64,
    /// false (default): two replicas of one volume never share a node. true: prefer distinct nodes, allow sharing.
    pub soft_node_anti_affinity: bool,
    /// true (default): prefer distinct zones. false: replicas must be in distinct zones (only among nodes that have a zone).
    pub soft_zone_anti_affinity: bool,
}

impl Default for SchedulerSettings {
    /// Longhorn's defaults: no over-provisioning, a quarter of each disk kept
    /// free, replicas on distinct nodes, distinct zones when possible.
    fn default() -> Self {
        Self {
            over_provisioning_percentage: 100,
            minimal_available_percentage: 25,
            soft_node_anti_affinity: false,
            soft_zone_anti_affinity: true,
        }
    }
}

/// Where one replica goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The node whose disk holds the replica: the replica's spec.nodeID.
    pub node_id: String,
    /// The disk's key in the node's spec.disks.
    pub disk_name: String,
    /// The disk's fsid from status: the replica's spec.diskID.
    pub disk_id: String,
    /// The disk's path: the replica's spec.diskPath.
    pub disk_path: String,
}

/// Why a replica could not be placed: `reason` is a CamelCase condition
/// reason, `message` a sentence a user understands with the numbers that matter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unschedulable {
    /// CamelCase condition reason, e.g. `ReplicaAntiAffinity`.
    pub reason: &'static str,
    /// What went wrong, with the numbers and names that matter.
    pub message: String,
}

/// What the scheduler sees of the cluster.
pub struct Cluster<'a> {
    /// Every oxhorn Node object.
    pub nodes: &'a [Arc<Node>],
    /// Every Replica object of every volume (for the space already promised on each disk).
    pub replicas: &'a [Arc<Replica>],
    /// Whether a node is up: its manager's lease is fresh and its Kubernetes node Ready. The caller computes it.
    pub node_up: &'a dyn Fn(&str) -> bool,
}

/// No node is up, ready and allowing scheduling.
const NO_SCHEDULABLE_NODE: &str = "NoSchedulableNode";
/// Schedulable nodes exist, but none carries the volume's node selector tags.
const NODE_SELECTOR_MISMATCH: &str = "NodeSelectorMismatch";
/// Every node that could take the replica already holds (or shares a zone with) a sibling.
const REPLICA_ANTI_AFFINITY: &str = "ReplicaAntiAffinity";
/// The nodes left have no disk that is measured, ready and allowing scheduling.
const NO_SCHEDULABLE_DISK: &str = "NoSchedulableDisk";
/// Usable disks exist, but none carries the volume's disk selector tags.
const DISK_SELECTOR_MISMATCH: &str = "DiskSelectorMismatch";
/// Matching disks exist, but none has room for the replica.
const INSUFFICIENT_STORAGE: &str = "InsufficientStorage";

/// How many nodes or disks a message lists before summarising the rest: a
/// cluster of hundreds of nodes must not make a condition unreadable.
const MAX_LISTED: usize = 10;

/// Picks a node and disk for a new replica of `volume`. `siblings` are the
/// volume's other replicas (scheduled or not, failed or not; those with an
/// empty spec.node_id are ignored).
pub fn schedule(
    cluster: &Cluster<'_>,
    volume: &Volume,
    siblings: &[&Replica],
    settings: &SchedulerSettings,
    rng: &mut fastrand::Rng,
) -> Result<Placement, Unschedulable> {
    let siblings = Siblings::new(cluster.nodes, siblings);
    let nodes = schedulable_nodes(cluster)?;
    let nodes = matching_nodes(nodes, volume)?;
    let nodes = anti_affine_nodes(nodes, &siblings, volume, settings)?;
    let disks = usable_disks(&nodes)?;
    let disks = matching_disks(disks, volume)?;
    let disks = disks_with_room(disks, cluster.replicas, volume, settings)?;
    Ok(pick(&disks, &siblings, rng))
}

/// What one more replica could get on each disk that may take one, on the
/// nodes `in_segment` accepts, given the volume's tag selectors: the
/// capacity a CSI GetCapacity reports.
pub fn schedulable_space(
    cluster: &Cluster<'_>,
    volume: &Volume,
    settings: &SchedulerSettings,
    in_segment: &dyn Fn(&Node) -> bool,
) -> Vec<i64> {
    let Ok(nodes) = schedulable_nodes(cluster) else {
        return Vec::new();
    };
    let nodes: Vec<&Node> = nodes.into_iter().filter(|n| in_segment(n)).collect();
    let Ok(nodes) = matching_nodes(nodes, volume) else {
        return Vec::new();
    };
    let disks = usable_disks(&nodes).and_then(|disks| matching_disks(disks, volume));
    let promised = promised_bytes(cluster.replicas);
    disks
        .unwrap_or_default()
        .into_iter()
        .map(|disk| {
            let key = (node_name(disk.node), disk.status.fsid.as_str());
            let room = Room::new(disk, promised.get(&key).copied().unwrap_or(0), settings);
            i64::try_from(room.schedulable()).unwrap_or(i64::MAX)
        })
        .collect()
}

/// Where the volume's other replicas already are, by node and by zone.
struct Siblings<'a> {
    nodes: HashSet<&'a str>,
    /// Non-empty zones of the nodes in `nodes`.
    zones: HashSet<&'a str>,
}

impl<'a> Siblings<'a> {
    fn new(all_nodes: &'a [Arc<Node>], siblings: &[&'a Replica]) -> Self {
        let nodes: HashSet<&str> = siblings
            .iter()
            .map(|r| r.spec.instance.node_id.as_str())
            .filter(|n| !n.is_empty())
            .collect();
        let zones = all_nodes
            .iter()
            .filter(|n| nodes.contains(node_name(n)))
            .map(|n| zone(n))
            .filter(|z| !z.is_empty())
            .collect();
        Self { nodes, zones }
    }

    fn on_node(&self, node: &Node) -> bool {
        self.nodes.contains(node_name(node))
    }

    /// Whether a sibling is in the node's zone; a node without a zone shares
    /// a zone with nobody.
    fn in_zone(&self, node: &Node) -> bool {
        let zone = zone(node);
        !zone.is_empty() && self.zones.contains(zone)
    }
}

/// A disk of a node that passed the node-level rules.
#[derive(Clone, Copy)]
struct DiskCandidate<'a> {
    node: &'a Node,
    name: &'a str,
    spec: &'a DiskSpec,
    status: &'a DiskStatus,
}

impl DiskCandidate<'_> {
    /// "node/disk", how messages name a disk.
    fn label(&self) -> String {
        format!("{}/{}", node_name(self.node), self.name)
    }
}

/// Nodes that are up, ready and allow scheduling.
fn schedulable_nodes<'a>(cluster: &Cluster<'a>) -> Result<Vec<&'a Node>, Unschedulable> {
    let mut nodes = Vec::new();
    let mut excluded = Vec::new();
    for node in cluster.nodes.iter().map(|n| &**n) {
        let problems = node_problems(cluster, node);
        if problems.is_empty() {
            nodes.push(node);
        } else {
            excluded.push(format!("{} ({})", node_name(node), problems.join(" and ")));
        }
    }
    if !nodes.is_empty() {
        return Ok(nodes);
    }
    let message = if excluded.is_empty() {
        "no oxhorn node exists yet".to_string()
    } else {
        format!(
            "no node is up, ready and allowing scheduling: {}",
            listing(excluded, ", ")
        )
    };
    Err(unschedulable(NO_SCHEDULABLE_NODE, message))
}

/// Why a node takes no replica, in words; empty when it may take one.
fn node_problems(cluster: &Cluster<'_>, node: &Node) -> Vec<&'static str> {
    let mut problems = Vec::new();
    if !(cluster.node_up)(node_name(node)) {
        problems.push("down");
    }
    if node
        .status
        .as_ref()
        .is_some_and(|s| is_false(&s.conditions, "Ready"))
    {
        problems.push("not ready");
    }
    if !node.spec.allow_scheduling {
        problems.push("scheduling disabled");
    }
    problems
}

/// Nodes carrying every tag of the volume's node selector.
fn matching_nodes<'a>(
    nodes: Vec<&'a Node>,
    volume: &Volume,
) -> Result<Vec<&'a Node>, Unschedulable> {
    let selector = &volume.spec.node_selector;
    let (matching, others): (Vec<_>, Vec<_>) = nodes
        .into_iter()
        .partition(|n| has_all(&n.spec.tags, selector));
    if !matching.is_empty() {
        return Ok(matching);
    }
    let excluded = others
        .iter()
        .map(|n| format!("{} ({})", node_name(n), tags(&n.spec.tags)))
        .collect();
    Err(unschedulable(
        NODE_SELECTOR_MISMATCH,
        format!(
            "no schedulable node carries every node selector tag ({}): {}",
            selector.join(", "),
            listing(excluded, ", ")
        ),
    ))
}

/// Nodes the hard anti-affinity rules allow.
fn anti_affine_nodes<'a>(
    nodes: Vec<&'a Node>,
    siblings: &Siblings<'_>,
    volume: &Volume,
    settings: &SchedulerSettings,
) -> Result<Vec<&'a Node>, Unschedulable> {
    let considered = nodes.len();
    let mut allowed = Vec::new();
    let mut excluded = Vec::new();
    for node in nodes {
        match anti_affinity_conflict(node, siblings, settings) {
            None => allowed.push(node),
            Some(why) => excluded.push(format!("{} ({why})", node_name(node))),
        }
    }
    if !allowed.is_empty() {
        return Ok(allowed);
    }
    Err(unschedulable(
        REPLICA_ANTI_AFFINITY,
        anti_affinity_message(volume, settings, considered, excluded),
    ))
}

/// Why a hard anti-affinity rule keeps the replica off `node`, if one does.
fn anti_affinity_conflict(
    node: &Node,
    siblings: &Siblings<'_>,
    settings: &SchedulerSettings,
) -> Option<String> {
    if !settings.soft_node_anti_affinity && siblings.on_node(node) {
        Some("has a replica".to_string())
    } else if !settings.soft_zone_anti_affinity && siblings.in_zone(node) {
        Some(format!("zone {} has a replica", zone(node)))
    } else {
        None
    }
}

/// E.g. "3 replicas need 3 nodes with hard node anti-affinity, but only 2
/// ready nodes allow scheduling: node-a (has a replica), node-b (has a replica)".
/// `considered` counts the nodes that passed every rule but anti-affinity.
fn anti_affinity_message(
    volume: &Volume,
    settings: &SchedulerSettings,
    considered: usize,
    excluded: Vec<String>,
) -> String {
    let (rule, one, many) = match (
        settings.soft_node_anti_affinity,
        settings.soft_zone_anti_affinity,
    ) {
        (false, false) => ("hard node and zone", "node", "nodes in distinct zones"),
        (true, false) => ("hard zone", "zone", "zones"),
        _ => ("hard node", "node", "nodes"),
    };
    let count = volume.spec.number_of_replicas;
    let (replicas, need, what) = if count == 1 {
        ("replica", "needs", one)
    } else {
        ("replicas", "need", many)
    };
    let selected = if volume.spec.node_selector.is_empty() {
        ""
    } else if considered == 1 {
        " and matches the node selector"
    } else {
        " and match the node selector"
    };
    // "but only 3 nodes" reads oddly when 3 are needed: then the nodes are
    // enough in number and the list says why each one is excluded.
    let nodes = if usize::try_from(count).is_ok_and(|c| considered < c) {
        let (ready, allow) = if considered == 1 {
            ("node", "allows")
        } else {
            ("nodes", "allow")
        };
        format!("but only {considered} ready {ready} {allow} scheduling{selected}")
    } else if considered == 1 {
        format!("and the only ready node that allows scheduling{selected} is excluded")
    } else {
        format!("and all {considered} ready nodes that allow scheduling{selected} are excluded")
    };
    format!(
        "{count} {replicas} {need} {count} {what} with {rule} anti-affinity, {nodes}: {}",
        listing(excluded, ", ")
    )
}

/// Disks of `nodes` that are measured, ready and allow scheduling.
fn usable_disks<'a>(nodes: &[&'a Node]) -> Result<Vec<DiskCandidate<'a>>, Unschedulable> {
    let mut usable = Vec::new();
    let mut excluded = Vec::new();
    for &node in nodes {
        if node.spec.disks.is_empty() {
            excluded.push(format!("{} (no disks)", node_name(node)));
        }
        for (name, spec) in &node.spec.disks {
            match disk_status(node, name, spec) {
                Ok(status) => usable.push(DiskCandidate {
                    node,
                    name,
                    spec,
                    status,
                }),
                Err(why) => excluded.push(format!("{}/{name} ({why})", node_name(node))),
            }
        }
    }
    if !usable.is_empty() {
        return Ok(usable);
    }
    Err(unschedulable(
        NO_SCHEDULABLE_DISK,
        format!(
            "no disk is measured, ready and allowing scheduling on the nodes left for the replica: {}",
            listing(excluded, ", ")
        ),
    ))
}

/// The measured status of a disk that may take replicas, or why it may not.
fn disk_status<'a>(
    node: &'a Node,
    name: &str,
    spec: &DiskSpec,
) -> Result<&'a DiskStatus, &'static str> {
    if !spec.allow_scheduling {
        return Err("scheduling disabled");
    }
    let status = node
        .status
        .as_ref()
        .and_then(|s| s.disk_status.get(name))
        .filter(|d| !d.fsid.is_empty() && d.storage_maximum > 0)
        .ok_or("not measured yet")?;
    if is_false(&status.conditions, "Ready") {
        return Err("not ready");
    }
    if is_false(&status.conditions, "Schedulable") {
        return Err("not schedulable");
    }
    Ok(status)
}

/// Disks carrying every tag of the volume's disk selector.
fn matching_disks<'a>(
    disks: Vec<DiskCandidate<'a>>,
    volume: &Volume,
) -> Result<Vec<DiskCandidate<'a>>, Unschedulable> {
    let selector = &volume.spec.disk_selector;
    let (matching, others): (Vec<_>, Vec<_>) = disks
        .into_iter()
        .partition(|d| has_all(&d.spec.tags, selector));
    if !matching.is_empty() {
        return Ok(matching);
    }
    let excluded = others
        .iter()
        .map(|d| format!("{} ({})", d.label(), tags(&d.spec.tags)))
        .collect();
    Err(unschedulable(
        DISK_SELECTOR_MISMATCH,
        format!(
            "no usable disk carries every disk selector tag ({}): {}",
            selector.join(", "),
            listing(excluded, ", ")
        ),
    ))
}

/// Disks with room for a replica of the volume's size.
fn disks_with_room<'a>(
    disks: Vec<DiskCandidate<'a>>,
    replicas: &[Arc<Replica>],
    volume: &Volume,
    settings: &SchedulerSettings,
) -> Result<Vec<DiskCandidate<'a>>, Unschedulable> {
    let promised = promised_bytes(replicas);
    let size = i128::from(volume.spec.size);
    let mut fitting = Vec::new();
    let mut excluded = Vec::new();
    for disk in disks {
        let key = (node_name(disk.node), disk.status.fsid.as_str());
        let room = Room::new(disk, promised.get(&key).copied().unwrap_or(0), settings);
        if room.fits(size) {
            fitting.push(disk);
        } else {
            excluded.push(format!(
                "{}: {}",
                disk.label(),
                room.describe(disk, settings)
            ));
        }
    }
    if !fitting.is_empty() {
        return Ok(fitting);
    }
    Err(unschedulable(
        INSUFFICIENT_STORAGE,
        format!(
            "no disk has {} free for the replica: {}",
            human(volume.spec.size),
            listing(excluded, "; ")
        ),
    ))
}

/// Bytes promised to replicas, by (node, disk fsid). Computed from the
/// replicas themselves because a disk's status.storage_scheduled lags behind
/// replicas scheduled moments ago, which would let two volumes overfill a disk.
pub fn promised_bytes(replicas: &[Arc<Replica>]) -> HashMap<(&str, &str), i128> {
    let mut promised: HashMap<(&str, &str), i128> = HashMap::new();
    for r in replicas {
        let key = (r.spec.instance.node_id.as_str(), r.spec.disk_id.as_str());
        let total = promised.entry(key).or_default();
        *total = total.saturating_add(i128::from(r.spec.instance.volume_size));
    }
    promised
}

/// How much a disk may still take, by each of its two limits. In i128 so
/// that no combination of i64 sizes and u64 percentages can overflow.
struct Room {
    /// Bytes already promised to replicas on the disk.
    promised: i128,
    /// Bytes that may be promised in total: (maximum - reserved) * over-provisioning.
    promise_limit: i128,
    /// Bytes that may still be written before free space drops below the minimal percentage.
    free_headroom: i128,
}

impl Room {
    fn new(disk: DiskCandidate<'_>, promised: i128, settings: &SchedulerSettings) -> Self {
        let maximum = i128::from(disk.status.storage_maximum);
        let reserved = i128::from(disk.spec.storage_reserved).max(0);
        let promise_limit = maximum
            .saturating_sub(reserved)
            .saturating_mul(i128::from(settings.over_provisioning_percentage))
            / 100;
        let must_stay_free =
            maximum.saturating_mul(i128::from(settings.minimal_available_percentage)) / 100;
        let free_headroom =
            i128::from(disk.status.storage_available).saturating_sub(must_stay_free);
        Self {
            promised,
            promise_limit,
            free_headroom,
        }
    }

    fn fits(&self, size: i128) -> bool {
        self.promised.saturating_add(size) <= self.promise_limit && size <= self.free_headroom
    }

    /// What a replica could still get: the tighter of the two limits.
    fn schedulable(&self) -> i128 {
        self.promise_limit
            .saturating_sub(self.promised)
            .min(self.free_headroom)
            .max(0)
    }

    /// E.g. "2 GiB schedulable of 8 GiB (25% must stay free)", naming the
    /// limit that binds so the user knows which knob or disk to change.
    fn describe(&self, disk: DiskCandidate<'_>, settings: &SchedulerSettings) -> String {
        let why = if self.free_headroom <= self.promise_limit.saturating_sub(self.promised) {
            format!("{}% must stay free", settings.minimal_available_percentage)
        } else {
            let reserved = if disk.spec.storage_reserved > 0 {
                format!(" with {} reserved", human(disk.spec.storage_reserved))
            } else {
                String::new()
            };
            format!(
                "{} already promised to replicas; {}% over-provisioning{reserved} allows {}",
                human_i128(self.promised),
                settings.over_provisioning_percentage,
                human_i128(self.promise_limit)
            )
        };
        format!(
            "{} schedulable of {} ({why})",
            human_i128(self.schedulable()),
            human(disk.status.storage_maximum)
        )
    }
}

/// Picks uniformly among the best-ranked disks: no sibling on the node first,
/// then no sibling in the zone. `disks` is never empty.
fn pick(
    disks: &[DiskCandidate<'_>],
    siblings: &Siblings<'_>,
    rng: &mut fastrand::Rng,
) -> Placement {
    let rank = |d: &DiskCandidate<'_>| (siblings.on_node(d.node), siblings.in_zone(d.node));
    let best = disks.iter().map(rank).min();
    let best: Vec<_> = disks.iter().filter(|d| Some(rank(d)) == best).collect();
    let disk = best[rng.usize(..best.len())];
    Placement {
        node_id: node_name(disk.node).to_string(),
        disk_name: disk.name.to_string(),
        disk_id: disk.status.fsid.clone(),
        disk_path: disk.spec.path.clone(),
    }
}

fn unschedulable(reason: &'static str, message: String) -> Unschedulable {
    Unschedulable { reason, message }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn zone(node: &Node) -> &str {
    node.status.as_ref().map_or("", |s| s.zone.as_str())
}

/// Whether condition `type_` is known to be False; Unknown or absent is not.
fn is_false(conditions: &[Condition], type_: &str) -> bool {
    Condition::status_of(conditions, type_) == ConditionStatus::False
}

fn has_all(tags: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| tags.contains(w))
}

/// A node's or disk's tags, for a message.
fn tags(tags: &[String]) -> String {
    if tags.is_empty() {
        "no tags".to_string()
    } else {
        format!("tags: {}", tags.join(", "))
    }
}

/// Joins the first [`MAX_LISTED`] items with `separator` and counts the rest.
fn listing(items: Vec<String>, separator: &str) -> String {
    let more = items.len().saturating_sub(MAX_LISTED);
    let mut text = items
        .into_iter()
        .take(MAX_LISTED)
        .collect::<Vec<_>>()
        .join(separator);
    if more > 0 {
        text.push_str(&format!("{separator}and {more} more"));
    }
    text
}

/// [`human`] for the i128 arithmetic of [`Room`], clamped to i64.
fn human_i128(value: i128) -> String {
    human(i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX }))
}

/// Bytes in binary units with at most one decimal, rounded down:
/// "10 GiB", "1.5 GiB", "512 MiB", "4 KiB", "100 B".
fn human(bytes: i64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let sign = if bytes < 0 { "-" } else { "" };
    let magnitude = bytes.unsigned_abs();
    let exponent = (1..UNITS.len())
        .take_while(|e| magnitude >> (10 * e) > 0)
        .last()
        .unwrap_or(0);
    let shift = 10 * exponent;
    let whole = magnitude >> shift;
    let remainder = u128::from(magnitude - (whole << shift));
    let tenths = (remainder * 10) >> shift;
    let unit = UNITS[exponent];
    if tenths == 0 {
        format!("{sign}{whole} {unit}")
    } else {
        format!("{sign}{whole}.{tenths} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;
    use crate::types::{DesireState, InstanceSpec, NodeSpec, NodeStatus, ReplicaSpec, VolumeSpec};

    const GIB: i64 = 1 << 30;
    const VOLUME: &str = "vol";

    /// Builds a Node: ready, allowing scheduling, with the disks added by `disk`.
    struct NodeBuilder(Node);

    /// A ready, schedulable node without disks.
    fn bare_node(name: &str) -> NodeBuilder {
        let spec = NodeSpec {
            disks: BTreeMap::new(),
            allow_scheduling: true,
            tags: vec![],
        };
        let mut node = Node::new(name, spec);
        node.status = Some(NodeStatus {
            conditions: vec![condition("Ready", ConditionStatus::True)],
            ..NodeStatus::default()
        });
        NodeBuilder(node)
    }

    /// A ready, schedulable node with one empty 100 GiB disk "default" whose fsid is "{name}-fs".
    fn node(name: &str) -> NodeBuilder {
        bare_node(name).disk("default", &format!("{name}-fs"), 100 * GIB, 100 * GIB)
    }

    impl NodeBuilder {
        fn status(&mut self) -> &mut NodeStatus {
            self.0.status.get_or_insert_with(NodeStatus::default)
        }

        /// Adds (or replaces) a schedulable, ready disk with `maximum` bytes, `available` free.
        fn disk(mut self, name: &str, fsid: &str, maximum: i64, available: i64) -> Self {
            let spec = DiskSpec {
                path: format!("/var/lib/oxhorn/{name}"),
                allow_scheduling: true,
                storage_reserved: 0,
                tags: vec![],
            };
            self.0.spec.disks.insert(name.to_string(), spec);
            let status = DiskStatus {
                storage_available: available,
                storage_maximum: maximum,
                storage_scheduled: 0,
                fsid: fsid.to_string(),
                conditions: vec![
                    condition("Ready", ConditionStatus::True),
                    condition("Schedulable", ConditionStatus::True),
                ],
            };
            self.status().disk_status.insert(name.to_string(), status);
            self
        }

        fn disk_spec(mut self, name: &str, edit: impl FnOnce(&mut DiskSpec)) -> Self {
            if let Some(disk) = self.0.spec.disks.get_mut(name) {
                edit(disk);
            }
            self
        }

        fn disk_status(mut self, name: &str, edit: impl FnOnce(&mut DiskStatus)) -> Self {
            if let Some(disk) = self.status().disk_status.get_mut(name) {
                edit(disk);
            }
            self
        }

        fn zone(mut self, zone: &str) -> Self {
            self.status().zone = zone.to_string();
            self
        }

        fn tags(mut self, tags: &[&str]) -> Self {
            self.0.spec.tags = strings(tags);
            self
        }

        fn allow_scheduling(mut self, allow: bool) -> Self {
            self.0.spec.allow_scheduling = allow;
            self
        }

        fn ready(mut self, status: ConditionStatus) -> Self {
            self.status().conditions = vec![condition("Ready", status)];
            self
        }
    }

    fn condition(type_: &str, status: ConditionStatus) -> Condition {
        Condition {
            type_: type_.to_string(),
            status,
            reason: String::new(),
            message: String::new(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    fn volume(size: i64, replicas: i32) -> Volume {
        Volume::new(
            VOLUME,
            VolumeSpec {
                size,
                number_of_replicas: replicas,
                frontend: Default::default(),
                node_id: String::new(),
                data_locality: Default::default(),
                stale_replica_timeout: 2880,
                from_backup: String::new(),
                disk_selector: vec![],
                node_selector: vec![],
                replica_auto_balance: Default::default(),
                access_mode: Default::default(),
                data_source: None,
            },
        )
    }

    fn replica(name: &str, volume: &str, size: i64, node_id: &str, disk_id: &str) -> Replica {
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
            },
        )
    }

    /// A cluster: nodes, every replica, and which nodes are down.
    #[derive(Default)]
    struct World {
        nodes: Vec<Arc<Node>>,
        replicas: Vec<Arc<Replica>>,
        down: Vec<String>,
    }

    impl World {
        fn new(nodes: impl IntoIterator<Item = NodeBuilder>) -> Self {
            Self {
                nodes: nodes.into_iter().map(|b| Arc::new(b.0)).collect(),
                ..Self::default()
            }
        }

        fn with_replica(mut self, r: Replica) -> Self {
            self.replicas.push(Arc::new(r));
            self
        }

        fn down(mut self, node: &str) -> Self {
            self.down.push(node.to_string());
            self
        }

        /// Schedules a replica of `volume`; its siblings are the replicas of the same volume name.
        fn schedule(
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
        fn schedule_seeded(
            &self,
            volume: &Volume,
            settings: &SchedulerSettings,
            seed: u64,
        ) -> Result<Placement, Unschedulable> {
            self.schedule(volume, settings, &mut fastrand::Rng::with_seed(seed))
        }

        /// Schedules with the default settings and seed 0.
        fn schedule_default(&self, volume: &Volume) -> Result<Placement, Unschedulable> {
            self.schedule_seeded(volume, &SchedulerSettings::default(), 0)
        }

        /// The nodes chosen over 50 seeds: which nodes the rules leave in the running.
        fn chosen_nodes(&self, volume: &Volume, settings: &SchedulerSettings) -> BTreeSet<String> {
            (0..50)
                .filter_map(|seed| self.schedule_seeded(volume, settings, seed).ok())
                .map(|p| p.node_id)
                .collect()
        }

        /// Schedules a replica of `volume` and records it, as the volume controller would.
        fn place(
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
        fn volume_nodes(&self) -> Vec<String> {
            self.replicas
                .iter()
                .filter(|r| r.spec.instance.volume_name == VOLUME)
                .map(|r| r.spec.instance.node_id.clone())
                .collect()
        }
    }

    fn four_nodes() -> World {
        World::new(["node-a", "node-b", "node-c", "node-d"].map(node))
    }

    fn soft_node() -> SchedulerSettings {
        SchedulerSettings {
            soft_node_anti_affinity: true,
            ..SchedulerSettings::default()
        }
    }

    fn hard_zone() -> SchedulerSettings {
        SchedulerSettings {
            soft_zone_anti_affinity: false,
            ..SchedulerSettings::default()
        }
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn distinct(nodes: &[String]) -> usize {
        nodes.iter().collect::<HashSet<_>>().len()
    }

    #[test]
    fn schedulable_space_counts_promises_headroom_and_segments() {
        // node-a: 100 GiB, 10 GiB promised; node-b: 40 GiB free of 100; node-c down.
        let world = World::new([
            node("node-a").zone("z1"),
            node("node-b")
                .zone("z2")
                .disk_status("default", |d| d.storage_available = 40 * GIB),
            node("node-c").zone("z1"),
        ])
        .with_replica(replica("r1", "other", 10 * GIB, "node-a", "node-a-fs"))
        .down("node-c");
        let up = |node: &str| !world.down.iter().any(|d| d == node);
        let cluster = Cluster {
            nodes: &world.nodes,
            replicas: &world.replicas,
            node_up: &up,
        };
        let settings = SchedulerSettings::default();
        let vol = volume(GIB, 1);
        let mut all = schedulable_space(&cluster, &vol, &settings, &|_| true);
        all.sort();
        // node-b: 40 GiB free minus the 25 GiB that must stay free.
        assert_eq!(all, vec![15 * GIB, 75 * GIB]);
        let z1 = schedulable_space(&cluster, &vol, &settings, &|n| zone(n) == "z1");
        assert_eq!(z1, vec![75 * GIB], "node-c is down");
        let mut tagged = vol.clone();
        tagged.spec.disk_selector = strings(&["ssd"]);
        assert!(schedulable_space(&cluster, &tagged, &settings, &|_| true).is_empty());
    }

    #[test]
    fn defaults_are_longhorns() {
        let s = SchedulerSettings::default();
        assert_eq!(s.over_provisioning_percentage, 100);
        assert_eq!(s.minimal_available_percentage, 25);
        assert!(!s.soft_node_anti_affinity);
        assert!(s.soft_zone_anti_affinity);
    }

    #[test]
    fn three_replicas_over_four_nodes_land_on_three_distinct_nodes() {
        for seed in 0..50 {
            let mut world = four_nodes();
            let mut rng = fastrand::Rng::with_seed(seed);
            for _ in 0..3 {
                world
                    .place(
                        &volume(10 * GIB, 3),
                        &SchedulerSettings::default(),
                        &mut rng,
                    )
                    .expect("placed");
            }
            assert_eq!(distinct(&world.volume_nodes()), 3, "seed {seed}");
        }
    }

    #[test]
    fn placement_names_the_disk_by_fsid_and_path() {
        let world = World::new([node("node-a")]);
        let placement = world
            .schedule_seeded(&volume(GIB, 1), &SchedulerSettings::default(), 1)
            .expect("placed");
        assert_eq!(
            placement,
            Placement {
                node_id: "node-a".into(),
                disk_name: "default".into(),
                disk_id: "node-a-fs".into(),
                disk_path: "/var/lib/oxhorn/default".into(),
            }
        );
    }

    #[test]
    fn fourth_replica_on_three_nodes_with_hard_anti_affinity_names_the_nodes() {
        let mut world = World::new(["node-a", "node-b", "node-c"].map(node));
        let mut rng = fastrand::Rng::with_seed(7);
        let vol = volume(10 * GIB, 4);
        let settings = SchedulerSettings::default();
        for _ in 0..3 {
            world.place(&vol, &settings, &mut rng).expect("placed");
        }
        let err = world
            .schedule(&vol, &settings, &mut rng)
            .expect_err("no fourth node");
        assert_eq!(err.reason, "ReplicaAntiAffinity");
        assert_eq!(
            err.message,
            "4 replicas need 4 nodes with hard node anti-affinity, but only 3 ready nodes allow \
             scheduling: node-a (has a replica), node-b (has a replica), node-c (has a replica)"
        );
        assert_eq!(err.to_string(), err.message);
    }

    #[test]
    fn a_replacement_blocked_by_the_replica_it_replaces_says_so() {
        // A failed replica on node-c still counts as a sibling until it is removed.
        let world = World::new(["node-a", "node-b", "node-c"].map(node))
            .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
            .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"))
            .with_replica(replica("r3", VOLUME, GIB, "node-c", "node-c-fs"));
        let err = world
            .schedule_default(&volume(GIB, 3))
            .expect_err("every node has a replica");
        assert_eq!(
            err.message,
            "3 replicas need 3 nodes with hard node anti-affinity, and all 3 ready nodes that \
             allow scheduling are excluded: node-a (has a replica), node-b (has a replica), \
             node-c (has a replica)"
        );
        let world = World::new([node("node-a")]).with_replica(replica(
            "r1",
            VOLUME,
            GIB,
            "node-a",
            "node-a-fs",
        ));
        let err = world
            .schedule_default(&volume(GIB, 1))
            .expect_err("the only node has the replica");
        assert_eq!(
            err.message,
            "1 replica needs 1 node with hard node anti-affinity, and the only ready node that \
             allows scheduling is excluded: node-a (has a replica)"
        );
    }

    #[test]
    fn anti_affinity_counts_only_nodes_that_could_take_the_replica() {
        let mut world = World::new(["node-a", "node-b", "node-c"].map(node))
            .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
            .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"))
            .down("node-c");
        let err = world
            .schedule_default(&volume(GIB, 3))
            .expect_err("node-c is down");
        assert_eq!(err.reason, "ReplicaAntiAffinity");
        assert_eq!(
            err.message,
            "3 replicas need 3 nodes with hard node anti-affinity, but only 2 ready nodes allow \
             scheduling: node-a (has a replica), node-b (has a replica)"
        );
        world.down.clear();
        let placed = world
            .schedule_default(&volume(GIB, 3))
            .expect("node-c is back");
        assert_eq!(placed.node_id, "node-c");
    }

    #[test]
    fn siblings_without_a_node_are_ignored() {
        let world = World::new([node("node-a")]).with_replica(replica("r1", VOLUME, GIB, "", ""));
        let placed = world
            .schedule_default(&volume(GIB, 2))
            .expect("the unscheduled sibling takes no node");
        assert_eq!(placed.node_id, "node-a");
    }

    #[test]
    fn soft_node_anti_affinity_shares_a_node_only_when_it_must() {
        for seed in 0..50 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut world = World::new(["node-a", "node-b", "node-c"].map(node));
            for _ in 0..3 {
                world
                    .place(&volume(GIB, 3), &soft_node(), &mut rng)
                    .expect("placed");
            }
            assert_eq!(distinct(&world.volume_nodes()), 3, "seed {seed}");

            let mut world = World::new(["node-a", "node-b"].map(node));
            for _ in 0..3 {
                world
                    .place(&volume(GIB, 3), &soft_node(), &mut rng)
                    .expect("placed");
            }
            let nodes = world.volume_nodes();
            assert_eq!(
                distinct(&nodes[..2]),
                2,
                "seed {seed}: shared before it had to"
            );
            assert_eq!(distinct(&nodes), 2);
        }
    }

    #[test]
    fn down_disabled_and_not_ready_nodes_take_no_replica() {
        let world = World::new([
            node("node-a"),
            node("node-b").allow_scheduling(false),
            node("node-c").ready(ConditionStatus::False),
            node("node-d"),
        ])
        .down("node-a");
        let chosen = world.chosen_nodes(&volume(GIB, 1), &SchedulerSettings::default());
        assert_eq!(chosen, names(&["node-d"]));
    }

    #[test]
    fn ready_unknown_is_not_ready_false() {
        let world = World::new([node("node-a").ready(ConditionStatus::Unknown)]);
        let placed = world.schedule_default(&volume(GIB, 1));
        assert_eq!(placed.expect("placed").node_id, "node-a");
    }

    #[test]
    fn no_schedulable_node_says_why_for_each() {
        let world = World::new([
            node("node-a").ready(ConditionStatus::False),
            node("node-b").allow_scheduling(false),
            node("node-c"),
        ])
        .down("node-a")
        .down("node-c");
        let err = world
            .schedule_default(&volume(GIB, 1))
            .expect_err("nothing schedulable");
        assert_eq!(err.reason, "NoSchedulableNode");
        assert_eq!(
            err.message,
            "no node is up, ready and allowing scheduling: node-a (down and not ready), \
             node-b (scheduling disabled), node-c (down)"
        );
    }

    #[test]
    fn an_empty_cluster_has_no_schedulable_node() {
        let err = World::default()
            .schedule_default(&volume(GIB, 1))
            .expect_err("no nodes");
        assert_eq!(err.reason, "NoSchedulableNode");
        assert_eq!(err.message, "no oxhorn node exists yet");
    }

    #[test]
    fn long_lists_are_cut_short() {
        let names: Vec<String> = (0..25).map(|i| format!("node-{i:02}")).collect();
        let mut world = World::new(names.iter().map(|n| node(n)));
        world.down = names;
        let err = world
            .schedule_default(&volume(GIB, 1))
            .expect_err("all down");
        assert!(
            err.message.ends_with("node-09 (down), and 15 more"),
            "{}",
            err.message
        );
        assert!(!err.message.contains("node-10"));
    }

    #[test]
    fn unusable_disks_take_no_replica() {
        let world = World::new([
            node("node-a").disk_spec("default", |d| d.allow_scheduling = false),
            node("node-b").disk_status("default", |d| d.fsid.clear()),
            node("node-c").disk_status("default", |d| {
                d.conditions = vec![condition("Ready", ConditionStatus::False)];
            }),
            node("node-d").disk_status("default", |d| {
                d.conditions = vec![condition("Schedulable", ConditionStatus::False)];
            }),
            node("node-e").disk_status("default", |d| d.storage_maximum = 0),
            bare_node("node-f"),
        ]);
        let err = world
            .schedule_default(&volume(GIB, 1))
            .expect_err("no usable disk");
        assert_eq!(err.reason, "NoSchedulableDisk");
        assert_eq!(
            err.message,
            "no disk is measured, ready and allowing scheduling on the nodes left for the \
             replica: node-a/default (scheduling disabled), node-b/default (not measured yet), \
             node-c/default (not ready), node-d/default (not schedulable), \
             node-e/default (not measured yet), node-f (no disks)"
        );
        let world = World::new([node("node-a")
            .disk_spec("default", |d| d.allow_scheduling = false)
            .disk("second", "fs-2", 100 * GIB, 100 * GIB)]);
        let placed = world
            .schedule_default(&volume(GIB, 1))
            .expect("the second disk is fine");
        assert_eq!(placed.disk_name, "second");
        assert_eq!(placed.disk_id, "fs-2");
    }

    #[test]
    fn a_disk_without_status_is_not_measured_yet() {
        let mut builder = node("node-a");
        builder.status().disk_status.clear();
        let err = World::new([builder])
            .schedule_default(&volume(GIB, 1))
            .expect_err("unmeasured");
        assert_eq!(err.reason, "NoSchedulableDisk");
        assert!(
            err.message.contains("node-a/default (not measured yet)"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_full_disk_reports_insufficient_storage_with_numbers() {
        // 25% of 8 GiB must stay free: 4 GiB available leaves 2 GiB for replicas.
        let world = World::new([bare_node("node-a").disk("default", "fs-a", 8 * GIB, 4 * GIB)]);
        let err = world
            .schedule_default(&volume(10 * GIB, 1))
            .expect_err("full");
        assert_eq!(err.reason, "InsufficientStorage");
        assert_eq!(
            err.message,
            "no disk has 10 GiB free for the replica: node-a/default: 2 GiB schedulable of 8 GiB \
             (25% must stay free)"
        );
    }

    #[test]
    fn minimal_available_is_a_boundary_not_a_cliff() {
        // 100 GiB disk, 25% must stay free: with 35 GiB available a 10 GiB replica just fits.
        let world = World::new([bare_node("node-a").disk("default", "fs-a", 100 * GIB, 35 * GIB)]);
        let settings = SchedulerSettings::default();
        let mut rng = fastrand::Rng::with_seed(0);
        assert!(
            world
                .schedule(&volume(10 * GIB, 1), &settings, &mut rng)
                .is_ok()
        );
        let err = world
            .schedule(&volume(10 * GIB + 4096, 1), &settings, &mut rng)
            .expect_err("one block too many");
        assert_eq!(err.reason, "InsufficientStorage");
        let lenient = SchedulerSettings {
            minimal_available_percentage: 0,
            ..settings
        };
        assert!(
            world
                .schedule(&volume(35 * GIB, 1), &lenient, &mut rng)
                .is_ok()
        );
    }

    #[test]
    fn over_provisioning_200_percent_promises_twice_the_disk() {
        // A thin 100 GiB disk with 100 GiB already promised to another volume.
        let world = World::new([node("node-a")]).with_replica(replica(
            "other-r",
            "other",
            100 * GIB,
            "node-a",
            "node-a-fs",
        ));
        let mut rng = fastrand::Rng::with_seed(0);
        let err = world
            .schedule(
                &volume(50 * GIB, 1),
                &SchedulerSettings::default(),
                &mut rng,
            )
            .expect_err("100% promised");
        assert_eq!(err.reason, "InsufficientStorage");
        assert_eq!(
            err.message,
            "no disk has 50 GiB free for the replica: node-a/default: 0 B schedulable of 100 GiB \
             (100 GiB already promised to replicas; 100% over-provisioning allows 100 GiB)"
        );
        let twice = SchedulerSettings {
            over_provisioning_percentage: 200,
            ..SchedulerSettings::default()
        };
        assert!(
            world
                .schedule(&volume(50 * GIB, 1), &twice, &mut rng)
                .is_ok()
        );
        assert!(
            world
                .schedule(&volume(75 * GIB, 1), &twice, &mut rng)
                .is_ok()
        );
        let world = world.with_replica(replica(
            "other-r2",
            "other",
            100 * GIB,
            "node-a",
            "node-a-fs",
        ));
        let err = world
            .schedule(&volume(4096, 1), &twice, &mut rng)
            .expect_err("200 GiB promised");
        assert_eq!(err.reason, "InsufficientStorage");
    }

    #[test]
    fn reserved_space_is_never_promised() {
        let world =
            World::new([node("node-a").disk_spec("default", |d| d.storage_reserved = 60 * GIB)]);
        let settings = SchedulerSettings::default();
        let mut rng = fastrand::Rng::with_seed(0);
        assert!(
            world
                .schedule(&volume(40 * GIB, 1), &settings, &mut rng)
                .is_ok()
        );
        let err = world
            .schedule(&volume(50 * GIB, 1), &settings, &mut rng)
            .expect_err("only 40 GiB unreserved");
        assert_eq!(
            err.message,
            "no disk has 50 GiB free for the replica: node-a/default: 40 GiB schedulable of \
             100 GiB (0 B already promised to replicas; 100% over-provisioning with 60 GiB \
             reserved allows 40 GiB)"
        );
    }

    #[test]
    fn promised_space_counts_every_volume_on_the_same_node_and_disk() {
        // A thin 100 GiB disk: 80 GiB promised to two other volumes leaves 20 GiB.
        // Its status still counts nothing as scheduled: that lags, and is ignored.
        let world = World::new([node("node-a")])
            .with_replica(replica("x", "other", 50 * GIB, "node-a", "node-a-fs"))
            .with_replica(replica("y", "third", 30 * GIB, "node-a", "node-a-fs"))
            // The same fsid on another node, and another disk of this node: neither counts.
            .with_replica(replica("z", "other", 90 * GIB, "node-b", "node-a-fs"))
            .with_replica(replica("w", "other", 90 * GIB, "node-a", "elsewhere"));
        assert!(world.schedule_default(&volume(20 * GIB, 1)).is_ok());
        let err = world
            .schedule_default(&volume(21 * GIB, 1))
            .expect_err("80 GiB promised");
        assert_eq!(
            err.message,
            "no disk has 21 GiB free for the replica: node-a/default: 20 GiB schedulable of \
             100 GiB (80 GiB already promised to replicas; 100% over-provisioning allows 100 GiB)"
        );
    }

    #[test]
    fn node_selector_limits_nodes_and_explains_a_mismatch() {
        let world = World::new([
            node("node-a").tags(&["fast"]),
            node("node-b").tags(&["fast", "ssd"]),
            node("node-c"),
        ]);
        let mut vol = volume(GIB, 1);
        vol.spec.node_selector = strings(&["fast", "ssd"]);
        let chosen = world.chosen_nodes(&vol, &SchedulerSettings::default());
        assert_eq!(chosen, names(&["node-b"]));
        vol.spec.node_selector = strings(&["gpu"]);
        let err = world.schedule_default(&vol).expect_err("no gpu node");
        assert_eq!(err.reason, "NodeSelectorMismatch");
        assert_eq!(
            err.message,
            "no schedulable node carries every node selector tag (gpu): node-a (tags: fast), \
             node-b (tags: fast, ssd), node-c (no tags)"
        );
    }

    #[test]
    fn disk_selector_limits_disks_and_explains_a_mismatch() {
        let world = World::new([
            node("node-a").disk_spec("default", |d| d.tags = strings(&["hdd"])),
            node("node-b")
                .disk("fast", "node-b-nvme", 100 * GIB, 100 * GIB)
                .disk_spec("fast", |d| d.tags = strings(&["ssd"])),
        ]);
        let mut vol = volume(GIB, 1);
        vol.spec.disk_selector = strings(&["ssd"]);
        for seed in 0..20 {
            let placed = world
                .schedule_seeded(&vol, &SchedulerSettings::default(), seed)
                .expect("node-b/fast matches");
            assert_eq!(
                (placed.node_id.as_str(), placed.disk_name.as_str()),
                ("node-b", "fast")
            );
        }
        vol.spec.disk_selector = strings(&["nvme"]);
        let err = world.schedule_default(&vol).expect_err("no nvme disk");
        assert_eq!(err.reason, "DiskSelectorMismatch");
        assert_eq!(
            err.message,
            "no usable disk carries every disk selector tag (nvme): node-a/default (tags: hdd), \
             node-b/default (no tags), node-b/fast (tags: ssd)"
        );
    }

    #[test]
    fn failures_are_reported_in_order_of_how_fundamental_they_are() {
        // Both nodes hold a sibling and have a full disk: a selector mismatch is
        // reported before anti-affinity, anti-affinity before disks and space.
        let full = |b: NodeBuilder| b.disk_status("default", |d| d.storage_available = 0);
        let world = World::new([
            full(node("node-a").tags(&["t"])),
            full(node("node-b").tags(&["t"])),
        ])
        .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
        .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"));
        let mut vol = volume(GIB, 3);
        let mut rng = fastrand::Rng::with_seed(0);
        let settings = SchedulerSettings::default();
        vol.spec.node_selector = strings(&["other"]);
        assert_eq!(
            world
                .schedule(&vol, &settings, &mut rng)
                .map_err(|e| e.reason),
            Err("NodeSelectorMismatch")
        );
        vol.spec.node_selector = strings(&["t"]);
        let err = world
            .schedule(&vol, &settings, &mut rng)
            .expect_err("anti-affinity");
        assert_eq!(err.reason, "ReplicaAntiAffinity");
        assert!(
            err.message
                .contains("only 2 ready nodes allow scheduling and match the node selector"),
            "{}",
            err.message
        );
        assert_eq!(
            world
                .schedule(&vol, &soft_node(), &mut rng)
                .map_err(|e| e.reason),
            Err("InsufficientStorage")
        );
        vol.spec.disk_selector = strings(&["ssd"]);
        assert_eq!(
            world
                .schedule(&vol, &soft_node(), &mut rng)
                .map_err(|e| e.reason),
            Err("DiskSelectorMismatch")
        );
    }

    #[test]
    fn hard_zone_anti_affinity_keeps_replicas_in_distinct_zones() {
        let world = World::new([
            node("node-a").zone("z1"),
            node("node-b").zone("z1"),
            node("node-c").zone("z2"),
        ])
        .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"));
        let soft_node_hard_zone = SchedulerSettings {
            soft_node_anti_affinity: true,
            ..hard_zone()
        };
        for settings in [hard_zone(), soft_node_hard_zone.clone()] {
            let chosen = world.chosen_nodes(&volume(GIB, 3), &settings);
            assert_eq!(chosen, names(&["node-c"]), "z2 is the only free zone");
        }
        let world = world.with_replica(replica("r2", VOLUME, GIB, "node-c", "node-c-fs"));
        let err = world
            .schedule_seeded(&volume(GIB, 3), &soft_node_hard_zone, 0)
            .expect_err("both zones taken");
        assert_eq!(err.reason, "ReplicaAntiAffinity");
        assert_eq!(
            err.message,
            "3 replicas need 3 zones with hard zone anti-affinity, and all 3 ready nodes that \
             allow scheduling are excluded: node-a (zone z1 has a replica), \
             node-b (zone z1 has a replica), node-c (zone z2 has a replica)"
        );
        let err = world
            .schedule_seeded(&volume(GIB, 3), &hard_zone(), 0)
            .expect_err("both zones taken");
        assert!(
            err.message.starts_with(
                "3 replicas need 3 nodes in distinct zones with hard node and zone anti-affinity"
            ) && err
                .message
                .contains("node-a (has a replica), node-b (zone z1 has a replica)"),
            "{}",
            err.message
        );
    }

    #[test]
    fn hard_zone_anti_affinity_ignores_nodes_without_a_zone() {
        let world = World::new([node("node-a").zone("z1"), node("node-b"), node("node-c")])
            .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
            .with_replica(replica("r2", VOLUME, GIB, "node-b", "node-b-fs"));
        let placed = world
            .schedule_seeded(&volume(GIB, 3), &hard_zone(), 0)
            .expect("node-c has no zone to share");
        assert_eq!(placed.node_id, "node-c");
    }

    #[test]
    fn soft_zone_anti_affinity_prefers_a_new_zone_but_shares_one_when_it_must() {
        let world = World::new([
            node("node-a").zone("z1"),
            node("node-b").zone("z1"),
            node("node-c").zone("z1"),
            node("node-d").zone("z2"),
        ])
        .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"));
        let settings = SchedulerSettings::default();
        let chosen = world.chosen_nodes(&volume(GIB, 3), &settings);
        assert_eq!(chosen, names(&["node-d"]));
        let world = world.with_replica(replica("r2", VOLUME, GIB, "node-d", "node-d-fs"));
        let chosen = world.chosen_nodes(&volume(GIB, 3), &settings);
        assert_eq!(
            chosen,
            names(&["node-b", "node-c"]),
            "a shared zone is allowed"
        );
    }

    #[test]
    fn soft_node_prefers_a_free_node_in_a_used_zone_over_a_used_node_in_no_zone() {
        let world = World::new([
            node("node-a").zone("z1"),
            node("node-b").zone("z1"),
            node("node-c"),
        ])
        .with_replica(replica("r1", VOLUME, GIB, "node-a", "node-a-fs"))
        .with_replica(replica("r2", VOLUME, GIB, "node-c", "node-c-fs"));
        let chosen = world.chosen_nodes(&volume(GIB, 3), &soft_node());
        assert_eq!(chosen, names(&["node-b"]));
    }

    #[test]
    fn ties_are_broken_at_random_over_every_equal_node() {
        let world = World::new(["node-a", "node-b", "node-c", "node-d", "node-e"].map(node));
        let vol = volume(GIB, 1);
        let settings = SchedulerSettings::default();
        let mut rng = fastrand::Rng::with_seed(42);
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..500 {
            let placed = world.schedule(&vol, &settings, &mut rng).expect("placed");
            *counts.entry(placed.node_id).or_default() += 1;
        }
        assert_eq!(counts.len(), 5, "{counts:?}");
        assert!(counts.values().all(|&n| n > 50), "{counts:?}");
        let draw = |seed| world.schedule_seeded(&vol, &settings, seed);
        assert_eq!(draw(3), draw(3), "a seeded rng decides the same way twice");
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        let huge = |b: NodeBuilder| {
            b.disk_status("default", |d| {
                d.storage_maximum = i64::MAX;
                d.storage_available = i64::MAX;
            })
        };
        let world = World::new([
            huge(node("node-a")),
            huge(node("node-b")).disk_spec("default", |d| d.storage_reserved = i64::MIN),
        ])
        .with_replica(replica("x", "other", i64::MAX, "node-a", "node-a-fs"))
        .with_replica(replica("y", "other", i64::MAX, "node-a", "node-a-fs"))
        .with_replica(replica("z", "other", i64::MIN, "node-b", "node-b-fs"));
        let mut rng = fastrand::Rng::with_seed(0);
        for over in [0, 100, u64::MAX] {
            for minimal in [0, 100, u64::MAX] {
                let settings = SchedulerSettings {
                    over_provisioning_percentage: over,
                    minimal_available_percentage: minimal,
                    soft_node_anti_affinity: true,
                    ..SchedulerSettings::default()
                };
                for size in [i64::MIN, -1, 0, 4096, i64::MAX] {
                    // Any answer will do, as long as there is one.
                    let _ = world.schedule(&volume(size, 3), &settings, &mut rng);
                }
            }
        }
        let settings = SchedulerSettings {
            over_provisioning_percentage: u64::MAX,
            minimal_available_percentage: 0,
            ..SchedulerSettings::default()
        };
        let placed = world
            .schedule(&volume(i64::MAX, 1), &settings, &mut rng)
            .expect("room");
        assert_eq!(placed.node_id, "node-b");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(100), "100 B");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(512 << 20), "512 MiB");
        assert_eq!(human(10 * GIB), "10 GiB");
        assert_eq!(human(3 * GIB / 2), "1.5 GiB");
        assert_eq!(human(GIB - 1), "1023.9 MiB");
        assert_eq!(human(-2 * GIB), "-2 GiB");
        assert_eq!(human(i64::MAX), "7.9 EiB");
        assert_eq!(human(i64::MIN), "-8 EiB");
        assert_eq!(human_i128(i128::MAX), "7.9 EiB");
        assert_eq!(human_i128(i128::MIN), "-8 EiB");
    }

    /// One generated disk: small GiB counts so boundaries are hit often.
    #[derive(Clone, Debug)]
    struct GenDisk {
        allow: bool,
        /// Index into a few fsids (or none): disks sharing a filesystem are allowed.
        fsid: Option<u8>,
        maximum: i64,
        available: i64,
        reserved: i64,
        ssd: bool,
        ready: ConditionStatus,
        schedulable: ConditionStatus,
    }

    #[derive(Clone, Debug)]
    struct GenNode {
        up: bool,
        allow: bool,
        ready: ConditionStatus,
        fast: bool,
        zone: u8,
        disks: Vec<GenDisk>,
    }

    /// A replica of the test volume (sibling) or of another one, possibly unscheduled (node None).
    #[derive(Clone, Debug)]
    struct GenReplica {
        sibling: bool,
        node: Option<u8>,
        fsid: u8,
        size: i64,
    }

    #[derive(Clone, Debug)]
    struct Scenario {
        nodes: Vec<GenNode>,
        replicas: Vec<GenReplica>,
        settings: SchedulerSettings,
        size: i64,
        replica_count: i32,
        node_selector: bool,
        disk_selector: bool,
        seed: u64,
    }

    fn condition_status() -> impl Strategy<Value = ConditionStatus> {
        prop_oneof![
            6 => Just(ConditionStatus::True),
            1 => Just(ConditionStatus::False),
            1 => Just(ConditionStatus::Unknown),
        ]
    }

    fn gen_disk() -> impl Strategy<Value = GenDisk> {
        (
            prop::bool::weighted(0.9),
            prop::option::weighted(0.9, 0..4u8),
            (0..12i64, 0..12i64, 0..4i64),
            prop::bool::ANY,
            condition_status(),
            condition_status(),
        )
            .prop_map(
                |(allow, fsid, (maximum, available, reserved), ssd, ready, schedulable)| GenDisk {
                    allow,
                    fsid,
                    maximum: maximum * GIB,
                    available: available * GIB,
                    reserved: reserved * GIB,
                    ssd,
                    ready,
                    schedulable,
                },
            )
    }

    fn gen_node() -> impl Strategy<Value = GenNode> {
        (
            prop::bool::weighted(0.9),
            prop::bool::weighted(0.9),
            condition_status(),
            prop::bool::ANY,
            0..3u8,
            prop::collection::vec(gen_disk(), 0..3),
        )
            .prop_map(|(up, allow, ready, fast, zone, disks)| GenNode {
                up,
                allow,
                ready,
                fast,
                zone,
                disks,
            })
    }

    fn gen_replica() -> impl Strategy<Value = GenReplica> {
        (
            prop::bool::ANY,
            prop::option::weighted(0.9, 0..7u8),
            0..4u8,
            1..6i64,
        )
            .prop_map(|(sibling, node, fsid, size)| GenReplica {
                sibling,
                node,
                fsid,
                size: size * GIB,
            })
    }

    fn gen_scenario() -> impl Strategy<Value = Scenario> {
        (
            prop::collection::vec(gen_node(), 0..7),
            prop::collection::vec(gen_replica(), 0..8),
            (
                prop::sample::select(vec![50u64, 100, 200]),
                prop::sample::select(vec![0u64, 10, 25, 50]),
                prop::bool::ANY,
                prop::bool::ANY,
            ),
            (
                1..8i64,
                1..5i32,
                prop::bool::weighted(0.3),
                prop::bool::weighted(0.3),
            ),
            any::<u64>(),
        )
            .prop_map(
                |(
                    nodes,
                    replicas,
                    (over, minimal, soft_node, soft_zone),
                    (size, count, ns, ds),
                    seed,
                )| {
                    Scenario {
                        nodes,
                        replicas,
                        settings: SchedulerSettings {
                            over_provisioning_percentage: over,
                            minimal_available_percentage: minimal,
                            soft_node_anti_affinity: soft_node,
                            soft_zone_anti_affinity: soft_zone,
                        },
                        size: size * GIB,
                        replica_count: count,
                        node_selector: ns,
                        disk_selector: ds,
                        seed,
                    }
                },
            )
    }

    const ZONES: [&str; 3] = ["", "z1", "z2"];

    impl Scenario {
        fn world(&self) -> World {
            let mut world = World::default();
            for (i, g) in self.nodes.iter().enumerate() {
                let name = format!("n{i}");
                let mut b = bare_node(&name)
                    .zone(ZONES[usize::from(g.zone)])
                    .allow_scheduling(g.allow)
                    .ready(g.ready)
                    .tags(if g.fast { &["fast"] } else { &[] });
                for (j, d) in g.disks.iter().enumerate() {
                    let fsid = d.fsid.map(|f| format!("fs{f}")).unwrap_or_default();
                    b = b
                        .disk(&format!("d{j}"), &fsid, d.maximum, d.available)
                        .disk_spec(&format!("d{j}"), |s| {
                            s.allow_scheduling = d.allow;
                            s.storage_reserved = d.reserved;
                            s.tags = if d.ssd { strings(&["ssd"]) } else { vec![] };
                        })
                        .disk_status(&format!("d{j}"), |s| {
                            s.conditions = vec![
                                condition("Ready", d.ready),
                                condition("Schedulable", d.schedulable),
                            ];
                        });
                }
                world.nodes.push(Arc::new(b.0));
                if !g.up {
                    world.down.push(name);
                }
            }
            for (i, r) in self.replicas.iter().enumerate() {
                let node = r.node.map(|n| format!("n{n}")).unwrap_or_default();
                let vol = if r.sibling { VOLUME } else { "other" };
                let disk = format!("fs{}", r.fsid);
                world.replicas.push(Arc::new(replica(
                    &format!("r{i}"),
                    vol,
                    r.size,
                    &node,
                    &disk,
                )));
            }
            world
        }

        fn volume(&self) -> Volume {
            let mut v = volume(self.size, self.replica_count);
            if self.node_selector {
                v.spec.node_selector = strings(&["fast"]);
            }
            if self.disk_selector {
                v.spec.disk_selector = strings(&["ssd"]);
            }
            v
        }
    }

    /// Every (node, disk) pair the hard rules allow, with its soft rank, written
    /// straight from the rules rather than from the implementation.
    fn oracle(
        world: &World,
        vol: &Volume,
        settings: &SchedulerSettings,
    ) -> Vec<(Placement, (bool, bool))> {
        let siblings: Vec<&Replica> = world
            .replicas
            .iter()
            .filter(|r| {
                r.spec.instance.volume_name == VOLUME && !r.spec.instance.node_id.is_empty()
            })
            .map(|r| &**r)
            .collect();
        let zone_of = |name: &str| {
            world
                .nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name))
                .and_then(|n| n.status.as_ref())
                .map(|s| s.zone.clone())
                .unwrap_or_default()
        };
        let mut allowed = Vec::new();
        for n in &world.nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let status = n.status.clone().unwrap_or_default();
            let node_ok = !world.down.contains(&name)
                && n.spec.allow_scheduling
                && !status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == ConditionStatus::False)
                && vol
                    .spec
                    .node_selector
                    .iter()
                    .all(|t| n.spec.tags.contains(t));
            let on_node = siblings.iter().any(|r| r.spec.instance.node_id == name);
            let in_zone = !status.zone.is_empty()
                && siblings
                    .iter()
                    .any(|r| zone_of(&r.spec.instance.node_id) == status.zone);
            if !node_ok
                || (!settings.soft_node_anti_affinity && on_node)
                || (!settings.soft_zone_anti_affinity && in_zone)
            {
                continue;
            }
            for (disk_name, spec) in &n.spec.disks {
                let Some(ds) = status.disk_status.get(disk_name) else {
                    continue;
                };
                let scheduled: i128 = world
                    .replicas
                    .iter()
                    .filter(|r| r.spec.instance.node_id == name && r.spec.disk_id == ds.fsid)
                    .map(|r| i128::from(r.spec.instance.volume_size))
                    .sum();
                let size = i128::from(vol.spec.size);
                let max = i128::from(ds.storage_maximum);
                let disk_ok = spec.allow_scheduling
                    && !ds.fsid.is_empty()
                    && ds.storage_maximum > 0
                    && !ds.conditions.iter().any(|c| {
                        (c.type_ == "Ready" || c.type_ == "Schedulable")
                            && c.status == ConditionStatus::False
                    })
                    && vol.spec.disk_selector.iter().all(|t| spec.tags.contains(t))
                    && scheduled + size
                        <= (max - i128::from(spec.storage_reserved))
                            * i128::from(settings.over_provisioning_percentage)
                            / 100
                    && i128::from(ds.storage_available) - size
                        >= max * i128::from(settings.minimal_available_percentage) / 100;
                if disk_ok {
                    let placement = Placement {
                        node_id: name.clone(),
                        disk_name: disk_name.clone(),
                        disk_id: ds.fsid.clone(),
                        disk_path: spec.path.clone(),
                    };
                    allowed.push((placement, (on_node, in_zone)));
                }
            }
        }
        allowed
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A placement is returned exactly when the hard rules allow one, and it is
        /// one of the allowed pairs with the best soft rank.
        #[test]
        fn every_placement_satisfies_every_hard_rule(scenario in gen_scenario()) {
            let world = scenario.world();
            let vol = scenario.volume();
            let allowed = oracle(&world, &vol, &scenario.settings);
            let mut rng = fastrand::Rng::with_seed(scenario.seed);
            match world.schedule(&vol, &scenario.settings, &mut rng) {
                Ok(placement) => {
                    let rank = allowed.iter().find(|(p, _)| *p == placement).map(|(_, r)| *r);
                    prop_assert!(rank.is_some(), "{placement:?} breaks a hard rule; allowed: {allowed:?}");
                    let best = allowed.iter().map(|(_, r)| *r).min();
                    prop_assert_eq!(rank, best, "a better-ranked pair was passed over");
                }
                Err(e) => {
                    prop_assert!(allowed.is_empty(), "{e:?} although {allowed:?} were allowed");
                    prop_assert!(!e.message.is_empty());
                    prop_assert!([
                        NO_SCHEDULABLE_NODE,
                        NODE_SELECTOR_MISMATCH,
                        REPLICA_ANTI_AFFINITY,
                        NO_SCHEDULABLE_DISK,
                        DISK_SELECTOR_MISMATCH,
                        INSUFFICIENT_STORAGE,
                    ]
                    .contains(&e.reason));
                }
            }
        }
    }
}
