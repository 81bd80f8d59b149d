//! CSI Controller: turns CSI calls into Volume and Snapshot objects and
//! waits, bounded, for the controllers to converge on them. Volume ids are
//! Volume names; snapshot ids are Snapshot names.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use serde_json::json;
use tonic::{Request, Response, Status};
use tracing::{Instrument, info, info_span};

use super::capability;
use super::error::api_status;
use super::guard::VolumeLocks;
use super::parameters::{MIN_VOLUME_SIZE, VolumeParameters, volume_size};
use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use super::proto::*;
use super::snapshots;
use crate::controller::{Liveness, Settings};
use crate::datastore::Datastore;
use crate::names::object_name;
use crate::scheduler::{self, Cluster};
use crate::types::{
    AccessMode, CLONE_FOR, Condition, ConditionStatus, DataSource, InstanceState, Robustness,
    Snapshot, SnapshotSpec, Volume, VolumeSpec, VolumeState,
};

/// Longest volume name: replica names, labels and clone snapshot names add
/// to it and must stay within 63 characters.
const VOLUME_NAME_MAX: usize = 48;
/// The original CSI name of an object whose name had to be derived from it.
pub const CSI_NAME: &str = "oxhorn.io/csi-name";
/// Whether the volume was published read-only, to refuse an incompatible
/// second publish.
const PUBLISHED_READONLY: &str = "oxhorn.io/published-readonly";

const SCHEDULE_WAIT: Duration = Duration::from_secs(30);
const ATTACH_WAIT: Duration = Duration::from_secs(60);
const DELETE_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

pub struct ControllerService {
    pub(super) ds: Arc<Datastore>,
    pub(super) client: Client,
    pub(super) locks: VolumeLocks,
}

impl ControllerService {
    pub fn new(client: Client, ds: Arc<Datastore>, locks: VolumeLocks) -> Self {
        Self { ds, client, locks }
    }

    pub(super) fn volumes(&self) -> Api<Volume> {
        Api::namespaced(self.client.clone(), &self.ds.namespace)
    }

    pub(super) fn snapshots_api(&self) -> Api<Snapshot> {
        Api::namespaced(self.client.clone(), &self.ds.namespace)
    }

    /// CSI calls before the caches synced would decide on an empty view.
    pub(super) fn ready(&self) -> Result<(), Status> {
        if *self.ds.readiness().borrow() {
            Ok(())
        } else {
            Err(Status::unavailable(
                "the manager's caches are still syncing",
            ))
        }
    }

    pub(super) fn cached_volume(&self, id: &str) -> Option<Arc<Volume>> {
        self.ds
            .volumes
            .store
            .get(&ObjectRef::new(id).within(&self.ds.namespace))
    }

    pub(super) async fn get_volume(&self, id: &str) -> Result<Option<Volume>, Status> {
        self.volumes()
            .get_opt(id)
            .await
            .map_err(|e| api_status(&format!("volume {id}"), e))
    }

