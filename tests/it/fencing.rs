//! Who may write to a volume's replicas: only the newest engine generation,
//! only from the newest I/O path, and only with the volume's key.
//!
//! A second engine started on the same replicas: the first one's writes fail
//! and never land. Once an engine opens a new connection to a replica (a
//! re-add, or a restart with the same generation), nothing that arrives on
//! its older one is applied; a reader's connection supersedes nothing and may
//! only read. A replica that missed writes, the others lost: no engine serves
//! from it alone until the others are back, or an operator salvages. Every
//! data and control port refuses a caller without the volume's key, and an
//! engine refuses a replica of another volume.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use oxhorn::engine::{Engine, EngineError, control_address};
use oxhorn::frontend::BlockDevice;
use oxhorn::protocol::control::engine_control_client::EngineControlClient;
use oxhorn::protocol::control::replica_control_client::ReplicaControlClient;
use oxhorn::protocol::control::{EngineStatusRequest, ReplicaMode, ReplicaStatusRequest};
use oxhorn::protocol::{Access, Connection, ConnectionError, HandshakeError, Status};

use crate::dataplane::{
    BLOCK, Model, PATIENCE, Replicas, Rng, SIZE, WHOLE, access, assert_same, modes, read_all,
    until_all_rw, write_random,
};

fn block(fill: u8) -> Bytes {
    Bytes::from(vec![fill; BLOCK as usize])
}

/// Two engines on the same replicas, as when a volume moved while its old
/// node's engine kept running: once the newer one connected, every write of
/// the older fails, and none of them lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_engine_is_fenced_once_a_newer_one_connects() {
    let replicas = Replicas::start("vol-fenced", 2).await;
    let old = replicas.engine().await;
    until_all_rw(&old, 2).await;
    old.write(0, block(1)).await.unwrap();

    let new = replicas.engine().await;
    until_all_rw(&new, 2).await;
    let error = old.write(BLOCK, block(2)).await.unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::EIO), "{error}");
    assert_eq!(
        modes(&old.status().await),
        [ReplicaMode::Err, ReplicaMode::Err],
        "the old engine keeps no replica"
    );
    // Its reconnects are refused too.
    let retry = old.add_replica(&replicas.addresses()[0]).await.unwrap_err();
    assert!(
        matches!(
            retry,
            EngineError::Replica(ConnectionError::Refused {
                reason: HandshakeError::Fenced(_),
                ..
            })
        ),
        "{retry}"
    );

    assert_eq!(new.read(0, BLOCK as usize).await.unwrap(), block(1));
    assert_eq!(
        new.read(BLOCK, BLOCK as usize).await.unwrap(),
        block(0),
        "a fenced write landed"
    );
    new.write(BLOCK, block(3)).await.unwrap();
    drop((old, new));
    for address in replicas.addresses() {
        let data = replicas.read(&address).await;
        assert_eq!(
            &data[..2 * BLOCK as usize],
            &[[1; 4096], [3; 4096]].concat()
        );
    }
}

/// An engine that re-adds a replica, or restarts with the same generation,
/// opens a new connection: whatever still arrives on the old one (a write
/// left in the replica's receive buffer when the engine gave up on it) must
/// not land over what the rebuild copies through the new one. A reader
/// supersedes nothing and may only read.
#[tokio::test]
async fn a_superseded_connection_of_the_same_generation_writes_nothing() {
    let replicas = Replicas::start("vol-superseded", 1).await;
    let address = replicas.addresses()[0].clone();
    let access = replicas.next_access();
    let old = Connection::connect(&address, &access).await.unwrap();
    old.write(0, block(1)).await.unwrap();

    let new = Connection::connect(&address, &access).await.unwrap();
    let refused = old.write(BLOCK, block(2)).await.unwrap_err();
    assert!(
        matches!(
            refused,
            ConnectionError::Remote {
                status: Status::Fenced,
                ..
            }
        ),
        "{refused}"
    );
    assert!(old.unmap(0, BLOCK as u32).await.is_err(), "an old discard");

    let reader = Connection::read_only(&address, &access).await.unwrap();
    assert_eq!(reader.read(0, BLOCK as u32).await.unwrap(), block(1));
    let refused = reader.write(0, block(3)).await.unwrap_err();
    assert!(refused.to_string().contains("read-only"), "{refused}");
    new.write(2 * BLOCK, block(4)).await.unwrap();
    assert_eq!(
        new.read(0, 3 * BLOCK as u32).await.unwrap(),
        [block(1), block(0), block(4)].concat(),
        "only the newest connection's writes landed"
    );
}

