//! One task per instance: starts its process, tells when it listens,
//! restarts it with backoff when it dies unasked, and stops it when asked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, field, info, info_span, warn};

use super::pidfd::{ExitWatch, PidFd};
use super::shared::{Done, Entry, Shared, StopResult, Table};
use super::{InstanceError, InstanceInfo, InstanceRequest};
use crate::frontend::{FuseFrontend, FuseOptions};
use crate::types::InstanceState;

/// How often a starting process is checked for listening.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// A connect to a local port that takes longer than this failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a process gets to exit after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(15);

/// Adds an instance to `table` and starts its supervisor task, which starts
/// the process or, given `adopted`, watches the one already running.
pub(super) fn launch(
    shared: &Arc<Shared>,
    table: &mut Table,
    request: InstanceRequest,
    port: u16,
    info: InstanceInfo,
    adopted: Option<(PidFd, u64)>,
) {
    let generation = table.next_generation;
    table.next_generation += 1;
    let name = request.name.clone();
    let kind = request.kind.noun();
    let span = info_span!("instance", instance = %name, kind, port, pid = field::Empty);
    if let Some(pid) = info.pid {
        span.record("pid", pid);
    }
    let stop = CancellationToken::new();
    let (done_tx, done_rx) = watch::channel(None);
    let start_time = adopted.as_ref().map(|(_, start_time)| *start_time);
    let supervisor = Supervisor {
        shared: Arc::clone(shared),
        name: name.clone(),
        generation,
        port,
        stop: stop.clone(),
        span: span.clone(),
        done: done_tx,
    };
    // The task locks the table first thing, so it waits until the entry
    // below is in.
    let task = shared.runtime.spawn(
        supervisor
            .run(adopted.map(|(pidfd, _)| pidfd))
            .instrument(span),
    );
    table.entries.insert(
        name,
        Entry {
            generation,
            request,
            port,
            info,
            start_time,
            stop,
            done: done_rx,
            task: task.abort_handle(),
        },
    );
}

/// Waits until the supervisor behind `done` has ended; how its stop went.
pub(super) async fn finished(mut done: Done) -> StopResult {
    // The supervisor never sends but its result: wait for the channel to close.
    while done.changed().await.is_ok() {}
    done.borrow().clone()
}

/// The task of one instance. Dropping it (the task ended or was aborted)
/// forgets the instance; the process, if any, is left alone.
struct Supervisor {
    shared: Arc<Shared>,
    name: String,
    generation: u64,
    port: u16,
    stop: CancellationToken,
    span: Span,
    /// Dropped last (after `Drop::drop` forgot the entry): stop() then knows
    /// the instance is gone.
    done: watch::Sender<StopResult>,
}

/// How a process's watch ended.
enum Watched {
    /// It exited unasked, as described.
    Exited(String),
    /// stop() was called and it is gone; `killed` if it took SIGKILL.
    Stopped { killed: bool },
}

impl Supervisor {
    async fn run(self, adopted: Option<PidFd>) {
        let mut backoff = Backoff::default();
        let mut next = adopted;
        let mut restart = false;
        // Whether the last process may have left a FUSE mount behind: it died
        // unasked or took SIGKILL.
        let mut left_behind = false;
        loop {
            let pidfd = match next.take() {
                Some(pidfd) => pidfd,
                None => match self.start(restart).await {
                    Ok(Some(pidfd)) => pidfd,
                    Ok(None) => break,
                    Err(error) => {
                        restart = true;
                        let delay = backoff.after(Duration::ZERO);
                        warn!(%error, ?delay, "instance did not start");
                        self.set_error(format!("could not start: {error}"), delay);
                        if self.backed_off(delay).await {
                            continue;
                        }
                        break;
                    }
                },
            };
            let started = Instant::now();
            match self.watch(pidfd).await {
                Watched::Stopped { killed } => {
                    left_behind = killed;
                    break;
                }
                Watched::Exited(status) => {
                    let log = super::spawn::log_path(&self.shared.config.state_dir, &self.name);
                    let words = tokio::task::spawn_blocking(move || super::spawn::last_words(&log));
                    let status = match words.await.ok().flatten() {
                        Some(words) => format!("{status}; its last words: {words}"),
                        None => status,
                    };
                    restart = true;
                    left_behind = true;
                    let delay = backoff.after(started.elapsed());
                    info!(%status, ?delay, "instance exited; restarting after a delay");
                    self.set_error(status, delay);
                    if !self.backed_off(delay).await {
                        break;
                    }
                }
            }
        }
        // Here only after stop() or a shutdown; a shutdown leaves things be.
        if self.stop.is_cancelled() {
            let result = self.finish_stop(left_behind).await;
            if let Err(error) = &result {
                warn!(%error, "instance stopped, not cleanly");
            } else {
                info!("instance stopped");
            }
            self.done
                .send_replace(Some(result.map_err(|e| e.to_string())));
        }
    }

