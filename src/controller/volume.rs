//! Volume controller: a volume's owner creates its Engine and Replicas,
//! places the replicas, attaches and detaches, tracks replica failures,
//! replaces replicas that stay failed, salvages a volume whose replicas all
//! failed, grows the volume, takes and removes its snapshots, fills a new
//! volume from a snapshot before it first attaches, and removes everything
//! when it is deleted.

mod fill;
mod snapshots;

use fill::Filling;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use super::{Context, ControllerError, Settings, delete, patch_guarded, release, replace_status};
use crate::scheduler::{self, Cluster};
use crate::types::{
    Condition, ConditionStatus, DesireState, Engine, EngineSpec, FINALIZER, InstanceSpec,
    InstanceState, Replica, ReplicaMode, ReplicaSpec, Robustness, Snapshot, Volume, VolumeState,
    VolumeStatus,
};

/// Longest a volume goes unlooked-at: time-based rules (stale replicas,
/// replenishment) have no event of their own.
const RESYNC: Duration = Duration::from_secs(60);
/// While something is in motion, look again this soon.
const SOON: Duration = Duration::from_secs(2);

pub async fn reconcile(volume: Arc<Volume>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let previous_owner = volume
        .status
        .as_ref()
        .map(|s| s.owner_id.clone())
        .unwrap_or_default();
    let Some(volume) = ctx.claim(&*volume).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("volume", volume = %volume.name_any(), node = %volume.spec.node_id);
    async move {
        let mut pass = Pass::new(&ctx, volume);
        if !previous_owner.is_empty() && previous_owner != ctx.node.node_id {
            // Taken over: this manager's caches may not show yet what the
            // previous owner just created. Read from the API server.
            pass.read_fresh().await?;
        }
        let action = pass.run().await?;
        pass.finish().await?;
        Ok(action)
    }
    .instrument(span)
    .await
}

/// One reconcile of one volume: the volume as read, the status being built,
/// and the volume's engine and replicas from the caches.
struct Pass<'a> {
    ctx: &'a Context,
    volume: Volume,
    status: VolumeStatus,
    engine: Option<Arc<Engine>>,
    replicas: Vec<Arc<Replica>>,
    /// The volume's Snapshots.
    snapshots: Vec<Arc<Snapshot>>,
    /// The settings, read once so that one pass decides on one view of them.
    settings: Settings,
    /// Shortest wait a time-based rule asked for.
    next: Duration,
}

impl<'a> Pass<'a> {
    fn new(ctx: &'a Context, volume: Volume) -> Self {
        let name = volume.name_any();
        let engine = ctx
            .ds
            .engines
            .store
            .state()
            .into_iter()
            .find(|e| e.spec.instance.volume_name == name);
        let mut replicas: Vec<_> = ctx
            .ds
            .replicas
            .store
            .state()
            .into_iter()
            .filter(|r| r.spec.instance.volume_name == name)
            .collect();
        replicas.sort_by_key(|r| r.name_any());
        let mut snapshots: Vec<_> = ctx
            .ds
            .snapshots
            .store
            .state()
            .into_iter()
            .filter(|s| s.spec.volume == name)
            .collect();
        snapshots.sort_by_key(|s| s.name_any());
        let status = volume.status.clone().unwrap_or_default();
        Self {
            ctx,
            volume,
            status,
            engine,
            replicas,
            snapshots,
            settings: ctx.settings(),
            next: RESYNC,
        }
    }

    fn name(&self) -> String {
        self.volume.name_any()
    }

