//! The fault matrix: one fault per test, each under checksummed random
//! writes (overlapping extents, discards, syncs) from the test bed's
//! [`Writer`], which records every acknowledgement itself. After the fault
//! every block of the volume is read back: a block may hold its last
//! acknowledged write or the one in flight when the fault hit, nothing else
//! (0 lost, 0 corrupt). Then what failed comes back, the replicas are
//! rebuilt under writes, the volume is read back again, and every replica
//! must be byte-identical (and pass the same check).
//!
//! Data-plane rows run `oxhorn replica` processes on loopback and an `oxhorn
//! engine` process with the FUSE frontend (killing the engine and killing
//! a replica also run with FUSE over io_uring, where the kernel has it);
//! cluster rows run `oxhorn manager`
//! nodes and attach a volume through the controllers. Each test prints its
//! row of the matrix (`fault matrix |` lines; `--nocapture` shows them).
//!
//! The row that cuts the engine's node off the API server runs its nodes in
//! network namespaces ([`crate::common::Hosts`]); the row that partitions a
//! replica lives with the other network-namespace tests.
//!
//! The rows: kill -9 one replica, two replicas, the engine; SIGSTOP a
//! replica for 20 s; one replica's disk full (a small tmpfs); bit rot on
//! one replica, and on two at different blocks (`rot.rs`); kill the
//! manager on the engine's node, beside an instance manager, and on a
//! replica's node; cut the engine's node off the API server only; and
//! finding 5, a stale replica the only one back (`stale.rs`).
//!
//! The writer: extents of 1 to 16 blocks from four threads with O_DIRECT,
//! overlapping in time but never two in flight on one block, with discards
//! and fdatasyncs; every 4 KiB block carries its offset, the write's
//! sequence number, a run id and an xxh3 checksum, and the writer records
//! what each request returned. Each check reads every block back: it must
//! hold its last acknowledged content or that of a request in flight (or
//! failed) since, nothing older, no zeros where a write was acknowledged,
//! nothing damaged. Every replica is read from its data port too,
//! byte-identical and held to the same check.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oxhorn::frontend::FuseTransport;
use oxhorn::protocol::control::engine_control_client::EngineControlClient;
use oxhorn::protocol::control::{
    AddReplicaRequest, EngineReplica, EngineStatus, EngineStatusRequest, ReplicaMode,
};
use oxhorn::protocol::{Access, Connection, Key, TokenChannel};
use oxhorn_testbed::writer::{Running, Stats};
use oxhorn_testbed::{
    self as testbed, EngineProcess, Mounted, ReplicaProcess, Verdict, Writer, fuse_uring,
};
use oxhorn_testbed::{WriterOptions, writer::BLOCK};
use tempfile::TempDir;

use crate::common::{OXHORN, eventually, require_root};

const SIZE: u64 = 64 << 20;
const PATIENCE: Duration = Duration::from_secs(60);
/// Acknowledged writes the writer must add in each phase of a test.
const PHASE_WRITES: u64 = 300;
/// How long a hung replica stays stopped.
const HANG: Duration = Duration::from_secs(20);
/// A replica that answers nothing must be out of the I/O path within this:
/// the request timeout (8 s) or the keepalive bound (2 s + 4 s), with room
/// for a loaded machine.
const HUNG_OUT_WITHIN: Duration = Duration::from_secs(15);

// The one place each data-plane object is made: their signatures change with
// fencing and authentication, and each is one line to adapt here.

/// The data-plane rows' cluster key, as the managers would hold it.
static CLUSTER_KEY: std::sync::LazyLock<Key> = std::sync::LazyLock::new(Key::generate);

/// How the data-plane rows' engine (generation 1) reaches `volume`.
fn access(volume: &str) -> Access {
    Access {
        volume: volume.to_string(),
        key: CLUSTER_KEY.for_volume(volume),
        generation: 1,
    }
}