    /// Polls `check` against the caches until it answers, or DEADLINE_EXCEEDED
    /// saying what was awaited. `check` may also fail the wait.
    pub(super) async fn wait_for<T>(
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

    async fn create(&self, request: CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        let name = required(&request.name, "name")?;
        capability::check_all(&request.volume_capabilities)?;
        let parameters = VolumeParameters::parse(&request.parameters)?;
        let range = request.capacity_range.unwrap_or_default();
        let size = volume_size(range.required_bytes, range.limit_bytes)?;
        let id = object_name(name, VOLUME_NAME_MAX);
        let _guard = self.locks.try_lock(&id)?;
        let source = request.volume_content_source.and_then(|s| s.r#type);
        let data_source = self.data_source(&id, source.as_ref(), size).await?;
        let settings = self.settings();
        let wanted = Self::volume_spec(
            &settings,
            &parameters,
            size,
            &request.volume_capabilities,
            data_source,
        );
        match self.get_volume(&id).await? {
            Some(existing) => compatible(&existing, name, &wanted, range.limit_bytes)?,
            None => {
                self.create_volume_object(&id, name, wanted, source.as_ref())
                    .await?
            }
        }
        let volume = self.wait_scheduled(&id).await?;
        info!(volume = %id, size = volume.spec.size, "volume provisioned");
        Ok(CreateVolumeResponse {
            volume: Some(csi_volume(&volume, parameters.volume_context(), source)),
        })
    }

    fn settings(&self) -> Settings {
        Settings::read(&self.ds.settings.store, &self.ds.namespace)
    }

    fn volume_spec(
        settings: &Settings,
        parameters: &VolumeParameters,
        size: i64,
        capabilities: &[VolumeCapability],
        data_source: Option<DataSource>,
    ) -> VolumeSpec {
        VolumeSpec {
            size,
            number_of_replicas: parameters
                .number_of_replicas
                .unwrap_or(settings.default_replica_count),
            frontend: parameters.frontend,
            node_id: String::new(),
            data_locality: parameters.data_locality,
            stale_replica_timeout: parameters
                .stale_replica_timeout
                .unwrap_or(settings.stale_replica_timeout),
            from_backup: String::new(),
            disk_selector: parameters.disk_selector.clone(),
            node_selector: parameters.node_selector.clone(),
            replica_auto_balance: parameters.replica_auto_balance,
            access_mode: if capability::is_single_writer(capabilities) {
                AccessMode::Rwop
            } else {
                AccessMode::Rwo
            },
            data_source,
        }
    }

    /// The volume's `dataSource`: the snapshot to restore, or for a clone the
    /// snapshot of the source volume taken for it. Checks the source exists
    /// and fits in `size`.
    async fn data_source(
        &self,
        id: &str,
        source: Option<&Source>,
        size: i64,
    ) -> Result<Option<DataSource>, Status> {
        let (snapshot, source_size) = match source {
            None => return Ok(None),
            Some(Source::Snapshot(SnapshotSource { snapshot_id })) => {
                let snapshot = self.snapshots_api().get_opt(snapshot_id).await;
                let snapshot = snapshot
                    .map_err(|e| api_status(&format!("snapshot {snapshot_id}"), e))?
                    .ok_or_else(|| {
                        Status::not_found(format!("source snapshot {snapshot_id} does not exist"))
                    })?;
                let size = snapshot.status.as_ref().map_or(0, |s| s.size);
                (snapshot_id.clone(), size)
            }
            Some(Source::Volume(VolumeSource { volume_id })) => {
                let volume = self.get_volume(volume_id).await?.ok_or_else(|| {
                    Status::not_found(format!("source volume {volume_id} does not exist"))
                })?;
                (clone_snapshot_name(id), volume.spec.size)
            }
        };
        if source_size > size {
            return Err(Status::out_of_range(format!(
                "the source holds {source_size} bytes, more than the {size} bytes asked for"
            )));
        }
        Ok(Some(DataSource::Snapshot(snapshot)))
    }

    async fn create_volume_object(
        &self,
        id: &str,
        name: &str,
        spec: VolumeSpec,
        source: Option<&Source>,
    ) -> Result<(), Status> {
        if let Some(Source::Volume(VolumeSource { volume_id })) = source {
            self.snapshot_for_clone(id, volume_id).await?;
        }
        let mut volume = Volume::new(id, spec);
        if id != name {
            volume
                .annotations_mut()
                .insert(CSI_NAME.to_owned(), name.to_owned());
        }
        self.volumes()
            .create(&PostParams::default(), &volume)
            .await
            .map_err(|e| api_status(&format!("volume {id}"), e))?;
        info!(volume = %id, csi_name = %name, "volume created");
        Ok(())
    }

    /// A clone is a restore from a snapshot of the source taken for it; the
    /// volume controller deletes that snapshot once the clone is filled.
    async fn snapshot_for_clone(&self, id: &str, source: &str) -> Result<(), Status> {
        let name = clone_snapshot_name(id);
        let mut snapshot = Snapshot::new(
            &name,
            SnapshotSpec {
                volume: source.to_owned(),
            },
        );
        snapshot
            .labels_mut()
            .insert(CLONE_FOR.to_owned(), id.to_owned());
        match self
            .snapshots_api()
            .create(&PostParams::default(), &snapshot)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => Err(api_status(&format!("snapshot {name}"), e)),
        }
    }

    /// Waits for the first placement of the volume's replicas: done when every
    /// replica has a node and disk, an error saying why when one cannot.
    async fn wait_scheduled(&self, id: &str) -> Result<Arc<Volume>, Status> {
        self.wait_for(&format!("scheduling volume {id}"), SCHEDULE_WAIT, || {
            let Some(volume) = self.cached_volume(id) else {
                return Ok(None);
            };
            let conditions = volume.status.as_ref().map(|s| s.conditions.as_slice());
            let scheduled = conditions
                .unwrap_or_default()
                .iter()
                .find(|c| c.type_ == "Scheduled");
            match scheduled.map(|c| c.status) {
                Some(ConditionStatus::True) => Ok(Some(Arc::clone(&volume))),
                Some(ConditionStatus::False) => {
                    let c = scheduled.map(|c| (c.reason.as_str(), c.message.as_str()));
                    let (reason, message) = c.unwrap_or_default();
                    Err(Status::resource_exhausted(format!(
                        "volume {id} cannot be placed ({reason}): {message}"
                    )))
                }
                _ => Ok(None),
            }
        })
        .await
    }

    async fn delete(&self, request: DeleteVolumeRequest) -> Result<(), Status> {
        let id = required(&request.volume_id, "volume_id")?;
        let _guard = self.locks.try_lock(id)?;
        let Some(volume) = self.get_volume(id).await? else {
            return Ok(());
        };
        if !volume.spec.node_id.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {id} is attached to node {}; unpublish it first",
                volume.spec.node_id
            )));
        }
        if let Some(blocker) = snapshots::deletion_blocker(self, id).await? {
            return Err(Status::failed_precondition(blocker));
        }
        match self.volumes().delete(id, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(e) => return Err(api_status(&format!("volume {id}"), e)),
        }
        info!(volume = %id, "volume deletion requested");
        self.wait_for(&format!("deleting volume {id}"), DELETE_WAIT, || {
            Ok(self.cached_volume(id).is_none().then_some(()))
        })
        .await
    }

    async fn publish(
        &self,
        request: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, Status> {
        let id = required(&request.volume_id, "volume_id")?;
        let node = required(&request.node_id, "node_id")?;
        let capability = request
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        capability::check(capability).map_err(Status::invalid_argument)?;
        let _guard = self.locks.try_lock(id)?;
        let volume = self.existing_volume(id).await?;
        self.existing_node(node)?;
        let readonly = request.readonly.to_string();
        let published_readonly = volume.annotations().get(PUBLISHED_READONLY);
        match volume.spec.node_id.as_str() {
            "" => self.set_attachment(&volume, node, Some(&readonly)).await?,
            current if current == node => {
                if published_readonly.is_some_and(|r| *r != readonly) {
                    return Err(Status::already_exists(format!(
                        "volume {id} is published to {node} with readonly={}",
                        published_readonly.map_or("", String::as_str)
                    )));
                }
            }
            other => {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is attached to node {other}; a single-node volume cannot also attach to {node}"
                )));
            }
        }
        self.wait_attached(id, node).await?;
        Ok(ControllerPublishVolumeResponse {
            publish_context: HashMap::new(),
        })
    }

    async fn existing_volume(&self, id: &str) -> Result<Volume, Status> {
        self.get_volume(id)
            .await?
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    fn existing_node(&self, node: &str) -> Result<(), Status> {
        let key = ObjectRef::new(node).within(&self.ds.namespace);
        match self.ds.nodes.store.get(&key) {
            Some(_) => Ok(()),
            None => Err(Status::not_found(format!(
                "node {node} is not an oxhorn node"
            ))),
        }
    }

    /// Sets where the volume should be attached ("" detaches), with the
    /// publish's readonly flag, guarded by the volume's resourceVersion.
    async fn set_attachment(
        &self,
        volume: &Volume,
        node: &str,
        readonly: Option<&str>,
    ) -> Result<(), Status> {
        let id = volume.name_any();
        let patch = json!({
            "metadata": {
                "resourceVersion": volume.resource_version(),
                "annotations": {PUBLISHED_READONLY: readonly},
            },
            "spec": {"nodeID": node},
        });
        self.volumes()
            .patch(&id, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| api_status(&format!("volume {id}"), e))?;
        info!(volume = %id, node = %node, "volume attachment requested");
        Ok(())
    }

    async fn wait_attached(&self, id: &str, node: &str) -> Result<(), Status> {
        self.wait_for(
            &format!("attaching volume {id} to {node}"),
            ATTACH_WAIT,
            || {
                let volume = self.cached_volume(id);
                let status = volume.as_ref().and_then(|v| v.status.as_ref());
                Ok(status
                    .filter(|s| s.state == VolumeState::Attached && s.current_node_id == node)
                    .map(|_| ()))
            },
        )
        .await
    }

    async fn unpublish(&self, request: ControllerUnpublishVolumeRequest) -> Result<(), Status> {
        let id = required(&request.volume_id, "volume_id")?;
        let node = request.node_id.as_str();
        let _guard = self.locks.try_lock(id)?;
        let Some(volume) = self.get_volume(id).await? else {
            return Ok(());
        };
        let attached_to = volume.spec.node_id.as_str();
        if attached_to.is_empty() || (!node.is_empty() && attached_to != node) {
            return Ok(());
        }
        self.set_attachment(&volume, "", None).await?;
        self.wait_for(&format!("detaching volume {id}"), ATTACH_WAIT, || {
            let volume = self.cached_volume(id);
            let status = volume.as_ref().and_then(|v| v.status.as_ref());
            Ok(status
                .filter(|s| s.current_node_id.is_empty() && s.state != VolumeState::Detaching)
                .map(|_| ()))
        })
        .await
    }

    async fn validate(
        &self,
        request: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        let id = required(&request.volume_id, "volume_id")?;
        if request.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        self.existing_volume(id).await?;
        let refused: Vec<String> = request
            .volume_capabilities
            .iter()
            .filter_map(|c| capability::check(c).err())
            .collect();
        if !refused.is_empty() {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: refused.join("; "),
            });
        }
        VolumeParameters::parse(&request.parameters)?;
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context,
                volume_capabilities: request.volume_capabilities,
                parameters: request.parameters,
                mutable_parameters: HashMap::new(),
            }),
            message: String::new(),
        })
    }

    fn list(&self, request: &ListVolumesRequest) -> Result<ListVolumesResponse, Status> {
        let mut volumes = self.ds.volumes.store.state();
        volumes.sort_by_key(|v| v.name_any());
        let (page, next_token) = paginate(&volumes, request.max_entries, &request.starting_token)?;
        let entries = page
            .iter()
            .map(|v| list_volumes_response::Entry {
                volume: Some(csi_volume(v, HashMap::new(), None)),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: published_nodes(v),
                    volume_condition: Some(volume_condition(v)),
                }),
            })
            .collect();
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    fn capacity(&self, request: &GetCapacityRequest) -> Result<GetCapacityResponse, Status> {
        request
            .volume_capabilities
            .iter()
            .try_for_each(capability::check)
            .map_err(Status::invalid_argument)?;
        let parameters = VolumeParameters::parse(&request.parameters)?;
        let settings = self.settings();
        let template = Volume::new(
            "capacity",
            Self::volume_spec(&settings, &parameters, MIN_VOLUME_SIZE, &[], None),
        );
        let segments = request
            .accessible_topology
            .as_ref()
            .map(|t| t.segments.clone())
            .unwrap_or_default();
        let in_segment = |node: &crate::types::Node| in_topology(node, &segments);
        let nodes = self.ds.nodes.store.state();
        let replicas = self.ds.replicas.store.state();
        let liveness = Liveness::new(&self.ds);
        let node_up = |node: &str| liveness.is_up(node);
        let cluster = Cluster {
            nodes: &nodes,
            replicas: &replicas,
            node_up: &node_up,
        };
        let space =
            scheduler::schedulable_space(&cluster, &template, &settings.scheduler, &in_segment);
        Ok(GetCapacityResponse {
            available_capacity: space.iter().sum(),
            maximum_volume_size: space.iter().max().copied(),
            minimum_volume_size: Some(MIN_VOLUME_SIZE),
        })
    }

    fn get(&self, id: &str) -> Result<ControllerGetVolumeResponse, Status> {
        let volume = self
            .cached_volume(id)
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(csi_volume(&volume, HashMap::new(), None)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: published_nodes(&volume),
                volume_condition: Some(volume_condition(&volume)),
            }),
        })
    }

    async fn expand(
        &self,
        request: ControllerExpandVolumeRequest,
    ) -> Result<ControllerExpandVolumeResponse, Status> {
        let id = required(&request.volume_id, "volume_id")?;
        let range = request
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let size = volume_size(range.required_bytes, range.limit_bytes)?;
        let _guard = self.locks.try_lock(id)?;
        let volume = self.existing_volume(id).await?;
        let node_expansion_required = !capability::is_block(request.volume_capability.as_ref());
        if size <= volume.spec.size {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: volume.spec.size,
                node_expansion_required,
            });
        }
        let patch = json!({"spec": {"size": size}});
        self.volumes()
            .patch(id, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| api_status(&format!("volume {id}"), e))?;
        info!(volume = %id, from = volume.spec.size, to = size, "volume expansion requested");
        if !volume.spec.node_id.is_empty() {
            self.wait_engine_size(id, size).await?;
        }
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: size,
            node_expansion_required,
        })
    }

    /// An attached volume has grown when its running engine reports the size.
    async fn wait_engine_size(&self, id: &str, size: i64) -> Result<(), Status> {
        let engine = ObjectRef::new(&format!("{id}-e")).within(&self.ds.namespace);
        self.wait_for(&format!("growing volume {id}"), ATTACH_WAIT, || {
            let engine = self.ds.engines.store.get(&engine);
            let status = engine.as_ref().and_then(|e| e.status.as_ref());
            Ok(status
                .filter(|s| {
                    s.instance.current_state == InstanceState::Running && s.current_size >= size
                })
                .map(|_| ()))
        })
        .await
    }
}

