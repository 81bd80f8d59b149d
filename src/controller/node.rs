//! Node controller: a node's manager measures its disks (statfs) and keeps
//! its Node object's conditions current; when a node's manager is gone, the
//! manager that took the Node over marks it not Ready, so nothing is
//! scheduled there.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use super::{Context, ControllerError, replace_status};
use crate::datastore::create_if_absent;
use crate::host::frontends;
use crate::scheduler::promised_bytes;
use crate::types::{
    Condition, ConditionStatus, DUPLICATE_FILESYSTEM, DiskSpec, DiskStatus, FrontendSupport, Node,
    NodeSpec, NodeStatus, REGION_LABEL, ZONE_LABEL,
};

/// Free space changes without any event: measure this often (as often as
/// Longhorn's disk monitor). A status write wakes every manager's node
/// controller, so more often would cost all of them for little.
const MEASURE_EVERY: Duration = Duration::from_secs(30);
/// What a node's frontends need changes only when someone installs or
/// removes a package or a module: probe it this often. The iSCSI probe runs
/// a program in the host's namespaces.
const PROBE_FRONTENDS_EVERY: Duration = Duration::from_secs(300);
/// The Schedulable reason of a node or disk whose replicas are evicted:
/// nothing new is placed there.
const EVICTING: &str = "Evicting";
/// The disk a node gets when its Node object is first created.
pub const DEFAULT_DISK: &str = "default-disk";

/// Creates this node's Node object with its default disk when it has none.
pub async fn ensure_own_node(ctx: &Context) -> Result<(), ControllerError> {
    let api: Api<Node> = ctx.api();
    if api.get_opt(&ctx.node.node_id).await?.is_some() {
        return Ok(());
    }
    let data_dir = &ctx.node.data_dir;
    std::fs::create_dir_all(data_dir).map_err(|source| ControllerError::Io {
        path: data_dir.clone(),
        source,
    })?;
    let disk = DiskSpec {
        path: data_dir.display().to_string(),
        allow_scheduling: true,
        storage_reserved: 0,
        tags: Vec::new(),
        eviction_requested: false,
    };
    let node = Node::new(
        &ctx.node.node_id,
        NodeSpec {
            disks: BTreeMap::from([(DEFAULT_DISK.to_owned(), disk)]),
            allow_scheduling: true,
            tags: Vec::new(),
            eviction_requested: false,
        },
    );
    if create_if_absent(&api, &node).await?.is_some() {
        info!(disk = %data_dir.display(), "created this node's Node object");
    }
    Ok(())
}

pub async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let Some(node) = ctx.claim(&*node).await? else {
        return Ok(Action::await_change());
    };
    let name = node.name_any();
    let mut status = node.status.clone().unwrap_or_default();
    let action = if name == ctx.node.node_id {
        observe_own(&ctx, &node, &mut status);
        status.frontends = ctx.frontends.get(Instant::now(), || frontends(&ctx)).await;
        Action::requeue(MEASURE_EVERY)
    } else {
        observe_taken_over(&ctx, &name, &mut status);
        Action::await_change()
    };
    count_replicas(&ctx, &node, &mut status);
    let old = node.status.clone().unwrap_or_default();
    announce_transitions(&ctx, &node, &old, &status).await;
    if old != status {
        let mut updated = node.clone();
        updated.status = Some(status);
        replace_status(&ctx.api::<Node>(), &updated).await?;
    }
    Ok(action)
}

/// This manager's own node: disks measured, Ready from the Kubernetes node.
fn observe_own(ctx: &Context, node: &Node, status: &mut NodeStatus) {
    let kube_node = ctx.ds.kube_nodes.get(&ctx.node.node_id);
    let label = |key: &str| {
        kube_node
            .as_ref()
            .and_then(|n| n.labels().get(key).cloned())
            .unwrap_or_default()
    };
    status.zone = label(ZONE_LABEL);
    status.region = label(REGION_LABEL);
    status.disk_status = measure_disks(ctx, node, status);

    match ctx.liveness.down(&ctx.node.node_id) {
        None => Condition::set(
            &mut status.conditions,
            "Ready",
            ConditionStatus::True,
            "NodeUp",
            "the node and its manager are up",
        ),
        Some(down) => Condition::set(
            &mut status.conditions,
            "Ready",
            ConditionStatus::False,
            down.reason(),
            down.message(&ctx.node.node_id),
        ),
    };
    let schedulable_disks = status
        .disk_status
        .values()
        .filter(|d| Condition::is_true(&d.conditions, "Schedulable"))
        .count();
    let (schedulable, reason, message) = if !node.spec.allow_scheduling {
        (
            false,
            "SchedulingDisabled",
            "spec.allowScheduling is false".to_owned(),
        )
    } else if node.spec.eviction_requested {
        (
            false,
            EVICTING,
            "spec.evictionRequested is true: its replicas move away".to_owned(),
        )
    } else if schedulable_disks == 0 {
        (
            false,
            "NoSchedulableDisk",
            "no disk of this node can take replicas".to_owned(),
        )
    } else {
        (
            true,
            "Schedulable",
            format!("{schedulable_disks} disk(s) can take replicas"),
        )
    };
    Condition::set(
        &mut status.conditions,
        "Schedulable",
        schedulable.into(),
        reason,
        message,
    );
}

