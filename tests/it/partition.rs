//! Real network partitions in the data plane: each `oxhorn replica` in a
//! network namespace of its own (a testbed [`Host`] on a bridge the test
//! creates), the engine in the test process reaching them over the bridge,
//! and a host cut off from the bridge (its frames vanish: no RST, no ICMP)
//! while the volume is written, then let back.
//!
//! Needs root. Each replica's host is a network namespace on a bridge the
//! test creates (testbed's `netns.rs`: a private 10.250.x.0/24 routed only
//! to that bridge, everything removed when the test ends, and a crashed
//! run's leftovers swept at the next start). A host is cut off under writes
//! by its bridge port ceasing to forward: the replica must leave the I/O path
//! within the keepalive bound while writes go on; once healed, the same
//! replica rejoins with a rebuild that copies only the chunks changed
//! meanwhile, and every replica then equals the acknowledged writes.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use oxhorn::engine::Engine;
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::control::{EngineStatus, ReplicaMode};
use oxhorn::protocol::{Access, Connection, KEEPALIVE, Key, PING_TIMEOUT};
use oxhorn_testbed::ReplicaProcess;
use oxhorn_testbed::netns::{Host, Network};
use tempfile::TempDir;
use tokio::task::JoinSet;

use crate::common::{OXHORN, PATIENCE, eventually, require_root};
use crate::dataplane::{
    BLOCK, Model, Rng, SIZE, WHOLE, assert_same, read_all, until_all_rw, write_random,
};

/// A dead peer is noticed within a keepalive interval and a ping timeout;
/// a loaded machine (two cores shared with builds) may add scheduling delay:
/// up to 6.0 s were measured against this 6 s bound.
const FAILURE_BOUND: Duration = KEEPALIVE.saturating_add(PING_TIMEOUT);
const SLACK: Duration = Duration::from_secs(2);
/// Where the writer writes, before, during and after the partition: a
/// rebuild then has little to copy.
const RECENT: Range<u64> = 0..8 << 20;
/// The unit a rebuild compares and copies (the replica's sync chunk).
const CHUNK: u64 = 2 << 20;

/// Replicas, each on a host of its own on one network. The processes are
/// declared first: they die before their hosts are removed.
struct Cluster {
    replicas: Vec<ReplicaProcess>,
    hosts: Vec<Host>,
    _network: Network,
    _dir: TempDir,
}

impl Cluster {
    async fn start(count: usize) -> Self {
        require_root();
        let network = Network::create().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut replicas = Vec::new();
        let mut hosts = Vec::new();
        for i in 0..count {
            let host = network.add_host().unwrap();
            let mut replica = spawn_replica(&host, &dir.path().join(format!("r{i}")));
            replica.wait_serving(PATIENCE).await.unwrap();
            replicas.push(replica);
            hosts.push(host);
        }
        Self {
            replicas,
            hosts,
            _network: network,
            _dir: dir,
        }
    }

    fn addresses(&self) -> Vec<String> {
        self.replicas.iter().map(ReplicaProcess::address).collect()
    }
}

// The one place each of these is made: a change of how engines, replicas or
// connections start is a change here only.

/// The one volume of these tests: its key and the engine generation.
static ACCESS: std::sync::LazyLock<Access> = std::sync::LazyLock::new(|| Access {
    volume: "vol-partition".into(),
    key: Key::generate().for_volume("vol-partition"),
    generation: 1,
});

fn spawn_replica(host: &Host, dir: &Path) -> ReplicaProcess {
    ReplicaProcess::spawn_in(host, Path::new(OXHORN), dir, SIZE, &ACCESS).unwrap()
}

async fn start_engine(addresses: &[String]) -> Arc<Engine> {
    Engine::start(&ACCESS, SIZE, addresses, false)
        .await
        .unwrap()
}

/// Reads a replica's whole volume straight from its data port, as a reader
/// that leaves the engine's connection in place.
async fn read_replica(address: &str) -> Vec<u8> {
    let connection = Connection::read_only(address, &ACCESS).await.unwrap();
    let mut out = Vec::with_capacity(SIZE as usize);
    for offset in (0..SIZE).step_by(4 << 20) {
        out.extend_from_slice(&connection.read(offset, 4 << 20).await.unwrap());
    }
    out
}

fn mode_of(status: &EngineStatus, address: &str) -> Option<ReplicaMode> {
    let replica = status.replicas.iter().find(|r| r.address == address)?;
    Some(replica.mode())
}

/// One acknowledged write, as the writer saw it.
#[derive(Clone)]
struct Acked {
    offset: u64,
    len: u64,
    data: Bytes,
    issued: Instant,
    acked: Instant,
}

