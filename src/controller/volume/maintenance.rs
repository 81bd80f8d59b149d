//! The recurring tasks that make nothing: snapshot-delete (the volume's
//! oldest snapshots past a count), snapshot-cleanup (the snapshots the
//! system took for rebuilds) and filesystem-trim. Each is done within its
//! turn; a volume it cannot be done on now is skipped, saying why.

use std::sync::Arc;

use kube::ResourceExt;
use tracing::info;

use super::super::{ControllerError, delete};
use super::recurring::Step;
use super::{Pass, running_status};
use crate::types::{
    BACKUP_FOR, CLONE_FOR, CSI_SNAPSHOT, Engine, MADE_BY, RecurringJob, RecurringTask, ReplicaMode,
    Snapshot,
};

impl Pass<'_> {
    /// Does `job`'s task, one that makes nothing, on the volume.
    pub(super) async fn maintain(
        &mut self,
        job: &RecurringJob,
        engine: &Engine,
    ) -> Result<Step, ControllerError> {
        match job.spec.task {
            RecurringTask::SnapshotDelete => self.delete_snapshots(job).await,
            RecurringTask::SnapshotCleanup => Ok(self.clean_up_snapshots(engine).await),
            RecurringTask::FilesystemTrim => Ok(self.trim(engine).await),
            other => Ok(Step::Failed(format!("{other:?} is not a maintenance task"))),
        }
    }

    /// Deletes the oldest of the snapshots nothing holds past `retain`:
    /// neither a clone being filled, nor a backup, nor a CSI
    /// VolumeSnapshot (whose user deletes it through Kubernetes).
    async fn delete_snapshots(&mut self, job: &RecurringJob) -> Result<Step, ControllerError> {
        let mut free: Vec<Arc<Snapshot>> = self
            .snapshots
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .filter(|s| s.status.as_ref().is_some_and(|st| st.ready_to_use))
            .filter(|s| {
                let labels = s.labels();
                !(labels.contains_key(BACKUP_FOR)
                    || labels.contains_key(CLONE_FOR)
                    || labels.contains_key(CSI_SNAPSHOT))
            })
            .cloned()
            .collect();
        free.sort_by_key(|s| {
            std::cmp::Reverse((
                s.metadata.creation_timestamp.clone().map(|t| t.0),
                s.name_any(),
            ))
        });
        let retain = usize::try_from(job.spec.retain).unwrap_or(0);
        let doomed: Vec<Arc<Snapshot>> = free.into_iter().skip(retain).collect();
        if doomed.is_empty() {
            return Ok(Step::Skipped(format!(
                "{retain} snapshots or fewer to keep"
            )));
        }
        for snapshot in &doomed {
            info!(snapshot = %snapshot.name_any(), made_by = ?snapshot.labels().get(MADE_BY), "deleting past snapshot-delete's count");
            delete(&self.ctx.api::<Snapshot>(), &**snapshot).await?;
        }
        Ok(Step::Succeeded)
    }

    /// Removes the snapshots the system took (for rebuilds) that no
    /// Snapshot names, through the running engine, once no rebuild, backup
    /// or clone reads the chain.
    async fn clean_up_snapshots(&mut self, engine: &Engine) -> Step {
        let Some(status) = running_status(engine) else {
            return Step::Skipped(
                "the volume is detached: system snapshots are removed while it is attached".into(),
            );
        };
        let rebuilding = !status.rebuild_status.is_empty()
            || status
                .replica_mode_map
                .values()
                .any(|m| *m != ReplicaMode::ReadWrite);
        if rebuilding || self.backing_up() || self.dependents_filling() {
            return Step::Skipped("a rebuild, backup or clone reads the snapshots now".into());
        }
        let system: Vec<String> = status
            .snapshots
            .values()
            .filter(|s| !s.user_created && !s.removed)
            .filter(|s| !self.snapshots.iter().any(|k| k.name_any() == s.name))
            .map(|s| s.name.clone())
            .collect();
        if system.is_empty() {
            return Step::Skipped("no system snapshot to remove".into());
        }
        match self.remove_system_snapshots(engine, &system).await {
            Ok(()) => {
                info!(removed = ?system, "system snapshots removed");
                Step::Succeeded
            }
            Err(error) => Step::Failed(format!("removing system snapshots: {error}")),
        }
    }

    /// Trims the volume's filesystem where this node mounts it.
    async fn trim(&mut self, engine: &Engine) -> Step {
        let here = engine.spec.instance.node_id == self.ctx.node.node_id;
        if running_status(engine).is_none() || !here {
            return Step::Skipped("the volume is not attached on its owner's node".into());
        }
        let host = &self.ctx.node.host;
        let link = self.ctx.node.dev_dir.join(self.name());
        let Some(device) = std::fs::canonicalize(&link)
            .ok()
            .and_then(|d| crate::host::device::block_device_number(&d).ok().flatten())
        else {
            return Step::Skipped("the volume has no block device on this node".into());
        };
        let mounts = match host.mounts() {
            Ok(mounts) => mounts,
            Err(error) => return Step::Failed(format!("reading the mount table: {error}")),
        };
        let Some(mount) = mounts
            .into_iter()
            .find(|m| m.device == device && !m.read_only())
        else {
            return Step::Skipped("no filesystem of the volume is mounted read-write".into());
        };
        let path = mount.mount_point;
        match host
            .run(
                "fstrim",
                &[std::ffi::OsStr::new("--verbose"), path.as_os_str()],
            )
            .await
        {
            Ok(output) => {
                let said = String::from_utf8_lossy(&output.stdout).trim().to_owned();
                info!(mount = %path.display(), %said, "filesystem trimmed");
                Step::Succeeded
            }
            Err(error) => Step::Failed(format!("fstrim {}: {error}", path.display())),
        }
    }
}
