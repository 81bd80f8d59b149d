//! CSI Identity: who the plugin is, what it can do, and whether it is ready.

use std::collections::HashMap;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::DRIVER_NAME;
use super::proto::identity_server::Identity;
use super::proto::plugin_capability::{self, service, volume_expansion};
use super::proto::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};

pub struct IdentityService {
    ready: watch::Receiver<bool>,
}

impl IdentityService {
    /// `ready` turns true once the manager's caches are synced.
    pub fn new(ready: watch::Receiver<bool>) -> Self {
        Self { ready }
    }
}

fn service(kind: service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service {
                r#type: kind.into(),
            },
        )),
    }
}

fn expansion(kind: volume_expansion::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(plugin_capability::Type::VolumeExpansion(
            plugin_capability::VolumeExpansion {
                r#type: kind.into(),
            },
        )),
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                // No VolumeAccessibilityConstraints: an engine reaches its
                // replicas over the network, so a volume attaches on any node.
                service(service::Type::ControllerService),
                expansion(volume_expansion::Type::Online),
            ],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(*self.ready.borrow()),
        }))
    }
}
