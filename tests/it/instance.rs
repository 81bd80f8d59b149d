//! The instance manager with real `oxhorn replica` and `oxhorn engine`
//! processes: starting, restarting after SIGKILL, adoption by a new manager,
//! ports, and what a stop or a "power loss" leaves behind.
//!
//! Each test is a "node" with its own loopback address, port range and
//! directories; dropping the node kills whatever its managers left running.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oxhorn::engine::FrontendKind;
use oxhorn::instance::{
    InstanceError, InstanceInfo, InstanceKind, InstanceManager, InstanceManagerConfig,
    InstanceRequest, kill_recorded,
};
use oxhorn::protocol::control::EngineStatusRequest;
use oxhorn::protocol::control::engine_control_client::EngineControlClient;
use oxhorn::protocol::{Access, Key};
use oxhorn::types::InstanceState;
use oxhorn_testbed::{self as testbed, loop_devices_under, mounts_under};

use crate::common::{OXHORN, eventually, init_tracing, require_root};

const SIZE: u64 = 16 << 20;
const PATIENCE: Duration = Duration::from_secs(30);
/// The cluster's data-plane key, as a manager would hold it.
static CLUSTER_KEY: std::sync::LazyLock<Key> = std::sync::LazyLock::new(Key::generate);

/// One test node. Dropping it kills what its managers left (so drop the
/// managers first: declare them after the node), unmounts what its engines
/// left, and removes its directory.
struct Node {
    /// Removed when the node drops, after everything in it is unmounted.
    _dir: tempfile::TempDir,
    root: PathBuf,
    ip: IpAddr,
    ports: RangeInclusive<u16>,
}

impl Node {
    /// Node `n`: address 127.0.91.n, ports 24000 + 20n onwards.
    fn new(n: u8) -> Self {
        init_tracing();
        let dir = tempfile::Builder::new()
            .prefix("oxhorn-instance-")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical tempdir");
        let first = 24000 + 20 * u16::from(n);
        Node {
            _dir: dir,
            root,
            ip: IpAddr::V4(Ipv4Addr::new(127, 0, 91, n)),
            ports: first..=first + 19,
        }
    }

    fn with_ports(mut self, count: u16) -> Self {
        self.ports = *self.ports.start()..=*self.ports.start() + count - 1;
        self
    }

    fn first_port(&self) -> u16 {
        *self.ports.start()
    }

    fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }

    fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    fn dev_dir(&self) -> PathBuf {
        self.root.join("dev")
    }

    fn record(&self, name: &str) -> PathBuf {
        self.state_dir()
            .join("instances")
            .join(format!("{name}.json"))
    }

    fn config(&self) -> InstanceManagerConfig {
        InstanceManagerConfig {
            binary: OXHORN.into(),
            state_dir: self.state_dir(),
            ip: self.ip,
            ports: self.ports.clone(),
            run_dir: self.run_dir(),
            dev_dir: self.dev_dir(),
            key: CLUSTER_KEY.clone(),
        }
    }

    async fn manager(&self) -> Arc<InstanceManager> {
        InstanceManager::start(self.config())
            .await
            .expect("manager starts")
    }

    fn replica(&self, name: &str) -> InstanceRequest {
        InstanceRequest {
            name: name.into(),
            kind: InstanceKind::Replica {
                volume: "vol1".into(),
                dir: self.root.join("replicas").join(name),
                size: SIZE,
            },
        }
    }

    fn address(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip, port)
    }

    fn kill_recorded(&self) -> usize {
        kill_recorded(&self.state_dir(), &self.run_dir(), &self.dev_dir()).expect("kill_recorded")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = kill_recorded(&self.state_dir(), &self.run_dir(), &self.dev_dir());
        // Belt and braces, should an engine have escaped its record.
        testbed::release_under(&self.root);
    }
}

