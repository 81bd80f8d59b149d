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

mod cluster_key;
mod error;
mod local;
mod pidfd;
mod ports;
mod record;
mod remote;
mod request;
pub mod service;
mod shared;
mod spawn;
mod supervisor;
mod survivors;

use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::broadcast;

pub use cluster_key::{read_cluster_key, write_cluster_key};
pub use error::InstanceError;
pub use ports::parse_port_range;
pub use request::{InstanceKind, InstanceRequest};
pub use survivors::kill_recorded;

use crate::protocol::Key;
use crate::types::InstanceState;
use local::Local;
use remote::Remote;

/// Where the instance manager of a node whose default disk is `data_dir`
/// keeps its records, logs and the cluster key.
pub fn state_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("instance-manager")
}

/// Where a node's instances run: the options the manager (holding them
/// itself) and `oxhorn instance-manager` share on their command lines.
#[derive(Clone, Debug, clap::Args)]
pub struct InstanceArgs {
    /// The node's default disk: replica data, and the instance manager's
    /// records, logs and the cluster key.
    #[arg(long, env = "OXHORN_DATA_DIR", default_value = "/var/lib/oxhorn")]
    pub data_dir: PathBuf,
    /// Address this node's engines and replicas listen on and are reached at.
    #[arg(long, env = "POD_IP")]
    pub ip: IpAddr,
    /// Ports handed to engines and replicas, as FIRST-LAST.
    #[arg(long, default_value = "10000-19999", value_parser = parse_port_range)]
    pub ports: RangeInclusive<u16>,
    /// Where engines mount their FUSE files.
    #[arg(long, default_value = "/var/run/oxhorn")]
    pub run_dir: PathBuf,
    /// Where engines publish `/dev/oxhorn/<volume>` links.
    #[arg(long, default_value = "/dev/oxhorn")]
    pub dev_dir: PathBuf,
}

impl InstanceArgs {
    /// The supervisor these options describe, running this executable and
    /// handing each instance its volume's key derived from `key`.
    pub fn config(&self, key: Key) -> Result<InstanceManagerConfig, InstanceError> {
        let exe = Path::new("/proc/self/exe");
        let binary = std::env::current_exe().map_err(|e| InstanceError::io("finding", exe, e))?;
        Ok(InstanceManagerConfig {
            binary,
            state_dir: state_dir(&self.data_dir),
            ip: self.ip,
            ports: self.ports.clone(),
            run_dir: self.run_dir.clone(),
            dev_dir: self.dev_dir.clone(),
            key,
        })
    }
}

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

/// Starts, watches, restarts and stops the instances of one node: in the
/// manager's own process (embedded), or through the node's
/// `oxhorn instance-manager` (remote), whose processes survive the
/// manager's container.
pub struct InstanceManager {
    backend: Backend,
}

enum Backend {
    Local(Local),
    Remote(Remote),
}

impl InstanceManager {
    /// Supervises the instances in this process, adopting those that
    /// survived a previous manager on `config.state_dir`. Must be called
    /// inside a tokio runtime, whose tasks then supervise the instances.
    pub async fn start(config: InstanceManagerConfig) -> Result<Arc<Self>, InstanceError> {
        let backend = Backend::Local(Local::start(config).await?);
        Ok(Arc::new(Self { backend }))
    }

    /// Asks the `oxhorn instance-manager` serving on `socket`, and mirrors
    /// what it holds.
    pub async fn connect(socket: &Path) -> Result<Arc<Self>, InstanceError> {
        let backend = Backend::Remote(Remote::connect(socket).await?);
        Ok(Arc::new(Self { backend }))
    }

    /// Makes sure the instance runs, and returns what it is now; idempotent.
    /// A new instance gets its ports and starts (in the background: it is
    /// Starting, without a pid yet). A known one keeps its process (running,
    /// starting or waiting to restart): `request` is stored for its next
    /// start, so an engine restarted after a crash gets the latest replicas
    /// and size. Changing the kind (replica, engine) is an error, as is
    /// asking while the instance is being stopped.
    pub async fn ensure_running(
        &self,
        request: InstanceRequest,
    ) -> Result<InstanceInfo, InstanceError> {
        match &self.backend {
            Backend::Local(local) => local.ensure_running(request),
            Backend::Remote(remote) => remote.ensure_running(request).await,
        }
    }

    /// Stops the instance: SIGTERM, SIGKILL after a grace period of 15 s,
    /// then for a killed engine the clean-up of its FUSE mount and loop
    /// device. The record goes, the ports are freed and the instance is
    /// forgotten. Ok if it is unknown.
    pub async fn stop(&self, name: &str) -> Result<(), InstanceError> {
        match &self.backend {
            Backend::Local(local) => local.stop(name).await,
            Backend::Remote(remote) => remote.stop(name).await,
        }
    }

    pub fn get(&self, name: &str) -> Option<InstanceInfo> {
        match &self.backend {
            Backend::Local(local) => local.get(name),
            Backend::Remote(remote) => remote.get(name),
        }
    }

    /// Names of all known instances (running, starting, backing off), sorted.
    pub fn names(&self) -> Vec<String> {
        match &self.backend {
            Backend::Local(local) => local.names(),
            Backend::Remote(remote) => remote.names(),
        }
    }

    /// Receives the name of an instance each time its [`InstanceInfo`]
    /// changes or it is forgotten, so controllers can requeue it.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        match &self.backend {
            Backend::Local(local) => local.subscribe(),
            Backend::Remote(remote) => remote.subscribe(),
        }
    }

    /// The PID of the node's `oxhorn instance-manager` process; None when
    /// the instances are supervised in this process, or its PID is unknown.
    pub fn process_id(&self) -> Option<u32> {
        match &self.backend {
            Backend::Local(_) => None,
            Backend::Remote(remote) => remote.process_id(),
        }
    }

    /// Stops supervising (or asking), leaving every process running for the
    /// next manager. Afterwards nothing starts any more.
    pub async fn shutdown(&self) {
        match &self.backend {
            Backend::Local(local) => local.shutdown().await,
            Backend::Remote(remote) => remote.shutdown(),
        }
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
