//! Filling a new volume from a snapshot (a restore, or a clone through a
//! snapshot of the source volume) before it first attaches. Each of the new
//! volume's replicas copies, from a running replica of the source volume,
//! the snapshot chain up to and including the snapshot; the copies are then
//! given one revision and marked clean, so the first engine start trusts
//! all of them alike. A replica added later is rebuilt by the engine.
//!
//! The volume's `Filled` condition tells how it goes: False with reason
//! WaitingForSource, SourceNotFound, SourceTooLarge, Filling or FillFailed,
//! then True with reason Filled. A volume without a data source has none.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::super::data_plane::{self, CALL_TIMEOUT};
use super::super::{ControllerError, delete};
use super::{Pass, SOON};
use crate::protocol::Access;
use crate::protocol::control::{
    MarkCleanRequest, SetRevisionRequest, Snapshot as Layer, SyncFromRequest,
};
use crate::types::{
    CLONE_FOR, Condition, ConditionStatus, DesireState, FILLED, InstanceState, Replica, Snapshot,
};

/// Where filling stands after a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filling {
    /// The volume holds its data source's data (or has none).
    Done,
    /// Under way, or about to be: the volume's replicas must run.
    Copying,
    /// Waiting for the source to exist or be ready: nothing to run for.
    Blocked,
}

/// A pass's step of filling.
pub(super) enum Step {
    /// Filled: what the volume now holds.
    Done(String),
    /// Not yet: reason and message for the condition.
    Waiting(&'static str, String),
}

/// Reasons to wait that need no replica of the volume to run.
const BLOCKED: [&str; 4] = [
    "SourceNotFound",
    "WaitingForSource",
    "SourceTooLarge",
    "RestoreFailed",
];

impl Pass<'_> {
    /// Whether the volume holds its data source's data, as this pass sees it.
    pub(super) fn holds_its_data(&self) -> bool {
        !self.volume.spec.has_source() || Condition::is_true(&self.status.conditions, FILLED)
    }

    /// Fills the volume from its data source if it is not filled yet, and
    /// says where that stands: a volume attaches only once it is Done.
    pub(super) async fn fill(&mut self) -> Result<Filling, ControllerError> {
        if self.holds_its_data() {
            self.drop_clone_source().await?;
            return Ok(Filling::Done);
        }
        if self.engine_started() {
            // An engine starts only once the volume holds its data: this one
            // means a fill (or a standby's activation) completed whose
            // record a lost status write dropped. Filling again would write
            // over what the volume's users wrote since, and fence its
            // engine out.
            warn!("the engine runs but Filled was not recorded; recording it");
            self.activated_unrecorded();
            let message = "holds its data source's data".to_owned();
            Condition::set(
                &mut self.status.conditions,
                FILLED,
                ConditionStatus::True,
                "Filled",
                message,
            );
            return Ok(Filling::Done);
        }
        if self.follows_backups() {
            return self.follow_backups().await;
        }
        let spec = &self.volume.spec;
        let (snapshot, backup) = (spec.source_snapshot(), spec.source_backup());
        let (snapshot, backup) = (snapshot.map(str::to_owned), backup.map(str::to_owned));
        let filled = match (snapshot, backup) {
            (Some(snapshot), _) => self.fill_from(&snapshot).await,
            (None, Some(backup)) => self.restore_from(&backup).await,
            (None, None) => return Ok(Filling::Done),
        };
        let step = match filled {
            Err(error) if error.is_data_plane() => {
                warn!(%error, "filling failed; retrying");
                Step::Waiting("FillFailed", error.to_string())
            }
            other => other?,
        };
        match step {
            Step::Done(message) => {
                info!(%message, "filled");
                Condition::set(
                    &mut self.status.conditions,
                    FILLED,
                    ConditionStatus::True,
                    "Filled",
                    message.clone(),
                );
                self.ctx
                    .event(&self.volume, EventType::Normal, "Filled", message)
                    .await;
                self.drop_clone_source().await?;
                Ok(Filling::Done)
            }
            Step::Waiting(reason, message) => {
                self.wait_at_most(SOON);
                Condition::set(
                    &mut self.status.conditions,
                    FILLED,
                    ConditionStatus::False,
                    reason,
                    message,
                );
                if BLOCKED.contains(&reason) {
                    Ok(Filling::Blocked)
                } else {
                    Ok(Filling::Copying)
                }
            }
        }
    }

    async fn fill_from(&self, name: &str) -> Result<Step, ControllerError> {
        let Some(snapshot) = self.ctx.ds.snapshots.get(name) else {
            let message = format!("snapshot {name} does not exist");
            return Ok(Step::Waiting("SourceNotFound", message));
        };
        let status = snapshot.status.clone().unwrap_or_default();
        if !status.ready_to_use {
            let message = format!("snapshot {name} is not ready yet");
            return Ok(Step::Waiting("WaitingForSource", message));
        }
        if status.size > self.volume.spec.size {
            let message = format!(
                "snapshot {name} holds {} bytes, more than the volume's {}",
                status.size, self.volume.spec.size
            );
            return Ok(Step::Waiting("SourceTooLarge", message));
        }
        let source = self.ctx.access(&snapshot.spec.volume, 0);
        let Some((address, layers)) = self.source_replica(&snapshot, &source).await else {
            let message = format!(
                "waiting for a running replica of volume {} holding snapshot {name}",
                snapshot.spec.volume
            );
            return Ok(Step::Waiting("WaitingForSource", message));
        };
        let targets = self.running_replicas();
        if targets.is_empty() {
            let message = "waiting for the volume's replicas to run".to_owned();
            return Ok(Step::Waiting("Filling", message));
        }
        let access = self.access();
        let limit = self.ctx.settings().rebuild_bandwidth;
        for (replica, target) in &targets {
            let source = (address.as_str(), &source);
            copy_layers(replica, target, &access, source, &layers, limit).await?;
        }
        settle(&targets, &access, 0).await?;
        Ok(Step::Done(format!("holds the data of snapshot {name}")))
    }

