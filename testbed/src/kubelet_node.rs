//! A real Kubernetes node: Debian's containerd (with runc) and the pinned
//! kubelet, registered with the test control plane, running real pods.
//!
//! Each node has its own containerd root, state, socket and runc root, its
//! own kubelet root, certificate and log directories, and a cgroup of its
//! own ([`crate::cgroup`]) that every pod lives under. What the two programs
//! change elsewhere on the host is put back when the last node stops
//! ([`crate::host_state`]). The kubelet runs without iptables on its PATH,
//! so it leaves the host's firewall alone. Its device-plugin directory has a
//! fixed path, so each kubelet runs in a mount namespace of its own where
//! that path is its node's (the node directory's mounts stay shared with
//! the host's), and where /etc/hosts and /etc/resolv.conf are the control
//! plane's (see [`crate::ControlPlane`]): the kubelet serves the API server
//! under its node name with a certificate of the cluster's CA. The host's changes are one set for all nodes, so a test's
//! nodes start together ([`KubeletNode::start_beside`]) in one turn: a
//! second [`KubeletNode::start`], of this process or another, waits for
//! them to stop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tempfile::TempDir;

use crate::apirelay::ApiRelay;
use crate::controlplane::{KUBERNETES_SERVICE, free_port, tool};
use crate::host_state::{HostChanges, POD_BRIDGE, POD_GATEWAY, POD_IPAM_DIR, POD_SUBNET};
use crate::process::Supervised;
use crate::{ControlPlane, Error, Result, cgroup, images, release_under};

const READY_TIMEOUT: Duration = Duration::from_secs(90);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Node directories are named with this prefix, which finds a crashed
/// run's containerd shims.
const DIR_PREFIX: &str = "oxhorn-node-";
/// What the kubelet may run from /usr/sbin (block volumes); iptables is
/// left out on purpose.
const SBIN_TOOLS: [&str; 3] = ["losetup", "blockdev", "blkid"];

/// Held by the running nodes, who change the host together: one test's at
/// a time of one process...
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// ...and those of different processes (a test binary, the local cluster)
/// too, by an exclusive lock on this file.
const HOST_LOCK: &str = "/run/oxhorn-testbed/kubelet-node.lock";
/// Where every kubelet keeps its device-plugin socket and checkpoint.
const DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";

/// The host to oneself: no other kubelet node starts while it is held.
pub struct HostTurn {
    /// The kubernetes Service, relayed to the API server of the turn's
    /// nodes: pods' in-cluster clients look for the API server at its
    /// address, where a real cluster's kube-proxy would send them on.
    /// Dropped first: the address is free again before the next turn.
    kubernetes_service: std::sync::Mutex<Option<ApiRelay>>,
    _across_processes: nix::fcntl::Flock<std::fs::File>,
    _in_process: tokio::sync::MutexGuard<'static, ()>,
}

impl HostTurn {
    /// Waits for the host's turn: until no other kubelet node runs.
    pub async fn take() -> Result<Self> {
        let in_process = ONE_AT_A_TIME.lock().await;
        let path = Path::new(HOST_LOCK);
        let file = tokio::task::spawn_blocking(move || crate::process::lock_exclusive(path))
            .await
            .map_err(|e| Error::Failed(format!("locking {HOST_LOCK}: {e}")))??;
        Ok(Self {
            kubernetes_service: std::sync::Mutex::new(None),
            _across_processes: file,
            _in_process: in_process,
        })
    }

    /// Relays the kubernetes Service's address (on the host while nodes
    /// run: [`HostChanges`]) to `control`'s API server, unless a node of
    /// this turn did already.
    fn relay_kubernetes_service(&self, control: &ControlPlane) -> Result<()> {
        let mut relay = self
            .kubernetes_service
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if relay.is_none() {
            *relay = Some(ApiRelay::start_at(
                KUBERNETES_SERVICE,
                control.api_address(),
            )?);
        }
        Ok(())
    }
}

pub struct KubeletNode {
    name: String,
    socket: PathBuf,
    cgroup: String,
    kubelet: Option<Supervised>,
    containerd: Option<Supervised>,
    dir: Option<TempDir>,
    /// Dropped last: the host is restored once everything else is gone,
    /// then, with the last node of the turn, the next nodes may start.
    _host: HostChanges,
    turn: Option<Arc<HostTurn>>,
}

impl KubeletNode {
    /// Starts containerd and a kubelet that registers as `name` with
    /// `control`, imports the [`images::BUSYBOX`] image, and waits until the
    /// Node is Ready. On an error, whatever was started is stopped again.
    /// Waits while another node of this process runs.
    pub async fn start(control: &ControlPlane, name: &str) -> Result<Self> {
        Self::start_in_turn(control, name, HostTurn::take().await?).await
    }

