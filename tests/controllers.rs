//! The embedded controllers on a real API server, with several `oxhorn
//! manager` processes playing nodes (each its own node id, address, data dir
//! and Kubernetes Node). What a user would notice: where replicas land, that
//! a volume attaches and holds data, that losing a node degrades the volume
//! and it heals itself onto another node with the data intact, that exactly
//! one manager acts on each object, that impossible requests say why, and
//! that deleting a volume leaves nothing behind.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use oxhorn::testbed::{self, ManagerOptions, ManagerProcess, TestNamespace};
use oxhorn::types::*;
use serde_json::json;

const OXHORN: &str = env!("CARGO_BIN_EXE_oxhorn");
const MIB: i64 = 1 << 20;
const PATIENCE: Duration = Duration::from_secs(90);
/// Short enough that a test sees a lost manager's lease expire quickly.
const LEASE_SECONDS: u64 = 5;

/// A few nodes, each a manager process, in one test namespace.
struct Cluster {
    // Dropped first: the nodes power off before the namespace is purged.
    nodes: Vec<ManagerProcess>,
    client: Client,
    ns: TestNamespace,
}

impl Cluster {
    async fn start(prefix: &str, count: usize) -> Self {
        static SUBNET: AtomicU8 = AtomicU8::new(1);
        let control_plane = testbed::shared();
        let ns = TestNamespace::create(control_plane, prefix).await.unwrap();
        let client = control_plane.client().unwrap();
        let subnet = SUBNET.fetch_add(1, Ordering::Relaxed);
        // The test machine's disk is shared and may be fuller than the
        // default 25% free that replicas need.
        let settings: Api<Setting> = Api::namespaced(client.clone(), ns.name());
        let minimal = Setting::new(
            "storage-minimal-available-percentage",
            SettingSpec { value: "1".into() },
        );
        settings
            .create(&PostParams::default(), &minimal)
            .await
            .unwrap();
        let mut nodes = Vec::new();
        for i in 1..=count {
            let name = format!("{}-n{i}", ns.name());
            testbed::register_kube_node(&client, &name, &[])
                .await
                .unwrap();
            let mut options = ManagerOptions::new(control_plane.kubeconfig(), &name, ns.name());
            options.ip = IpAddr::from([127, 0, subnet, u8::try_from(i).unwrap()]);
            options.lease_seconds = LEASE_SECONDS;
            nodes.push(ManagerProcess::start(Path::new(OXHORN), options).unwrap());
        }
        let cluster = Self { nodes, client, ns };
        cluster.until_nodes_schedulable().await;
        cluster
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.ns.name())
    }

    fn node(&self, name: &str) -> &ManagerProcess {
        self.nodes.iter().find(|n| n.node_id() == name).unwrap()
    }

    fn node_mut(&mut self, name: &str) -> &mut ManagerProcess {
        self.nodes.iter_mut().find(|n| n.node_id() == name).unwrap()
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("==== {} ====\n{}", n.node_id(), n.log()))
            .collect()
    }

    async fn set(&self, key: &str, value: &str) {
        let setting = Setting::new(
            key,
            SettingSpec {
                value: value.into(),
            },
        );
        self.api::<Setting>()
            .create(&PostParams::default(), &setting)
            .await
            .unwrap();
    }

    async fn until_nodes_schedulable(&self) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.node_id().to_owned()).collect();
        self.until("every node Ready and Schedulable", || async {
            let nodes = self.api::<Node>().list(&Default::default()).await.ok()?;
            let ready = names.iter().all(|name| {
                nodes.items.iter().any(|n| {
                    n.name_any() == *name
                        && n.status.as_ref().is_some_and(|s| {
                            Condition::is_true(&s.conditions, "Ready")
                                && Condition::is_true(&s.conditions, "Schedulable")
                        })
                })
            });
            ready.then_some(())
        })
        .await;
    }

    /// Polls `check` until it returns Some, failing the test with the
    /// managers' logs after PATIENCE.
    async fn until<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn create_volume(&self, name: &str, size: i64, replicas: i32) {
        let volume = Volume::new(
            name,
            serde_json::from_value(json!({"size": size, "numberOfReplicas": replicas})).unwrap(),
        );
        self.api::<Volume>()
            .create(&PostParams::default(), &volume)
            .await
            .unwrap();
    }

    async fn volume(&self, name: &str) -> Option<Volume> {
        self.api::<Volume>().get_opt(name).await.unwrap()
    }

    async fn replicas_of(&self, volume: &str) -> Vec<Replica> {
        let all = self
            .api::<Replica>()
            .list(&Default::default())
            .await
            .unwrap();
        all.items
            .into_iter()
            .filter(|r| r.spec.instance.volume_name == volume)
            .collect()
    }

    async fn engine_of(&self, volume: &str) -> Option<Engine> {
        let all = self
            .api::<Engine>()
            .list(&Default::default())
            .await
            .unwrap();
        all.items
            .into_iter()
            .find(|e| e.spec.instance.volume_name == volume)
    }

    async fn patch_volume(&self, name: &str, patch: serde_json::Value) {
        self.api::<Volume>()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    async fn until_volume(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&VolumeStatus) -> bool,
    ) -> Volume {
        self.until(what, || async {
            let volume = self.volume(name).await?;
            volume.status.as_ref().is_some_and(&check).then_some(volume)
        })
        .await
    }

    /// Attaches `volume` to `node` and returns its device path.
    async fn attach(&self, volume: &str, node: &str) -> String {
        self.patch_volume(volume, json!({"spec": {"nodeID": node}}))
            .await;
        self.until_volume(volume, "the volume attached", |s| {
            s.state == VolumeState::Attached
        })
        .await;
        let engine = self.engine_of(volume).await.unwrap();
        engine.status.unwrap().endpoint
    }

    async fn detach(&self, volume: &str) {
        self.patch_volume(volume, json!({"spec": {"nodeID": ""}}))
            .await;
        self.until_volume(volume, "the volume detached", |s| {
            s.state == VolumeState::Detached
        })
        .await;
    }

    /// Deletes the volume and waits until its objects are gone.
    async fn delete_volume(&self, volume: &str) {
        self.api::<Volume>()
            .delete(volume, &DeleteParams::default())
            .await
            .unwrap();
        self.until("the volume and its engine and replicas gone", || async {
            let gone = self.volume(volume).await.is_none()
                && self.engine_of(volume).await.is_none()
                && self.replicas_of(volume).await.is_empty();
            gone.then_some(())
        })
        .await;
    }
}

