//! Rotten blocks on replicas' disks under a running volume: `oxhorn
//! replica` processes on loopback, their layer files damaged behind their
//! backs (a flipped bit, a zeroed block, a truncated file), read through
//! the engine or found by a scrub. Every read returns the acknowledged data
//! or fails with EIO when no replica has a good copy; rotten data is never
//! served, and the replica that had it is repaired. The last test runs the
//! managers: a scrub the scrub-interval Setting starts, and what the
//! Volume then says.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use oxhorn::engine::Engine;
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::ConnectionError;
use oxhorn::protocol::control::ReplicaMode;
use oxhorn_testbed::ReplicaProcess;

use crate::common::{Cluster, MIB, read_device, replica_dir, require_root, write_pattern};
use crate::dataplane::{
    BLOCK, Model, PATIENCE, Replicas, Rng, assert_same, modes, read_all, until_all_rw, write_random,
};

const BS: usize = BLOCK as usize;
/// Where the tests write: 8 MiB, 2048 blocks.
const REGION: std::ops::Range<u64> = 0..8 << 20;

/// Damage done to one replica's head layer file.
enum Rot {
    /// One bit of the block changed.
    Flip(u64),
    /// The block overwritten with zeros.
    Zero(u64),
    /// The file cut short at the block.
    TruncateAt(u64),
}

fn rot(replica: &ReplicaProcess, damage: Rot) {
    rot_layer(replica, "head-1.img", damage);
}

fn rot_layer(replica: &ReplicaProcess, layer: &str, damage: Rot) {
    let path = replica.dir().join(layer);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    match damage {
        Rot::Flip(block) => {
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, block * BLOCK + 17).unwrap();
            file.write_all_at(&[byte[0] ^ 0x20], block * BLOCK + 17)
                .unwrap();
        }
        Rot::Zero(block) => file.write_all_at(&[0; BS], block * BLOCK).unwrap(),
        Rot::TruncateAt(block) => file.set_len(block * BLOCK).unwrap(),
    }
}

/// Gives `block` of `layer` on `replica` other data with a matching
/// checksum: the replica differs from the others and cannot tell.
fn diverge(replica: &ReplicaProcess, layer: &str, block: u64) {
    let data = vec![0xa5; BS];
    let open = |name: String| {
        OpenOptions::new()
            .write(true)
            .open(replica.dir().join(name))
            .unwrap()
    };
    open(layer.to_string())
        .write_all_at(&data, block * BLOCK)
        .unwrap();
    open(format!("{layer}.crc"))
        .write_all_at(&crc32c::crc32c(&data).to_le_bytes(), block * 4)
        .unwrap();
}

/// Replicas with random writes all over [`REGION`], flushed; returns what
/// the volume must read and the blocks written.
async fn written_volume(replicas: &Replicas, engine: &Arc<Engine>) -> (Vec<u8>, Vec<u64>) {
    until_all_rw(engine, replicas.processes.len()).await;
    let model = Arc::new(Mutex::new(Model::new()));
    write_random(engine, &model, &mut Rng(0x5eed), REGION, 400, 8).await;
    engine.flush().await.unwrap();
    let expected = model.lock().unwrap().data.clone();
    let written = (0..REGION.end / BLOCK)
        .filter(|&b| expected[b as usize * BS..][..BS].iter().any(|&x| x != 0))
        .collect::<Vec<_>>();
    assert!(written.len() > 100, "{} blocks written", written.len());
    (expected, written)
}

/// Reads `block` through the engine once per replica (reads take turns
/// among them), each time expecting the acknowledged data.
async fn read_from_each(engine: &Engine, count: usize, block: u64, expected: &[u8]) {
    for i in 0..count {
        let data = engine.read(block * BLOCK, BS).await.unwrap();
        assert_same(
            &data,
            &expected[block as usize * BS..][..BS],
            &format!("block {block}, read {i}"),
        );
    }
}

