//! Cluster rows of the fault matrix: `oxhorn manager` nodes, a volume
//! attached through the controllers, a manager killed or cut off under writes.
//!
//! Killing the manager on a replica's node takes three managers: the
//! replica, marked failed while its node was down, must rejoin as it is for
//! the volume to heal. `kill_the_manager_beside_an_instance_manager` runs
//! every node's engines and replicas under an `oxhorn instance-manager`
//! process of its own, as installed: the manager on the engine's node is
//! killed under checksummed writes, none fails or is lost, the instance
//! manager runs on untouched, and the next manager finds the engine through
//! it. Cutting the engine's node off the API server runs the nodes in
//! network namespaces, each reaching the API server through a relay on a
//! network of its own whose bridge port is disabled: a watch on /proc must
//! see one engine process of the volume at every moment.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::ResourceExt;
use oxhorn::protocol::control::{EngineStatusRequest, ReplicaMode as WireMode};
use oxhorn::types::{
    Condition, ConditionStatus, Node, Replica, ReplicaMode, Robustness, VolumeState,
};
use oxhorn_testbed::{ManagerProcess, Writer};

use super::{
    PHASE_WRITES, Row, SIZE, read_replica, until_acknowledged, write_more, writer_options,
};
use crate::common::{Cluster, OXHORN, PATIENCE, eventually};

pub(super) const VOLUME: &str = "vol";

/// The managers' logs and those of the engines and replicas they run.
pub(super) fn logs(cluster: &Cluster) -> String {
    let mut logs = cluster.logs();
    for node in &cluster.nodes {
        let Ok(entries) = std::fs::read_dir(instance_logs(node)) else {
            continue;
        };
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            logs.push_str(&format!(
                "\n==== {} {} ====\n{text}",
                node.node_id(),
                entry.file_name().to_string_lossy()
            ));
        }
    }
    logs
}

