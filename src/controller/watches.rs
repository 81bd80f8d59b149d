//! What else a controller watches: node availability, instance processes,
//! and the objects of other kinds whose changes concern its own (the
//! mappers from one kind's change to the objects it concerns).

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tokio::sync::broadcast;
use tracing::info;

use crate::datastore::{Cache, Liveness};
use crate::instance::InstanceManager;
use crate::types::{Backup, BackupState, Engine, Node, RecurringJob, Replica, Snapshot, Volume};

/// How often availability of nodes is re-evaluated: lease expiry makes no
/// watch event, so it has to be looked at.
const LIVENESS_POLL: Duration = Duration::from_secs(1);

/// Watches node availability and sends `()` each time the set of available
/// nodes changes, so every object whose owner may have changed is looked at
/// again. Subscribe once per controller.
pub(super) fn watch_liveness(liveness: Liveness) -> broadcast::Sender<()> {
    let (tx, _) = broadcast::channel(4);
    let sender = tx.clone();
    tokio::spawn(async move {
        let mut last = liveness.up_nodes();
        let mut tick = tokio::time::interval(LIVENESS_POLL);
        loop {
            tick.tick().await;
            let now = liveness.up_nodes();
            if now != last {
                info!(up = ?now, was = ?last, "node availability changed");
                last = now;
                // No receiver yet is fine: controllers start from a full list.
                let _ = sender.send(());
            }
        }
    });
    tx
}

pub(super) fn liveness_changes(
    changes: &broadcast::Sender<()>,
) -> impl Stream<Item = ()> + Send + use<> {
    tokio_stream::wrappers::BroadcastStream::new(changes.subscribe())
        .filter_map(|r| futures::future::ready(r.ok()))
}

/// Refers to the object named like each instance whose process state
/// changed. Engines and replicas never share a name, so the controller of the
/// other kind finds no such object and ignores it.
pub(super) fn instance_changes<K>(
    instances: &InstanceManager,
    ns: &str,
) -> impl Stream<Item = ObjectRef<K>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + 'static,
{
    let ns = ns.to_owned();
    tokio_stream::wrappers::BroadcastStream::new(instances.subscribe()).filter_map(move |r| {
        futures::future::ready(r.ok().map(|name| ObjectRef::new(name.as_str()).within(&ns)))
    })
}

/// The volume of a replica: its replicas' states make the volume's.
pub(super) fn replica_volume(ns: &str) -> impl Mapper<Replica, Option<ObjectRef<Volume>>> {
    let ns = ns.to_owned();
    move |replica| Some(volume_ref(&replica.spec.instance.volume_name, &ns))
}

/// The volume of an engine: the engine's state makes the volume's.
pub(super) fn engine_volume(ns: &str) -> impl Mapper<Engine, Option<ObjectRef<Volume>>> {
    let ns = ns.to_owned();
    move |engine| Some(volume_ref(&engine.spec.instance.volume_name, &ns))
}

/// The replicas on a node: what a node change may affect.
pub(super) fn replicas_on(replicas: &Cache<Replica>) -> impl Mapper<Node, Vec<ObjectRef<Replica>>> {
    let replicas = replicas.store.clone();
    move |node| {
        let node = node.name_any();
        replicas
            .state()
            .iter()
            .filter(|r| r.spec.instance.node_id == node)
            .map(|r| ObjectRef::from_obj(&**r))
            .collect()
    }
}

/// The volumes with replicas on a node whose eviction was requested or
/// withdrawn (of the node or one of its disks): they move those replicas,
/// or stop moving them. Other changes of a node (its measurements, every
/// half minute) concern no volume.
pub(super) fn evictions_on(
    replicas: &Cache<Replica>,
    ns: &str,
) -> impl Mapper<Node, Vec<ObjectRef<Volume>>> {
    let (replicas, ns) = (replicas.store.clone(), ns.to_owned());
    let evicting: Mutex<HashSet<String>> = Mutex::default();
    move |node| {
        let name = node.name_any();
        let now = node.evicting();
        let was = {
            let mut evicting = evicting.lock().unwrap_or_else(|e| e.into_inner());
            if now {
                !evicting.insert(name.clone())
            } else {
                evicting.remove(&name)
            }
        };
        if !now && !was {
            return Vec::new();
        }
        let volumes: BTreeSet<String> = replicas
            .state()
            .iter()
            .filter(|r| r.spec.instance.node_id == name)
            .map(|r| r.spec.instance.volume_name.clone())
            .collect();
        volumes.iter().map(|v| volume_ref(v, &ns)).collect()
    }
}

