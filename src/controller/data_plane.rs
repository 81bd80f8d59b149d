//! Clients of the data plane's control APIs: the engine controller's polls
//! and the volume controller's snapshot and fill work. Every failure is a
//! `DataPlane`/`DataPlaneConnect` error naming the process. Calls are bounded
//! so that a hung process fails a pass instead of stalling the volume for
//! good; a fill's copy is not, but HTTP/2 keepalive ends it if the peer
//! stops answering.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::ResourceExt;
use tonic::transport::Channel;

use crate::protocol::{Access, TokenChannel};

use super::ControllerError;
use crate::protocol::control::engine_control_client::EngineControlClient;
use crate::protocol::control::replica_control_client::ReplicaControlClient;
use crate::protocol::control::{
    EngineMetrics, EngineMetricsRequest, EngineStatus, EngineStatusRequest, ReplicaStatus,
    ReplicaStatusRequest,
};
use crate::types::{Engine, InstanceState, Replica};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Taking or removing a snapshot flushes, and removing one merges its data
/// into its child: seconds, not milliseconds, on a large volume.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A replica's control address: the port after its data port, while its
/// process runs.
pub fn replica_control_address(replica: &Replica) -> Option<String> {
    let status = replica.status.as_ref()?;
    let port = u16::try_from(status.port).ok()?;
    let control = crate::protocol::control_port(port)?;
    (status.current_state == InstanceState::Running && !status.ip.is_empty() && port > 0)
        .then(|| format!("{}:{control}", status.ip))
}

/// The engine's control address, while its process runs.
pub fn engine_control_address(engine: &Engine) -> Option<String> {
    let status = &engine.status.as_ref()?.instance;
    (status.current_state == InstanceState::Running && !status.ip.is_empty() && status.port > 0)
        .then(|| format!("{}:{}", status.ip, status.port))
}

/// A connected control client of one data-plane process, with its name and
/// address for errors.
pub struct Control<C> {
    pub client: C,
    target: String,
    address: String,
}

impl<C> Control<C> {
    /// Turns a refusal into an error naming the process.
    pub fn failed(&self, status: tonic::Status) -> ControllerError {
        ControllerError::DataPlane {
            target: self.target.clone(),
            address: self.address.clone(),
            status: Box::new(status),
        }
    }
}

impl Control<ReplicaControlClient<TokenChannel>> {
    /// The replica's chain, revision and flags.
    pub async fn status(&mut self) -> Result<ReplicaStatus, ControllerError> {
        let reply = self.client.status(ReplicaStatusRequest {}).await;
        reply
            .map(tonic::Response::into_inner)
            .map_err(|e| self.failed(e))
    }
}

impl Control<EngineControlClient<TokenChannel>> {
    /// The engine's replicas and snapshots.
    pub async fn status(&mut self) -> Result<EngineStatus, ControllerError> {
        let reply = self.client.status(EngineStatusRequest {}).await;
        reply
            .map(tonic::Response::into_inner)
            .map_err(|e| self.failed(e))
    }

    /// The engine's I/O counters and latency histograms.
    pub async fn metrics(&mut self) -> Result<EngineMetrics, ControllerError> {
        let reply = self.client.metrics(EngineMetricsRequest {}).await;
        reply
            .map(tonic::Response::into_inner)
            .map_err(|e| self.failed(e))
    }
}

/// The control API of `replica`'s process at `address`, called with
/// `access`; `timeout` bounds each call (None for a streamed copy).
pub async fn replica(
    replica: &Replica,
    address: &str,
    timeout: Option<Duration>,
    access: &Access,
) -> Result<Control<ReplicaControlClient<TokenChannel>>, ControllerError> {
    let target = format!("replica {}", replica.name_any());
    let channel = connect(&target, address, timeout).await?;
    Ok(Control {
        client: ReplicaControlClient::new(crate::protocol::with_token(channel, access)),
        target,
        address: address.to_owned(),
    })
}

/// The control API of `engine`'s process at `address`, for snapshot work.
pub async fn engine(
    engine: &Engine,
    address: &str,
    access: &Access,
) -> Result<Control<EngineControlClient<TokenChannel>>, ControllerError> {
    engine_with_timeout(engine, address, CALL_TIMEOUT, access).await
}