    /// Whether the volume's engine runs or is asked to.
    fn engine_started(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| {
            e.spec.instance.desire_state != DesireState::Stopped
                || super::engine_state(e) != InstanceState::Stopped
        })
    }

    /// The volume's usable replicas with their control addresses, once
    /// every one of them whose node is up runs; empty until then.
    pub(super) fn running_replicas(&self) -> Vec<(Arc<Replica>, String)> {
        let usable: Vec<Arc<Replica>> = self
            .usable()
            .into_iter()
            .filter(|r| self.ctx.liveness.is_up(&r.spec.instance.node_id))
            .collect();
        let running: Vec<(Arc<Replica>, String)> = usable
            .iter()
            .filter_map(|r| data_plane::replica_control_address(r).map(|a| (Arc::clone(r), a)))
            .collect();
        if running.len() < usable.len() {
            return Vec::new();
        }
        running
    }

    /// A running, healthy replica of the snapshot's volume whose chain holds
    /// the snapshot: its control address and its chain up to and including
    /// the snapshot, oldest first.
    async fn source_replica(
        &self,
        snapshot: &Snapshot,
        access: &Access,
    ) -> Option<(String, Vec<Layer>)> {
        let name = snapshot.name_any();
        let candidates: Vec<(Arc<Replica>, String)> = self
            .ctx
            .ds
            .replicas
            .store
            .state()
            .into_iter()
            .filter(|r| r.spec.instance.volume_name == snapshot.spec.volume)
            .filter(|r| r.spec.failed_at.is_none() && r.metadata.deletion_timestamp.is_none())
            .filter_map(|r| data_plane::replica_control_address(&r).map(|a| (r, a)))
            .collect();
        for (replica, address) in candidates {
            let chain = match chain_of(&replica, &address, access).await {
                Ok(chain) => chain,
                Err(error) => {
                    warn!(%error, "source replica not usable");
                    continue;
                }
            };
            if let Some(at) = chain.iter().position(|l| l.name == name) {
                return Some((address, chain[..=at].to_vec()));
            }
        }
        None
    }

    /// Deletes the snapshot the volume was cloned through: it was made for
    /// this volume alone.
    pub(super) async fn drop_clone_source(&self) -> Result<(), ControllerError> {
        let Some(name) = self.volume.spec.source_snapshot() else {
            return Ok(());
        };
        let Some(snapshot) = self.ctx.ds.snapshots.get(name) else {
            return Ok(());
        };
        let for_me = snapshot.labels().get(CLONE_FOR) == Some(&self.name());
        if for_me && snapshot.metadata.deletion_timestamp.is_none() {
            info!(snapshot = %name, "deleting the snapshot this clone was made through");
            delete(&self.ctx.api::<Snapshot>(), &*snapshot).await?;
        }
        Ok(())
    }
}

async fn chain_of(
    replica: &Replica,
    address: &str,
    access: &Access,
) -> Result<Vec<Layer>, ControllerError> {
    let mut control = data_plane::replica(replica, address, Some(CALL_TIMEOUT), access).await?;
    Ok(control.status().await?.snapshots)
}

/// Makes `replica`'s chain equal to `layers` of the source replica at
/// `source.0`, of the volume `source.1` admits to, at no more than `limit`
/// bytes per second (0: no limit), as for a rebuild. Only chunks that differ
/// are copied, so a retry after a failure costs what was left.
async fn copy_layers(
    replica: &Replica,
    address: &str,
    access: &Access,
    source: (&str, &Access),
    layers: &[Layer],
    limit: u64,
) -> Result<(), ControllerError> {
    let (source, source_access) = source;
    info!(replica = %replica.name_any(), %source, layers = layers.len(), "copying the snapshot chain");
    // No deadline: the copy takes as long as the data does.
    let mut control = data_plane::replica(replica, address, None, access).await?;
    let request = SyncFromRequest {
        source: source.to_owned(),
        layers: layers.to_vec(),
        source_volume: source_access.volume.clone(),
        source_key: source_access.key.to_hex(),
        bandwidth_limit: limit,
    };
    let mut progress = control
        .client
        .sync_from(request)
        .await
        .map_err(|e| control.failed(e))?
        .into_inner();
    let mut copied = 0;
    while let Some(step) = progress.message().await.map_err(|e| control.failed(e))? {
        copied = step.bytes_copied;
    }
    info!(replica = %replica.name_any(), copied, "snapshot chain copied");
    Ok(())
}

/// Gives the filled replicas one revision counter and marks them clean:
/// they hold the same data, and the first engine start must trust each of
/// them rather than pick one and rebuild the others. The revision is at
/// least `floor`; returns it.
pub(super) async fn settle(
    replicas: &[(Arc<Replica>, String)],
    access: &Access,
    floor: u64,
) -> Result<u64, ControllerError> {
    let mut controls = Vec::new();
    let mut revision = floor;
    for (replica, address) in replicas {
        let mut control = data_plane::replica(replica, address, Some(CALL_TIMEOUT), access).await?;
        let status = control.status().await?;
        revision = revision.max(status.revision);
        controls.push(control);
    }
    for control in &mut controls {
        let request = SetRevisionRequest { revision };
        control
            .client
            .set_revision(request)
            .await
            .map_err(|e| control.failed(e))?;
        control
            .client
            .mark_clean(MarkCleanRequest {})
            .await
            .map_err(|e| control.failed(e))?;
    }
    Ok(revision)
}