/// The node of a replica on an evicting node or disk: the node counts the
/// replicas it still has to move.
pub(super) fn evicting_node(nodes: &Cache<Node>) -> impl Mapper<Replica, Option<ObjectRef<Node>>> {
    let nodes = nodes.clone();
    move |replica| {
        let node = nodes.get(&replica.spec.instance.node_id)?;
        node.evicting().then(|| ObjectRef::from_obj(&*node))
    }
}

/// The volumes a snapshot change concerns: its own volume, whose owner takes
/// and removes it, and the volumes filling from it, which wait for it.
pub(super) fn snapshot_concerns(
    volumes: &Cache<Volume>,
) -> impl Mapper<Snapshot, Vec<ObjectRef<Volume>>> {
    source_concerns(
        volumes,
        |s: &Snapshot| &s.spec.volume,
        |v| v.spec.source_snapshot(),
    )
}

/// The volumes a Backup change concerns: its own volume, whose replicas
/// run while it is taken, and the volumes restoring from it.
pub(super) fn backup_concerns(
    volumes: &Cache<Volume>,
) -> impl Mapper<Backup, Vec<ObjectRef<Volume>>> {
    source_concerns(
        volumes,
        |b: &Backup| &b.spec.volume_name,
        |v| v.spec.source_backup(),
    )
}

/// The volume whose snapshot a volume fills from: its replicas are the
/// source, so it must see how the filling goes.
pub(super) fn filled_from(
    snapshots: &Cache<Snapshot>,
    ns: &str,
) -> impl Mapper<Volume, Option<ObjectRef<Volume>>> {
    let (snapshots, ns) = (snapshots.clone(), ns.to_owned());
    move |volume| {
        let snapshot = snapshots.get(volume.spec.source_snapshot()?)?;
        Some(volume_ref(&snapshot.spec.volume, &ns))
    }
}

/// The Backups of a snapshot's volume not completed yet: a change of its
/// snapshots may let them go on.
pub(super) fn backups_of(backups: &Cache<Backup>) -> impl Mapper<Snapshot, Vec<ObjectRef<Backup>>> {
    let backups = backups.store.clone();
    move |snapshot| {
        backups
            .state()
            .iter()
            .filter(|b| {
                b.spec.volume_name == snapshot.spec.volume
                    && b.status
                        .as_ref()
                        .is_none_or(|s| s.state != BackupState::Completed)
            })
            .map(|b| ObjectRef::from_obj(&**b))
            .collect()
    }
}

/// The volumes whose turn a recurring job's run gives (its status lists
/// them as running): their owners run the job's task.
pub(super) fn turns_of(ns: &str) -> impl Mapper<RecurringJob, Vec<ObjectRef<Volume>>> {
    let ns = ns.to_owned();
    move |job| {
        job.status
            .iter()
            .flat_map(|s| &s.running)
            .map(|volume| volume_ref(volume, &ns))
            .collect()
    }
}

/// The recurring jobs a volume's change concerns: those it joins (by its
/// labels) or holds a turn in; their owners count the volume's records.
pub(super) fn jobs_of(
    jobs: &Cache<RecurringJob>,
) -> impl Mapper<Volume, Vec<ObjectRef<RecurringJob>>> {
    let jobs = jobs.store.clone();
    move |volume| {
        let name = volume.name_any();
        jobs.state()
            .iter()
            .filter(|job| {
                let running = job
                    .status
                    .as_ref()
                    .is_some_and(|s| s.running.contains(&name));
                running
                    || super::recurring::joins(volume.labels(), &job.name_any(), &job.spec.groups)
            })
            .map(|job| ObjectRef::from_obj(&**job))
            .collect()
    }
}

/// The claims choosing a volume's recurring jobs that a change of a volume
/// `node` owns concerns: those bound to the PersistentVolume named after
/// it, as the CSI provisioner names them (a volume made before its claim
/// was bound, or whose labels someone changed, follows its claim again).
pub(super) fn sourcing_claims(
    claims: &Cache<PersistentVolumeClaim>,
    node: &str,
) -> impl Mapper<Volume, Vec<ObjectRef<PersistentVolumeClaim>>> {
    let (claims, node) = (claims.store.clone(), node.to_owned());
    move |volume| {
        // Only the owner writes the volume's labels.
        let owned = volume.status.as_ref().is_some_and(|s| s.owner_id == node);
        if !owned {
            return Vec::new();
        }
        let name = volume.name_any();
        claims
            .state()
            .iter()
            .filter(|claim| {
                let bound = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
                bound == Some(name.as_str())
            })
            .map(|claim| ObjectRef::from_obj(&**claim))
            .collect()
    }
}