/// Writes random extents in [`RECENT`], 8 at a time (disjoint within a
/// batch), until told to stop; each write must succeed. Each is applied to
/// the model and logged once acknowledged.
struct Writer {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Acked>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(engine: &Arc<Engine>, model: &Arc<Mutex<Model>>, seed: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (engine, model, stop, log) =
                (engine.clone(), model.clone(), stop.clone(), log.clone());
            tokio::spawn(async move {
                let mut rng = Rng(seed);
                while !stop.load(Ordering::Relaxed) {
                    let mut blocks = std::collections::BTreeSet::new();
                    let mut batch = Vec::new();
                    for _ in 0..8 {
                        let (offset, len) = rng.extent(&RECENT);
                        let data = rng.data(len);
                        let range = offset / BLOCK..(offset + len) / BLOCK;
                        if range.clone().all(|b| !blocks.contains(&b)) {
                            blocks.extend(range);
                            batch.push((offset, data));
                        }
                    }
                    let writes = batch.iter().map(|(offset, data)| {
                        let engine = engine.clone();
                        let (offset, data) = (*offset, data.clone());
                        async move {
                            let issued = Instant::now();
                            let result = engine.write(offset, data.clone()).await;
                            (result, issued, Instant::now(), offset, data)
                        }
                    });
                    for (result, issued, acked, offset, data) in
                        futures::future::join_all(writes).await
                    {
                        result.unwrap_or_else(|e| panic!("write at {offset} failed: {e}"));
                        model.lock().unwrap().apply(offset, &data);
                        log.lock().unwrap().push(Acked {
                            offset,
                            len: data.len() as u64,
                            data,
                            issued,
                            acked,
                        });
                    }
                }
            })
        };
        Self { stop, log, task }
    }

    fn acked(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Stops and returns every acknowledged write; panics as the writer did.
    async fn finish(self) -> Vec<Acked> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// When the engine took `address` out of the I/O path: status is asked every
/// 20 ms, each time from a task of its own (a call may wait on the cut-off
/// replica's control port), and the first answer saying ERR dates it by when
/// that call began (the mode is read once the replica before it in the list
/// has answered, a few ms later). `None` if none did within `limit`.
async fn when_failed(engine: &Arc<Engine>, address: &str, limit: Duration) -> Option<Instant> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let prober = {
        let (engine, address) = (engine.clone(), address.to_string());
        tokio::spawn(async move {
            let mut probes = JoinSet::new();
            loop {
                let (engine, address, tx) = (engine.clone(), address.clone(), tx.clone());
                probes.spawn(async move {
                    let began = Instant::now();
                    let status = engine.status().await;
                    if mode_of(&status, &address) == Some(ReplicaMode::Err) {
                        let _ = tx.send(began);
                    }
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
                while probes.try_join_next().is_some() {}
            }
        })
    };
    let failed = tokio::time::timeout(limit, rx.recv()).await.ok().flatten();
    // Dropping the task's JoinSet aborts the probes still waiting.
    prober.abort();
    let _ = prober.await;
    failed
}

/// Says, for the first blocks where `actual` differs from `expected`, which
/// logged write left the data found there and which one the model holds,
/// with when each was issued and acknowledged relative to `times`.
fn explain(what: &str, actual: &[u8], expected: &[u8], log: &[Acked], times: &[(&str, Instant)]) {
    let block = BLOCK as usize;
    let differing: Vec<usize> = (0..actual.len() / block)
        .filter(|b| actual[b * block..(b + 1) * block] != expected[b * block..(b + 1) * block])
        .collect();
    if differing.is_empty() {
        return;
    }
    println!(
        "partition: {what}: {} blocks differ from the model",
        differing.len()
    );
    let when = |at: Instant| {
        times
            .iter()
            .map(|(name, t)| {
                if at >= *t {
                    format!("{name}+{:?}", at - *t)
                } else {
                    format!("{name}-{:?}", *t - at)
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    // The writes covering a block, in acknowledgement order, with their data there.
    let writes_at = |b: usize| {
        let at = b as u64 * BLOCK;
        log.iter().enumerate().filter_map(move |(i, w)| {
            let inside = w.offset <= at && at < w.offset + w.len;
            inside.then(|| (i, w, &w.data[(at - w.offset) as usize..][..block]))
        })
    };
    for &b in differing.iter().take(5) {
        let found = &actual[b * block..(b + 1) * block];
        let source = writes_at(b).filter(|(_, _, d)| *d == found).last();
        let last = writes_at(b).last();
        let describe = |w: Option<(usize, &Acked, &[u8])>| match w {
            Some((i, w, _)) => format!(
                "write #{i} issued {} acked {}",
                when(w.issued),
                when(w.acked)
            ),
            None => "no logged write".into(),
        };
        println!(
            "partition: {what} block {b}: holds {}; the model holds {}",
            describe(source),
            describe(last)
        );
    }
}

/// Replica 1's host is cut off while the volume is written: the engine takes
/// it out of the I/O path within the keepalive bound and writes go on. Once
/// the link is back, the same replica process, on the data it kept, is added
/// again and rebuilt incrementally: only chunks changed while it was away
/// are copied. Then every replica reads as the model of acknowledged writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_replica_leaves_the_io_path_and_rejoins_incrementally() {
    let mut cluster = Cluster::start(3).await;
    let addresses = cluster.addresses();
    let cut = &addresses[1];
    let pid = cluster.replicas[1].pid();
    let engine = start_engine(&addresses).await;
    until_all_rw(&engine, 3).await;
    let model = Arc::new(Mutex::new(Model::new()));
    write_random(&engine, &model, &mut Rng(0xc0ffee), WHOLE, 300, 8).await;

    let writer = Writer::start(&engine, &model, 0x9a77);
    eventually(PATIENCE, || async { (writer.acked() > 16).then_some(()) })
        .await
        .expect("the writer's first writes acknowledged");

    let partitioned = Instant::now();
    cluster.hosts[1].partition().unwrap();
    let failed = when_failed(&engine, cut, FAILURE_BOUND + PATIENCE)
        .await
        .unwrap_or_else(|| panic!("replica 1 never left the I/O path"));
    let to_err = failed.saturating_duration_since(partitioned);
    println!(
        "partition: replica 1 ERR {to_err:?} after its host was cut off (bound {FAILURE_BOUND:?})"
    );
    assert!(
        to_err <= FAILURE_BOUND + SLACK,
        "replica 1 went ERR {to_err:?} after the partition, bound {FAILURE_BOUND:?}"
    );
    let asked = Instant::now();
    let status = engine.status().await;
    println!(
        "partition: engine status took {:?} with replica 1 cut off",
        asked.elapsed()
    );
    let modes: Vec<_> = addresses.iter().map(|a| mode_of(&status, a)).collect();
    assert_eq!(
        modes,
        [
            Some(ReplicaMode::Rw),
            Some(ReplicaMode::Err),
            Some(ReplicaMode::Rw)
        ],
        "{status:#?}"
    );

    // Writes go on, acknowledged by the other two, while it is away.
    let at_err = writer.acked();
    eventually(PATIENCE, || async {
        (writer.acked() >= at_err + 200).then_some(())
    })
    .await
    .expect("writes acknowledged while a replica is partitioned");
    assert!(cluster.hosts[1].is_partitioned().unwrap());

    // The link comes back; the same process, on its own data, rejoins.
    let healed = Instant::now();
    cluster.hosts[1].heal().unwrap();
    assert_eq!(cluster.replicas[1].pid(), pid, "replica 1 was restarted");
    engine.add_replica(cut).await.unwrap();
    let status = until_all_rw(&engine, 3).await;
    let rejoined = Instant::now();
    let log = writer.finish().await;

    // What changed while it was away: every write not acknowledged before
    // the cut (those in flight then may have missed it too), up to the end
    // of the rebuild.
    let missed: Vec<&Acked> = log.iter().filter(|w| w.acked > partitioned).collect();
    let mut blocks = std::collections::BTreeSet::new();
    let mut chunks = std::collections::BTreeSet::new();
    for w in &missed {
        blocks.extend(w.offset / BLOCK..(w.offset + w.len) / BLOCK);
        chunks.extend(w.offset / CHUNK..(w.offset + w.len).div_ceil(CHUNK));
    }
    let during: Vec<&&Acked> = missed
        .iter()
        .filter(|w| w.issued >= partitioned && w.acked <= healed)
        .collect();
    let written_during: u64 = during.iter().map(|w| w.len).sum();
    let stall = log
        .iter()
        .map(|w| w.acked - w.issued)
        .max()
        .unwrap_or_default();
    let replica = status.replicas.iter().find(|r| &r.address == cut).unwrap();
    let copied = replica.last_rebuild_bytes_copied;
    let volume_bytes: u64 = status.snapshots.iter().map(|s| s.size).sum();
    println!(
        "partition: {} writes ({written_during} bytes) acknowledged during the partition ({:?}), \
         longest write {stall:?}; {} blocks ({} bytes) in {} chunks changed from the cut to the \
         end of the rebuild ({:?} after the heal); the rebuild copied {copied} bytes of a volume \
         holding {volume_bytes}",
        during.len(),
        healed - partitioned,
        blocks.len(),
        blocks.len() as u64 * BLOCK,
        chunks.len(),
        rejoined - healed,
    );
    assert!(
        stall <= FAILURE_BOUND + SLACK,
        "a write waited {stall:?} on the partitioned replica"
    );
    assert!(copied > 0, "the rebuild copied nothing: {status:#?}");
    assert!(
        copied <= chunks.len() as u64 * CHUNK,
        "copied {copied}, more than the {} chunks changed while away",
        chunks.len()
    );
    assert!(
        copied * 3 <= volume_bytes,
        "copied {copied} of {volume_bytes}: not incremental"
    );

    let expected = model.lock().unwrap().data.clone();
    let volume = read_all(&*engine).await;
    drop(engine);
    let mut replicas = Vec::new();
    for address in &addresses {
        replicas.push(read_replica(address).await);
    }
    let times = [("cut", partitioned), ("ERR", failed), ("heal", healed)];
    for (i, replica) in replicas.iter().enumerate() {
        explain(&format!("replica {i}"), replica, &expected, &log, &times);
    }
    assert_same(&volume, &expected, "volume after the rejoin");
    for (i, replica) in replicas.iter().enumerate() {
        assert_same(replica, &expected, &format!("replica {i}"));
    }
    for replica in &mut cluster.replicas {
        let status = replica.stop().unwrap();
        assert!(
            status.success(),
            "replica exit {status}:\n{}",
            replica.log()
        );
    }
}

/// The network itself: hosts reach each other and the test over the bridge,
/// a partitioned host reaches nothing and nothing reaches it, and healing
/// lets connections through again.
#[tokio::test]
async fn a_partitioned_host_reaches_nothing_until_healed() {
    require_root();
    let network = Network::create().unwrap();
    let (a, b) = (network.add_host().unwrap(), network.add_host().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut replica = spawn_replica(&a, &dir.path().join("r0"));
    replica.wait_serving(PATIENCE).await.unwrap();
    let address = replica.address();
    assert!(reach(&address).await, "the test does not reach {address}");
    assert!(reach_from(&b, &address), "host b does not reach {address}");

    a.partition().unwrap();
    assert!(a.is_partitioned().unwrap() && !b.is_partitioned().unwrap());
    assert!(
        !reach(&address).await,
        "the test reached a partitioned host"
    );
    assert!(
        !reach_from(&b, &address),
        "host b reached a partitioned host"
    );

    a.heal().unwrap();
    eventually(PATIENCE, || async { reach(&address).await.then_some(()) })
        .await
        .expect("the healed host is reachable");
    assert!(reach_from(&b, &address), "host b does not reach {address}");
    replica.kill();
}

/// Whether a TCP connection to `address` opens within 2 s.
async fn reach(address: &str) -> bool {
    let connect = tokio::net::TcpStream::connect(address);
    tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .is_ok_and(|c| c.is_ok())
}

/// Whether a TCP connection from `host` to `address` opens within 2 s.
fn reach_from(host: &Host, address: &str) -> bool {
    let (ip, port) = address.rsplit_once(':').unwrap();
    let mut command = std::process::Command::new("timeout");
    command
        .args(["2", "bash", "-c"])
        .arg(format!(": </dev/tcp/{ip}/{port}"))
        .stderr(std::process::Stdio::null());
    host.enter(&mut command).unwrap();
    command.status().unwrap().success()
}

/// Reads prefer replicas on the engine's host: a connection tells a replica
/// on this host (here, on loopback) from one on another host.
#[tokio::test]
async fn a_connection_tells_a_replica_on_this_host_from_a_remote_one() {
    require_root();
    let network = Network::create().unwrap();
    let remote_host = network.add_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut remote = spawn_replica(&remote_host, &dir.path().join("remote"));
    let mut here =
        ReplicaProcess::spawn(Path::new(OXHORN), &dir.path().join("here"), SIZE, &ACCESS).unwrap();
    for replica in [&mut remote, &mut here] {
        replica.wait_serving(PATIENCE).await.unwrap();
    }
    let to_remote = Connection::read_only(&remote.address(), &ACCESS)
        .await
        .unwrap();
    let to_here = Connection::read_only(&here.address(), &ACCESS)
        .await
        .unwrap();
    assert!(
        !to_remote.is_local(),
        "{} is on another host",
        remote.address()
    );
    assert!(to_here.is_local(), "{} is on this host", here.address());
    remote.kill();
    here.kill();
}
