//! Bit rot rows: a replica's head layer file damaged behind its back once
//! the writer has stopped, the volume attached (bits flipped in some
//! blocks, others zeroed), on one
//! replica, and on two at different blocks. The writer's check then reads
//! every block through the engine: read repair must give the acknowledged
//! data wherever the engine asks a damaged replica. A scrub repairs what no
//! read met, and the row ends as every row does: more writes, the check,
//! and the replicas read whole (each block against its checksum) and
//! compared.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use oxhorn::protocol::control::{EngineMetricsRequest, ScrubRequest};
use oxhorn_testbed::Writer;

use super::{
    BLOCK, DataPlane, PHASE_WRITES, Row, SIZE, engine_control, until_acknowledged, writer_options,
};

/// Blocks each victim has damaged.
const DAMAGED: usize = 64;

/// Damages `DAMAGED` of the blocks holding data in `layer`: every
/// `stride`-th from the `first`-th (so victims differ), alternately one
/// flipped bit and the whole block zeroed. Returns how many it damaged.
fn damage(layer: &Path, first: usize, stride: usize) -> usize {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(layer)
        .unwrap();
    let image = std::fs::read(layer).unwrap();
    let block = BLOCK as usize;
    let held = image
        .chunks(block)
        .enumerate()
        .filter(|(_, data)| data.iter().any(|&b| b != 0))
        .map(|(i, _)| i);
    let victims: Vec<usize> = held.skip(first).step_by(stride).take(DAMAGED).collect();
    for (n, &victim) in victims.iter().enumerate() {
        let at = (victim * block) as u64;
        if n % 2 == 0 {
            let byte_at = at + (n * 37 % block) as u64;
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, byte_at).unwrap();
            file.write_all_at(&[byte[0] ^ 0x10], byte_at).unwrap();
        } else {
            file.write_all_at(&vec![0; block], at).unwrap();
        }
    }
    victims.len()
}

async fn rot(name: &'static str, prefix: &str, seed: u64, victims: &[usize]) {
    let mut row = Row::new(name);
    let plane = DataPlane::start(prefix, None).await;
    let writer = Writer::new(SIZE, writer_options(seed));
    let running = writer.start(&plane.device).unwrap();
    until_acknowledged(&writer, &running, 0, PHASE_WRITES).await;
    until_acknowledged(&writer, &running, writer.acknowledged(), PHASE_WRITES).await;
    let stats = running.stop();
    assert_eq!(stats.failed, 0, "{stats}");
    // Rotted once the writes stop, on the volume still attached: a write
    // after it would replace a rotten block, checksum and all, and leave
    // nothing to find (a slow machine writes fewer blocks, more of them
    // again).
    for (i, &victim) in victims.iter().enumerate() {
        let layer = plane.replicas[victim].dir().join("head-1.img");
        let damaged = damage(&layer, i, victims.len());
        assert!(damaged >= DAMAGED / 2, "replica {victim}: {damaged} blocks");
    }
    row.check_after_fault(writer.verify(&plane.device).unwrap(), || plane.logs());

    let mut control = engine_control(&plane.engine).await;
    control
        .scrub(ScrubRequest {
            bytes_per_second: 0,
        })
        .await
        .unwrap();
    let status = plane
        .until("the scrub done", |s| {
            s.scrub
                .as_ref()
                .is_some_and(|s| !s.running && s.finished_unix > 0)
        })
        .await;
    let scrub = status.scrub.unwrap();
    let metrics = control
        .metrics(EngineMetricsRequest {})
        .await
        .unwrap()
        .into_inner();
    eprintln!(
        "{name}: read repair: {} bytes failed their checksums, {} repaired, {} unrecoverable; scrub: {} checked, {} rotten, {} repaired, {} chunks differed",
        metrics.checksum_failed_bytes,
        metrics.repaired_bytes,
        metrics.unrecoverable_bytes,
        scrub.checked_bytes,
        scrub.rotten_bytes,
        scrub.repaired_bytes,
        scrub.mismatched_chunks
    );
    assert_eq!(metrics.unrecoverable_bytes, 0);
    assert_eq!(scrub.unrepaired_bytes, 0, "{scrub:?}");
    assert_eq!(scrub.error, "");
    assert!(
        metrics.repaired_bytes + scrub.repaired_bytes > 0,
        "nothing was found rotten"
    );
    plane.finish(row, &writer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rot_on_one_replica() {
    rot("bit rot on one replica", "fm-rot-one", 11, &[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rot_on_two_replicas_at_different_blocks() {
    rot("bit rot on two replicas", "fm-rot-two", 12, &[0, 2]).await;
}
