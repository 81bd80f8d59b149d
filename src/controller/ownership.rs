//! Which manager acts on an object: Longhorn's `isControllerResponsibleFor`
//! (seeds 001/002). The preferred owner acts; the current owner keeps acting
//! while the preferred one is unavailable; when both are unavailable, any
//! manager may claim the object, and the status write that records the claim
//! (guarded by the object's resourceVersion) decides who won.

use crate::datastore::{Down, Liveness};
use crate::types::{
    Backup, BackupTarget, BackupVolume, Engine, Node, RecurringJob, Replica, Snapshot,
    SystemBackup, SystemRestore, Volume,
};

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

impl Liveness {
    /// [`is_responsible_for`] with this cluster's availability. A manager
    /// whose own lease has not been renewed acts on nothing: the others
    /// already count it as gone and take its objects over.
    pub fn is_responsible_for(&self, me: &str, preferred: &str, current: &str) -> bool {
        self.down(me) != Some(Down::ManagerMissing)
            && is_responsible_for(me, preferred, current, |node| !self.is_up(node))
    }
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

/// Backup objects: no node is preferred for a target or a backup volume,
/// whose syncs any manager can run; a backup's controller prefers its
/// volume's owner (see [`crate::controller`]'s `claim_preferring`).
macro_rules! owned_by_anyone {
    ($($kind:ty),*) => {$(
        impl Owned for $kind {
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
    )*};
}
owned_by_anyone!(
    BackupTarget,
    BackupVolume,
    Backup,
    RecurringJob,
    SystemBackup,
    SystemRestore
);

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
