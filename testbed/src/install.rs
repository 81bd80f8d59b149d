//! Oxhorn installed from its manifest on a [`KubeletNode`] as a user
//! installs it, with `kubectl apply`: the manifest `oxhorn manifest` makes
//! for the node's directories, changed only where this test bed differs
//! from a real cluster (`for_the_test_bed`).
//!
//! The test bed's cluster has no service network (only pods on the pod
//! network reach the kubernetes Service's address, see
//! [`crate::KubeletNode`]) and its kubelet refuses a loopback node address,
//! so each host-network container is given the API server's address (as on
//! a cluster without kube-proxy), the manager's data plane
//! and probes use a loopback address, and a node selector keeps the pods on
//! the kubelet nodes (the cluster's other nodes have no kubelet), the
//! Deployments, with one replica each, on the first. The kubelet nodes
//! share one host, so each has directories of its own and a loopback
//! address of its own: each gets a copy of each DaemonSet, for its
//! directories and address, named and labelled for the node. This
//! machine's init (pid 1) is a sandbox's, whose namespaces no other process
//! may open: the manager joins those of this process instead
//! (`--host-pid`), which the kubelet runs in too.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use oxhorn::cmd::manifest::HostDirs;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ControlPlane, Error, KubeletNode, Result};

/// The namespace the manifest installs into.
pub const NAMESPACE: &str = "oxhorn-system";
const GONE_TIMEOUT: Duration = Duration::from_secs(120);

/// The applied manifest. Dropping it deletes its cluster-wide objects but
/// the CRDs, which every test of a binary shares; its namespace is the
/// caller's to remove (e.g. a [`crate::TestNamespace::adopt`]).
pub struct Installation {
    file: PathBuf,
    cluster_objects: PathBuf,
    kubeconfig: PathBuf,
    node: String,
    api: SocketAddr,
    address: IpAddr,
    /// When `kubectl apply` began.
    pub applied: Instant,
}

impl Installation {
    /// Waits until no earlier [`NAMESPACE`] is left (the namespace
    /// controller must run), then applies the manifest for `nodes`, each
    /// with its manager's data address; the Deployments run on the first.
    pub async fn apply(control: &ControlPlane, nodes: &[(&KubeletNode, IpAddr)]) -> Result<Self> {
        until_namespace_gone(control).await?;
        let &[(node, address), ..] = nodes else {
            return Err(Error::Failed("no node to install on".into()));
        };
        let api = control.api_address();
        let mut objects = Vec::new();
        for (i, (each, each_address)) in nodes.iter().enumerate() {
            for mut object in documents(&node_manifest(each)?)? {
                let daemon_set = object["kind"] == "DaemonSet";
                if !daemon_set && i > 0 {
                    continue;
                }
                for_the_test_bed(&mut object, api, each.name(), *each_address);
                if daemon_set && nodes.len() > 1 {
                    object = for_node(object, each.name());
                }
                objects.push(object);
            }
        }
        let manifest = to_yaml(&objects)?;
        let dir = node.host_dir("manifest")?;
        let file = dir.join("oxhorn.yaml");
        std::fs::write(&file, &manifest).map_err(|e| Error::io(&file, e))?;
        // Those of deploy/uninstall.yaml too, whether a test applies it or
        // not (kubectl is told to ignore any not found).
        let cluster_objects = dir.join("cluster-objects.yaml");
        let objects = cluster_objects_of(&manifest)? + &cluster_objects_of(&uninstall_yaml()?)?;
        std::fs::write(&cluster_objects, objects).map_err(|e| Error::io(&cluster_objects, e))?;
        let installation = Self {
            file,
            cluster_objects,
            kubeconfig: control.kubeconfig().to_path_buf(),
            node: node.name().to_string(),
            api,
            address,
            applied: Instant::now(),
        };
        installation.kubectl_apply()?;
        Ok(installation)
    }

    /// The manifest as applied.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Applies the manifest again, as a user re-applies it: what was
    /// deleted comes back.
    pub fn apply_again(&self) -> Result<()> {
        self.kubectl_apply()
    }

    fn kubectl_apply(&self) -> Result<()> {
        let file = text(&self.file)?;
        kubectl(
            &self.kubeconfig,
            &[
                "apply",
                "--server-side",
                "--field-manager=oxhorn-testbed",
                "-f",
                file,
            ],
        )
    }

    /// deploy/uninstall.yaml as this test bed runs it, written beside the
    /// manifest.
    pub fn uninstall_file(&self) -> Result<PathBuf> {
        let mut objects = documents(&uninstall_yaml()?)?;
        for object in &mut objects {
            for_the_test_bed(object, self.api, &self.node, self.address);
        }
        let yaml = to_yaml(&objects)?;
        let file = self.file.with_file_name("uninstall.yaml");
        std::fs::write(&file, yaml).map_err(|e| Error::io(&file, e))?;
        Ok(file)
    }
}

fn uninstall_yaml() -> Result<String> {
    oxhorn::cmd::manifest::uninstall_yaml()
        .map_err(|e| Error::Failed(format!("the uninstall manifest: {e}")))
}

