//! Rebuilds take turns per node (the setting
//! `concurrent-replica-rebuild-per-node-limit`): a node back from a reboot
//! would otherwise rebuild a replica of every volume it holds at once, and
//! its disk and network would serve none of them, nor the volumes' own I/O,
//! well. The count comes from the Engines' statuses, a poll old, so managers
//! adding replicas in the same moment may pass the limit briefly.

use std::collections::BTreeMap;

use crate::types::EngineStatus;

/// Rebuilds running on each node, and how many a node may run.
pub(super) struct Turns {
    running: BTreeMap<String, usize>,
    limit: usize,
}

impl Turns {
    /// Counts the replicas the Engines' statuses report rebuilding, on the
    /// nodes `node_of` names for them.
    pub(super) fn count<'a>(
        statuses: impl Iterator<Item = &'a EngineStatus>,
        node_of: impl Fn(&str) -> Option<String>,
        limit: usize,
    ) -> Self {
        let mut running = BTreeMap::new();
        let rebuilding = statuses
            .flat_map(|s| s.rebuild_status.iter())
            .filter(|(_, rebuild)| rebuild.is_rebuilding);
        for (replica, _) in rebuilding {
            if let Some(node) = node_of(replica) {
                *running.entry(node).or_default() += 1;
            }
        }
        Turns { running, limit }
    }

    /// Takes a turn to rebuild on `node`, or says how many rebuild there
    /// already.
    pub(super) fn take(&mut self, node: &str) -> Result<(), usize> {
        let running = self.running.entry(node.to_owned()).or_default();
        if *running >= self.limit {
            return Err(*running);
        }
        *running += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::RebuildStatus;

    fn status(rebuilding: &[(&str, bool)]) -> EngineStatus {
        let mut status = EngineStatus::default();
        for (replica, is_rebuilding) in rebuilding {
            let rebuild = RebuildStatus {
                is_rebuilding: *is_rebuilding,
                ..RebuildStatus::default()
            };
            status.rebuild_status.insert(replica.to_string(), rebuild);
        }
        status
    }

    #[test]
    fn a_node_rebuilds_at_most_the_limit_at_once_and_others_are_not_held_up() {
        // r1 and r2 rebuild on node a, r3 on b; r4 finished; r5's node is
        // unknown (not cached yet).
        let statuses = [
            status(&[("r1", true), ("r3", true)]),
            status(&[("r2", true), ("r4", false), ("r5", true)]),
            status(&[]),
        ];
        let node_of = |replica: &str| match replica {
            "r1" | "r2" | "r4" => Some("a".to_owned()),
            "r3" => Some("b".to_owned()),
            _ => None,
        };
        let mut turns = Turns::count(statuses.iter(), node_of, 3);
        assert_eq!(turns.take("a"), Ok(()));
        assert_eq!(
            turns.take("a"),
            Err(3),
            "a runs r1, r2 and the one just added"
        );
        assert_eq!(turns.take("b"), Ok(()));
        assert_eq!(turns.take("b"), Ok(()));
        assert_eq!(turns.take("b"), Err(3));
        assert_eq!(turns.take("c"), Ok(()));
    }
}
