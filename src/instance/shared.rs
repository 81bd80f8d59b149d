//! The instance table the manager's API and the supervisor tasks share.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::pidfd::PidFd;
use super::record::{Record, Records};
use super::{InstanceError, InstanceInfo, InstanceManagerConfig, InstanceRequest, spawn};
use crate::types::InstanceState;

/// How long a process killed right after its start gets to vanish.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What the manager and its supervisor tasks share.
pub(super) struct Shared {
    pub config: InstanceManagerConfig,
    pub records: Records,
    pub runtime: tokio::runtime::Handle,
    table: Mutex<Table>,
    events: broadcast::Sender<String>,
}

/// How a supervisor ended: `None` if aborted (shutdown) before it finished
/// a stop, else the stop's result (why it failed).
pub(super) type StopResult = Option<Result<(), String>>;
pub(super) type Done = watch::Receiver<StopResult>;

/// Every instance the manager knows.
#[derive(Default)]
pub(super) struct Table {
    /// Set by shutdown: no process starts any more.
    pub closed: bool,
    pub entries: HashMap<String, Entry>,
    /// Tells an entry from a later one of the same name, so the task of a
    /// stopped instance never touches its successor.
    pub next_generation: u64,
}

/// One instance: what it should run, where, and what it does now.
pub(super) struct Entry {
    pub generation: u64,
    /// The latest request: the next (re)start runs it.
    pub request: InstanceRequest,
    /// Kept for the instance's whole life, across restarts.
    pub port: u16,
    pub info: InstanceInfo,
    /// Start time of the process in `info.pid`, for its record.
    pub start_time: Option<u64>,
    /// Cancelled by stop(): the supervisor stops the process and ends.
    pub stop: CancellationToken,
    /// Closed when the supervisor task ends.
    pub done: Done,
    pub task: AbortHandle,
}

impl Entry {
    /// The record of the running process, if one runs.
    pub fn record(&self) -> Option<Record> {
        Some(Record {
            name: self.request.name.clone(),
            pid: self.info.pid?,
            start_time: self.start_time?,
            port: self.port,
            request: self.request.clone(),
        })
    }
}

impl Table {
    /// Ports held by known instances, running or not: a restart reuses them.
    pub fn held_ports(&self) -> HashSet<u16> {
        self.entries
            .values()
            .flat_map(|entry| (0..entry.request.kind.port_count()).map(|i| entry.port + i))
            .collect()
    }
}

impl Shared {
    pub fn new(config: InstanceManagerConfig, runtime: tokio::runtime::Handle) -> Self {
        Self {
            records: Records::new(&config.state_dir),
            config,
            runtime,
            table: Mutex::new(Table::default()),
            events: broadcast::channel(256).0,
        }
    }

    /// The table. A panic while it was held leaves it consistent enough (each
    /// change is a few field assignments), so poisoning is ignored.
    pub fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.events.subscribe()
    }

    /// Tells subscribers that `name`'s info changed (or that it is gone).
    pub fn notify(&self, name: &str) {
        // An error only means nobody listens.
        let _ = self.events.send(name.to_owned());
    }

    /// Runs `change` on entry `name` if it is still `generation`, and
    /// notifies if its info changed. `None` if the entry is gone.
    pub fn update<R>(
        &self,
        name: &str,
        generation: u64,
        change: impl FnOnce(&mut Entry, &Records) -> R,
    ) -> Option<R> {
        let mut table = self.table();
        let entry = table
            .entries
            .get_mut(name)
            .filter(|entry| entry.generation == generation)?;
        let before = entry.info.clone();
        let result = change(entry, &self.records);
        if entry.info != before {
            self.notify(name);
        }
        Some(result)
    }

    /// Starts the process of entry `name` and records it. `None` if nothing
    /// should start: the entry is being stopped or the manager shut down.
    ///
    /// The table stays locked from the check to the record, so shutdown
    /// cannot slip in between: a process never starts without a record (a
    /// later manager could not find it) or after shutdown (nothing would
    /// supervise it). Blocks on fork and file I/O: call it off the runtime.
    pub fn spawn_recorded(
        &self,
        name: &str,
        generation: u64,
        restart: bool,
    ) -> Result<Option<PidFd>, InstanceError> {
        let mut table = self.table();
        if table.closed {
            return Ok(None);
        }
        let Some(entry) = table
            .entries
            .get_mut(name)
            .filter(|entry| entry.generation == generation && !entry.stop.is_cancelled())
        else {
            return Ok(None);
        };
        let before = entry.info.clone();
        let started = self.spawn_entry(entry, restart);
        if entry.info != before {
            self.notify(name);
        }
        started.map(Some)
    }

    /// Starts `entry`'s process and writes its record.
    fn spawn_entry(&self, entry: &mut Entry, restart: bool) -> Result<PidFd, InstanceError> {
        if restart {
            // Counted per attempt, whether or not the process starts.
            entry.info.restarts += 1;
        }
        let spawned = spawn::spawn(&self.config, &entry.request, entry.port)?;
        entry.info.pid = Some(spawned.pidfd.pid());
        entry.start_time = Some(spawned.start_time);
        if let Some(Err(error)) = entry.record().map(|record| self.records.write(&record)) {
            // Unrecorded, the process would be lost to a restarted manager.
            let _ = spawned.pidfd.signal(Signal::SIGKILL);
            let _ = spawned.pidfd.wait_exit(KILL_WAIT);
            let _ = spawned.pidfd.reap();
            entry.info.pid = None;
            entry.start_time = None;
            return Err(error);
        }
        entry.info.state = InstanceState::Starting;
        entry.info.message.clear();
        Ok(spawned.pidfd)
    }

    /// Rewrites the record of `entry`'s running process, after its request
    /// changed: a restarted manager must restart it as last asked.
    pub fn rewrite_record(&self, entry: &Entry) {
        if let Some(record) = entry.record()
            && let Err(error) = self.records.write(&record)
        {
            warn!(instance = %entry.request.name, %error, "instance record not updated");
        }
    }
}
