//! Finding 5 end to end: the replica on one node misses writes (its node
//! loses power), then the nodes of the two that hold them lose power too,
//! and only the stale replica's node comes back. The engine runs on a
//! fourth node that holds no replica, so that it outlives the replicas'
//! nodes.
//!
//! Left alone, the volume must wait: an engine that reaches the stale
//! replica alone gives up rather than serve it. A user's salvage request
//! serves it, losing what it missed, and the replicas that come back later
//! follow it rather than bringing the lost writes back.
//!
//! Once the others are back after the engine gave up, nothing acknowledged
//! is missing. The salvage test sets the Volume's `salvageRequest` in that
//! stale state: the volume serves the stale replica (blocks it missed read
//! back lost, none corrupt), and the others, once back, are rebuilt from it,
//! byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::ResourceExt;
use oxhorn::types::{ConditionStatus, ReplicaMode, Robustness, VolumeState};
use oxhorn_testbed::Writer;
use serde_json::json;

use super::cluster::{
    EngineWatch, VOLUME, create_healthy_volume, instance_log, logs, until_back, until_healthy,
    until_taken_over,
};
use super::{
    PHASE_WRITES, Row, SIZE, read_replica, until_acknowledged, write_more, writer_options,
};
use crate::common::{Cluster, OXHORN, eventually, read_device};

/// An engine that cannot reach its volume's I/O path gives up after 60 s;
/// auto-salvage starts one once the stale replica's node is back.
const GIVING_UP: Duration = Duration::from_secs(150);

/// A volume whose up-to-date replicas' nodes are down and whose stale
/// replica's node is back.
struct Stale {
    cluster: Cluster,
    engines: EngineWatch,
    engine_node: String,
    writer: Writer,
    /// Replica name to its node.
    holders: BTreeMap<String, String>,
    stale: String,
    up_to_date: [String; 2],
}

impl Stale {
    async fn start(name: &str, prefix: &str, seed: u64) -> Self {
        let mut cluster = Cluster::start(prefix, 4).await;
        let engines = EngineWatch::start(cluster.nodes.iter().map(|n| n.ip()).collect());
        let holders: BTreeMap<String, String> = create_healthy_volume(&cluster)
            .await
            .iter()
            .map(|r| (r.name_any(), r.spec.instance.node_id.clone()))
            .collect();
        let engine_node = cluster
            .nodes
            .iter()
            .map(|n| n.node_id().to_owned())
            .find(|n| !holders.values().any(|h| h == n))
            .expect("a node without a replica");
        let device = PathBuf::from(cluster.attach(VOLUME, &engine_node).await);
        until_healthy(&cluster, 3).await;
        let names: Vec<String> = holders.keys().cloned().collect();
        let stale = names[2].clone();
        let up_to_date = [names[0].clone(), names[1].clone()];
        let writer = Writer::new(SIZE, writer_options(seed));
        let running = writer.start(&device).unwrap();
        until_acknowledged(&writer, &running, 0, PHASE_WRITES).await;
        cluster.node_mut(&holders[&stale]).power_off();
        until_out(&cluster, &stale).await;
        until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
        let stats = running.stop();
        assert_eq!(stats.failed, 0, "{stats}");
        eprintln!(
            "{name}: {stale} on {} missed {PHASE_WRITES} writes; powering off {:?}",
            holders[&stale],
            up_to_date.each_ref().map(|r| &holders[r])
        );
        for replica in &up_to_date {
            cluster.node_mut(&holders[replica]).power_off();
        }
        for replica in &up_to_date {
            until_taken_over(&cluster, &holders[replica]).await;
        }
        cluster
            .node_mut(&holders[&stale])
            .restart(Path::new(OXHORN))
            .unwrap();
        until_back(&cluster, &holders[&stale]).await;
        Self {
            cluster,
            engines,
            engine_node,
            writer,
            holders,
            stale,
            up_to_date,
        }
    }

    /// Powers the up-to-date replicas' nodes on again.
    fn restart_up_to_date(&mut self) {
        for replica in &self.up_to_date {
            self.cluster
                .node_mut(&self.holders[replica])
                .restart(Path::new(OXHORN))
                .unwrap();
        }
    }

    async fn device(&self) -> PathBuf {
        let engine = self.cluster.engine_of(VOLUME).await.unwrap();
        PathBuf::from(engine.status.unwrap().endpoint)
    }

