//! The engine's part of a rebuild: adding a replica and rebuilding it from a
//! healthy one (the replica's part is `replica/rebuild_pull.rs`).
//!
//! The new replica joins in WO mode at a quiesced point where the engine also
//! snapshots every replica, so that from then on it receives every new write
//! while the snapshot layers, immutable from that moment, are copied to it
//! from a RW replica (the replica skips chunks whose checksums already match).
//! At a second quiesced point it takes the source's revision counter and
//! becomes RW.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Instrument, info, info_span, warn};

use super::member::Member;
use super::{Engine, EngineError, Mode, write};
use crate::protocol;
use crate::protocol::control::{ReplicaStatusRequest, SetRevisionRequest, SyncFromRequest};

impl Engine {
    /// Adds the replica at `address` (a data address) and starts rebuilding it.
    /// A failed member with the same address is replaced.
    pub async fn add_replica(&self, address: &str) -> Result<(), EngineError> {
        let current = super::read(&self.members)
            .iter()
            .find(|m| m.address == address)
            .cloned();
        if current.as_ref().is_some_and(|m| m.mode() != Mode::Error) {
            return Err(EngineError::AlreadyMember(address.to_string()));
        }
        let (member, status) = Member::connect(address, &self.access).await?;
        let size = self.size.load(std::sync::atomic::Ordering::Acquire);
        if status.size != size {
            return Err(EngineError::InvalidAddress(
                address.to_string(),
                format!("replica size {} is not the volume's {size}", status.size),
            ));
        }
        let member = Arc::new(member);
        member.queue_rebuild("waiting for rebuild");
        {
            let mut members = write(&self.members);
            match members.iter().position(|m| m.address == address) {
                Some(i) => members[i] = member.clone(),
                None => members.push(member.clone()),
            }
        }
        write(&self.absent).retain(|(a, _)| a != address);
        self.watch(&member);
        self.spawn_rebuild(member);
        Ok(())
    }

    /// Limits each rebuild that starts from now on to `bytes_per_second` on
    /// average (0: no limit); those running keep theirs.
    pub fn set_rebuild_limit(&self, bytes_per_second: u64) {
        self.rebuild_limit
            .store(bytes_per_second, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn rebuild_limit(&self) -> u64 {
        self.rebuild_limit
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the replica out of the volume, and off the I/O-path record.
    pub async fn remove_replica(&self, address: &str) -> Result<(), EngineError> {
        let removed = {
            let mut members = write(&self.members);
            let position = members.iter().position(|m| m.address == address);
            position.map(|i| members.remove(i))
        };
        let absent = {
            let mut absent = write(&self.absent);
            let before = absent.len();
            absent.retain(|(a, _)| a != address);
            before != absent.len()
        };
        match removed {
            Some(member) => {
                self.fail(&member, "removed from the volume");
                self.settle_io_path().await
            }
            None if absent => Ok(()),
            None => Err(EngineError::NotMember(address.to_string())),
        }
    }

    pub(super) fn spawn_rebuild(&self, target: Arc<Member>) {
        let Some(engine) = self.myself.upgrade() else {
            return;
        };
        let span = info_span!("rebuild", volume = %self.volume, replica = %target.address);
        tokio::spawn(
            async move {
                let mut result = engine.rebuild(&target).await;
                if result.as_ref().is_err_and(EngineError::is_data_loss) {
                    // The source never hands over a rotten block: repair it
                    // from another replica's copy, then copy again.
                    warn!(error = ?result, "the rebuild's source holds blocks that fail their checksums: scrubbing the replicas, then rebuilding again");
                    result = match engine.run_scrub(engine.rebuild_limit()).await {
                        Ok(()) => engine.rebuild(&target).await,
                        Err(error) => Err(error),
                    };
                }
                match result {
                    Ok(()) => info!("rebuilt: replica RW"),
                    Err(error) => {
                        warn!(%error, "rebuild failed");
                        engine.fail(&target, &format!("rebuild failed: {error}"));
                    }
                }
            }
            .instrument(span),
        );
    }

    async fn rebuild(&self, target: &Arc<Member>) -> Result<(), EngineError> {
        // One quiesced point: the target joins the writes, every replica
        // snapshots, and the target is told to sync (which marks it
        // rebuilding) before any write or discard reaches it.
        let (source, mut progress) = {
            let _quiet = self.gate.write().await;
            let source = self
                .members_in(&[Mode::ReadWrite])
                .into_iter()
                .next()
                .ok_or(EngineError::NoHealthyReplica)?;
            target.set_mode(Mode::WriteOnly);
            target.set_rebuild_source(&source.address);
            target.set_rebuild_progress(Some((0, 0)));
            self.snapshot_quiesced(&rebuild_snapshot_name(), false)
                .await?;
            let layers = control_status(&source).await?.snapshots;
            info!(source = %source.address, layers = layers.len(), "copying snapshot layers");
            let request = SyncFromRequest {
                source: source.control_address(),
                layers,
                bandwidth_limit: self.rebuild_limit(),
                ..SyncFromRequest::default()
            };
            let progress = protocol::within_deadline(target.control.clone().sync_from(request))
                .await
                .map_err(|e| EngineError::Control(target.address.clone(), e))?
                .into_inner();
            (source, progress)
        };
        let mut copied = 0;
        while let Some(step) = progress
            .message()
            .await
            .map_err(|e| EngineError::Control(target.address.clone(), e))?
        {
            if target.mode() != Mode::WriteOnly {
                return Err(EngineError::NotMember(target.address.clone()));
            }
            target.set_rebuild_progress(Some((step.bytes_done, step.bytes_total)));
            let more = step.bytes_copied.saturating_sub(copied);
            self.io_stats.rebuild_copied.fetch_add(more, Relaxed);
            copied = step.bytes_copied;
        }

        let _quiet = self.gate.write().await;
        let revision = control_status(&source).await?.revision;
        protocol::within_deadline(
            target
                .control
                .clone()
                .set_revision(SetRevisionRequest { revision }),
        )
        .await
        .map_err(|e| EngineError::Control(target.address.clone(), e))?;
        // On the record before it serves reads: from now on it holds
        // every acknowledged write, like the others.
        self.record_io_path(Some(target)).await?;
        target.set_rebuild_progress(None);
        target.set_rebuild_copied(copied);
        target.set_mode(Mode::ReadWrite);
        Ok(())
    }
}

async fn control_status(
    member: &Member,
) -> Result<crate::protocol::control::ReplicaStatus, EngineError> {
    Ok(
        protocol::within_deadline(member.control.clone().status(ReplicaStatusRequest {}))
            .await
            .map_err(|e| EngineError::Control(member.address.clone(), e))?
            .into_inner(),
    )
}

/// A system snapshot's name: unique, and sorting by time.
fn rebuild_snapshot_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("rebuild-{nanos:x}")
}
