//! Oxhorn: replicated block storage for Kubernetes.
//!
//! Data flows CSI call -> custom resource -> controller -> instance manager ->
//! engine -> replicas. The modules follow that path:
//! - [`csi`]: the CSI gRPC services Kubernetes calls;
//! - [`types`]: the oxhorn.io custom resources those calls create;
//! - [`datastore`]: the shared, watched caches of those resources, and the
//!   API calls that may find their work done already;
//! - [`controller`]: the reconcilers that turn desired state into actions;
//! - [`scheduler`]: where a volume's replicas go;
//! - [`backup`]: volumes' snapshots kept in an object store;
//! - [`instance`]: the per-node processes (engines, replicas) a manager runs;
//! - the data plane, the crate `oxhorn-dataplane` (dataplane/), which knows
//!   nothing of Kubernetes; its modules are re-exported here under the same
//!   names: [`engine`] (replicates a volume's I/O to its replicas),
//!   [`protocol`] (the engine <-> replica data protocol), [`frontend`] (the
//!   volume as a block device on its node), [`replica`] (one copy of a
//!   volume's data on a node's disk) and [`names`];
//! - [`host`]: the node's host: its programs, mounts and filesystems;
//! - [`metrics`]: what a manager owns and does, for Prometheus;
//! - [`api`]: the REST API operators and the dashboard use, over the same
//!   custom resources, each call authorized as its caller;
//! - [`dashboard`]: the web pages over the API, live as the cluster changes;
//! - [`support_bundle`]: one tar.gz with what it takes to understand a
//!   problem, credentials redacted, for the CLI and the API.
//!
//! Beside them, [`cmd`] holds the subcommands that put the layers together
//! (the per-node manager, the instance manager's pod, installing and
//! uninstalling), and [`error`] and [`logging`] serve the process.

pub mod csi;

pub mod types;

pub mod datastore;

pub mod controller;
pub mod scheduler;

pub mod backup;

pub mod instance;

// The data plane is its own crate (dataplane/): re-exported under the same
// paths, so `crate::engine::…` reads the same in either crate.
pub use oxhorn_dataplane::{engine, frontend, names, protocol, replica};

pub mod host;

pub mod api;
pub mod cmd;
pub mod dashboard;
pub mod error;
pub mod logging;
pub mod metrics;
pub mod support_bundle;

pub use error::{Error, Result};
