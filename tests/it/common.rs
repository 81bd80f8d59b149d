//! What the integration tests share: the binary under test, one way to wait
//! for a condition ([`eventually`]), a cluster of `oxhorn manager` nodes in a
//! test namespace, and raw device I/O with dd.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use oxhorn::types::*;
use oxhorn_testbed::apirelay::ApiRelay;
use oxhorn_testbed::netns::{Host, Network};
use oxhorn_testbed::{
    self as testbed, ControlPlane, KubeletNode, ManagerOptions, ManagerProcess, TestNamespace,
};
use serde_json::json;

pub const OXHORN: &str = env!("CARGO_BIN_EXE_oxhorn");
pub const MIB: i64 = 1 << 20;
pub const PATIENCE: Duration = Duration::from_secs(90);
/// Every test node's manager serves /metrics on this port of its address,
/// as the manifest's do.
pub const METRICS_PORT: u16 = 9811;
pub const API_PORT: u16 = 9500;
/// Short enough that a test sees a lost manager's lease expire quickly.
pub const LEASE_SECONDS: u64 = 5;

/// The first and the longest pause between two checks of [`eventually`].
const FIRST_POLL: Duration = Duration::from_millis(10);
const MAX_POLL: Duration = Duration::from_millis(100);

/// [`eventually`]'s condition did not hold before the deadline.
#[derive(Debug)]
pub struct TimedOut(Duration);

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "timed out after {:?}", self.0)
    }
}

/// Checks `condition` until it yields a value, or fails once `deadline` (from
/// now) has passed. Checks quickly at first, then at most every 100 ms, so
/// that a fast condition is seen at once and a slow one does not flood the
/// API server.
pub async fn eventually<T, F, Fut>(deadline: Duration, mut condition: F) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    let mut pause = FIRST_POLL;
    loop {
        if let Some(value) = condition().await {
            return Ok(value);
        }
        if Instant::now() >= end {
            return Err(TimedOut(deadline));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// Logs of the code under test, in the test's output (`RUST_LOG` filters;
/// oxhorn's info by default). Once per process; later calls do nothing.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "oxhorn=info".into()),
        )
        .try_init();
}

/// Fails the test unless it runs as root. Mounts, loop devices and FUSE need
/// it, and a test that skipped itself would pass without testing anything.
pub fn require_root() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "this test needs root (mounts, loop devices, FUSE); run the tests as root"
    );
}

/// A few nodes, each a manager process, in one test namespace.
pub struct Cluster {
    // Dropped first: the nodes power off before their hosts go and the
    // namespace is purged.
    pub nodes: Vec<ManagerProcess>,
    /// The nodes' network namespaces, when they run in some.
    pub hosts: Option<Hosts>,
    pub client: Client,
    pub ns: TestNamespace,
}

/// Network namespaces for a cluster's nodes, one each: a data network
/// between them (and the test process), and a network on which they reach
/// the API server alone, through a relay, so that a node can be cut off
/// the API server while its data traffic flows.
pub struct Hosts {
    hosts: Vec<Host>,
    api: Network,
    _relay: ApiRelay,
    /// The kubeconfig that reaches the API server through the relay.
    kubeconfig: tempfile::NamedTempFile,
}

impl Hosts {
    async fn create(count: usize) -> Self {
        let data = Network::create().unwrap();
        let api = Network::create().unwrap();
        let control_plane = testbed::shared();
        let relay = ApiRelay::start(api.gateway().into(), control_plane.api_address()).unwrap();
        let kubeconfig = tempfile::NamedTempFile::new().unwrap();
        control_plane
            .write_kubeconfig_via(kubeconfig.path(), relay.address())
            .unwrap();
        let mut hosts = Vec::new();
        for _ in 0..count {
            let mut host = data.add_host().unwrap();
            api.connect(&mut host).unwrap();
            hosts.push(host);
        }
        Self {
            hosts,
            api,
            _relay: relay,
            kubeconfig,
        }
    }