/// The log of `instance` (its processes' output, one after the other) on
/// `node`.
pub(super) fn instance_log(cluster: &Cluster, node: &str, instance: &str) -> String {
    let path = instance_logs(cluster.node(node)).join(format!("{instance}.log"));
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Where `node`'s instance manager writes its processes' logs.
fn instance_logs(node: &ManagerProcess) -> PathBuf {
    oxhorn::instance::state_dir(&node.data_dir()).join("logs")
}

/// Creates the rows' volume (3 replicas) and waits until it is detached and
/// healthy; its replicas.
pub(super) async fn create_healthy_volume(cluster: &Cluster) -> Vec<Replica> {
    cluster.create_volume(VOLUME, SIZE as i64, 3).await;
    cluster
        .until_volume(VOLUME, "the volume detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    cluster.replicas_of(VOLUME).await
}

/// Waits until another manager has taken `victim`'s node over as down
/// (its lease expired).
pub(super) async fn until_taken_over(cluster: &Cluster, victim: &str) {
    let nodes = cluster.api::<Node>();
    cluster
        .until(&format!("{victim} taken over as down"), || async {
            let status = nodes.get(victim).await.ok()?.status?;
            let down = Condition::status_of(&status.conditions, "Ready") == ConditionStatus::False;
            (down && status.owner_id != victim).then_some(())
        })
        .await;
}

/// Waits until `node`'s own manager reports it Ready again.
pub(super) async fn until_back(cluster: &Cluster, node: &str) {
    let nodes = cluster.api::<Node>();
    cluster
        .until(&format!("{node} back"), || async {
            let status = nodes.get(node).await.ok()?.status?;
            let ready = Condition::status_of(&status.conditions, "Ready") == ConditionStatus::True;
            (ready && status.owner_id == node).then_some(())
        })
        .await;
}

/// Waits until the volume is attached and healthy with every replica RW
/// in its engine, and returns the replicas' data addresses.
pub(super) async fn until_healthy(cluster: &Cluster, replicas: usize) -> BTreeMap<String, String> {
    let healthy = eventually(PATIENCE, || async {
        let status = cluster.volume(VOLUME).await?.status?;
        if status.state != VolumeState::Attached || status.robustness != Robustness::Healthy {
            return None;
        }
        let engine = cluster.engine_of(VOLUME).await?.status?;
        let modes = &engine.replica_mode_map;
        let rw = modes
            .values()
            .filter(|m| **m == ReplicaMode::ReadWrite)
            .count();
        (rw == replicas && modes.len() == replicas).then_some(engine.current_replica_address_map)
    })
    .await;
    match healthy {
        Ok(addresses) => addresses,
        Err(e) => panic!(
            "{e} waiting for the volume healthy with {replicas} replicas RW: {:#?}\n{:#?}\n{}",
            cluster.volume(VOLUME).await.and_then(|v| v.status),
            cluster.engine_of(VOLUME).await.and_then(|e| e.status),
            logs(cluster)
        ),
    }
}

/// Kills the manager of the node the volume is attached to
/// (`engine_node`), or of another node holding one of its replicas,
/// under writes, keeps it down until another manager has taken its node
/// over, and starts it again.
///
/// The replica on the node taken over is marked failed; once its node
/// is back, the same replica rejoins (three nodes and the default
/// replenishment wait: nothing else could heal the volume in time).
/// Where a row's engines and replicas run: inside each node's manager, or
/// under each node's own `oxhorn instance-manager`, as installed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holder {
    Manager,
    InstanceManager,
}

async fn kill_a_manager(
    name: &'static str,
    prefix: &str,
    engine_node: bool,
    holder: Holder,
    seed: u64,
) {
    let mut row = Row::new(name);
    let mut cluster = match holder {
        Holder::Manager => Cluster::start(prefix, 3).await,
        Holder::InstanceManager => Cluster::start_with_instance_managers(prefix, 3).await,
    };
    let replicas = create_healthy_volume(&cluster).await;
    let holders: Vec<String> = replicas
        .iter()
        .map(|r| r.spec.instance.node_id.clone())
        .collect();
    let names = |replicas: Vec<oxhorn::types::Replica>| -> Vec<String> {
        replicas
            .iter()
            .map(|r| r.metadata.name.clone().unwrap_or_default())
            .collect()
    };
    let original = names(replicas);
    let attached_to = holders[0].clone();
    let device = PathBuf::from(cluster.attach(VOLUME, &attached_to).await);
    until_healthy(&cluster, 3).await;
    let victim = if engine_node {
        attached_to.clone()
    } else {
        holders[1].clone()
    };
    eprintln!(
        "{name}: replicas on {holders:?}, attached to {attached_to}, killing {victim}'s manager"
    );

    let writer = Writer::new(SIZE, writer_options(seed));
    let running = writer.start(&device).unwrap();
    until_acknowledged(&writer, &running, 0, PHASE_WRITES).await;
    let instance_manager = cluster.node(&victim).instance_manager_pid();
    cluster.node_mut(&victim).kill();
    until_taken_over(&cluster, &victim).await;
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let stats = running.stop();
    assert_eq!(stats.failed, 0, "{stats}");
    row.check_after_fault(writer.verify(&device).unwrap(), || logs(&cluster));

    cluster
        .node_mut(&victim)
        .restart(Path::new(OXHORN))
        .unwrap();
    let running = writer.start(&device).unwrap();
    until_back(&cluster, &victim).await;
    until_healthy(&cluster, 3).await;
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let stats = running.stop();
    assert_eq!(stats.failed, 0, "{stats}");
    let addresses = until_healthy(&cluster, 3).await;
    assert_eq!(
        cluster.node(&victim).instance_manager_pid(),
        instance_manager,
        "the instance manager ran on through the manager's death"
    );
    assert_eq!(
        names(cluster.replicas_of(VOLUME).await),
        original,
        "the failed replica rejoined (or never left the engine) rather than being replaced\n{}",
        logs(&cluster)
    );
    let verdict = writer.verify(&device).unwrap();
    let mut images = Vec::new();
    for (replica, address) in &addresses {
        let access = cluster.access(VOLUME).await;
        images.push((replica.clone(), read_replica(address, SIZE, &access).await));
    }
    row.finish(&stats, &verdict, &images, &writer, || logs(&cluster));
    cluster.detach(VOLUME).await;
    cluster.delete_volume(VOLUME).await;
}

/// Cuts the manager of the node the volume is attached to off the API
/// server (and only that: its data network still carries the volume's
/// traffic) under writes, until another manager has taken its node over
/// as down, then lets it back. Nothing acknowledged may be lost, and no
/// second engine may run beside the first at any moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_the_engines_node_from_the_api_server() {
    let name = "partition the engine's node from the API server";
    let mut row = Row::new(name);
    let cluster = Cluster::start_in_namespaces("fm-api-part", 3).await;
    let hosts = cluster.hosts.as_ref().expect("nodes in namespaces");
    let engines = EngineWatch::start(hosts.addresses());
    let replicas = create_healthy_volume(&cluster).await;
    let attached_to = replicas[0].spec.instance.node_id.clone();
    let index = cluster
        .nodes
        .iter()
        .position(|n| n.node_id() == attached_to)
        .unwrap();
    let device = PathBuf::from(cluster.attach(VOLUME, &attached_to).await);
    until_healthy(&cluster, 3).await;
    let generation = cluster.engine_of(VOLUME).await.unwrap().spec.generation;
    eprintln!("{name}: attached to {attached_to} (engine generation {generation})");

    let writer = Writer::new(SIZE, writer_options(8));
    let running = writer.start(&device).unwrap();
    until_acknowledged(&writer, &running, 0, PHASE_WRITES).await;
    hosts.cut_from_api(index);
    until_taken_over(&cluster, &attached_to).await;
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let engine = cluster.engine_of(VOLUME).await.unwrap();
    assert_eq!(
        (engine.spec.generation, &engine.spec.instance.node_id),
        (generation, &attached_to),
        "the engine was started again while its node was cut off"
    );
    // The cut-off manager, whose caches froze with every other lease
    // unrenewed, must not have acted on them (finding 7): asked directly
    // (the Engine's status is whatever that manager last wrote), the engine
    // still has the replicas on the nodes that are up RW.
    let status = engine.status.as_ref().unwrap();
    let control = format!("{}:{}", status.instance.ip, status.instance.port);
    let access = cluster.access(VOLUME).await;
    let mut client = oxhorn_testbed::engine_client(&control, &access)
        .await
        .unwrap();
    let members = client
        .status(EngineStatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .replicas;
    for replica in &replicas[1..] {
        let address = &engine.spec.replica_address_map[&replica.name_any()];
        let member = members.iter().find(|m| m.address == *address);
        assert_eq!(
            member.map(|m| m.mode()),
            Some(WireMode::Rw),
            "{address}, on a node that is up, left the I/O path while {attached_to} was cut off: {members:?}\n{}",
            logs(&cluster)
        );
    }
    hosts.reconnect_to_api(index);
    until_back(&cluster, &attached_to).await;
    until_healthy(&cluster, 3).await;
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let stats = running.stop();
    assert_eq!(stats.failed, 0, "{stats}");
    row.check_after_fault(writer.verify(&device).unwrap(), || logs(&cluster));

    let stats = write_more(&writer, &device, PHASE_WRITES).await;
    let addresses = until_healthy(&cluster, 3).await;
    let verdict = writer.verify(&device).unwrap();
    let mut images = Vec::new();
    for (replica, address) in &addresses {
        let access = cluster.access(VOLUME).await;
        images.push((replica.clone(), read_replica(address, SIZE, &access).await));
    }
    let seen = engines.stop();
    eprintln!("{name}: engine processes: {seen}");
    assert_eq!(
        seen.most_at_once,
        1,
        "two engines of the volume ran at once: {seen}\n{}",
        logs(&cluster)
    );
    row.finish(&stats, &verdict, &images, &writer, || logs(&cluster));
    cluster.detach(VOLUME).await;
    cluster.delete_volume(VOLUME).await;
}

/// Watches the machine's `oxhorn engine` processes serving on any of a
/// cluster's node addresses (one volume per cluster), from a thread that
/// samples /proc every 10 ms until stopped.
pub(super) struct EngineWatch {
    seen: Arc<Mutex<EnginesSeen>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct EnginesSeen {
    pub most_at_once: usize,
    /// Every process seen, by pid.
    pub processes: BTreeMap<u32, EngineProcess>,
    /// The pids running at the last sample.
    pub running: BTreeSet<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct EngineProcess {
    pub generation: u64,
    /// Its replicas' data addresses, as started.
    pub replicas: Vec<String>,
}

impl std::fmt::Display for EnginesSeen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} in all, at most {} at once: {:?}",
            self.processes.len(),
            self.most_at_once,
            self.processes
        )
    }
}