    /// Starts the process on the blocking pool (fork and file writes block).
    async fn start(&self, restart: bool) -> Result<Option<PidFd>, InstanceError> {
        let (shared, name, generation) =
            (Arc::clone(&self.shared), self.name.clone(), self.generation);
        let pidfd =
            tokio::task::spawn_blocking(move || shared.spawn_recorded(&name, generation, restart))
                .await
                .map_err(|e| InstanceError::Task(e.to_string()))??;
        if let Some(pidfd) = &pidfd {
            self.span.record("pid", pidfd.pid());
            info!(pid = pidfd.pid(), restart, "instance started");
        }
        Ok(pidfd)
    }

    /// Watches a process until it exits or stop() is called, marking it
    /// Running once it accepts connections.
    async fn watch(&self, pidfd: PidFd) -> Watched {
        let process = ExitWatch::new(pidfd);
        let listening = wait_listening(SocketAddr::new(self.shared.config.ip, self.port));
        tokio::pin!(listening);
        let mut running = false;
        loop {
            tokio::select! {
                () = &mut listening, if !running => {
                    running = true;
                    self.set_running();
                }
                () = process.exited() => {
                    return Watched::Exited(describe(process.pidfd().reap()));
                }
                () = self.stop.cancelled() => {
                    return Watched::Stopped { killed: terminate(&process).await };
                }
            }
        }
    }

    /// Sleeps `delay` before a restart; false if stop() was called meanwhile.
    async fn backed_off(&self, delay: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = self.stop.cancelled() => false,
        }
    }

    /// Running, unless stop() has begun meanwhile.
    fn set_running(&self) {
        self.shared.update(&self.name, self.generation, |entry, _| {
            if entry.info.state == InstanceState::Starting {
                entry.info.state = InstanceState::Running;
                info!("instance running");
            }
        });
    }

    /// Error, with why and when the next start comes; the record goes, as
    /// the process it named is gone.
    fn set_error(&self, reason: String, delay: Duration) {
        self.shared
            .update(&self.name, self.generation, |entry, records| {
                if let Err(error) = records.remove(&self.name) {
                    warn!(%error, "stale instance record left");
                }
                entry.info.pid = None;
                entry.start_time = None;
                if entry.info.state != InstanceState::Stopping {
                    entry.info.state = InstanceState::Error;
                    entry.info.message = format!("{reason}; restarting in {}s", delay.as_secs());
                }
            });
    }

    /// After stop(): cleans up what a killed engine left, removes the record.
    async fn finish_stop(&self, left_behind: bool) -> Result<(), InstanceError> {
        let volume = self
            .shared
            .update(&self.name, self.generation, |entry, _| {
                entry.request.kind.fuse_volume().map(str::to_owned)
            })
            .flatten();
        let cleaned = match volume.filter(|_| left_behind) {
            Some(volume) => {
                let (run_dir, dev_dir) = (&self.shared.config.run_dir, &self.shared.config.dev_dir);
                clean_up_frontend(volume, run_dir.clone(), dev_dir.clone()).await
            }
            None => Ok(()),
        };
        let removed = self.shared.records.remove(&self.name);
        cleaned.and(removed)
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        let mut table = self.shared.table();
        let ours = table
            .entries
            .get(&self.name)
            .is_some_and(|entry| entry.generation == self.generation);
        if ours {
            table.entries.remove(&self.name);
            drop(table);
            self.shared.notify(&self.name);
        }
    }
}

