//! Engine controller: the manager of the node a volume is attached to runs
//! its `oxhorn engine` process, keeps the engine's replica set equal to
//! spec.replicaAddressMap (adding a replica starts its rebuild), grows it to
//! spec.volumeSize, and polls the engine into status every few seconds.

mod integrity;
mod rebuilds;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::protocol::TokenChannel;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use super::data_plane::Control;
use super::instance_status::{RUNNING, announce, hold_deletion, never_ran, reflect};
use super::{Context, ControllerError, release, update_status};
use crate::engine::FrontendKind;
use crate::frontend::iscsi::chap::ChapSecrets;
use crate::instance::{InstanceKind, InstanceRequest};
use crate::protocol::control::engine_control_client::EngineControlClient;
use crate::protocol::control::{
    self as protocol, AddReplicaRequest, ExpandRequest, RemoveReplicaRequest, ScrubRequest,
    SetRebuildLimitRequest,
};
use crate::types::{
    Condition, ConditionStatus, DesireState, Engine, EngineStatus, Frontend, InstanceState,
    RebuildStatus, ReplicaMode, SnapshotInfo,
};

/// How often a running engine is polled into its status.
const POLL: Duration = Duration::from_secs(2);
/// The reason given when an iSCSI engine's CHAP Secret cannot be used.
const CHAP_UNUSABLE: &str = "ChapSecretUnusable";
/// Bounds each call of a poll, so that a hung engine fails the pass.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// The I/O figures of `engine`, for /metrics: None unless it runs on this
/// node, where its kept connection is.
pub async fn io_metrics(
    ctx: &Context,
    engine: &Engine,
) -> Result<Option<protocol::EngineMetrics>, ControllerError> {
    let instance = engine.status.as_ref().map(|s| &s.instance);
    let Some(instance) = instance.filter(|i| i.current_state == InstanceState::Running) else {
        return Ok(None);
    };
    if engine.spec.instance.node_id != ctx.node.node_id {
        return Ok(None);
    }
    let address = format!("{}:{}", instance.ip, instance.port);
    let mut api = control(ctx, engine, &address).await?;
    api.metrics().await.map(Some).inspect_err(|_| {
        ctx.engine_channels.forget(&engine.name_any());
    })
}

/// The control API of `engine`'s process at `address`, on this node's
/// kept connection to it.
async fn control(
    ctx: &Context,
    engine: &Engine,
    address: &str,
) -> Result<Control<EngineControlClient<TokenChannel>>, ControllerError> {
    let access = ctx.access(&engine.spec.instance.volume_name, engine.spec.generation);
    ctx.engine_channels
        .engine(engine, address, CONTROL_TIMEOUT, &access)
        .await
}

pub async fn reconcile(engine: Arc<Engine>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    if idle(&engine) {
        return Ok(Action::await_change());
    }
    let Some(engine) = ctx.claim(&*engine).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("engine", engine = %engine.name_any(), volume = %engine.spec.instance.volume_name, node = %engine.spec.instance.node_id);
    async move {
        let here = engine.spec.instance.node_id == ctx.node.node_id;
        if !here {
            ctx.engine_channels.forget(&engine.name_any());
        }
        if engine.metadata.deletion_timestamp.is_some() && !serves_attachment(&ctx, &engine) {
            if here {
                ctx.engine_channels.forget(&engine.name_any());
                ctx.instances.stop(&engine.name_any()).await?;
            }
            release(&ctx.api::<Engine>(), &engine).await?;
            return Ok(Action::await_change());
        }
        let mut status = engine.status.clone().unwrap_or_default();
        let action = if here {
            run_here(&ctx, &engine, &mut status).await?
        } else {
            // Not on this node: either nowhere yet, or on a node that is
            // down, whose process nobody can see.
            if status.instance.current_state != InstanceState::Stopped {
                status.instance.current_state = InstanceState::Unknown;
            }
            Action::await_change()
        };
        if engine.metadata.deletion_timestamp.is_some() {
            let spec = &engine.spec.instance;
            hold_deletion(&mut status.instance, &spec.volume_name, &spec.node_id);
        }
        let before = engine
            .status
            .as_ref()
            .map_or(InstanceState::Stopped, |s| s.instance.current_state);
        announce(&ctx, &engine, before, status.instance.current_state).await;
        update_status(&ctx.api::<Engine>(), &engine, status).await?;
        Ok(action)
    }
    .instrument(span)
    .await
}