impl EngineWatch {
    pub(super) fn start(addresses: Vec<IpAddr>) -> Self {
        let seen = Arc::new(Mutex::new(EnginesSeen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopped) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let now = engines_on(&addresses);
                let mut seen = shared.lock().unwrap();
                seen.most_at_once = seen.most_at_once.max(now.len());
                seen.running = now.keys().copied().collect();
                seen.processes.extend(now);
                drop(seen);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Self {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// What the watch has seen so far.
    pub(super) fn seen(&self) -> EnginesSeen {
        self.seen.lock().unwrap().clone()
    }

    pub(super) fn stop(mut self) -> EnginesSeen {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("stopped once");
        thread.join().expect("the watch thread panicked");
        self.seen()
    }
}

impl Drop for EngineWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The `oxhorn engine` processes listening on one of `addresses`, by pid.
fn engines_on(addresses: &[IpAddr]) -> BTreeMap<u32, EngineProcess> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&str> = cmdline
                .split(|b| *b == 0)
                .map(|a| std::str::from_utf8(a).unwrap_or_default())
                .collect();
            if args.get(1) != Some(&"engine") {
                return None;
            }
            let values = |flag: &str| {
                args.windows(2)
                    .filter(|w| w[0] == flag)
                    .map(|w| w[1].to_owned())
                    .collect::<Vec<String>>()
            };
            let listen: std::net::SocketAddr = values("--listen").first()?.parse().ok()?;
            let generation = values("--generation").first()?.parse().ok()?;
            let replicas = values("--replica");
            addresses.contains(&listen.ip()).then_some((
                pid,
                EngineProcess {
                    generation,
                    replicas,
                },
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_the_manager_on_the_engines_node() {
    kill_a_manager(
        "kill -9 the manager on the engine's node",
        "fm-mgr-engine",
        true,
        Holder::Manager,
        6,
    )
    .await;
}

/// As installed: the engine lives under the node's instance manager, which
/// the manager's death does not touch, and the next manager asks it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_the_manager_beside_an_instance_manager() {
    kill_a_manager(
        "kill -9 the manager on the engine's node (instance manager)",
        "fm-mgr-im",
        true,
        Holder::InstanceManager,
        9,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_the_manager_on_a_replicas_node() {
    kill_a_manager(
        "kill -9 the manager on a replica's node",
        "fm-mgr-replica",
        false,
        Holder::Manager,
        7,
    )
    .await;
}
