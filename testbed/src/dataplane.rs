//! `oxhorn replica` and `oxhorn engine` processes on loopback, for data-plane
//! tests: each can be killed like a crash and started again as it was.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use super::netns::{self, Host};
use super::process::Supervised;
use crate::{Error, Result};
use oxhorn::frontend::{FuseFrontend, FuseOptions};
use oxhorn::protocol::control::EngineStatusRequest;
use oxhorn::protocol::control::engine_control_client::EngineControlClient;
use oxhorn::protocol::{Access, KEY_ENV};

/// A process started again with the same command after a kill.
struct Restartable {
    name: &'static str,
    binary: PathBuf,
    args: Vec<String>,
    /// The volume's key, handed over in the environment as the instance
    /// manager does.
    key: String,
    log: PathBuf,
    /// The network namespace it runs in; the test's own if `None`.
    netns: Option<PathBuf>,
    process: Option<Supervised>,
}

impl Restartable {
    fn spawn(
        name: &'static str,
        binary: &Path,
        args: Vec<String>,
        access: &Access,
        log: PathBuf,
        netns: Option<PathBuf>,
    ) -> Result<Self> {
        let mut process = Self {
            name,
            binary: binary.to_path_buf(),
            args,
            key: access.key.to_hex(),
            log,
            netns,
            process: None,
        };
        process.start()?;
        Ok(process)
    }

    fn start(&mut self) -> Result<()> {
        let mut command = Command::new(&self.binary);
        command.args(&self.args).env(KEY_ENV, &self.key);
        if let Some(path) = &self.netns {
            netns::enter(path, &mut command)?;
        }
        self.process = Some(Supervised::spawn(self.name, command, &self.log)?);
        Ok(())
    }

    fn kill(&mut self) {
        self.process = None;
    }

    fn stop(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let mut process = self
            .process
            .take()
            .ok_or_else(|| Error::Failed(format!("{} not running", self.name)))?;
        process.terminate(timeout)
    }

    /// An error, with the log, if the process was started and has exited.
    fn check_running(&mut self) -> Result<()> {
        self.process
            .as_mut()
            .map_or(Ok(()), Supervised::check_running)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        self.process
            .as_ref()
            .ok_or_else(|| Error::Failed(format!("{} not running", self.name)))?
            .signal(signal)
    }

