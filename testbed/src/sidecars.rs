//! The Kubernetes CSI sidecars (built by hack/install-test-deps.sh) as a
//! controller Deployment would run them next to one plugin: csi-provisioner,
//! csi-attacher, csi-resizer and csi-snapshotter on the plugin's socket; and
//! the cluster-wide controllers they rely on: snapshot-controller, and
//! kube-controller-manager's PersistentVolume controllers (they bind claims
//! to volumes and tell the provisioner which claims are its own). Also what
//! a kubelet and a cluster installer would have put in place for them:
//! CSINode objects and the VolumeSnapshot CRDs.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tempfile::TempDir;

use super::controlplane::tool;
use super::process::Supervised;
use super::{ControlPlane, tools_dir};
use crate::{Error, Result};
use oxhorn::csi::DRIVER_NAME;

/// Long enough for an attach (an engine starting) or a snapshot; the
/// sidecars' defaults (10-15 s) are meant for cloud APIs that answer at once.
const CALL_TIMEOUT: &str = "--timeout=60s";
/// The sidecars back off up to 5 minutes by default: too long for a test
/// to wait out one refused call.
const RETRY_MAX: &str = "--retry-interval-max=5s";

/// The kube-controller-manager controllers a CSI driver needs; the
/// attach-detach controller is not among them: it needs kubelets.
const KUBE_CONTROLLERS: &str = "persistentvolume-binder-controller,\
persistentvolume-protection-controller,persistentvolumeclaim-protection-controller";
/// What real kubelet nodes add: the attach-detach controller, and the
/// service-account controller, which gives every namespace the `default`
/// ServiceAccount that pods run as.
const KUBELET_CONTROLLERS: &str = "persistentvolume-attach-detach-controller,\
serviceaccount-controller";

/// What a cluster runs before Oxhorn is installed in it: every controller
/// kube-controller-manager runs by default, node lifecycle included
/// (manager-only nodes renew their Leases: see
/// [`crate::register_kube_node`]).
const CLUSTER_CONTROLLERS: &str = "*";
/// The same on a control plane that other tests share: without node
/// lifecycle, which would judge those tests' manager-only nodes too, whose
/// Leases renew only while each test's own runtime gets to run.
const SHARED_CLUSTER_CONTROLLERS: &str = "*,-node-lifecycle-controller";

/// The running sidecars; dropping this kills them and removes their logs.
pub struct Sidecars {
    processes: Vec<Supervised>,
    // Holds the logs.
    _dir: TempDir,
}

impl Sidecars {
    /// Starts every sidecar against `kubeconfig`, the CSI ones talking to the
    /// plugin on `socket`. They wait for the socket to appear.
    pub fn start(kubeconfig: &Path, socket: &Path) -> Result<Self> {
        Self::start_with(kubeconfig, socket, false)
    }

    /// Like [`Sidecars::start`], for a cluster with real kubelet nodes
    /// ([`crate::KubeletNode`]): with kube-scheduler and the attach-detach
    /// and service-account controllers too.
    pub fn start_for_kubelets(kubeconfig: &Path, socket: &Path) -> Result<Self> {
        Self::start_with(kubeconfig, socket, true)
    }

    /// Only what the cluster itself runs, for Oxhorn installed from its
    /// manifest (whose Deployments bring the CSI sidecars): kube-scheduler
    /// and kube-controller-manager with its default controllers.
    pub fn start_cluster(control_plane: &ControlPlane) -> Result<Self> {
        Self::start_cluster_with(control_plane, CLUSTER_CONTROLLERS)
    }

    /// Like [`Sidecars::start_cluster`], on a control plane other tests
    /// share ([`crate::shared`]): without the node-lifecycle controller.
    pub fn start_cluster_beside_tests(control_plane: &ControlPlane) -> Result<Self> {
        Self::start_cluster_with(control_plane, SHARED_CLUSTER_CONTROLLERS)
    }

    fn start_cluster_with(control_plane: &ControlPlane, controllers: &str) -> Result<Self> {
        let dir = logs_dir()?;
        let kubeconfig = control_plane.kubeconfig();
        let mut kube_controllers = kube_controller_manager(kubeconfig, controllers)?;
        kube_controllers.arg(format!(
            "--root-ca-file={}",
            control_plane.ca_file().display()
        ));
        let commands = vec![
            ("kube-controller-manager", kube_controllers),
            ("kube-scheduler", kube_scheduler(kubeconfig)?),
        ];
        Self::spawn_all(commands, dir)
    }

    /// Only kube-controller-manager's PersistentVolume controllers, which
    /// bind claims to volumes, as every cluster runs them.
    pub fn start_claim_binder(kubeconfig: &Path) -> Result<Self> {
        let binder = kube_controller_manager(kubeconfig, KUBE_CONTROLLERS)?;
        Self::spawn_all(vec![("kube-controller-manager", binder)], logs_dir()?)
    }

    /// Only Kubernetes' garbage collector, which deletes the dependents of
    /// a deleted owner (its ownerReferences), as every cluster runs it.
    pub fn start_garbage_collector(kubeconfig: &Path) -> Result<Self> {
        let gc = kube_controller_manager(kubeconfig, "garbage-collector-controller")?;
        Self::spawn_all(vec![("kube-controller-manager", gc)], logs_dir()?)
    }

