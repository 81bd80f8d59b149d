//! An `oxhorn manager` process playing one node against a control plane.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic::transport::Channel;

use super::ControlPlane;
use super::process::Supervised;
use crate::csi;
use crate::{Error, Result};

pub struct ManagerProcess {
    process: Supervised,
    socket: PathBuf,
    // Holds the socket and the log; removed after the process is gone.
    _dir: TempDir,
}

impl ManagerProcess {
    /// Starts `binary manager` as node `node_id` of `control_plane`, watching
    /// `namespace`, serving CSI on a socket in a fresh directory.
    pub fn spawn(
        binary: &Path,
        control_plane: &ControlPlane,
        node_id: &str,
        namespace: &str,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("oxhorn-{node_id}-"))
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let socket = dir.path().join("csi.sock");
        Self::spawn_at(
            binary,
            control_plane.kubeconfig(),
            node_id,
            namespace,
            socket,
            dir,
        )
    }

    /// Like [`ManagerProcess::spawn`], with the socket at `socket` and the log
    /// in `dir`, against the cluster in `kubeconfig`.
    pub fn spawn_at(
        binary: &Path,
        kubeconfig: &Path,
        node_id: &str,
        namespace: &str,
        socket: PathBuf,
        dir: TempDir,
    ) -> Result<Self> {
        let mut command = Command::new(binary);
        command
            .arg("manager")
            .arg(format!("--csi-endpoint=unix://{}", socket.display()))
            .arg(format!("--node-id={node_id}"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg(format!("--namespace={namespace}"));
        let process =
            Supervised::spawn("oxhorn manager", command, &dir.path().join("manager.log"))?;
        Ok(Self {
            process,
            socket,
            _dir: dir,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The manager's output so far.
    pub fn log(&self) -> String {
        self.process.log_tail(usize::MAX)
    }

    /// A channel to the CSI socket, once the manager serves it.
    pub async fn connect(&mut self, timeout: Duration) -> Result<Channel> {
        let deadline = Instant::now() + timeout;
        loop {
            self.process.check_running()?;
            // A socket left by a crashed manager exists but refuses connections.
            let last = match csi::client::connect(&self.socket).await {
                Ok(channel) => return Ok(channel),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(Error::Testbed(format!(
                    "manager not serving {} within {timeout:?} ({last}):\n{}",
                    self.socket.display(),
                    self.process.log_tail(30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.process.wait(timeout)
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.process.terminate(timeout)
    }
}
