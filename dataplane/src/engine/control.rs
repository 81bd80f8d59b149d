//! The engine's control API (gRPC): status, snapshots, expansion, replicas,
//! I/O metrics.
//! The one place engine errors become gRPC codes.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{Engine, EngineError};
use crate::protocol::control::engine_control_server::EngineControl;
use crate::protocol::control::{
    AddReplicaRequest, EngineMetrics, EngineMetricsRequest, EngineStatus, EngineStatusRequest,
    ExpandRequest, RemoveReplicaRequest, RemoveSnapshotRequest, ScrubRequest,
    SetRebuildLimitRequest, SnapshotRequest,
};

#[cfg(test)]
mod tests;

pub struct EngineControlService {
    engine: Arc<Engine>,
    /// Where the frontend exposes the volume, if it has one.
    endpoint: String,
}

impl EngineControlService {
    pub fn new(engine: Arc<Engine>, endpoint: String) -> Self {
        Self { engine, endpoint }
    }

    async fn status(&self) -> EngineStatus {
        EngineStatus {
            endpoint: self.endpoint.clone(),
            ..self.engine.status().await
        }
    }
}

impl From<EngineError> for Status {
    fn from(error: EngineError) -> Self {
        let message = error.to_string();
        match error {
            EngineError::NoHealthyReplica => Status::unavailable(message),
            EngineError::InvalidAddress(..) | EngineError::CannotShrink(..) => {
                Status::invalid_argument(message)
            }
            EngineError::AlreadyMember(_) => Status::already_exists(message),
            EngineError::NotMember(_) => Status::not_found(message),
            EngineError::NoGoodCopy(_) => Status::data_loss(message),
            EngineError::Control(_, status) => Status::new(status.code(), message),
            EngineError::Replica(_) | EngineError::IoPathUnreachable { .. } => {
                Status::unavailable(message)
            }
            // The process's own failures end it; no call answers with them.
            EngineError::Config(_)
            | EngineError::Listen { .. }
            | EngineError::Frontend(_)
            | EngineError::Task(_)
            | EngineError::Serve(_) => Status::internal(message),
        }
    }
}

#[tonic::async_trait]
impl EngineControl for EngineControlService {
    async fn status(
        &self,
        _: Request<EngineStatusRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        Ok(Response::new(self.status().await))
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        let request = request.into_inner();
        self.engine
            .snapshot(&request.name, request.user_created)
            .await?;
        Ok(Response::new(self.status().await))
    }

    async fn remove_snapshot(
        &self,
        request: Request<RemoveSnapshotRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        self.engine
            .remove_snapshot(&request.into_inner().name)
            .await?;
        Ok(Response::new(self.status().await))
    }

    async fn expand(
        &self,
        request: Request<ExpandRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        self.engine.expand(request.into_inner().size).await?;
        Ok(Response::new(self.status().await))
    }

    async fn add_replica(
        &self,
        request: Request<AddReplicaRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        self.engine
            .add_replica(&request.into_inner().address)
            .await?;
        Ok(Response::new(self.status().await))
    }

    async fn remove_replica(
        &self,
        request: Request<RemoveReplicaRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        self.engine
            .remove_replica(&request.into_inner().address)
            .await?;
        Ok(Response::new(self.status().await))
    }

    async fn set_rebuild_limit(
        &self,
        request: Request<SetRebuildLimitRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        self.engine
            .set_rebuild_limit(request.into_inner().bytes_per_second);
        Ok(Response::new(self.status().await))
    }

    async fn scrub(
        &self,
        request: Request<ScrubRequest>,
    ) -> Result<Response<EngineStatus>, Status> {
        self.engine
            .start_scrub(request.into_inner().bytes_per_second);
        Ok(Response::new(self.status().await))
    }

    async fn metrics(
        &self,
        _: Request<EngineMetricsRequest>,
    ) -> Result<Response<EngineMetrics>, Status> {
        Ok(Response::new(self.engine.metrics()))
    }
}
