//! A manager's view of the node's `oxhorn instance-manager`: calls go over
//! its socket, and a watch keeps a mirror of every instance it holds, so
//! that reading an instance ([`Remote::get`]) stays local and
//! controllers are told of each change, as with the embedded supervisor.
//! When the watch breaks it reconnects, and the new snapshot replaces the
//! mirror.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tonic::transport::{Channel, Endpoint};
use tracing::{info, warn};

use super::service::{info_of, proto};
use super::{InstanceError, InstanceInfo, InstanceRequest};
use proto::instance_manager_client::InstanceManagerClient;

/// How long a watch that broke waits before it reconnects.
const RECONNECT: Duration = Duration::from_secs(1);
/// Change notices a slow subscriber may fall behind by.
const EVENTS: usize = 1024;

type Mirror = Arc<Mutex<HashMap<String, InstanceInfo>>>;

pub(super) struct Remote {
    client: InstanceManagerClient<Channel>,
    /// The instance manager's PID as its socket's last connection told
    /// (SO_PEERCRED); 0 before one, or when it is in a PID namespace this
    /// process cannot see.
    pid: Arc<AtomicU32>,
    mirror: Mirror,
    events: broadcast::Sender<String>,
    watch: AbortHandle,
}

fn lock(mirror: &Mirror) -> MutexGuard<'_, HashMap<String, InstanceInfo>> {
    // A map of plain values, left whole by any panicking holder.
    mirror.lock().unwrap_or_else(PoisonError::into_inner)
}

fn remote_error(status: tonic::Status) -> InstanceError {
    InstanceError::Remote {
        code: format!("{:?}", status.code()),
        message: status.message().to_string(),
    }
}

/// A channel to the unix socket at `socket`; it connects lazily, and again
/// after the instance manager restarts. Each connection records the PID of
/// the process at the other end in `pid`.
fn channel(socket: &Path, pid: &Arc<AtomicU32>) -> Result<Channel, InstanceError> {
    let unreachable = |reason: String| InstanceError::Unreachable {
        socket: socket.to_path_buf(),
        reason,
    };
    let path: PathBuf = socket.to_path_buf();
    let pid = Arc::clone(pid);
    // The URI is a placeholder: the connector dials the socket.
    let endpoint =
        Endpoint::try_from("http://localhost").map_err(|e| unreachable(e.to_string()))?;
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let (path, pid) = (path.clone(), Arc::clone(&pid));
            async move {
                let stream = UnixStream::connect(path).await?;
                let peer = stream
                    .peer_cred()?
                    .pid()
                    .and_then(|p| u32::try_from(p).ok());
                pid.store(peer.unwrap_or(0), Ordering::Relaxed);
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        })),
    )
}

impl Remote {
    /// Connects to the instance manager at `socket` and waits for its
    /// first snapshot, so that the mirror is whole before controllers read
    /// it. An instance manager that is not serving yet (its pod starts
    /// beside the manager's, and waits for the cluster key) is waited for.
    pub(super) async fn connect(socket: &Path) -> Result<Self, InstanceError> {
        let pid = Arc::default();
        let client = InstanceManagerClient::new(channel(socket, &pid)?);
        let mirror: Mirror = Arc::default();
        let (events, _) = broadcast::channel(EVENTS);
        let mut told = false;
        let (first, stream) = loop {
            match first_snapshot(&client).await {
                Ok(watching) => break watching,
                Err(reason) => {
                    if !told {
                        info!(socket = %socket.display(), %reason, "waiting for the instance manager");
                        told = true;
                    }
                    tokio::time::sleep(RECONNECT).await;
                }
            }
        };
        apply(&mirror, &events, first);
        let watch = tokio::spawn(keep_watching(
            client.clone(),
            stream,
            mirror.clone(),
            events.clone(),
        ))
        .abort_handle();
        Ok(Self {
            client,
            pid,
            mirror,
            events,
            watch,
        })
    }

