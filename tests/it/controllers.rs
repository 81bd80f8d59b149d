//! The embedded controllers on a real API server, with several `oxhorn
//! manager` processes playing nodes (each its own node id, address, data dir
//! and Kubernetes Node). What a user would notice: where replicas land, that
//! a volume attaches and holds data, that losing a node degrades the volume
//! and it heals itself onto another node with the data intact, that exactly
//! one manager acts on each object, that impossible requests say why, and
//! that deleting a volume leaves nothing behind.
//!
//! Also: online growth, lease expiry, and a manager restart that does not
//! interrupt I/O; data is compared byte for byte after every heal.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use oxhorn::types::*;
use oxhorn_testbed as testbed;
use serde_json::json;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_survives_losing_a_node_and_heals_onto_another() {
    let mut cluster = Cluster::start("heal", 4).await;
    cluster
        .set("replica-replenishment-wait-interval", "2")
        .await;
    let node1 = cluster.nodes[0].node_id().to_owned();

    cluster.create_volume("vol", 64 * MIB, 3).await;
    cluster
        .until_volume("vol", "the volume detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    let replicas = cluster.replicas_of("vol").await;
    let placed: BTreeSet<&str> = replicas
        .iter()
        .map(|r| r.spec.instance.node_id.as_str())
        .collect();
    assert_eq!(replicas.len(), 3);
    assert_eq!(
        placed.len(),
        3,
        "three replicas on three distinct nodes: {placed:?}"
    );

    let device = cluster.attach("vol", &node1).await;
    assert!(
        device.starts_with(&cluster.node(&node1).dev_dir().display().to_string()),
        "{device}"
    );
    let written = write_pattern(&device, 16 << 20, 7);

    // The engine takes its rebuild bandwidth limit from the Setting, the
    // default until there is one.
    for (limit, what) in [(100, "the default"), (40, "the Setting's")] {
        if limit != 100 {
            cluster
                .set("replica-rebuild-bandwidth-limit", &limit.to_string())
                .await;
        }
        cluster
            .until(&format!("the engine at {what} rebuild limit"), || async {
                let engine = cluster.engine_of("vol").await?;
                (engine.status?.rebuild_bandwidth_limit == limit).then_some(())
            })
            .await;
    }

    // Lose a node that holds a replica and is not where the volume is attached.
    let victim = replicas
        .iter()
        .map(|r| r.spec.instance.node_id.clone())
        .find(|n| *n != node1)
        .unwrap();
    let lost_replica = replicas
        .iter()
        .find(|r| r.spec.instance.node_id == victim)
        .unwrap()
        .name_any();
    let spare: String = cluster
        .nodes
        .iter()
        .map(|n| n.node_id().to_owned())
        .find(|n| !placed.contains(n.as_str()))
        .unwrap();
    let lost_at = Instant::now();
    cluster.node_mut(&victim).power_off();
    testbed::set_kube_node_ready(&cluster.client, &victim, false)
        .await
        .unwrap();

    let replicas_api = cluster.api::<Replica>();
    cluster
        .until("the lost node's replica taken over", || async {
            let replica = replicas_api.get(&lost_replica).await.ok()?;
            let owner = replica.status?.owner_id;
            (owner != victim && !owner.is_empty()).then_some(())
        })
        .await;
    let nodes_api = cluster.api::<Node>();
    cluster
        .until(
            "the lost node marked not Ready by another manager",
            || async {
                let status = nodes_api.get(&victim).await.ok()?.status?;
                (status.owner_id != victim
                    && Condition::status_of(&status.conditions, "Ready") == ConditionStatus::False)
                    .then_some(())
            },
        )
        .await;
    let takeover = lost_at.elapsed();

    let failed = cluster
        .until("the lost replica marked failed", || async {
            let replica = replicas_api.get(&lost_replica).await.ok()?;
            replica
                .spec
                .failed_at
                .is_some()
                .then_some(lost_at.elapsed())
        })
        .await;
    let healed = cluster
        .until(
            "a new replica on the spare node, rebuilt, and the volume healthy",
            || async {
                let volume = cluster.volume("vol").await?;
                let engine = cluster.engine_of("vol").await?;
                let modes = engine.status?.replica_mode_map;
                let replicas = cluster.replicas_of("vol").await;
                let on_spare = replicas.iter().find(|r| r.spec.instance.node_id == spare)?;
                let rebuilt = modes.get(&on_spare.name_any()) == Some(&ReplicaMode::ReadWrite);
                let healthy = volume.status?.robustness == Robustness::Healthy;
                (rebuilt
                    && healthy
                    && modes
                        .values()
                        .filter(|m| **m == ReplicaMode::ReadWrite)
                        .count()
                        == 3)
                    .then(|| lost_at.elapsed())
            },
        )
        .await;
    eprintln!(
        "node lost -> ownership moved in {takeover:?}, replica failed after {failed:?}, healthy again after {healed:?}"
    );

    // Every RW replica serves reads in turn: read the data more than once.
    for _ in 0..3 {
        assert!(
            read_device(&device, written.len()) == written,
            "data differs after the rebuild"
        );
    }
    let reasons = cluster.event_reasons().await;
    for reason in ["ReplicaFailed", "Degraded", "Healthy", "Attached"] {
        assert!(
            reasons.contains(reason),
            "no {reason} event among {reasons:?}"
        );
    }

    // Grow the attached volume: the engine and the block device follow.
    cluster
        .patch_volume("vol", json!({"spec": {"size": 96 * MIB}}))
        .await;
    cluster
        .until("the engine grown to 96 MiB", || async {
            let engine = cluster.engine_of("vol").await?;
            (engine.status?.current_size == 96 * MIB).then_some(())
        })
        .await;
    cluster
        .until("the device grown to 96 MiB", || async {
            let output = Command::new("blockdev")
                .args(["--getsize64", &device])
                .output()
                .ok()?;
            (String::from_utf8_lossy(&output.stdout).trim() == (96 * MIB).to_string()).then_some(())
        })
        .await;
    assert!(
        read_device(&device, written.len()) == written,
        "data differs after expansion"
    );

    cluster.detach("vol").await;
    let replicas = cluster.replicas_of("vol").await;
    cluster.delete_volume("vol").await;
    for replica in replicas
        .iter()
        .filter(|r| r.spec.instance.node_id != victim)
    {
        let node = cluster.node(&replica.spec.instance.node_id);
        let dir = replica_dir(node, replica);
        assert!(!dir.exists(), "{} still exists", dir.display());
        let record = node
            .data_dir()
            .join("instance-manager/instances")
            .join(format!("{}.json", replica.name_any()));
        assert!(!record.exists(), "{} still runs", replica.name_any());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_managers_act_exactly_once_per_object() {
    let cluster = Cluster::start("race", 2).await;
    cluster.set("replica-soft-anti-affinity", "true").await;
    let names: Vec<String> = (0..12).map(|i| format!("race-{i}")).collect();
    for name in &names {
        cluster.create_volume(name, 16 * MIB, 2).await;
    }
    for name in &names {
        cluster
            .until_volume(name, "the volume detached", |s| {
                s.state == VolumeState::Detached
            })
            .await;
    }
    // Both managers were up and eligible for every volume; each volume must
    // have been claimed once, and its engine and replicas created once.
    let logs = cluster.logs();
    for name in &names {
        let claims = logs
            .lines()
            .filter(|l| {
                l.contains("took ownership")
                    && l.contains("kind=Volume")
                    && l.contains(&format!("name={name} "))
            })
            .count();
        assert_eq!(claims, 1, "{name} claimed {claims} times\n{logs}");
        assert_eq!(cluster.replicas_of(name).await.len(), 2, "{name}");
        let creations = logs
            .lines()
            .filter(|l| {
                l.contains(&format!("volume{{volume={name} "))
                    && (l.contains("replica created") || l.contains("engine created"))
            })
            .count();
        assert_eq!(
            creations, 3,
            "{name}: engine and two replicas created once each\n{logs}"
        );
    }
    let owners: BTreeSet<String> =
        futures::future::join_all(names.iter().map(|n| cluster.volume(n)))
            .await
            .into_iter()
            .map(|v| v.unwrap().status.unwrap().owner_id)
            .collect();
    eprintln!("volumes owned by {owners:?}");

    // Attaching to the node that does not own the volume hands ownership
    // over; the new owner must not add replicas it does not see yet.
    for name in &names[..2] {
        let owner = cluster.volume(name).await.unwrap().status.unwrap().owner_id;
        let other = cluster
            .nodes
            .iter()
            .map(|n| n.node_id().to_owned())
            .find(|n| *n != owner)
            .unwrap();
        cluster.attach(name, &other).await;
        let volume = cluster.volume(name).await.unwrap();
        assert_eq!(
            volume.status.unwrap().owner_id,
            other,
            "{name}: ownership follows the attachment"
        );
        let replicas = cluster.replicas_of(name).await;
        assert_eq!(
            replicas.len(),
            2,
            "{name} after the hand-over: {:?}",
            replicas.iter().map(|r| r.name_any()).collect::<Vec<_>>()
        );
        cluster.detach(name).await;
    }
}

fn scheduled_condition(volume: Volume) -> Condition {
    let conditions = volume.status.unwrap().conditions;
    conditions
        .into_iter()
        .find(|c| c.type_ == "Scheduled")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_cannot_be_placed_say_why() {
    let mut cluster = Cluster::start("unsched", 2).await;
    cluster.create_volume("three", 16 * MIB, 3).await;
    let volume = cluster
        .until_volume("three", "the Scheduled condition False", |s| {
            Condition::status_of(&s.conditions, "Scheduled") == ConditionStatus::False
        })
        .await;
    let scheduled = scheduled_condition(volume);
    assert_eq!(scheduled.reason, "ReplicaAntiAffinity", "{scheduled:?}");
    assert!(
        scheduled.message.contains("3 replicas"),
        "{}",
        scheduled.message
    );
    let replicas = cluster.replicas_of("three").await;
    assert_eq!(replicas.len(), 3, "no crash loop creating replicas");
    assert_eq!(
        replicas
            .iter()
            .filter(|r| !r.spec.instance.node_id.is_empty())
            .count(),
        2
    );
    let unscheduled = replicas
        .iter()
        .find(|r| r.spec.instance.node_id.is_empty())
        .unwrap();
    let condition = cluster
        .until("the unscheduled replica's condition", || async {
            let replica = cluster
                .api::<Replica>()
                .get(&unscheduled.name_any())
                .await
                .ok()?;
            replica
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Scheduled")
        })
        .await;
    assert_eq!(condition.status, ConditionStatus::False);

    // Far bigger than any disk here.
    cluster.create_volume("huge", 1 << 50, 1).await;
    let volume = cluster
        .until_volume("huge", "the Scheduled condition False", |s| {
            Condition::status_of(&s.conditions, "Scheduled") == ConditionStatus::False
        })
        .await;
    let scheduled = scheduled_condition(volume);
    assert_eq!(scheduled.reason, "InsufficientStorage", "{scheduled:?}");
    assert!(
        scheduled.message.contains("1 PiB") || scheduled.message.contains("1024 TiB"),
        "{}",
        scheduled.message
    );

    // An impossible request is not a crash: a volume that fits, asked for
    // after the impossible ones, is still placed on both nodes and becomes
    // healthy, and both managers still run.
    cluster.create_volume("fits", 16 * MIB, 2).await;
    cluster
        .until_volume("fits", "a volume that fits detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    let placed: BTreeSet<String> = cluster
        .replicas_of("fits")
        .await
        .into_iter()
        .map(|r| r.spec.instance.node_id)
        .collect();
    assert_eq!(placed.len(), 2, "{placed:?}");
    for node in &mut cluster.nodes {
        if let Err(error) = node.check_running() {
            panic!("{error}");
        }
        assert!(!node.log().contains("panicked"), "{}", node.log());
    }
    cluster.delete_volume("three").await;
    cluster.delete_volume("huge").await;
    cluster.delete_volume("fits").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_manager_adopts_its_processes_without_interrupting_io() {
    let mut cluster = Cluster::start("adopt", 1).await;
    let node1 = cluster.nodes[0].node_id().to_owned();
    cluster.create_volume("vol", 32 * MIB, 1).await;
    let device = cluster.attach("vol", &node1).await;
    let before = write_pattern(&device, 8 << 20, 1);
    assert_eq!(read_device(&device, before.len()), before);

    // A writer keeps going while the manager dies and comes back.
    let writer = {
        let device = device.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(6);
            let mut rounds = 0u64;
            while Instant::now() < deadline {
                let data = write_pattern(&device, 4 << 20, rounds);
                assert_eq!(read_device(&device, data.len()), data, "round {rounds}");
                rounds += 1;
            }
            rounds
        })
    };
    let record = cluster.nodes[0]
        .data_dir()
        .join("instance-manager/instances/vol-e.json");
    let engine_pid = || -> u64 {
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        record["pid"].as_u64().unwrap()
    };
    let pid_before = engine_pid();
    cluster.nodes[0].kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.nodes[0].restart(Path::new(OXHORN)).unwrap();
    let rounds = tokio::task::spawn_blocking(move || writer.join())
        .await
        .unwrap()
        .expect("I/O failed across the manager restart");
    assert!(rounds > 0);
    cluster
        .until_volume("vol", "the volume still attached", |s| {
            s.state == VolumeState::Attached && s.robustness == Robustness::Healthy
        })
        .await;
    assert_eq!(engine_pid(), pid_before, "the engine process was replaced");
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_that_stops_renewing_its_lease_loses_its_objects() {
    let mut cluster = Cluster::start("lease", 2).await;
    let (survivor, lost) = (
        cluster.nodes[0].node_id().to_owned(),
        cluster.nodes[1].node_id().to_owned(),
    );
    // The Kubernetes node stays Ready: only the lease tells.
    let stopped = Instant::now();
    cluster.node_mut(&lost).kill();
    let nodes = cluster.api::<Node>();
    let status = cluster
        .until("the silent node taken over", || async {
            let status = nodes.get(&lost).await.ok()?.status?;
            let down = Condition::status_of(&status.conditions, "Ready") == ConditionStatus::False;
            (status.owner_id == survivor && down).then_some(status)
        })
        .await;
    let took = stopped.elapsed();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "ManagerDown", "{ready:?}");
    eprintln!("lease of {LEASE_SECONDS} s: ownership moved {took:?} after the manager stopped");
    assert!(
        took >= Duration::from_secs(LEASE_SECONDS) - Duration::from_secs(LEASE_SECONDS / 3 + 1),
        "moved before the lease could have expired: {took:?}"
    );
}
