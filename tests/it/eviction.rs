//! Evicting a node's replicas: each gets a replacement on another node,
//! which rebuilds while the evicted one still serves, and only then does
//! the evicted one go; the volume keeps as many read-write replicas as it
//! wants throughout, and its data. Where no replacement can go, the replica
//! stays and the volume says why; a detached volume's replica stays until
//! the volume is attached and can rebuild.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use oxhorn::types::*;
use serde_json::json;

use crate::common::*;

/// The fewest read-write replicas the volume's engine reported at any
/// moment since the watch started, and whether the volume was ever less
/// than healthy.
#[derive(Debug, Default)]
struct Lowest {
    read_write: Option<usize>,
    unhealthy: Vec<Robustness>,
}

/// Watches `volume`'s engine and the volume from now on, recording in the
/// returned [`Lowest`] every moment of less redundancy.
fn watch_redundancy(cluster: &Cluster, volume: &str) -> Arc<Mutex<Lowest>> {
    let lowest = Arc::new(Mutex::new(Lowest::default()));
    let (record, name) = (Arc::clone(&lowest), volume.to_owned());
    let engines = watcher::watcher(cluster.api::<Engine>(), watcher::Config::default());
    tokio::spawn(async move {
        let mut engines = std::pin::pin!(engines);
        while let Some(event) = engines.next().await {
            let Ok(Event::Apply(engine) | Event::InitApply(engine)) = event else {
                continue;
            };
            if engine.spec.instance.volume_name != name {
                continue;
            }
            let modes = engine
                .status
                .map(|s| s.replica_mode_map)
                .unwrap_or_default();
            let read_write = modes
                .values()
                .filter(|m| **m == ReplicaMode::ReadWrite)
                .count();
            let mut lowest = record.lock().unwrap();
            lowest.read_write = Some(lowest.read_write.map_or(read_write, |l| l.min(read_write)));
        }
    });
    let (record, name) = (Arc::clone(&lowest), volume.to_owned());
    let volumes = watcher::watcher(cluster.api::<Volume>(), watcher::Config::default());
    tokio::spawn(async move {
        let mut volumes = std::pin::pin!(volumes);
        while let Some(event) = volumes.next().await {
            let Ok(Event::Apply(volume) | Event::InitApply(volume)) = event else {
                continue;
            };
            let robustness = volume.status.map(|s| s.robustness);
            if volume.metadata.name.as_deref() == Some(name.as_str())
                && let Some(robustness) = robustness.filter(|r| *r != Robustness::Healthy)
            {
                record.lock().unwrap().unhealthy.push(robustness);
            }
        }
    });
    lowest
}

/// Requests (or withdraws) the eviction of node `name`'s replicas.
async fn evict_node(cluster: &Cluster, name: &str, evict: bool) {
    cluster
        .api::<Node>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"evictionRequested": evict}})),
        )
        .await
        .unwrap();
}

/// Where `volume`'s replicas are: node to replica name.
async fn placement(cluster: &Cluster, volume: &str) -> BTreeMap<String, String> {
    cluster
        .replicas_of(volume)
        .await
        .into_iter()
        .map(|r| (r.spec.instance.node_id.clone(), r.name_any()))
        .collect()
}

async fn node_status(cluster: &Cluster, name: &str) -> Option<NodeStatus> {
    cluster.api::<Node>().get(name).await.ok()?.status
}

/// The volume's Evicted condition, if it has one.
fn evicted(status: &VolumeStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == "Evicted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_node_hands_its_replica_over_without_losing_redundancy() {
    hand_over("evict", false).await;
}

/// The manager that owns the volume (where it is attached) crashes and
/// starts again while the replacement exists: it goes on from what the
/// objects say, to the same end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_goes_on_after_the_volumes_manager_restarts() {
    hand_over("evict-restart", true).await;
}

