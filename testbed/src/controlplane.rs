//! etcd + kube-apiserver on free loopback ports, with oxhorn's CRDs applied.
//!
//! The API server reaches kubelets as a real cluster's does: by the node
//! name each kubelet reports as its Hostname address, over TLS verified
//! against the test bed's CA, with a client certificate the kubelets trust.
//! Node names resolve to 127.0.0.1 through a hosts file of the control
//! plane's ([`ControlPlane::resolve_locally`]), which the API server and the
//! kubelets see as /etc/hosts in mount namespaces of their own; their
//! /etc/resolv.conf names only 127.0.0.1 (no DNS server runs on this
//! machine), so no name lookup of theirs leaves it. Pods inherit that
//! resolv.conf from their kubelet (there is no cluster DNS): a name a pod
//! looks up resolves nowhere.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use serde::Deserialize;
use tempfile::TempDir;

use super::process::Supervised;
use super::{certs, tools_dir};
use crate::{Error, Result};

const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The cluster's Service addresses; the first is the `kubernetes`
/// Service's, which the kubelet gives every container as
/// KUBERNETES_SERVICE_HOST (and 443 as KUBERNETES_SERVICE_PORT).
const SERVICE_RANGE: &str = "10.96.0.0/24";
/// The `kubernetes` Service's address and port: where a pod's in-cluster
/// client looks for the API server. The kubelet nodes relay it to the API
/// server (see [`crate::KubeletNode`]); its certificate names it.
pub(crate) const KUBERNETES_SERVICE: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 96, 0, 1)),
    443,
);
const ADMIN_TOKEN_USER: &str = "oxhorn-testbed-admin";

/// A running control plane. Dropping it (or [`ControlPlane::stop`]) kills the
/// processes and removes their data.
pub struct ControlPlane {
    config: Config,
    kubeconfig: PathBuf,
    /// Where the API server listens, and what a kubeconfig needs to reach it.
    api: SocketAddr,
    ca: PathBuf,
    authority: certs::Ca,
    /// The hosts file the API server and the kubelets resolve names with.
    hosts: PathBuf,
    resolv_conf: PathBuf,
    token: String,
    processes: Mutex<Vec<Supervised>>,
    dir: Mutex<Option<TempDir>>,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver, waits until the API server is ready and
    /// oxhorn's CRDs (from deploy/crds.yaml) are established. On an error,
    /// whatever was started is stopped again.
    pub async fn start() -> Result<Self> {
        let started = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("oxhorn-testbed-")
            .tempdir_in(data_root())
            .map_err(|e| Error::io(data_root(), e))?;
        let path = dir.path();
        let etcd_port = free_port()?;
        let etcd = etcd_command(path, etcd_port)?;
        let mut processes = vec![Supervised::spawn("etcd", etcd, &path.join("etcd.log"))?];

        let api_port = free_port()?;
        let authority = certs::Ca::generate()?;
        let token = write_credentials(path, &authority)?;
        let (hosts, resolv_conf) = write_name_resolution(path)?;
        let mut apiserver = apiserver_command(path, api_port, etcd_port)?;
        crate::mount::bind_in_own_namespace(
            &mut apiserver,
            &name_resolution_binds(&hosts, &resolv_conf),
        )?;
        processes.push(Supervised::spawn(
            "kube-apiserver",
            apiserver,
            &path.join("kube-apiserver.log"),
        )?);
        let kubeconfig = path.join("kubeconfig");
        let api = SocketAddr::from(([127, 0, 0, 1], api_port));
        let ca = path.join("ca.crt");
        write_kubeconfig(&kubeconfig, api, None, &ca, &token)?;
        let config = load_config(&kubeconfig).await?;
        wait_ready(&Client::try_from(config.clone())?, &mut processes).await?;

        let control_plane = Self {
            config,
            kubeconfig,
            api,
            ca,
            authority,
            hosts,
            resolv_conf,
            token,
            processes: Mutex::new(processes),
            dir: Mutex::new(Some(dir)),
        };
        control_plane.apply_crds(&crds_file()).await?;
        tracing::info!(elapsed = ?started.elapsed(), "control plane ready");
        Ok(control_plane)
    }

