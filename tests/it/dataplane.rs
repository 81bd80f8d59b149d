//! The data plane for real: `oxhorn replica` processes on loopback and the
//! replicating engine, with replicas killed with SIGKILL, restarted and
//! rebuilt, and the engine itself dropped mid-write and restarted. The
//! writers, the model of acknowledged writes and the comparisons serve the
//! `partition` module too.
//!
//! Every replica is then checked byte for byte. Beyond kills and rebuilds,
//! this module checks that overlapping writes and discards in flight together
//! leave the replicas identical; that two rebuilds and a snapshot under
//! writes and discards lose nothing; that a hung replica (SIGSTOP) leaves the
//! I/O path while I/O goes on; and that a replica which cannot take a
//! snapshot another one holds leaves the I/O path.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use oxhorn::engine::Engine;
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::control::{EngineStatus, ReplicaMode};
use oxhorn::protocol::{Access, Connection, Key};
use oxhorn_testbed::{Mounted, ReplicaProcess};
use tempfile::TempDir;

use crate::common::{OXHORN, eventually, require_root};

pub(crate) const SIZE: u64 = 64 << 20;
pub(crate) const BLOCK: u64 = 4096;
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// A small deterministic generator: tests must replay the same way.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// An aligned (offset, length) of 1 to 64 blocks within `region`.
    pub(crate) fn extent(&mut self, region: &Range<u64>) -> (u64, u64) {
        let blocks = 1 + self.next() % 64;
        let start =
            region.start / BLOCK + self.next() % ((region.end - region.start) / BLOCK - blocks);
        (start * BLOCK, blocks * BLOCK)
    }

    pub(crate) fn data(&mut self, len: u64) -> Bytes {
        let seed = self.next();
        (0..len)
            .map(|i| (seed.wrapping_mul(i + 1) >> 24) as u8)
            .collect::<Vec<u8>>()
            .into()
    }
}

/// The volume as it must read: what every acknowledged write left.
pub(crate) struct Model {
    pub(crate) data: Vec<u8>,
    /// How many acknowledged writes it holds.
    pub(crate) writes: usize,
}

impl Model {
    pub(crate) fn new() -> Self {
        Self {
            data: vec![0; SIZE as usize],
            writes: 0,
        }
    }

    pub(crate) fn apply(&mut self, offset: u64, data: &[u8]) {
        self.data[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        self.writes += 1;
    }
}

/// A volume's key, new for each test volume, as the controller derives one.
pub(crate) fn access(volume: &str) -> Access {
    Access {
        volume: volume.to_string(),
        key: Key::generate().for_volume(volume),
        generation: 0,
    }
}

pub(crate) struct Replicas {
    _dir: TempDir,
    pub(crate) processes: Vec<ReplicaProcess>,
    /// The volume's key; the generation of the last engine started.
    pub(crate) access: Mutex<Access>,
}

impl Replicas {
    pub(crate) async fn start(volume: &str, count: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let access = access(volume);
        let mut processes = Vec::new();
        for i in 0..count {
            let path = dir.path().join(format!("r{i}"));
            let mut replica =
                ReplicaProcess::spawn(Path::new(OXHORN), &path, SIZE, &access).unwrap();
            replica.wait_serving(PATIENCE).await.unwrap();
            processes.push(replica);
        }
        Self {
            _dir: dir,
            processes,
            access: Mutex::new(access),
        }
    }

    pub(crate) fn addresses(&self) -> Vec<String> {
        self.processes.iter().map(ReplicaProcess::address).collect()
    }

    /// The access of the next engine: one generation up, as the controller
    /// raises it for each engine it starts.
    pub(crate) fn next_access(&self) -> Access {
        let mut access = self.access.lock().unwrap();
        access.generation += 1;
        access.clone()
    }

    /// An engine of the next generation on every replica.
    pub(crate) async fn engine(&self) -> Arc<Engine> {
        self.engine_on(&self.addresses()).await
    }

    /// An engine of the next generation on `addresses`.
    pub(crate) async fn engine_on(&self, addresses: &[String]) -> Arc<Engine> {
        Engine::start(&self.next_access(), SIZE, addresses, false)
            .await
            .unwrap()
    }

