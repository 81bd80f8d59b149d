//! CSI Controller: turns CSI calls into Volume and Snapshot objects and
//! waits, bounded, for the controllers to converge on them. Volume ids are
//! Volume names; snapshot ids are Snapshot names. This file holds the service,
//! what its calls share, and the trait impl delegating to one file per
//! concern: volumes, publish, capacity, expand, snapshots.

mod capacity;
mod expand;
mod publish;
mod snapshots;
mod volumes;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tonic::{Request, Response, Status};
use tracing::{Instrument, info, info_span};

use super::error::api_status;
use super::guard::VolumeLocks;
use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::*;
use crate::controller::Settings;
use crate::datastore::Datastore;
use crate::types::{Snapshot, Volume};

/// The original CSI name of an object whose name had to be derived from it.
const CSI_NAME: &str = "oxhorn.io/csi-name";

const POLL: Duration = Duration::from_millis(100);

pub struct ControllerService {
    ds: Arc<Datastore>,
    client: Client,
    locks: VolumeLocks,
}

impl ControllerService {
    pub fn new(client: Client, ds: Arc<Datastore>, locks: VolumeLocks) -> Self {
        Self { ds, client, locks }
    }

    fn volumes(&self) -> Api<Volume> {
        Api::namespaced(self.client.clone(), &self.ds.namespace)
    }

    fn snapshots_api(&self) -> Api<Snapshot> {
        Api::namespaced(self.client.clone(), &self.ds.namespace)
    }

    /// CSI calls before the caches synced would decide on an empty view.
    fn ready(&self) -> Result<(), Status> {
        if *self.ds.readiness().borrow() {
            Ok(())
        } else {
            Err(Status::unavailable(
                "the manager's caches are still syncing",
            ))
        }
    }

    fn cached_volume(&self, id: &str) -> Option<Arc<Volume>> {
        self.ds
            .volumes
            .store
            .get(&ObjectRef::new(id).within(&self.ds.namespace))
    }

    async fn get_volume(&self, id: &str) -> Result<Option<Volume>, Status> {
        self.volumes()
            .get_opt(id)
            .await
            .map_err(|e| api_status(&format!("volume {id}"), e))
    }

    /// Polls `check` against the caches until it answers, or DEADLINE_EXCEEDED
    /// saying what was awaited. `check` may also fail the wait.
    async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<Option<T>, Status>,
    ) -> Result<T, Status> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(done) = check()? {
                return Ok(done);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Status::deadline_exceeded(format!(
                    "{what}: not done after {timeout:?}; the call can be retried"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn existing_volume(&self, id: &str) -> Result<Volume, Status> {
        self.get_volume(id)
            .await?
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    fn settings(&self) -> Settings {
        Settings::read(&self.ds.settings.store, &self.ds.namespace)
    }
}

/// A required string field, or INVALID_ARGUMENT naming it.
fn required<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(value)
    }
}

/// A page of `items` from the position `token` names (an index, so that a
/// token is checked, not trusted) and the token of the next page.
fn paginate<'a, T>(
    items: &'a [T],
    max_entries: i32,
    token: &str,
) -> Result<(&'a [T], String), Status> {
    if max_entries < 0 {
        return Err(Status::invalid_argument("max_entries cannot be negative"));
    }
    let start = if token.is_empty() {
        0
    } else {
        token
            .parse::<usize>()
            .ok()
            .filter(|&i| i <= items.len())
            .ok_or_else(|| Status::aborted(format!("starting_token {token:?} is not valid")))?
    };
    let rest = &items[start..];
    let take = match usize::try_from(max_entries) {
        Ok(0) | Err(_) => rest.len(),
        Ok(n) => n.min(rest.len()),
    };
    let next = if take < rest.len() {
        (start + take).to_string()
    } else {
        String::new()
    };
    Ok((&rest[..take], next))
}

fn rpc_capability(kind: rpc::Type) -> ControllerServiceCapability {
    ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc {
                r#type: kind.into(),
            },
        )),
    }
}