/// Whether the engine is its volume's I/O path where the volume is attached:
/// then its deletion waits until the volume detaches, since no other engine
/// can take over a mounted device.
fn serves_attachment(ctx: &Context, engine: &Engine) -> bool {
    let spec = &engine.spec.instance;
    ctx.ds.volumes.get(&spec.volume_name).is_some_and(|volume| {
        spec.desire_state == DesireState::Running
            && !spec.node_id.is_empty()
            && volume.spec.node_id == spec.node_id
    })
}

/// An engine that never ran and should not: nothing to claim or report, so
/// a detached volume's engine costs no write.
fn idle(engine: &Engine) -> bool {
    engine.metadata.deletion_timestamp.is_none()
        && engine.spec.instance.desire_state == DesireState::Stopped
        && never_ran(engine.status.as_ref().map(|s| &s.instance))
}

async fn run_here(
    ctx: &Context,
    engine: &Engine,
    status: &mut EngineStatus,
) -> Result<Action, ControllerError> {
    let name = engine.name_any();
    if engine.spec.instance.desire_state == DesireState::Stopped
        || engine.spec.replica_address_map.is_empty()
    {
        ctx.engine_channels.forget(&name);
        if ctx.instances.get(&name).is_some() {
            ctx.instances.stop(&name).await?;
            info!("engine process stopped");
        }
        *status = EngineStatus {
            instance: status.instance.clone(),
            ..EngineStatus::default()
        };
        status.instance.current_state = InstanceState::Stopped;
        status.instance.started = false;
        return Ok(Action::await_change());
    }
    let info = match chap(ctx, engine) {
        Ok(chap) => ctx.instances.ensure_running(request(engine, chap)).await?,
        Err(why) => {
            warn!(%why, "the engine's CHAP Secret is unusable");
            ctx.event(engine, EventType::Warning, CHAP_UNUSABLE, why.clone())
                .await;
            // Never started, nor its request changed, without its secrets:
            // a process running keeps those it started with.
            let Some(info) = ctx.instances.get(&name) else {
                let conditions = &mut status.instance.conditions;
                Condition::set(
                    conditions,
                    RUNNING,
                    ConditionStatus::False,
                    CHAP_UNUSABLE,
                    why,
                );
                return Ok(Action::requeue(POLL));
            };
            info
        }
    };
    reflect(&mut status.instance, &info);
    if info.state != InstanceState::Running {
        return Ok(Action::requeue(POLL));
    }
    let address = format!("{}:{}", info.ip, info.port);
    let mut api = control(ctx, engine, &address).await?;
    let observed = converge(ctx, engine, &mut api).await.inspect_err(|_| {
        // The next pass dials afresh rather than trust this connection.
        ctx.engine_channels.forget(&name);
    })?;
    fill_status(engine, &observed, status);
    // The counters only: a failure costs nothing but this poll's news.
    if let Ok(metrics) = api.metrics().await {
        status.read_repair = integrity::read_repair(&metrics);
    }
    integrity::announce(ctx, engine, engine.status.as_ref(), status).await;
    Ok(Action::requeue(POLL))
}

/// What the instance manager runs for `engine`.
fn request(engine: &Engine, chap: Option<ChapSecrets>) -> InstanceRequest {
    InstanceRequest {
        name: engine.name_any(),
        kind: InstanceKind::Engine {
            volume: engine.spec.instance.volume_name.clone(),
            generation: engine.spec.generation,
            size: engine.spec.instance.volume_size.unsigned_abs(),
            replicas: engine.spec.replica_address_map.values().cloned().collect(),
            frontend: match engine.spec.frontend {
                Frontend::Fuse => FrontendKind::Fuse,
                Frontend::Iscsi => FrontendKind::Iscsi,
            },
            salvage: engine.spec.salvage,
            chap,
        },
    }
}

