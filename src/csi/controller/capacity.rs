//! GetCapacity: the space the scheduler could give a new volume.

use std::collections::HashMap;

use super::ControllerService;
use crate::csi::capability;
use crate::csi::error::ControllerServiceError;
use crate::csi::parameters::{MIN_VOLUME_SIZE, VolumeParameters};
use crate::csi::proto::*;
use crate::datastore::Liveness;
use crate::scheduler::{self, Cluster};
use crate::types::Volume;

impl ControllerService {
    pub(super) fn capacity(
        &self,
        request: &GetCapacityRequest,
    ) -> Result<GetCapacityResponse, ControllerServiceError> {
        request
            .volume_capabilities
            .iter()
            .try_for_each(capability::check)
            .map_err(ControllerServiceError::InvalidArgument)?;
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
