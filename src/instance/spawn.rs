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

/// The last line a process wrote to its log, as Kubernetes takes a failed
/// container's last log lines for its termination message: a process that
/// gives up says why last. At most [`LAST_WORDS`] bytes of it.
pub(super) fn last_words(log: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(log).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    // A panic's last line is the hint about RUST_BACKTRACE; the message is
    // the line before.
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("note: "))?;
    // Not the instance manager's own line: the process said nothing.
    if line.starts_with("--- instance manager:") {
        return None;
    }
    let mut end = line.len().min(LAST_WORDS);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    Some(line[..end].to_owned())
}

/// How much of a log's end [`last_words`] reads, and keeps.
const TAIL: u64 = 4096;
const LAST_WORDS: usize = 512;

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
        .envs(request.kind.env())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn log(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.log");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn last_words_are_the_processs_last_line() {
        let (_dir, path) = log("--- instance manager: starting oxhorn [\"engine\"]\n\
             WARN not serving yet\n\
             ERROR oxhorn: exiting error=replicas [\"a\"] cannot be reached\n\n");
        assert_eq!(
            last_words(&path).as_deref(),
            Some("ERROR oxhorn: exiting error=replicas [\"a\"] cannot be reached")
        );
    }

    #[test]
    fn a_panic_says_what_panicked() {
        let (_dir, path) = log("thread 'main' panicked at src/main.rs:1:1:\nboom\n\
             note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n");
        assert_eq!(last_words(&path).as_deref(), Some("boom"));
    }

    #[test]
    fn a_process_that_said_nothing_has_no_last_words() {
        let (_dir, path) = log("old run's line\n--- instance manager: starting oxhorn []\n");
        assert_eq!(last_words(&path), None);
        assert_eq!(last_words(Path::new("/nonexistent/e.log")), None);
    }

    #[test]
    fn last_words_are_cut_short_on_a_character_boundary() {
        let (_dir, path) = log(&"é".repeat(LAST_WORDS));
        let words = last_words(&path).unwrap();
        assert!(words.len() <= LAST_WORDS && words.chars().all(|c| c == 'é'));
    }
}
