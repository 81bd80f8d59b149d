//! Moving replicas off evicting nodes and disks, as Longhorn does: a
//! replica on a node or disk whose `evictionRequested` is set counts no
//! more toward numberOfReplicas, so [`replenish`](Pass::replenish) makes it
//! a replacement elsewhere (the scheduler places nothing on an evicting node
//! or disk). The evicted replica keeps serving until enough replacements
//! serve reads and writes in the running engine; only then does it leave
//! the engine, and once the engine's status shows it gone, it is deleted.
//! Every step is decided again from the objects on each pass, so a manager
//! restarted in the middle goes on where it stopped; and since the volume's
//! read-write replicas elsewhere already number what it wants (at least
//! one), an eviction never lowers its redundancy nor removes its last copy.
//!
//! A detached volume cannot rebuild (its engine does not run): its evicted
//! replicas stay, and say so, until it is next attached.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::super::{ControllerError, delete};
use super::{Pass, running_status};
use crate::types::{
    Condition, ConditionStatus, DesireState, Engine, EngineStatus, Replica, ReplicaMode,
};

/// The volume's condition about its replicas on evicting nodes or disks:
/// False while some remain, absent when none does.
pub(crate) const EVICTED: &str = "Evicted";
/// Evicted replicas leave: their replacements serve.
const MOVING: &str = "ReplicasMoving";
/// Evicted replicas stay until their replacements serve: they rebuild.
const REBUILDING: &str = "ReplacementRebuilding";
/// Evicted replicas stay: a replacement cannot be placed anywhere.
const UNSCHEDULABLE: &str = "ReplacementUnschedulable";
/// Evicted replicas stay until the volume is attached and can rebuild.
const DETACHED: &str = "VolumeDetached";
/// Reasons that need someone to act: each time one is newly given, a
/// Warning Event says so.
const BLOCKED: [&str; 2] = [UNSCHEDULABLE, DETACHED];

/// What becomes of the volume's evicted replicas on this pass.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Enough replicas elsewhere serve: the evicted ones leave.
    Retire,
    /// They stay, for the reason (a condition reason) and message given.
    Keep(&'static str, String),
}

