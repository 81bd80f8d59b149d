//! A volume's Snapshots, handled by the volume's owner: the data-plane
//! snapshot is taken through the engine when the volume is attached (one
//! quiesced point on every replica), else on each replica, which runs
//! without an engine while there is such work; it is removed the same way
//! when the Snapshot is deleted. The Snapshot's status says whether it is
//! ready.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::protocol::{Access, TokenChannel};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use super::super::data_plane::{self, CALL_TIMEOUT, Control};
use super::super::{ControllerError, delete, patch_guarded, release, update_status};
use super::{Pass, SOON, engine_state};
use crate::protocol::control::engine_control_client::EngineControlClient;
use crate::protocol::control::replica_control_client::ReplicaControlClient;
use crate::protocol::control::{RemoveSnapshotRequest, SnapshotRequest};
use crate::types::{
    BackupState, Condition, ConditionStatus, DesireState, Engine, FINALIZER, InstanceState,
    Replica, Snapshot, SnapshotStatus,
};

/// Where a snapshot can be taken or removed now.
enum DataPlane<'a> {
    /// On each of these in turn: the running engine alone, or when it is
    /// stopped, each running replica.
    On(Vec<Site<'a>>),
    /// Neither yet, and why.
    NotYet(&'static str),
}

/// A data-plane process snapshot work runs on, at its control address,
/// and how to call it.
enum Site<'a> {
    /// The engine: at one quiesced point of the volume's I/O, on every
    /// replica it uses.
    Engine(&'a Engine, String, Access),
    /// One replica, on its own chain.
    Replica(Arc<Replica>, String, Access),
}

/// A site's control API, connected.
enum SiteControl {
    Engine(Control<EngineControlClient<TokenChannel>>),
    Replica(Control<ReplicaControlClient<TokenChannel>>),
}

fn has_finalizer(snapshot: &Snapshot) -> bool {
    snapshot.finalizers().iter().any(|f| f == FINALIZER)
}

fn deleting(snapshot: &Snapshot) -> bool {
    snapshot.metadata.deletion_timestamp.is_some()
}

/// Whether the data plane has work for the snapshot: taking or removing it.
pub(super) fn pending(snapshot: &Snapshot) -> bool {
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
    /// is detached: a snapshot to take or remove, another volume filling
    /// from one of this volume's snapshots (these replicas are its source),
    /// or a backup being taken.
    pub(super) fn snapshot_work(&self) -> bool {
        self.snapshots.iter().any(|s| pending(s)) || self.dependents_filling() || self.backing_up()
    }

    /// Whether a Backup of this volume is being taken: its snapshot is read
    /// from these replicas.
    pub(super) fn backing_up(&self) -> bool {
        let name = self.volume.name_any();
        self.ctx.ds.backups.store.state().iter().any(|b| {
            b.spec.volume_name == name
                && b.metadata.deletion_timestamp.is_none()
                && b.status
                    .as_ref()
                    .is_none_or(|s| s.state != BackupState::Completed)
                && !crate::controller::backup::from_store(b)
        })
    }

    /// Whether a volume is filling from one of this volume's snapshots. Its
    /// copy reads the chain up to that snapshot, which removing any of them
    /// would change (a removed snapshot's data merges into its child).
    pub(super) fn dependents_filling(&self) -> bool {
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
            update_status(&self.ctx.api::<Snapshot>(), &*snapshot, status).await?;
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
        if let Some(refusal) = self.volume.standby_refusal("be snapshotted") {
            self.not_yet(status, "VolumeIsStandby", &refusal);
            return Ok(());
        }
        if !self.holds_its_data() {
            let why = "the volume is still being filled from its data source";
            self.not_yet(status, "WaitingForFill", why);
            return Ok(());
        }
        let sites = match self.data_plane(engine) {
            DataPlane::NotYet(why) => {
                self.not_yet(status, "Pending", why);
                return Ok(());
            }
            DataPlane::On(sites) => sites,
        };
        for site in &sites {
            site.take(&name).await?;
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
            DataPlane::On(sites) => remove_from(&sites, &name).await,
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
    fn data_plane<'e>(&self, engine: &'e Engine) -> DataPlane<'e> {
        let desire = engine.spec.instance.desire_state;
        match (desire, engine_state(engine)) {
            (DesireState::Running, InstanceState::Running) => {
                match data_plane::engine_control_address(engine) {
                    Some(address) => {
                        DataPlane::On(vec![Site::Engine(engine, address, self.access())])
                    }
                    None => DataPlane::NotYet("the engine has no address yet"),
                }
            }
            (DesireState::Stopped, InstanceState::Stopped) => {
                let running = self.running_replicas();
                if running.is_empty() {
                    return DataPlane::NotYet("waiting for the replicas to run");
                }
                let sites = running
                    .into_iter()
                    .map(|(r, a)| Site::Replica(r, a, self.access()));
                DataPlane::On(sites.collect())
            }
            _ => DataPlane::NotYet("the volume is attaching or detaching"),
        }
    }

    /// Removes the data-plane snapshots `names`, which no Snapshot names
    /// (those the system took for rebuilds), through the running engine.
    pub(super) async fn remove_system_snapshots(
        &self,
        engine: &Engine,
        names: &[String],
    ) -> Result<(), String> {
        let sites = match self.data_plane(engine) {
            DataPlane::On(sites) => sites,
            DataPlane::NotYet(why) => return Err(why.to_owned()),
        };
        for name in names {
            remove_from(&sites, name)
                .await
                .map_err(|error| format!("{name}: {error}"))?;
        }
        Ok(())
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

async fn remove_from(sites: &[Site<'_>], name: &str) -> Result<(), ControllerError> {
    for site in sites {
        site.remove(name).await?;
    }
    Ok(())
}

impl Site<'_> {
    async fn connect(&self) -> Result<SiteControl, ControllerError> {
        Ok(match self {
            Site::Engine(engine, address, access) => {
                SiteControl::Engine(data_plane::engine(engine, address, access).await?)
            }
            Site::Replica(replica, address, access) => SiteControl::Replica(
                data_plane::replica(replica, address, Some(CALL_TIMEOUT), access).await?,
            ),
        })
    }

    /// Takes snapshot `name`; a replica that holds it already is done. An
    /// engine is always asked, even when its status lists the snapshot: that
    /// list is one replica's, and the engine answers "exists already" only
    /// once each of its replicas holds the snapshot or left the I/O path.
    async fn take(&self, name: &str) -> Result<(), ControllerError> {
        let mut control = self.connect().await?;
        if matches!(self, Site::Replica(..)) && control.holds(name).await? {
            return Ok(());
        }
        let request = SnapshotRequest {
            name: name.to_owned(),
            user_created: true,
            labels: Default::default(),
        };
        if let Site::Replica(replica, ..) = self {
            info!(replica = %replica.name_any(), "taking the snapshot on the replica");
        }
        let reply = match &mut control {
            SiteControl::Engine(c) => c.client.snapshot(request).await.map(drop),
            SiteControl::Replica(c) => c.client.snapshot(request).await.map(drop),
        };
        control.done_unless(reply, tonic::Code::AlreadyExists)
    }

    /// Removes snapshot `name`; gone already is fine.
    async fn remove(&self, name: &str) -> Result<(), ControllerError> {
        let mut control = self.connect().await?;
        match self {
            // Through the engine, removal pauses the volume's I/O: not for
            // a snapshot it does not hold.
            Site::Engine(..) => {
                if !control.holds(name).await? {
                    return Ok(());
                }
            }
            Site::Replica(replica, ..) => {
                info!(replica = %replica.name_any(), "removing the snapshot from the replica");
            }
        }
        let request = RemoveSnapshotRequest {
            name: name.to_owned(),
        };
        let reply = match &mut control {
            SiteControl::Engine(c) => c.client.remove_snapshot(request).await.map(drop),
            SiteControl::Replica(c) => c.client.remove_snapshot(request).await.map(drop),
        };
        control.done_unless(reply, tonic::Code::NotFound)
    }
}

impl SiteControl {
    /// Whether the process holds snapshot `name`.
    async fn holds(&mut self, name: &str) -> Result<bool, ControllerError> {
        let snapshots = match self {
            SiteControl::Engine(c) => c.status().await?.snapshots,
            SiteControl::Replica(c) => c.status().await?.snapshots,
        };
        Ok(snapshots.iter().any(|s| s.name == name))
    }

    /// A call's reply as done, or the error naming the process; `already`
    /// is the answer of a call an earlier pass made already.
    fn done_unless(
        &self,
        reply: Result<(), tonic::Status>,
        already: tonic::Code,
    ) -> Result<(), ControllerError> {
        match reply {
            Err(status) if status.code() != already => Err(match self {
                SiteControl::Engine(c) => c.failed(status),
                SiteControl::Replica(c) => c.failed(status),
            }),
            _ => Ok(()),
        }
    }
}