    /// Reads a replica's whole volume straight from its data port.
    pub(crate) async fn read(&self, address: &str) -> Vec<u8> {
        let access = self.access.lock().unwrap().clone();
        read_replica(address, &access).await
    }
}

pub(crate) const WHOLE: Range<u64> = 0..SIZE;

/// Writes `count` random extents in `region`, `parallel` at a time, recording
/// each in the model once acknowledged. Every write must succeed.
pub(crate) async fn write_random(
    engine: &Arc<Engine>,
    model: &Arc<Mutex<Model>>,
    rng: &mut Rng,
    region: Range<u64>,
    count: usize,
    parallel: usize,
) {
    for _ in 0..count.div_ceil(parallel) {
        let batch: Vec<_> = (0..parallel)
            .map(|_| {
                let (offset, len) = rng.extent(&region);
                (offset, rng.data(len))
            })
            .collect();
        // Overlapping writes in one batch would race: keep the batch disjoint.
        let mut seen = BTreeSet::new();
        let batch: Vec<_> = batch
            .into_iter()
            .filter(|(o, d)| (o / BLOCK..(o + d.len() as u64) / BLOCK).all(|b| seen.insert(b)))
            .collect();
        let writes = batch
            .iter()
            .map(|(offset, data)| engine.write(*offset, data.clone()));
        for result in futures::future::join_all(writes).await {
            result.expect("write failed");
        }
        let mut model = model.lock().unwrap();
        for (offset, data) in &batch {
            model.apply(*offset, data);
        }
    }
}

pub(crate) async fn read_all(device: &impl BlockDevice) -> Vec<u8> {
    let mut out = Vec::with_capacity(SIZE as usize);
    for offset in (0..SIZE).step_by(4 << 20) {
        out.extend_from_slice(&device.read(offset, 4 << 20).await.unwrap());
    }
    out
}

/// Reads a replica's whole volume straight from its data port, as a reader
/// that leaves the engine's connection in place.
pub(crate) async fn read_replica(address: &str, access: &Access) -> Vec<u8> {
    let connection = Connection::read_only(address, access).await.unwrap();
    let mut out = Vec::with_capacity(SIZE as usize);
    for offset in (0..SIZE).step_by(4 << 20) {
        out.extend_from_slice(&connection.read(offset, 4 << 20).await.unwrap());
    }
    out
}

pub(crate) fn modes(status: &EngineStatus) -> Vec<ReplicaMode> {
    status.replicas.iter().map(|r| r.mode()).collect()
}

/// Waits until every replica of the engine is RW.
pub(crate) async fn until_all_rw(engine: &Engine, count: usize) -> EngineStatus {
    let all_rw = eventually(PATIENCE, || async {
        let status = engine.status().await;
        let rw = modes(&status).iter().all(|m| *m == ReplicaMode::Rw);
        (status.replicas.len() == count && rw).then_some(status)
    })
    .await;
    match all_rw {
        Ok(status) => status,
        Err(e) => panic!("{e}: replicas never all RW: {:#?}", engine.status().await),
    }
}

pub(crate) fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
    if let Some(at) = actual.iter().zip(expected).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {at} (block {})",
            at as u64 / BLOCK
        );
    }
    assert_eq!(actual.len(), expected.len(), "{what}: length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_replica_leaves_the_io_path_and_is_rebuilt_identical() {
    let mut replicas = Replicas::start("vol-rebuild", 3).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    let model = Arc::new(Mutex::new(Model::new()));
    let mut rng = Rng(0x9e3779b97f4a7c15);
    write_random(&engine, &model, &mut rng, WHOLE, 300, 8).await;

    // Kill replica 1 while writes are in flight: none may fail. From now on
    // writes stay in the first 8 MiB, so a rebuild has little to copy.
    let recent = 0..8 << 20;
    let before = model.lock().unwrap().writes;
    let writer = {
        let (engine, model) = (engine.clone(), model.clone());
        tokio::spawn(async move {
            let mut rng = Rng(42);
            write_random(&engine, &model, &mut rng, 0..8 << 20, 400, 8).await;
        })
    };
    // The writer is under way once its first writes are acknowledged; the
    // kill lands among the many after them.
    eventually(PATIENCE, || async {
        (model.lock().unwrap().writes > before).then_some(())
    })
    .await
    .expect("the writer's first writes acknowledged");
    replicas.processes[1].kill();
    writer.await.unwrap();
    // And more while it is away.
    write_random(&engine, &model, &mut rng, recent.clone(), 100, 8).await;
    let status = engine.status().await;
    assert_eq!(
        modes(&status),
        [ReplicaMode::Rw, ReplicaMode::Err, ReplicaMode::Rw],
        "{status:#?}"
    );
    assert!(status.replicas[1].io_errors >= 1);
    assert_same(
        &read_all(&*engine).await,
        &model.lock().unwrap().data,
        "volume with a replica down",
    );

    // Restart it on its old data and rebuild while writes go on.
    replicas.processes[1].start().unwrap();
    replicas.processes[1].wait_serving(PATIENCE).await.unwrap();
    engine.add_replica(&replicas.addresses()[1]).await.unwrap();
    write_random(&engine, &model, &mut rng, recent, 200, 8).await;
    let status = until_all_rw(&engine, 3).await;

    // Only what changed while it was away was copied.
    let written_bytes: u64 = status.snapshots.iter().map(|s| s.size).sum();
    let copied = status.replicas[1].last_rebuild_bytes_copied;
    assert!(
        copied > 0 && copied <= 10 << 20,
        "copied {copied} of {written_bytes}"
    );

    let expected = model.lock().unwrap().data.clone();
    assert_same(&read_all(&*engine).await, &expected, "volume after rebuild");
    drop(engine);
    for (i, address) in replicas.addresses().iter().enumerate() {
        assert_same(
            &replicas.read(address).await,
            &expected,
            &format!("replica {i}"),
        );
    }
    for replica in &mut replicas.processes {
        let status = replica.stop().unwrap();
        assert!(
            status.success(),
            "replica exit {status}:\n{}",
            replica.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_restart_loses_no_acknowledged_write() {
    let replicas = Replicas::start("vol-restart", 3).await;
    let model = Arc::new(Mutex::new(Model::new()));
    let mut rng = Rng(7);
    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    write_random(&engine, &model, &mut rng, WHOLE, 300, 8).await;

    // Writes in flight when the engine dies may or may not have landed.
    let before = model.lock().unwrap().data.clone();
    let in_flight: Vec<(u64, Bytes)> = (0..32)
        .map(|i| (i * (1 << 20), rng.data(64 * BLOCK)))
        .collect();
    let tasks: Vec<_> = in_flight
        .iter()
        .cloned()
        .map(|(offset, data)| {
            let engine = engine.clone();
            tokio::spawn(async move { engine.write(offset, data).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2)).await;
    for task in &tasks {
        task.abort();
    }
    drop(tasks);
    drop(engine);

    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    let after = read_all(&*engine).await;
    let block = BLOCK as usize;
    let mut undecided = vec![false; SIZE as usize / block];
    for (offset, data) in &in_flight {
        let first = *offset as usize / block;
        for (i, new) in data.chunks(block).enumerate() {
            let at = (first + i) * block..(first + i + 1) * block;
            let (now, old) = (&after[at.clone()], &before[at]);
            assert!(
                now == old || now == new,
                "in-flight write left block {} neither old nor new",
                first + i
            );
            undecided[first + i] = true;
        }
    }
    for (i, (now, old)) in after.chunks(block).zip(before.chunks(block)).enumerate() {
        assert!(undecided[i] || now == old, "acknowledged block {i} lost");
    }
    // And all three replicas agree again.
    drop(engine);
    let first = replicas.read(&replicas.addresses()[0]).await;
    for address in &replicas.addresses()[1..] {
        assert_same(&replicas.read(address).await, &first, address);
    }
}

#[tokio::test]
async fn with_no_replica_left_io_fails_with_eio() {
    let mut replicas = Replicas::start("vol-eio", 1).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 1).await;
    engine
        .write(0, Bytes::from(vec![1; BLOCK as usize]))
        .await
        .unwrap();
    replicas.processes[0].kill();
    let error = engine
        .write(0, Bytes::from(vec![2; BLOCK as usize]))
        .await
        .unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::EIO));
    let error = engine.read(0, BLOCK as usize).await.unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::EIO));
}

