//! CSI Controller: turns CSI calls into Volume and Snapshot objects and
//! waits, bounded, for the controllers to converge on them. Volume ids are
//! Volume names; snapshot ids are Snapshot names. This file holds the service,
//! what its calls share, and the trait impl delegating to one file per
//! concern: volumes, publish, capacity, expand, snapshots, backups.

mod backups;
mod capacity;
mod expand;
mod publish;
mod snapshots;
mod volumes;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::Api;
use tonic::{Request, Response, Status};

use super::error::ControllerServiceError;
use super::guard::VolumeLocks;
use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::*;
use super::traced::traced;
use crate::datastore::Datastore;
use crate::datastore::Settings;
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
    fn ready(&self) -> Result<(), ControllerServiceError> {
        if *self.ds.readiness().borrow() {
            Ok(())
        } else {
            Err(ControllerServiceError::NotReady)
        }
    }

    async fn get_volume(&self, id: &str) -> Result<Option<Volume>, ControllerServiceError> {
        self.volumes()
            .get_opt(id)
            .await
            .map_err(|e| ControllerServiceError::api(format!("volume {id}"), e))
    }

    /// Polls `check` against the caches until it answers, or DEADLINE_EXCEEDED
    /// saying what was awaited. `check` may also fail the wait.
    async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<Option<T>, ControllerServiceError>,
    ) -> Result<T, ControllerServiceError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(done) = check()? {
                return Ok(done);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ControllerServiceError::Timeout {
                    what: what.to_owned(),
                    timeout,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn existing_volume(&self, id: &str) -> Result<Volume, ControllerServiceError> {
        self.get_volume(id)
            .await?
            .ok_or_else(|| ControllerServiceError::VolumeNotFound(id.to_owned()))
    }

    fn settings(&self) -> Settings {
        Settings::read(&self.ds.settings)
    }
}

/// A required string field, or INVALID_ARGUMENT naming it.
fn required<'a>(value: &'a str, field: &'static str) -> Result<&'a str, ControllerServiceError> {
    if value.is_empty() {
        Err(ControllerServiceError::Required(field))
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
) -> Result<(&'a [T], String), ControllerServiceError> {
    if max_entries < 0 {
        return Err(ControllerServiceError::InvalidArgument(
            "max_entries cannot be negative".into(),
        ));
    }
    let start = if token.is_empty() {
        0
    } else {
        token
            .parse::<usize>()
            .ok()
            .filter(|&i| i <= items.len())
            .ok_or_else(|| {
                ControllerServiceError::Aborted(format!("starting_token {token:?} is not valid"))
            })?
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
        Ok(Response::new(self.list(request.get_ref())?))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        self.ready()?;
        Ok(Response::new(self.capacity(request.get_ref())?))
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
        Ok(Response::new(snapshots::list(self, request.get_ref())?))
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        // Not advertised: csi-sanity v5.4 fails plugins that name the capability.
        Err(ControllerServiceError::Unimplemented(
            "GetSnapshot is not supported; use ListSnapshots",
        )
        .into())
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
        Ok(Response::new(self.get(id)?))
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(
            ControllerServiceError::Unimplemented("volume attribute classes are not supported")
                .into(),
        )
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
            let refused = paginate(&items, 1, forged);
            assert!(matches!(refused, Err(ControllerServiceError::Aborted(_))));
        }
        let negative = paginate(&items, -1, "");
        assert!(matches!(
            negative,
            Err(ControllerServiceError::InvalidArgument(_))
        ));
    }
}
