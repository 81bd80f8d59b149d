//! Where a volume's replicas go.
//!
//! [`schedule`] is a pure function of what the caller shows it (nodes, every
//! replica, which nodes are up, the settings) and a random number generator, so
//! the volume controller stays the only place that reads the cluster and every
//! placement rule can be tested without one.
//!
//! The rules are Longhorn's. Candidates are narrowed in stages (schedulable
//! nodes, node selector, anti-affinity, usable disks, disk selector, room;
//! a node or disk that is evicting its replicas takes none), and the first
//! stage that leaves nothing names the failure, so the user is told
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

/// No node is up, ready, allowing scheduling and not evicting.
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

/// Nodes that are up, ready, allow scheduling and are not evicting.
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
    if node.spec.eviction_requested {
        problems.push("evicting");
    }
    problems
}

/// Nodes carrying every tag of the volume's node selector.
fn matching_nodes<'a>(
    nodes: Vec<&'a Node>,
    volume: &Volume,
) -> Result<Vec<&'a Node>, Unschedulable> {
    carrying_all(
        nodes,
        &volume.spec.node_selector,
        |n| n.spec.tags.as_slice(),
        |n| node_name(n).to_owned(),
        NODE_SELECTOR_MISMATCH,
        "no schedulable node carries every node selector tag",
    )
}

/// The candidates carrying every tag of `selector`. When none does: the
/// failure `reason`, saying `none` and listing the candidates' tags.
fn carrying_all<T>(
    candidates: Vec<T>,
    selector: &[String],
    tags_of: impl Fn(&T) -> &[String],
    label: impl Fn(&T) -> String,
    reason: &'static str,
    none: &str,
) -> Result<Vec<T>, Unschedulable> {
    let (matching, others): (Vec<_>, Vec<_>) = candidates
        .into_iter()
        .partition(|c| has_all(tags_of(c), selector));
    if !matching.is_empty() {
        return Ok(matching);
    }
    let excluded = others
        .iter()
        .map(|c| format!("{} ({})", label(c), tags(tags_of(c))))
        .collect();
    Err(unschedulable(
        reason,
        format!(
            "{none} ({}): {}",
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

/// Disks of `nodes` that are measured, ready, allow scheduling and are not
/// evicting.
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
    if spec.eviction_requested {
        return Err("evicting");
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
    carrying_all(
        disks,
        &volume.spec.disk_selector,
        |d| d.spec.tags.as_slice(),
        DiskCandidate::label,
        DISK_SELECTOR_MISMATCH,
        "no usable disk carries every disk selector tag",
    )
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
mod tests;