#[tokio::test]
async fn snapshots_are_taken_on_every_replica_at_one_point() {
    let replicas = Replicas::start("vol-snap", 2).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 2).await;
    engine.write(0, Bytes::from(vec![1; 8192])).await.unwrap();
    engine.snapshot("before", true).await.unwrap();
    engine.write(0, Bytes::from(vec![2; 4096])).await.unwrap();
    let status = engine.status().await;
    let names: Vec<_> = status.snapshots.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["before"]);
    assert!(status.snapshots[0].user_created);
    assert_eq!(status.snapshots[0].size, 8192);
    let error = engine.snapshot("../escape", true).await.unwrap_err();
    assert!(error.to_string().contains("invalid"), "{error}");
    engine.remove_snapshot("before").await.unwrap();
    let data = engine.read(0, 8192).await.unwrap();
    assert_eq!(&data[..4096], &[2; 4096][..]);
    assert_eq!(&data[4096..], &[1; 4096][..]);
    assert!(engine.status().await.snapshots.is_empty());
}

#[tokio::test]
async fn a_malformed_frame_closes_that_connection_only() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let replicas = Replicas::start("vol-frame", 1).await;
    let address = &replicas.addresses()[0];
    let access = replicas.next_access();
    // Garbage instead of the handshake, and garbage instead of a frame
    // after it: each closes its connection.
    for handshake in [false, true] {
        let mut raw = tokio::net::TcpStream::connect(address).await.unwrap();
        if handshake {
            let claim = oxhorn::protocol::Claim {
                volume: access.volume.clone(),
                generation: access.generation,
                role: oxhorn::protocol::Role::Engine,
            };
            oxhorn::protocol::introduce(&mut raw, &access.key, &claim)
                .await
                .unwrap();
        }
        raw.write_all(&[0xde; 64]).await.unwrap();
        // Ends with EOF or a reset: either way, closed.
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, raw.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("handshake {handshake}: connection not closed"))
            .ok();
    }

    let connection = Connection::connect(address, &replicas.next_access())
        .await
        .unwrap();
    connection
        .write(0, Bytes::from(vec![9; 4096]))
        .await
        .unwrap();
    assert_eq!(&connection.read(0, 4096).await.unwrap()[..], &[9; 4096][..]);
    let error = connection.read(1, 4096).await.unwrap_err();
    assert!(error.to_string().contains("InvalidArgument"), "{error}");
}

