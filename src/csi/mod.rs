//! The CSI services that Kubernetes (kubelet and the CSI sidecars) calls, served
//! over a unix socket. Each service lives in a module of its own (the
//! controller's split by concern); `error.rs` maps each service's errors to
//! CSI codes in one place, and `traced.rs` logs every call the same way.

mod capability;
mod controller;
pub mod endpoint;
mod error;
mod guard;
mod identity;
mod node;
mod parameters;
pub mod registration;
mod traced;

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
