//! Replica placement under hard node anti-affinity (the default): no two
//! replicas of a volume share a node at any moment, not only at rest. The
//! hardest moment is a cluster coming up: every manager starts at once, each
//! may see the others' nodes and leases late, and two of them may both take
//! a volume for theirs.
//!
//! Three managers start four times, and each time five volumes are created
//! while they come up; the test fails at the first moment two replicas of a
//! volume share a node.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::watcher::{self, Event};
use oxhorn::types::{ConditionStatus, Replica};

use crate::common::{Cluster, LEASE_SECONDS, MIB};

const STARTS: usize = 4;
const VOLUMES_PER_START: usize = 5;

/// The first moment two replicas of one volume shared a node, as seen by a
/// watch on every replica: created, being created, or being deleted.
fn watch_for_shared_nodes(cluster: &Cluster) -> Arc<Mutex<Option<String>>> {
    let found = Arc::new(Mutex::new(None));
    let record = Arc::clone(&found);
    let stream = watcher::watcher(cluster.api::<Replica>(), watcher::Config::default());
    tokio::spawn(async move {
        let mut replicas: HashMap<String, Replica> = HashMap::new();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Apply(r) | Event::InitApply(r)) => {
                    replicas.insert(r.name_any(), r);
                }
                Ok(Event::Delete(r)) => {
                    replicas.remove(&r.name_any());
                }
                Ok(Event::Init | Event::InitDone) | Err(_) => continue,
            }
            let mut by_place: BTreeMap<(&str, &str), &str> = BTreeMap::new();
            for (name, replica) in &replicas {
                let node = replica.spec.instance.node_id.as_str();
                if node.is_empty() {
                    continue;
                }
                let volume = replica.spec.instance.volume_name.as_str();
                if let Some(other) = by_place.insert((volume, node), name) {
                    let mut first = record.lock().unwrap();
                    first.get_or_insert_with(|| {
                        format!("volume {volume}: replicas {other} and {name} both on {node}")
                    });
                }
            }
        }
    });
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_never_share_a_node_while_the_managers_start() {
    for start in 0..STARTS {
        let cluster = Cluster::launch("placement", 3, LEASE_SECONDS).await;
        let shared = watch_for_shared_nodes(&cluster);
        let volumes: Vec<String> = (0..VOLUMES_PER_START)
            .map(|i| format!("vol-{start}-{i}"))
            .collect();
        for volume in &volumes {
            cluster.create_volume(volume, 16 * MIB, 3).await;
        }
        for volume in &volumes {
            cluster
                .until_volume(volume, "three replicas scheduled", |status| {
                    status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Scheduled" && c.status == ConditionStatus::True)
                })
                .await;
            cluster
                .until("the volume's replicas trimmed to three", || async {
                    (cluster.replicas_of(volume).await.len() == 3).then_some(())
                })
                .await;
        }
        for volume in &volumes {
            let replicas = cluster.replicas_of(volume).await;
            let mut nodes: Vec<&str> = replicas
                .iter()
                .map(|r| r.spec.instance.node_id.as_str())
                .collect();
            nodes.sort();
            nodes.dedup();
            assert_eq!(nodes.len(), 3, "{volume}: {nodes:?}");
        }
        if let Some(moment) = shared.lock().unwrap().take() {
            panic!("cluster start {start}: {moment}");
        }
        for volume in &volumes {
            cluster.delete_volume(volume).await;
        }
    }
}