    /// Every replica's image, read from its data port.
    async fn images(&self) -> Vec<(String, Vec<u8>)> {
        let addresses = until_healthy(&self.cluster, 3).await;
        let access = self.cluster.access(VOLUME).await;
        let mut images = Vec::new();
        for (replica, address) in &addresses {
            images.push((replica.clone(), read_replica(address, SIZE, &access).await));
        }
        images
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_stale_replica_comes_back() {
    let name = "only a stale replica back, the up-to-date ones' nodes down";
    let mut row = Row::new(name);
    let mut stale = Stale::start(name, "fm-stale", 9).await;
    let cluster = &stale.cluster;

    // Auto-salvage starts an engine that reaches the stale replica alone;
    // the engine must give up rather than serve it (the I/O path it waits
    // for is the others'), and the volume must never say it is healthy.
    let gave_up = eventually(GIVING_UP, || async {
        if let Some(volume) = cluster.volume(VOLUME).await.and_then(|v| v.status) {
            assert_ne!(
                volume.robustness,
                Robustness::Healthy,
                "{volume:#?}\n{}",
                logs(cluster)
            );
        }
        if let Some(status) = cluster.engine_of(VOLUME).await.and_then(|e| e.status) {
            assert_ne!(
                status.replica_mode_map.get(&stale.stale),
                Some(&ReplicaMode::ReadWrite),
                "the stale replica was made RW: {status:#?}\n{}",
                logs(cluster)
            );
        }
        let log = instance_log(cluster, &stale.engine_node, &format!("{VOLUME}-e"));
        log.lines()
            .find(|l| l.contains("exiting") && l.contains("newest I/O path"))
            .map(str::to_owned)
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e} waiting for an engine started on the stale replica to give up: {}\n{}",
            stale.engines.seen(),
            logs(cluster)
        )
    });
    eprintln!("{name}: the engine gave up: {gave_up}");
    // And the volume says why, where a user looks.
    let why = cluster
        .until("the volume saying why its engine failed", || async {
            let status = cluster.volume(VOLUME).await?.status?;
            let condition = status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "EngineRunning" && c.status == ConditionStatus::False)?;
            condition
                .message
                .contains("newest I/O path")
                .then_some(condition.message)
        })
        .await;
    eprintln!("{name}: the volume says: {why}");
    stale.restart_up_to_date();
    let cluster = &stale.cluster;
    until_healthy(cluster, 3).await;
    let device = stale.device().await;
    let writer = &stale.writer;
    row.check_after_fault(writer.verify(&device).unwrap(), || logs(cluster));
    let stats = write_more(writer, &device, PHASE_WRITES).await;
    let verdict = writer.verify(&device).unwrap();
    let images = stale.images().await;
    eprintln!("{name}: engine processes: {}", stale.engines.seen());
    row.finish(&stats, &verdict, &images, writer, || logs(cluster));
    cluster.detach(VOLUME).await;
    cluster.delete_volume(VOLUME).await;
}

/// The user's way out: a salvage request serves the stale replica at once,
/// losing what it missed (the writer finds blocks lost, none corrupt), and
/// the up-to-date replicas, once back, are rebuilt from it: what was lost
/// does not come back, and every replica ends byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_salvage_request_serves_what_is_left() {
    let name = "salvage request";
    let mut stale = Stale::start(name, "fm-salvage", 10).await;
    let cluster = &stale.cluster;
    cluster
        .patch_volume(VOLUME, json!({"spec": {"salvageRequest": "first"}}))
        .await;
    cluster
        .until_volume(VOLUME, "the salvaged volume attached", |s| {
            s.state == VolumeState::Attached && s.salvaged_request == "first"
        })
        .await;
    let device = stale.device().await;
    let salvaged = stale
        .writer
        .verify(&device)
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(cluster)));
    eprintln!("{name}: after the salvage: {salvaged}");
    assert!(
        salvaged.lost > 0 && salvaged.corrupt == 0,
        "the salvaged volume should lack writes the stale replica missed, with nothing corrupt: {salvaged}"
    );
    let image = read_device(device.to_str().unwrap(), SIZE as usize);

    stale.restart_up_to_date();
    let images = stale.images().await;
    let cluster = &stale.cluster;
    let device = stale.device().await;
    assert!(
        read_device(device.to_str().unwrap(), SIZE as usize) == image,
        "the volume changed once the up-to-date replicas came back\n{}",
        logs(cluster)
    );
    for (replica, replica_image) in &images {
        assert!(
            *replica_image == image,
            "replica {replica} differs from the salvaged volume\n{}",
            logs(cluster)
        );
    }
    let seen = stale.engines.stop();
    assert_eq!(seen.most_at_once, 1, "{seen}");
    cluster.detach(VOLUME).await;
    cluster.delete_volume(VOLUME).await;
}

/// Waits until the volume's engine no longer lists `replica` as RW.
async fn until_out(cluster: &Cluster, replica: &str) {
    cluster
        .until(&format!("{replica} out of the I/O path"), || async {
            let status = cluster.engine_of(VOLUME).await?.status?;
            (status.replica_mode_map.get(replica) != Some(&ReplicaMode::ReadWrite)).then_some(())
        })
        .await;
}