/// Completes once something accepts TCP connections on `addr`.
async fn wait_listening(addr: SocketAddr) {
    while !is_listening(addr).await {
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

pub(super) async fn is_listening(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// SIGTERM, then SIGKILL after [`GRACE`]; returns once the process is gone,
/// whether it took SIGKILL.
async fn terminate(process: &ExitWatch) -> bool {
    send(process.pidfd(), Signal::SIGTERM);
    let killed = tokio::time::timeout(GRACE, process.exited()).await.is_err();
    if killed {
        warn!(grace = ?GRACE, "instance ignored SIGTERM; sending SIGKILL");
        send(process.pidfd(), Signal::SIGKILL);
        process.exited().await;
    }
    info!(status = %describe(process.pidfd().reap()), "instance process ended");
    killed
}

fn send(pidfd: &PidFd, signal: Signal) {
    match pidfd.signal(signal) {
        // ESRCH: it has already exited.
        Err(error) if error.raw_os_error() != Some(nix::libc::ESRCH) => {
            warn!(%error, %signal, "cannot signal the instance");
        }
        _ => {}
    }
}

/// How a process ended, for humans.
fn describe(status: Option<WaitStatus>) -> String {
    match status {
        Some(WaitStatus::Exited(_, code)) => format!("exited with status {code}"),
        Some(WaitStatus::Signaled(_, signal, _)) => format!("killed by {signal}"),
        Some(other) => format!("ended ({other:?})"),
        // Adopted: its parent (or init) reaps it and learns the status.
        None => "exited (status unknown: not a child of this manager)".into(),
    }
}

/// Removes the FUSE mount, loop device and device link a dead engine left
/// for `volume`. Mount and loop calls block: run on the blocking pool.
pub(super) async fn clean_up_frontend(
    volume: String,
    run_dir: std::path::PathBuf,
    dev_dir: std::path::PathBuf,
) -> Result<(), InstanceError> {
    tokio::task::spawn_blocking(move || clean_up_frontend_now(&volume, &run_dir, &dev_dir))
        .await
        .map_err(|e| InstanceError::Task(e.to_string()))?
}

pub(super) fn clean_up_frontend_now(
    volume: &str,
    run_dir: &std::path::Path,
    dev_dir: &std::path::Path,
) -> Result<(), InstanceError> {
    let mut options = FuseOptions::new(run_dir);
    options.dev_dir = dev_dir.to_path_buf();
    FuseFrontend::clean_up(volume, &options).map_err(|source| InstanceError::Frontend {
        volume: volume.to_owned(),
        source,
    })
}

/// Delays between restarts: 1 s, doubling up to 30 s; back to 1 s after a
/// process ran a minute, so a rare crash restarts fast.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    /// The delay before restarting a process that ran for `ran`.
    fn after(&mut self, ran: Duration) -> Duration {
        if ran >= BACKOFF_RESET_AFTER {
            self.next = BACKOFF_FIRST;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap_and_resets_after_a_long_run() {
        let mut backoff = Backoff::default();
        let short = Duration::from_secs(1);
        let delays: Vec<u64> = (0..7).map(|_| backoff.after(short).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff.after(Duration::from_secs(60)).as_secs(), 1);
        assert_eq!(backoff.after(short).as_secs(), 2);
    }

    #[test]
    fn describes_exits() {
        use nix::unistd::Pid;
        let pid = Pid::from_raw(1);
        assert_eq!(
            describe(Some(WaitStatus::Exited(pid, 3))),
            "exited with status 3"
        );
        assert_eq!(
            describe(Some(WaitStatus::Signaled(pid, Signal::SIGKILL, false))),
            "killed by SIGKILL"
        );
        assert!(describe(None).contains("unknown"));
    }
}