/// Each replica read whole from its data port: a rotten block left would
/// fail the read there.
async fn assert_replicas_hold(replicas: &Replicas, expected: &[u8]) {
    for (i, address) in replicas.addresses().iter().enumerate() {
        let data = replicas.read(address).await;
        assert_same(&data[..expected.len()], expected, &format!("replica {i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotten_blocks_on_each_replica_are_read_from_a_good_copy_and_repaired() {
    require_root();
    let replicas = Replicas::start("vol-rot", 3).await;
    let engine = replicas.engine().await;
    let (expected, written) = written_volume(&replicas, &engine).await;
    let last = *written.last().unwrap();
    // Different blocks on each replica; block written[10] rotten on two.
    let damaged = [written[10], written[11], written[40], last];
    rot(&replicas.processes[0], Rot::Flip(written[10]));
    rot(&replicas.processes[0], Rot::Flip(written[11]));
    rot(&replicas.processes[1], Rot::Flip(written[10]));
    rot(&replicas.processes[1], Rot::Zero(written[40]));
    rot(&replicas.processes[2], Rot::TruncateAt(last));

    for block in damaged {
        read_from_each(&engine, 3, block, &expected).await;
    }
    let metrics = engine.metrics();
    assert_eq!(metrics.checksum_failed_bytes, 5 * BLOCK, "{metrics:?}");
    assert_eq!(metrics.repaired_bytes, 5 * BLOCK, "{metrics:?}");
    assert_eq!(metrics.unrecoverable_bytes, 0);
    // Read again, everything: nothing rotten is left anywhere.
    assert_same(
        &read_all(&*engine).await[..expected.len()],
        &expected,
        "volume",
    );
    assert_eq!(engine.metrics().checksum_failed_bytes, 5 * BLOCK);
    let status = engine.status().await;
    assert_eq!(modes(&status), [ReplicaMode::Rw; 3], "{status:#?}");
    drop(engine);
    assert_replicas_hold(&replicas, &expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_rotten_on_every_replica_fails_the_read_with_eio_not_data() {
    require_root();
    let replicas = Replicas::start("vol-rot-all", 2).await;
    let engine = replicas.engine().await;
    let (expected, written) = written_volume(&replicas, &engine).await;
    let lost = written[5];
    for replica in &replicas.processes {
        rot(replica, Rot::Flip(lost));
    }
    // Alone and inside a larger read: EIO, whichever replica is asked first.
    for (offset, len) in [(lost * BLOCK, BS), ((lost - lost % 8) * BLOCK, 8 * BS)] {
        for _ in 0..2 {
            let error = engine.read(offset, len).await.unwrap_err();
            assert_eq!(error.raw_os_error(), Some(nix::libc::EIO), "{error}");
        }
    }
    let metrics = engine.metrics();
    assert_eq!(metrics.unrecoverable_bytes, 4 * BLOCK, "{metrics:?}");
    assert_eq!(metrics.repaired_bytes, 0);
    // The rest of the volume reads, and both replicas stay in the I/O path.
    read_from_each(&engine, 2, written[6], &expected).await;
    let status = engine.status().await;
    assert_eq!(modes(&status), [ReplicaMode::Rw; 2], "{status:#?}");
    // Read straight from a replica, the block is refused, named.
    drop(engine);
    let access = replicas.access.lock().unwrap().clone();
    let connection = oxhorn::protocol::Connection::read_only(&replicas.addresses()[0], &access)
        .await
        .unwrap();
    match connection.read(lost * BLOCK, 4096).await {
        Err(ConnectionError::Corrupt { ranges, .. }) => {
            assert_eq!(ranges, [(lost * BLOCK, BLOCK)]);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// A scrub finds rot before any read does, in a snapshot layer and in the
/// head, and repairs it in place; a replica whose data differs from the
/// others' with valid checksums (as a bug would leave it), in the head or
/// in a snapshot, takes the majority's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scrub_repairs_every_layer_and_settles_a_replica_that_differs() {
    require_root();
    let replicas = Replicas::start("vol-scrub", 3).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    let model = Arc::new(Mutex::new(Model::new()));
    write_random(&engine, &model, &mut Rng(11), REGION, 300, 8).await;
    engine.snapshot("s1", true).await.unwrap();
    let head_blocks = Bytes::from(vec![0x5a; 8 * BS]);
    engine.write(64 * BLOCK, head_blocks.clone()).await.unwrap();
    model.lock().unwrap().apply(64 * BLOCK, &head_blocks);
    engine.flush().await.unwrap();
    let expected = model.lock().unwrap().data.clone();
    // A block only the snapshot holds, away from the head's writes.
    let in_snapshot = (1024..REGION.end / BLOCK)
        .find(|&b| expected[b as usize * BS..][..BS].iter().any(|&x| x != 0))
        .unwrap();

    rot_layer(
        &replicas.processes[0],
        "snap-s1.img",
        Rot::Flip(in_snapshot),
    );
    rot_layer(&replicas.processes[1], "head-2.img", Rot::Flip(66));
    diverge(&replicas.processes[2], "head-2.img", 67);
    // A snapshot block one replica holds otherwise, its checksum matching.
    let other_in_snapshot = (in_snapshot + 1..REGION.end / BLOCK)
        .find(|&b| expected[b as usize * BS..][..BS].iter().any(|&x| x != 0))
        .unwrap();
    diverge(&replicas.processes[1], "snap-s1.img", other_in_snapshot);

    assert!(engine.start_scrub(0));
    let status = crate::common::eventually(PATIENCE, || async {
        let status = engine.scrub_status();
        (!status.running).then_some(status)
    })
    .await
    .expect("the scrub ends");
    assert_eq!(status.error, "");
    assert_eq!(status.rotten_bytes, 2 * BLOCK, "{status:?}");
    assert_eq!(status.repaired_bytes, 2 * BLOCK, "{status:?}");
    assert_eq!(status.unrepaired_bytes, 0, "{status:?}");
    assert_eq!((status.mismatched_chunks, status.resolved_chunks), (2, 2));
    // Every replica's layers were read: the snapshot's blocks and the
    // head's, on three replicas.
    assert!(status.checked_bytes > 3 * 300 * BLOCK, "{status:?}");
    // Repaired in the snapshot layer itself, not just shadowed.
    for (replica, block) in [(0, in_snapshot), (1, other_in_snapshot)] {
        let path = replicas.processes[replica].dir().join("snap-s1.img");
        let snapshot = std::fs::read(path).unwrap();
        let at = block as usize * BS;
        assert_same(
            &snapshot[at..at + BS],
            &expected[at..at + BS],
            &format!("snapshot block {block} of replica {replica}"),
        );
    }
    assert!(
        engine.metrics().checksum_failed_bytes == 0,
        "no read met the rot"
    );
    drop(engine);
    assert_replicas_hold(&replicas, &expected).await;
}

/// A block rotten on one replica where the two others hold different
/// copies, both with valid checksums: no copy is known right, so the scrub
/// leaves the rotten block rotten (known bad, not made silently wrong) and
/// reports the chunk as unsettled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scrub_leaves_rot_alone_where_the_other_copies_disagree() {
    require_root();
    let replicas = Replicas::start("vol-scrub-split", 3).await;
    let engine = replicas.engine().await;
    let (expected, written) = written_volume(&replicas, &engine).await;
    let block = written[7];
    rot(&replicas.processes[0], Rot::Flip(block));
    diverge(&replicas.processes[2], "head-1.img", block);

    engine.run_scrub(0).await.unwrap();
    let status = engine.scrub_status();
    assert_eq!(
        (
            status.rotten_bytes,
            status.repaired_bytes,
            status.unrepaired_bytes
        ),
        (BLOCK, 0, BLOCK),
        "{status:?}"
    );
    assert_eq!((status.mismatched_chunks, status.resolved_chunks), (1, 0));
    drop(engine);
    let access = replicas.access.lock().unwrap().clone();
    let addresses = replicas.addresses();
    let first = oxhorn::protocol::Connection::read_only(&addresses[0], &access)
        .await
        .unwrap();
    assert!(
        matches!(
            first.read(block * BLOCK, 4096).await,
            Err(ConnectionError::Corrupt { .. })
        ),
        "the rotten block was overwritten with a copy no majority holds"
    );
    let second = oxhorn::protocol::Connection::read_only(&addresses[1], &access)
        .await
        .unwrap();
    let data = second.read(block * BLOCK, 4096).await.unwrap();
    assert_same(&data, &expected[block as usize * BS..][..BS], "replica 1");
}

/// A rebuild never copies a rotten block: its source refuses to hand it
/// over, the engine repairs the source from another replica's copy and
/// copies again, and the rebuilt replica holds the good data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_whose_source_has_a_rotten_block_copies_a_good_copy() {
    require_root();
    let replicas = Replicas::start("vol-rot-rebuild", 3).await;
    let addresses = replicas.addresses();
    // Replica 0 is the first RW replica: the rebuild's source.
    let engine = replicas.engine_on(&addresses[..2]).await;
    until_all_rw(&engine, 2).await;
    let model = Arc::new(Mutex::new(Model::new()));
    write_random(&engine, &model, &mut Rng(21), REGION, 300, 8).await;
    engine.snapshot("s1", true).await.unwrap();
    let expected = model.lock().unwrap().data.clone();
    let block = (0..REGION.end / BLOCK)
        .find(|&b| expected[b as usize * BS..][..BS].iter().any(|&x| x != 0))
        .unwrap();
    rot_layer(&replicas.processes[0], "snap-s1.img", Rot::Flip(block));

    engine.add_replica(&addresses[2]).await.unwrap();
    until_all_rw(&engine, 3).await;
    let scrub = engine.scrub_status();
    assert_eq!(scrub.repaired_bytes, BLOCK, "{scrub:?}");
    let copy = std::fs::read(replicas.processes[2].dir().join("snap-s1.img")).unwrap();
    let at = block as usize * BS;
    assert_same(
        &copy[at..at + BS],
        &expected[at..at + BS],
        "the rebuilt copy",
    );
    drop(engine);
    assert_replicas_hold(&replicas, &expected).await;
}

/// A replica killed with SIGKILL while writes are in flight may have a
/// block's data without its checksum, or the reverse: after its restart
/// every block it holds must read, none reported rotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_write_reads_back_without_a_false_alarm() {
    require_root();
    let mut replicas = Replicas::start("vol-rot-kill", 2).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 2).await;
    let model = Arc::new(Mutex::new(Model::new()));
    write_random(&engine, &model, &mut Rng(3), REGION, 100, 8).await;
    let writer = {
        let (engine, model) = (engine.clone(), model.clone());
        tokio::spawn(async move {
            write_random(&engine, &model, &mut Rng(4), REGION, 400, 8).await;
        })
    };
    let before = model.lock().unwrap().writes;
    crate::common::eventually(PATIENCE, || async {
        (model.lock().unwrap().writes > before + 20).then_some(())
    })
    .await
    .expect("writes under way");
    replicas.processes[1].kill();
    writer.await.unwrap();
    drop(engine);
    replicas.processes[1].start().unwrap();
    replicas.processes[1].wait_serving(PATIENCE).await.unwrap();
    // The whole replica, every checksum checked on the way.
    let address = &replicas.addresses()[1];
    let data = replicas.read(address).await;
    assert_eq!(data.len(), crate::dataplane::SIZE as usize);
    // Back in a volume (rebuilt from the other, which has every write), a
    // scrub finds nothing rotten and nothing that differs.
    let engine = replicas.engine().await;
    until_all_rw(&engine, 2).await;
    engine.run_scrub(0).await.unwrap();
    let scrub = engine.scrub_status();
    assert!(scrub.checked_bytes > 0, "{scrub:?}");
    assert_eq!(
        (scrub.rotten_bytes, scrub.mismatched_chunks),
        (0, 0),
        "{scrub:?}"
    );
}

/// With the scrub-interval Setting, a manager starts a scrub of an attached
/// volume once due; it rewrites a block one replica's disk damaged, the
/// Volume's status, an Event and the metrics say so, and the volume reads
/// as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_due_scrub_repairs_rot_and_the_volume_says_so() {
    require_root();
    let cluster = Cluster::start("scrub", 2).await;
    let node = cluster.nodes[0].node_id().to_owned();
    cluster.create_volume("vol", 32 * MIB, 2).await;
    let device = cluster.attach("vol", &node).await;
    let written = write_pattern(&device, 8 << 20, 7);
    let replica = &cluster.replicas_of("vol").await[0];
    let dir = replica_dir(cluster.node(&replica.spec.instance.node_id), replica);
    let head = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|f| f.starts_with("head-") && f.ends_with(".img"))
        .unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(head))
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, 100 * BLOCK + 9).unwrap();
    file.write_all_at(&[!byte[0]], 100 * BLOCK + 9).unwrap();

    // Due a minute after the volume's creation, no scrub having run.
    cluster.set("scrub-interval", "1").await;
    let scrubbed = cluster
        .until_volume("vol", "a scrub done", |s| {
            s.last_scrub.as_ref().is_some_and(|r| r.finished.is_some())
        })
        .await;
    let report = scrubbed.status.unwrap().last_scrub.unwrap();
    assert_eq!(report.rotten_bytes, BLOCK as i64, "{report:?}");
    assert_eq!(report.repaired_bytes, BLOCK as i64, "{report:?}");
    assert_eq!(report.unrepaired_bytes, 0, "{report:?}");
    assert!(report.checked_bytes >= 2 * (8 << 20), "{report:?}");
    assert!(
        cluster.event_reasons().await.contains("ScrubFoundDamage"),
        "{:?}",
        cluster.event_reasons().await
    );
    // The owner's /metrics says it too.
    let scraped = cluster.scrape();
    let repaired = scraped
        .lines()
        .find(|l| l.starts_with(r#"oxhorn_volume_last_scrub_repaired_bytes{volume="vol""#))
        .unwrap_or_else(|| panic!("no scrub series in\n{scraped}"));
    assert!(repaired.ends_with(" 4096"), "{repaired}");
    assert_eq!(read_device(&device, 8 << 20), written);
    cluster.detach("vol").await;
    cluster.delete_volume("vol").await;
}