#[tokio::test]
async fn a_full_disk_is_reported_as_enospc_and_loses_nothing() {
    require_root();
    let work = tempfile::tempdir().unwrap();
    // A real 4 MiB filesystem under a 64 MiB replica.
    let disk = Mounted::new(
        Path::new("tmpfs"),
        &work.path().join("disk"),
        "tmpfs",
        Some("size=4m"),
    )
    .unwrap();
    let access = access("vol-full");
    let mut replica =
        ReplicaProcess::spawn(Path::new(OXHORN), &disk.path().join("r0"), SIZE, &access).unwrap();
    replica.wait_serving(PATIENCE).await.unwrap();
    let engine = Engine::start(&access, SIZE, &[replica.address()], false)
        .await
        .unwrap();
    until_all_rw(&engine, 1).await;

    let mib = 1 << 20;
    let mut written = Vec::new();
    let error = loop {
        let offset = written.len() as u64 * mib;
        assert!(offset < SIZE, "a 64 MiB volume fit on a 4 MiB disk");
        let data = Bytes::from(vec![written.len() as u8 + 1; mib as usize]);
        match engine.write(offset, data.clone()).await {
            Ok(()) => written.push(data),
            Err(error) => break error,
        }
    };
    assert_eq!(error.raw_os_error(), Some(nix::libc::ENOSPC), "{error}");
    assert!(!written.is_empty());
    // The replica stays in the I/O path and what was acknowledged reads back.
    for (i, data) in written.iter().enumerate() {
        assert_eq!(
            engine.read(i as u64 * mib, mib as usize).await.unwrap(),
            data
        );
    }
    drop(engine);
    replica.kill();
}