    fn start_with(kubeconfig: &Path, socket: &Path, kubelets: bool) -> Result<Self> {
        let dir = logs_dir()?;
        let csi = |name: &str| -> Result<Command> {
            let mut command = Command::new(tool(name)?);
            command
                .arg(format!("--csi-address={}", socket.display()))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["--leader-election=false", CALL_TIMEOUT, RETRY_MAX, "--v=2"]);
            Ok(command)
        };
        let mut provisioner = csi("csi-provisioner")?;
        // A controller Deployment, not one provisioner per node; the claim's
        // name and namespace go to CreateVolume, as in a real deployment.
        provisioner.args(["--node-deployment=false", "--extra-create-metadata"]);
        let attacher = csi("csi-attacher")?;
        let mut resizer = csi("csi-resizer")?;
        // Oxhorn grows volumes online: an in-use volume is no reason to wait.
        resizer.arg("--handle-volume-inuse-error=false");
        let mut snapshotter = csi("csi-snapshotter")?;
        snapshotter.arg("--extra-create-metadata");
        let mut snapshot_controller = Command::new(tool("snapshot-controller")?);
        snapshot_controller
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--leader-election=false", RETRY_MAX, "--v=2"]);

        let controllers = if kubelets {
            format!("{KUBE_CONTROLLERS},{KUBELET_CONTROLLERS}")
        } else {
            KUBE_CONTROLLERS.to_string()
        };
        let kube_controllers = kube_controller_manager(kubeconfig, &controllers)?;

        let mut commands = vec![
            ("kube-controller-manager", kube_controllers),
            ("csi-provisioner", provisioner),
            ("csi-attacher", attacher),
            ("csi-resizer", resizer),
            ("csi-snapshotter", snapshotter),
            ("snapshot-controller", snapshot_controller),
        ];
        if kubelets {
            commands.push(("kube-scheduler", kube_scheduler(kubeconfig)?));
        }
        Self::spawn_all(commands, dir)
    }

    fn spawn_all(commands: Vec<(&'static str, Command)>, dir: TempDir) -> Result<Self> {
        let mut processes = Vec::new();
        for (name, command) in commands {
            let log = dir.path().join(format!("{name}.log"));
            processes.push(Supervised::spawn(name, command, &log)?);
        }
        Ok(Self {
            processes,
            _dir: dir,
        })
    }

    /// An error naming the first sidecar that exited, with its log's end.
    pub fn check_running(&mut self) -> Result<()> {
        self.processes
            .iter_mut()
            .try_for_each(Supervised::check_running)
    }

    /// The last `lines` lines of each sidecar's log, for failure messages.
    pub fn logs(&self, lines: usize) -> String {
        self.processes
            .iter()
            .map(|p| format!("==== {} ====\n{}\n", p.name, p.log_tail(lines)))
            .collect()
    }
}

fn logs_dir() -> Result<TempDir> {
    tempfile::Builder::new()
        .prefix("oxhorn-sidecars-")
        .tempdir()
        .map_err(|e| Error::io(std::env::temp_dir(), e))
}

fn kube_controller_manager(kubeconfig: &Path, controllers: &str) -> Result<Command> {
    let mut command = Command::new(tool("kube-controller-manager")?);
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--controllers={controllers}"))
        .args([
            "--leader-elect=false",
            // Serves no health or metrics endpoint: nothing probes it.
            "--secure-port=0",
            "--use-service-account-credentials=false",
            // The binder also retries on this period, not only on events.
            "--pvclaimbinder-sync-period=2s",
            "--v=2",
        ]);
    Ok(command)
}

fn kube_scheduler(kubeconfig: &Path) -> Result<Command> {
    let mut command = Command::new(tool("kube-scheduler")?);
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["--leader-elect=false", "--secure-port=0", "--v=2"]);
    Ok(command)
}

/// Where hack/install-test-deps.sh puts the VolumeSnapshot CRDs.
pub fn snapshot_crds_dir() -> PathBuf {
    tools_dir().with_file_name("crds").join("snapshot")
}

/// Applies the VolumeSnapshot and VolumeGroupSnapshot CRDs to
/// `control_plane` and waits until they are established.
pub async fn apply_snapshot_crds(control_plane: &ControlPlane) -> Result<()> {
    let dir = snapshot_crds_dir();
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        Error::Failed(format!(
            "{}: {e}: run hack/install-test-deps.sh",
            dir.display()
        ))
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(&dir, e))?.path();
        if path.extension().is_some_and(|ext| ext == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    for file in files {
        control_plane.apply_crds(&file).await?;
    }
    Ok(())
}

/// Records that `node` runs oxhorn's node plugin with node id `node` and
/// the topology `keys` (its NodeGetInfo's), as the kubelet does when
/// node-driver-registrar registers the plugin: csi-attacher reads the node
/// id for ControllerPublishVolume here, csi-provisioner the topology keys.
pub async fn register_csi_node(client: &Client, node: &str, keys: &[&str]) -> Result<()> {
    let api: Api<CSINode> = Api::all(client.clone());
    let mut csi_node = CSINode {
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: DRIVER_NAME.to_owned(),
                node_id: node.to_owned(),
                topology_keys: Some(keys.iter().map(|k| (*k).to_owned()).collect()),
                ..CSINodeDriver::default()
            }],
        },
        ..CSINode::default()
    };
    csi_node.metadata.name = Some(node.to_owned());
    let params = PatchParams::apply("oxhorn-testbed").force();
    api.patch(node, &params, &Patch::Apply(&csi_node)).await?;
    Ok(())
}
