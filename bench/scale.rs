//! Control-plane scale: N volumes (default 1000, 3 replicas each, detached)
//! created against one manager; the time until every replica is scheduled
//! and the manager's peak resident memory. The baseline, in the same
//! invocation on the same API server, is creating the same N Volume objects
//! with no manager running: the API server's own cost. Prints both and the
//! ratios. Targets (bench/README.md): all scheduled in under 60 s, peak RSS
//! under 100 MiB.
//!
//!     cargo bench --bench scale [-- N]

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use std::collections::HashSet;

use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use oxhorn::types::{Replica, Setting, SettingSpec, Volume};
use oxhorn_testbed::{self as testbed, ControlPlane, ManagerOptions, ManagerProcess};
use serde_json::json;

/// Volume creations in flight at once, as a CSI provisioner with several
/// workers would send them.
const IN_FLIGHT: usize = 16;
const REPLICAS: usize = 3;

#[tokio::main]
async fn main() {
    let count: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let oxhorn = Path::new(env!("CARGO_BIN_EXE_oxhorn"));
    let control_plane = ControlPlane::start().await.expect("control plane");
    let client = control_plane.client().expect("client");

    let baseline = create_namespace(&client, "baseline").await;
    let started = Instant::now();
    create_volumes(&client, &baseline, count).await;
    let api_only = started.elapsed();

    let ns = create_namespace(&client, "scale").await;
    for (key, value) in [
        // One node holds every replica of every volume.
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
        Api::<Setting>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &setting)
            .await
            .expect("setting");
    }
    testbed::register_kube_node(&client, "scale-node", &[])
        .await
        .expect("kube node");
    let options = ManagerOptions::new(control_plane.kubeconfig(), "scale-node", &ns);
    let mut manager = ManagerProcess::start(oxhorn, options).expect("manager");
    manager
        .connect(Duration::from_secs(60))
        .await
        .expect("manager serving");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = memory(manager.pid());

    let started = Instant::now();
    create_volumes(&client, &ns, count).await;
    let created = started.elapsed();
    let replicas: Api<Replica> = Api::namespaced(client.clone(), &ns);
    let scheduled_in = tokio::time::timeout(
        Duration::from_secs(900),
        until_scheduled(replicas, count * REPLICAS),
    )
    .await
    .map(|()| started.elapsed())
    .expect("not every replica scheduled within 15 minutes");
    let settled = memory(manager.pid());

    println!(
        "{count} volumes x {REPLICAS} replicas, one manager, 2 cores shared with the API server and etcd"
    );
    println!(
        "  baseline: {count} Volume objects created, no manager:  {:>8.2?}",
        api_only
    );
    println!(
        "  with the manager: created in {created:>8.2?}, all scheduled in {scheduled_in:>8.2?}  (target < 60 s)"
    );
    println!(
        "  ratio scheduled / baseline: {:.2}",
        scheduled_in.as_secs_f64() / api_only.as_secs_f64()
    );
    println!(
        "  manager RSS idle {:.1} MiB, now {:.1} MiB, peak {:.1} MiB  (target peak < 100 MiB)",
        mib(idle.0),
        mib(settled.0),
        mib(settled.1)
    );
    println!(
        "  ratio peak / idle: {:.2}",
        settled.1 as f64 / idle.0 as f64
    );
    manager.power_off();
}

async fn create_namespace(client: &Client, prefix: &str) -> String {
    let name = format!("{prefix}-{}", std::process::id());
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let mut namespace = k8s_openapi::api::core::v1::Namespace::default();
    namespace.metadata.name = Some(name.clone());
    api.create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    name
}

async fn create_volumes(client: &Client, ns: &str, count: usize) {
    let api: Api<Volume> = Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let spec =
                    serde_json::from_value(json!({"size": 16 << 20, "numberOfReplicas": REPLICAS}))
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

/// Follows the replicas with a watch (cheap for the API server, unlike
/// repeated lists) until `wanted` of them have a node.
async fn until_scheduled(api: Api<Replica>, wanted: usize) {
    let mut scheduled = HashSet::new();
    let mut events = std::pin::pin!(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    while scheduled.len() < wanted {
        match events.next().await {
            Some(Ok(replica)) if !replica.spec.instance.node_id.is_empty() => {
                scheduled.insert(replica.name_any());
            }
            Some(_) => {}
            None => return,
        }
    }
}

/// (VmRSS, VmHWM) of a process, in bytes.
fn memory(pid: u32) -> (u64, u64) {
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

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
