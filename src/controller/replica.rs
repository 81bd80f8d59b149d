//! Replica controller: the manager of the node holding a replica's disk runs
//! its `oxhorn replica` process while the replica should run, reports the
//! process in status, and removes the replica's data when it is deleted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use super::instance_status::{announce, hold_deletion, never_ran, reflect};
use super::{Context, ControllerError, release, update_status};
use crate::instance::{InstanceKind, InstanceRequest};
use crate::types::{DesireState, InstanceState, InstanceStatus, Replica};

/// How often a replica whose deletion is held looks at its volume again.
const HELD_RECHECK: Duration = Duration::from_secs(2);

/// Where a replica's data lives on its disk.
pub fn data_dir(replica: &Replica) -> Option<PathBuf> {
    let spec = &replica.spec;
    if spec.disk_path.is_empty() || spec.data_directory_name.is_empty() {
        return None;
    }
    Some(
        PathBuf::from(&spec.disk_path)
            .join("replicas")
            .join(&spec.data_directory_name),
    )
}

pub async fn reconcile(
    replica: Arc<Replica>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if idle(&replica) {
        return Ok(Action::await_change());
    }
    let Some(replica) = ctx.claim(&*replica).await? else {
        return Ok(Action::await_change());
    };
    let span = info_span!("replica", replica = %replica.name_any(), volume = %replica.spec.instance.volume_name, node = %replica.spec.instance.node_id);
    async move {
        let going = replica.metadata.deletion_timestamp.is_some();
        // A foreground cascade deletes the replicas with their volume: while
        // the volume's deletion is held, theirs is too, and they serve on.
        let held_by = ctx
            .ds
            .volumes
            .get(&replica.spec.instance.volume_name)
            .filter(|volume| going && volume.deletion_held());
        if going && held_by.is_none() {
            return clean_up(&ctx, &replica).await;
        }
        let mut status = replica.status.clone().unwrap_or_default();
        if replica.spec.instance.node_id == ctx.node.node_id {
            run_here(&ctx, &replica, &mut status).await?;
        } else if !replica.spec.instance.node_id.is_empty() {
            // Taken over from a node that is down: nobody can say how its
            // process is doing.
            status.current_state = InstanceState::Unknown;
        }
        if let Some(volume) = &held_by {
            hold_deletion(&mut status, &volume.name_any(), &volume.spec.node_id);
        }
        let before = replica
            .status
            .as_ref()
            .map_or(InstanceState::Stopped, |s| s.current_state);
        announce(&ctx, &replica, before, status.current_state).await;
        update_status(&ctx.api::<Replica>(), &replica, status).await?;
        if held_by.is_some() {
            // Nothing about the replica changes when its volume detaches.
            return Ok(Action::requeue(HELD_RECHECK));
        }
        Ok(Action::await_change())
    }
    .instrument(span)
    .await
}

/// Nothing to run, stop, report or clean up: a replica not placed yet, or
/// one that never ran and should not. Leaving it unclaimed saves a status
/// write per replica of every detached volume.
fn idle(replica: &Replica) -> bool {
    let spec = &replica.spec.instance;
    replica.metadata.deletion_timestamp.is_none()
        && (spec.node_id.is_empty()
            || (spec.desire_state == DesireState::Stopped && never_ran(replica.status.as_ref())))
}

/// Starts or stops this node's process as desired and reports it.
async fn run_here(
    ctx: &Context,
    replica: &Replica,
    status: &mut InstanceStatus,
) -> Result<(), ControllerError> {
    let name = replica.name_any();
    match replica.spec.instance.desire_state {
        DesireState::Running => {
            let Some(dir) = data_dir(replica) else {
                return Ok(());
            };
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|source| ControllerError::Io {
                    path: parent.to_owned(),
                    source,
                })?;
            }
            let size = replica.spec.instance.volume_size.unsigned_abs();
            let info = ctx
                .instances
                .ensure_running(InstanceRequest {
                    name,
                    kind: InstanceKind::Replica {
                        volume: replica.spec.instance.volume_name.clone(),
                        dir,
                        size,
                    },
                })
                .await?;
            reflect(status, &info);
        }
        DesireState::Stopped => {
            if ctx.instances.get(&name).is_some() {
                ctx.instances.stop(&name).await?;
                info!("replica process stopped");
            }
            status.current_state = InstanceState::Stopped;
            status.started = false;
        }
    }
    Ok(())
}

/// The replica is being deleted: stop its process, remove its data, let it go.
async fn clean_up(ctx: &Context, replica: &Replica) -> Result<Action, ControllerError> {
    let node = &replica.spec.instance.node_id;
    if node == &ctx.node.node_id {
        ctx.instances.stop(&replica.name_any()).await?;
        if let Some(dir) = data_dir(replica) {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => info!(dir = %dir.display(), "replica data removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(ControllerError::Io { path: dir, source }),
            }
        }
    } else if !node.is_empty() {
        let dir = data_dir(replica)
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        warn!(
            dir,
            "node is down; its replica data stays until removed by hand"
        );
        ctx.event(
            replica,
            EventType::Warning,
            "DataLeftBehind",
            format!(
                "node {node} is down: the replica's data at {dir} on that node was not removed"
            ),
        )
        .await;
    }
    release(&ctx.api::<Replica>(), replica).await?;
    Ok(Action::await_change())
}