fn spawn_replica(dir: &Path, volume: &str) -> ReplicaProcess {
    ReplicaProcess::spawn(Path::new(OXHORN), dir, SIZE, &access(volume)).unwrap()
}

fn spawn_engine(
    dir: &Path,
    volume: &str,
    replicas: &[String],
    transport: FuseTransport,
) -> EngineProcess {
    let transport = match transport {
        FuseTransport::IoUring => "io-uring",
        FuseTransport::DevFuse => "dev-fuse",
        FuseTransport::Auto => "auto",
    };
    let (binary, access) = (Path::new(OXHORN), access(volume));
    EngineProcess::spawn_fuse(binary, dir, &access, SIZE, replicas, transport).unwrap()
}

/// Reads through a reader's connection, which leaves the engine's in place.
async fn connect(address: &str, access: &Access) -> Connection {
    Connection::read_only(address, access)
        .await
        .unwrap_or_else(|e| panic!("connecting to replica {address}: {e}"))
}

async fn engine_control(engine: &EngineProcess) -> EngineControlClient<TokenChannel> {
    engine
        .client()
        .await
        .unwrap_or_else(|e| panic!("connecting to engine control {}: {e}", engine.control))
}

fn writer_options(seed: u64) -> WriterOptions {
    WriterOptions {
        workers: 4,
        max_extent: 16,
        hot_blocks: 512,
        discard_percent: 5,
        sync_percent: 2,
        seed,
    }
}

/// Reads a replica's whole volume straight from its data port.
async fn read_replica(address: &str, size: u64, access: &Access) -> Vec<u8> {
    let connection = connect(address, access).await;
    let mut out = Vec::with_capacity(size as usize);
    for offset in (0..size).step_by(4 << 20) {
        let len = (4 << 20).min(size - offset) as u32;
        let data = connection
            .read(offset, len)
            .await
            .unwrap_or_else(|e| panic!("reading replica {address} at {offset}: {e}"));
        out.extend_from_slice(&data);
    }
    out
}

/// Every image identical to the first; the first difference otherwise.
fn first_difference(images: &[(String, Vec<u8>)]) -> Option<String> {
    let (first_name, first) = &images[0];
    images[1..].iter().find_map(|(name, image)| {
        let at = image.iter().zip(first).position(|(a, b)| a != b)?;
        let block = at as u64 / BLOCK;
        let differing = image
            .chunks(BLOCK as usize)
            .zip(first.chunks(BLOCK as usize))
            .filter(|(a, b)| a != b)
            .count();
        Some(format!(
            "{name} differs from {first_name}: {differing} blocks, the first block {block}"
        ))
    })
}

/// One row of the matrix, printed when the test is done.
struct Row {
    name: &'static str,
    started: Instant,
    after_fault: Option<Verdict>,
}

impl Row {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            started: Instant::now(),
            after_fault: None,
        }
    }

    /// The read-back right after the fault: 0 lost, 0 corrupt.
    fn check_after_fault(&mut self, verdict: Verdict, context: impl FnOnce() -> String) {
        eprintln!("{}: after the fault: {verdict}", self.name);
        assert!(
            verdict.is_clean(),
            "{}: acknowledged writes lost after the fault: {verdict}\n{}",
            self.name,
            context()
        );
        self.after_fault = Some(verdict);
    }

    /// The read-back once everything came back, and the replicas' images.
    fn finish(
        self,
        stats: &Stats,
        verdict: &Verdict,
        images: &[(String, Vec<u8>)],
        writer: &Writer,
        context: impl Fn() -> String,
    ) {
        eprintln!("{}: writer: {stats}", self.name);
        assert!(
            stats.overlapped > 0 && stats.discards > 0,
            "{}: no overlapping writes or no discards: {stats}",
            self.name
        );
        eprintln!("{}: after recovery: {verdict}", self.name);
        assert!(
            verdict.is_clean(),
            "{}: acknowledged writes lost after recovery: {verdict}\n{}",
            self.name,
            context()
        );
        for (name, image) in images {
            let replica = writer.verify_image(image);
            assert!(
                replica.is_clean(),
                "{}: replica {name}: {replica}\n{}",
                self.name,
                context()
            );
        }
        let difference = first_difference(images);
        let after_fault = self.after_fault.unwrap_or_default();
        eprintln!(
            "fault matrix | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |",
            self.name,
            stats.writes,
            verdict.blocks,
            after_fault.lost + verdict.lost,
            after_fault.corrupt + verdict.corrupt,
            after_fault.in_flight,
            stats.failed,
            if difference.is_none() { "yes" } else { "no" },
            self.started.elapsed().as_secs_f64()
        );
        if let Some(difference) = difference {
            panic!(
                "{}: replicas differ: {difference}\n{}",
                self.name,
                context()
            );
        }
    }
}

