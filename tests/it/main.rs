//! Every integration test, in one binary: one build and link of the crate,
//! and one test control plane (etcd + kube-apiserver, started on first use)
//! shared by all tests, each in a namespace of its own. One module per area;
//! `common` holds what they share.

mod common;

mod api;
mod backup;
mod backup_nfs;
mod bitrot;
mod cli;
mod controllers;
mod csi_controller;
mod csi_node;
mod dashboard;
mod dataplane;
mod datastore;
mod eviction;
mod faults;
mod fencing;
mod frontend;
mod held_deletion;
mod identity;
mod install;
mod installed;
mod instance;
mod iscsi;
mod kubelet_node;
mod layout;
mod local_cluster;
mod metrics;
mod partition;
mod placement;
mod provisioning;
mod rebuild;
mod recurring;
mod recurring_tasks;
pub mod rest_api;
mod revert;
mod sanity;
mod snapshots;
mod standby;
mod support_bundle;
mod system_backup;
mod uninstall;
mod user_flow;
mod volume;
