//! A volume's replicas: their health as the engine reports it, new ones
//! while fewer than numberOfReplicas are healthy (evicted ones not
//! counted, see `eviction.rs`), the surplus removed,
//! placement on nodes and disks, and failed ones removed once stale.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::PostParams;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{info, warn};

use super::super::{ControllerError, delete, patch_guarded, replace_status};
use super::{Pass, replica_address, running_status};
use crate::scheduler::{self, Cluster};
use crate::types::{
    Condition, ConditionStatus, DesireState, Engine, FINALIZER, Replica, ReplicaMode, ReplicaSpec,
};

/// How long a failed replica waits before it rejoins: failures come in
/// bursts (a flapping link, a restarting process), and each rejoin costs a
/// rebuild's comparison of the whole replica. A replica that fails again
/// soon after rejoining waits twice as long each time, up to MAX_REUSE_WAIT.
const REUSE_AFTER: Duration = Duration::from_secs(10);
const MAX_REUSE_WAIT: Duration = Duration::from_secs(300);
/// Healthy this long before it failed, a replica waits REUSE_AFTER again.
const STABLE: Duration = Duration::from_secs(600);

impl Pass<'_> {
    /// Records in each replica when it last became healthy and when it failed,
    /// from what the running engine reports.
    pub(super) async fn track_replica_health(
        &mut self,
        engine: &Engine,
    ) -> Result<(), ControllerError> {
        let Some(engine_status) = running_status(engine) else {
            return Ok(());
        };
        let now = Time(jiff::Timestamp::now());
        for i in 0..self.replicas.len() {
            let replica = Arc::clone(&self.replicas[i]);
            let name = replica.name_any();
            if !engine.spec.replica_address_map.contains_key(&name) {
                continue;
            }
            match engine_status.replica_mode_map.get(&name) {
                Some(ReplicaMode::Error) if replica.spec.failed_at.is_none() => {
                    warn!(replica = %name, "replica failed in the engine");
                    let why = format!(
                        "replica {name} on node {} failed and left the I/O path",
                        replica.spec.instance.node_id
                    );
                    self.mark_failed(i, &now, why).await?;
                }
                Some(ReplicaMode::ReadWrite)
                    if replica.spec.healthy_at.is_none() || replica.spec.failed_at.is_some() =>
                {
                    let patch = json!({"spec": {"healthyAt": now, "failedAt": null}});
                    self.replicas[i] = self.patch_replica(&replica, patch).await?;
                }
                _ => {}
            }
        }
        self.fail_replicas_on_down_nodes(engine, now).await
    }

    /// A replica on a node that went down cannot answer the engine, and once
    /// it is out of the engine's replica set the engine no longer reports it:
    /// mark it failed here, so that it gets replaced.
    async fn fail_replicas_on_down_nodes(
        &mut self,
        engine: &Engine,
        now: Time,
    ) -> Result<(), ControllerError> {
        if engine.spec.instance.desire_state != DesireState::Running {
            return Ok(());
        }
        for i in 0..self.replicas.len() {
            let replica = Arc::clone(&self.replicas[i]);
            let node = &replica.spec.instance.node_id;
            if replica.spec.failed_at.is_some() || node.is_empty() {
                continue;
            }
            let Some(down) = self.ctx.liveness.down(node) else {
                continue;
            };
            warn!(replica = %replica.name_any(), node = %node, "replica's node is down");
            let why = format!(
                "replica {} failed: {}",
                replica.name_any(),
                down.message(node)
            );
            self.mark_failed(i, &now, why).await?;
        }
        Ok(())
    }

    /// Marks the volume's replica `i` failed at `now`, with an Event saying why.
    pub(super) async fn mark_failed(
        &mut self,
        i: usize,
        now: &Time,
        why: String,
    ) -> Result<(), ControllerError> {
        self.ctx
            .event(&self.volume, EventType::Warning, "ReplicaFailed", why)
            .await;
        let replica = Arc::clone(&self.replicas[i]);
        let patch = json!({"spec": {"failedAt": now}});
        self.replicas[i] = self.patch_replica(&replica, patch).await?;
        Ok(())
    }

    /// Replicas that count toward numberOfReplicas: not failed, not going.
    pub(super) fn healthy(&self) -> impl Iterator<Item = &Arc<Replica>> {
        self.replicas
            .iter()
            .filter(|r| r.spec.failed_at.is_none() && !self.going(r))
    }

    pub(super) fn failed(&self) -> impl Iterator<Item = &Arc<Replica>> {
        self.replicas
            .iter()
            .filter(|r| r.spec.failed_at.is_some() && !self.going(r))
    }

    /// Whether a replica is being deleted. Not while the volume's own
    /// deletion is held: the replica's is held too, and it keeps serving.
    pub(super) fn going(&self, replica: &Replica) -> bool {
        replica.metadata.deletion_timestamp.is_some() && !self.volume.deletion_held()
    }

    /// Brings back failed replicas that can rejoin: their node is up, their
    /// process runs, they were healthy once and failed a while ago. The
    /// engine then adds each again and rebuilds only what it missed (its
    /// layers are compared chunk by chunk), instead of a new replica copying
    /// everything. Only while the volume lacks healthy replicas: once one
    /// has been replaced, the failed one is left to be removed as stale.
    pub(super) async fn reuse_failed(&mut self) -> Result<(), ControllerError> {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        let mut healthy = self.staying().count();
        for i in 0..self.replicas.len() {
            if healthy >= wanted {
                break;
            }
            let replica = Arc::clone(&self.replicas[i]);
            let Some(failed_for) = failed_for(&replica) else {
                continue;
            };
            // One on an evicting node or disk is replaced instead.
            let reusable = !self.evicting(&replica)
                && replica.metadata.deletion_timestamp.is_none()
                && replica.spec.healthy_at.is_some()
                && self.ctx.liveness.is_up(&replica.spec.instance.node_id)
                && replica_address(&replica).is_some();
            if !reusable {
                continue;
            }
            let (wait, rejoins) = rejoin_backoff(&replica.spec);
            if failed_for < wait {
                self.wait_at_most(wait - failed_for);
                continue;
            }
            info!(replica = %replica.name_any(), rejoins, "reusing a failed replica: it rejoins with an incremental rebuild");
            self.ctx
                .event(
                    &self.volume,
                    EventType::Normal,
                    "ReplicaReused",
                    format!("replica {} is back and rejoins", replica.name_any()),
                )
                .await;
            // healthyAt restarts too: how long the replica then stays up
            // decides whether its next failure counts as one more in a row.
            let now = Time(jiff::Timestamp::now());
            let patch = json!({"spec": {"failedAt": null, "healthyAt": now, "rejoins": rejoins}});
            self.replicas[i] = self.patch_replica(&replica, patch).await?;
            healthy += 1;
        }
        Ok(())
    }

    /// Creates replicas until numberOfReplicas of them are not failed nor
    /// evicted. A failed replica gets the replenishment wait to come back
    /// before it is replaced; when every replica failed, salvage brings the
    /// best of them back instead. Evicted replicas are replaced only while
    /// the engine runs, where a replacement is rebuilt before it counts: one
    /// made while the volume is detached would hold nothing, yet could look
    /// current to a first start after a fill, take part in a detached
    /// snapshot or be reverted as if it held the volume's data.
    pub(super) async fn replenish(&mut self) -> Result<(), ControllerError> {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        let staying = if self.engine_runs() {
            self.staying().count()
        } else {
            self.healthy().count()
        };
        if staying >= wanted {
            return Ok(());
        }
        if self.healthy().next().is_none() && self.failed().next().is_some() {
            return Ok(());
        }
        let wait = self.settings.replenishment_wait;
        let youngest_failure = self.failed().filter_map(|r| failed_for(r)).min();
        if let Some(failed_for) = youngest_failure
            && failed_for < wait
        {
            self.wait_at_most(wait - failed_for);
            return Ok(());
        }
        let mut all_replicas = self.ctx.ds.replicas.store.state();
        for _ in staying..wanted {
            let mut replica = self.new_replica();
            // Placed as it is created: one write instead of two. One that
            // cannot be placed now is created anyway, and schedule() says why.
            if let Ok(placement) = self.place(&replica, &all_replicas) {
                replica.spec.instance.node_id = placement.node_id;
                replica.spec.disk_id = placement.disk_id;
                replica.spec.disk_path = placement.disk_path;
                replica.spec.data_directory_name = replica.name_any();
            }
            let created = self
                .ctx
                .api::<Replica>()
                .create(&PostParams::default(), &replica)
                .await?;
            info!(replica = %created.name_any(), node = %created.spec.instance.node_id, "replica created");
            self.ctx.expected.created(&self.name(), created.name_any());
            let created = Arc::new(created);
            all_replicas.push(Arc::clone(&created));
            self.replicas.push(created);
        }
        Ok(())
    }

    /// Deletes replicas beyond numberOfReplicas (two managers that both
    /// believed they owned the volume for a moment, or a lowered count), of
    /// those the engine does not use, in the order [`surplus_order`] gives.
    /// Evicted replicas are neither counted nor removed here: they leave
    /// once their replacements serve (`eviction.rs`).
    pub(super) async fn trim_surplus(&mut self) -> Result<(), ControllerError> {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        // As its spec has it, or as it last said it has: an evicted replica
        // taken out of the spec (its eviction since withdrawn) may still
        // serve in the running engine.
        let in_engine = |r: &Replica| {
            self.engine.as_ref().is_some_and(|e| {
                let name = r.name_any();
                e.spec.replica_address_map.contains_key(&name)
                    || e.status
                        .as_ref()
                        .is_some_and(|s| s.replica_mode_map.contains_key(&name))
            })
        };
        let healthy: Vec<&Replica> = self.staying().map(|r| &**r).collect();
        if healthy.len() <= wanted {
            return Ok(());
        }
        let surplus: Vec<Arc<Replica>> = surplus_order(&healthy, in_engine)
            .into_iter()
            .take(healthy.len() - wanted)
            .map(|r| Arc::new(r.clone()))
            .collect();
        for replica in surplus {
            info!(replica = %replica.name_any(), "removing a replica beyond numberOfReplicas");
            delete(&self.ctx.api::<Replica>(), &*replica).await?;
            self.replicas.retain(|r| r.name_any() != replica.name_any());
        }
        Ok(())
    }

    fn new_replica(&self) -> Replica {
        let suffix = format!("{:08x}", fastrand::u32(..));
        let mut replica = Replica::new(
            &format!("{}-r-{suffix}", self.name()),
            ReplicaSpec {
                instance: self.instance_spec(),
                engine_name: self
                    .engine
                    .as_ref()
                    .map(|e| e.name_any())
                    .unwrap_or_default(),
                disk_id: String::new(),
                disk_path: String::new(),
                data_directory_name: String::new(),
                healthy_at: None,
                failed_at: None,
                rejoins: 0,
            },
        );
        replica.metadata.owner_references = self.owner_reference().map(|r| vec![r]);
        replica.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        replica
    }

    /// Where `replica` should go, given the volume's other replicas and every
    /// replica in the cluster (for the space already promised on each disk).
    fn place(
        &self,
        replica: &Replica,
        all_replicas: &[Arc<Replica>],
    ) -> Result<scheduler::Placement, scheduler::Unschedulable> {
        let nodes = self.ctx.ds.nodes.store.state();
        let liveness = self.ctx.liveness.clone();
        let node_up = move |node: &str| liveness.is_up(node);
        let siblings: Vec<&Replica> = self
            .replicas
            .iter()
            .filter(|r| r.name_any() != replica.name_any())
            .map(|r| &**r)
            .collect();
        let cluster = Cluster {
            nodes: &nodes,
            replicas: all_replicas,
            node_up: &node_up,
        };
        scheduler::schedule(
            &cluster,
            &self.volume,
            &siblings,
            &self.settings.scheduler,
            &mut fastrand::Rng::new(),
        )
    }

    /// Places every unscheduled replica, or says in the Scheduled condition
    /// why it cannot be placed.
    pub(super) async fn schedule(&mut self) -> Result<(), ControllerError> {
        let mut all_replicas = self.ctx.ds.replicas.store.state();
        let mut failure = None;
        for i in 0..self.replicas.len() {
            let replica = Arc::clone(&self.replicas[i]);
            if !replica.spec.instance.node_id.is_empty()
                || replica.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            match self.place(&replica, &all_replicas) {
                Ok(placement) => {
                    let patch = json!({"spec": {
                        "nodeID": placement.node_id,
                        "diskID": placement.disk_id,
                        "diskPath": placement.disk_path,
                        "dataDirectoryName": replica.name_any(),
                    }});
                    let scheduled = self.patch_replica(&replica, patch).await?;
                    info!(replica = %replica.name_any(), node = %placement.node_id, disk = %placement.disk_name, "replica scheduled");
                    all_replicas.push(Arc::clone(&scheduled));
                    self.replicas[i] = scheduled;
                }
                Err(unschedulable) => failure = Some((replica, unschedulable)),
            }
        }
        let flipped = match &failure {
            None => Condition::set(
                &mut self.status.conditions,
                "Scheduled",
                ConditionStatus::True,
                "ReplicasScheduled",
                "every replica has a node and disk",
            ),
            Some((replica, why)) => {
                self.wait_at_most(Duration::from_secs(10));
                Condition::set(
                    &mut self.status.conditions,
                    "Scheduled",
                    ConditionStatus::False,
                    why.reason,
                    format!("replica {}: {}", replica.name_any(), why.message),
                )
            }
        };
        if let Some((replica, why)) = failure {
            let unchanged = replica.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Scheduled" && c.message == why.message)
            });
            if flipped {
                warn!(replica = %replica.name_any(), reason = why.reason, %why, "replica cannot be scheduled");
                self.ctx
                    .event(
                        &self.volume,
                        EventType::Warning,
                        why.reason,
                        why.message.clone(),
                    )
                    .await;
            }
            if !unchanged {
                let mut updated = (*replica).clone();
                let status = updated.status.get_or_insert_default();
                Condition::set(
                    &mut status.conditions,
                    "Scheduled",
                    ConditionStatus::False,
                    why.reason,
                    why.message,
                );
                replace_status(&self.ctx.api::<Replica>(), &updated).await?;
            }
        }
        Ok(())
    }

    /// Deletes failed replicas past the volume's staleReplicaTimeout, once
    /// enough healthy ones, evicted ones not counted, exist to keep the data
    /// safe without them.
    pub(super) async fn remove_stale(&mut self) -> Result<(), ControllerError> {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        if self.staying().count() < wanted {
            return Ok(());
        }
        let timeout = Duration::from_secs(
            self.volume
                .spec
                .stale_replica_timeout
                .unsigned_abs()
                .saturating_mul(60),
        );
        let stale: Vec<Arc<Replica>> = self
            .failed()
            .filter(|r| failed_for(r).is_some_and(|f| f >= timeout))
            .cloned()
            .collect();
        for replica in stale {
            info!(replica = %replica.name_any(), "removing a stale failed replica");
            delete(&self.ctx.api::<Replica>(), &*replica).await?;
        }
        if let Some(oldest) = self.failed().filter_map(|r| failed_for(r)).max() {
            self.wait_at_most(timeout.saturating_sub(oldest));
        }
        Ok(())
    }

    /// Replicas the engine may use: scheduled, not failed, not going, not
    /// evicted and leaving.
    pub(super) fn usable(&self) -> Vec<Arc<Replica>> {
        self.healthy()
            .filter(|r| {
                !r.spec.instance.node_id.is_empty() && !self.retiring.contains(&r.name_any())
            })
            .cloned()
            .collect()
    }

    /// Changes one of the volume's replicas, remembering the write until the
    /// cache shows it.
    pub(super) async fn patch_replica(
        &self,
        replica: &Replica,
        patch: serde_json::Value,
    ) -> Result<Arc<Replica>, ControllerError> {
        let written = patch_guarded(&self.ctx.api::<Replica>(), replica, patch).await?;
        self.ctx.expected.changed(&self.name(), replica, &written);
        Ok(Arc::new(written))
    }
}

