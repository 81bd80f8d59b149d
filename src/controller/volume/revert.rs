//! Reverting a detached volume to one of its snapshots (spec.revert), done
//! by the volume's owner on the replicas themselves while no engine runs,
//! as a detached volume's snapshots are taken: the replicas run without an
//! engine while there is such work. (Longhorn reverts through an engine
//! attached without a frontend; here the replicas' own control API reverts
//! each, so the volume never has to attach, and nothing can read or write
//! it meanwhile.)
//!
//! The owner takes a revert on only while the volume is detached and not
//! to attach, writing `status.revert` as under way (guarded by the
//! volume's resourceVersion, so a concurrent attach makes it refuse
//! instead) and moving the engine generation past every engine before, so
//! none of them can write again. From then on the volume does not attach
//! until the revert is done: a manager that crashes half way leaves it
//! under way, and the next owner reverts again, to the same end. See
//! `revert_plan.rs` for which replicas are reverted and how the others are
//! kept from ever serving.
//!
//! A replica's chain is linear: reverting drops the snapshots taken after
//! the one reverted to (Longhorn keeps them as a branch). Their Snapshots
//! are deleted with it, so none claims data that is gone.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use super::super::data_plane::{self, CALL_TIMEOUT};
use super::super::{ControllerError, delete};
use super::revert_plan::{Facts, NoPlan, Plan, Step, decide, plan};
use super::{Pass, SOON, engine_state};
use crate::protocol::control::{RevertRequest, SetRevisionRequest};
use crate::types::{
    DesireState, Engine, InstanceState, Replica, RevertPhase, RevertStatus, Snapshot,
};

/// What a revert did: the replicas reverted, and the snapshots the chain
/// still holds.
struct Reverted {
    replicas: Vec<String>,
    chain: BTreeSet<String>,
}

