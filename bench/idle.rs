//! The control plane's cost at rest: three nodes (a manager and an
//! `oxhorn instance-manager` each, as installed), then 1, 10 and 100
//! volumes of 3 replicas, attached (FUSE and loop device) and left alone.
//! After each step the cluster rests (default 60 s), then the CPU time and
//! resident memory of every manager, instance manager, engine and replica
//! process are sampled over a window (default 60 s) from /proc. The
//! baseline, in the same invocation, is the same cluster with no volume:
//! the per-volume figures are the increase over it. Targets (issue 33,
//! bench/README.md): a manager <= 5 mcores + 0.5 per volume it owns, an
//! instance manager <= 2 mcores + 0.2 per instance.
//!
//!     cargo bench --bench idle [-- COUNTS] [--rest SECONDS] [--window SECONDS] [--oxhorn PATH]
//!
//! COUNTS is a comma-separated list of volume counts, ascending (default
//! 1,10,100). `--oxhorn` runs another build of oxhorn (an older commit's,
//! to compare) instead of this one's. Needs root (FUSE, loop devices).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use oxhorn::metrics::process::{resident, stat};
use oxhorn::types::{Robustness, Setting, SettingSpec, Volume, VolumeState};
use oxhorn_testbed::{self as testbed, ManagerOptions, ManagerProcess, TestNamespace};
use serde_json::json;

const NODES: u8 = 3;
const REPLICAS: usize = 3;
/// Attachments in flight at once.
const IN_FLIGHT: usize = 8;
const READY: Duration = Duration::from_secs(900);

struct Args {
    counts: Vec<usize>,
    oxhorn: PathBuf,
    rest: Duration,
    window: Duration,
}

fn seconds(value: &str) -> Duration {
    Duration::from_secs(value.parse().expect("--rest and --window take seconds"))
}

fn args() -> Args {
    let mut args = Args {
        counts: vec![1, 10, 100],
        oxhorn: PathBuf::from(env!("CARGO_BIN_EXE_oxhorn")),
        rest: Duration::from_secs(60),
        window: Duration::from_secs(60),
    };
    let mut given = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(arg) = given.next() {
        let mut value = || {
            given
                .next()
                .unwrap_or_else(|| panic!("{arg} takes a value"))
        };
        match arg.as_str() {
            "--rest" => args.rest = seconds(&value()),
            "--window" => args.window = seconds(&value()),
            "--oxhorn" => args.oxhorn = value().into(),
            list => {
                args.counts = list
                    .split(',')
                    .map(|n| n.parse().expect("COUNTS: numbers separated by commas"))
                    .collect();
            }
        }
    }
    args
}

#[tokio::main]
async fn main() {
    let args = args();
    let oxhorn = args.oxhorn.as_path();
    let control_plane = testbed::shared();
    let client = control_plane.client().expect("client");
    let ns = TestNamespace::create(control_plane, "idle")
        .await
        .expect("namespace");
    let settings: Api<Setting> = Api::namespaced(client.clone(), ns.name());
    // The machine's disk is shared and may be fuller than the default 25%
    // free that replicas need.
    settings
        .create(
            &PostParams::default(),
            &Setting::new(
                "storage-minimal-available-percentage",
                SettingSpec { value: "1".into() },
            ),
        )
        .await
        .expect("setting");
    let mut nodes = Vec::new();
    for i in 1..=NODES {
        let name = format!("{}-n{i}", ns.name());
        testbed::register_kube_node(&client, &name, &[])
            .await
            .expect("kube node");
        let mut options = ManagerOptions::new(control_plane.kubeconfig(), &name, ns.name());
        options.instance_manager = true;
        options.ip = IpAddr::from([127, 0, 97, i]);
        nodes.push(ManagerProcess::start(oxhorn, options).expect("manager"));
    }
    for node in &mut nodes {
        node.connect(Duration::from_secs(60))
            .await
            .expect("manager serving");
    }
    let volumes: Api<Volume> = Api::namespaced(client.clone(), ns.name());

    println!(
        "At rest: {NODES} nodes (manager + instance manager each), volumes of {REPLICAS} replicas attached through FUSE, spread over the nodes; {} s of rest, then {} s sampled. mcores = CPU milliseconds per second.",
        args.rest.as_secs(),
        args.window.as_secs()
    );
    let mut baseline = None;
    let mut made = 0;
    for count in std::iter::once(0).chain(args.counts.iter().copied()) {
        let started = Instant::now();
        add_volumes(&volumes, &nodes, made, count).await;
        made = made.max(count);
        tokio::time::timeout(READY, until_healthy(&volumes, count))
            .await
            .expect("every volume attached and healthy");
        let ready_in = started.elapsed();
        tokio::time::sleep(args.rest).await;
        let sample = Sample::take(&nodes, args.window).await;
        sample.print(count, ready_in, baseline.as_ref());
        baseline.get_or_insert(sample);
    }
    for node in &mut nodes {
        node.power_off();
    }
    drop(ns);
}