/// Evicts a node holding one of a 2-replica volume's replicas on 3 nodes,
/// restarting the volume's manager in the middle if `restart`.
async fn hand_over(prefix: &str, restart: bool) {
    let mut cluster = Cluster::start(prefix, 3).await;
    cluster.create_volume("vol", 64 * MIB, 2).await;
    cluster
        .until_volume("vol", "the volume detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    let before = placement(&cluster, "vol").await;
    assert_eq!(before.len(), 2, "two replicas on two nodes: {before:?}");
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.node_id().to_owned())
        .collect();
    let spare = nodes
        .iter()
        .find(|n| !before.contains_key(*n))
        .unwrap()
        .clone();
    let (victim, evicted_replica) = before.iter().next().unwrap();
    let attached_to = before.keys().find(|n| *n != victim).unwrap().clone();

    let device = cluster.attach("vol", &attached_to).await;
    let written = write_pattern(&device, 16 << 20, 11);
    cluster
        .until_volume("vol", "both replicas read-write", |s| {
            s.robustness == Robustness::Healthy
        })
        .await;
    let lowest = watch_redundancy(&cluster, "vol");
    cluster
        .until("the watch's first look at the engine", || async {
            lowest.lock().unwrap().read_write.map(|_| ())
        })
        .await;

    evict_node(&cluster, victim, true).await;
    if restart {
        cluster
            .until("a replacement on the spare node", || async {
                placement(&cluster, "vol").await.get(&spare).map(|_| ())
            })
            .await;
        cluster
            .node_mut(&attached_to)
            .restart(std::path::Path::new(OXHORN))
            .unwrap();
    }
    let (replacement, counted) = cluster
        .until(
            "a replacement on the spare node read-write, and the evicted replica gone",
            || async {
                let now = placement(&cluster, "vol").await;
                let replacement = now.get(&spare)?.clone();
                let engine = cluster.engine_of("vol").await?;
                let modes = engine.status?.replica_mode_map;
                let rebuilt = modes.get(&replacement) == Some(&ReplicaMode::ReadWrite);
                let counted = node_status(&cluster, victim).await?.replicas_to_evict;
                (rebuilt && !now.contains_key(victim.as_str())).then_some((replacement, counted))
            },
        )
        .await;
    assert_ne!(&replacement, evicted_replica);
    let volume = cluster
        .until_volume("vol", "the volume healthy with no Evicted condition", |s| {
            s.robustness == Robustness::Healthy && evicted(s).is_none()
        })
        .await;
    assert_eq!(volume.status.unwrap().state, VolumeState::Attached);
    cluster
        .until("the node counting no replica left to evict", || async {
            let status = node_status(&cluster, victim).await?;
            (status.replicas_to_evict == 0).then_some(())
        })
        .await;
    eprintln!("replicas to evict when the replacement served: {counted}");

    // Every RW replica serves reads in turn: read the data more than once.
    for _ in 0..3 {
        assert!(
            read_device(&device, written.len()) == written,
            "data differs after the eviction"
        );
    }
    {
        let lowest = lowest.lock().unwrap();
        assert!(
            lowest.read_write.is_some_and(|n| n >= 2) && lowest.unhealthy.is_empty(),
            "the volume lost redundancy while evicting: {lowest:?}"
        );
    }
    let reasons = cluster.event_reasons().await;
    assert!(reasons.contains("ReplicaEvicted"), "{reasons:?}");
    assert!(!reasons.contains("EvictionBlocked"), "{reasons:?}");

    // Nothing new lands on the evicting node.
    cluster.create_volume("vol-2", 16 * MIB, 2).await;
    cluster
        .until_volume("vol-2", "the second volume placed", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Scheduled" && c.status == ConditionStatus::True)
        })
        .await;
    let second = placement(&cluster, "vol-2").await;
    assert!(!second.contains_key(victim.as_str()), "{second:?}");

    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
    cluster.delete_volume("vol-2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_nowhere_to_go_stays_and_the_volume_says_why() {
    let cluster = Cluster::start("evict-stuck", 2).await;
    cluster
        .set("replica-replenishment-wait-interval", "2")
        .await;
    cluster.create_volume("vol", 32 * MIB, 2).await;
    cluster
        .until_volume("vol", "the volume detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    let before = placement(&cluster, "vol").await;
    let nodes: Vec<String> = before.keys().cloned().collect();
    let (attached_to, victim) = (&nodes[0], &nodes[1]);

    // Detached: the replica waits for an attachment, and says so.
    evict_node(&cluster, victim, true).await;
    let volume = cluster
        .until_volume(
            "vol",
            "the detached volume saying why its replica stays",
            |s| evicted(s).is_some_and(|c| c.reason == "VolumeDetached"),
        )
        .await;
    eprintln!("{:?}", evicted(volume.status.as_ref().unwrap()));
    // Detached, nothing replaces it yet: a replacement could only be
    // rebuilt once the engine runs.
    assert_eq!(placement(&cluster, "vol").await, before);

    // Attached: it would rebuild, but no node may take a replacement.
    let device = cluster.attach("vol", attached_to).await;
    let written = write_pattern(&device, 8 << 20, 5);
    let volume = cluster
        .until_volume(
            "vol",
            "the volume saying no replacement can be placed",
            |s| {
                evicted(s).is_some_and(|c| {
                    c.status == ConditionStatus::False && c.reason == "ReplacementUnschedulable"
                })
            },
        )
        .await;
    let status = volume.status.unwrap();
    let message = &evicted(&status).unwrap().message;
    assert!(
        message.contains(&before[victim]) && message.contains("anti-affinity"),
        "{message}"
    );
    assert_eq!(status.robustness, Robustness::Healthy);
    cluster
        .until("the node counting the replica it still has", || async {
            let status = node_status(&cluster, victim).await?;
            (status.replicas_to_evict == 1).then_some(())
        })
        .await;
    let reasons = cluster.event_reasons().await;
    assert!(reasons.contains("EvictionBlocked"), "{reasons:?}");
    let now = placement(&cluster, "vol").await;
    assert_eq!(now.get(victim.as_str()), Some(&before[victim]), "{now:?}");
    assert!(read_device(&device, written.len()) == written);

    // Withdrawn: the replacement that never found a place goes.
    evict_node(&cluster, victim, false).await;
    cluster
        .until_volume("vol", "the Evicted condition gone", |s| {
            evicted(s).is_none()
        })
        .await;
    cluster
        .until("the unplaced replacement removed", || async {
            (cluster.replicas_of("vol").await.len() == 2).then_some(())
        })
        .await;
    assert_eq!(placement(&cluster, "vol").await, before);
    assert!(read_device(&device, written.len()) == written);
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}