/// The control API of `engine`'s process at `address`; `timeout` bounds
/// each call.
pub async fn engine_with_timeout(
    engine: &Engine,
    address: &str,
    timeout: Duration,
    access: &Access,
) -> Result<Control<EngineControlClient<TokenChannel>>, ControllerError> {
    let target = format!("engine {}", engine.name_any());
    let channel = connect(&target, address, Some(timeout)).await?;
    Ok(engine_control(channel, target, address, access))
}

fn engine_control(
    channel: Channel,
    target: String,
    address: &str,
    access: &Access,
) -> Control<EngineControlClient<TokenChannel>> {
    Control {
        client: EngineControlClient::new(crate::protocol::with_token(channel, access)),
        target,
        address: address.to_owned(),
    }
}

/// Connections to the engines this manager polls, kept from one poll to
/// the next: a poll is then one request on an open HTTP/2 connection
/// rather than a TCP and HTTP/2 handshake for both sides each time. An
/// idle kept connection sends nothing (control channels ping only while a
/// call is in flight); each call is bounded by the timeout it was opened
/// with.
#[derive(Default)]
pub struct EngineChannels {
    /// Engine name -> (control address, channel).
    open: Mutex<HashMap<String, (String, Channel)>>,
}

impl EngineChannels {
    fn open(&self) -> MutexGuard<'_, HashMap<String, (String, Channel)>> {
        // A map of handles, left whole by any panicking holder.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The control API of `engine`'s process at `address`, on the kept
    /// connection if there is one to that address.
    pub async fn engine(
        &self,
        engine: &Engine,
        address: &str,
        timeout: Duration,
        access: &Access,
    ) -> Result<Control<EngineControlClient<TokenChannel>>, ControllerError> {
        let name = engine.name_any();
        let target = format!("engine {name}");
        let kept = self
            .open()
            .get(&name)
            .filter(|(at, _)| at == address)
            .map(|(_, channel)| channel.clone());
        let channel = match kept {
            Some(channel) => channel,
            None => {
                let channel = connect(&target, address, Some(timeout)).await?;
                let entry = (address.to_owned(), channel.clone());
                self.open().insert(name, entry);
                channel
            }
        };
        Ok(engine_control(channel, target, address, access))
    }

    /// Closes the connection to the engine `name`: it stopped, moved, or a
    /// call on it failed (the next poll dials afresh).
    pub fn forget(&self, name: &str) {
        self.open().remove(name);
    }
}

async fn connect(
    target: &str,
    address: &str,
    timeout: Option<Duration>,
) -> Result<Channel, ControllerError> {
    let failed = |source| ControllerError::DataPlaneConnect {
        target: target.to_owned(),
        address: address.to_owned(),
        source,
    };
    // With the data plane's keepalive: a peer that stops answering fails
    // the call, streamed copies included, instead of hanging the pass.
    let mut endpoint = crate::protocol::control_endpoint(address)
        .map_err(failed)?
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(timeout) = timeout {
        endpoint = endpoint.timeout(timeout);
    }
    endpoint.connect().await.map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EngineSpec, Frontend, InstanceSpec};

    #[tokio::test]
    async fn an_engine_that_cannot_be_reached_is_a_data_plane_failure() {
        // A port nothing listens on: bound, then released.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        drop(listener);
        let engine = Engine::new(
            "vol-e",
            EngineSpec {
                instance: InstanceSpec {
                    volume_name: "vol".into(),
                    volume_size: 1 << 20,
                    node_id: String::new(),
                    desire_state: Default::default(),
                    image: String::new(),
                },
                replica_address_map: Default::default(),
                frontend: Frontend::Fuse,
                chap_secret: String::new(),
                generation: 0,
                salvage: false,
                salvage_request: String::new(),
            },
        );
        let timeout = Duration::from_secs(5);
        let access = Access {
            volume: "vol".into(),
            key: crate::protocol::Key::generate(),
            generation: 0,
        };
        let Err(error) = engine_with_timeout(&engine, &address, timeout, &access).await else {
            panic!("connected to {address}, where nothing listens");
        };
        assert!(error.is_data_plane(), "{error}");
        assert!(error.to_string().contains("engine vol-e"), "{error}");
    }
}