/// Creates volumes `from..to` and attaches each to a node in turn.
async fn add_volumes(api: &Api<Volume>, nodes: &[ManagerProcess], from: usize, to: usize) {
    futures::stream::iter(from..to)
        .map(|i| {
            let api = api.clone();
            let node = nodes[i % nodes.len()].node_id().to_owned();
            async move {
                let name = format!("v{i:04}");
                let spec =
                    serde_json::from_value(json!({"size": 16 << 20, "numberOfReplicas": REPLICAS}))
                        .expect("spec");
                api.create(&PostParams::default(), &Volume::new(&name, spec))
                    .await
                    .expect("volume");
                let attach = json!({"spec": {"nodeID": node}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&attach))
                    .await
                    .expect("attach");
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<()>()
        .await;
}

/// Waits until `count` volumes are attached and healthy.
async fn until_healthy(api: &Api<Volume>, count: usize) {
    loop {
        let list = api.list(&Default::default()).await.expect("volumes");
        let healthy = list
            .items
            .iter()
            .filter(|v| {
                v.status.as_ref().is_some_and(|s| {
                    s.state == VolumeState::Attached && s.robustness == Robustness::Healthy
                })
            })
            .count();
        if healthy >= count {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Which kind of process, by its command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Manager,
    InstanceManager,
    Engine,
    Replica,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Manager => "manager",
            Kind::InstanceManager => "instance manager",
            Kind::Engine => "engine",
            Kind::Replica => "replica",
        }
    }
}

/// CPU and memory of every process of a kind over one window.
#[derive(Default)]
struct Figures {
    processes: usize,
    cpu: Duration,
    rss: u64,
}

struct Sample {
    window: Duration,
    kinds: BTreeMap<Kind, Figures>,
}

impl Sample {
    async fn take(nodes: &[ManagerProcess], window: Duration) -> Self {
        let before = cpu_times(&processes(nodes));
        let started = Instant::now();
        tokio::time::sleep(window).await;
        let window = started.elapsed();
        let now = processes(nodes);
        let after = cpu_times(&now);
        let mut kinds: BTreeMap<Kind, Figures> = BTreeMap::new();
        for (pid, kind) in now {
            // Only processes alive through the whole window.
            let (Some(start), Some(end)) = (before.get(&pid), after.get(&pid)) else {
                continue;
            };
            let figures = kinds.entry(kind).or_default();
            figures.processes += 1;
            figures.cpu += end.saturating_sub(*start);
            figures.rss += resident(pid).unwrap_or(0);
        }
        Self { window, kinds }
    }

    fn mcores(&self, kind: Kind) -> f64 {
        self.kinds.get(&kind).map_or(0.0, |f| {
            f.cpu.as_secs_f64() * 1000.0 / self.window.as_secs_f64()
        })
    }

    fn print(&self, volumes: usize, ready_in: Duration, baseline: Option<&Sample>) {
        println!();
        println!(
            "{volumes} volumes (ready in {:.0} s):",
            ready_in.as_secs_f64()
        );
        println!(
            "  {:<17} {:>9} {:>13} {:>16} {:>15} {:>13}",
            "process", "processes", "mcores total", "mcores/process", "RSS MiB/proc", "vs baseline"
        );
        for (kind, figures) in &self.kinds {
            let total = self.mcores(*kind);
            let per = total / figures.processes.max(1) as f64;
            let vs = baseline
                .map(|b| b.mcores(*kind))
                .filter(|b| *b > 0.0)
                .map_or("-".to_string(), |b| format!("{:.2}", total / b));
            println!(
                "  {:<17} {:>9} {:>13.1} {:>16.2} {:>15.1} {:>13}",
                kind.name(),
                figures.processes,
                total,
                per,
                figures.rss as f64 / f64::from(1 << 20) / figures.processes.max(1) as f64,
                vs
            );
        }
        let nodes = f64::from(NODES);
        let per_node_volumes = volumes as f64 / nodes;
        let manager = self.mcores(Kind::Manager) / nodes;
        let manager_target = 5.0 + 0.5 * per_node_volumes;
        let instances = (volumes * REPLICAS) as f64 / nodes + per_node_volumes;
        let instance_manager = self.mcores(Kind::InstanceManager) / nodes;
        let instance_manager_target = 2.0 + 0.2 * instances;
        println!(
            "  per manager {manager:.2} mcores, target {manager_target:.2} (ratio {:.2}); per instance manager {instance_manager:.2}, target {instance_manager_target:.2} (ratio {:.2})",
            manager / manager_target,
            instance_manager / instance_manager_target
        );
        if volumes > 0 {
            let per_volume = |kinds: &[Kind]| {
                kinds
                    .iter()
                    .map(|k| self.mcores(*k) - baseline.map_or(0.0, |b| b.mcores(*k)))
                    .sum::<f64>()
                    / volumes as f64
            };
            println!(
                "  per volume over the baseline: managers {:.3} mcores, instance managers {:.3}, engine and replicas {:.3}",
                per_volume(&[Kind::Manager]),
                per_volume(&[Kind::InstanceManager]),
                per_volume(&[Kind::Engine, Kind::Replica]),
            );
        }
    }
}

/// Every process of the nodes: each manager, each instance manager, and
/// the engines and replicas it runs (its children).
fn processes(nodes: &[ManagerProcess]) -> Vec<(u32, Kind)> {
    let mut found = Vec::new();
    let mut parents = Vec::new();
    for node in nodes {
        found.push((node.pid(), Kind::Manager));
        if let Some(pid) = node.instance_manager_pid() {
            found.push((pid, Kind::InstanceManager));
            parents.push(pid);
        }
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Some(stat) = stat(pid) else { continue };
        if !parents.contains(&stat.parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let subcommand = cmdline.split(|b| *b == 0).nth(1).unwrap_or_default();
        match subcommand {
            b"engine" => found.push((pid, Kind::Engine)),
            b"replica" => found.push((pid, Kind::Replica)),
            _ => {}
        }
    }
    found
}

fn cpu_times(processes: &[(u32, Kind)]) -> BTreeMap<u32, Duration> {
    processes
        .iter()
        .filter_map(|(pid, _)| Some((*pid, stat(*pid)?.cpu)))
        .collect()
}