/// A required string field, or INVALID_ARGUMENT naming it.
pub(super) fn required<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(value)
    }
}

pub(super) fn clone_snapshot_name(volume: &str) -> String {
    format!("{volume}-clone-source")
}

/// Whether an existing volume satisfies a repeated CreateVolume; if not,
/// ALREADY_EXISTS saying what differs.
fn compatible(
    existing: &Volume,
    name: &str,
    wanted: &VolumeSpec,
    limit: i64,
) -> Result<(), Status> {
    let id = existing.name_any();
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(Status::aborted(format!(
            "volume {id} is being deleted; retry later"
        )));
    }
    let same_name = existing
        .annotations()
        .get(CSI_NAME)
        .map_or(id == name, |n| n == name);
    let have = &existing.spec;
    let differs = [
        (!same_name, "it was created for another CSI name".to_owned()),
        (
            have.size < wanted.size || (limit > 0 && have.size > limit),
            format!("its size is {} bytes", have.size),
        ),
        (
            have.number_of_replicas != wanted.number_of_replicas,
            format!("it has {} replicas", have.number_of_replicas),
        ),
        (
            have.data_source != wanted.data_source,
            format!(
                "its data source is {:?}",
                have.data_source
                    .as_ref()
                    .map_or(String::new(), ToString::to_string)
            ),
        ),
        (
            have.disk_selector != wanted.disk_selector
                || have.node_selector != wanted.node_selector,
            "its selectors differ".to_owned(),
        ),
    ];
    let why: Vec<String> = differs
        .into_iter()
        .filter(|(d, _)| *d)
        .map(|(_, w)| w)
        .collect();
    if why.is_empty() {
        Ok(())
    } else {
        Err(Status::already_exists(format!(
            "volume {id} exists and does not match the request: {}",
            why.join("; ")
        )))
    }
}

