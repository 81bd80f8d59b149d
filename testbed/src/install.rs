//! Oxhorn installed from its manifest on a [`KubeletNode`] as a user
//! installs it, with `kubectl apply`: the manifest `oxhorn manifest` makes
//! for the node's directories, changed only where this test bed differs
//! from a real cluster ([`for_the_test_bed`]).
//!
//! The test bed's cluster has no service network and its kubelet refuses a
//! loopback node address, so each container is given the API server's
//! address (as on a cluster without kube-proxy), the manager's data plane
//! and probes use a loopback address, and a node selector keeps the pods on
//! the kubelet's node (the cluster's other nodes have no kubelet), with one
//! replica per Deployment. This machine's init (pid 1) is a sandbox's,
//! whose namespaces no other process may open: the manager joins those of
//! this process instead (`--host-pid`), which the kubelet runs in too.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use oxhorn::manifest::HostDirs;
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
    /// controller must run), then applies the manifest for `node` with the
    /// manager's data address `address`.
    pub async fn apply(
        control: &ControlPlane,
        node: &KubeletNode,
        address: IpAddr,
    ) -> Result<Self> {
        until_namespace_gone(control).await?;
        let dirs = HostDirs {
            kubelet_dir: node.kubelet_dir(),
            data_dir: node.host_dir("oxhorn-data")?,
            run_dir: node.host_dir("oxhorn-run")?,
        };
        let manifest = oxhorn::manifest::manifest_yaml_for(&dirs)
            .map_err(|e| Error::Failed(format!("the manifest: {e}")))?;
        let manifest = for_the_test_bed(&manifest, control.api_address(), node.name(), address)?;
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
            api: control.api_address(),
            address,
            applied: Instant::now(),
        };
        kubectl(
            control.kubeconfig(),
            &[
                "apply",
                "--server-side",
                "--field-manager=oxhorn-testbed",
                "-f",
                text(&installation.file)?,
            ],
        )?;
        Ok(installation)
    }

    /// The manifest as applied.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// deploy/uninstall.yaml as this test bed runs it, written beside the
    /// manifest.
    pub fn uninstall_file(&self) -> Result<PathBuf> {
        let yaml = for_the_test_bed(&uninstall_yaml()?, self.api, &self.node, self.address)?;
        let file = self.file.with_file_name("uninstall.yaml");
        std::fs::write(&file, yaml).map_err(|e| Error::io(&file, e))?;
        Ok(file)
    }
}

fn uninstall_yaml() -> Result<String> {
    oxhorn::manifest::uninstall_yaml()
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

/// The manifest as the test bed runs it (see the module's comment).
pub fn for_the_test_bed(
    manifest: &str,
    api: SocketAddr,
    node: &str,
    address: IpAddr,
) -> Result<String> {
    let mut objects = documents(manifest)?;
    for object in &mut objects {
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
    to_yaml(&objects)
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