    /// Replaces the cached engine and replicas with the API server's.
    async fn read_fresh(&mut self) -> Result<(), ControllerError> {
        let name = self.name();
        let of_volume = |volume: &str| *volume == name;
        let replicas = self
            .ctx
            .api::<Replica>()
            .list(&ListParams::default())
            .await?;
        self.replicas = replicas
            .items
            .into_iter()
            .filter(|r| of_volume(&r.spec.instance.volume_name))
            .map(Arc::new)
            .collect();
        self.replicas.sort_by_key(|r| r.name_any());
        let engines = self
            .ctx
            .api::<Engine>()
            .list(&ListParams::default())
            .await?;
        self.engine = engines
            .items
            .into_iter()
            .find(|e| of_volume(&e.spec.instance.volume_name))
            .map(Arc::new);
        Ok(())
    }

    fn wait_at_most(&mut self, wait: Duration) {
        self.next = self.next.min(wait.max(Duration::from_millis(500)));
    }

    async fn run(&mut self) -> Result<Action, ControllerError> {
        if !self.caught_up() {
            // Decisions need the results of the last pass's writes.
            return Ok(Action::requeue(Duration::from_millis(300)));
        }
        if self.volume.metadata.deletion_timestamp.is_some() {
            return self.delete_all().await;
        }
        if !self.volume.finalizers().iter().any(|f| f == FINALIZER) {
            let finalizers: Vec<String> = self
                .volume
                .finalizers()
                .iter()
                .cloned()
                .chain([FINALIZER.to_owned()])
                .collect();
            self.volume = patch_guarded(
                &self.ctx.api(),
                &self.volume,
                json!({"metadata": {"finalizers": finalizers}}),
            )
            .await?;
        }
        self.adopt_snapshots().await?;
        let Some(engine) = self.ensure_engine().await? else {
            return Ok(Action::requeue(SOON));
        };
        self.track_replica_health(&engine).await?;
        self.replenish().await?;
        self.trim_surplus().await?;
        self.schedule().await?;
        self.remove_stale().await?;
        // A volume attaches only once it holds its data source's data.
        let filling = self.fill().await?;
        if self.volume.spec.node_id.is_empty() || filling != Filling::Done {
            let busy = filling == Filling::Copying || self.snapshot_work();
            self.detach(&engine, busy).await?;
        } else {
            self.attach(&engine).await?;
        }
        self.reconcile_snapshots(&engine).await?;
        self.salvage(&engine).await?;
        self.observe(&engine);
        Ok(Action::requeue(self.next))
    }

    /// Writes status if it changed, with an Event for each change a user
    /// should know about.
    async fn finish(&self) -> Result<(), ControllerError> {
        let old = self.volume.status.clone().unwrap_or_default();
        if old == self.status {
            return Ok(());
        }
        if old.state != self.status.state {
            info!(from = ?old.state, to = ?self.status.state, "volume state");
            self.ctx
                .event(
                    &self.volume,
                    EventType::Normal,
                    &format!("{:?}", self.status.state),
                    format!("volume is {:?}", self.status.state).to_lowercase(),
                )
                .await;
        }
        if old.robustness != self.status.robustness && self.status.robustness != Robustness::Unknown
        {
            let type_ = if self.status.robustness == Robustness::Healthy {
                EventType::Normal
            } else {
                EventType::Warning
            };
            info!(from = ?old.robustness, to = ?self.status.robustness, "volume robustness");
            self.ctx
                .event(
                    &self.volume,
                    type_,
                    &format!("{:?}", self.status.robustness),
                    format!("volume is {:?}", self.status.robustness).to_lowercase(),
                )
                .await;
        }
        let mut updated = self.volume.clone();
        updated.status = Some(self.status.clone());
        replace_status(&self.ctx.api::<Volume>(), &updated).await?;
        Ok(())
    }