/// The CHAP credentials an iSCSI engine's target asks for, from its Secret.
fn chap(ctx: &Context, engine: &Engine) -> Result<Option<ChapSecrets>, String> {
    match engine.spec.frontend {
        Frontend::Iscsi => ctx.ds.chap_secrets(&engine.spec.chap_secret),
        Frontend::Fuse => Ok(None),
    }
}

/// Brings the running engine to the spec: replicas added (and rebuilt,
/// each when its node has a turn) or removed, size grown. Returns the
/// engine's status afterwards.
async fn converge(
    ctx: &Context,
    engine: &Engine,
    api: &mut Control<EngineControlClient<TokenChannel>>,
) -> Result<protocol::EngineStatus, ControllerError> {
    let mut observed = api.status().await?;
    let wanted: BTreeSet<&String> = engine.spec.replica_address_map.values().collect();
    let present: BTreeSet<String> = observed
        .replicas
        .iter()
        .map(|r| r.address.clone())
        .collect();
    for address in present.iter().filter(|a| !wanted.contains(a)) {
        // The spec was written from a status seconds old: the replica it
        // drops (an evicted one, say) may be the only one serving now, the
        // one to take its place having failed since.
        if last_serving(&observed, address) {
            warn!(replica = %address, "kept in the engine: no other replica serves reads and writes");
            continue;
        }
        info!(replica = %address, "removing replica from the engine");
        observed = api
            .client
            .remove_replica(RemoveReplicaRequest {
                address: address.clone(),
            })
            .await
            .map_err(|e| api.failed(e))?
            .into_inner();
    }
    // Before any replica is added, so that its rebuild takes the limit.
    let limit = ctx.settings().rebuild_bandwidth;
    if observed.rebuild_limit != limit {
        info!(
            bytes_per_second = limit,
            "setting the engine's rebuild bandwidth limit"
        );
        observed = api
            .client
            .set_rebuild_limit(SetRebuildLimitRequest {
                bytes_per_second: limit,
            })
            .await
            .map_err(|e| api.failed(e))?
            .into_inner();
    }
    // Counted only when a replica is to be added, not on every poll.
    let mut turns = None;
    for address in wanted.iter().filter(|a| !present.contains(a.as_str())) {
        let node = replica_node(ctx, engine, address);
        let turns = turns.get_or_insert_with(|| rebuild_turns(ctx));
        if let Some(node) = &node
            && let Err(running) = turns.take(node)
        {
            info!(replica = %address, %node, running, "the replica's rebuild waits: its node rebuilds as many as it may");
            continue;
        }
        info!(replica = %address, "adding replica to the engine; it rebuilds");
        observed = api
            .client
            .add_replica(AddReplicaRequest {
                address: (*address).clone(),
            })
            .await
            .map_err(|e| api.failed(e))?
            .into_inner();
    }
    let size = engine.spec.instance.volume_size.unsigned_abs();
    if observed.size < size {
        info!(from = observed.size, to = size, "expanding the volume");
        observed = api
            .client
            .expand(ExpandRequest { size })
            .await
            .map_err(|e| api.failed(e))?
            .into_inner();
    }
    if integrity::due(ctx, engine, observed.scrub.as_ref()) {
        let bytes_per_second = ctx.settings().scrub_bandwidth;
        info!(
            bytes_per_second,
            "a scrub is due: starting it on the volume's replicas"
        );
        observed = api
            .client
            .scrub(ScrubRequest { bytes_per_second })
            .await
            .map_err(|e| api.failed(e))?
            .into_inner();
    }
    Ok(observed)
}

/// The rebuilds running now, per node, by every Engine's status.
fn rebuild_turns(ctx: &Context) -> rebuilds::Turns {
    let engines = ctx.ds.engines.store.state();
    let node_of = |replica: &str| {
        ctx.ds
            .replicas
            .get(replica)
            .map(|r| r.spec.instance.node_id.clone())
    };
    rebuilds::Turns::count(
        engines.iter().filter_map(|e| e.status.as_ref()),
        node_of,
        ctx.settings().rebuilds_per_node,
    )
}