impl Drop for Installation {
    fn drop(&mut self) {
        if let Ok(file) = text(&self.cluster_objects) {
            let delete = ["delete", "--ignore-not-found", "--wait=false", "-f", file];
            let _ = kubectl(&self.kubeconfig, &delete);
        }
    }
}

async fn until_namespace_gone(control: &ControlPlane) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(control.client()?);
    let deadline = Instant::now() + GONE_TIMEOUT;
    while namespaces.get_opt(NAMESPACE).await?.is_some() {
        if Instant::now() > deadline {
            return Err(Error::Failed(format!(
                "an earlier {NAMESPACE} still there after {GONE_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<()> {
    let kubectl = crate::tools_dir().join("kubectl");
    let output = std::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .map_err(|e| Error::io(&kubectl, e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Failed(format!(
            "kubectl {}: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

fn text(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| Error::Failed(format!("{} is not UTF-8", path.display())))
}

/// The objects of a YAML stream, empty documents left out.
fn documents(manifest: &str) -> Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(manifest) {
        let object = Value::deserialize(document)
            .map_err(|e| Error::Failed(format!("the manifest: {e}")))?;
        if !object.is_null() {
            objects.push(object);
        }
    }
    Ok(objects)
}

fn to_yaml(objects: &[Value]) -> Result<String> {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        let yaml = serde_yaml_ng::to_string(object)
            .map_err(|e| Error::Failed(format!("the manifest: {e}")))?;
        out.push_str(&yaml);
    }
    Ok(out)
}

/// The manifest for `node`'s directories.
fn node_manifest(node: &KubeletNode) -> Result<String> {
    let dirs = HostDirs {
        kubelet_dir: node.kubelet_dir(),
        data_dir: node.host_dir("oxhorn-data")?,
        run_dir: node.host_dir("oxhorn-run")?,
    };
    oxhorn::cmd::manifest::manifest_yaml_for(&dirs)
        .map_err(|e| Error::Failed(format!("the manifest: {e}")))
}

/// `daemon_set`, for `node` alone: named for it, and with a label of it
/// that its selector requires, so that the copies leave each other's pods
/// alone.
fn for_node(mut daemon_set: Value, node: &str) -> Value {
    let name = daemon_set["metadata"]["name"].as_str().unwrap_or_default();
    daemon_set["metadata"]["name"] = json!(format!("{name}-{node}"));
    let spec = &mut daemon_set["spec"];
    spec["selector"]["matchLabels"][NODE_LABEL] = json!(node);
    spec["template"]["metadata"]["labels"][NODE_LABEL] = json!(node);
    daemon_set
}

/// The label of a DaemonSet's copy for one node.
const NODE_LABEL: &str = "testbed.oxhorn.io/node";

/// A manifest's object as the test bed runs it on `node`, with the
/// manager's data address `address` (see the module's comment).
fn for_the_test_bed(object: &mut Value, api: SocketAddr, node: &str, address: IpAddr) {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    if kind == "Deployment" {
        object["spec"]["replicas"] = json!(1);
    }
    if ["DaemonSet", "Deployment", "Job"].contains(&kind.as_str()) {
        let pod = &mut object["spec"]["template"]["spec"];
        pod["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        if let Some(containers) = pod["containers"].as_array_mut() {
            for container in containers {
                on_loopback(container, api, address);
            }
        }
    }
}

/// The API server's address in `container`'s environment; the manager's
/// data-plane address `address`, where it also answers its probes; the
/// namespaces of this process as the host's.
fn on_loopback(container: &mut Value, api: SocketAddr, address: IpAddr) {
    let mut env: Vec<Value> = container["env"].as_array().cloned().unwrap_or_default();
    let has_address = env.iter().any(|var| var["name"] == "POD_IP");
    env.retain(|var| var["name"] != "POD_IP");
    if has_address {
        env.push(json!({"name": "POD_IP", "value": address.to_string()}));
    }
    env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": api.ip().to_string()}));
    env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": api.port().to_string()}));
    container["env"] = Value::Array(env);
    for probe in ["readinessProbe", "livenessProbe"] {
        if container[probe].is_object() {
            container[probe]["httpGet"]["host"] = json!(address.to_string());
        }
    }
    if let Some(args) = container["args"].as_array_mut()
        && args
            .iter()
            .any(|arg| arg.as_str() == Some("--host-proc=/host/proc"))
    {
        args.push(json!(format!("--host-pid={}", std::process::id())));
    }
}

/// The manifest's cluster-wide objects but the namespace and the CRDs.
fn cluster_objects_of(manifest: &str) -> Result<String> {
    let objects: Vec<Value> = documents(manifest)?
        .into_iter()
        .filter(|object| {
            let kind = object["kind"].as_str().unwrap_or_default();
            !object["metadata"]["namespace"].is_string()
                && !["Namespace", "CustomResourceDefinition"].contains(&kind)
        })
        .collect();
    to_yaml(&objects)
}
