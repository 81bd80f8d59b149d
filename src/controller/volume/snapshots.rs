//! A volume's Snapshots, handled by the volume's owner: the data-plane
//! snapshot is taken through the engine when the volume is attached (one
//! quiesced point on every replica), else on each replica, which runs
//! without an engine while there is such work; it is removed the same way
//! when the Snapshot is deleted. The Snapshot's status says whether it is
//! ready.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use super::super::control::{self, CALL_TIMEOUT};
use super::super::{ControllerError, delete, patch_guarded, release, replace_status};
use super::{Pass, SOON, engine_state};
use crate::protocol::control::{RemoveSnapshotRequest, SnapshotRequest};
use crate::types::{
    Condition, ConditionStatus, DesireState, Engine, FINALIZER, InstanceState, Replica, Snapshot,
    SnapshotStatus,
};

/// Where a snapshot can be taken or removed now.
enum DataPlane {
    /// The engine runs: at a quiesced point of the volume's I/O.
    Engine(String),
    /// The engine is stopped: on each of these running replicas.
    Replicas(Vec<(Arc<Replica>, String)>),
    /// Neither yet, and why.
    NotYet(&'static str),
}

fn has_finalizer(snapshot: &Snapshot) -> bool {
    snapshot.finalizers().iter().any(|f| f == FINALIZER)
}

fn deleting(snapshot: &Snapshot) -> bool {
    snapshot.metadata.deletion_timestamp.is_some()
}

/// Whether the data plane has work for the snapshot: taking or removing it.
fn pending(snapshot: &Snapshot) -> bool {
    if deleting(snapshot) {
        return has_finalizer(snapshot);
    }
    !snapshot.status.as_ref().is_some_and(|s| s.ready_to_use)
}

impl Pass<'_> {
    /// Gives a snapshot seen for the first time the cleanup finalizer, so
    /// its data-plane snapshot is removed before it goes, and the volume as
    /// owner, so it goes with the volume.
    pub(super) async fn adopt_snapshots(&mut self) -> Result<(), ControllerError> {
        let Some(owner) = self.owner_reference() else {
            return Ok(());
        };
        for i in 0..self.snapshots.len() {
            let snapshot = Arc::clone(&self.snapshots[i]);
            if deleting(&snapshot) || has_finalizer(&snapshot) {
                continue;
            }
            let finalizers: Vec<String> = snapshot
                .finalizers()
                .iter()
                .cloned()
                .chain([FINALIZER.to_owned()])
                .collect();
            let mut owners = snapshot.owner_references().to_vec();
            if !owners.iter().any(|o| o.uid == owner.uid) {
                owners.push(owner.clone());
            }
            let patch = json!({"metadata": {"finalizers": finalizers, "ownerReferences": owners}});
            let adopted = patch_guarded(&self.ctx.api::<Snapshot>(), &*snapshot, patch).await?;
            info!(snapshot = %snapshot.name_any(), "snapshot adopted");
            self.snapshots[i] = Arc::new(adopted);
        }
        Ok(())
    }

    /// Whether the replicas must run for snapshot work although the volume
    /// is detached: a snapshot to take or remove, or another volume filling
    /// from one of this volume's snapshots (these replicas are its source).
    pub(super) fn snapshot_work(&self) -> bool {
        self.snapshots.iter().any(|s| pending(s)) || self.dependents_filling()
    }

    /// Whether a volume is filling from one of this volume's snapshots. Its
    /// copy reads the chain up to that snapshot, which removing any of them
    /// would change (a removed snapshot's data merges into its child).
    fn dependents_filling(&self) -> bool {
        let sources: BTreeSet<String> = self.snapshots.iter().map(|s| s.name_any()).collect();
        self.ctx.ds.volumes.store.state().iter().any(|v| {
            v.spec
                .source_snapshot()
                .is_some_and(|s| sources.contains(s))
                && v.metadata.deletion_timestamp.is_none()
                && !v.is_filled()
        })
    }