fn dd(args: &[&str]) {
    let output = Command::new("dd")
        .args(args)
        .arg("status=none")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "dd {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Writes `len` bytes of a seeded pattern at the start of `device`, bypassing
/// the page cache, and returns them.
fn write_pattern(device: &str, len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &data).unwrap();
    let input = format!("if={}", file.path().display());
    dd(&[
        &input,
        &format!("of={device}"),
        "bs=1M",
        "oflag=direct",
        "conv=fsync,notrunc",
    ]);
    data
}

/// Reads `len` bytes from the start of `device`, bypassing the page cache.
fn read_device(device: &str, len: usize) -> Vec<u8> {
    let file = tempfile::NamedTempFile::new().unwrap();
    let count = format!("count={}", len >> 20);
    dd(&[
        &format!("if={device}"),
        &format!("of={}", file.path().display()),
        "bs=1M",
        "iflag=direct",
        &count,
    ]);
    std::fs::read(file.path()).unwrap()
}

fn replica_dir(node: &ManagerProcess, replica: &Replica) -> PathBuf {
    node.data_dir()
        .join("replicas")
        .join(&replica.spec.data_directory_name)
}

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
    let events = cluster
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&Default::default())
        .await
        .unwrap();
    let reasons: BTreeSet<String> = events
        .items
        .iter()
        .filter_map(|e| e.reason.clone())
        .collect();
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
    let cluster = Cluster::start("unsched", 2).await;
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

    // Both managers still run: an impossible request is not a crash.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for node in &cluster.nodes {
        assert!(!node.log().contains("panicked"), "{}", node.log());
    }
    cluster.delete_volume("three").await;
    cluster.delete_volume("huge").await;
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