/// The healthy replicas the engine does not use (`in_engine` false), in the
/// order to remove them: unplaced ones first, then one sharing a node with a
/// replica still kept (so those kept spread over nodes as the anti-affinity
/// rules want), then stopped ones; ties by name, so that two managers
/// trimming at once pick the same ones. Each pick is made against what the
/// earlier picks left.
fn surplus_order<'r>(
    healthy: &[&'r Replica],
    in_engine: impl Fn(&Replica) -> bool,
) -> Vec<&'r Replica> {
    let mut kept: Vec<&Replica> = healthy.to_vec();
    let mut order = Vec::new();
    loop {
        let shares_a_node = |replica: &Replica| {
            kept.iter().any(|other| {
                other.name_any() != replica.name_any()
                    && other.spec.instance.node_id == replica.spec.instance.node_id
            })
        };
        let next = kept
            .iter()
            .copied()
            .filter(|r| !in_engine(r))
            .min_by_key(|r| {
                (
                    !r.spec.instance.node_id.is_empty(),
                    !shares_a_node(r),
                    replica_address(r).is_some(),
                    r.name_any(),
                )
            });
        let Some(next) = next else {
            return order;
        };
        kept.retain(|r| r.name_any() != next.name_any());
        order.push(next);
    }
}

/// How long a failed replica waits before it rejoins, and the count of
/// rejoins in a row it then has: one that had been healthy for STABLE before
/// it failed starts again from REUSE_AFTER.
fn rejoin_backoff(spec: &ReplicaSpec) -> (Duration, u32) {
    let healthy_for = spec
        .healthy_at
        .as_ref()
        .zip(spec.failed_at.as_ref())
        .and_then(|(healthy, failed)| Duration::try_from(failed.0.duration_since(healthy.0)).ok());
    let in_a_row = if healthy_for.is_some_and(|d| d >= STABLE) {
        0
    } else {
        spec.rejoins
    };
    let wait = REUSE_AFTER
        .saturating_mul(1u32.checked_shl(in_a_row).unwrap_or(u32::MAX))
        .min(MAX_REUSE_WAIT);
    (wait, in_a_row.saturating_add(1))
}

