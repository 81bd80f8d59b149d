//! Oxhorn: replicated block storage for Kubernetes.
//!
//! Data flows CSI call -> custom resource -> controller -> instance manager ->
//! engine -> replicas. The modules follow that path:
//! - [`csi`]: the CSI gRPC services Kubernetes calls;
//! - [`types`]: the oxhorn.io custom resources those calls create;
//! - [`datastore`]: the shared, watched caches of those resources;
//! - [`controller`]: the reconcilers that turn desired state into actions;
//! - [`scheduler`]: where a volume's replicas go;
//! - [`instance`]: the per-node processes (engines, replicas) a manager runs;
//! - [`manager`]: the per-node daemon that wires them together;
//! - [`host`]: the node's host: its programs, mounts and filesystems;
//! - [`backup`]: volumes' snapshots kept in an object store;
//! - [`manifest`] and [`uninstall`]: installing Oxhorn and removing it.
//!
//! The data plane is the crate `oxhorn-dataplane` (dataplane/), which knows
//! nothing of Kubernetes; its modules are re-exported here under the same
//! names: [`engine`] (replicates a volume's I/O to its replicas),
//! [`protocol`] (the engine <-> replica data protocol), [`frontend`] (the
//! volume as a block device on its node), [`replica`] (one copy of a
//! volume's data on a node's disk) and [`names`].

pub mod backup;
pub mod controller;
pub mod csi;
pub mod datastore;
pub mod error;
pub mod health;
pub mod host;
pub mod instance;
pub mod instance_manager;
pub mod logging;
pub mod manager;
pub mod manifest;
pub mod scheduler;
pub mod types;
pub mod uninstall;

// The data plane is its own crate (dataplane/): re-exported under the same
// paths, so `crate::engine::…` reads the same in either crate.
pub use oxhorn_dataplane::{engine, frontend, names, protocol, replica};

pub use error::{Error, Result};