/// The node of the replica at `address` in `engine`'s spec, as cached.
fn replica_node(ctx: &Context, engine: &Engine, address: &str) -> Option<String> {
    let (name, _) = engine
        .spec
        .replica_address_map
        .iter()
        .find(|(_, a)| a.as_str() == address)?;
    Some(ctx.ds.replicas.get(name)?.spec.instance.node_id.clone())
}

/// Translates what the engine reports into the Engine's status, naming
/// replicas by object name rather than address.
fn fill_status(engine: &Engine, observed: &protocol::EngineStatus, status: &mut EngineStatus) {
    let names: BTreeMap<&str, &str> = engine
        .spec
        .replica_address_map
        .iter()
        .map(|(name, address)| (address.as_str(), name.as_str()))
        .collect();
    status.endpoint.clone_from(&observed.endpoint);
    status.current_size = i64::try_from(observed.size).unwrap_or(i64::MAX);
    status.current_replica_address_map.clear();
    status.replica_mode_map.clear();
    status.rebuild_status.clear();
    status.rebuild_bandwidth_limit =
        i64::try_from(observed.rebuild_limit >> 20).unwrap_or(i64::MAX);
    status.scrub = integrity::report(observed.scrub.as_ref());
    for replica in &observed.replicas {
        let Some(name) = names.get(replica.address.as_str()) else {
            continue;
        };
        status
            .current_replica_address_map
            .insert((*name).to_owned(), replica.address.clone());
        status
            .replica_mode_map
            .insert((*name).to_owned(), mode(replica.mode()));
        if replica.rebuilding {
            let progress = (replica.rebuild_bytes_done * 100)
                .checked_div(replica.rebuild_bytes_total)
                .unwrap_or(0);
            status.rebuild_status.insert(
                replica.address.clone(),
                RebuildStatus {
                    is_rebuilding: true,
                    progress: i32::try_from(progress.min(100)).unwrap_or(100),
                    state: "in_progress".into(),
                    error: String::new(),
                    from_replica_address: replica.rebuild_source.clone(),
                },
            );
        }
    }
    status.snapshots = observed
        .snapshots
        .iter()
        .map(|s| {
            let created = jiff::Timestamp::from_second(s.created_unix)
                .ok()
                .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
            let info = SnapshotInfo {
                name: s.name.clone(),
                parent: s.parent.clone(),
                children: Vec::new(),
                created,
                user_created: s.user_created,
                removed: false,
                size: i64::try_from(s.size).unwrap_or(i64::MAX),
                labels: s.labels.clone().into_iter().collect(),
            };
            (s.name.clone(), info)
        })
        .collect();
}

/// Whether the replica at `address` is the engine's only one serving
/// reads and writes.
fn last_serving(observed: &protocol::EngineStatus, address: &str) -> bool {
    let serving = |r: &&protocol::EngineReplica| r.mode() == protocol::ReplicaMode::Rw;
    let mut serving = observed.replicas.iter().filter(serving);
    serving.clone().any(|r| r.address == address) && serving.all(|r| r.address == address)
}

fn mode(mode: protocol::ReplicaMode) -> ReplicaMode {
    match mode {
        protocol::ReplicaMode::Rw => ReplicaMode::ReadWrite,
        protocol::ReplicaMode::Wo => ReplicaMode::WriteOnly,
        protocol::ReplicaMode::Err | protocol::ReplicaMode::Unspecified => ReplicaMode::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(replicas: &[(&str, protocol::ReplicaMode)]) -> protocol::EngineStatus {
        protocol::EngineStatus {
            replicas: replicas
                .iter()
                .map(|(address, mode)| protocol::EngineReplica {
                    address: (*address).into(),
                    mode: *mode as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_only_replica_serving_is_not_taken_out_of_the_engine() {
        use protocol::ReplicaMode::{Err, Rw, Wo};
        let alone = status(&[("e", Rw), ("r", Err)]);
        assert!(last_serving(&alone, "e"), "its replacement failed since");
        assert!(!last_serving(&alone, "r"), "a failed one goes");
        let rebuilding = status(&[("e", Rw), ("r", Wo)]);
        assert!(
            last_serving(&rebuilding, "e"),
            "its replacement still rebuilds"
        );
        let both = status(&[("e", Rw), ("r", Rw)]);
        assert!(!last_serving(&both, "e"), "another serves");
    }
}