fn csi_volume(
    volume: &Volume,
    volume_context: HashMap<String, String>,
    source: Option<Source>,
) -> super::proto::Volume {
    super::proto::Volume {
        capacity_bytes: volume.spec.size,
        volume_id: volume.name_any(),
        volume_context,
        content_source: source.map(|s| VolumeContentSource { r#type: Some(s) }),
        accessible_topology: Vec::new(),
    }
}

fn published_nodes(volume: &Volume) -> Vec<String> {
    let node = &volume.spec.node_id;
    if node.is_empty() {
        Vec::new()
    } else {
        vec![node.clone()]
    }
}

/// Abnormal while the volume's data is less protected than asked for.
pub(super) fn volume_condition(volume: &Volume) -> VolumeCondition {
    let robustness = volume
        .status
        .as_ref()
        .map_or(Robustness::Unknown, |s| s.robustness);
    let scheduled = volume
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Scheduled"));
    match robustness {
        Robustness::Degraded | Robustness::Faulted => VolumeCondition {
            abnormal: true,
            message: format!(
                "volume is {}: fewer healthy replicas than the {} asked for",
                format!("{robustness:?}").to_lowercase(),
                volume.spec.number_of_replicas
            ),
        },
        _ => match scheduled.filter(|c| c.status != ConditionStatus::True) {
            Some(Condition { message, .. }) => VolumeCondition {
                abnormal: true,
                message: format!("a replica cannot be placed: {message}"),
            },
            None => VolumeCondition {
                abnormal: false,
                message: "volume is healthy".to_owned(),
            },
        },
    }
}

/// Whether a node lies in a CSI topology segment (zone and region keys).
fn in_topology(node: &crate::types::Node, segments: &HashMap<String, String>) -> bool {
    let status = node.status.clone().unwrap_or_default();
    segments.iter().all(|(key, value)| match key.as_str() {
        crate::types::ZONE_LABEL => status.zone == *value,
        crate::types::REGION_LABEL => status.region == *value,
        _ => false,
    })
}

/// A page of `items` from the position `token` names (an index, so that a
/// token is checked, not trusted) and the token of the next page.
pub(super) fn paginate<'a, T>(
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
