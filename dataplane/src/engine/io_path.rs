//! The record of the volume's I/O path, kept on the replicas themselves.
//!
//! Every replica in the I/O path (RW) holds every write acknowledged since
//! it joined; a replica that left it does not. So that a later engine never
//! serves a replica that missed writes, the engine records the set of RW
//! replicas, by id, on each of them before it acknowledges anything that
//! depends on the set: at start, before a rebuilt replica becomes RW, and
//! after a replica leaves, before the operation that noticed is answered.
//! A new engine trusts only the newest record it can find, and serves only
//! when it reaches every replica that record names: one of them may hold
//! writes the others lack, and a replica outside it certainly misses some.
//! An operator may override this (salvage), accepting the loss of whatever
//! the unreachable replicas hold.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::future::join_all;
use tracing::{info, warn};

use super::member::Member;
use super::{Engine, EngineError, Mode};
use crate::protocol;
use crate::protocol::control::{IoPath, ReplicaStatus};

/// What the engine last recorded.
#[derive(Default)]
pub(super) struct Recorded {
    /// Changes recorded by this engine generation so far.
    version: u64,
    /// The members of the last complete record.
    members: Option<BTreeSet<String>>,
}

impl Recorded {
    /// Numbers this engine's records after `version`, the newest of its
    /// generation that a crashed process of the same generation left.
    pub(super) fn resume_after(&mut self, version: u64) {
        self.version = self.version.max(version);
    }
}

/// The newest record among the replicas' statuses.
pub(super) fn newest<'a>(statuses: impl Iterator<Item = &'a ReplicaStatus>) -> Option<IoPath> {
    statuses
        .filter_map(|s| s.io_path.clone())
        .max_by_key(|p| (p.generation, p.version))
}

/// The members of `newest` that none of `reachable` is.
pub(super) fn missing<'a>(
    newest: &IoPath,
    reachable: impl Iterator<Item = &'a ReplicaStatus>,
) -> Vec<String> {
    let ids: BTreeSet<&str> = reachable.map(|s| s.id.as_str()).collect();
    newest
        .members
        .iter()
        .filter(|m| !ids.contains(m.as_str()))
        .cloned()
        .collect()
}

impl Engine {
    /// Records the RW replicas, and `joining` if given, as the I/O path on
    /// each of them, unless that set is already recorded. A replica that
    /// fails to take the record leaves the I/O path, and the record is made
    /// again without it; `joining` failing is an error.
    pub(super) async fn record_io_path(
        &self,
        joining: Option<&Arc<Member>>,
    ) -> Result<(), EngineError> {
        let mut recorded = self.recorded.lock().await;
        loop {
            self.path_changed.store(false, Ordering::Release);
            let mut targets = self.members_in(&[Mode::ReadWrite]);
            targets.extend(joining.cloned());
            let members: BTreeSet<String> = targets.iter().map(|m| m.id.clone()).collect();
            if recorded.members.as_ref() == Some(&members) {
                return Ok(());
            }
            if targets.is_empty() {
                return Err(EngineError::NoHealthyReplica);
            }
            recorded.version += 1;
            let record = IoPath {
                generation: self.access.generation,
                version: recorded.version,
                members: members.iter().cloned().collect(),
            };
            let results = join_all(targets.iter().map(|m| {
                let mut control = m.control.clone();
                let record = record.clone();
                async move { protocol::within_deadline(control.set_io_path(record)).await }
            }))
            .await;
            let mut complete = true;
            for (member, result) in targets.iter().zip(results) {
                if let Err(status) = result {
                    let error = EngineError::Control(member.address.clone(), status);
                    if joining.is_some_and(|j| Arc::ptr_eq(j, member)) {
                        return Err(error);
                    }
                    self.fail(member, &format!("recording the I/O path: {error}"));
                    complete = false;
                }
            }
            if complete {
                info!(volume = %self.volume, version = record.version, members = ?record.members, "I/O path recorded");
                recorded.members = Some(members);
                return Ok(());
            }
            warn!(volume = %self.volume, "a replica missed the I/O-path record: recording again without it");
        }
    }

    /// Records the I/O path again if a replica left it since the last
    /// record: called before an operation's success is answered.
    pub(super) async fn settle_io_path(&self) -> Result<(), EngineError> {
        if self.path_changed.load(Ordering::Acquire) {
            self.record_io_path(None).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: &str, path: Option<(u64, u64, &[&str])>) -> ReplicaStatus {
        ReplicaStatus {
            id: id.into(),
            io_path: path.map(|(generation, version, members)| IoPath {
                generation,
                version,
                members: members.iter().map(|m| m.to_string()).collect(),
            }),
            ..ReplicaStatus::default()
        }
    }

    #[test]
    fn the_newest_record_wins_and_names_who_is_missing() {
        // C left the I/O path at version 2 and kept the older record.
        let a = status("a", Some((3, 2, &["a", "b"])));
        let c = status("c", Some((3, 1, &["a", "b", "c"])));
        let newest_of_c = newest([&c].into_iter()).unwrap();
        assert_eq!(missing(&newest_of_c, [&c].into_iter()), ["a", "b"]);
        let both = newest([&a, &c].into_iter()).unwrap();
        assert_eq!(both.members, ["a", "b"]);
        assert_eq!(missing(&both, [&a, &c].into_iter()), ["b"]);
        // A later generation's first record beats an earlier one's tenth.
        let later = status("b", Some((4, 1, &["b"])));
        assert_eq!(newest([&a, &later].into_iter()).unwrap().members, ["b"]);
        assert!(newest([&status("n", None)].into_iter()).is_none());
    }
}