    /// The nodes' addresses on the data network, in order.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.hosts.iter().map(|h| h.address().into()).collect()
    }

    /// Cuts node `index` (from 0) off the API server: every frame between
    /// it and the relay vanishes; its data network is untouched.
    pub fn cut_from_api(&self, index: usize) {
        self.hosts[index].partition_from(&self.api).unwrap();
    }

    /// Lets node `index` reach the API server again.
    pub fn reconnect_to_api(&self, index: usize) {
        self.hosts[index].heal_to(&self.api).unwrap();
    }
}

/// How a test cluster's nodes run.
struct Setup<'a> {
    lease_seconds: u64,
    /// Each node in a network namespace of its own.
    hosts: Option<Hosts>,
    /// The first node is this real kubelet's.
    kubelet: Option<&'a KubeletNode>,
    /// Engines and replicas under an `oxhorn instance-manager` per node.
    instance_managers: bool,
    /// The namespace to run in, instead of a new one.
    namespace: Option<TestNamespace>,
    /// The first nodes' managers, this many, are the installed manifest's,
    /// on kubelet nodes: none is started for them here.
    installed: usize,
    /// The nodes' addresses are 127.0.subnet.i; a new subnet when unset.
    subnet: Option<u8>,
    /// Recurring jobs' clock runs this many times faster.
    job_clock_scale: Option<u32>,
    /// The control plane, instead of the shared one.
    control_plane: Option<&'a ControlPlane>,
}

/// The steps of a long test, each reported on stderr with the time since
/// the test began.
pub struct Steps {
    started: Instant,
}

impl Steps {
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
        }
    }

    pub fn report(&self, what: &str) {
        eprintln!("[{:>6.1?}] {what}", self.started.elapsed());
    }

    /// Waits until `check` returns Some, reporting how long that took;
    /// after `patience`, fails the test with `logs()`.
    pub async fn until<T, F, Fut>(
        &self,
        what: &str,
        patience: Duration,
        check: F,
        logs: impl FnOnce() -> String,
    ) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let step = Instant::now();
        match eventually(patience, check).await {
            Ok(value) => {
                self.report(&format!("{what} after {:.1?}", step.elapsed()));
                value
            }
            Err(e) => panic!("{e} waiting for {what}\n{}", logs()),
        }
    }
}

/// The names of every `K` `api` lists.
async fn names<K>(api: Api<K>) -> Vec<String>
where
    K: kube::Resource + Clone + fmt::Debug + serde::de::DeserializeOwned,
{
    let list = api.list(&Default::default()).await.unwrap();
    list.iter().map(|o| o.name_any()).collect()
}

/// The sum of the samples of `name` in `scraped` (Prometheus text) whose
/// labels include each of `labels` (`key="value"`); None without any.
pub fn sample_sum(scraped: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let values: Vec<f64> = scraped
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// A subnet no other cluster of this test binary uses: nodes take
/// 127.0.<subnet>.<i>; the local-cluster example 127.1.0.x. Two test
/// processes run side by side (a developer's while CI runs) keep apart by
/// starting one at `OXHORN_IT_SUBNET` (1 unless set).
pub fn next_subnet() -> u8 {
    static SUBNET: LazyLock<AtomicU8> = LazyLock::new(|| {
        let first = std::env::var("OXHORN_IT_SUBNET").ok();
        AtomicU8::new(first.and_then(|s| s.parse().ok()).unwrap_or(1))
    });
    SUBNET.fetch_add(1, Ordering::Relaxed)
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Self {
            lease_seconds: LEASE_SECONDS,
            hosts: None,
            kubelet: None,
            instance_managers: false,
            namespace: None,
            installed: 0,
            subnet: None,
            job_clock_scale: None,
            control_plane: None,
        }
    }
}

