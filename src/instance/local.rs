//! The instance supervisor in this process: the manager's own (embedded),
//! or the `oxhorn instance-manager` process's, which serves it to the
//! manager (`service.rs`).

use std::sync::Arc;

use tokio::sync::broadcast;
use tracing::info;

use super::shared::{Done, Entry, Shared};
use super::{
    InstanceError, InstanceInfo, InstanceManagerConfig, InstanceRequest, ports, supervisor,
    survivors,
};
use crate::types::InstanceState;

/// Starts, watches, restarts and stops the instances of one node, in this
/// process.
pub(super) struct Local {
    shared: Arc<Shared>,
}

impl Local {
    /// Adopts the instances that survived a previous manager on
    /// `config.state_dir`. Must be called inside a tokio runtime, whose tasks
    /// then supervise the instances.
    pub(super) async fn start(config: InstanceManagerConfig) -> Result<Self, InstanceError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| InstanceError::NoRuntime(e.to_string()))?;
        let shared = Arc::new(Shared::new(config, runtime));
        shared.records.create_dir()?;
        survivors::adopt_all(&shared).await?;
        Ok(Self { shared })
    }

    /// See [`super::InstanceManager::ensure_running`].
    pub(super) fn ensure_running(
        &self,
        request: InstanceRequest,
    ) -> Result<InstanceInfo, InstanceError> {
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

    /// See [`super::InstanceManager::stop`]. If this future is dropped, the
    /// stop goes on; if the supervisor shuts down meanwhile, it may not
    /// finish.
    pub(super) async fn stop(&self, name: &str) -> Result<(), InstanceError> {
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

    pub(super) fn get(&self, name: &str) -> Option<InstanceInfo> {
        self.shared
            .table()
            .entries
            .get(name)
            .map(|entry| entry.info.clone())
    }

    pub(super) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.table().entries.keys().cloned().collect();
        names.sort();
        names
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<String> {
        self.shared.subscribe()
    }

    /// Stops supervising, leaving every process running and recorded for the
    /// next manager to adopt (as a crash would, but orderly). Instances being
    /// stopped may be left half-stopped. Afterwards nothing starts any more.
    pub(super) async fn shutdown(&self) {
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

impl Drop for Local {
    /// Like a crash: the processes keep running, for a next manager to adopt.
    fn drop(&mut self) {
        self.close();
    }
}
