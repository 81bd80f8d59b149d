//! Handles on processes that cannot be confused with a later process reusing
//! the pid: a pidfd names one process for its whole life, and the start time
//! in /proc tells whether a recorded pid is still the process recorded.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::libc;
use nix::sys::signal::Signal;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tracing::warn;

/// A process, by pidfd. Readable (for poll, epoll, tokio's `AsyncFd`) once the
/// process has exited.
#[derive(Debug)]
pub(super) struct PidFd {
    fd: OwnedFd,
    pid: u32,
}

impl PidFd {
    /// A handle on the process `pid` is now; ESRCH if there is none.
    pub fn open(pid: u32) -> io::Result<Self> {
        let raw_pid =
            libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: pidfd_open takes a pid and flags; it returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(fd).map_err(io::Error::other)?;
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, pid })
    }

    /// A handle on `pid` only if it is still the live process that started at
    /// `start_time` (clock ticks after boot, as /proc shows it).
    pub fn open_if_same(pid: u32, start_time: u64) -> Option<Self> {
        let pidfd = Self::open(pid).ok()?;
        // Checked after opening: the handle pins the process the pid names
        // now, so a match means the handle is on the recorded process.
        let stat = ProcStat::read(pid).ok()?;
        (stat.start_time == start_time && !stat.has_exited()).then_some(pidfd)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` to this very process, never to a successor with the
    /// same pid. ESRCH once it has exited.
    pub fn signal(&self, signal: Signal) -> io::Result<()> {
        // SAFETY: pidfd_send_signal takes an fd, a signal number, an optional
        // siginfo (null: as kill(2) would fill it) and flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Blocks up to `timeout` for the process to exit; whether it has.
    pub fn wait_exit(&self, timeout: Duration) -> io::Result<bool> {
        let mut pollfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        loop {
            // SAFETY: one valid pollfd, owned by this frame.
            let rc = unsafe { libc::poll(&mut pollfd, 1, millis) };
            if rc >= 0 {
                return Ok(rc > 0);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }

    /// Whether the process has exited, without waiting.
    pub fn has_exited(&self) -> bool {
        self.wait_exit(Duration::ZERO).unwrap_or(false)
    }

    /// Reaps the process if it is an exited child of this process, with how
    /// it ended. `None` if it still runs or is not our child (an adopted
    /// process: its parent, or init, reaps it).
    pub fn reap(&self) -> Option<WaitStatus> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG;
        match waitid(Id::PIDFd(self.fd.as_fd()), flags) {
            Ok(WaitStatus::StillAlive) | Err(_) => None,
            Ok(status) => Some(status),
        }
    }
}

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits for a process to exit without a thread per process: the runtime's
/// epoll watches the pidfd.
#[derive(Debug)]
pub(super) enum ExitWatch {
    Registered(AsyncFd<PidFd>),
    /// The runtime refused the fd (it should not): poll it instead.
    Polled(PidFd),
}

/// How often a [`ExitWatch::Polled`] process is checked.
const EXIT_POLL: Duration = Duration::from_millis(200);

impl ExitWatch {
    /// Must be called inside a tokio runtime.
    pub fn new(pidfd: PidFd) -> Self {
        // SAFETY: a PidFd owns its fd, never closes or replaces it while it
        // lives, and always returns that same fd from as_raw_fd.
        let registered = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) };
        match registered {
            Ok(fd) => ExitWatch::Registered(fd),
            Err(error) => {
                let (pidfd, error) = error.into_parts();
                warn!(%error, pid = pidfd.pid(), "cannot watch the pidfd; polling it");
                ExitWatch::Polled(pidfd)
            }
        }
    }

    pub fn pidfd(&self) -> &PidFd {
        match self {
            ExitWatch::Registered(fd) => fd.get_ref(),
            ExitWatch::Polled(pidfd) => pidfd,
        }
    }

    /// Completes once the process has exited. Cancel-safe.
    pub async fn exited(&self) {
        if let ExitWatch::Registered(fd) = self {
            match fd.readable().await {
                // Readiness is left set: the process stays exited.
                Ok(_guard) => return,
                Err(error) => warn!(%error, "lost the pidfd watch; polling it"),
            }
        }
        while !self.pidfd().has_exited() {
            tokio::time::sleep(EXIT_POLL).await;
        }
    }
}

/// What /proc/<pid>/stat says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcStat {
    /// Field 3: R, S, D, Z (zombie), X (dead)...
    pub state: char,
    /// Field 22: when the process started, in clock ticks after boot. With
    /// the pid it names one process: a reused pid has a later start time.
    pub start_time: u64,
}

impl ProcStat {
    pub fn read(pid: u32) -> io::Result<Self> {
        let path = format!("/proc/{pid}/stat");
        let text = std::fs::read_to_string(&path)?;
        Self::parse(&text)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("unexpected {path}")))
    }

    fn parse(text: &str) -> Option<Self> {
        // Field 2, the command name, is in parentheses and may itself hold
        // spaces and parentheses: the fields that follow start after the
        // last ')'.
        let (_, rest) = text.rsplit_once(')')?;
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.chars().next()?;
        // Fields 4 to 21 lie between the state (3) and the start time (22).
        let start_time = fields.nth(22 - 4)?.parse().ok()?;
        Some(Self { state, start_time })
    }

    /// A zombie or dead process: it only waits to be reaped.
    pub fn has_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_command_name_with_spaces_and_parentheses() {
        let line = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 \
                    1 0 987654 12345678 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        let stat = ProcStat::parse(line).expect("parses");
        assert_eq!(
            stat,
            ProcStat {
                state: 'S',
                start_time: 987654
            }
        );
        assert!(!stat.has_exited());
    }

    #[test]
    fn reads_this_process() {
        let stat = ProcStat::read(std::process::id()).expect("own stat");
        assert!(stat.start_time > 0);
        let pidfd = PidFd::open(std::process::id()).expect("pidfd");
        assert!(!pidfd.has_exited());
        assert!(PidFd::open_if_same(std::process::id(), stat.start_time).is_some());
        assert!(PidFd::open_if_same(std::process::id(), stat.start_time + 1).is_none());
    }

    #[test]
    #[expect(clippy::zombie_processes, reason = "reaped through the pidfd")]
    fn sees_a_child_exit_and_reaps_it() {
        let child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pidfd = PidFd::open(child.id()).expect("pidfd");
        assert!(pidfd.wait_exit(Duration::from_secs(10)).expect("poll"));
        let status = pidfd.reap().expect("reaped");
        assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
    }
}
