//! A rebuild under its bandwidth limit, interrupted twice: first its target
//! replica is killed, then its source. Each next attempt copies only what
//! the ones before had not, and the rebuilt replica reads like the others.

use std::sync::{Arc, Mutex};

use oxhorn::engine::Engine;
use oxhorn::protocol::control::{EngineReplica, ReplicaMode};

use crate::common::eventually;
use crate::dataplane::{
    Model, PATIENCE, Replicas, Rng, SIZE, WHOLE, assert_same, read_all, until_all_rw, write_random,
};

/// Slow enough that a rebuild of the test's data is still under way when
/// the test interrupts it.
const LIMIT: u64 = 8 << 20;

/// The engine's report of the replica at `address`.
async fn replica(engine: &Engine, address: &str) -> EngineReplica {
    let status = engine.status().await;
    status
        .replicas
        .into_iter()
        .find(|r| r.address == address)
        .unwrap_or_else(|| panic!("replica {address} is not in the engine's status"))
}

/// Waits until the rebuild of `address` has copied at least `bytes` and
/// returns how much it reports copied then, with the rebuild's total.
async fn until_copied(engine: &Engine, address: &str, bytes: u64) -> (u64, u64) {
    let reached = eventually(PATIENCE, || async {
        let r = replica(engine, address).await;
        let copying = r.rebuilding && r.rebuild_bytes_done >= bytes;
        // A running rebuild names the replica it copies from.
        assert!(
            !copying || (!r.rebuild_source.is_empty() && r.rebuild_source != address),
            "{r:?}"
        );
        copying.then_some((r.rebuild_bytes_done, r.rebuild_bytes_total))
    })
    .await;
    match reached {
        Ok(reached) => reached,
        Err(e) => panic!("{e}: {:#?}", engine.status().await),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interrupted_rebuild_resumes_where_it_stopped() {
    let mut replicas = Replicas::start("vol-resume", 3).await;
    let addresses = replicas.addresses();
    let (other, target) = (&addresses[1], &addresses[2]);
    let engine = replicas.engine_on(&addresses[..2]).await;
    until_all_rw(&engine, 2).await;
    let model = Arc::new(Mutex::new(Model::new()));
    let mut rng = Rng(0x5eed);
    // Data in a snapshot the target does not have: it is staged there.
    write_random(&engine, &model, &mut rng, WHOLE, 400, 8).await;
    engine.snapshot("before", true).await.unwrap();
    engine.set_rebuild_limit(LIMIT);

    // The target killed a third of the way through.
    engine.add_replica(target).await.unwrap();
    let (first, total) = until_copied(&engine, target, SIZE / 6).await;
    replicas.processes[2].kill();
    replicas.processes[2].start().unwrap();
    replicas.processes[2].wait_serving(PATIENCE).await.unwrap();
    eventually(PATIENCE, || async {
        (replica(&engine, target).await.mode() == ReplicaMode::Err).then_some(())
    })
    .await
    .expect("the killed target out of the I/O path");

    // Its source killed a while into the second attempt. The engine's
    // first RW replica is the source: the target's rebuild fails with it.
    engine.add_replica(target).await.unwrap();
    let (second, _) = until_copied(&engine, target, SIZE / 12).await;
    replicas.processes[0].kill();
    let failed = eventually(PATIENCE, || async {
        let r = replica(&engine, target).await;
        (r.mode() == ReplicaMode::Err && !r.rebuilding).then_some(r.last_error)
    })
    .await
    .expect("the rebuild failed with its source");
    assert!(failed.contains("rebuild failed"), "{failed}");

    // The third attempt, from the other replica, copies what is left.
    engine.set_rebuild_limit(0);
    engine.add_replica(target).await.unwrap();
    eventually(PATIENCE, || async {
        (replica(&engine, target).await.mode() == ReplicaMode::Rw).then_some(())
    })
    .await
    .expect("the target rebuilt");
    let copied = replica(&engine, target).await.last_rebuild_bytes_copied;
    println!(
        "resume: {total} bytes to copy; {first} copied before the target was killed, \
         {second} before the source was, {copied} by the last attempt"
    );
    assert!(
        copied > 0 && copied + first + second <= total,
        "the last attempt copied {copied} of {total}, after {first} and {second}"
    );

    let expected = model.lock().unwrap().data.clone();
    assert_same(
        &read_all(&*engine).await,
        &expected,
        "volume after the rebuild",
    );
    drop(engine);
    for address in [other, target] {
        assert_same(&replicas.read(address).await, &expected, address);
    }
}