    /// Like [`KubeletNode::start`], in a turn the caller took already (to
    /// look at the host before the node changes it).
    pub async fn start_in_turn(control: &ControlPlane, name: &str, turn: HostTurn) -> Result<Self> {
        Self::start_sharing(control, name, Arc::new(turn)).await
    }

    /// Another node, in the turn of `first`: a cluster of several kubelet
    /// nodes.
    pub async fn start_beside(control: &ControlPlane, name: &str, first: &Self) -> Result<Self> {
        // Invariant: set by start, taken only by stop, which consumes it.
        let turn = first.turn.clone().expect("the node's turn");
        Self::start_sharing(control, name, turn).await
    }

    async fn start_sharing(
        control: &ControlPlane,
        name: &str,
        turn: Arc<HostTurn>,
    ) -> Result<Self> {
        let host = HostChanges::begin()?;
        if host.first() {
            cgroup::sweep();
            kill_shims(|address| address.contains(DIR_PREFIX) && !Path::new(address).exists());
        }
        turn.relay_kubernetes_service(control)?;
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(|e| Error::io(std::env::temp_dir(), e))?;
        let cgroup = format!("{}{name}", cgroup::PREFIX);
        let mut node = Self {
            name: name.to_string(),
            socket: dir.path().join("containerd.sock"),
            cgroup,
            kubelet: None,
            containerd: None,
            dir: Some(dir),
            _host: host,
            turn: Some(turn),
        };
        node.start_processes(control)?;
        node.until_ready(control).await?;
        Ok(node)
    }

    fn dir(&self) -> &Path {
        // Invariant: taken only by drop.
        self.dir.as_ref().expect("node directory").path()
    }