/// Replica C dies under writes, A and B take the writes that follow, the
/// engine dies, and only C comes back: C must not serve. Once A and B are
/// back, the volume serves every acknowledged write and C is rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_missed_writes_never_serves_them() {
    let mut replicas = Replicas::start("vol-stale", 3).await;
    let addresses = replicas.addresses();
    let engine = replicas.engine().await;
    until_all_rw(&engine, 3).await;
    let model = Arc::new(Mutex::new(Model::new()));
    let mut rng = Rng(0xc0ffee);
    write_random(&engine, &model, &mut rng, WHOLE, 100, 8).await;
    replicas.processes[2].kill();
    write_random(&engine, &model, &mut rng, WHOLE, 200, 8).await;
    assert_eq!(
        modes(&engine.status().await),
        [ReplicaMode::Rw, ReplicaMode::Rw, ReplicaMode::Err]
    );
    drop(engine);
    replicas.processes[0].kill();
    replicas.processes[1].kill();

    replicas.processes[2].start().unwrap();
    replicas.processes[2].wait_serving(PATIENCE).await.unwrap();
    let refused = Engine::start(&replicas.next_access(), SIZE, &addresses, false).await;
    let Err(EngineError::IoPathUnreachable { missing, .. }) = refused else {
        panic!("an engine served from the stale replica alone");
    };
    assert_eq!(missing.len(), 2, "{missing:?}");

    for replica in &mut replicas.processes[..2] {
        replica.start().unwrap();
        replica.wait_serving(PATIENCE).await.unwrap();
    }
    let engine = replicas.engine().await;
    let expected = model.lock().unwrap().data.clone();
    assert_same(&read_all(&*engine).await, &expected, "volume");
    until_all_rw(&engine, 3).await;
    drop(engine);
    for address in &addresses {
        assert_same(&replicas.read(address).await, &expected, address);
    }
}

/// Salvage is the operator's way out when the newest I/O path is gone for
/// good: the engine serves what it reaches, and says it.
#[tokio::test]
async fn salvage_serves_what_is_left() {
    let mut replicas = Replicas::start("vol-salvage", 2).await;
    let addresses = replicas.addresses();
    let engine = replicas.engine().await;
    until_all_rw(&engine, 2).await;
    engine.write(0, block(7)).await.unwrap();
    replicas.processes[1].kill();
    engine.write(BLOCK, block(8)).await.unwrap();
    drop(engine);
    replicas.processes[0].kill();
    replicas.processes[1].start().unwrap();
    replicas.processes[1].wait_serving(PATIENCE).await.unwrap();

    let access = replicas.next_access();
    assert!(
        Engine::start(&access, SIZE, &addresses, false)
            .await
            .is_err()
    );
    let engine = Engine::start(&replicas.next_access(), SIZE, &addresses, true)
        .await
        .unwrap();
    let status = engine.status().await;
    assert_eq!(
        modes(&status),
        [ReplicaMode::Rw, ReplicaMode::Err],
        "{status:#?}"
    );
    assert_eq!(engine.read(0, BLOCK as usize).await.unwrap(), block(7));
    assert_eq!(
        engine.read(BLOCK, BLOCK as usize).await.unwrap(),
        block(0),
        "salvage serves the stale replica's data, as the operator accepted"
    );
}

/// Every port of the data plane refuses whoever lacks the volume's key, and
/// an engine refuses a replica of another volume.
#[tokio::test]
async fn the_data_plane_admits_only_its_own() {
    let replicas = Replicas::start("vol-own", 1).await;
    let address = replicas.addresses()[0].clone();
    let stranger = access("vol-own");
    let Err(refused) = Connection::connect(&address, &stranger).await else {
        panic!("a connection without the volume's key was admitted");
    };
    assert!(
        matches!(
            refused,
            ConnectionError::Refused {
                reason: HandshakeError::Denied(_),
                ..
            }
        ),
        "{refused}"
    );

    let control = control_address(&address).unwrap();
    let channel = oxhorn::protocol::control_channel(&control).await.unwrap();
    let plain = ReplicaControlClient::new(channel.clone())
        .status(ReplicaStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(plain.code(), tonic::Code::Unauthenticated, "{plain}");
    let wrong = ReplicaControlClient::new(oxhorn::protocol::with_token(channel, &stranger))
        .status(ReplicaStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong}");

    // A replica of another volume: its key is another.
    let other = Replicas::start("vol-other", 1).await;
    let engine = replicas.engine().await;
    until_all_rw(&engine, 1).await;
    let error = engine.add_replica(&other.addresses()[0]).await.unwrap_err();
    assert!(
        matches!(
            error,
            EngineError::Replica(ConnectionError::Refused {
                reason: HandshakeError::Denied(_),
                ..
            })
        ),
        "{error}"
    );
    assert_eq!(engine.status().await.replicas.len(), 1);

    // The same key under another volume's name is refused as well.
    let mut renamed = replicas.access.lock().unwrap().clone();
    renamed.volume = "vol-other".into();
    assert!(Connection::connect(&address, &renamed).await.is_err());
}

/// An engine process's control port wants the key too. (Multi-threaded:
/// `stop` blocks its thread while the engine's graceful shutdown waits for
/// this test's HTTP/2 connections to close.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_control_port_refuses_calls_without_the_key() {
    crate::common::require_root();
    let work = tempfile::tempdir().unwrap();
    let replicas = Replicas::start("vol-engine-key", 1).await;
    let access: Access = replicas.next_access();
    let mut engine = oxhorn_testbed::EngineProcess::spawn(
        std::path::Path::new(crate::common::OXHORN),
        work.path(),
        &access,
        SIZE,
        &replicas.addresses(),
    )
    .unwrap();
    engine.wait_device(PATIENCE).await.unwrap();
    let channel = oxhorn::protocol::control_channel(&engine.control)
        .await
        .unwrap();
    let refused = EngineControlClient::new(channel)
        .status(EngineStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    let status = engine
        .client()
        .await
        .unwrap()
        .status(EngineStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.volume, "vol-engine-key");
    let exit = engine
        .stop()
        .unwrap_or_else(|e| panic!("{e}:\n{}", engine.log()));
    assert!(exit.success(), "engine exit {exit}:\n{}", engine.log());
}
