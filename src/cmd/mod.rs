//! The `oxhorn` subcommands that are not a layer of the data path: each
//! puts the layers together for one job.
//! - [`manager`]: the per-node daemon: caches, CSI services, controllers and
//!   the instance manager, and the kubelet's probes;
//! - [`instance_manager`]: holds a node's engines and replicas in a pod of
//!   their own;
//! - [`manifest`] and [`uninstall`]: installing Oxhorn and removing it;
//! - [`support_bundle`]: the bundle a user sends with a problem.

pub mod instance_manager;
pub mod manager;
pub mod manifest;
pub mod support_bundle;
pub mod uninstall;
