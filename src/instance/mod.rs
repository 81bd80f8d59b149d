//! The per-node processes a manager runs: `oxhorn replica` and `oxhorn
//! engine` instances, each watched by a task that restarts it when it dies.
//!
//! The processes outlive the manager, so that a manager crash or upgrade does
//! not interrupt I/O: each runs in a session of its own, and each running
//! process has a record in `<state_dir>/instances/<name>.json` from which a
//! restarted manager adopts it ([`InstanceManager::start`]). Their output
//! goes to `<state_dir>/logs/<name>.log`.
//!
//! The processes only survive if the manager is not the init of its pid
//! namespace (a container's pid 1), whose death kills the namespace.

mod error;
mod pidfd;
mod ports;
mod record;
mod request;
mod shared;
mod spawn;
mod supervisor;
mod survivors;

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::broadcast;
use tracing::info;

pub use error::InstanceError;
pub use request::{InstanceKind, InstanceRequest};
pub use survivors::kill_recorded;

use crate::protocol::Key;
use crate::types::InstanceState;
use shared::{Done, Entry, Shared};

/// Where a node's instances run and keep their state.
#[derive(Clone, Debug)]
pub struct InstanceManagerConfig {
    /// The oxhorn executable (`std::env::current_exe()` in the manager).
    pub binary: PathBuf,
    /// Records and logs.
    pub state_dir: PathBuf,
    /// The address instances bind and advertise.
    pub ip: IpAddr,
    /// The ports handed out.
    pub ports: RangeInclusive<u16>,
    /// `--run-dir` of engines: their FUSE mounts live there.
    pub run_dir: PathBuf,
    /// `--dev-dir` of engines: their device links live there.
    pub dev_dir: PathBuf,
    /// The cluster's data-plane key: each instance gets its volume's.
    pub key: Key,
}

/// What the manager sees of an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceInfo {
    pub state: InstanceState,
    pub ip: IpAddr,
    /// A replica's data port (its control port is the next one); an
    /// engine's control port.
    pub port: u16,
    /// The running process, if any.
    pub pid: Option<u32>,
    /// Starts after the first, since this manager knows the instance.
    pub restarts: u32,
    /// Why it is in Error (how it exited, when it restarts); empty otherwise.
    pub message: String,
}

/// Starts, watches, restarts and stops the instances of one node.
pub struct InstanceManager {
    shared: Arc<Shared>,
}

