//! Starting an instance's process so that it outlives the manager.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::pidfd::{PidFd, ProcStat};
use super::{InstanceError, InstanceManagerConfig, InstanceRequest};

/// A process just started: the handle that watches it and its start time
/// for the record.
pub(super) struct Spawned {
    pub pidfd: PidFd,
    pub start_time: u64,
}

/// `<state_dir>/logs/<name>.log`, where the process's output goes.
pub(super) fn log_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("logs").join(format!("{name}.log"))
}

/// Starts `oxhorn` for `request` on `port`, its output appended to its log.
pub(super) fn spawn(
    config: &InstanceManagerConfig,
    request: &InstanceRequest,
    port: u16,
) -> Result<Spawned, InstanceError> {
    let args = request.args(config.ip, port, &config.run_dir, &config.dev_dir);
    let log_path = log_path(&config.state_dir, &request.name);
    let mut log = open_log(&log_path)?;
    // A line per start, so the log shows where each run's output begins.
    writeln!(
        log,
        "--- instance manager: starting {} {args:?}",
        config.binary.display()
    )
    .map_err(|e| InstanceError::io("writing", &log_path, e))?;
    let stderr = log
        .try_clone()
        .map_err(|e| InstanceError::io("opening", &log_path, e))?;

    let mut command = Command::new(&config.binary);
    // In the environment, which only the process's owner can read, rather
    // than on the command line, which anyone on the node can.
    let key = config.key.for_volume(request.kind.volume());
    command
        .args(&args)
        .env(crate::protocol::KEY_ENV, key.to_hex())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr);
    // SAFETY: only setsid, which is async-signal-safe, runs in the child.
    unsafe {
        // A session of its own: a signal to the manager's process group or
        // session (Ctrl-C, a hang-up) must not reach the instance, which
        // keeps serving I/O while the manager restarts. Deliberately no
        // PR_SET_PDEATHSIG, for the same reason.
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| InstanceError::io("starting", &config.binary, e))?;
    match watch(&child) {
        // `child` is dropped without waiting, which std allows: the pidfd
        // sees the exit and the supervisor reaps the process.
        Ok(spawned) => Ok(spawned),
        Err(error) => {
            // Without a handle nothing would supervise or record it.
            let _ = child.kill();
            let _ = child.wait();
            Err(error)
        }
    }
}

fn open_log(path: &Path) -> Result<File, InstanceError> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| InstanceError::io("creating", dir, e))?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| InstanceError::io("opening", path, e))
}

/// The handle and start time of a child just spawned. Its pid cannot have
/// been reused yet: an unreaped child keeps its pid, even once it exits.
fn watch(child: &Child) -> Result<Spawned, InstanceError> {
    let pid = child.id();
    let proc_path = || PathBuf::from(format!("/proc/{pid}"));
    let pidfd = PidFd::open(pid).map_err(|e| InstanceError::io("pidfd_open", &proc_path(), e))?;
    let start_time = ProcStat::read(pid)
        .map_err(|e| InstanceError::io("reading", &proc_path(), e))?
        .start_time;
    Ok(Spawned { pidfd, start_time })
}
