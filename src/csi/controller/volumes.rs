//! CreateVolume, DeleteVolume, ListVolumes, ControllerGetVolume and
//! ValidateVolumeCapabilities: a CSI volume is a Volume object.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use tracing::info;

use super::backups::backup_of;
use super::{CSI_NAME, ControllerService, paginate, required, snapshots};
use crate::csi::capability;
use crate::csi::error::ControllerServiceError;
use crate::csi::parameters::{VolumeParameters, claim_of, volume_size};
use crate::csi::proto::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use crate::csi::proto::*;
use crate::datastore::{Settings, create_if_absent, unless_gone};
use crate::names::object_name;
use crate::types::{
    AccessMode, Backup, Condition, ConditionStatus, DataSource, PVC_NAME, PVC_NAMESPACE,
    Robustness, VOLUME_NAME_MAX, Volume, VolumeSpec, clone_source,
};

const SCHEDULE_WAIT: Duration = Duration::from_secs(30);
const DELETE_WAIT: Duration = Duration::from_secs(30);

impl ControllerService {
    pub(super) async fn create(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, ControllerServiceError> {
        let name = required(&request.name, "name")?;
        capability::check_all(&request.volume_capabilities)?;
        let parameters = VolumeParameters::parse(&request.parameters)?;
        let range = request.capacity_range.unwrap_or_default();
        let size = volume_size(range.required_bytes, range.limit_bytes)?;
        let id = object_name(name, VOLUME_NAME_MAX);
        let _guard = self.locks.try_lock(&id)?;
        let source = request.volume_content_source.and_then(|s| s.r#type);
        if source.is_some() && !parameters.from_backup.is_empty() {
            return Err(ControllerServiceError::InvalidArgument(
                "a volume restores from its content source or from the class's fromBackup, not both"
                    .into(),
            ));
        }
        let filled_from = self.data_source(&id, source.as_ref(), size).await?;
        let settings = self.settings();
        let mut wanted = Self::volume_spec(
            &settings,
            &parameters,
            size,
            &request.volume_capabilities,
            None,
        );
        match filled_from {
            Some(FilledFrom::Snapshot(source)) => wanted.data_source = Some(source),
            Some(FilledFrom::Backup(backup)) => wanted.from_backup = backup,
            None => {}
        }
        match self.get_volume(&id).await? {
            Some(existing) => compatible(&existing, name, &wanted, range.limit_bytes)?,
            None => {
                let claim = claim_of(&request.parameters);
                let labels = parameters.recurring_jobs.clone();
                self.create_volume_object(&id, name, wanted, source.as_ref(), claim, labels)
                    .await?
            }
        }
        let volume = self.wait_scheduled(&id).await?;
        info!(volume = %id, size = volume.spec.size, "volume provisioned");
        Ok(CreateVolumeResponse {
            volume: Some(csi_volume(&volume, parameters.volume_context(), source)),
        })
    }

    pub(super) fn volume_spec(
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
            chap_secret: parameters.chap_secret.clone(),
            node_id: String::new(),
            data_locality: parameters.data_locality,
            stale_replica_timeout: parameters
                .stale_replica_timeout
                .unwrap_or(settings.stale_replica_timeout),
            from_backup: parameters.from_backup.clone(),
            salvage_request: String::new(),
            disk_selector: parameters.disk_selector.clone(),
            node_selector: parameters.node_selector.clone(),
            replica_auto_balance: parameters.replica_auto_balance,
            access_mode: if capability::is_single_writer(capabilities) {
                AccessMode::Rwop
            } else {
                AccessMode::Rwo
            },
            data_source,
            revert: None,
            standby: false,
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
    ) -> Result<Option<FilledFrom>, ControllerServiceError> {
        let (snapshot, source_size) = match source {
            None => return Ok(None),
            Some(Source::Snapshot(SnapshotSource { snapshot_id }))
                if let Some(name) = backup_of(snapshot_id) =>
            {
                let backup = self.backup_source(name).await?;
                let backup_size = backup.status.as_ref().map_or(0, |s| s.size);
                check_source_fits(backup_size, size)?;
                return Ok(Some(FilledFrom::Backup(name.to_owned())));
            }
            Some(Source::Snapshot(SnapshotSource { snapshot_id })) => {
                let snapshot = self.snapshots_api().get_opt(snapshot_id).await;
                let snapshot = snapshot
                    .map_err(|e| ControllerServiceError::api(format!("snapshot {snapshot_id}"), e))?
                    .ok_or_else(|| {
                        ControllerServiceError::NotFound(format!(
                            "source snapshot {snapshot_id} does not exist"
                        ))
                    })?;
                let size = snapshot.status.as_ref().map_or(0, |s| s.size);
                (snapshot_id.clone(), size)
            }
            Some(Source::Volume(VolumeSource { volume_id })) => {
                let volume = self.get_volume(volume_id).await?.ok_or_else(|| {
                    ControllerServiceError::NotFound(format!(
                        "source volume {volume_id} does not exist"
                    ))
                })?;
                if let Some(refusal) = volume.standby_refusal("be cloned") {
                    return Err(ControllerServiceError::FailedPrecondition(refusal));
                }
                (clone_source(id, volume_id).name_any(), volume.spec.size)
            }
        };
        check_source_fits(source_size, size)?;
        Ok(Some(FilledFrom::Snapshot(DataSource::Snapshot(snapshot))))
    }

    /// The Backup `name`, which a new volume is restored from.
    async fn backup_source(&self, name: &str) -> Result<Backup, ControllerServiceError> {
        let api: Api<Backup> = Api::namespaced(self.client.clone(), &self.ds.namespace);
        api.get_opt(name)
            .await
            .map_err(|e| ControllerServiceError::api(format!("backup {name}"), e))?
            .ok_or_else(|| {
                ControllerServiceError::NotFound(format!("source backup {name} does not exist"))
            })
    }

    async fn create_volume_object(
        &self,
        id: &str,
        name: &str,
        spec: VolumeSpec,
        source: Option<&Source>,
        claim: Option<(String, String)>,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<(), ControllerServiceError> {
        if let Some(Source::Volume(VolumeSource { volume_id })) = source {
            self.snapshot_for_clone(id, volume_id).await?;
        }
        let mut volume = Volume::new(id, spec);
        volume.metadata.labels = Some(labels).filter(|l| !l.is_empty());
        let annotations = volume.annotations_mut();
        if id != name {
            annotations.insert(CSI_NAME.to_owned(), name.to_owned());
        }
        if let Some((namespace, claim)) = claim {
            annotations.insert(PVC_NAMESPACE.to_owned(), namespace);
            annotations.insert(PVC_NAME.to_owned(), claim);
        }
        self.volumes()
            .create(&PostParams::default(), &volume)
            .await
            .map_err(|e| ControllerServiceError::api(format!("volume {id}"), e))?;
        info!(volume = %id, csi_name = %name, "volume created");
        Ok(())
    }

    /// A clone is a restore from a snapshot of the source taken for it; the
    /// volume controller deletes that snapshot once the clone is filled.
    async fn snapshot_for_clone(
        &self,
        id: &str,
        source: &str,
    ) -> Result<(), ControllerServiceError> {
        let snapshot = clone_source(id, source);
        create_if_absent(&self.snapshots_api(), &snapshot)
            .await
            .map_err(|e| {
                ControllerServiceError::api(format!("snapshot {}", snapshot.name_any()), e)
            })?;
        Ok(())
    }

    /// Waits for the first placement of the volume's replicas: done when every
    /// replica has a node and disk, an error saying why when one cannot.
    async fn wait_scheduled(&self, id: &str) -> Result<Arc<Volume>, ControllerServiceError> {
        self.wait_for(&format!("scheduling volume {id}"), SCHEDULE_WAIT, || {
            let Some(volume) = self.ds.volumes.get(id) else {
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
                    let c = scheduled.map(|c| (c.reason.clone(), c.message.clone()));
                    let (reason, message) = c.unwrap_or_default();
                    Err(ControllerServiceError::Unplaceable {
                        volume: id.to_owned(),
                        reason,
                        message,
                    })
                }
                _ => Ok(None),
            }
        })
        .await
    }

    pub(super) async fn delete(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<(), ControllerServiceError> {
        let id = required(&request.volume_id, "volume_id")?;
        let _guard = self.locks.try_lock(id)?;
        let Some(volume) = self.get_volume(id).await? else {
            return Ok(());
        };
        if !volume.spec.node_id.is_empty() {
            return Err(ControllerServiceError::FailedPrecondition(format!(
                "volume {id} is attached to node {}; unpublish it first",
                volume.spec.node_id
            )));
        }
        if let Some(blocker) = snapshots::deletion_blocker(self, id).await? {
            return Err(ControllerServiceError::FailedPrecondition(blocker));
        }
        let deleting = unless_gone(self.volumes().delete(id, &DeleteParams::default()).await)
            .map_err(|e| ControllerServiceError::api(format!("volume {id}"), e))?;
        if deleting.is_none() {
            return Ok(());
        }
        info!(volume = %id, "volume deletion requested");
        self.wait_for(&format!("deleting volume {id}"), DELETE_WAIT, || {
            Ok(self.ds.volumes.get(id).is_none().then_some(()))
        })
        .await
    }

    pub(super) async fn validate(
        &self,
        request: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, ControllerServiceError> {
        let id = required(&request.volume_id, "volume_id")?;
        if request.volume_capabilities.is_empty() {
            return Err(ControllerServiceError::InvalidArgument(
                "volume_capabilities are required".into(),
            ));
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

    pub(super) fn list(
        &self,
        request: &ListVolumesRequest,
    ) -> Result<ListVolumesResponse, ControllerServiceError> {
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

    pub(super) fn get(
        &self,
        id: &str,
    ) -> Result<ControllerGetVolumeResponse, ControllerServiceError> {
        let volume = self
            .ds
            .volumes
            .get(id)
            .ok_or_else(|| ControllerServiceError::VolumeNotFound(id.to_owned()))?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(csi_volume(&volume, HashMap::new(), None)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: published_nodes(&volume),
                volume_condition: Some(volume_condition(&volume)),
            }),
        })
    }
}

/// Whether an existing volume satisfies a repeated CreateVolume; if not,
/// ALREADY_EXISTS saying what differs.
/// What fills a new volume, from its CSI content source.
enum FilledFrom {
    Snapshot(DataSource),
    /// The Backup of this name.
    Backup(String),
}

fn check_source_fits(source_size: i64, size: i64) -> Result<(), ControllerServiceError> {
    if source_size > size {
        return Err(ControllerServiceError::OutOfRange(format!(
            "the source holds {source_size} bytes, more than the {size} bytes asked for"
        )));
    }
    Ok(())
}

fn compatible(
    existing: &Volume,
    name: &str,
    wanted: &VolumeSpec,
    limit: i64,
) -> Result<(), ControllerServiceError> {
    let id = existing.name_any();
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(ControllerServiceError::Aborted(format!(
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
            have.from_backup != wanted.from_backup,
            format!("it is restored from backup {:?}", have.from_backup),
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
        Err(ControllerServiceError::AlreadyExists(format!(
            "volume {id} exists and does not match the request: {}",
            why.join("; ")
        )))
    }
}

fn csi_volume(
    volume: &Volume,
    volume_context: HashMap<String, String>,
    source: Option<Source>,
) -> crate::csi::proto::Volume {
    crate::csi::proto::Volume {
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
fn volume_condition(volume: &Volume) -> VolumeCondition {
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