#[tokio::test]
async fn a_cleanly_stopped_engine_restarts_without_a_rebuild() {
    let replicas = Replicas::start("vol-clean", 3).await;
    let model = Arc::new(Mutex::new(Model::new()));
    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    write_random(&engine, &model, &mut Rng(11), WHOLE, 64, 8).await;
    engine.shut_down().await.unwrap();
    drop(engine);

    let engine = replicas.engine().await;
    let status = engine.status().await;
    assert_eq!(modes(&status), [ReplicaMode::Rw; 3], "{status:#?}");
    assert!(
        status
            .replicas
            .iter()
            .all(|r| !r.rebuilding && r.last_rebuild_bytes_copied == 0)
    );
    assert_same(
        &read_all(&*engine).await,
        &model.lock().unwrap().data,
        "volume after a clean restart",
    );
}

/// Writes `count` random extents of 1 to 64 blocks in `region`, `parallel`
/// at a time with no care for overlaps, and discards one extent in four
/// instead of writing it. Every request must succeed.
async fn write_overlapping(
    engine: &Arc<Engine>,
    rng: &mut Rng,
    region: Range<u64>,
    count: usize,
    parallel: usize,
) {
    for _ in 0..count.div_ceil(parallel) {
        let batch: Vec<_> = (0..parallel)
            .map(|_| {
                let (offset, len) = rng.extent(&region);
                let discard = rng.next().is_multiple_of(4);
                (offset, len, (!discard).then(|| rng.data(len)))
            })
            .collect();
        let requests = batch.into_iter().map(|(offset, len, data)| {
            let engine = engine.clone();
            tokio::spawn(async move {
                match data {
                    Some(data) => engine.write(offset, data).await,
                    None => engine.unmap(offset, len).await,
                }
            })
        });
        for result in futures::future::join_all(requests).await {
            result.unwrap().expect("request failed");
        }
    }
}

/// Overlapping writes and discards in flight together may land in any
/// order, but in the same order on every replica: the replicas end up
/// byte-identical, and the volume reads as they do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_writes_leave_the_replicas_identical() {
    let replicas = Replicas::start("vol-overlap", 3).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    write_overlapping(&engine, &mut Rng(0xfeed), 0..1 << 20, 2000, 32).await;
    let volume = read_all(&*engine).await;
    drop(engine);
    for (i, address) in replicas.addresses().iter().enumerate() {
        assert_same(
            &replicas.read(address).await,
            &volume,
            &format!("replica {i}"),
        );
    }
}

/// Two replicas added back to back, and a snapshot taken, while writes and
/// discards go on: each rebuild's target also takes the other's rebuild
/// snapshot and the user's, and none of them may lose what those hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rebuilds_and_a_snapshot_under_writes_and_discards_lose_nothing() {
    let replicas = Replicas::start("vol-rebuilds", 3).await;
    let addresses = replicas.addresses();
    let engine = replicas.engine_on(&addresses[..1]).await;
    until_all_rw(&engine, 1).await;
    let model = Arc::new(Mutex::new(Model::new()));
    let mut rng = Rng(0x5eed);
    write_random(&engine, &model, &mut rng, WHOLE, 300, 8).await;

    let writer = {
        let engine = engine.clone();
        tokio::spawn(async move {
            write_overlapping(&engine, &mut Rng(99), 0..16 << 20, 600, 8).await;
        })
    };
    engine.add_replica(&addresses[1]).await.unwrap();
    engine.add_replica(&addresses[2]).await.unwrap();
    engine.snapshot("during-rebuild", true).await.unwrap();
    writer.await.unwrap();
    until_all_rw(&engine, 3).await;

    let volume = read_all(&*engine).await;
    let untouched = 16 << 20..SIZE as usize;
    assert_same(
        &volume[untouched.clone()],
        &model.lock().unwrap().data[untouched],
        "volume beyond the region written during the rebuilds",
    );
    let names: Vec<_> = engine
        .status()
        .await
        .snapshots
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(
        names.iter().any(|n| n == "during-rebuild"),
        "snapshots: {names:?}"
    );
    // The rebuilt replicas' layers may hold the snapshots' blocks
    // differently from the source's; what each snapshot reads is the same,
    // so a scrub finds nothing to settle.
    engine.run_scrub(0).await.unwrap();
    let scrub = engine.scrub_status();
    assert!(scrub.checked_bytes > 0, "{scrub:?}");
    assert_eq!(
        (
            scrub.rotten_bytes,
            scrub.mismatched_chunks,
            scrub.error.as_str()
        ),
        (0, 0, ""),
        "{scrub:?}"
    );
    drop(engine);
    for (i, address) in addresses.iter().enumerate() {
        assert_same(
            &replicas.read(address).await,
            &volume,
            &format!("replica {i}"),
        );
    }
}