impl Pass<'_> {
    /// Whether a revert is under way: the replicas must run, no engine may,
    /// and no other snapshot work may change their chains meanwhile.
    pub(super) fn reverting(&self) -> bool {
        self.volume.revert_under_way().is_some()
    }

    /// Takes on, refuses, or carries on with the volume's revert.
    pub(super) async fn revert(&mut self, engine: &Engine) -> Result<(), ControllerError> {
        let snapshot = self.volume.revert_unanswered().and_then(|asked| {
            let snapshots = self.snapshots.iter();
            snapshots
                .map(|s| &**s)
                .find(|s| s.name_any() == asked.snapshot)
        });
        let facts = Facts {
            snapshot,
            engine_stopped: self.engine_stopped(engine),
            busy: self.chain_busy(),
        };
        match decide(&self.volume, &facts) {
            Step::Idle => Ok(()),
            Step::Wait(why) => {
                info!(why, "revert waits");
                self.wait_at_most(SOON);
                Ok(())
            }
            Step::Refuse(why) => {
                self.answer_revert(RevertPhase::Failed, why).await;
                Ok(())
            }
            Step::Begin => self.begin_revert(engine).await,
            Step::Carry => self.carry_on_reverting(engine).await,
        }
    }

    /// Whether no engine runs, or the one left runs on a node that is down
    /// (the revert's generation fences it out).
    fn engine_stopped(&self, engine: &Engine) -> bool {
        let node = &engine.spec.instance.node_id;
        let node_down = !node.is_empty() && !self.ctx.liveness.is_up(node);
        engine.spec.instance.desire_state == DesireState::Stopped
            && (engine_state(engine) == InstanceState::Stopped || node_down)
    }

    /// Other work on the volume's chain that a revert must not race.
    fn chain_busy(&self) -> Option<&'static str> {
        let pending = self.snapshots.iter().any(|s| super::snapshots::pending(s));
        if pending {
            Some("a snapshot of the volume is being taken or removed")
        } else if self.dependents_filling() {
            Some("a volume is being filled from one of this volume's snapshots")
        } else if self.backing_up() {
            Some("a backup of the volume is being taken")
        } else {
            None
        }
    }

    /// Takes the revert on: a generation past every engine's, and the
    /// revert under way in status (written at the end of the pass, only if
    /// the volume did not change meanwhile). Nothing is reverted before
    /// the next pass sees it under way.
    async fn begin_revert(&mut self, engine: &Engine) -> Result<(), ControllerError> {
        let Some(asked) = self.volume.revert_unanswered().cloned() else {
            return Ok(());
        };
        let generation = engine.spec.generation + 1;
        self.set_engine(engine, json!({"spec": {"generation": generation}}))
            .await?;
        info!(snapshot = asked.snapshot, generation, "revert taken on");
        self.status.revert = Some(RevertStatus {
            request: asked.request,
            snapshot: asked.snapshot.clone(),
            phase: RevertPhase::Reverting,
            message: format!("reverting to snapshot {}", asked.snapshot),
            generation,
        });
        self.ctx
            .event(
                &self.volume,
                EventType::Normal,
                "Reverting",
                format!("reverting to snapshot {}", asked.snapshot),
            )
            .await;
        self.wait_at_most(SOON);
        Ok(())
    }

    async fn carry_on_reverting(&mut self, engine: &Engine) -> Result<(), ControllerError> {
        let Some(under_way) = self.volume.revert_under_way().cloned() else {
            return Ok(());
        };
        let span = info_span!("revert", snapshot = %under_way.snapshot);
        let waiting = if !self.engine_stopped(engine) {
            Some("waiting for the engine to stop".to_owned())
        } else if engine.spec.generation < under_way.generation {
            Some("waiting for the engine's new generation".to_owned())
        } else {
            None
        };
        if let Some(why) = waiting {
            self.revert_waits(&under_way, why);
            return Ok(());
        }
        let running = self.running_replicas();
        if running.is_empty() {
            self.revert_waits(&under_way, "waiting for the replicas to run".to_owned());
            return Ok(());
        }
        let outcome = self
            .revert_replicas(&under_way.snapshot, &running)
            .instrument(span.clone())
            .await;
        match outcome {
            Ok(Ok(reverted)) => {
                self.revert_done(&under_way, reverted)
                    .instrument(span)
                    .await
            }
            Ok(Err(NoPlan::Wait(why))) => {
                self.revert_waits(&under_way, why);
                Ok(())
            }
            Ok(Err(NoPlan::Impossible(why))) => {
                self.answer_revert(RevertPhase::Failed, why).await;
                Ok(())
            }
            Err(error) if error.is_data_plane() => {
                warn!(parent: &span, %error, "revert not done yet");
                self.revert_waits(&under_way, error.to_string());
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// The revert under way waits: say why in its status, look again soon.
    fn revert_waits(&mut self, under_way: &RevertStatus, why: String) {
        info!(why, "revert waits");
        self.wait_at_most(SOON);
        self.status.revert = Some(RevertStatus {
            message: why,
            ..under_way.clone()
        });
    }

    /// Reverts the replicas the plan names, then records them as the I/O
    /// path on each.
    async fn revert_replicas(
        &self,
        snapshot: &str,
        running: &[(Arc<Replica>, String)],
    ) -> Result<Result<Reverted, NoPlan>, ControllerError> {
        let access = self.access();
        let mut controls = Vec::with_capacity(running.len());
        let mut statuses = Vec::with_capacity(running.len());
        for (replica, address) in running {
            let mut control =
                data_plane::replica(replica, address, Some(CALL_TIMEOUT), &access).await?;
            statuses.push(control.status().await?);
            controls.push(control);
        }
        let Plan { revert, record } = match plan(snapshot, access.generation, &statuses) {
            Ok(plan) => plan,
            Err(no) => return Ok(Err(no)),
        };
        let mut chain = BTreeSet::new();
        let mut replicas = Vec::with_capacity(revert.len());
        for &i in &revert {
            let name = running[i].0.name_any();
            info!(replica = %name, "reverting the replica");
            let request = RevertRequest {
                name: snapshot.to_owned(),
            };
            let reply = controls[i].client.revert(request).await;
            let status = reply.map_err(|e| controls[i].failed(e))?.into_inner();
            chain.extend(status.snapshots.into_iter().map(|s| s.name));
            replicas.push(name);
        }
        // Past every revision seen: a salvage, which goes by revisions,
        // then never takes a replica left out for as current as these.
        let revision = statuses.iter().map(|s| s.revision).max().unwrap_or(0) + 1;
        for &i in &revert {
            let request = SetRevisionRequest { revision };
            let reply = controls[i].client.set_revision(request).await;
            reply.map_err(|e| controls[i].failed(e))?;
            let reply = controls[i].client.set_io_path(record.clone()).await;
            reply.map_err(|e| controls[i].failed(e))?;
        }
        info!(replicas = ?replicas, generation = record.generation, version = record.version, "replicas reverted and recorded as the I/O path");
        Ok(Ok(Reverted { replicas, chain }))
    }

    /// Every replica in the I/O path is reverted: the replicas left out are
    /// failed (they are rebuilt before serving, and never a source), the
    /// Snapshots whose layers went are deleted, and the revert is done.
    async fn revert_done(
        &mut self,
        under_way: &RevertStatus,
        reverted: Reverted,
    ) -> Result<(), ControllerError> {
        let now = Time(jiff::Timestamp::now());
        let left_out: Vec<usize> = (0..self.replicas.len())
            .filter(|&i| {
                let replica = &self.replicas[i];
                // One never placed holds no data.
                !replica.spec.instance.node_id.is_empty()
                    && replica.spec.failed_at.is_none()
                    && replica.metadata.deletion_timestamp.is_none()
                    && !reverted.replicas.contains(&replica.name_any())
            })
            .collect();
        for i in left_out {
            let why = format!(
                "replica {} was not reverted to snapshot {}: it is rebuilt before it serves",
                self.replicas[i].name_any(),
                under_way.snapshot
            );
            self.mark_failed(i, &now, why).await?;
        }
        let api = self.ctx.api::<Snapshot>();
        let mut discarded = Vec::new();
        for snapshot in &self.snapshots {
            let ready = snapshot.status.as_ref().is_some_and(|s| s.ready_to_use);
            if ready
                && snapshot.metadata.deletion_timestamp.is_none()
                && !reverted.chain.contains(&snapshot.name_any())
            {
                delete(&api, &**snapshot).await?;
                discarded.push(snapshot.name_any());
            }
        }
        let mut message = format!(
            "reverted to snapshot {} on replicas {}: writes after it are discarded",
            under_way.snapshot,
            reverted.replicas.join(", ")
        );
        if !discarded.is_empty() {
            message.push_str(&format!(
                ", and the snapshots taken after it ({}) deleted",
                discarded.join(", ")
            ));
        }
        self.answer_revert(RevertPhase::Reverted, message).await;
        Ok(())
    }

    /// Answers the revert asked (refused) or under way (done or impossible),
    /// with an Event.
    async fn answer_revert(&mut self, phase: RevertPhase, message: String) {
        let (request, snapshot, generation) = match (
            self.volume.revert_under_way(),
            self.volume.revert_unanswered(),
        ) {
            (Some(u), _) => (u.request.clone(), u.snapshot.clone(), u.generation),
            (None, Some(a)) => (a.request.clone(), a.snapshot.clone(), 0),
            (None, None) => return,
        };
        let (type_, reason) = match phase {
            RevertPhase::Reverted => (EventType::Normal, "Reverted"),
            _ => (EventType::Warning, "RevertFailed"),
        };
        match phase {
            RevertPhase::Reverted => info!(message, "revert done"),
            _ => warn!(message, "revert refused"),
        }
        self.ctx
            .event(&self.volume, type_, reason, message.clone())
            .await;
        self.status.revert = Some(RevertStatus {
            request,
            snapshot,
            phase,
            message,
            generation,
        });
    }
}