impl Cluster {
    /// `count` nodes named after the namespace, whose leases expire after
    /// [`LEASE_SECONDS`].
    pub async fn start(prefix: &str, count: usize) -> Self {
        Self::start_with_lease(prefix, count, LEASE_SECONDS).await
    }

    /// `count` nodes whose leases expire after `lease_seconds`.
    pub async fn start_with_lease(prefix: &str, count: usize, lease_seconds: u64) -> Self {
        let cluster = Self::launch(prefix, count, lease_seconds).await;
        cluster.until_nodes_schedulable().await;
        cluster
    }

    /// `count` nodes whose managers have been started, without waiting for
    /// them to be ready.
    pub async fn launch(prefix: &str, count: usize, lease_seconds: u64) -> Self {
        let setup = Setup {
            lease_seconds,
            ..Setup::default()
        };
        Self::launch_on(prefix, count, setup).await
    }

    /// `count` nodes whose recurring jobs' clock runs `scale` times faster
    /// than real time; every node Ready and Schedulable.
    pub async fn start_with_job_clock(prefix: &str, count: usize, scale: u32) -> Self {
        let setup = Setup {
            job_clock_scale: Some(scale),
            ..Setup::default()
        };
        let cluster = Self::launch_on(prefix, count, setup).await;
        cluster.until_nodes_schedulable().await;
        cluster
    }

    /// `count` nodes whose engines and replicas run under an
    /// `oxhorn instance-manager` of their own, as installed; every node
    /// Ready and Schedulable.
    pub async fn start_with_instance_managers(prefix: &str, count: usize) -> Self {
        let setup = Setup {
            instance_managers: true,
            ..Setup::default()
        };
        let cluster = Self::launch_on(prefix, count, setup).await;
        cluster.until_nodes_schedulable().await;
        cluster
    }

    /// `count` nodes, the first of them `kubelet`'s, whose manager registers
    /// the CSI driver with that real kubelet; every node Ready and
    /// Schedulable.
    pub async fn start_with_kubelet(prefix: &str, count: usize, kubelet: &KubeletNode) -> Self {
        let setup = Setup {
            kubelet: Some(kubelet),
            ..Setup::default()
        };
        let cluster = Self::launch_on(prefix, count, setup).await;
        cluster.until_nodes_schedulable().await;
        cluster
    }

    /// `count` nodes with addresses in `subnet` (see [`next_subnet`]) in
    /// the namespace of an installed Oxhorn, the first `installed` of them
    /// kubelet nodes whose managers the manifest's DaemonSets run (not
    /// started here; their data addresses are 127.0.subnet.i); the others
    /// manager-only host processes; all Ready and Schedulable.
    pub async fn join_installed(
        ns: TestNamespace,
        count: usize,
        installed: usize,
        subnet: u8,
    ) -> Self {
        let setup = Setup {
            instance_managers: true,
            namespace: Some(ns),
            installed,
            subnet: Some(subnet),
            ..Setup::default()
        };
        let cluster = Self::launch_on("", count, setup).await;
        cluster.until_nodes_schedulable().await;
        cluster
    }

    /// `count` nodes of a control plane of their own, in its namespace
    /// `ns`; every node Ready and Schedulable.
    pub async fn start_on(control_plane: &ControlPlane, ns: TestNamespace, count: usize) -> Self {
        let setup = Setup {
            namespace: Some(ns),
            control_plane: Some(control_plane),
            ..Setup::default()
        };
        let cluster = Self::launch_on("", count, setup).await;
        cluster.until_nodes_schedulable().await;
        cluster
    }

    /// `count` nodes, each in a network namespace of its own (see
    /// [`Hosts`]), every node Ready and Schedulable.
    pub async fn start_in_namespaces(prefix: &str, count: usize) -> Self {
        require_root();
        let hosts = Hosts::create(count).await;
        let setup = Setup {
            hosts: Some(hosts),
            ..Setup::default()
        };
        let cluster = Self::launch_on(prefix, count, setup).await;
        cluster.until_nodes_schedulable().await;
        cluster
    }