/// A replica that hangs (SIGSTOP: its sockets stay open, nothing answers)
/// is taken out of the I/O path within the keepalive bound, even by calls
/// made while I/O is quiesced, and I/O goes on with the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_replica_leaves_the_io_path_and_io_goes_on() {
    let mut replicas = Replicas::start("vol-hung", 3).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    let model = Arc::new(Mutex::new(Model::new()));
    let mut rng = Rng(0x57);
    write_random(&engine, &model, &mut rng, WHOLE, 100, 8).await;

    replicas.processes[1].pause().unwrap();
    // Expand holds the I/O gate while it asks every replica.
    tokio::time::timeout(PATIENCE, engine.expand(SIZE + (16 << 20)))
        .await
        .expect("expand waited on a hung replica")
        .unwrap();
    let status = tokio::time::timeout(PATIENCE, engine.status())
        .await
        .expect("status waited on a hung replica");
    assert_eq!(
        modes(&status),
        [ReplicaMode::Rw, ReplicaMode::Err, ReplicaMode::Rw],
        "{status:#?}"
    );
    write_random(&engine, &model, &mut rng, WHOLE, 100, 8).await;
    assert_same(
        &read_all(&*engine).await,
        &model.lock().unwrap().data,
        "volume with a hung replica",
    );
    replicas.processes[1].resume().unwrap();
    replicas.processes[1].kill();
}

/// A snapshot one replica holds already (an earlier, partial attempt) and
/// another cannot take: the engine's "exists already" must not leave the
/// replica without it in the I/O path.
#[tokio::test]
async fn a_replica_that_cannot_take_a_snapshot_leaves_the_io_path() {
    use oxhorn::engine::control_address;
    use oxhorn::protocol::control::SnapshotRequest;
    use oxhorn::protocol::control::replica_control_client::ReplicaControlClient;

    let replicas = Replicas::start("vol-partial", 2).await;
    let addresses = replicas.addresses();
    let engine = replicas.engine().await;
    until_all_rw(&engine, 2).await;
    engine.write(0, Bytes::from(vec![1; 8192])).await.unwrap();

    let first = control_address(&addresses[0]).unwrap();
    let channel = oxhorn::protocol::control_channel(&first).await.unwrap();
    let access = replicas.access.lock().unwrap().clone();
    let mut first = ReplicaControlClient::new(oxhorn::protocol::with_token(channel, &access));
    let request = SnapshotRequest {
        name: "partial".into(),
        user_created: true,
        labels: Default::default(),
    };
    first.snapshot(request).await.unwrap();
    // The second replica's files vanish under it: its open head still
    // flushes, but it cannot freeze it as a snapshot.
    std::fs::remove_dir_all(replicas.processes[1].dir()).unwrap();

    let error = engine.snapshot("partial", true).await.unwrap_err();
    assert!(error.to_string().contains("already exists"), "{error}");
    let status = engine.status().await;
    assert_eq!(
        modes(&status),
        [ReplicaMode::Rw, ReplicaMode::Err],
        "{status:#?}"
    );
}