    /// Polls `ready` until it yields, failing when the process exits or
    /// `timeout` passes.
    async fn wait_for<T>(
        &mut self,
        timeout: Duration,
        mut ready: impl AsyncFnMut() -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            if let Some(value) = ready().await {
                return Ok(value);
            }
            if Instant::now() > deadline {
                return Err(Error::Failed(format!(
                    "{} not ready after {timeout:?}:\n{}",
                    self.name,
                    self.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub struct ReplicaProcess {
    process: Restartable,
    dir: PathBuf,
    ip: IpAddr,
    port: u16,
}

impl ReplicaProcess {
    /// Starts `binary replica` of `access.volume` on `dir` (created if new)
    /// serving data on a free loopback port and control on the next one.
    pub fn spawn(binary: &Path, dir: &Path, size: u64, access: &Access) -> Result<Self> {
        Self::spawn_on(None, binary, dir, size, access)
    }

    /// Like [`spawn`](Self::spawn), with the process in `host`'s network
    /// namespace, listening on the host's address.
    pub fn spawn_in(
        host: &Host,
        binary: &Path,
        dir: &Path,
        size: u64,
        access: &Access,
    ) -> Result<Self> {
        Self::spawn_on(Some(host), binary, dir, size, access)
    }

    fn spawn_on(
        host: Option<&Host>,
        binary: &Path,
        dir: &Path,
        size: u64,
        access: &Access,
    ) -> Result<Self> {
        let ip = host.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |h| h.address().into());
        // Free in the test's namespace, and so in a new host's too.
        let port = free_port_pair()?;
        let args = vec![
            "replica".to_string(),
            format!("--volume={}", access.volume),
            format!("--dir={}", dir.display()),
            format!("--size={size}"),
            format!("--listen={ip}:{port}"),
        ];
        let log = dir.with_extension("log");
        let netns = host.map(Host::namespace_path);
        let process = Restartable::spawn("oxhorn replica", binary, args, access, log, netns)?;
        Ok(Self {
            process,
            dir: dir.to_path_buf(),
            ip,
            port,
        })
    }

    /// Starts the process again on the same directory and ports.
    pub fn start(&mut self) -> Result<()> {
        self.process.start()
    }

    /// The data address, host:port; control is on the next port.
    pub fn address(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.process.as_ref().map(Supervised::pid)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn stop(&mut self) -> Result<ExitStatus> {
        self.process.stop(Duration::from_secs(10))
    }

    /// Stops the process with SIGSTOP: it keeps its sockets but answers
    /// nothing, as a hung process would.
    pub fn pause(&self) -> Result<()> {
        self.process.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        self.process.signal(nix::sys::signal::Signal::SIGCONT)
    }

    /// The process's output so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Waits until the data and control ports accept connections.
    pub async fn wait_serving(&mut self, timeout: Duration) -> Result<()> {
        let (ip, port) = (self.ip, self.port);
        self.process
            .wait_for(timeout, async || {
                let data = tokio::net::TcpStream::connect((ip, port)).await;
                let control = tokio::net::TcpStream::connect((ip, port + 1)).await;
                (data.is_ok() && control.is_ok()).then_some(())
            })
            .await
    }
}

/// An `oxhorn engine` process with the FUSE frontend. Dropping it kills the
/// process and clears the mount and loop device a killed engine leaves.
pub struct EngineProcess {
    process: Restartable,
    volume: String,
    frontend: FuseOptions,
    /// Where the device link appears.
    pub device_link: PathBuf,
    /// The control API address.
    pub control: String,
    access: Access,
}

impl EngineProcess {
    /// Starts `binary engine` for `access` (volume, key, generation) over
    /// `replicas` (data addresses), with its run and device directories
    /// under `dir`.
    pub fn spawn(
        binary: &Path,
        dir: &Path,
        access: &Access,
        size: u64,
        replicas: &[String],
    ) -> Result<Self> {
        Self::spawn_fuse(binary, dir, access, size, replicas, "dev-fuse")
    }

    /// Like [`spawn`](Self::spawn), the FUSE frontend taking the kernel's
    /// requests through `transport` (`--fuse-transport`).
    pub fn spawn_fuse(
        binary: &Path,
        dir: &Path,
        access: &Access,
        size: u64,
        replicas: &[String],
        transport: &str,
    ) -> Result<Self> {
        Self::spawn_with(binary, dir, access, size, replicas, |_| {
            vec![
                "--frontend=fuse".into(),
                format!("--fuse-transport={transport}"),
            ]
        })
    }

    /// Like [`spawn`](Self::spawn), serving the volume as an iSCSI target
    /// on 127.0.0.1 at the port after the control port.
    pub fn spawn_iscsi(
        binary: &Path,
        dir: &Path,
        access: &Access,
        size: u64,
        replicas: &[String],
    ) -> Result<Self> {
        Self::spawn_with(binary, dir, access, size, replicas, |control_port| {
            vec![
                "--frontend=iscsi".into(),
                format!("--iscsi-listen=127.0.0.1:{}", control_port + 1),
            ]
        })
    }

    fn spawn_with(
        binary: &Path,
        dir: &Path,
        access: &Access,
        size: u64,
        replicas: &[String],
        frontend: impl FnOnce(u16) -> Vec<String>,
    ) -> Result<Self> {
        let volume = &access.volume;
        let port = free_port_pair()?;
        let control = format!("127.0.0.1:{port}");
        let mut args = vec![
            "engine".to_string(),
            format!("--volume={volume}"),
            format!("--generation={}", access.generation),
            format!("--size={size}"),
            format!("--listen={control}"),
            format!("--run-dir={}", dir.join("run").display()),
            format!("--dev-dir={}", dir.join("dev").display()),
        ];
        args.extend(frontend(port));
        args.extend(replicas.iter().map(|r| format!("--replica={r}")));
        let log = dir.join(format!("engine-{volume}.log"));
        let mut frontend = FuseOptions::new(dir.join("run"));
        frontend.dev_dir = dir.join("dev");
        Ok(Self {
            process: Restartable::spawn("oxhorn engine", binary, args, access, log, None)?,
            volume: volume.to_string(),
            frontend,
            device_link: dir.join("dev").join(volume),
            control,
            access: access.clone(),
        })
    }

    /// Starts the process again with the same arguments.
    pub fn start(&mut self) -> Result<()> {
        self.process.start()
    }

    /// Waits until the engine's control API reports its device (the control
    /// server starts after the frontend), and returns the device it links to.
    pub async fn wait_device(&mut self, timeout: Duration) -> Result<PathBuf> {
        let (control, access) = (self.control.clone(), self.access.clone());
        let endpoint = self
            .process
            .wait_for(timeout, async || endpoint(&control, &access).await)
            .await?;
        std::fs::canonicalize(&endpoint).map_err(|e| Error::io(endpoint, e))
    }

    /// Waits until the engine's control API reports its endpoint (an
    /// iSCSI engine's `iscsi://...` URL) and returns it.
    pub async fn wait_endpoint(&mut self, timeout: Duration) -> Result<String> {
        let (control, access) = (self.control.clone(), self.access.clone());
        self.process
            .wait_for(timeout, async || endpoint(&control, &access).await)
            .await
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn stop(&mut self) -> Result<ExitStatus> {
        self.process.stop(Duration::from_secs(30))
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// A client of the engine's control API, authenticated with its key.
    pub async fn client(&self) -> Result<EngineControlClient<oxhorn::protocol::TokenChannel>> {
        engine_client(&self.control, &self.access).await
    }
}

/// A client of the engine control API at `control` (host:port), calling as
/// `access` says.
pub async fn engine_client(
    control: &str,
    access: &oxhorn::protocol::Access,
) -> Result<EngineControlClient<oxhorn::protocol::TokenChannel>> {
    let channel = oxhorn::protocol::control_channel(control)
        .await
        .map_err(|e| Error::Failed(format!("engine control {control}: {e}")))?;
    Ok(EngineControlClient::new(oxhorn::protocol::with_token(
        channel, access,
    )))
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        self.process.kill();
        if let Err(error) = FuseFrontend::clean_up(&self.volume, &self.frontend) {
            eprintln!("cleaning up after engine {}: {error}", self.volume);
        }
    }
}

/// The endpoint a running engine reports, once it answers.
async fn endpoint(control: &str, access: &Access) -> Option<String> {
    let channel = oxhorn::protocol::control_channel(control).await.ok()?;
    let mut client = EngineControlClient::new(oxhorn::protocol::with_token(channel, access));
    let status = client
        .status(EngineStatusRequest {})
        .await
        .ok()?
        .into_inner();
    (!status.endpoint.is_empty()).then_some(status.endpoint)
}

/// A free port whose successor is free too.
fn free_port_pair() -> Result<u16> {
    crate::controlplane::free_ports(2)
}
