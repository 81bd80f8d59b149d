//! Filling a new volume from a Backup before its first use: the backup's
//! blocks, each checked against its checksum, are written to every replica
//! of the volume at once over the data protocol (as the volume's engine
//! would, with its generation), flushed, and the replicas given one
//! revision and marked clean, as after a fill from a snapshot. A block
//! missing from the store or corrupt there fails the restore naming it, for
//! good: the volume, not Filled, never attaches, and is to be deleted.

use bytes::Bytes;
use tracing::info;

use super::super::ControllerError;
use super::fill::{Step, settle};
use super::{Pass, replica_address};
use crate::backup::{BackupError, VolumeWriter};
use crate::protocol::Connection;
use crate::types::{BackupState, FILLED, Replica};

/// The Filled reason of a restore that found its backup damaged.
const RESTORE_FAILED: &str = "RestoreFailed";

impl Pass<'_> {
    /// Restores the volume from the Backup `name`.
    pub(super) async fn restore_from(&self, name: &str) -> Result<Step, ControllerError> {
        let failed = self.status.conditions.iter().find(|c| c.type_ == FILLED);
        if let Some(failed) = failed.filter(|c| c.reason == RESTORE_FAILED) {
            // The backup does not change: trying again would fail again.
            return Ok(Step::Waiting(RESTORE_FAILED, failed.message.clone()));
        }
        let ctx = self.ctx;
        let Some(backup) = ctx.ds.backups.get(name) else {
            let message = format!("backup {name} does not exist");
            return Ok(Step::Waiting("SourceNotFound", message));
        };
        let status = backup.status.clone().unwrap_or_default();
        if status.state != BackupState::Completed {
            let message = format!("backup {name} is not completed yet");
            return Ok(Step::Waiting("WaitingForSource", message));
        }
        if status.size > self.volume.spec.size {
            let message = format!(
                "backup {name} holds {} bytes, more than the volume's {}",
                status.size, self.volume.spec.size
            );
            return Ok(Step::Waiting("SourceTooLarge", message));
        }
        let target_name = &backup.spec.backup_target_name;
        let Some(target) = ctx.ds.backup_targets.get(target_name) else {
            let message = format!("BackupTarget {target_name} does not exist");
            return Ok(Step::Waiting("WaitingForSource", message));
        };
        let store = match ctx.open_store(&target) {
            Ok(store) => store,
            Err(error) => return Ok(Step::Waiting("WaitingForSource", error.to_string())),
        };
        let targets = self.running_replicas();
        if targets.is_empty() {
            let message = "waiting for the volume's replicas to run".to_owned();
            return Ok(Step::Waiting("Filling", message));
        }
        let access = self.access();
        let mut replicas = Vec::with_capacity(targets.len());
        for (replica, _) in &targets {
            let address = replica_address(replica).unwrap_or_default();
            let connection = Connection::connect(&address, &access).await;
            replicas.push(connection.map_err(|e| restore_failed(replica, e))?);
        }
        info!(
            backup = name,
            replicas = replicas.len(),
            "restoring from the backup"
        );
        let writer = Replicas(replicas);
        match store.restore(&backup.spec.volume_name, name, &writer).await {
            Ok(bytes) => info!(backup = name, bytes, "restored"),
            Err(
                error @ (BackupError::BlockMissing { .. }
                | BackupError::BlockCorrupt { .. }
                | BackupError::Malformed(..)),
            ) => {
                let message = format!("backup {name}: {error}");
                return Ok(Step::Waiting(RESTORE_FAILED, message));
            }
            Err(error) => {
                let message = format!("restoring backup {name}: {error}");
                return Ok(Step::Waiting("FillFailed", message));
            }
        }
        for (connection, (replica, _)) in writer.0.iter().zip(&targets) {
            connection
                .flush()
                .await
                .map_err(|e| restore_failed(replica, e))?;
        }
        settle(&targets, &access, 0).await?;
        Ok(Step::Done(format!("holds the data of backup {name}")))
    }
}

fn restore_failed(replica: &Replica, error: impl std::fmt::Display) -> ControllerError {
    ControllerError::DataPlane {
        target: format!("replica {}", kube::ResourceExt::name_any(replica)),
        address: replica_address(replica).unwrap_or_default(),
        status: Box::new(tonic::Status::unavailable(error.to_string())),
    }
}

/// Every replica of the volume, written alike.
struct Replicas(Vec<Connection>);

impl VolumeWriter for Replicas {
    async fn write(&self, offset: u64, data: Bytes) -> std::io::Result<()> {
        let writes = self.0.iter().map(|c| c.write(offset, data.clone()));
        futures::future::try_join_all(writes)
            .await
            .map_err(std::io::Error::other)?;
        Ok(())
    }
}