/// The frontends this node can present volumes with, measured on its
/// host each time (an operator may install open-iscsi meanwhile).
async fn frontends(ctx: &Context) -> Vec<FrontendSupport> {
    frontends::support(&ctx.node.host, Path::new("/dev"))
        .await
        .into_iter()
        .map(|(frontend, support)| FrontendSupport {
            frontend,
            supported: support.is_ok(),
            reason: support.err().unwrap_or_default(),
        })
        .collect()
}

/// The node's frontends as last probed, probed again once
/// [`PROBE_FRONTENDS_EVERY`] has passed.
#[derive(Default)]
pub struct FrontendProbe {
    last: tokio::sync::Mutex<Option<(Instant, Vec<FrontendSupport>)>>,
}

impl FrontendProbe {
    async fn get<F>(&self, now: Instant, probe: impl FnOnce() -> F) -> Vec<FrontendSupport>
    where
        F: Future<Output = Vec<FrontendSupport>>,
    {
        let mut last = self.last.lock().await;
        match &*last {
            Some((at, support)) if now.duration_since(*at) < PROBE_FRONTENDS_EVERY => {
                support.clone()
            }
            _ => {
                let support = probe().await;
                *last = Some((now, support.clone()));
                support
            }
        }
    }
}

/// How many replicas each disk holds, and how many the node still has to
/// move off: every one while it is evicting, else those on its evicting
/// disks. Replicas being deleted are gone already.
fn count_replicas(ctx: &Context, node: &Node, status: &mut NodeStatus) {
    let name = node.name_any();
    let replicas: Vec<_> = ctx
        .ds
        .replicas
        .store
        .state()
        .into_iter()
        .filter(|r| r.spec.instance.node_id == name && r.metadata.deletion_timestamp.is_none())
        .collect();
    for (disk, measured) in &mut status.disk_status {
        let held = replicas.iter().filter(|r| node.holds(r, disk)).count();
        measured.scheduled_replicas = i64::try_from(held).unwrap_or(i64::MAX);
    }
    let to_evict = replicas.iter().filter(|r| node.evicts(r)).count();
    status.replicas_to_evict = i64::try_from(to_evict).unwrap_or(i64::MAX);
}

/// A node whose manager is gone: not Ready, so nothing is placed there.
fn observe_taken_over(ctx: &Context, name: &str, status: &mut NodeStatus) {
    let (ready, reason, message) = match ctx.liveness.down(name) {
        Some(down) => (ConditionStatus::False, down.reason(), down.message(name)),
        // Up again: its own manager takes the node back and says more.
        None => (
            ConditionStatus::True,
            "NodeUp",
            "the node and its manager are up".to_owned(),
        ),
    };
    Condition::set(&mut status.conditions, "Ready", ready, reason, message);
    if ready == ConditionStatus::False {
        Condition::set(
            &mut status.conditions,
            "Schedulable",
            ConditionStatus::False,
            reason,
            "the node is not Ready",
        );
    }
}