    /// A client configuration with cluster-admin rights.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// A new client, bound to the caller's tokio runtime.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.config.clone())?)
    }

    /// The kubeconfig file, for child processes and kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Where the API server listens (on loopback).
    pub fn api_address(&self) -> SocketAddr {
        self.api
    }

    /// The cluster's CA certificate (it signed the API server's).
    pub fn ca_file(&self) -> &Path {
        &self.ca
    }

    /// Makes `name` resolve to 127.0.0.1 for the API server and the
    /// kubelets: for a node's name, before its kubelet starts.
    pub fn resolve_locally(&self, name: &str) -> Result<()> {
        use std::io::Write;
        // Appended in place: a bind mount holds the file's inode.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.hosts)
            .map_err(|e| Error::io(&self.hosts, e))?;
        file.write_all(format!("127.0.0.1 {name}\n").as_bytes())
            .map_err(|e| Error::io(&self.hosts, e))
    }

    /// What a process of the cluster binds over /etc/hosts and
    /// /etc/resolv.conf (see [`crate::mount::bind_in_own_namespace`]).
    pub(crate) fn name_resolution(&self) -> Vec<(PathBuf, PathBuf)> {
        name_resolution_binds(&self.hosts, &self.resolv_conf)
    }

    /// A kubelet serving certificate for node `name`, from the cluster's CA.
    pub(crate) fn kubelet_serving_certificate(&self, name: &str) -> Result<certs::Issued> {
        self.authority
            .serving(name, &[name, "127.0.0.1", "localhost"])
    }

    /// Writes to `path` a kubeconfig like [`ControlPlane::kubeconfig`] that
    /// reaches the API server at `server` (a relay), still verifying the
    /// serving certificate as the loopback address's.
    pub fn write_kubeconfig_via(&self, path: &Path, server: SocketAddr) -> Result<()> {
        let name = self.api.ip().to_string();
        write_kubeconfig(path, server, Some(&name), &self.ca, &self.token)
    }

    /// Runs the pinned kubectl against this control plane.
    pub fn kubectl(&self, args: &[&str]) -> Result<Output> {
        let kubectl = tools_dir().join("kubectl");
        Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .map_err(|e| Error::io(kubectl, e))
    }

    /// Kills the processes and removes their data; idempotent.
    pub fn stop(&self) {
        let mut processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        // Dropping a process kills it; the API server goes before its store.
        while processes.pop().is_some() {}
        self.dir.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Applies every CRD in `path` (server-side apply) and waits until each is
    /// established.
    pub async fn apply_crds(&self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let api: Api<CustomResourceDefinition> = Api::all(self.client()?);
        let params = PatchParams::apply("oxhorn-testbed").force();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let crd = CustomResourceDefinition::deserialize(document)?;
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &params, &Patch::Apply(&crd)).await?;
            let established = await_condition(api.clone(), &name, conditions::is_crd_established());
            let Ok(waited) = tokio::time::timeout(Duration::from_secs(30), established).await
            else {
                let conditions = api.get(&name).await?.status.and_then(|s| s.conditions);
                return Err(Error::Failed(format!(
                    "CRD {name} not established after 30s: {conditions:?}"
                )));
            };
            waited.map_err(|e| Error::Failed(format!("waiting for CRD {name}: {e}")))?;
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls /readyz until kube-apiserver answers "ok", failing early when one of
/// the processes exits.
async fn wait_ready(client: &Client, processes: &mut [Supervised]) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        for process in processes.iter_mut() {
            process.check_running()?;
        }
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| Error::Failed(e.to_string()))?;
        let last = match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => body,
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            let log = processes.last().map(|p| p.log_tail(30)).unwrap_or_default();
            return Err(Error::Failed(format!(
                "kube-apiserver not ready after {START_TIMEOUT:?}: {last}\n{log}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// deploy/crds.yaml of this source tree.
pub fn crds_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds.yaml")
}

/// Memory-backed when possible: etcd fsyncs every write.
fn data_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Where test processes listen: below the kernel's ephemeral range (32768
/// and up by default), from which outgoing connections take their ports.
/// A port found free in that range can be taken by a connection before the
/// process meant to listen on it has started (seen: "Address already in
/// use" with kubelets and pods connecting beside the tests). The instances'
/// own range, 10000-19999, is below this one.
const TEST_PORTS: std::ops::Range<u32> = 20_000..32_000;

pub(crate) fn free_port() -> Result<u16> {
    free_ports(1)
}

/// The first of `count` consecutive ports free on loopback, from
/// [`TEST_PORTS`]; each call starts looking past the last one found, from
/// a place that differs between processes.
pub(crate) fn free_ports(count: u16) -> Result<u16> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let span = TEST_PORTS.end - TEST_PORTS.start - u32::from(count);
    let seed = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let step = NEXT.fetch_add(u32::from(count), std::sync::atomic::Ordering::Relaxed);
        let offset = seed.wrapping_add(step) % span;
        // Invariant: TEST_PORTS ends below u16::MAX.
        let first = u16::try_from(TEST_PORTS.start + offset).expect("a port");
        if (0..count).all(|i| TcpListener::bind(("127.0.0.1", first + i)).is_ok()) {
            return Ok(first);
        }
    }
    Err(Error::Failed(format!(
        "no {count} consecutive free ports in {TEST_PORTS:?}"
    )))
}

/// The path of an installed tool, or an error saying how to install it.
pub(crate) fn tool(name: &str) -> Result<PathBuf> {
    let path = tools_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Failed(format!(
            "{} is missing: run hack/install-test-deps.sh",
            path.display()
        )))
    }
}

fn etcd_command(dir: &Path, client_port: u16) -> Result<Command> {
    let peer_port = free_port()?;
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut command = Command::new(tool("etcd")?);
    command
        .arg("--name=testbed")
        .arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=testbed={peer}"))
        .args(["--logger=zap", "--log-level=warn"]);
    Ok(command)
}