    /// Deletes the engine and replicas (their controllers stop the processes
    /// and remove the data), then lets the volume go.
    async fn delete_all(&mut self) -> Result<Action, ControllerError> {
        self.status.state = VolumeState::Deleting;
        self.drop_clone_source().await?;
        self.release_snapshots().await?;
        if let Some(engine) = &self.engine {
            delete(&self.ctx.api::<Engine>(), &**engine).await?;
        }
        for replica in &self.replicas {
            delete(&self.ctx.api::<Replica>(), &**replica).await?;
        }
        if self.engine.is_some() || !self.replicas.is_empty() {
            return Ok(Action::requeue(SOON));
        }
        info!("engine and replicas gone; releasing the volume");
        release(&self.ctx.api::<Volume>(), &self.volume).await?;
        Ok(Action::await_change())
    }

    fn owner_reference(&self) -> Option<OwnerReference> {
        self.volume.controller_owner_ref(&())
    }

    fn instance_spec(&self) -> InstanceSpec {
        InstanceSpec {
            volume_name: self.name(),
            volume_size: self.volume.spec.size,
            node_id: String::new(),
            desire_state: DesireState::Stopped,
            image: String::new(),
        }
    }

    async fn ensure_engine(&mut self) -> Result<Option<Arc<Engine>>, ControllerError> {
        if let Some(engine) = &self.engine {
            return Ok(Some(Arc::clone(engine)));
        }
        let mut engine = Engine::new(
            &format!("{}-e", self.name()),
            EngineSpec {
                instance: self.instance_spec(),
                replica_address_map: Default::default(),
                frontend: self.volume.spec.frontend,
            },
        );
        engine.metadata.owner_references = self.owner_reference().map(|r| vec![r]);
        engine.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        match self
            .ctx
            .api::<Engine>()
            .create(&PostParams::default(), &engine)
            .await
        {
            Ok(created) => {
                info!(engine = %created.name_any(), "engine created");
                self.ctx.expected.created(&self.name(), created.name_any());
                Ok(Some(Arc::new(created)))
            }
            // Created by an earlier pass the cache has not shown yet.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Records in each replica when it last became healthy and when it failed,
    /// from what the running engine reports.
    async fn track_replica_health(&mut self, engine: &Engine) -> Result<(), ControllerError> {
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
            let patch = match engine_status.replica_mode_map.get(&name) {
                Some(ReplicaMode::Error) if replica.spec.failed_at.is_none() => {
                    warn!(replica = %name, "replica failed in the engine");
                    self.ctx
                        .event(
                            &self.volume,
                            EventType::Warning,
                            "ReplicaFailed",
                            format!(
                                "replica {name} on node {} failed and left the I/O path",
                                replica.spec.instance.node_id
                            ),
                        )
                        .await;
                    json!({"spec": {"failedAt": now}})
                }
                Some(ReplicaMode::ReadWrite)
                    if replica.spec.healthy_at.is_none() || replica.spec.failed_at.is_some() =>
                {
                    json!({"spec": {"healthyAt": now, "failedAt": null}})
                }
                _ => continue,
            };
            self.replicas[i] = self.patch_replica(&replica, patch).await?;
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
            self.ctx
                .event(
                    &self.volume,
                    EventType::Warning,
                    "ReplicaFailed",
                    format!(
                        "replica {} failed: {}",
                        replica.name_any(),
                        down.message(node)
                    ),
                )
                .await;
            let patch = json!({"spec": {"failedAt": now}});
            self.replicas[i] = self.patch_replica(&replica, patch).await?;
        }
        Ok(())
    }

    /// Replicas that count toward numberOfReplicas: not failed, not going.
    fn healthy(&self) -> impl Iterator<Item = &Arc<Replica>> {
        self.replicas
            .iter()
            .filter(|r| r.spec.failed_at.is_none() && r.metadata.deletion_timestamp.is_none())
    }

    fn failed(&self) -> impl Iterator<Item = &Arc<Replica>> {
        self.replicas
            .iter()
            .filter(|r| r.spec.failed_at.is_some() && r.metadata.deletion_timestamp.is_none())
    }

    /// Creates replicas until numberOfReplicas of them are not failed. A failed
    /// replica gets the replenishment wait to come back before it is replaced;
    /// when every replica failed, salvage brings the best of them back instead.
    async fn replenish(&mut self) -> Result<(), ControllerError> {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        let healthy = self.healthy().count();
        if healthy >= wanted {
            return Ok(());
        }
        if healthy == 0 && self.failed().next().is_some() {
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
        for _ in healthy..wanted {
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
    /// believed they owned the volume for a moment, or a lowered count): the
    /// unplaced ones first, then those the engine does not use.
    async fn trim_surplus(&mut self) -> Result<(), ControllerError> {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        let in_engine = |r: &Replica| {
            self.engine
                .as_ref()
                .is_some_and(|e| e.spec.replica_address_map.contains_key(&r.name_any()))
        };
        let mut surplus: Vec<Arc<Replica>> =
            self.healthy().filter(|r| !in_engine(r)).cloned().collect();
        let healthy = self.healthy().count();
        if healthy <= wanted {
            return Ok(());
        }
        // Unplaced first, then stopped ones.
        surplus.sort_by_key(|r| {
            (
                !r.spec.instance.node_id.is_empty(),
                replica_address(r).is_some(),
            )
        });
        for replica in surplus.into_iter().take(healthy - wanted) {
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
    async fn schedule(&mut self) -> Result<(), ControllerError> {
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
    /// enough healthy ones exist to keep the data safe without them.
    async fn remove_stale(&mut self) -> Result<(), ControllerError> {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        if self.healthy().count() < wanted {
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

    /// Replicas the engine may use: scheduled, not failed, not going.
    fn usable(&self) -> Vec<Arc<Replica>> {
        self.healthy()
            .filter(|r| !r.spec.instance.node_id.is_empty())
            .cloned()
            .collect()
    }

    /// Runs the replicas, then the engine on spec.nodeID with the replicas
    /// whose processes run.
    async fn attach(&mut self, engine: &Engine) -> Result<(), ControllerError> {
        let target = self.volume.spec.node_id.clone();
        let usable = self.usable();
        for replica in &usable {
            self.set_replica_desire(replica, DesireState::Running)
                .await?;
        }
        let addresses: BTreeMap<String, String> = usable
            .iter()
            .filter_map(|r| replica_address(r).map(|a| (r.name_any(), a)))
            .collect();
        let spec = &engine.spec;
        let elsewhere = !spec.instance.node_id.is_empty() && spec.instance.node_id != target;
        if elsewhere
            && engine_state(engine) != InstanceState::Stopped
            && self.ctx.liveness.is_up(&spec.instance.node_id)
        {
            // Moving: stop it where it runs first.
            self.set_engine(engine, json!({"spec": {"desireState": "stopped"}}))
                .await?;
            self.wait_at_most(SOON);
            return Ok(());
        }
        let starting =
            spec.instance.desire_state == DesireState::Stopped || spec.instance.node_id != target;
        // Start only once every usable replica runs (or cannot: node down),
        // so the engine does not start on a subset and rebuild the rest.
        let waiting = usable.iter().any(|r| {
            replica_address(r).is_none() && self.ctx.liveness.is_up(&r.spec.instance.node_id)
        });
        if addresses.is_empty() || (starting && waiting) {
            self.wait_at_most(SOON);
            return Ok(());
        }
        let changed = starting
            || spec.replica_address_map != addresses
            || spec.instance.volume_size != self.volume.spec.size;
        if changed {
            info!(replicas = ?addresses.keys().collect::<Vec<_>>(), "engine wanted on {target}");
            self.set_engine(
                engine,
                json!({"spec": {
                    "nodeID": target,
                    "desireState": "running",
                    "replicaAddressMap": replacing(&spec.replica_address_map, &addresses),
                    "volumeSize": self.volume.spec.size,
                }}),
            )
            .await?;
        }
        Ok(())
    }

    /// Stops the engine, then the replicas, unless the data plane has work
    /// for them (`busy`: a snapshot to take or remove, a fill): then the
    /// usable replicas run without an engine.
    async fn detach(&mut self, engine: &Engine, busy: bool) -> Result<(), ControllerError> {
        if engine.spec.instance.desire_state != DesireState::Stopped {
            self.set_engine(engine, json!({"spec": {"desireState": "stopped"}}))
                .await?;
        }
        let engine_node_down = !engine.spec.instance.node_id.is_empty()
            && !self.ctx.liveness.is_up(&engine.spec.instance.node_id);
        if engine_state(engine) != InstanceState::Stopped && !engine_node_down {
            self.wait_at_most(SOON);
            return Ok(());
        }
        let usable: Vec<String> = self.usable().iter().map(|r| r.name_any()).collect();
        for replica in self.replicas.clone() {
            let desire = if busy && usable.contains(&replica.name_any()) {
                DesireState::Running
            } else {
                DesireState::Stopped
            };
            self.set_replica_desire(&replica, desire).await?;
        }
        // Grow stopped replicas with the volume: they take the size at start.
        if engine.spec.instance.volume_size != self.volume.spec.size {
            self.set_engine(
                engine,
                json!({"spec": {"volumeSize": self.volume.spec.size}}),
            )
            .await?;
        }
        Ok(())
    }

    /// When every replica failed: stop the engine, clear the failures of the
    /// replicas whose nodes are up, and let the next engine start trust the
    /// most up-to-date of them (highest revision), rebuilding the others.
    async fn salvage(&mut self, engine: &Engine) -> Result<(), ControllerError> {
        if self.healthy().next().is_some()
            || self.failed().next().is_none()
            || !self.settings.auto_salvage
        {
            return Ok(());
        }
        if engine.spec.instance.desire_state == DesireState::Running {
            warn!("every replica failed; stopping the engine to salvage");
            self.set_engine(
                engine,
                json!({"spec": {"desireState": "stopped", "replicaAddressMap": null}}),
            )
            .await?;
        }
        if engine_state(engine) != InstanceState::Stopped {
            self.wait_at_most(SOON);
            return Ok(());
        }
        let candidates: Vec<Arc<Replica>> = self
            .failed()
            .filter(|r| self.ctx.liveness.is_up(&r.spec.instance.node_id))
            .cloned()
            .collect();
        for replica in &candidates {
            self.patch_replica(replica, json!({"spec": {"failedAt": null}}))
                .await?;
        }
        if !candidates.is_empty() {
            let names: Vec<String> = candidates.iter().map(|r| r.name_any()).collect();
            self.ctx.event(&self.volume, EventType::Warning, "Salvaged", format!("every replica had failed; bringing back {} (the engine trusts the most up to date)", names.join(", "))).await;
        }
        self.wait_at_most(SOON);
        Ok(())
    }

    async fn set_replica_desire(
        &self,
        replica: &Replica,
        desire: DesireState,
    ) -> Result<(), ControllerError> {
        if replica.spec.instance.desire_state == desire
            && replica.spec.instance.volume_size == self.volume.spec.size
        {
            return Ok(());
        }
        let patch = json!({"spec": {"desireState": desire, "volumeSize": self.volume.spec.size}});
        self.patch_replica(replica, patch).await?;
        Ok(())
    }

    /// Changes one of the volume's replicas, remembering the write until the
    /// cache shows it.
    async fn patch_replica(
        &self,
        replica: &Replica,
        patch: serde_json::Value,
    ) -> Result<Arc<Replica>, ControllerError> {
        let written = patch_guarded(&self.ctx.api::<Replica>(), replica, patch).await?;
        self.ctx.expected.changed(&self.name(), replica, &written);
        Ok(Arc::new(written))
    }

    /// Changes the volume's engine, remembering the write until the cache
    /// shows it.
    async fn set_engine(
        &self,
        engine: &Engine,
        patch: serde_json::Value,
    ) -> Result<(), ControllerError> {
        let written = patch_guarded(&self.ctx.api::<Engine>(), engine, patch).await?;
        self.ctx.expected.changed(&self.name(), engine, &written);
        Ok(())
    }

    /// Whether the caches show every write earlier passes made to the
    /// volume's engine and replicas.
    fn caught_up(&self) -> bool {
        let version = |name: &str| {
            let replica = self.replicas.iter().find(|r| r.name_any() == name);
            match replica {
                Some(replica) => replica.resource_version(),
                None => self
                    .engine
                    .as_ref()
                    .filter(|e| e.name_any() == name)
                    .and_then(|e| e.resource_version()),
            }
        };
        self.ctx.expected.satisfied(&self.name(), version)
    }

    /// State, robustness and where the volume is attached, from the engine
    /// and replicas.
    fn observe(&mut self, engine: &Engine) {
        let wanted = usize::try_from(self.volume.spec.number_of_replicas).unwrap_or(0);
        let running = running_status(engine);
        let attached_here = running.is_some_and(|s| !s.endpoint.is_empty())
            && engine.spec.instance.node_id == self.volume.spec.node_id;
        self.status.current_node_id = if running.is_some() {
            engine.spec.instance.node_id.clone()
        } else {
            String::new()
        };
        let ever_scheduled = self
            .replicas
            .iter()
            .any(|r| !r.spec.instance.node_id.is_empty());
        self.status.state = match (self.volume.spec.node_id.is_empty(), attached_here) {
            (false, true) => VolumeState::Attached,
            (false, false) => VolumeState::Attaching,
            (true, _) if engine_state(engine) != InstanceState::Stopped => VolumeState::Detaching,
            (true, _) if !ever_scheduled => VolumeState::Creating,
            (true, _) => VolumeState::Detached,
        };
        let healthy = match running {
            Some(status) => status
                .replica_mode_map
                .values()
                .filter(|m| **m == ReplicaMode::ReadWrite)
                .count(),
            None => self.usable().len(),
        };
        self.status.robustness = match healthy {
            0 if !ever_scheduled => Robustness::Unknown,
            0 => Robustness::Faulted,
            n if n >= wanted => Robustness::Healthy,
            _ => Robustness::Degraded,
        };
    }
}

/// A merge patch turning map `current` into `wanted`: keys left out of a
/// merge patch are kept, so the ones to drop are set to null.
fn replacing(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> serde_json::Value {
    let mut patch = serde_json::Map::new();
    for key in current.keys().filter(|k| !wanted.contains_key(*k)) {
        patch.insert(key.clone(), serde_json::Value::Null);
    }
    for (key, value) in wanted {
        patch.insert(key.clone(), value.clone().into());
    }
    patch.into()
}

/// The engine's status when its process runs.
fn running_status(engine: &Engine) -> Option<&crate::types::EngineStatus> {
    engine
        .status
        .as_ref()
        .filter(|s| s.instance.current_state == InstanceState::Running)
}

fn engine_state(engine: &Engine) -> InstanceState {
    engine
        .status
        .as_ref()
        .map_or(InstanceState::Stopped, |s| s.instance.current_state)
}

/// The data address of a replica whose process runs.
fn replica_address(replica: &Replica) -> Option<String> {
    let status = replica.status.as_ref()?;
    (status.current_state == InstanceState::Running && !status.ip.is_empty() && status.port > 0)
        .then(|| format!("{}:{}", status.ip, status.port))
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

    #[test]
    fn a_map_patch_drops_the_keys_no_longer_wanted() {
        let current = BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ]);
        let wanted = BTreeMap::from([
            ("b".to_owned(), "2".to_owned()),
            ("c".to_owned(), "3".to_owned()),
        ]);
        assert_eq!(
            replacing(&current, &wanted),
            json!({"a": null, "b": "2", "c": "3"})
        );
    }
}