    fn start_processes(&mut self, control: &ControlPlane) -> Result<()> {
        let dir = self.dir().to_path_buf();
        share_mounts(&dir)?;
        write_containerd_config(&dir, &self.socket)?;
        let mut containerd = Command::new("containerd");
        containerd.arg("--config").arg(dir.join("containerd.toml"));
        self.containerd = Some(Supervised::spawn(
            "containerd",
            containerd,
            &dir.join("containerd.log"),
        )?);
        wait_for_socket(&self.socket, self.containerd.as_mut())?;
        let archive = images::build_busybox(&dir)?;
        images::import(&self.socket, &archive, images::BUSYBOX_REPOSITORY)?;

        cgroup::create(&self.cgroup)?;
        // Before the kubelet starts: it looks its own name up.
        control.resolve_locally(&self.name)?;
        control.kubelet_serving_certificate(&self.name)?.write_to(
            &dir.join("kubelet-pki"),
            "kubelet.crt",
            "kubelet.key",
        )?;
        write_kubelet_config(&dir, &self.socket, &self.cgroup, control.ca_file())?;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).map_err(|e| Error::io(&bin, e))?;
        for tool in SBIN_TOOLS {
            let link = bin.join(tool);
            std::os::unix::fs::symlink(Path::new("/usr/sbin").join(tool), &link)
                .map_err(|e| Error::io(&link, e))?;
        }
        let mut kubelet = Command::new(tool("kubelet")?);
        kubelet
            .arg("--config")
            .arg(dir.join("kubelet.yaml"))
            .arg("--kubeconfig")
            .arg(control.kubeconfig())
            .arg("--root-dir")
            .arg(dir.join("kubelet"))
            .arg("--cert-dir")
            .arg(dir.join("kubelet-pki"))
            .arg("--hostname-override")
            .arg(&self.name)
            .arg("--v=1")
            .env("PATH", format!("{}:/usr/local/bin:/usr/bin", bin.display()));
        let own_plugins = dir.join("device-plugins");
        for plugins in [&own_plugins, Path::new(DEVICE_PLUGINS)] {
            std::fs::create_dir_all(plugins).map_err(|e| Error::io(plugins, e))?;
        }
        let mut binds = vec![(own_plugins, PathBuf::from(DEVICE_PLUGINS))];
        binds.extend(control.name_resolution());
        crate::mount::bind_in_own_namespace(&mut kubelet, &binds)?;
        self.kubelet = Some(Supervised::spawn(
            "kubelet",
            kubelet,
            &dir.join("kubelet.log"),
        )?);
        Ok(())
    }

    async fn until_ready(&mut self, control: &ControlPlane) -> Result<()> {
        let nodes: Api<Node> = Api::all(control.client()?);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for process in [&mut self.kubelet, &mut self.containerd]
                .into_iter()
                .flatten()
            {
                process.check_running()?;
            }
            let node = nodes.get_opt(&self.name).await?;
            if let Some(node) = node.filter(is_ready) {
                return untaint(&nodes, &node).await;
            }
            if Instant::now() > deadline {
                return Err(Error::Failed(format!(
                    "node {} not Ready within {READY_TIMEOUT:?}; end of the kubelet's log:\n{}",
                    self.name,
                    self.logs(30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// containerd's socket, for `ctr --address`.
    pub fn containerd_socket(&self) -> &Path {
        &self.socket
    }

    /// The kubelet's root directory (pods, plugins, plugin registration).
    pub fn kubelet_dir(&self) -> PathBuf {
        self.dir().join("kubelet")
    }

    /// Where plugins register with the kubelet (its `plugins_registry`).
    pub fn registration_dir(&self) -> PathBuf {
        self.kubelet_dir().join("plugins_registry")
    }

    /// Stops the node like dropping it does, and keeps the host from the
    /// next node until the returned turn is dropped: for checking that the
    /// host is as it was. For a node alone in its turn.
    pub fn stop(mut self) -> HostTurn {
        let turn = self.turn.take();
        drop(self);
        // Invariant: set by start, taken only here; a node started beside
        // another shares it, and is not stopped this way.
        turn.and_then(Arc::into_inner)
            .expect("the turn of a node alone")
    }

    /// A directory of this node's for a pod's hostPath, `name` under the
    /// node's own; what is mounted there is released with the node, and
    /// mounts propagate both ways as on a real node's shared root.
    pub fn host_dir(&self, name: &str) -> Result<PathBuf> {
        let dir = self.dir().join("host").join(name);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(dir)
    }

    /// Lets go of the loop devices backed by files under the node's
    /// directory (its pods' volumes): each goes now, or when its last user
    /// closes it. Done before any pod is killed: a dying container's mounts
    /// take the host's copies of its shared FUSE mounts with them, after
    /// which a loop device's backing file no longer shows a path under the
    /// node's directory and nothing here could tell it is the node's.
    pub fn release_loop_devices(&self) {
        if let Some(dir) = &self.dir {
            crate::mount::detach_loop_devices_under(dir.path());
        }
    }

    /// Imports the images hack/build-image.sh built (Oxhorn's and the CSI
    /// sidecars'), so the manifest's pods can run here.
    pub fn import_product_images(&self) -> Result<()> {
        images::import_product(&self.socket)
    }

    /// Imports every image archive of `dir` (hack/install-e2e-deps.sh's,
    /// for one), each under the names it carries, so that pods find them
    /// without pulling.
    pub fn import_images(&self, dir: &Path) -> Result<()> {
        images::import_dir(&self.socket, dir, None)
    }

    /// The last `lines` lines of each container log of the pods of
    /// `namespace`, from the kubelet's pod log directory.
    pub fn pod_logs(&self, namespace: &str, lines: usize) -> String {
        let mut logs = String::new();
        let pods = std::fs::read_dir(self.dir().join("pod-logs"))
            .into_iter()
            .flatten();
        let ours = format!("{namespace}_");
        for pod in pods
            .flatten()
            .filter(|p| p.file_name().to_string_lossy().starts_with(&ours))
        {
            for container in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                for file in std::fs::read_dir(container.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let text = std::fs::read_to_string(file.path()).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
                    logs.push_str(&format!("==== {} ====\n", file.path().display()));
                    for line in tail.into_iter().rev() {
                        logs.push_str(line);
                        logs.push('\n');
                    }
                }
            }
        }
        logs
    }

    /// The last `lines` lines of the kubelet's and containerd's logs.
    pub fn logs(&self, lines: usize) -> String {
        [&self.kubelet, &self.containerd]
            .into_iter()
            .flatten()
            .map(|p| format!("--- {}:\n{}", p.name, p.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for KubeletNode {
    /// Stops the kubelet, kills the pods' processes, stops containerd and
    /// its shims, unmounts what they mounted and removes the directory and
    /// the cgroup. Never panics: also runs while unwinding.
    fn drop(&mut self) {
        self.release_loop_devices();
        if let Some(mut kubelet) = self.kubelet.take() {
            let _ = kubelet.terminate(STOP_TIMEOUT);
        }
        cgroup::remove(&self.cgroup);
        if let Some(mut containerd) = self.containerd.take() {
            let _ = containerd.terminate(STOP_TIMEOUT);
        }
        let socket = self.socket.to_string_lossy().into_owned();
        kill_shims(|address| address == socket);
        if let Some(dir) = self.dir.take() {
            release_under(dir.path());
            drop(dir);
        }
    }
}

/// Makes `dir` a mount point of its own with shared propagation, as a
/// systemd host's root is: pods' `Bidirectional` mounts (the node plugin's)
/// need it, and this machine's root is private. The drop's release of what
/// is mounted under the node's directory removes it.
fn share_mounts(dir: &Path) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    let failed =
        |what: &str, e: nix::Error| Error::Failed(format!("{what} {}: {e}", dir.display()));
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| failed("bind-mounting", e))?;
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| failed("sharing the mounts of", e))
}

/// The taint a kubelet registers its node with, which the node-lifecycle
/// controller removes once the node is Ready.
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// Does what the node-lifecycle controller would for a Ready node: removes
/// its not-ready taint. That controller runs only in a whole cluster's
/// kube-controller-manager ([`crate::sidecars::Sidecars::start_cluster`]),
/// which starts after the nodes.
async fn untaint(nodes: &Api<Node>, node: &Node) -> Result<()> {
    let taints: Vec<_> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != NOT_READY_TAINT)
        .collect();
    let patch = serde_json::json!({"spec": {"taints": taints}});
    let name = node.metadata.name.as_deref().unwrap_or_default();
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

fn wait_for_socket(socket: &Path, mut process: Option<&mut Supervised>) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !socket.exists() {
        if let Some(process) = process.as_mut() {
            process.check_running()?;
        }
        if Instant::now() > deadline {
            return Err(Error::Failed(format!(
                "{} did not appear within {READY_TIMEOUT:?}",
                socket.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Kills every containerd shim whose `-address` (its containerd's socket)
/// `matches`.
fn kill_shims(matches: impl Fn(&str) -> bool) {
    crate::process::kill_where(|args| {
        let is_shim = args[0].contains("containerd-shim");
        let address = args
            .iter()
            .position(|a| a == "-address")
            .and_then(|i| args.get(i + 1));
        is_shim && address.is_some_and(|a| matches(a))
    });
}

fn write_containerd_config(dir: &Path, socket: &Path) -> Result<()> {
    let cni = dir.join("cni");
    std::fs::create_dir_all(&cni).map_err(|e| Error::io(&cni, e))?;
    // The pods of every node share one bridge, and one record of the
    // addresses given out (so no two pods of the host get the same one).
    // The bridge, with the gateway address and forwarding off, is the test
    // bed's ([`HostChanges`]): the plugin is no gateway, so it never turns
    // on the host's IPv4 forwarding. The pods' one route goes through the
    // bridge to the kubernetes Service's address, which is the host's, where
    // the turn's relay passes the connection on to the API server: the only
    // traffic that leaves a pod's network namespace, and the host only
    // delivers it locally (no default route, no NAT, no forwarding).
    let conflist = cni.join("10-oxhorn-test.conflist");
    let network = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "oxhorn-test",
        "plugins": [{
            "type": "bridge",
            "bridge": POD_BRIDGE,
            "isGateway": false,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": POD_IPAM_DIR,
                // The gateway: never given to a pod.
                "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                "routes": [{
                    "dst": format!("{}/32", KUBERNETES_SERVICE.ip()),
                    "gw": POD_GATEWAY
                }]
            }
        }]
    });
    std::fs::write(&conflist, network.to_string()).map_err(|e| Error::io(&conflist, e))?;
    let path = |name: &str| dir.join(name).display().to_string();
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  # This VM's capability bounding set lacks CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  sandbox_image = "{sandbox}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = "{runc}"
"#,
        root = path("containerd-root"),
        state = path("containerd-state"),
        socket = socket.display(),
        sandbox = images::BUSYBOX,
        cni = cni.display(),
        runc = path("runc"),
    );
    let file = dir.join("containerd.toml");
    std::fs::write(&file, config).map_err(|e| Error::io(&file, e))
}

fn write_kubelet_config(dir: &Path, socket: &Path, cgroup: &str, client_ca: &Path) -> Result<()> {
    let pki = dir.join("kubelet-pki");
    let config = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{cgroup}"),
        // The machine is cgroup v1 (hybrid); 1.35 refuses v1 without this.
        "failCgroupV1": false,
        "failSwapOn": false,
        "address": "127.0.0.1",
        "port": free_port()?,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port()?,
        // As a real cluster's: a certificate of the cluster's CA (the API
        // server's, for logs and exec) or a token the API server vouches
        // for, and what each may do is the API server's RBAC.
        "tlsCertFile": pki.join("kubelet.crt"),
        "tlsPrivateKeyFile": pki.join("kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": client_ca}
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": format!("unix://{}", socket.display()),
        "podLogsDir": dir.join("pod-logs"),
        "volumePluginDir": dir.join("volume-plugins"),
        // A shared test machine's disk is often fuller than the defaults
        // allow; nothing here should be evicted for it.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%"
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99
    });
    let file = dir.join("kubelet.yaml");
    std::fs::write(&file, config.to_string()).map_err(|e| Error::io(&file, e))
}
