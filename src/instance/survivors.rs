//! Processes that outlived their manager: a restarted manager adopts them, a
//! node's "power loss" ([`kill_recorded`]) kills them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tracing::{info, warn};

use super::pidfd::PidFd;
use super::record::{Found, Record, Records, remove_file};
use super::shared::Shared;
use super::supervisor::{clean_up_frontend_now, is_listening, launch};
use super::{InstanceError, InstanceInfo};
use crate::types::InstanceState;

/// How long a process gets to vanish after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Adopts every recorded process still alive; removes the other records.
pub(super) async fn adopt_all(shared: &Arc<Shared>) -> Result<(), InstanceError> {
    for found in shared.records.load_all()? {
        adopt(shared, found).await;
    }
    Ok(())
}

async fn adopt(shared: &Arc<Shared>, found: Found) {
    let record = match found.record {
        Ok(record) => record,
        Err(error) => {
            warn!(path = %found.path.display(), %error, "removing an unusable instance record");
            remove_or_warn(&found.path);
            return;
        }
    };
    let Some(pidfd) = PidFd::open_if_same(record.pid, record.start_time) else {
        let (instance, pid) = (&record.name, record.pid);
        info!(%instance, pid, "instance did not survive; removing its record");
        remove_or_warn(&found.path);
        return;
    };
    let ip = shared.config.ip;
    // One probe now, so a caller sees Running at once for a serving process.
    let state = if is_listening(SocketAddr::new(ip, record.port)).await {
        InstanceState::Running
    } else {
        InstanceState::Starting
    };
    let (instance, pid, port) = (&record.name, record.pid, record.port);
    info!(%instance, pid, port, ?state, "adopted a surviving instance");
    let info = InstanceInfo {
        state,
        ip,
        port: record.port,
        pid: Some(record.pid),
        restarts: 0,
        message: String::new(),
    };
    let mut table = shared.table();
    launch(
        shared,
        &mut table,
        record.request,
        record.port,
        info,
        Some((pidfd, record.start_time)),
    );
}

fn remove_or_warn(path: &Path) {
    if let Err(error) = remove_file(path) {
        warn!(%error, "stale instance record left");
    }
}

/// For tests and a "node power loss": SIGKILLs every process recorded under
/// `state_dir` (a pid whose start time differs from the record's is another
/// process now and is left alone), cleans up the FUSE mounts and loop
/// devices of the engines' volumes under `run_dir`/`dev_dir`, and removes
/// the records. Returns how many processes it killed.
///
/// A manager still running on `state_dir` would restart what this kills:
/// drop or shut it down first.
pub fn kill_recorded(
    state_dir: &Path,
    run_dir: &Path,
    dev_dir: &Path,
) -> Result<usize, InstanceError> {
    let mut killed = 0;
    let mut first_error = None;
    for found in Records::new(state_dir).load_all()? {
        if let Ok(record) = &found.record {
            match kill(record, run_dir, dev_dir) {
                Ok(true) => killed += 1,
                Ok(false) => {}
                Err(error) => {
                    warn!(instance = %record.name, %error, "not cleanly killed");
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Err(error) = remove_file(&found.path) {
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(killed), Err)
}

/// Kills the recorded process if it is still the one recorded, and cleans up
/// after an engine; whether there was a process to kill.
fn kill(record: &Record, run_dir: &Path, dev_dir: &Path) -> Result<bool, InstanceError> {
    let killed = match PidFd::open_if_same(record.pid, record.start_time) {
        Some(pidfd) => {
            // An error is ESRCH: it exited meanwhile.
            let _ = pidfd.signal(Signal::SIGKILL);
            let proc_path = PathBuf::from(format!("/proc/{}", record.pid));
            let gone = pidfd
                .wait_exit(KILL_WAIT)
                .map_err(|e| InstanceError::io("waiting for", &proc_path, e))?;
            if !gone {
                return Err(InstanceError::Unkillable { pid: record.pid });
            }
            // Reaps it if it is our child (a manager in this process started
            // it), so no zombie stays; its parent or init does otherwise.
            let _ = pidfd.reap();
            info!(instance = %record.name, pid = record.pid, "killed");
            true
        }
        None => false,
    };
    if let Some(volume) = record.request.kind.fuse_volume() {
        clean_up_frontend_now(volume, run_dir, dev_dir)?;
    }
    Ok(killed)
}
