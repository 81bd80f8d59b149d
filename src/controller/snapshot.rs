//! Snapshot controller for snapshots whose volume does not exist. A
//! snapshot of an existing volume is the business of the volume's owner
//! (see the volume controller), which a snapshot change requeues; here a
//! snapshot naming no volume is reported as such, and let go when deleted.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{Instrument, info, info_span};

use super::{Context, ControllerError, release, update_status};
use crate::types::{Condition, ConditionStatus, Snapshot, Volume};

pub async fn reconcile(
    snapshot: Arc<Snapshot>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    if volume_exists(&ctx, &snapshot.spec.volume).await? {
        return Ok(Action::await_change());
    }
    let Some(snapshot) = ctx.claim(&*snapshot).await? else {
        return Ok(Action::await_change());
    };
    let span =
        info_span!("snapshot", snapshot = %snapshot.name_any(), volume = %snapshot.spec.volume);
    async move {
        if snapshot.metadata.deletion_timestamp.is_some() {
            info!("the volume is gone; letting the snapshot go");
            release(&ctx.api::<Snapshot>(), &snapshot).await?;
            return Ok(Action::await_change());
        }
        let mut status = snapshot.status.clone().unwrap_or_default();
        let message = format!("volume {} does not exist", snapshot.spec.volume);
        status.ready_to_use = false;
        status.error.clone_from(&message);
        Condition::set(
            &mut status.conditions,
            "Ready",
            ConditionStatus::False,
            "VolumeNotFound",
            message,
        );
        update_status(&ctx.api::<Snapshot>(), &snapshot, status).await?;
        Ok(Action::await_change())
    }
    .instrument(span)
    .await
}

/// Whether the volume exists: in the cache, or, since a snapshot is often
/// created right after its volume, on the API server.
async fn volume_exists(ctx: &Context, name: &str) -> Result<bool, ControllerError> {
    if ctx.ds.volumes.get(name).is_some() {
        return Ok(true);
    }
    Ok(ctx.api::<Volume>().get_opt(name).await?.is_some())
}