    /// The instance manager's PID, once a connection told it.
    pub(super) fn process_id(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Relaxed)).filter(|pid| *pid != 0)
    }

    pub(super) async fn ensure_running(
        &self,
        request: InstanceRequest,
    ) -> Result<InstanceInfo, InstanceError> {
        request.validate()?;
        let name = request.name.clone();
        let request_json = serde_json::to_vec(&request).map_err(|e| InstanceError::Remote {
            code: "InvalidArgument".into(),
            message: e.to_string(),
        })?;
        let info = self
            .client
            .clone()
            .ensure_running(proto::EnsureRunningRequest { request_json })
            .await
            .map_err(remote_error)?
            .into_inner();
        let info = info_of(&info)?;
        remember(&self.mirror, &self.events, name, &info);
        Ok(info)
    }

    pub(super) async fn stop(&self, name: &str) -> Result<(), InstanceError> {
        self.client
            .clone()
            .stop(proto::StopRequest {
                name: name.to_string(),
            })
            .await
            .map_err(remote_error)?;
        lock(&self.mirror).remove(name);
        let _ = self.events.send(name.to_string());
        Ok(())
    }

    pub(super) fn get(&self, name: &str) -> Option<InstanceInfo> {
        lock(&self.mirror).get(name).cloned()
    }

    pub(super) fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.mirror).keys().cloned().collect();
        names.sort();
        names
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<String> {
        self.events.subscribe()
    }

    pub(super) fn shutdown(&self) {
        self.watch.abort();
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Opens a watch and reads its first event, the snapshot; why not, if it
/// fails.
async fn first_snapshot(
    client: &InstanceManagerClient<Channel>,
) -> Result<(proto::WatchEvent, tonic::Streaming<proto::WatchEvent>), String> {
    let mut stream = client
        .clone()
        .watch(proto::WatchRequest {})
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    match stream.message().await {
        Ok(Some(first)) => Ok((first, stream)),
        Ok(None) => Err("the watch ended at once".into()),
        Err(e) => Err(e.message().to_string()),
    }
}

/// Puts what a call answered into the mirror and, if that changes it,
/// tells subscribers: controllers call [`Remote::ensure_running`] on every
/// pass, so a notice for an unchanged instance would start their next pass
/// at once, and again, forever.
fn remember(
    mirror: &Mirror,
    events: &broadcast::Sender<String>,
    name: String,
    info: &InstanceInfo,
) {
    if put(&mut lock(mirror), name.clone(), info.clone()) {
        let _ = events.send(name);
    }
}

/// Puts `info` into the mirror; whether that changed it.
fn put(mirror: &mut HashMap<String, InstanceInfo>, name: String, info: InstanceInfo) -> bool {
    if mirror.get(&name) == Some(&info) {
        return false;
    }
    mirror.insert(name, info);
    true
}

/// Applies one watch event to the mirror and tells subscribers which
/// instances changed: an update repeating what a call already answered
/// is no change.
fn apply(mirror: &Mirror, events: &broadcast::Sender<String>, event: proto::WatchEvent) {
    let mut changed = Vec::new();
    {
        let mut mirror = lock(mirror);
        let updates = match event.update {
            Some(update) => vec![update],
            None => {
                // A snapshot: whatever it leaves out is gone.
                changed.extend(mirror.drain().map(|(name, _)| name));
                event.snapshot
            }
        };
        for update in updates {
            let changes = match update.info.as_ref().map(info_of) {
                Some(Ok(info)) => put(&mut mirror, update.name.clone(), info),
                Some(Err(error)) => {
                    warn!(instance = %update.name, %error, "ignoring an instance update");
                    false
                }
                None => mirror.remove(&update.name).is_some(),
            };
            if changes {
                changed.push(update.name);
            }
        }
    }
    changed.sort();
    changed.dedup();
    for name in changed {
        let _ = events.send(name);
    }
}

async fn keep_watching(
    client: InstanceManagerClient<Channel>,
    mut stream: tonic::Streaming<proto::WatchEvent>,
    mirror: Mirror,
    events: broadcast::Sender<String>,
) {
    loop {
        loop {
            match stream.message().await {
                Ok(Some(event)) => apply(&mirror, &events, event),
                Ok(None) => break,
                Err(status) => {
                    warn!(error = %status.message(), "the instance manager's watch broke");
                    break;
                }
            }
        }
        stream = loop {
            tokio::time::sleep(RECONNECT).await;
            match client.clone().watch(proto::WatchRequest {}).await {
                Ok(response) => break response.into_inner(),
                Err(status) => {
                    warn!(error = %status.message(), "reconnecting to the instance manager")
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::service::info_message;
    use crate::types::InstanceState;

    fn update(name: &str, port: Option<u16>) -> proto::InstanceUpdate {
        proto::InstanceUpdate {
            name: name.into(),
            info: port.map(|port| {
                info_message(&InstanceInfo {
                    state: InstanceState::Running,
                    ip: [127, 0, 0, 1].into(),
                    port,
                    pid: Some(7),
                    restarts: 0,
                    message: String::new(),
                })
            }),
        }
    }

    #[test]
    fn snapshots_replace_the_mirror_and_updates_change_it_telling_only_of_changes() {
        let mirror: Mirror = Arc::default();
        let (events, mut seen) = broadcast::channel(16);
        let snapshot = |names: Vec<proto::InstanceUpdate>| proto::WatchEvent {
            snapshot: names,
            update: None,
        };
        apply(
            &mirror,
            &events,
            snapshot(vec![update("a", Some(1)), update("b", Some(2))]),
        );
        // What the mirror holds already: no notice.
        apply(
            &mirror,
            &events,
            proto::WatchEvent {
                snapshot: Vec::new(),
                update: Some(update("b", Some(2))),
            },
        );
        apply(
            &mirror,
            &events,
            proto::WatchEvent {
                snapshot: Vec::new(),
                update: Some(update("a", None)),
            },
        );
        assert_eq!(lock(&mirror).keys().collect::<Vec<_>>(), ["b"]);
        apply(&mirror, &events, snapshot(vec![update("c", Some(3))]));
        let mut names: Vec<String> = lock(&mirror).keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["c"], "b left with the new snapshot");
        assert_eq!(lock(&mirror)["c"].port, 3);
        let mut told = Vec::new();
        while let Ok(name) = seen.try_recv() {
            told.push(name);
        }
        assert_eq!(told, ["a", "b", "a", "b", "c"]);
    }
}