impl Pass<'_> {
    /// Whether `replica` is on a node or disk that is evicting.
    pub(super) fn evicting(&self, replica: &Replica) -> bool {
        let node = &replica.spec.instance.node_id;
        !node.is_empty()
            && self
                .ctx
                .ds
                .nodes
                .get(node)
                .is_some_and(|n| n.evicts(replica))
    }

    /// Whether the volume's engine runs: its replicas can be rebuilt.
    pub(super) fn engine_runs(&self) -> bool {
        self.engine.as_deref().and_then(rebuilding_status).is_some()
    }

    /// Replicas that count toward numberOfReplicas: not failed, not going,
    /// not evicted.
    pub(super) fn staying(&self) -> impl Iterator<Item = &Arc<Replica>> {
        self.healthy().filter(|r| !self.evicting(r))
    }

    /// Decides whether the evicted replicas leave now; takes out of the
    /// engine those that leave ([`usable`](Pass::usable) passes them over
    /// from here on), deletes those the engine no longer has, and says on
    /// the volume why any stays.
    pub(super) async fn evict(&mut self, engine: &Engine) -> Result<(), ControllerError> {
        self.retiring.clear();
        // Failed ones too: they are replaced already, and go with the others.
        let evicted: Vec<Arc<Replica>> = self
            .replicas
            .iter()
            .filter(|r| !self.going(r) && self.evicting(r))
            .cloned()
            .collect();
        if evicted.is_empty() {
            self.status.conditions.retain(|c| c.type_ != EVICTED);
            return Ok(());
        }
        let names: Vec<String> = evicted.iter().map(|r| r.name_any()).collect();
        let verdict = self.verdict(engine, &names);
        match verdict {
            Verdict::Retire => {
                self.retiring.extend(names.iter().cloned());
                let message = format!(
                    "replicas {} leave: their replacements serve",
                    names.join(", ")
                );
                self.report(MOVING, message).await;
                self.retire(engine, &evicted).await
            }
            Verdict::Keep(reason, message) => {
                self.report(reason, message).await;
                Ok(())
            }
        }
    }

    /// Whether the evicted replicas `names` may leave: only while the engine
    /// runs and, besides them, as many replicas as the volume wants (at
    /// least one) serve reads and writes in it.
    fn verdict(&self, engine: &Engine, names: &[String]) -> Verdict {
        let listed = names.join(", ");
        let Some(status) = rebuilding_status(engine) else {
            return Verdict::Keep(
                DETACHED,
                format!(
                    "replicas {listed} stay on their evicting nodes or disks until the volume is \
                     attached: a replacement rebuilds only while the volume's engine runs"
                ),
            );
        };
        let wanted = usize::try_from(self.volume.spec.number_of_replicas)
            .unwrap_or(0)
            .max(1);
        let serving = self.staying().filter(|r| serves(engine, status, r)).count();
        if serving >= wanted {
            return Verdict::Retire;
        }
        let unplaced = self.staying().find(|r| r.spec.instance.node_id.is_empty());
        match unplaced {
            Some(replacement) => {
                let why = condition(&self.status.conditions, "Scheduled")
                    .filter(|c| c.status == ConditionStatus::False)
                    .map_or_else(|| "it is not placed yet".to_owned(), |c| c.message.clone());
                Verdict::Keep(
                    UNSCHEDULABLE,
                    format!(
                        "replicas {listed} stay: {serving} of the {wanted} replicas wanted \
                         elsewhere serve, and replacement {} cannot be placed: {why}",
                        replacement.name_any()
                    ),
                )
            }
            None => Verdict::Keep(
                REBUILDING,
                format!(
                    "replicas {listed} stay until their replacements are rebuilt: {serving} of \
                     the {wanted} replicas wanted elsewhere serve"
                ),
            ),
        }
    }

    /// Deletes each of `evicted` the engine no longer uses: out of its spec,
    /// and out of the status it reported since (a status written for an
    /// older spec cannot be written over a newer one).
    async fn retire(
        &mut self,
        engine: &Engine,
        evicted: &[Arc<Replica>],
    ) -> Result<(), ControllerError> {
        let status = engine.status.as_ref();
        for replica in evicted {
            let name = replica.name_any();
            let in_engine = engine.spec.replica_address_map.contains_key(&name)
                || status.is_some_and(|s| {
                    s.current_replica_address_map.contains_key(&name)
                        || s.replica_mode_map.contains_key(&name)
                });
            if in_engine {
                info!(replica = %name, node = %replica.spec.instance.node_id, "evicted replica: leaving the engine");
                continue;
            }
            info!(replica = %name, node = %replica.spec.instance.node_id, "evicted replica: out of the engine, deleting it");
            delete(&self.ctx.api::<Replica>(), &**replica).await?;
            self.ctx
                .event(
                    &self.volume,
                    EventType::Normal,
                    "ReplicaEvicted",
                    format!(
                        "replica {name} moved off node {}: its replacement serves",
                        replica.spec.instance.node_id
                    ),
                )
                .await;
            self.replicas.retain(|r| r.name_any() != name);
        }
        Ok(())
    }

    /// Sets the Evicted condition False, for `reason`; a Warning Event when
    /// it newly says that someone must act.
    async fn report(&mut self, reason: &'static str, message: String) {
        let before = condition(&self.status.conditions, EVICTED).map(|c| c.reason.clone());
        Condition::set(
            &mut self.status.conditions,
            EVICTED,
            ConditionStatus::False,
            reason,
            message.clone(),
        );
        if BLOCKED.contains(&reason) && before.as_deref() != Some(reason) {
            warn!(reason, %message, "eviction blocked");
            self.ctx
                .event(&self.volume, EventType::Warning, "EvictionBlocked", message)
                .await;
        }
    }
}

/// Whether `replica` serves reads and writes in the running engine.
fn serves(engine: &Engine, status: &EngineStatus, replica: &Replica) -> bool {
    let name = replica.name_any();
    engine.spec.replica_address_map.contains_key(&name)
        && status.replica_mode_map.get(&name) == Some(&ReplicaMode::ReadWrite)
}

fn condition<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The status of `engine` while it runs and is meant to: where replicas
/// are rebuilt, and so replaced.
fn rebuilding_status(engine: &Engine) -> Option<&EngineStatus> {
    running_status(engine).filter(|_| engine.spec.instance.desire_state == DesireState::Running)
}