impl InstanceManager {
    /// Adopts the instances that survived a previous manager on
    /// `config.state_dir`. Must be called inside a tokio runtime, whose tasks
    /// then supervise the instances.
    pub async fn start(config: InstanceManagerConfig) -> Result<Arc<Self>, InstanceError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| InstanceError::NoRuntime(e.to_string()))?;
        let shared = Arc::new(Shared::new(config, runtime));
        shared.records.create_dir()?;
        survivors::adopt_all(&shared).await?;
        Ok(Arc::new(Self { shared }))
    }

    /// Makes sure the instance runs, and returns what it is now; idempotent.
    /// A new instance gets its ports and starts (in the background: it is
    /// Starting, without a pid yet). A known one keeps its process (running,
    /// starting or waiting to restart): `request` is stored for its next
    /// start, so an engine restarted after a crash gets the latest replicas
    /// and size. Changing the kind (replica, engine) is an error, as is
    /// asking while the instance is being stopped.
    pub fn ensure_running(&self, request: InstanceRequest) -> Result<InstanceInfo, InstanceError> {
        request.validate()?;
        let shared = &self.shared;
        let mut table = shared.table();
        if table.closed {
            return Err(InstanceError::ShutDown);
        }
        if let Some(entry) = table.entries.get_mut(&request.name) {
            return self.update_request(entry, request);
        }
        let config = &shared.config;
        let width = request.kind.port_count();
        let port = ports::allocate(config.ip, &config.ports, width, &table.held_ports()).ok_or(
            InstanceError::NoFreePort {
                ip: config.ip,
                first: *config.ports.start(),
                last: *config.ports.end(),
                width,
            },
        )?;
        let info = InstanceInfo {
            state: InstanceState::Starting,
            ip: config.ip,
            port,
            pid: None,
            restarts: 0,
            message: String::new(),
        };
        let kind = request.kind.noun();
        info!(instance = %request.name, kind, port, "starting a new instance");
        let name = request.name.clone();
        supervisor::launch(shared, &mut table, request, port, info.clone(), None);
        drop(table);
        shared.notify(&name);
        Ok(info)
    }

    /// Stores `request` for a known instance's next start.
    fn update_request(
        &self,
        entry: &mut Entry,
        request: InstanceRequest,
    ) -> Result<InstanceInfo, InstanceError> {
        if entry.stop.is_cancelled() {
            return Err(InstanceError::Stopping(request.name));
        }
        let (running, requested) = (entry.request.kind.noun(), request.kind.noun());
        if running != requested {
            return Err(InstanceError::KindChanged {
                name: request.name,
                running,
                requested,
            });
        }
        if entry.request != request {
            info!(instance = %request.name, "instance request updated; its next start uses it");
            entry.request = request;
            self.shared.rewrite_record(entry);
        }
        Ok(entry.info.clone())
    }

    /// Stops the instance: SIGTERM, SIGKILL after a grace period of 15 s,
    /// then for a killed engine the clean-up of its FUSE mount and loop
    /// device. The record goes, the ports are freed and the instance is
    /// forgotten. Ok if it is unknown. If this future is dropped, the stop
    /// goes on; if the manager shuts down meanwhile, it may not finish.
    pub async fn stop(&self, name: &str) -> Result<(), InstanceError> {
        let Some(done) = self.request_stop(name) else {
            return Ok(());
        };
        match supervisor::finished(done).await {
            Some(Ok(())) => Ok(()),
            Some(Err(reason)) => Err(InstanceError::StopFailed {
                name: name.to_owned(),
                reason,
            }),
            None => Err(InstanceError::ShutDown),
        }
    }

    /// Tells the supervisor of `name` to stop it; what closes once it has.
    /// `None` if the instance is unknown. Not inlined in stop(): the table
    /// guard must not be in an async fn's state, which must be Send.
    fn request_stop(&self, name: &str) -> Option<Done> {
        let mut table = self.shared.table();
        let entry = table.entries.get_mut(name)?;
        entry.stop.cancel();
        let changed = entry.info.state != InstanceState::Stopping;
        entry.info.state = InstanceState::Stopping;
        let done = entry.done.clone();
        drop(table);
        if changed {
            info!(instance = name, "stopping the instance");
            self.shared.notify(name);
        }
        Some(done)
    }

    pub fn get(&self, name: &str) -> Option<InstanceInfo> {
        self.shared
            .table()
            .entries
            .get(name)
            .map(|entry| entry.info.clone())
    }

    /// Names of all known instances (running, starting, backing off), sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.table().entries.keys().cloned().collect();
        names.sort();
        names
    }

    /// Receives the name of an instance each time its [`InstanceInfo`]
    /// changes or it is forgotten, so controllers can requeue it.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.shared.subscribe()
    }

    /// Stops supervising, leaving every process running and recorded for the
    /// next manager to adopt (as a crash would, but orderly). Instances being
    /// stopped may be left half-stopped. Afterwards nothing starts any more.
    pub async fn shutdown(&self) {
        for done in self.close() {
            supervisor::finished(done).await;
        }
    }

    /// Marks the manager closed and aborts the supervisor tasks; the
    /// receivers that close once each task has ended.
    fn close(&self) -> Vec<Done> {
        let mut table = self.shared.table();
        table.closed = true;
        table
            .entries
            .values()
            .map(|entry| {
                entry.task.abort();
                entry.done.clone()
            })
            .collect()
    }
}

impl Drop for InstanceManager {
    /// Like a crash: the processes keep running, for a next manager to adopt.
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Controllers run these futures on a multi-threaded runtime.
    #[test]
    fn futures_are_send() {
        fn assert_send<T: Send>(_: &T) {}
        let config = InstanceManagerConfig {
            binary: "/nonexistent".into(),
            state_dir: "/nonexistent".into(),
            ip: IpAddr::from([127, 0, 0, 1]),
            ports: 1..=2,
            run_dir: "/nonexistent".into(),
            dev_dir: "/nonexistent".into(),
            key: Key::generate(),
        };
        assert_send(&InstanceManager::start(config));
        let manager: Option<Arc<InstanceManager>> = None;
        if let Some(manager) = manager {
            assert_send(&manager.stop("x"));
            assert_send(&manager.shutdown());
        }
    }
}