/// Waits until the writer has `more` writes acknowledged beyond `since`,
/// failing if all its workers stopped.
async fn until_acknowledged(writer: &Writer, running: &Running, since: u64, more: u64) {
    let done = eventually(PATIENCE, || async {
        if running.workers_left() == 0 {
            panic!("every writer stopped: {}", writer.stats());
        }
        (writer.acknowledged() >= since + more).then_some(())
    })
    .await;
    if let Err(e) = done {
        panic!(
            "{e}: {more} more writes not acknowledged: {}",
            writer.stats()
        );
    }
}

/// Runs the writer on `device` until `more` more writes are acknowledged.
/// None may fail.
async fn write_more(writer: &Writer, device: &Path, more: u64) -> Stats {
    let failed = writer.stats().failed;
    let running = writer.start(device).unwrap();
    until_acknowledged(writer, &running, writer.acknowledged(), more).await;
    let stats = running.stop();
    assert_eq!(stats.failed, failed, "{stats}");
    stats
}

/// Releases whatever a test left under a directory (loop devices, mounts),
/// however it ends.
struct ReleaseUnder(PathBuf);

impl Drop for ReleaseUnder {
    fn drop(&mut self) {
        testbed::release_under(&self.0);
    }
}

/// Three replicas on loopback and an engine with the FUSE frontend.
struct DataPlane {
    // Dropped in this order: the engine (its mount and loop device cleared),
    // the replicas, their disks, anything left, the directory.
    /// How the test reaches the replicas: as the engine does.
    access: Access,
    engine: EngineProcess,
    replicas: Vec<ReplicaProcess>,
    disks: Vec<Mounted>,
    _release: ReleaseUnder,
    _work: TempDir,
    device: PathBuf,
    /// FUSE over io_uring kept on for the engine, where the kernel has it.
    _uring: Option<fuse_uring::On>,
}

impl DataPlane {
    /// Starts three replicas, replica `small.0` on a tmpfs of `small.1`
    /// (e.g. "8m") if given, and an engine over them; waits until all are RW.
    async fn start(volume: &str, small: Option<(usize, &str)>) -> Self {
        Self::start_on(volume, small, FuseTransport::DevFuse).await
    }

