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
//! - [`engine`]: replicates a volume's I/O to its replicas;
//! - [`protocol`]: the engine <-> replica data protocol;
//! - [`frontend`]: the volume as a block device on its node;
//! - [`host`]: the node's host: its programs, mounts and filesystems;
//! - [`replica`]: one copy of a volume's data on a node's disk;
//! - [`backup`]: volumes' snapshots kept in an object store;
//! - [`manifest`] and [`uninstall`]: installing Oxhorn and removing it.

pub mod backup;
pub mod controller;
pub mod csi;
pub mod datastore;
pub mod engine;
pub mod error;
pub mod frontend;
pub mod health;
pub mod host;
pub mod instance;
pub mod instance_manager;
pub mod logging;
pub mod manager;
pub mod manifest;
pub mod names;
pub mod protocol;
pub mod replica;
pub mod scheduler;
pub mod types;
pub mod uninstall;

pub use error::{Error, Result};
