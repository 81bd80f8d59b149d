//! The instance manager's API (proto/instance.proto) served by the
//! `oxhorn instance-manager` process over its unix socket, and what a
//! manager's `remote` client shares with it: the message
//! conversions and the one mapping of errors to gRPC codes.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use super::local::Local;
use super::{InstanceError, InstanceInfo, InstanceManagerConfig, InstanceRequest};
use crate::types::InstanceState;

/// Code generated from proto/instance.proto.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("oxhorn.instance.v1");
}

use proto::instance_manager_server::{InstanceManager as Api, InstanceManagerServer};

pub(super) fn info_message(info: &InstanceInfo) -> proto::InstanceInfo {
    let state = serde_json::to_value(info.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    proto::InstanceInfo {
        state,
        ip: info.ip.to_string(),
        port: u32::from(info.port),
        pid: info.pid,
        restarts: info.restarts,
        message: info.message.clone(),
    }
}

pub(super) fn info_of(message: &proto::InstanceInfo) -> Result<InstanceInfo, InstanceError> {
    let malformed = |what: String| InstanceError::Remote {
        code: "InvalidArgument".into(),
        message: what,
    };
    let state: InstanceState =
        serde_json::from_value(serde_json::Value::from(message.state.as_str()))
            .map_err(|_| malformed(format!("unknown instance state {:?}", message.state)))?;
    Ok(InstanceInfo {
        state,
        ip: message
            .ip
            .parse()
            .map_err(|_| malformed(format!("malformed address {:?}", message.ip)))?,
        port: u16::try_from(message.port)
            .map_err(|_| malformed(format!("port {} out of range", message.port)))?,
        pid: message.pid,
        restarts: message.restarts,
        message: message.message.clone(),
    })
}

/// The one place instance errors become gRPC codes.
fn status(error: InstanceError) -> Status {
    let message = error.to_string();
    match error {
        InstanceError::InvalidName(_) | InstanceError::KindChanged { .. } => {
            Status::invalid_argument(message)
        }
        InstanceError::Stopping(_) => Status::failed_precondition(message),
        InstanceError::ShutDown => Status::unavailable(message),
        InstanceError::NoFreePort { .. } => Status::resource_exhausted(message),
        _ => Status::internal(message),
    }
}

struct Service {
    local: Arc<Local>,
}

type Events = Pin<Box<dyn Stream<Item = Result<proto::WatchEvent, Status>> + Send>>;

impl Service {
    fn update(&self, name: &str) -> proto::InstanceUpdate {
        proto::InstanceUpdate {
            name: name.to_string(),
            info: self.local.get(name).as_ref().map(info_message),
        }
    }

    fn snapshot(&self) -> proto::WatchEvent {
        proto::WatchEvent {
            snapshot: self.local.names().iter().map(|n| self.update(n)).collect(),
            update: None,
        }
    }
}

#[tonic::async_trait]
impl Api for Arc<Service> {
    async fn ensure_running(
        &self,
        request: Request<proto::EnsureRunningRequest>,
    ) -> Result<Response<proto::InstanceInfo>, Status> {
        let request: InstanceRequest =
            serde_json::from_slice(&request.into_inner().request_json)
                .map_err(|e| Status::invalid_argument(format!("instance request: {e}")))?;
        let info = self.local.ensure_running(request).map_err(status)?;
        Ok(Response::new(info_message(&info)))
    }

    async fn stop(
        &self,
        request: Request<proto::StopRequest>,
    ) -> Result<Response<proto::StopResponse>, Status> {
        self.local
            .stop(&request.into_inner().name)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::StopResponse {}))
    }

    type WatchStream = Events;

    /// Subscribes before the snapshot, so no change between the two is
    /// missed; a watcher that falls behind gets a new snapshot.
    async fn watch(
        &self,
        _: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let mut changes = self.local.subscribe();
        let (tx, rx) = mpsc::channel(64);
        let service = self.clone();
        tokio::spawn(async move {
            let mut event = service.snapshot();
            loop {
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
                event = match changes.recv().await {
                    Ok(name) => proto::WatchEvent {
                        snapshot: Vec::new(),
                        update: Some(service.update(&name)),
                    },
                    Err(broadcast::error::RecvError::Lagged(_)) => service.snapshot(),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Supervises the node's instances with `config` (adopting those a previous
/// instance manager left) and serves them on `listener` until `shutdown`
/// completes; the processes keep running after it.
pub async fn serve(
    config: InstanceManagerConfig,
    listener: UnixListener,
    shutdown: impl Future<Output = ()>,
) -> crate::Result<()> {
    let local = Arc::new(Local::start(config).await?);
    let service = Arc::new(Service {
        local: local.clone(),
    });
    tonic::transport::Server::builder()
        .add_service(InstanceManagerServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    local.shutdown().await;
    Ok(())
}
