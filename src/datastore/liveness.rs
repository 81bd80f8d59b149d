//! Node availability, read from the shared caches: a node is unavailable
//! when its Kubernetes Node is missing or not Ready, its oxhorn Node is
//! missing, or its manager's lease has not been seen renewed.

use std::sync::Arc;
use std::time::Instant;

use super::{Cache, Datastore, LeaseClock};
use crate::types::{Node, lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node as KubeNode;

/// Why a node is unavailable, or `None` when it is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Down {
    /// No Kubernetes Node of that name.
    KubeNodeMissing,
    /// The Kubernetes Node's Ready condition is not True.
    KubeNodeNotReady,
    /// No oxhorn Node object of that name.
    NodeMissing,
    /// The node's manager lease is missing or expired.
    ManagerMissing,
}

impl Down {
    /// CamelCase reason for conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            Down::KubeNodeMissing => "KubernetesNodeGone",
            Down::KubeNodeNotReady => "KubernetesNodeNotReady",
            Down::NodeMissing => "NodeGone",
            Down::ManagerMissing => "ManagerDown",
        }
    }

    /// A sentence for users.
    pub fn message(&self, node: &str) -> String {
        match self {
            Down::KubeNodeMissing => format!("Kubernetes node {node} does not exist"),
            Down::KubeNodeNotReady => format!("Kubernetes node {node} is not Ready"),
            Down::NodeMissing => format!("oxhorn Node {node} does not exist"),
            Down::ManagerMissing => {
                format!("the oxhorn manager on {node} has not renewed its lease")
            }
        }
    }
}

/// Node availability, read from the shared caches.
#[derive(Clone)]
pub struct Liveness {
    kube_nodes: Cache<KubeNode>,
    nodes: Cache<Node>,
    leases: Cache<Lease>,
    lease_clock: Arc<LeaseClock>,
}

impl Liveness {
    pub fn new(ds: &Arc<Datastore>) -> Self {
        Self {
            kube_nodes: ds.kube_nodes.clone(),
            nodes: ds.nodes.clone(),
            leases: ds.leases.clone(),
            lease_clock: Arc::clone(&ds.lease_clock),
        }
    }

    /// Why `node` is unavailable, or `None` when it is up.
    pub fn down(&self, node: &str) -> Option<Down> {
        let Some(kube_node) = self.kube_nodes.get(node) else {
            return Some(Down::KubeNodeMissing);
        };
        if !kube_node_ready(&kube_node) {
            return Some(Down::KubeNodeNotReady);
        }
        // A node or lease this manager has not seen yet may just not have
        // reached its caches (the other manager is starting too): while
        // warming up, only a lease seen to expire counts.
        let now = Instant::now();
        let warming_up = self.lease_clock.warming_up(now);
        if !warming_up && self.nodes.get(node).is_none() {
            return Some(Down::NodeMissing);
        }
        let name = lease_name(node);
        let fresh = match self.leases.get(&name) {
            Some(_) => self.lease_clock.is_fresh(&name, now),
            None => warming_up,
        };
        if !fresh {
            return Some(Down::ManagerMissing);
        }
        None
    }

    pub fn is_up(&self, node: &str) -> bool {
        self.down(node).is_none()
    }

    /// The nodes that are up, sorted: what the availability watcher compares.
    pub fn up_nodes(&self) -> Vec<String> {
        let mut up: Vec<String> = self
            .kube_nodes
            .store
            .state()
            .iter()
            .filter_map(|node| node.metadata.name.clone())
            .filter(|name| self.is_up(name))
            .collect();
        up.sort();
        up
    }
}

fn kube_node_ready(node: &KubeNode) -> bool {
    node.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|ready| ready.status == "True")
}
