//! What the control-plane benches (`scale.rs`, `recurring.rs`) share: a
//! namespace, many volumes made as a CSI provisioner would make them, and
//! watches that wait until all of them are in a state.

use std::collections::HashSet;
use std::fmt::Debug;

use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use oxhorn::types::{Replica, Setting, SettingSpec, Volume};
use serde_json::json;

/// Volume creations in flight at once, as a CSI provisioner with several
/// workers would send them.
const IN_FLIGHT: usize = 16;

pub async fn create_namespace(client: &Client, prefix: &str) -> String {
    let name = format!("{prefix}-{}", std::process::id());
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let mut namespace = k8s_openapi::api::core::v1::Namespace::default();
    namespace.metadata.name = Some(name.clone());
    api.create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    name
}

/// The settings that let one node's disk hold every replica of thousands
/// of (empty) volumes.
pub async fn one_node_holds_all(client: &Client, ns: &str) {
    for (key, value) in [
        ("replica-soft-anti-affinity", "true"),
        ("storage-over-provisioning-percentage", "10000"),
        ("storage-minimal-available-percentage", "1"),
    ] {
        let setting = Setting::new(
            key,
            SettingSpec {
                value: value.into(),
            },
        );
        Api::<Setting>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &setting)
            .await
            .expect("setting");
    }
}

/// Volumes `v0000`... of 16 MiB and `replicas` replicas each.
pub async fn create_volumes(client: &Client, ns: &str, count: usize, replicas: usize) {
    let api: Api<Volume> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let spec =
                    serde_json::from_value(json!({"size": 16 << 20, "numberOfReplicas": replicas}))
                        .expect("spec");
                api.create(
                    &PostParams::default(),
                    &Volume::new(&format!("v{i:04}"), spec),
                )
                .await
                .expect("volume");
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<()>()
        .await;
}

/// Follows the replicas with a watch until `wanted` of them have a node.
pub async fn until_scheduled(api: Api<Replica>, wanted: usize) {
    until_all(api, wanted, |replica: &Replica| {
        !replica.spec.instance.node_id.is_empty()
    })
    .await;
}

/// Follows `api`'s objects with a watch (cheap for the API server, unlike
/// repeated lists) until `wanted` of them are `done` at once.
pub async fn until_all<K>(api: Api<K>, wanted: usize, done: impl Fn(&K) -> bool)
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let mut finished = HashSet::new();
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    while finished.len() < wanted {
        match events.next().await {
            Some(Ok(object)) if done(&object) => {
                finished.insert(object.name_any());
            }
            Some(Ok(object)) => {
                finished.remove(&object.name_any());
            }
            Some(Err(_)) => {}
            None => return,
        }
    }
}

/// (VmRSS, VmHWM) of a process, in bytes.
pub fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
