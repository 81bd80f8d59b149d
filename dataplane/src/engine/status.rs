//! The engine's report of itself: replicas, modes, rebuilds, snapshots.

use super::{Engine, Mode};
use crate::frontend::BlockDevice;
use crate::protocol;
use crate::protocol::control::{self, EngineReplica, EngineStatus, ReplicaStatusRequest};

impl Engine {
    /// What the engine knows of the volume and each replica.
    pub async fn status(&self) -> EngineStatus {
        let members = super::read(&self.members).clone();
        let mut replicas = Vec::new();
        let mut snapshots = Vec::new();
        for member in members {
            let mode = member.mode();
            let report = member.report();
            let mut control = member.control.clone();
            // A failed member is not asked: it may hang every status call
            // for the whole control deadline.
            let status = async {
                if mode == Mode::Error && report.rebuild.is_none() {
                    return Err(tonic::Status::unavailable("out of the I/O path"));
                }
                protocol::within_deadline(control.status(ReplicaStatusRequest {})).await
            };
            let revision = match status.await {
                Ok(status) => {
                    let status = status.into_inner();
                    if mode == Mode::ReadWrite && snapshots.is_empty() {
                        snapshots = status.snapshots;
                    }
                    status.revision
                }
                Err(_) => 0,
            };
            replicas.push(EngineReplica {
                address: member.address.clone(),
                mode: match mode {
                    Mode::ReadWrite => control::ReplicaMode::Rw,
                    Mode::WriteOnly => control::ReplicaMode::Wo,
                    // Queued for a rebuild that has not taken it in yet.
                    Mode::Error if report.rebuild.is_some() => control::ReplicaMode::Wo,
                    Mode::Error => control::ReplicaMode::Err,
                }
                .into(),
                revision,
                io_errors: report.io_errors,
                rebuilding: report.rebuild.is_some(),
                rebuild_bytes_done: report.rebuild.map(|r| r.0).unwrap_or(0),
                rebuild_bytes_total: report.rebuild.map(|r| r.1).unwrap_or(0),
                last_error: report.last_error,
                last_rebuild_bytes_copied: report.last_rebuild_copied,
                rebuild_source: report.rebuild_source,
            });
        }
        for (address, reason) in super::read(&self.absent).iter() {
            replicas.push(EngineReplica {
                address: address.clone(),
                mode: control::ReplicaMode::Err.into(),
                last_error: reason.clone(),
                ..EngineReplica::default()
            });
        }
        EngineStatus {
            volume: self.volume().to_string(),
            size: self.size(),
            replicas,
            snapshots,
            endpoint: String::new(),
            rebuild_limit: self.rebuild_limit(),
            scrub: Some(self.scrub_status()),
        }
    }
}
