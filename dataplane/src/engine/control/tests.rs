//! The control API over gRPC, served as `oxhorn engine` serves it, by an
//! engine on three replicas on loopback, all in this process.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;

use super::EngineControlService;
use crate::engine::Engine;
use crate::frontend::BlockDevice;
use crate::protocol::control::engine_control_client::EngineControlClient;
use crate::protocol::control::engine_control_server::EngineControlServer;
use crate::protocol::control::{EngineMetricsRequest, LatencyHistogram};
use crate::protocol::{self, Access, Key, RequireToken, TokenChannel};
use crate::replica::{self, ReplicaConfig};

const VOLUME: &str = "metrics-test";
const SIZE: u64 = 16 << 20;
const KIB4: usize = 4096;

/// Replicas, an engine and its control API; all stop when it is dropped.
struct Served {
    engine: Arc<Engine>,
    client: EngineControlClient<TokenChannel>,
    stop: CancellationToken,
    _dirs: Vec<TempDir>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A loopback port whose successor (the replica's control port) is free
/// too. Another process may take it before the replica binds it: unlikely
/// enough for a test.
fn free_port_pair() -> u16 {
    loop {
        let first = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port + 1)).is_ok() {
            return port;
        }
    }
}

/// Starts a replica in `dir`; returns its data address once its control
/// port, bound after the data port, accepts connections.
async fn start_replica(dir: &TempDir, key: &Key, stop: &CancellationToken) -> String {
    let port = free_port_pair();
    let config = ReplicaConfig {
        volume: VOLUME.to_string(),
        dir: dir.path().join("replica"),
        size: SIZE,
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
    };
    let replica = replica::run_with_key(config, key.clone(), stop.clone().cancelled_owned());
    tokio::spawn(replica);
    for _ in 0..500 {
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port + 1))
            .await
            .is_ok()
        {
            return format!("127.0.0.1:{port}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("replica on port {port} never listened");
}

async fn serve() -> Served {
    let access = Access {
        volume: VOLUME.to_string(),
        key: Key::generate(),
        generation: 1,
    };
    let stop = CancellationToken::new();
    let dirs: Vec<TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut replicas = Vec::new();
    for dir in &dirs {
        replicas.push(start_replica(dir, &access.key, &stop).await);
    }
    let engine = Engine::start(&access, SIZE, &replicas, false)
        .await
        .unwrap();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = EngineControlService::new(Arc::clone(&engine), String::new());
    let server = Server::builder()
        .add_service(InterceptedService::new(
            EngineControlServer::new(service),
            RequireToken::new(access.key.clone()),
        ))
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            stop.clone().cancelled_owned(),
        );
    tokio::spawn(server);
    let channel = protocol::control_channel(&address.to_string())
        .await
        .unwrap();
    Served {
        engine,
        client: EngineControlClient::new(protocol::with_token(channel, &access)),
        stop,
        _dirs: dirs,
    }
}

/// A Prometheus histogram of `ops` observations over the fixed bounds.
fn assert_histogram(histogram: &LatencyHistogram, ops: u64) {
    let bounds = &histogram.bounds_ns;
    assert_eq!(bounds.len(), 18);
    assert_eq!((bounds[0], bounds[17]), (25_000, 10_000_000_000));
    assert!(bounds.is_sorted_by(|a, b| a < b), "{bounds:?}");
    let counts = &histogram.cumulative_counts;
    assert_eq!(counts.len(), bounds.len() + 1, "one more, +Inf");
    assert!(counts.is_sorted(), "cumulative: {counts:?}");
    assert_eq!(counts.last(), Some(&histogram.count), "+Inf is the count");
    assert_eq!(histogram.count, ops);
    assert!(histogram.sum_ns > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_frontends_ops_bytes_and_latencies() {
    let mut served = serve().await;
    let engine = &served.engine;
    for i in 0..8 {
        let data = Bytes::from(vec![i as u8 + 1; KIB4]);
        engine.write(i * 65536, data).await.unwrap();
    }
    engine
        .write(1 << 20, Bytes::from(vec![9; 256 << 10]))
        .await
        .unwrap();
    for i in 0..5 {
        let data = engine.read(i * 65536, KIB4).await.unwrap();
        assert_eq!(data[0], i as u8 + 1);
    }
    // Past the end: the replicas refuse it, the frontend gets an error.
    assert!(engine.read(SIZE, KIB4).await.is_err());
    engine.flush().await.unwrap();
    engine.flush().await.unwrap();
    engine.unmap(0, 65536).await.unwrap();

    let metrics = served
        .client
        .metrics(EngineMetricsRequest {})
        .await
        .unwrap()
        .into_inner();

    let write = metrics.write.unwrap();
    assert_eq!(
        (write.ops, write.bytes, write.errors),
        (9, 8 * 4096 + (256 << 10), 0)
    );
    assert_histogram(&write.latency.unwrap(), 9);
    let read = metrics.read.unwrap();
    assert_eq!((read.ops, read.bytes, read.errors), (6, 5 * 4096, 1));
    assert_histogram(&read.latency.unwrap(), 6);
    let flush = metrics.flush.unwrap();
    assert_eq!((flush.ops, flush.bytes, flush.errors), (2, 0, 0));
    assert_histogram(&flush.latency.unwrap(), 2);
    let unmap = metrics.unmap.unwrap();
    assert_eq!((unmap.ops, unmap.bytes, unmap.errors), (1, 65536, 0));
    assert!(unmap.latency.is_none());
}