/// Each disk's space and conditions. Two disks on one filesystem would count
/// its space twice: the second one is not Ready.
fn measure_disks(ctx: &Context, node: &Node, status: &NodeStatus) -> BTreeMap<String, DiskStatus> {
    let minimal_available = ctx.settings().scheduler.minimal_available_percentage;
    let replicas = ctx.ds.replicas.store.state();
    let promised = promised_bytes(&replicas);
    let mut seen_fsids = HashSet::new();
    let mut measured = BTreeMap::new();
    for (name, disk) in &node.spec.disks {
        let mut disk_status = status.disk_status.get(name).cloned().unwrap_or_default();
        match statfs(Path::new(&disk.path)) {
            Ok(space) if !seen_fsids.insert(space.fsid.clone()) => {
                disk_status.fsid = space.fsid;
                Condition::set(
                    &mut disk_status.conditions,
                    "Ready",
                    ConditionStatus::False,
                    DUPLICATE_FILESYSTEM,
                    format!(
                        "{} is on a filesystem another disk of this node already uses",
                        disk.path
                    ),
                );
            }
            Ok(space) => {
                disk_status.storage_available = space.available;
                disk_status.storage_maximum = space.maximum;
                let scheduled = promised.get(&(ctx.node.node_id.as_str(), space.fsid.as_str()));
                disk_status.storage_scheduled =
                    scheduled.map_or(0, |b| i64::try_from(*b).unwrap_or(i64::MAX));
                disk_status.fsid = space.fsid;
                Condition::set(
                    &mut disk_status.conditions,
                    "Ready",
                    ConditionStatus::True,
                    "DiskReady",
                    format!("{} is mounted and readable", disk.path),
                );
            }
            Err(error) => {
                warn!(disk = name, path = disk.path, %error, "disk cannot be measured");
                Condition::set(
                    &mut disk_status.conditions,
                    "Ready",
                    ConditionStatus::False,
                    "DiskUnreadable",
                    format!("{}: {error}", disk.path),
                );
            }
        }
        let floor = disk_status
            .storage_maximum
            .saturating_mul(i64::try_from(minimal_available).unwrap_or(100))
            / 100;
        let (schedulable, reason, message) =
            if !Condition::is_true(&disk_status.conditions, "Ready") {
                (false, "DiskNotReady", "the disk is not Ready".to_owned())
            } else if !disk.allow_scheduling {
                (
                    false,
                    "SchedulingDisabled",
                    "allowScheduling is false".to_owned(),
                )
            } else if disk.eviction_requested {
                (
                    false,
                    EVICTING,
                    "evictionRequested is true: its replicas move away".to_owned(),
                )
            } else if disk_status.storage_available <= floor {
                (
                    false,
                    "DiskPressure",
                    format!(
                        "{} bytes free, at or below the {minimal_available}% that must stay free",
                        disk_status.storage_available
                    ),
                )
            } else {
                (true, "DiskSchedulable", String::new())
            };
        Condition::set(
            &mut disk_status.conditions,
            "Schedulable",
            schedulable.into(),
            reason,
            message,
        );
        measured.insert(name.clone(), disk_status);
    }
    measured
}

struct Space {
    available: i64,
    maximum: i64,
    fsid: String,
}

/// Free and total bytes of the filesystem holding `path`, and its device
/// number as the filesystem's id on this node.
fn statfs(path: &Path) -> std::io::Result<Space> {
    let fs = nix::sys::statvfs::statvfs(path)?;
    let device = nix::sys::stat::stat(path)?.st_dev;
    let bytes =
        |blocks: u64| i64::try_from(blocks.saturating_mul(fs.fragment_size())).unwrap_or(i64::MAX);
    Ok(Space {
        available: bytes(fs.blocks_available()),
        maximum: bytes(fs.blocks()),
        fsid: format!("{device:x}"),
    })
}

/// An Event for each node condition that flipped.
async fn announce_transitions(ctx: &Context, node: &Node, old: &NodeStatus, new: &NodeStatus) {
    for condition in &new.conditions {
        let before = Condition::status_of(&old.conditions, &condition.type_);
        if before == condition.status {
            continue;
        }
        let type_ = if condition.status == ConditionStatus::True {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let reason = if condition.reason.is_empty() {
            condition.type_.clone()
        } else {
            condition.reason.clone()
        };
        ctx.event(
            node,
            type_,
            &reason,
            format!(
                "{} is now {:?}: {}",
                condition.type_, condition.status, condition.message
            ),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Frontend;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn frontends_are_probed_once_per_period() {
        let cache = FrontendProbe::default();
        let probes = AtomicUsize::new(0);
        let probe = || async {
            let n = probes.fetch_add(1, Ordering::SeqCst);
            vec![FrontendSupport {
                frontend: Frontend::Iscsi,
                supported: n > 0,
                reason: String::new(),
            }]
        };
        let start = Instant::now();
        let first = cache.get(start, probe).await;
        let again = cache.get(start + PROBE_FRONTENDS_EVERY / 2, probe).await;
        assert_eq!((probes.load(Ordering::SeqCst), &again), (1, &first));
        let later = cache.get(start + PROBE_FRONTENDS_EVERY, probe).await;
        assert_eq!(probes.load(Ordering::SeqCst), 2);
        assert!(later[0].supported, "the new probe's answer: {later:?}");
    }
}
