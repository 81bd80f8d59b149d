//! The CSI services that Kubernetes (kubelet and the CSI sidecars) calls, served
//! over a unix socket. Each service lives in a file of its own; `error.rs`
//! maps API failures to CSI codes in one place.

mod capability;
mod controller;
pub mod endpoint;
mod error;
mod guard;
mod identity;
mod node;
mod parameters;
mod snapshots;

pub use controller::ControllerService;
pub use guard::VolumeLocks;
pub use identity::IdentityService;
pub use node::{NodeService, NodeServiceConfig};

/// Code generated from csi-proto/csi.proto (CSI v1.12).
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("csi.v1");
}

/// The name this plugin registers under (GetPluginInfo, StorageClass provisioner).
pub const DRIVER_NAME: &str = "driver.oxhorn.io";
