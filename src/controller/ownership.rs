//! Which manager acts on an object: Longhorn's `isControllerResponsibleFor`
//! (seeds 001/002). The preferred owner acts; the current owner keeps acting
//! while the preferred one is unavailable; when both are unavailable, any
//! manager may claim the object, and the status write that records the claim
//! (guarded by the object's resourceVersion) decides who won.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::datastore::{Datastore, LeaseClock};
use crate::types::{Engine, Node, Replica, Snapshot, Volume, lease_name};

/// Whether `me` acts on an object whose preferred owner is `preferred` and
/// whose status names `current`. An empty owner counts as unavailable.
pub fn is_responsible_for(
    me: &str,
    preferred: &str,
    current: &str,
    unavailable: impl Fn(&str) -> bool,
) -> bool {
    let gone = |node: &str| node.is_empty() || unavailable(node);
    let is_preferred = me == preferred;
    let continues = me == current && gone(preferred);
    let needs_new_owner = gone(current) && gone(preferred);
    is_preferred || continues || needs_new_owner
}

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
    kube_nodes: Store<KubeNode>,
    nodes: Store<Node>,
    leases: Store<Lease>,
    lease_clock: Arc<LeaseClock>,
    namespace: String,
}

impl Liveness {
    pub fn new(ds: &Arc<Datastore>) -> Self {
        Self {
            kube_nodes: ds.kube_nodes.store.clone(),
            nodes: ds.nodes.store.clone(),
            leases: ds.leases.store.clone(),
            lease_clock: Arc::clone(&ds.lease_clock),
            namespace: ds.namespace.clone(),
        }
    }

    /// Why `node` is unavailable, or `None` when it is up.
    pub fn down(&self, node: &str) -> Option<Down> {
        let Some(kube_node) = self.kube_nodes.get(&ObjectRef::new(node)) else {
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
        if !warming_up
            && self
                .nodes
                .get(&ObjectRef::new(node).within(&self.namespace))
                .is_none()
        {
            return Some(Down::NodeMissing);
        }
        let name = lease_name(node);
        let fresh = match self
            .leases
            .get(&ObjectRef::new(&name).within(&self.namespace))
        {
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

    /// [`is_responsible_for`] with this cluster's availability. A manager
    /// whose own lease has not been renewed acts on nothing: the others
    /// already count it as gone and take its objects over.
    pub fn is_responsible_for(&self, me: &str, preferred: &str, current: &str) -> bool {
        self.down(me) != Some(Down::ManagerMissing)
            && is_responsible_for(me, preferred, current, |node| !self.is_up(node))
    }

    /// The nodes that are up, sorted: what the availability watcher compares.
    pub fn up_nodes(&self) -> Vec<String> {
        let mut up: Vec<String> = self
            .kube_nodes
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

/// The node that should act on an object, and the one that last did.
pub trait Owned {
    fn preferred_owner(&self) -> &str;
    fn current_owner(&self) -> &str;
    fn set_owner(&mut self, node: &str);
}

impl Owned for Volume {
    fn preferred_owner(&self) -> &str {
        &self.spec.node_id
    }
    fn current_owner(&self) -> &str {
        self.status.as_ref().map_or("", |s| &s.owner_id)
    }
    fn set_owner(&mut self, node: &str) {
        self.status.get_or_insert_default().owner_id = node.to_owned();
    }
}

impl Owned for Engine {
    fn preferred_owner(&self) -> &str {
        &self.spec.instance.node_id
    }
    fn current_owner(&self) -> &str {
        self.status.as_ref().map_or("", |s| &s.instance.owner_id)
    }
    fn set_owner(&mut self, node: &str) {
        self.status.get_or_insert_default().instance.owner_id = node.to_owned();
    }
}

impl Owned for Replica {
    fn preferred_owner(&self) -> &str {
        &self.spec.instance.node_id
    }
    fn current_owner(&self) -> &str {
        self.status.as_ref().map_or("", |s| &s.owner_id)
    }
    fn set_owner(&mut self, node: &str) {
        self.status.get_or_insert_default().owner_id = node.to_owned();
    }
}

/// The owner of a snapshot's volume acts on it through the volume; this
/// ownership is only for a snapshot whose volume does not exist, which no
/// node prefers: its current owner keeps it while up, else anyone claims it.
impl Owned for Snapshot {
    fn preferred_owner(&self) -> &str {
        ""
    }
    fn current_owner(&self) -> &str {
        self.status.as_ref().map_or("", |s| &s.owner_id)
    }
    fn set_owner(&mut self, node: &str) {
        self.status.get_or_insert_default().owner_id = node.to_owned();
    }
}

impl Owned for Node {
    fn preferred_owner(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn current_owner(&self) -> &str {
        self.status.as_ref().map_or("", |s| &s.owner_id)
    }
    fn set_owner(&mut self, node: &str) {
        self.status.get_or_insert_default().owner_id = node.to_owned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down_set(down: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |node| down.contains(&node)
    }

    #[test]
    fn the_preferred_owner_acts_even_when_another_owns() {
        assert!(is_responsible_for("a", "a", "b", down_set(&[])));
        assert!(!is_responsible_for("b", "a", "b", down_set(&[])));
    }

    #[test]
    fn the_current_owner_keeps_acting_while_the_preferred_is_down() {
        assert!(is_responsible_for("b", "a", "b", down_set(&["a"])));
        assert!(!is_responsible_for("c", "a", "b", down_set(&["a"])));
        // No preferred owner (a detached volume): the current owner keeps it.
        assert!(is_responsible_for("b", "", "b", down_set(&[])));
        assert!(!is_responsible_for("c", "", "b", down_set(&[])));
    }

    #[test]
    fn anyone_may_claim_when_both_are_down() {
        assert!(is_responsible_for("c", "a", "b", down_set(&["a", "b"])));
        assert!(is_responsible_for("c", "", "", down_set(&[])));
        assert!(is_responsible_for("c", "", "b", down_set(&["b"])));
    }

    #[test]
    fn a_live_preferred_owner_is_never_taken_over() {
        assert!(!is_responsible_for("c", "a", "", down_set(&["b"])));
        assert!(!is_responsible_for("c", "a", "b", down_set(&["b"])));
    }
}
