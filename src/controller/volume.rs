//! Volume controller: a volume's owner creates its Engine and Replicas,
//! places the replicas, attaches and detaches, tracks replica failures,
//! replaces replicas that stay failed, moves replicas off evicting nodes and
//! disks, salvages a volume whose replicas all failed, grows the volume,
//! takes and removes its snapshots, reverts it to one while it is
//! detached, fills a new volume from a snapshot before it first attaches,
//! runs its turns in recurring jobs, keeps a standby volume restoring each
//! new backup of another until it is activated, and removes everything when
//! it is deleted.

mod attachment;
mod eviction;
mod fill;
mod maintenance;
mod recurring;
mod replicas;
mod restore;
mod revert;
mod revert_plan;
mod snapshots;
mod standby;
mod standby_plan;
mod standby_restore;

use fill::Filling;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{Instrument, info, info_span};

use super::{Context, ControllerError, delete, hold, instance_status, release, replace_status};
use crate::datastore::{Settings, create_if_absent};
use crate::protocol::Access;
use crate::types::{
    Condition, ConditionStatus, DELETION_HELD, DesireState, Engine, EngineSpec, FINALIZER,
    InstanceSpec, InstanceState, Replica, ReplicaMode, Robustness, Snapshot, Volume, VolumeState,
    VolumeStatus, engine_name,
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
    /// Evicted replicas leaving on this pass: the engine is to drop them.
    retiring: BTreeSet<String>,
}

impl<'a> Pass<'a> {
    /// How the pass calls the volume's data plane: as its engine's
    /// generation, so that a superseded engine's requests stay refused.
    fn access(&self) -> Access {
        let engine = self.engine.as_ref().map_or(0, |e| e.spec.generation);
        // A standby's restores wrote as generations of their own, which its
        // replicas admitted; its first engine starts above them.
        let restored = self.status.standby.as_ref().map_or(0, |s| s.generation);
        self.ctx
            .access(&self.volume.name_any(), engine.max(restored))
    }

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
            retiring: BTreeSet::new(),
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
        if self.volume.deletion_held() {
            self.hold_deletion().await;
        } else if self.volume.metadata.deletion_timestamp.is_some() {
            return self.delete_all().await;
        } else {
            hold(&self.ctx.api(), &mut self.volume).await?;
        }
        self.adopt_snapshots().await?;
        let Some(engine) = self.ensure_engine().await? else {
            return Ok(Action::requeue(SOON));
        };
        self.track_replica_health(&engine).await?;
        self.reuse_failed().await?;
        self.replenish().await?;
        self.trim_surplus().await?;
        self.schedule().await?;
        self.remove_stale().await?;
        self.evict(&engine).await?;
        // A volume attaches only once it holds its data source's data.
        let filling = self.fill().await?;
        // Nor while a revert is under way: it runs on the replicas alone.
        let reverting = self.reverting();
        if self.volume.spec.node_id.is_empty() || filling != Filling::Done || reverting {
            let busy = filling == Filling::Copying || self.snapshot_work() || reverting;
            self.detach(&engine, busy).await?;
        } else {
            self.attach(&engine).await?;
        }
        self.revert(&engine).await?;
        if !reverting {
            self.reconcile_snapshots(&engine).await?;
            self.run_recurring_jobs(&engine).await;
        }
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

    /// Says why a deleted volume is still there and serving: it is attached.
    /// The rest of the pass keeps it attached and healthy until it detaches.
    async fn hold_deletion(&mut self) {
        let message = format!(
            "deletion waits until the volume is detached from node {}: a workload still uses it",
            self.volume.spec.node_id
        );
        let flipped = Condition::set(
            &mut self.status.conditions,
            DELETION_HELD,
            ConditionStatus::True,
            "Attached",
            &message,
        );
        if flipped {
            info!("{message}");
            self.ctx
                .event(&self.volume, EventType::Warning, "DeletionHeld", message)
                .await;
        }
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
            &engine_name(&self.name()),
            EngineSpec {
                instance: self.instance_spec(),
                replica_address_map: Default::default(),
                // Decided again on each start, for the node it starts on.
                frontend: self.volume.spec.frontend.on(None),
                chap_secret: String::new(),
                generation: 0,
                salvage: false,
                salvage_request: String::new(),
            },
        );
        engine.metadata.owner_references = self.owner_reference().map(|r| vec![r]);
        engine.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        // None: created by an earlier pass the cache has not shown yet.
        let Some(created) = create_if_absent(&self.ctx.api::<Engine>(), &engine).await? else {
            return Ok(None);
        };
        info!(engine = %created.name_any(), "engine created");
        self.ctx.expected.created(&self.name(), created.name_any());
        Ok(Some(Arc::new(created)))
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
            // Without a running engine, no replica is known to be in the
            // I/O path: count those that could be, on nodes that are up.
            None => self
                .usable()
                .iter()
                .filter(|r| self.ctx.liveness.is_up(&r.spec.instance.node_id))
                .count(),
        };
        self.observe_engine_failure(engine);
        // Kept across attachments: the engine's report goes with it.
        if let Some(scrub) = engine.status.as_ref().and_then(|s| s.scrub.clone()) {
            self.status.last_scrub = Some(scrub);
        }
        // status.salvagedRequest follows the engine, whatever the cached
        // status says: a salvage start that served has its flag cleared and
        // keeps the request it was made for.
        if !engine.spec.salvage && !engine.spec.salvage_request.is_empty() {
            self.status
                .salvaged_request
                .clone_from(&engine.spec.salvage_request);
        }
        self.status.robustness = match healthy {
            0 if !ever_scheduled => Robustness::Unknown,
            0 => Robustness::Faulted,
            n if n >= wanted => Robustness::Healthy,
            _ => Robustness::Degraded,
        };
    }
}

impl Pass<'_> {
    /// Says on the volume, where a user looks, why its engine does not run
    /// (say, replicas of its I/O path out of reach): the reason its process
    /// gave when it last failed. Not said while no engine is wanted.
    fn observe_engine_failure(&mut self, engine: &Engine) {
        let conditions = &mut self.status.conditions;
        if engine.spec.instance.desire_state != DesireState::Running {
            conditions.retain(|c| c.type_ != ENGINE_RUNNING);
            return;
        }
        let status = engine.status.as_ref().map(|s| &s.instance);
        // Only while it is failed: an older failure's condition stays on
        // the engine through a stop, a start or a move.
        let failed = status
            .filter(|s| s.current_state == InstanceState::Error)
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == instance_status::RUNNING)
            })
            .filter(|c| c.status == ConditionStatus::False);
        if let Some(failed) = failed {
            let message = format!(
                "the engine on {} failed: {}",
                engine.spec.instance.node_id, failed.message
            );
            Condition::set(
                conditions,
                ENGINE_RUNNING,
                ConditionStatus::False,
                "EngineFailed",
                message,
            );
        } else if status.is_some_and(|s| s.current_state == InstanceState::Running) {
            Condition::set(
                conditions,
                ENGINE_RUNNING,
                ConditionStatus::True,
                "Running",
                "",
            );
        }
    }
}

/// The volume's condition saying whether its engine runs, and if it failed,
/// why.
const ENGINE_RUNNING: &str = "EngineRunning";

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