    /// Like [`DataPlane::start`], the engine's FUSE frontend on `transport`
    /// (io_uring only where the kernel has it: `/dev/fuse` elsewhere).
    async fn start_on(
        volume: &str,
        small: Option<(usize, &str)>,
        transport: FuseTransport,
    ) -> Self {
        require_root();
        let uring = (transport == FuseTransport::IoUring)
            .then(fuse_uring::on)
            .flatten();
        let transport = match uring {
            Some(_) => FuseTransport::IoUring,
            None => FuseTransport::DevFuse,
        };
        let work = tempfile::Builder::new()
            .prefix("oxhorn-faults-")
            .tempdir()
            .unwrap();
        let root = work.path().canonicalize().unwrap();
        let release = ReleaseUnder(root.clone());
        let mut disks = Vec::new();
        let mut replicas = Vec::new();
        for i in 0..3 {
            let parent = match small {
                Some((at, size)) if at == i => {
                    let disk = Mounted::new(
                        Path::new("tmpfs"),
                        &root.join(format!("disk{i}")),
                        "tmpfs",
                        Some(&format!("size={size}")),
                    )
                    .unwrap();
                    let path = disk.path().to_path_buf();
                    disks.push(disk);
                    path
                }
                _ => root.clone(),
            };
            let mut replica = spawn_replica(&parent.join(format!("r{i}")), volume);
            replica.wait_serving(PATIENCE).await.unwrap();
            replicas.push(replica);
        }
        let addresses: Vec<String> = replicas.iter().map(ReplicaProcess::address).collect();
        let mut engine = spawn_engine(&root, volume, &addresses, transport);
        let device = engine.wait_device(PATIENCE).await.unwrap();
        let plane = Self {
            access: access(volume),
            engine,
            replicas,
            disks,
            _release: release,
            _work: work,
            device,
            _uring: uring,
        };
        plane.until_all_rw().await;
        plane
    }

    fn address(&self, replica: usize) -> String {
        self.replicas[replica].address()
    }

    async fn status(&self) -> EngineStatus {
        engine_control(&self.engine)
            .await
            .status(EngineStatusRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    /// The engine's and the replicas' logs, for a failure message.
    fn logs(&self) -> String {
        let mut logs = format!("==== engine ====\n{}", self.engine.log());
        for (i, replica) in self.replicas.iter().enumerate() {
            let _ = write!(logs, "\n==== replica {i} ====\n{}", replica.log());
        }
        logs
    }

    fn member<'a>(&self, status: &'a EngineStatus, replica: usize) -> Option<&'a EngineReplica> {
        let address = self.address(replica);
        status.replicas.iter().find(|r| r.address == address)
    }

    /// Waits until `check` holds for the engine's status.
    async fn until(&self, what: &str, check: impl Fn(&EngineStatus) -> bool) -> EngineStatus {
        self.until_asked(what, check).await.0
    }

    /// Like [`Self::until`], also returning when the status call that saw
    /// it began (a call may wait on a hung replica's control channel).
    async fn until_asked(
        &self,
        what: &str,
        check: impl Fn(&EngineStatus) -> bool,
    ) -> (EngineStatus, Instant) {
        let reached = eventually(PATIENCE, || async {
            let asked = Instant::now();
            let status = self.status().await;
            check(&status).then_some((status, asked))
        })
        .await;
        match reached {
            Ok(reached) => reached,
            Err(e) => panic!(
                "{e} waiting for {what}: {:#?}\n{}",
                self.status().await,
                self.logs()
            ),
        }
    }

    async fn until_all_rw(&self) -> EngineStatus {
        self.until("every replica RW", |status| {
            status.replicas.len() == self.replicas.len()
                && status.replicas.iter().all(|r| r.mode() == ReplicaMode::Rw)
        })
        .await
    }

    /// Waits until replica `replica` is out of the I/O path; also returns
    /// when the status call that saw it began.
    async fn until_out(&self, replica: usize) -> (EngineStatus, Instant) {
        self.until_asked(&format!("replica {replica} ERR"), |status| {
            self.member(status, replica)
                .is_some_and(|r| r.mode() == ReplicaMode::Err)
        })
        .await
    }

    /// Starts a killed replica again on its data.
    async fn restart(&mut self, replica: usize) {
        self.replicas[replica].start().unwrap();
        self.replicas[replica].wait_serving(PATIENCE).await.unwrap();
    }

    /// Adds a replica back to the engine, which rebuilds it.
    async fn add(&self, replica: usize) {
        engine_control(&self.engine)
            .await
            .add_replica(AddReplicaRequest {
                address: self.address(replica),
            })
            .await
            .unwrap_or_else(|e| panic!("adding replica {replica}: {e}\n{}", self.logs()));
    }