    /// Takes the snapshots not taken yet and removes the deleted ones,
    /// writing each snapshot's status when it changed.
    pub(super) async fn reconcile_snapshots(
        &mut self,
        engine: &Engine,
    ) -> Result<(), ControllerError> {
        for snapshot in self.snapshots.clone() {
            if !pending(&snapshot) {
                continue;
            }
            let span = info_span!("snapshot", snapshot = %snapshot.name_any());
            if deleting(&snapshot) {
                self.remove_snapshot(engine, &snapshot)
                    .instrument(span)
                    .await?;
                continue;
            }
            let mut status = snapshot.status.clone().unwrap_or_default();
            status.owner_id.clone_from(&self.ctx.node.node_id);
            match self
                .take_snapshot(engine, &snapshot, &mut status)
                .instrument(span.clone())
                .await
            {
                Ok(()) => {}
                Err(error) if error.is_data_plane() => {
                    warn!(parent: &span, %error, "snapshot not taken");
                    self.wait_at_most(SOON);
                    status.error = error.to_string();
                    Condition::set(
                        &mut status.conditions,
                        "Ready",
                        ConditionStatus::False,
                        "Failed",
                        error.to_string(),
                    );
                }
                Err(error) => return Err(error),
            }
            if snapshot.status.as_ref() != Some(&status) {
                let mut updated = (*snapshot).clone();
                updated.status = Some(status);
                replace_status(&self.ctx.api::<Snapshot>(), &updated).await?;
            }
        }
        Ok(())
    }

    async fn take_snapshot(
        &mut self,
        engine: &Engine,
        snapshot: &Snapshot,
        status: &mut SnapshotStatus,
    ) -> Result<(), ControllerError> {
        let name = snapshot.name_any();
        if !self.holds_its_data() {
            let why = "the volume is still being filled from its data source";
            self.not_yet(status, "WaitingForFill", why);
            return Ok(());
        }
        match self.data_plane(engine) {
            DataPlane::NotYet(why) => {
                self.not_yet(status, "Pending", why);
                return Ok(());
            }
            DataPlane::Engine(address) => snapshot_on_engine(engine, &address, &name).await?,
            DataPlane::Replicas(replicas) => {
                for (replica, address) in &replicas {
                    snapshot_on_replica(replica, address, &name).await?;
                }
            }
        }
        info!("snapshot taken");
        status.ready_to_use = true;
        status.creation_time = Some(Time(jiff::Timestamp::now()));
        status.size = self.volume.spec.size;
        status.error.clear();
        Condition::set(
            &mut status.conditions,
            "Ready",
            ConditionStatus::True,
            "Taken",
            "taken on every replica of the volume",
        );
        self.ctx
            .event(
                snapshot,
                EventType::Normal,
                "SnapshotTaken",
                format!("snapshot of volume {} taken", self.name()),
            )
            .await;
        Ok(())
    }

    /// The snapshot waits for something: say what, and look again soon.
    fn not_yet(&mut self, status: &mut SnapshotStatus, reason: &str, why: &str) {
        self.wait_at_most(SOON);
        Condition::set(
            &mut status.conditions,
            "Ready",
            ConditionStatus::False,
            reason,
            why,
        );
    }

    /// Removes the data-plane snapshot of a deleted Snapshot, then lets it go.
    async fn remove_snapshot(
        &mut self,
        engine: &Engine,
        snapshot: &Snapshot,
    ) -> Result<(), ControllerError> {
        let name = snapshot.name_any();
        if self.dependents_filling() {
            info!("a volume is filling from this volume's snapshots; removal waits");
            self.wait_at_most(SOON);
            return Ok(());
        }
        let removed = match self.data_plane(engine) {
            DataPlane::NotYet(_) => {
                self.wait_at_most(SOON);
                return Ok(());
            }
            DataPlane::Engine(address) => remove_on_engine(engine, &address, &name).await,
            DataPlane::Replicas(replicas) => remove_on_replicas(&replicas, &name).await,
        };
        if let Err(error) = removed {
            if !error.is_data_plane() {
                return Err(error);
            }
            warn!(%error, "snapshot not removed yet");
            self.wait_at_most(SOON);
            return Ok(());
        }
        info!("snapshot removed; letting it go");
        release(&self.ctx.api::<Snapshot>(), snapshot).await?;
        self.ctx
            .event(
                &self.volume,
                EventType::Normal,
                "SnapshotRemoved",
                format!("snapshot {name} removed"),
            )
            .await;
        Ok(())
    }