/// The volumes a change of a volume's source (a snapshot or Backup)
/// concerns: those whose `source_of` it is, then its own volume, which
/// `volume_of` names.
fn source_concerns<O>(
    volumes: &Cache<Volume>,
    volume_of: fn(&O) -> &String,
    source_of: fn(&Volume) -> Option<&str>,
) -> impl Mapper<O, Vec<ObjectRef<Volume>>>
where
    O: Resource + Send + Sync + 'static,
{
    let volumes = volumes.store.clone();
    move |source| {
        let name = source.name_any();
        let own = volume_ref(volume_of(&source), &source.namespace().unwrap_or_default());
        volumes
            .state()
            .iter()
            .filter(|v| source_of(v) == Some(&name))
            .map(|v| ObjectRef::from_obj(&**v))
            .chain([own])
            .collect()
    }
}

/// The standby volumes following the backups of the volume a Backup or
/// BackupVolume (`followed`: its target and volume) is of: a new backup is
/// theirs to restore, and a sync may let an activation go on.
pub(super) fn standby_followers<O>(
    volumes: &Cache<Volume>,
    followed: fn(&O) -> (&str, &str),
) -> impl Mapper<O, Vec<ObjectRef<Volume>>>
where
    O: Resource + Send + Sync + 'static,
{
    let volumes = volumes.store.clone();
    move |object| {
        let (target, source) = followed(&object);
        volumes
            .state()
            .iter()
            .filter(|v| v.is_standby())
            .filter(|v| {
                let standby = v.status.as_ref().and_then(|s| s.standby.as_ref());
                standby.is_some_and(|s| s.backup_target == target && s.source_volume == source)
            })
            .map(|v| ObjectRef::from_obj(&**v))
            .collect()
    }
}

/// The volume `name` of namespace `ns`.
fn volume_ref(name: &str, ns: &str) -> ObjectRef<Volume> {
    ObjectRef::new(name).within(ns)
}

/// A watch's mapper: from a changed object of kind `O` to the objects it
/// concerns.
pub(super) trait Mapper<O, I>: Fn(Arc<O>) -> I + Send + Sync + 'static {}

impl<O, I, F: Fn(Arc<O>) -> I + Send + Sync + 'static> Mapper<O, I> for F {}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};
    use serde_json::json;

    use super::*;

    fn volumes(specs: &[(&str, serde_json::Value)]) -> Cache<Volume> {
        let (store, mut writer) = reflector::store();
        for (name, spec) in specs {
            let volume: Volume = serde_json::from_value(json!({
                "apiVersion": "oxhorn.io/v1beta1", "kind": "Volume",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": spec,
            }))
            .unwrap();
            writer.apply_watcher_event(&watcher::Event::Apply(volume));
        }
        Cache::new(store, Some("ns"))
    }

    fn names(refs: Vec<ObjectRef<Volume>>) -> Vec<String> {
        refs.into_iter().map(|r| r.name).collect()
    }

    #[test]
    fn a_snapshot_concerns_its_volume_and_those_filling_from_it() {
        let volumes = volumes(&[
            ("v", json!({"size": 4096})),
            ("clone", json!({"size": 4096, "dataSource": "snapshot/s"})),
            ("other", json!({"size": 4096, "dataSource": "snapshot/t"})),
        ]);
        let snapshot: Snapshot = serde_json::from_value(json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Snapshot",
            "metadata": {"name": "s", "namespace": "ns"},
            "spec": {"volume": "v"},
        }))
        .unwrap();
        let concerned = snapshot_concerns(&volumes)(Arc::new(snapshot));
        assert_eq!(names(concerned), ["clone", "v"]);
    }

    #[test]
    fn a_backup_concerns_its_volume_and_those_restoring_from_it() {
        let volumes = volumes(&[
            ("v", json!({"size": 4096})),
            ("restored", json!({"size": 4096, "fromBackup": "b"})),
        ]);
        let backup: Backup = serde_json::from_value(json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Backup",
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"volumeName": "v"},
        }))
        .unwrap();
        let concerned = backup_concerns(&volumes)(Arc::new(backup));
        assert_eq!(names(concerned), ["restored", "v"]);
    }
}