    async fn launch_on(prefix: &str, count: usize, setup: Setup<'_>) -> Self {
        let Setup {
            lease_seconds,
            hosts,
            kubelet,
            instance_managers,
            namespace,
            installed,
            subnet,
            job_clock_scale,
            control_plane,
        } = setup;
        let control_plane = match control_plane {
            Some(control_plane) => control_plane,
            None => testbed::shared(),
        };
        let ns = match namespace {
            Some(ns) => ns,
            None => TestNamespace::create(control_plane, prefix).await.unwrap(),
        };
        let client = control_plane.client().unwrap();
        let subnet = subnet.unwrap_or_else(next_subnet);
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
            if i <= installed {
                continue;
            }
            let on_kubelet = kubelet.filter(|_| i == 1);
            let name = match on_kubelet {
                Some(kubelet) => kubelet.name().to_string(),
                None => {
                    let name = format!("{}-n{i}", ns.name());
                    testbed::register_kube_node(&client, &name, &[])
                        .await
                        .unwrap();
                    name
                }
            };
            let mut options = ManagerOptions::new(control_plane.kubeconfig(), &name, ns.name());
            options.kubelet_registration_dir = on_kubelet.map(KubeletNode::registration_dir);
            options.instance_manager = instance_managers;
            options.ip = IpAddr::from([127, 0, subnet, u8::try_from(i).unwrap()]);
            options.lease_seconds = lease_seconds;
            options.metrics_port = Some(METRICS_PORT);
            options.api_port = Some(API_PORT);
            options.job_clock_scale = job_clock_scale;
            if let Some(hosts) = &hosts {
                let host = &hosts.hosts[i - 1];
                options.ip = host.address().into();
                options.netns = Some(host.namespace_path());
                options.kubeconfig = hosts.kubeconfig.path().to_owned();
            }
            nodes.push(ManagerProcess::start(Path::new(OXHORN), options).unwrap());
        }
        Self {
            nodes,
            hosts,
            client,
            ns,
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.ns.name())
    }

    pub fn node(&self, name: &str) -> &ManagerProcess {
        self.nodes.iter().find(|n| n.node_id() == name).unwrap()
    }

    pub fn node_mut(&mut self, name: &str) -> &mut ManagerProcess {
        self.nodes.iter_mut().find(|n| n.node_id() == name).unwrap()
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let instance_manager = n.instance_manager_log();
                let instance_manager = if instance_manager.is_empty() {
                    String::new()
                } else {
                    format!(
                        "==== {} instance manager ====\n{instance_manager}",
                        n.node_id()
                    )
                };
                format!("==== {} ====\n{}{instance_manager}", n.node_id(), n.log())
            })
            .collect()
    }

    /// Sets Setting `key` to `value`, creating it or changing it.
    pub async fn set(&self, key: &str, value: &str) {
        let setting = Setting::new(
            key,
            SettingSpec {
                value: value.into(),
            },
        );
        let params = PatchParams::apply("oxhorn-tests").force();
        self.api::<Setting>()
            .patch(key, &params, &Patch::Apply(&setting))
            .await
            .unwrap();
    }

    /// Every PersistentVolume and VolumeAttachment, and every oxhorn
    /// Volume, Engine and Replica of the cluster's namespace, left.
    pub async fn volume_leftovers(&self) -> Vec<String> {
        let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(self.client.clone());
        let attachments: Api<k8s_openapi::api::storage::v1::VolumeAttachment> =
            Api::all(self.client.clone());
        [
            ("PV", names(pvs).await),
            ("VolumeAttachment", names(attachments).await),
            ("Volume", names(self.api::<Volume>()).await),
            ("Engine", names(self.api::<Engine>()).await),
            ("Replica", names(self.api::<Replica>()).await),
        ]
        .into_iter()
        .flat_map(|(kind, names)| names.into_iter().map(move |n| format!("{kind}/{n}")))
        .collect()
    }

    /// Fails, saying why each node is not, if they are not all Ready and
    /// Schedulable within PATIENCE (a full test disk shows here).
    pub async fn until_nodes_schedulable(&self) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.node_id().to_owned()).collect();
        let usable = |n: &Node| {
            n.status.as_ref().is_some_and(|s| {
                Condition::is_true(&s.conditions, "Ready")
                    && Condition::is_true(&s.conditions, "Schedulable")
            })
        };
        let ready = eventually(PATIENCE, || async {
            let nodes = self.api::<Node>().list(&Default::default()).await.ok()?;
            let all = names.iter().all(|name| {
                nodes
                    .items
                    .iter()
                    .any(|n| n.name_any() == *name && usable(n))
            });
            all.then_some(())
        })
        .await;
        if let Err(timed_out) = ready {
            let nodes = self.api::<Node>().list(&Default::default()).await;
            let conditions: Vec<String> = nodes
                .map(|list| list.items)
                .unwrap_or_default()
                .iter()
                .map(|n| {
                    let conditions = n.status.as_ref().map(|s| &s.conditions);
                    format!("{}: {conditions:?}", n.name_any())
                })
                .collect();
            panic!(
                "{timed_out} waiting for every node Ready and Schedulable\n{}\n{}",
                conditions.join("\n"),
                self.logs()
            );
        }
    }

    /// Waits until `check` returns Some, failing the test with the managers'
    /// logs after PATIENCE.
    pub async fn until<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        eventually(PATIENCE, check)
            .await
            .unwrap_or_else(|e| panic!("{e} waiting for {what}\n{}", self.logs()))
    }

    /// Creates `object` in the cluster's namespace.
    pub async fn create<K>(&self, object: &K)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + fmt::Debug,
    {
        self.api::<K>()
            .create(&PostParams::default(), object)
            .await
            .unwrap();
    }

    pub async fn create_volume(&self, name: &str, size: i64, replicas: i32) {
        self.create_volume_with(name, json!({"size": size, "numberOfReplicas": replicas}))
            .await;
    }

    /// Creates the Volume `name` with `spec` (its JSON form).
    pub async fn create_volume_with(&self, name: &str, spec: serde_json::Value) {
        let volume = Volume::new(name, serde_json::from_value(spec).unwrap());
        self.api::<Volume>()
            .create(&PostParams::default(), &volume)
            .await
            .unwrap();
    }

    pub async fn volume(&self, name: &str) -> Option<Volume> {
        self.api::<Volume>().get_opt(name).await.unwrap()
    }

    pub async fn replicas_of(&self, volume: &str) -> Vec<Replica> {
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

    /// How to reach `volume`'s replicas as its current engine does: the
    /// volume's key (from the managers' Secret) and the engine generation
    /// (or a standby's restores'). Never a higher generation: that would
    /// fence the running engine out.
    pub async fn access(&self, volume: &str) -> oxhorn::protocol::Access {
        let key = oxhorn::controller::cluster_key(&self.client, self.ns.name())
            .await
            .unwrap();
        let engine = self
            .engine_of(volume)
            .await
            .map_or(0, |e| e.spec.generation);
        // A standby's restores write as generations of their own.
        let restored = self
            .volume(volume)
            .await
            .and_then(|v| v.status?.standby)
            .map_or(0, |s| s.generation);
        let generation = engine.max(restored);
        oxhorn::protocol::Access {
            volume: volume.to_string(),
            key: key.for_volume(volume),
            generation,
        }
    }

    pub async fn engine_of(&self, volume: &str) -> Option<Engine> {
        let all = self
            .api::<Engine>()
            .list(&Default::default())
            .await
            .unwrap();
        all.items
            .into_iter()
            .find(|e| e.spec.instance.volume_name == volume)
    }

    pub async fn patch_volume(&self, name: &str, patch: serde_json::Value) {
        self.api::<Volume>()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn until_volume(
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
    pub async fn attach(&self, volume: &str, node: &str) -> String {
        require_root();
        self.patch_volume(volume, json!({"spec": {"nodeID": node}}))
            .await;
        self.until_volume(volume, "the volume attached", |s| {
            s.state == VolumeState::Attached
        })
        .await;
        let engine = self.engine_of(volume).await.unwrap();
        engine.status.unwrap().endpoint
    }

    pub async fn detach(&self, volume: &str) {
        self.patch_volume(volume, json!({"spec": {"nodeID": ""}}))
            .await;
        self.until_volume(volume, "the volume detached", |s| {
            s.state == VolumeState::Detached
        })
        .await;
    }

    /// The reasons of every Event in the test's namespace.
    /// Every manager's /metrics, one after the other.
    pub fn scrape(&self) -> String {
        let addresses = self.nodes.iter().filter_map(|n| n.metrics_address());
        addresses
            .map(|address| testbed::prometheus::scrape(address).unwrap())
            .collect()
    }

    pub async fn event_reasons(&self) -> std::collections::BTreeSet<String> {
        let events = self
            .api::<k8s_openapi::api::events::v1::Event>()
            .list(&Default::default())
            .await
            .unwrap();
        events.items.into_iter().filter_map(|e| e.reason).collect()
    }

    /// Deletes the volume and waits until its objects are gone.
    pub async fn delete_volume(&self, volume: &str) {
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

pub fn dd(args: &[&str]) {
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
pub fn write_pattern(device: &str, len: usize, seed: u64) -> Vec<u8> {
    write_pattern_at(device, 0, len, seed)
}

/// Writes `len` bytes of a seeded pattern `offset_mib` MiB into `device`,
/// bypassing the page cache, and returns them.
pub fn write_pattern_at(device: &str, offset_mib: usize, len: usize, seed: u64) -> Vec<u8> {
    let data = pattern(len, seed);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &data).unwrap();
    let input = format!("if={}", file.path().display());
    dd(&[
        &input,
        &format!("of={device}"),
        "bs=1M",
        &format!("seek={offset_mib}"),
        "oflag=direct",
        "conv=fsync,notrunc",
    ]);
    data
}

/// `len` bytes of a pattern made from `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

/// Reads `len` bytes from the start of `device`, bypassing the page cache.
pub fn read_device(device: &str, len: usize) -> Vec<u8> {
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

/// Runs `program` with `args`, failing the test with its output if it fails.
pub fn run(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

pub fn replica_dir(node: &ManagerProcess, replica: &Replica) -> PathBuf {
    node.data_dir()
        .join("replicas")
        .join(&replica.spec.data_directory_name)
}

/// A pod of the test bed's busybox image that runs `script` once, on the
/// host's network; callers add where it runs and what it mounts.
pub fn one_shot_pod(name: &str, script: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": testbed::images::BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
            }]
        }
    })
}

/// Creates `pod`, waits until it has run to its end, deletes it and waits
/// until it is gone; its final phase (Succeeded or Failed), or which wait
/// ran out of `patience`.
pub async fn run_to_completion(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    pod: serde_json::Value,
    patience: Duration,
) -> Result<String, String> {
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(pod).map_err(|e| e.to_string())?;
    let name = pod.name_any();
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("creating pod {name}: {e}"))?;
    let phase = eventually(patience, || async {
        let phase = pods.get(&name).await.ok()?.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await
    .map_err(|e| format!("{e} waiting for pod {name} to finish"))?;
    pods.delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| format!("deleting pod {name}: {e}"))?;
    eventually(patience, || async {
        pods.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| format!("{e} waiting for pod {name} to be removed"))?;
    Ok(phase)
}
