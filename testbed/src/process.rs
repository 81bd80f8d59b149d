//! Child processes that cannot outlive their parent, with their output kept in
//! a log file for error messages.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::{Error, Result};

pub struct Supervised {
    pub name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Spawns `command` with stdout and stderr written to `log`. The child is
    /// killed when this is dropped, and when the spawning thread exits. It
    /// runs in a process group of its own, so a terminal's Ctrl-C reaches
    /// only the program that started it, which then stops it in order.
    pub fn spawn(name: &'static str, mut command: Command, log: &Path) -> Result<Self> {
        let out = File::create(log).map_err(|e| Error::io(log, e))?;
        let err = out.try_clone().map_err(|e| Error::io(log, e))?;
        command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: only async-signal-safe calls (prctl, getppid) run in the child.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // The parent may have died before prctl took effect.
                if nix::unistd::getppid() == Pid::from_raw(1) {
                    return Err(std::io::Error::other("parent exited"));
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| Error::io(command.get_program(), e))?;
        Ok(Self {
            name,
            child,
            log: log.to_path_buf(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error if the process has exited, with the end of its log.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Failed(format!(
                "{} exited ({status}); end of {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail(30)
            ))),
            Err(e) => Err(Error::io(self.name, e)),
        }
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        self.wait(timeout)
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| Error::io(self.name, e))? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(Error::Failed(format!(
                    "{} still running after {timeout:?}",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (SIGSTOP, SIGCONT: a process that hangs and recovers).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        let pid = Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal)
            .map_err(|e| Error::Failed(format!("{} {signal}: {e}", self.name)))
    }

    /// Kills the process with SIGKILL and reaps it; nothing if it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last `lines` lines of the process's output.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills with SIGKILL every process whose arguments (the program first)
/// `match`, and waits up to 5 s for each to be gone: what a crash left
/// behind that nothing else names.
pub(crate) fn kill_where(matches: impl Fn(&[String]) -> bool) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let mut killed = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let args = arguments(&entry.path());
        if !args.is_empty() && matches(&args) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            killed.push(entry.path());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    // A process gone, or a zombie, has no arguments left.
    while killed.iter().any(|proc| !arguments(proc).is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The arguments of the process at `proc` (/proc/PID); none once it is gone.
fn arguments(proc: &Path) -> Vec<String> {
    let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
    cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Runs `program` with `args` to its end; its output, or an error with what
/// it said.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Error::io(program, e))?;
    if !output.status.success() {
        return Err(Error::Failed(format!(
            "{program} {}: {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// An exclusive lock on the file at `path` (made, with its directory, if
/// missing), held by other processes too until the result is dropped;
/// waits for it.
pub(crate) fn lock_exclusive(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::Failed(format!("locking {}: {e}", path.display())))
}