/// How long ago the replica failed.
fn failed_for(replica: &Replica) -> Option<Duration> {
    let failed = replica.spec.failed_at.as_ref()?;
    let elapsed = jiff::Timestamp::now().duration_since(failed.0);
    Some(Duration::try_from(elapsed).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::InstanceSpec;

    fn replica(name: &str, node: &str) -> Replica {
        let instance = InstanceSpec {
            volume_name: "v".into(),
            volume_size: 1 << 30,
            node_id: node.to_string(),
            desire_state: DesireState::Running,
            image: String::new(),
        };
        Replica::new(
            name,
            ReplicaSpec {
                instance,
                engine_name: String::new(),
                disk_id: String::new(),
                disk_path: String::new(),
                data_directory_name: String::new(),
                healthy_at: None,
                failed_at: None,
                rejoins: 0,
            },
        )
    }

    fn failed(healthy_for_secs: i64, rejoins: u32) -> ReplicaSpec {
        let failed = jiff::Timestamp::now();
        let healthy = failed - jiff::SignedDuration::from_secs(healthy_for_secs);
        ReplicaSpec {
            healthy_at: Some(Time(healthy)),
            failed_at: Some(Time(failed)),
            rejoins,
            ..replica("r", "n").spec
        }
    }

    #[test]
    fn a_flapping_replica_waits_twice_as_long_each_time() {
        let secs = |(wait, rejoins): (Duration, u32)| (wait.as_secs(), rejoins);
        assert_eq!(secs(rejoin_backoff(&failed(5, 0))), (10, 1));
        assert_eq!(secs(rejoin_backoff(&failed(5, 1))), (20, 2));
        assert_eq!(secs(rejoin_backoff(&failed(5, 3))), (80, 4));
        assert_eq!(secs(rejoin_backoff(&failed(5, 5))), (300, 6), "capped");
        assert_eq!(
            secs(rejoin_backoff(&failed(5, 40))),
            (300, 41),
            "no overflow"
        );
    }

    #[test]
    fn a_replica_healthy_for_long_before_failing_waits_the_least_again() {
        let (wait, rejoins) = rejoin_backoff(&failed(601, 7));
        assert_eq!((wait, rejoins), (REUSE_AFTER, 1));
    }

    fn names(replicas: Vec<&Replica>) -> Vec<String> {
        replicas.into_iter().map(|r| r.name_any()).collect()
    }

    /// Two managers made six replicas for a volume of three: the three
    /// removed leave one replica on each node, never two on one.
    #[test]
    fn the_surplus_removed_leaves_the_replicas_on_distinct_nodes() {
        let all = [
            replica("v-r-1", "node-1"),
            replica("v-r-2", "node-2"),
            replica("v-r-3", "node-2"),
            replica("v-r-4", "node-3"),
            replica("v-r-5", "node-3"),
            replica("v-r-6", ""),
        ];
        let healthy: Vec<&Replica> = all.iter().collect();
        let removed = names(
            surplus_order(&healthy, |_| false)
                .into_iter()
                .take(3)
                .collect(),
        );
        assert_eq!(removed[0], "v-r-6", "unplaced first");
        let kept: Vec<&str> = all
            .iter()
            .filter(|r| !removed.contains(&r.name_any()))
            .map(|r| r.spec.instance.node_id.as_str())
            .collect();
        assert_eq!(kept, ["node-1", "node-2", "node-3"]);
    }

    #[test]
    fn replicas_the_engine_uses_are_never_removed() {
        let all = [replica("v-r-1", "node-1"), replica("v-r-2", "node-1")];
        let healthy: Vec<&Replica> = all.iter().collect();
        let order = surplus_order(&healthy, |r| r.name_any() == "v-r-1");
        assert_eq!(names(order), ["v-r-2"]);
    }
}