/// Runs a call in a span naming its volume, logging its outcome: the CO
/// retries quietly, so the log is where a stuck or failing call shows.
async fn traced<T>(
    call: &'static str,
    volume: &str,
    work: impl Future<Output = Result<T, Status>>,
) -> Result<Response<T>, Status> {
    let span = info_span!("csi", call, volume = %volume);
    async move {
        let started = std::time::Instant::now();
        info!("call started");
        let result = work.await;
        match &result {
            Ok(_) => info!(elapsed = ?started.elapsed(), "call succeeded"),
            Err(status) => info!(elapsed = ?started.elapsed(), code = ?status.code(), message = status.message(), "call failed"),
        }
        result.map(Response::new)
    }
    .instrument(span)
    .await
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        let name = request.name.clone();
        traced("CreateVolume", &name, self.create(request)).await
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        let id = request.volume_id.clone();
        traced("DeleteVolume", &id, async {
            self.delete(request).await.map(|()| DeleteVolumeResponse {})
        })
        .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        let id = request.volume_id.clone();
        traced("ControllerPublishVolume", &id, self.publish(request)).await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        let id = request.volume_id.clone();
        traced("ControllerUnpublishVolume", &id, async {
            self.unpublish(request)
                .await
                .map(|()| ControllerUnpublishVolumeResponse {})
        })
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        let id = request.volume_id.clone();
        traced("ValidateVolumeCapabilities", &id, self.validate(request)).await
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        self.ready()?;
        self.list(request.get_ref()).map(Response::new)
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        self.ready()?;
        self.capacity(request.get_ref()).map(Response::new)
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            rpc::Type::CreateDeleteVolume,
            rpc::Type::PublishUnpublishVolume,
            rpc::Type::ListVolumes,
            rpc::Type::GetCapacity,
            rpc::Type::CreateDeleteSnapshot,
            rpc::Type::ListSnapshots,
            rpc::Type::CloneVolume,
            rpc::Type::PublishReadonly,
            rpc::Type::ExpandVolume,
            rpc::Type::ListVolumesPublishedNodes,
            rpc::Type::VolumeCondition,
            rpc::Type::GetVolume,
            rpc::Type::SingleNodeMultiWriter,
        ];
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: capabilities.into_iter().map(rpc_capability).collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        let id = request.source_volume_id.clone();
        traced("CreateSnapshot", &id, snapshots::create(self, request)).await
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        traced("DeleteSnapshot", "", snapshots::delete(self, request)).await
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        self.ready()?;
        snapshots::list(self, request.get_ref()).map(Response::new)
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        // Not advertised: csi-sanity v5.4 fails plugins that name the capability.
        Err(Status::unimplemented(
            "GetSnapshot is not supported; use ListSnapshots",
        ))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        self.ready()?;
        let request = request.into_inner();
        let id = request.volume_id.clone();
        traced("ControllerExpandVolume", &id, self.expand(request)).await
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        self.ready()?;
        let id = required(&request.get_ref().volume_id, "volume_id")?;
        self.get(id).map(Response::new)
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "volume attribute classes are not supported",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_index_tokens_and_refuse_forged_ones() {
        let items: Vec<u32> = (0..5).collect();
        let (page, next) = paginate(&items, 2, "").unwrap();
        assert_eq!((page, next.as_str()), (&[0, 1][..], "2"));
        let (page, next) = paginate(&items, 2, &next).unwrap();
        assert_eq!((page, next.as_str()), (&[2, 3][..], "4"));
        let (page, next) = paginate(&items, 0, &next).unwrap();
        assert_eq!((page, next.as_str()), (&[4][..], ""));
        for forged in ["invalid-token", "6", "-1"] {
            assert_eq!(
                paginate(&items, 1, forged).unwrap_err().code(),
                tonic::Code::Aborted
            );
        }
        assert_eq!(
            paginate(&items, -1, "").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
