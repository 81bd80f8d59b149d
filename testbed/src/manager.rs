//! An `oxhorn manager` process playing one node against a control plane,
//! with its own data dir, address and FUSE/device dirs (its Kubernetes
//! Node: [`crate::register_kube_node`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic::transport::Channel;

use super::process::Supervised;
use crate::{Error, Result, csi_client};

/// How a test node's manager runs.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    pub node_id: String,
    pub namespace: String,
    pub kubeconfig: PathBuf,
    /// The node's address: each test node has its own 127.x.y.z.
    pub ip: IpAddr,
    pub lease_seconds: u64,
    /// The network namespace to run in (a [`crate::netns::Host`]'s), with
    /// `ip` its address there; the root namespace when `None`.
    pub netns: Option<PathBuf>,
    /// A real kubelet's plugin registration directory
    /// ([`crate::KubeletNode::registration_dir`]), where the manager
    /// registers its CSI endpoint; none without a kubelet.
    pub kubelet_registration_dir: Option<PathBuf>,
    /// Run the engines and replicas under an `oxhorn instance-manager`
    /// process of the node's own, as the installed product does, instead
    /// of inside the manager.
    pub instance_manager: bool,
    /// Serve `/metrics` on this port of `ip`.
    pub metrics_port: Option<u16>,
    /// Serve the REST API on this port of `ip`.
    pub api_port: Option<u16>,
    /// Run recurring jobs' clock this many times faster than real time.
    pub job_clock_scale: Option<u32>,
}

impl ManagerOptions {
    pub fn new(kubeconfig: &Path, node_id: &str, namespace: &str) -> Self {
        Self {
            node_id: node_id.to_owned(),
            namespace: namespace.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
            ip: IpAddr::from([127, 0, 0, 1]),
            lease_seconds: 15,
            netns: None,
            kubelet_registration_dir: None,
            instance_manager: false,
            metrics_port: None,
            api_port: None,
            job_clock_scale: None,
        }
    }
}

pub struct ManagerProcess {
    process: Supervised,
    /// The node's `oxhorn instance-manager`, when the options ask for one.
    instance_manager: Option<Supervised>,
    options: ManagerOptions,
    socket: PathBuf,
    // Holds the socket, the log and the node's data; removed after the
    // processes are gone.
    dir: TempDir,
}

impl ManagerProcess {
    /// Starts `binary manager` as node `node_id` of `control_plane`, watching
    /// `namespace`, serving CSI on a socket in a fresh directory.
    pub fn spawn(
        binary: &Path,
        control_plane: &super::ControlPlane,
        node_id: &str,
        namespace: &str,
    ) -> Result<Self> {
        let options = ManagerOptions::new(control_plane.kubeconfig(), node_id, namespace);
        Self::start(binary, options)
    }