/// Polls the instance until `done` holds for its info.
async fn wait_for(
    manager: &InstanceManager,
    name: &str,
    what: &str,
    done: impl Fn(&InstanceInfo) -> bool,
) -> InstanceInfo {
    let info = eventually(PATIENCE, || async { manager.get(name).filter(&done) }).await;
    info.unwrap_or_else(|e| panic!("{name}: not {what}: {e}: {:?}", manager.get(name)))
}

async fn wait_running(manager: &InstanceManager, name: &str) -> InstanceInfo {
    wait_for(manager, name, "running", |info| {
        info.state == InstanceState::Running
    })
    .await
}

fn is_alive(pid: u32) -> bool {
    // Only our own children are tested here and the managers reap them, so
    // an exited one does not linger as a zombie.
    kill(Pid::from_raw(pid as i32), None).is_ok()
}

async fn wait_gone(pid: u32) {
    eventually(PATIENCE, || async { (!is_alive(pid)).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}: process {pid} still alive"));
}

fn sigkill(pid: u32) {
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_starts_serves_and_stops() {
    let node = Node::new(1);
    let manager = node.manager().await;
    let mut events = manager.subscribe();

    let started = manager
        .ensure_running(node.replica("r1"))
        .await
        .expect("ensure");
    assert_eq!(started.state, InstanceState::Starting);
    assert_eq!(started.port, node.first_port());
    assert_eq!(started.ip, node.ip);
    assert_eq!(events.recv().await.expect("event"), "r1");

    let info = wait_running(&manager, "r1").await;
    let pid = info.pid.expect("pid");
    assert_eq!((info.restarts, info.message.as_str()), (0, ""));
    TcpStream::connect(node.address(info.port)).expect("data port answers");
    TcpStream::connect(node.address(info.port + 1)).expect("control port answers");
    let record = fs::read_to_string(node.record("r1")).expect("record");
    assert!(record.contains(&format!("\"pid\": {pid}")), "{record}");
    assert_eq!(manager.names(), ["r1"]);
    let log = fs::read_to_string(node.state_dir().join("logs/r1.log")).expect("log");
    assert!(log.contains("replica"), "{log}");

    // Asking again changes nothing.
    let again = manager
        .ensure_running(node.replica("r1"))
        .await
        .expect("ensure");
    assert_eq!(again.pid, Some(pid));

    manager.stop("r1").await.expect("stop");
    assert!(!is_alive(pid), "the replica outlived stop()");
    assert!(!node.record("r1").exists());
    assert_eq!(manager.get("r1"), None);
    assert!(manager.names().is_empty());
    manager
        .stop("r1")
        .await
        .expect("stopping an unknown instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_replica_restarts_on_its_port_with_backoff() {
    let node = Node::new(2);
    let manager = node.manager().await;
    manager
        .ensure_running(node.replica("r1"))
        .await
        .expect("ensure");
    let first = wait_running(&manager, "r1").await;

    sigkill(first.pid.expect("pid"));
    let error = wait_for(&manager, "r1", "in error", |info| {
        info.state == InstanceState::Error
    })
    .await;
    assert!(error.message.contains("killed by SIGKILL"), "{error:?}");
    assert!(error.message.contains("restarting in 1s"), "{error:?}");
    assert_eq!(error.pid, None);
    assert!(
        !node.record("r1").exists(),
        "a dead process's record stayed"
    );

    let second = wait_for(&manager, "r1", "restarted", |info| {
        info.state == InstanceState::Running && info.restarts == 1
    })
    .await;
    assert_eq!(second.port, first.port);
    assert_ne!(second.pid, first.pid);
    assert!(node.record("r1").exists());

    // The second crash in a row waits twice as long.
    let killed_at = Instant::now();
    sigkill(second.pid.expect("pid"));
    let error = wait_for(&manager, "r1", "in error", |info| {
        info.state == InstanceState::Error
    })
    .await;
    assert!(error.message.contains("restarting in 2s"), "{error:?}");
    let third = wait_for(&manager, "r1", "restarted again", |info| {
        info.state == InstanceState::Running && info.restarts == 2
    })
    .await;
    let waited = killed_at.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "restarted after {waited:?}"
    );
    assert_eq!(third.port, first.port);

    manager.stop("r1").await.expect("stop");
    assert!(!is_alive(third.pid.expect("pid")));
}

#[test]
fn a_new_manager_adopts_the_survivors() {
    let node = Node::new(3);

    // Manager A in a runtime of its own, dropped like a crashed process.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let first = runtime.block_on(async {
        let manager = node.manager().await;
        manager
            .ensure_running(node.replica("r1"))
            .await
            .expect("ensure");
        wait_running(&manager, "r1").await
    });
    drop(runtime);
    let pid = first.pid.expect("pid");
    assert!(is_alive(pid), "the replica died with its manager");
    TcpStream::connect(node.address(first.port)).expect("the replica still serves");

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        // Manager B adopts it, and shuts down orderly.
        let manager = node.manager().await;
        let adopted = manager.get("r1").expect("adopted");
        assert_eq!(adopted.state, InstanceState::Running);
        assert_eq!((adopted.pid, adopted.port), (Some(pid), first.port));
        let ensured = manager
            .ensure_running(node.replica("r1"))
            .await
            .expect("ensure");
        assert_eq!(ensured.pid, Some(pid));
        manager.shutdown().await;
        assert!(matches!(
            manager.ensure_running(node.replica("r2")).await,
            Err(InstanceError::ShutDown)
        ));
        drop(manager);
        assert!(is_alive(pid), "shutdown killed the replica");

        // Manager C adopts it too, watches it and stops it. Its watch must
        // not take the adopted process (not its child) for dead: it has
        // started watching r1 by the time the same manager has started a
        // second replica and seen it serve, and r1 is unchanged then.
        let manager = node.manager().await;
        assert_eq!(manager.names(), ["r1"]);
        manager
            .ensure_running(node.replica("r2"))
            .await
            .expect("ensure r2");
        wait_running(&manager, "r2").await;
        let info = manager.get("r1").expect("adopted");
        assert_eq!(
            (info.state, info.pid, info.restarts),
            (InstanceState::Running, Some(pid), 0)
        );
        for name in ["r1", "r2"] {
            manager.stop(name).await.expect("stop");
        }
        wait_gone(pid).await;
        assert!(!node.record("r1").exists());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_records_are_removed_and_their_ports_reused() {
    let node = Node::new(4);
    let records = node.state_dir().join("instances");
    fs::create_dir_all(&records).expect("records dir");
    // A process that has exited, and a live one (this test) recorded with
    // another start time: a pid reused since the record was written.
    let mut exited = std::process::Command::new("true").spawn().expect("true");
    let dead_pid = exited.id();
    exited.wait().expect("reap");
    let write_stale = |name: &str, pid: u32| {
        let record = serde_json::json!({
            "name": name,
            "pid": pid,
            "start_time": 1,
            "port": node.first_port(),
            "request": {
                "name": name,
                "kind": {"Replica": {"dir": node.root.join(name), "size": SIZE}},
            },
        });
        fs::write(records.join(format!("{name}.json")), record.to_string()).expect("record");
    };
    write_stale("dead", dead_pid);
    write_stale("reused", std::process::id());
    fs::write(records.join("garbage.json"), "{").expect("garbage");

    // kill_recorded spares the process that reused the pid.
    assert_eq!(node.kill_recorded(), 0);
    assert_eq!(fs::read_dir(&records).expect("records").count(), 0);

    write_stale("dead", dead_pid);
    write_stale("reused", std::process::id());
    let manager = node.manager().await;
    assert!(manager.names().is_empty());
    assert_eq!(fs::read_dir(&records).expect("records").count(), 0);

    let info = manager
        .ensure_running(node.replica("r1"))
        .await
        .expect("ensure");
    assert_eq!(info.port, node.first_port());
    wait_running(&manager, "r1").await;
    manager.stop("r1").await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_are_disjoint_and_skip_foreign_listeners() {
    let node = Node::new(5).with_ports(5);
    let first = node.first_port();
    let _foreign = TcpListener::bind(node.address(first)).expect("foreign listener");
    let manager = node.manager().await;

    let a = manager.ensure_running(node.replica("a")).await.expect("a");
    let b = manager.ensure_running(node.replica("b")).await.expect("b");
    assert_eq!((a.port, b.port), (first + 1, first + 3));
    let error = manager
        .ensure_running(node.replica("c"))
        .await
        .expect_err("no ports left");
    assert!(matches!(error, InstanceError::NoFreePort { .. }), "{error}");
    assert_eq!(manager.names(), ["a", "b"]);

    for name in ["a", "b"] {
        let info = wait_running(&manager, name).await;
        TcpStream::connect(node.address(info.port + 1)).expect("control port");
    }
    manager.stop("a").await.expect("stop a");
    let c = manager.ensure_running(node.replica("c")).await.expect("c");
    assert_eq!(c.port, first + 1, "a's ports were not freed");
    wait_running(&manager, "c").await;
    for name in ["b", "c"] {
        manager.stop(name).await.expect("stop");
    }
}

fn engine(name: &str, replicas: &[SocketAddr], frontend: FrontendKind) -> InstanceRequest {
    InstanceRequest {
        name: name.into(),
        kind: InstanceKind::Engine {
            volume: "vol1".into(),
            generation: 1,
            size: SIZE,
            replicas: replicas.iter().map(ToString::to_string).collect(),
            frontend,
            salvage: false,
            chap: None,
        },
    }
}

/// The engine's replica addresses, through its control API.
async fn engine_replicas(control: SocketAddr) -> Vec<String> {
    let channel = oxhorn::protocol::control_channel(&control.to_string())
        .await
        .expect("engine control connects");
    let access = Access {
        volume: "vol1".into(),
        key: CLUSTER_KEY.for_volume("vol1"),
        generation: 1,
    };
    let mut client = EngineControlClient::new(oxhorn::protocol::with_token(channel, &access));
    let status = client
        .status(EngineStatusRequest {})
        .await
        .expect("engine status")
        .into_inner();
    assert_eq!((status.volume.as_str(), status.size), ("vol1", SIZE));
    let mut replicas: Vec<String> = status.replicas.into_iter().map(|r| r.address).collect();
    replicas.sort();
    replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_restarts_with_the_latest_request() {
    let node = Node::new(6);
    let manager = node.manager().await;
    let mut replicas = Vec::new();
    for name in ["r1", "r2"] {
        manager
            .ensure_running(node.replica(name))
            .await
            .expect("replica");
        replicas.push(node.address(wait_running(&manager, name).await.port));
    }

    let request = engine("e1", &replicas[..1], FrontendKind::None);
    manager
        .ensure_running(request.clone())
        .await
        .expect("engine");
    let info = wait_running(&manager, "e1").await;
    let control = node.address(info.port);
    assert_eq!(engine_replicas(control).await, [replicas[0].to_string()]);

    let error = manager
        .ensure_running(node.replica("e1"))
        .await
        .expect_err("kind change");
    assert!(
        matches!(error, InstanceError::KindChanged { .. }),
        "{error}"
    );

    // A new replica list is kept for the next start; the process stays.
    let updated = engine("e1", &replicas, FrontendKind::None);
    let same = manager.ensure_running(updated).await.expect("update");
    assert_eq!(same.pid, info.pid);
    let record = fs::read_to_string(node.record("e1")).expect("record");
    assert!(record.contains(&replicas[1].to_string()), "{record}");

    sigkill(info.pid.expect("pid"));
    let restarted = wait_for(&manager, "e1", "restarted", |info| {
        info.state == InstanceState::Running && info.restarts == 1
    })
    .await;
    assert_eq!(restarted.port, info.port);
    let mut expected: Vec<String> = replicas.iter().map(ToString::to_string).collect();
    expected.sort();
    assert_eq!(engine_replicas(control).await, expected);

    for name in ["e1", "r1", "r2"] {
        manager.stop(name).await.expect("stop");
    }
    assert!(manager.names().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuse_engine_leaves_nothing_after_stop_or_power_loss() {
    require_root();
    let node = Node::new(7);
    let link = node.dev_dir().join("vol1");
    let manager = node.manager().await;
    manager
        .ensure_running(node.replica("r1"))
        .await
        .expect("replica");
    let replica = node.address(wait_running(&manager, "r1").await.port);
    let request = engine("e1", &[replica], FrontendKind::Fuse);

    manager
        .ensure_running(request.clone())
        .await
        .expect("engine");
    wait_running(&manager, "e1").await;
    wait_until_exists(&link).await;
    assert!(!mounts_under(&node.root).is_empty());
    manager.stop("e1").await.expect("stop");
    assert!(mounts_under(&node.root).is_empty(), "stop left a mount");
    assert!(
        loop_devices_under(&node.root).is_empty(),
        "stop left a loop device"
    );
    assert!(!link.exists());

    manager.ensure_running(request).await.expect("engine again");
    wait_running(&manager, "e1").await;
    wait_until_exists(&link).await;
    drop(manager);
    assert_eq!(node.kill_recorded(), 2);
    assert!(
        mounts_under(&node.root).is_empty(),
        "a killed engine left a mount"
    );
    assert!(
        loop_devices_under(&node.root).is_empty(),
        "a killed engine left a loop device"
    );
    assert!(!link.exists());
}

async fn wait_until_exists(path: &Path) {
    eventually(PATIENCE, || async { path.exists().then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}: {} never appeared", path.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_start_nothing() {
    let node = Node::new(8);
    let manager = node.manager().await;
    for name in ["../x", "UPPER", ""] {
        let error = manager
            .ensure_running(node.replica(name))
            .await
            .expect_err(name);
        assert!(
            matches!(error, InstanceError::InvalidName(_)),
            "{name}: {error}"
        );
    }
    let mut bad_volume = engine("e1", &[node.address(1)], FrontendKind::None);
    if let InstanceKind::Engine { volume, .. } = &mut bad_volume.kind {
        *volume = "../vol".into();
    }
    assert!(matches!(
        manager.ensure_running(bad_volume).await,
        Err(InstanceError::InvalidName(_))
    ));
    assert!(manager.names().is_empty());
    let records = fs::read_dir(node.state_dir().join("instances")).expect("records");
    assert_eq!(records.count(), 0);
    assert!(!node.state_dir().join("logs").exists());
}

/// A manager asks its node's `oxhorn instance-manager` on every controller
/// pass; an answer that changes nothing must wake no controller, or each
/// pass would start the next one at once (a manager at rest spent a
/// quarter of a core so). A hundred such asks, then a new instance: the
/// notices seen up to that one's are the first start's at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_instance_manager_tells_only_of_changes() {
    let node = Node::new(9);
    let socket = node.root.join("instance-manager.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(oxhorn::instance::service::serve(
        node.config(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let manager = InstanceManager::connect(&socket).await.expect("connect");
    let mut events = manager.subscribe();
    manager
        .ensure_running(node.replica("r1"))
        .await
        .expect("ensure");
    let pid = wait_running(&manager, "r1").await.pid;

    for _ in 0..100 {
        let again = manager
            .ensure_running(node.replica("r1"))
            .await
            .expect("ensure");
        assert_eq!(again.pid, pid);
    }
    manager
        .ensure_running(node.replica("r2"))
        .await
        .expect("ensure");
    let mut told = 0;
    loop {
        let name = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("a notice for r2")
            .expect("notices");
        if name == "r2" {
            break;
        }
        told += 1;
    }
    // r1's: its ensure_running answer, then the watch's Starting and
    // Running updates.
    assert!(told <= 3, "{told} notices for an unchanged r1");

    manager.shutdown().await;
    stop.send(()).expect("serving");
    served.await.expect("join").expect("served");
}