    /// Stops the engine cleanly and reads every replica's data.
    async fn stop_and_read_replicas(&mut self) -> Vec<(String, Vec<u8>)> {
        let status = self.engine.stop().unwrap();
        assert!(status.success(), "engine exit {status}\n{}", self.logs());
        let mut images = Vec::new();
        for i in 0..self.replicas.len() {
            let address = self.address(i);
            let image = read_replica(&address, SIZE, &self.access).await;
            images.push((format!("r{i}"), image));
        }
        images
    }

    /// The last part of every data-plane row: writes while everything is
    /// RW again, a read-back, and the replicas compared.
    async fn finish(mut self, row: Row, writer: &Writer) {
        write_more(writer, &self.device, PHASE_WRITES).await;
        let verdict = writer.verify(&self.device).unwrap();
        let images = self.stop_and_read_replicas().await;
        row.finish(&writer.stats(), &verdict, &images, writer, || self.logs());
    }
}

/// Kills replicas `victims` under writes, waits until each is out of the
/// I/O path and writes go on, then restarts and adds them back.
async fn kill_replicas(
    name: &'static str,
    prefix: &str,
    seed: u64,
    victims: &[usize],
    transport: FuseTransport,
) {
    let mut row = Row::new(name);
    let mut plane = DataPlane::start_on(prefix, None, transport).await;
    let writer = Writer::new(SIZE, writer_options(seed));
    let running = writer.start(&plane.device).unwrap();
    until_acknowledged(&writer, &running, 0, PHASE_WRITES).await;
    for &victim in victims {
        plane.replicas[victim].kill();
    }
    for &victim in victims {
        plane.until_out(victim).await;
    }
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let stats = running.stop();
    assert_eq!(stats.failed, 0, "{stats}");
    row.check_after_fault(writer.verify(&plane.device).unwrap(), || plane.logs());

    for &victim in victims {
        plane.restart(victim).await;
    }
    for &victim in victims {
        plane.add(victim).await;
    }
    let running = writer.start(&plane.device).unwrap();
    plane.until_all_rw().await;
    assert_eq!(running.stop().failed, 0);
    plane.finish(row, &writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_one_replica() {
    let transport = FuseTransport::DevFuse;
    kill_replicas("kill -9 one replica", "fm-kill-one", 1, &[1], transport).await;
}

/// The same with FUSE over io_uring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_one_replica_on_io_uring() {
    let (name, transport) = ("kill -9 one replica, io_uring", FuseTransport::IoUring);
    kill_replicas(name, "fm-kill-one-uring", 1, &[1], transport).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_two_replicas() {
    let transport = FuseTransport::DevFuse;
    kill_replicas("kill -9 two replicas", "fm-kill-two", 2, &[1, 2], transport).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_the_engine() {
    let transport = FuseTransport::DevFuse;
    kill_engine("kill -9 the engine", "fm-kill-engine", transport).await;
}

/// The same with FUSE over io_uring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_the_engine_on_io_uring() {
    let transport = FuseTransport::IoUring;
    kill_engine(
        "kill -9 the engine, io_uring",
        "fm-kill-engine-uring",
        transport,
    )
    .await;
}

async fn kill_engine(name: &'static str, prefix: &str, transport: FuseTransport) {
    let mut row = Row::new(name);
    let mut plane = DataPlane::start_on(prefix, None, transport).await;
    let writer = Writer::new(SIZE, writer_options(3));
    let running = writer.start(&plane.device).unwrap();
    until_acknowledged(&writer, &running, 0, PHASE_WRITES).await;
    plane.engine.kill();
    // Requests in flight fail; each worker stops at its first failure.
    let stopped = eventually(PATIENCE, || async {
        (running.workers_left() == 0).then_some(())
    })
    .await;
    stopped.unwrap_or_else(|e| panic!("{e}: writers still going after the engine died"));
    let stats = running.stop();
    assert!(
        stats.failed > 0,
        "no request failed with the engine gone: {stats}"
    );

    plane.engine.start().unwrap();
    plane.device = plane.engine.wait_device(PATIENCE).await.unwrap();
    row.check_after_fault(writer.verify(&plane.device).unwrap(), || plane.logs());
    // After an unclean stop one replica is RW and the others are rebuilt
    // from it, under writes.
    let running = writer.start(&plane.device).unwrap();
    plane.until_all_rw().await;
    assert_eq!(running.stop().failed, stats.failed);
    plane.finish(row, &writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_one_replica() {
    let mut row = Row::new("SIGSTOP one replica 20 s");
    let mut plane = DataPlane::start("fm-sigstop", None).await;
    let writer = Writer::new(SIZE, writer_options(4));
    let running = writer.start(&plane.device).unwrap();
    until_acknowledged(&writer, &running, 0, PHASE_WRITES).await;
    plane.replicas[1].pause().unwrap();
    let stopped = Instant::now();
    let (_, asked) = plane.until_out(1).await;
    let out_after = asked - stopped;
    // Writes go on while it is still stopped.
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let went_on = stopped.elapsed();
    assert!(
        went_on < HANG,
        "{PHASE_WRITES} writes took {went_on:?} with one replica hung"
    );
    eprintln!(
        "{}: out of the I/O path by {out_after:?}, {PHASE_WRITES} more writes by {went_on:?}, longest write {:?}",
        row.name,
        writer.stats().max_latency
    );
    assert!(
        out_after < HUNG_OUT_WITHIN,
        "a hung replica stayed in the I/O path for {out_after:?}"
    );
    let longest = writer.stats().max_latency;
    assert!(
        longest < HUNG_OUT_WITHIN,
        "a write waited {longest:?} on a hung replica"
    );
    tokio::time::sleep(HANG.saturating_sub(stopped.elapsed())).await;
    plane.replicas[1].resume().unwrap();
    let stats = running.stop();
    assert_eq!(stats.failed, 0, "{stats}");
    row.check_after_fault(writer.verify(&plane.device).unwrap(), || plane.logs());

    plane.replicas[1].wait_serving(PATIENCE).await.unwrap();
    plane.add(1).await;
    let running = writer.start(&plane.device).unwrap();
    plane.until_all_rw().await;
    assert_eq!(running.stop().failed, 0);
    plane.finish(row, &writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replicas_disk_full() {
    let mut row = Row::new("one replica's disk full");
    // 8 MiB under a 64 MiB volume: replica 2 runs out while the others go on.
    let mut plane = DataPlane::start("fm-disk-full", Some((2, "8m"))).await;
    let writer = Writer::new(SIZE, writer_options(5));
    let running = writer.start(&plane.device).unwrap();
    let (status, _) = plane.until_out(2).await;
    let error = &plane.member(&status, 2).unwrap().last_error;
    eprintln!("{}: replica 2 out of the I/O path: {error}", row.name);
    assert!(error.contains("NoSpace"), "{error}");
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let stats = running.stop();
    assert_eq!(stats.failed, 0, "{stats}");
    row.check_after_fault(writer.verify(&plane.device).unwrap(), || plane.logs());

    // Room again: the disk grows, and the replica is added back.
    let disk = plane.disks[0].path().to_path_buf();
    nix::mount::mount(
        None::<&str>,
        &disk,
        None::<&str>,
        nix::mount::MsFlags::MS_REMOUNT,
        Some("size=256m"),
    )
    .unwrap();
    if plane.replicas[2]
        .wait_serving(Duration::ZERO)
        .await
        .is_err()
    {
        plane.restart(2).await;
    }
    plane.add(2).await;
    let running = writer.start(&plane.device).unwrap();
    plane.until_all_rw().await;
    assert_eq!(running.stop().failed, 0);
    plane.finish(row, &writer).await;
}

mod cluster;
mod rot;
mod stale;
