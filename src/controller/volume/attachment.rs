//! Attaching a volume (its replicas, then its engine on spec.nodeID),
//! detaching it, and salvaging it when every replica failed.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{info, warn};

use super::super::{ControllerError, patch_guarded};
use super::{Pass, SOON, engine_state, replica_address};
use crate::types::{DesireState, Engine, InstanceState, Replica};

impl Pass<'_> {
    /// Runs the replicas, then the engine on spec.nodeID with the replicas
    /// whose processes run.
    pub(super) async fn attach(&mut self, engine: &Engine) -> Result<(), ControllerError> {
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
        if self.salvage_pending(engine) && !self.restart_to_salvage(engine).await? {
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
            // A new engine fences every older one out of the replicas, and
            // a standby's restores, which wrote as generations of their own.
            let restored = self.status.standby.as_ref().map_or(0, |s| s.generation);
            let generation = if starting {
                spec.generation.max(restored) + 1
            } else {
                spec.generation
            };
            info!(replicas = ?addresses.keys().collect::<Vec<_>>(), generation, "engine wanted on {target}");
            let mut patch = json!({"spec": {
                "nodeID": target,
                "desireState": "running",
                "replicaAddressMap": replacing(&spec.replica_address_map, &addresses),
                "volumeSize": self.volume.spec.size,
                "generation": generation,
            }});
            if starting {
                let node = self.ctx.ds.nodes.get(&target);
                let frontend = self.volume.spec.frontend.on(node.as_deref());
                patch["spec"]["frontend"] = serde_json::to_value(frontend)?;
                patch["spec"]["chapSecret"] = self.volume.spec.chap_secret.clone().into();
                let salvage = self.salvage_pending(engine);
                patch["spec"]["salvage"] = salvage.into();
                if salvage {
                    patch["spec"]["salvageRequest"] =
                        self.volume.spec.salvage_request.clone().into();
                }
            }
            self.set_engine(engine, patch).await?;
        } else if spec.salvage && engine_state(engine) == InstanceState::Running {
            self.salvaged(engine, &addresses).await?;
        }
        Ok(())
    }

    /// Whether the user asked for a salvage not yet done. The engine says
    /// which request its last salvage start was made for, and clears its
    /// salvage flag once that start served: the Volume's status in the cache
    /// may be older than that.
    fn salvage_pending(&self, engine: &Engine) -> bool {
        let request = &self.volume.spec.salvage_request;
        let answered = engine.spec.salvage_request == *request && !engine.spec.salvage;
        !request.is_empty() && *request != self.status.salvaged_request && !answered
    }

    /// For a salvage the user asked for: the engine is stopped, to start
    /// again with the salvage flag. Always, even one that seems to serve: its
    /// status may be older than the loss of its replicas. True when
    /// attaching may go on.
    async fn restart_to_salvage(&mut self, engine: &Engine) -> Result<bool, ControllerError> {
        let spec = &engine.spec;
        let state = engine_state(engine);
        if spec.salvage {
            // Started for this request already, and not served yet.
            return Ok(true);
        }
        // An engine on a node that is down is as good as stopped: nobody
        // can stop it, and the next one's generation fences it.
        let node_down =
            !spec.instance.node_id.is_empty() && !self.ctx.liveness.is_up(&spec.instance.node_id);
        if spec.instance.desire_state == DesireState::Stopped || node_down {
            // Start again only once stopped: a process still waiting would
            // keep waiting.
            if state != InstanceState::Stopped && !node_down {
                self.wait_at_most(SOON);
                return Ok(false);
            }
            return Ok(true);
        }
        warn!("salvage requested: restarting the engine to serve the replicas it reaches");
        self.set_engine(engine, json!({"spec": {"desireState": "stopped"}}))
            .await?;
        self.wait_at_most(SOON);
        Ok(false)
    }

    /// An engine started to salvage serves: the request is done, and the
    /// engine's next start waits for its I/O path again.
    async fn salvaged(
        &mut self,
        engine: &Engine,
        addresses: &BTreeMap<String, String>,
    ) -> Result<(), ControllerError> {
        let names: Vec<&String> = addresses.keys().collect();
        warn!(replicas = ?names, "salvaged: the volume serves the replicas it reached");
        self.ctx
            .event(
                &self.volume,
                EventType::Warning,
                "Salvaged",
                format!(
                    "as requested ({}), the volume serves replicas {names:?}: acknowledged writes only other replicas held are lost",
                    engine.spec.salvage_request
                ),
            )
            .await;
        // status.salvagedRequest follows from the engine (see observe).
        self.set_engine(engine, json!({"spec": {"salvage": false}}))
            .await
    }

    /// Stops the engine, then the replicas, unless the data plane has work
    /// for them (`busy`: a snapshot to take or remove, a fill): then the
    /// usable replicas run without an engine.
    pub(super) async fn detach(
        &mut self,
        engine: &Engine,
        busy: bool,
    ) -> Result<(), ControllerError> {
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
    pub(super) async fn salvage(&mut self, engine: &Engine) -> Result<(), ControllerError> {
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

    /// Changes the volume's engine, remembering the write until the cache
    /// shows it.
    pub(super) async fn set_engine(
        &self,
        engine: &Engine,
        patch: serde_json::Value,
    ) -> Result<(), ControllerError> {
        let written = patch_guarded(&self.ctx.api::<Engine>(), engine, patch).await?;
        self.ctx.expected.changed(&self.name(), engine, &written);
        Ok(())
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