fn apiserver_command(dir: &Path, port: u16, etcd_port: u16) -> Result<Command> {
    let file = |name: &str| dir.join(name).display().to_string();
    let mut command = Command::new(tool("kube-apiserver")?);
    command
        .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
        .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
        .arg(format!("--secure-port={port}"))
        .arg(format!("--tls-cert-file={}", file("apiserver.crt")))
        .arg(format!("--tls-private-key-file={}", file("apiserver.key")))
        // Kubelets are dialled by their node names (see the module's
        // documentation), never by an address that could leave the machine.
        .arg("--kubelet-preferred-address-types=Hostname")
        .arg(format!(
            "--kubelet-certificate-authority={}",
            file("ca.crt")
        ))
        .arg(format!(
            "--kubelet-client-certificate={}",
            file("kubelet-client.crt")
        ))
        .arg(format!(
            "--kubelet-client-key={}",
            file("kubelet-client.key")
        ))
        .arg(format!("--token-auth-file={}", file("tokens.csv")))
        .arg("--authorization-mode=RBAC")
        .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
        .arg(format!(
            "--service-account-key-file={}",
            file("service-account.pub")
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            file("service-account.key")
        ))
        .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
        // No kube-proxy reads the kubernetes Service's endpoints (the
        // kubelet nodes relay its address themselves); don't maintain them.
        .arg("--endpoint-reconciler-type=none")
        // As every real cluster is set up: storage and CNI plugins run
        // privileged.
        .arg("--allow-privileged=true")
        .args([
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=1",
        ]);
    Ok(command)
}

/// The API server's user on the kubelets, as kubeadm names it; its group
/// may do anything there (logs, exec, port-forward, proxy).
const KUBELET_CLIENT: (&str, &str) = ("kube-apiserver-kubelet-client", "system:masters");

/// Writes the certificates, keys and the token file; returns the admin
/// token.
fn write_credentials(dir: &Path, authority: &certs::Ca) -> Result<String> {
    // Also under the names and the address of the kubernetes Service, as
    // pods reach it.
    let service_ip = KUBERNETES_SERVICE.ip().to_string();
    let serving = authority.serving(
        "kube-apiserver",
        &[
            "127.0.0.1",
            "localhost",
            &service_ip,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
    )?;
    let (user, group) = KUBELET_CLIENT;
    let kubelet_client = authority.client(user, group)?;
    let (service_account_key, service_account_pub) = certs::service_account_key()?;
    let token = format!("{:032x}", rand_u128());
    let files = [
        ("ca.crt", authority.pem().to_string()),
        ("apiserver.crt", serving.cert_pem),
        ("apiserver.key", serving.key_pem),
        ("kubelet-client.crt", kubelet_client.cert_pem),
        ("kubelet-client.key", kubelet_client.key_pem),
        ("service-account.key", service_account_key),
        ("service-account.pub", service_account_pub),
        (
            "tokens.csv",
            format!("{token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER},\"system:masters\"\n"),
        ),
    ];
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::write(&path, content).map_err(|e| Error::io(&path, e))?;
    }
    Ok(token)
}

/// Writes the hosts file (localhost only, until nodes join) and a
/// resolv.conf that sends queries to 127.0.0.1, where nothing answers;
/// returns their paths.
fn write_name_resolution(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let hosts = dir.join("hosts");
    let resolv_conf = dir.join("resolv.conf");
    for (path, text) in [
        (&hosts, "127.0.0.1 localhost\n::1 localhost\n"),
        (&resolv_conf, "nameserver 127.0.0.1\n"),
    ] {
        std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
    }
    Ok((hosts, resolv_conf))
}

fn name_resolution_binds(hosts: &Path, resolv_conf: &Path) -> Vec<(PathBuf, PathBuf)> {
    vec![
        (hosts.to_path_buf(), PathBuf::from("/etc/hosts")),
        (resolv_conf.to_path_buf(), PathBuf::from("/etc/resolv.conf")),
    ]
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, RandomState};
    let half = || RandomState::new().hash_one(std::time::SystemTime::now()) as u128;
    (half() << 64) | half()
}

fn write_kubeconfig(
    path: &Path,
    server: SocketAddr,
    tls_server_name: Option<&str>,
    ca: &Path,
    token: &str,
) -> Result<()> {
    let tls_server_name = tls_server_name
        .map(|name| format!("\n    tls-server-name: {name}"))
        .unwrap_or_default();
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: oxhorn-testbed
  cluster:
    server: https://{server}
    certificate-authority: {ca}{tls_server_name}
users:
- name: admin
  user:
    token: {token}
contexts:
- name: oxhorn-testbed
  context:
    cluster: oxhorn-testbed
    user: admin
current-context: oxhorn-testbed
",
        ca = ca.display()
    );
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

async fn load_config(kubeconfig: &Path) -> Result<Config> {
    let parsed = Kubeconfig::read_from(kubeconfig).map_err(|e| Error::KubeConfig(e.to_string()))?;
    Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))
}