    /// Starts a manager with `options` in a fresh directory.
    pub fn start(binary: &Path, options: ManagerOptions) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("oxhorn-{}-", options.node_id))
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let socket = dir.path().join("csi.sock");
        Self::spawn_at(binary, options, socket, dir)
    }

    /// Like [`ManagerProcess::start`], with the socket at `socket` and
    /// everything else in `dir`.
    pub fn spawn_at(
        binary: &Path,
        options: ManagerOptions,
        socket: PathBuf,
        dir: TempDir,
    ) -> Result<Self> {
        let instance_manager = if options.instance_manager {
            Some(spawn_instance_manager(binary, &options, dir.path())?)
        } else {
            None
        };
        let process = spawn_process(binary, &options, &socket, dir.path())?;
        Ok(Self {
            process,
            instance_manager,
            options,
            socket,
            dir,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Where the manager serves `/metrics`, if it does.
    pub fn metrics_address(&self) -> Option<std::net::SocketAddr> {
        let port = self.options.metrics_port?;
        Some(std::net::SocketAddr::new(self.options.ip, port))
    }

    /// Where the node's REST API answers, if it serves one.
    pub fn api_address(&self) -> Option<std::net::SocketAddr> {
        let port = self.options.api_port?;
        Some(std::net::SocketAddr::new(self.options.ip, port))
    }

    /// The node's address.
    pub fn ip(&self) -> IpAddr {
        self.options.ip
    }

    pub fn node_id(&self) -> &str {
        &self.options.node_id
    }

    /// The node's default disk.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Where this node's engines publish device links.
    pub fn dev_dir(&self) -> PathBuf {
        self.dir.path().join("dev")
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    fn state_dir(&self) -> PathBuf {
        oxhorn::instance::state_dir(&self.data_dir())
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
            let last = match csi_client::connect(&self.socket).await {
                Ok(channel) => return Ok(channel),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(Error::Failed(format!(
                    "manager not serving {} within {timeout:?} ({last}):\n{}",
                    self.socket.display(),
                    self.process.log_tail(30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// An error, with the end of its log, if the manager has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.process.check_running()
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.process.wait(timeout)
    }

    /// Kills the manager with SIGKILL, as a crash would. The engines and
    /// replicas it started keep running.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// The node loses power: the manager, its instance manager and every
    /// process they started die.
    pub fn power_off(&mut self) {
        self.process.kill();
        if let Some(instance_manager) = &mut self.instance_manager {
            instance_manager.kill();
        }
        self.kill_instances();
        // An instance the manager started but had not recorded yet when it
        // died (its record is written just after the spawn) is named by no
        // record: its arguments name the node's directory.
        let dir = self.dir.path().to_owned();
        crate::process::kill_where(|args| args.iter().any(|a| Path::new(a).starts_with(&dir)));
    }

    /// The pid of the node's `oxhorn instance-manager`, if it has one.
    pub fn instance_manager_pid(&self) -> Option<u32> {
        self.instance_manager.as_ref().map(Supervised::pid)
    }

    /// The instance manager's output so far; empty without one.
    pub fn instance_manager_log(&self) -> String {
        self.instance_manager
            .as_ref()
            .map(|p| p.log_tail(usize::MAX))
            .unwrap_or_default()
    }

    /// Starts the manager again in the same directory (after kill/power_off).
    /// An instance manager that died with its node starts again too.
    pub fn restart(&mut self, binary: &Path) -> Result<()> {
        self.process.kill();
        if let Some(instance_manager) = &mut self.instance_manager
            && instance_manager.check_running().is_err()
        {
            *instance_manager = spawn_instance_manager(binary, &self.options, self.dir.path())?;
        }
        self.process = spawn_process(binary, &self.options, &self.socket, self.dir.path())?;
        Ok(())
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.process.terminate(timeout)
    }

    fn kill_instances(&self) {
        if !self.state_dir().exists() {
            return;
        }
        if let Err(error) =
            oxhorn::instance::kill_recorded(&self.state_dir(), &self.run_dir(), &self.dev_dir())
        {
            eprintln!("{}: stopping its processes: {error}", self.options.node_id);
        }
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        self.power_off();
    }
}

fn spawn_process(
    binary: &Path,
    options: &ManagerOptions,
    socket: &Path,
    dir: &Path,
) -> Result<Supervised> {
    let mut command = node_command(binary, "manager", options, dir)?;
    command
        .arg(format!("--csi-endpoint=unix://{}", socket.display()))
        .arg(format!("--node-id={}", options.node_id))
        .arg("--kubeconfig")
        .arg(&options.kubeconfig)
        .arg(format!("--namespace={}", options.namespace))
        .arg(format!("--lease-seconds={}", options.lease_seconds));
    if let Some(dir) = &options.kubelet_registration_dir {
        command.arg("--kubelet-registration-dir").arg(dir);
    }
    if options.instance_manager {
        command
            .arg("--instance-manager")
            .arg(instance_manager_socket(dir));
    }
    if let Some(port) = options.metrics_port {
        command.arg(format!("--metrics-port={port}"));
    }
    if let Some(port) = options.api_port {
        command.arg(format!("--api-port={port}"));
    }
    if let Some(scale) = options.job_clock_scale {
        command.arg(format!("--recurring-time-scale={scale}"));
    }
    Supervised::spawn("oxhorn manager", command, &dir.join("manager.log"))
}

/// `binary subcommand` with what the node's manager and instance manager
/// share: its address and its data, run and device directories in `dir`,
/// in its network namespace if it has one.
fn node_command(
    binary: &Path,
    subcommand: &str,
    options: &ManagerOptions,
    dir: &Path,
) -> Result<Command> {
    let mut command = Command::new(binary);
    command
        .arg(subcommand)
        .arg(format!("--ip={}", options.ip))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--run-dir")
        .arg(dir.join("run"))
        .arg("--dev-dir")
        .arg(dir.join("dev"));
    if let Some(netns) = &options.netns {
        crate::netns::enter(netns, &mut command)?;
    }
    Ok(command)
}

fn instance_manager_socket(dir: &Path) -> PathBuf {
    dir.join("instance-manager.sock")
}

/// `oxhorn instance-manager` for the node in `dir`: the same data, run and
/// device directories and address as its manager's.
fn spawn_instance_manager(
    binary: &Path,
    options: &ManagerOptions,
    dir: &Path,
) -> Result<Supervised> {
    let mut command = node_command(binary, "instance-manager", options, dir)?;
    command.arg("--socket").arg(instance_manager_socket(dir));
    Supervised::spawn(
        "oxhorn instance-manager",
        command,
        &dir.join("instance-manager.log"),
    )
}