    /// Where snapshot work can be done now: through the running engine, or
    /// on the running replicas when the engine is stopped. Replicas on nodes
    /// that are down are passed over; a rebuild later gives them the
    /// chain of a healthy replica.
    fn data_plane(&self, engine: &Engine) -> DataPlane {
        let desire = engine.spec.instance.desire_state;
        match (desire, engine_state(engine)) {
            (DesireState::Running, InstanceState::Running) => {
                match control::engine_control_address(engine) {
                    Some(address) => DataPlane::Engine(address),
                    None => DataPlane::NotYet("the engine has no address yet"),
                }
            }
            (DesireState::Stopped, InstanceState::Stopped) => {
                let running = self.running_replicas();
                if running.is_empty() {
                    return DataPlane::NotYet("waiting for the replicas to run");
                }
                DataPlane::Replicas(running)
            }
            _ => DataPlane::NotYet("the volume is attaching or detaching"),
        }
    }

    /// The volume is going: its snapshots go with it, and there is no
    /// data-plane snapshot to remove since its replicas are removed whole.
    pub(super) async fn release_snapshots(&mut self) -> Result<(), ControllerError> {
        let api = self.ctx.api::<Snapshot>();
        for snapshot in std::mem::take(&mut self.snapshots) {
            if has_finalizer(&snapshot) {
                release(&api, &*snapshot).await?;
            }
            if !deleting(&snapshot) {
                info!(snapshot = %snapshot.name_any(), "deleting the snapshot with its volume");
                delete(&api, &*snapshot).await?;
            }
        }
        Ok(())
    }
}

async fn snapshot_on_engine(
    engine: &Engine,
    address: &str,
    name: &str,
) -> Result<(), ControllerError> {
    let mut control = control::engine(engine, address).await?;
    let status = control.status().await?;
    if status.snapshots.iter().any(|s| s.name == name) {
        return Ok(());
    }
    let request = SnapshotRequest {
        name: name.to_owned(),
        user_created: true,
        labels: Default::default(),
    };
    match control.client.snapshot(request).await {
        Err(status) if status.code() != tonic::Code::AlreadyExists => Err(control.failed(status)),
        _ => Ok(()),
    }
}

async fn snapshot_on_replica(
    replica: &Replica,
    address: &str,
    name: &str,
) -> Result<(), ControllerError> {
    let mut control = control::replica(replica, address, Some(CALL_TIMEOUT)).await?;
    let status = control.status().await?;
    if status.snapshots.iter().any(|s| s.name == name) {
        return Ok(());
    }
    let request = SnapshotRequest {
        name: name.to_owned(),
        user_created: true,
        labels: Default::default(),
    };
    info!(replica = %replica.name_any(), "taking the snapshot on the replica");
    match control.client.snapshot(request).await {
        Err(status) if status.code() != tonic::Code::AlreadyExists => Err(control.failed(status)),
        _ => Ok(()),
    }
}

async fn remove_on_engine(
    engine: &Engine,
    address: &str,
    name: &str,
) -> Result<(), ControllerError> {
    let mut control = control::engine(engine, address).await?;
    let status = control.status().await?;
    if !status.snapshots.iter().any(|s| s.name == name) {
        return Ok(());
    }
    let request = RemoveSnapshotRequest {
        name: name.to_owned(),
    };
    match control.client.remove_snapshot(request).await {
        Err(status) if status.code() != tonic::Code::NotFound => Err(control.failed(status)),
        _ => Ok(()),
    }
}

async fn remove_on_replicas(
    replicas: &[(Arc<Replica>, String)],
    name: &str,
) -> Result<(), ControllerError> {
    for (replica, address) in replicas {
        let mut control = control::replica(replica, address, Some(CALL_TIMEOUT)).await?;
        let request = RemoveSnapshotRequest {
            name: name.to_owned(),
        };
        info!(replica = %replica.name_any(), "removing the snapshot from the replica");
        match control.client.remove_snapshot(request).await {
            Err(status) if status.code() != tonic::Code::NotFound => {
                return Err(control.failed(status));
            }
            _ => {}
        }
    }
    Ok(())
}
