//! The README's main job: Oxhorn installed as a user installs it, on a local
//! cluster. A control plane (etcd + kube-apiserver on loopback), two real
//! kubelet nodes (containerd, runc) running the images hack/build-image.sh
//! built, kube-scheduler and kube-controller-manager; `kubectl apply` of the
//! manifest (see `oxhorn_testbed::install` for what the test bed changes in
//! it); a manager-only node (an `oxhorn manager` host process) joins, so
//! the default StorageClass's three replicas have three nodes. A claim on
//! that class and a pod on node-1 that writes a file and its checksum, then
//! another on node-2 that checks it; kubectl shows the objects. Then it is all deleted and
//! stopped (or, with --hold, after Ctrl-C). --import-images adds images of
//! one's own to the nodes (hack/e2e.sh's test images).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::CSINode;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use oxhorn::csi::DRIVER_NAME;
use oxhorn::types::{Setting, SettingSpec, Volume};
use oxhorn_testbed::install::{Installation, NAMESPACE};
use oxhorn_testbed::sidecars::{self, Sidecars};
use oxhorn_testbed::{self as testbed, ControlPlane, KubeletNode, ManagerOptions, ManagerProcess};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

/// The kubelet nodes; node-3 is manager-only.
const KUBELET_NODES: [&str; 2] = ["node-1", "node-2"];
const NODES: u8 = 3;
const CLAIM: &str = "demo";
const USER_NAMESPACE: &str = "default";
const SIZE: &str = "256Mi";
const MOUNT: &str = "/data";
const READER: &str = "demo-reader";
/// Where every node's manager serves /metrics, and the API and dashboard:
/// the DaemonSet's as deploy/oxhorn.yaml says, node-3's as started here.
const METRICS_PORT: u16 = 9811;
const API_PORT: u16 = 9500;
/// The local port of the printed `kubectl port-forward`: on this host,
/// one manager already has the loopback's API_PORT (the manifest's
/// `--api-loopback`, where the forward arrives).
const FORWARDED: u16 = 8500;
/// Long enough for a cold start of every pod on a busy machine.
const PATIENCE: Duration = Duration::from_secs(180);

#[derive(Parser)]
struct Args {
    /// The oxhorn binary the manager-only nodes run.
    #[arg(long)]
    oxhorn: PathBuf,
    /// Keep the cluster running until Ctrl-C.
    #[arg(long)]
    hold: bool,
    /// Also import every image archive (`*.tar`) of this directory into
    /// each kubelet node, under the names the archives carry: images the
    /// cluster's pods run without pulling (hack/e2e.sh passes those of
    /// hack/install-e2e-deps.sh). Repeatable.
    #[arg(long, value_name = "DIR")]
    import_images: Vec<PathBuf>,
}

type Failure = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> ExitCode {
    oxhorn::logging::init(oxhorn::logging::LogFormat::Text);
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("local cluster failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// 127.1.0.x: the integration tests' nodes take 127.0.x.y, and the tests
/// run this example beside them.
fn address(node: u8) -> IpAddr {
    IpAddr::from([127, 1, 0, node])
}

async fn run(args: Args) -> Result<(), Failure> {
    let started = Instant::now();
    let say = |what: &str| println!("[{:>6.1?}] {what}", started.elapsed());
    let control_plane = ControlPlane::start().await?;
    sidecars::apply_snapshot_crds(&control_plane).await?;
    let client = control_plane.client()?;
    say("control plane ready");
    let [first, second] = KUBELET_NODES;
    let node = KubeletNode::start(&control_plane, first).await?;
    // Declared after the first node, so dropped before it: the first
    // holds the host's turn.
    let node_2 = KubeletNode::start_beside(&control_plane, second, &node).await?;
    node.import_product_images()?;
    node_2.import_product_images()?;
    for dir in &args.import_images {
        node.import_images(dir)?;
        node_2.import_images(dir)?;
    }
    let _controllers = Sidecars::start_cluster(&control_plane)?;
    say("kubelet nodes node-1 and node-2 ready, oxhorn's images imported");

    let nodes = [(&node, address(1)), (&node_2, address(2))];
    let installation = Installation::apply(&control_plane, &nodes).await?;
    say(&format!(
        "$ kubectl apply -f {} (deploy/oxhorn.yaml for these nodes)",
        installation.file().display()
    ));
    // The machine's disk may be all but full; the demo volume is a few
    // sparse files.
    let setting = Setting::new(
        "storage-minimal-available-percentage",
        SettingSpec { value: "0".into() },
    );
    Api::<Setting>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &setting)
        .await?;
    let mut managers = Vec::new();
    for i in 3..=NODES {
        let name = format!("node-{i}");
        testbed::register_kube_node(&client, &name, &[]).await?;
        let mut options = ManagerOptions::new(control_plane.kubeconfig(), &name, NAMESPACE);
        options.ip = address(i);
        options.instance_manager = true;
        options.metrics_port = Some(METRICS_PORT);
        options.api_port = Some(API_PORT);
        managers.push(ManagerProcess::start(&args.oxhorn, options)?);
    }
    until_installed(&client).await?;
    say("oxhorn running: its pods Ready on node-1 and node-2, node-3 joined");

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), USER_NAMESPACE);
    claims.create(&PostParams::default(), &claim()?).await?;
    let write = format!(
        "set -e; echo hello from oxhorn > {MOUNT}/hello.txt; \
         sha256sum {MOUNT}/hello.txt > {MOUNT}/hello.sha256; sync"
    );
    run_pod(&client, "demo-writer", &write, first).await?;
    say(&format!(
        "pod demo-writer on {first} wrote {MOUNT}/hello.txt on claim {CLAIM}, {:.1?} after kubectl apply",
        installation.applied.elapsed()
    ));
    // The reader stays, for kubectl to show; Ready once its check passed.
    let read =
        format!("sha256sum -c {MOUNT}/hello.sha256 && touch /tmp/checked && exec sleep 1000000");
    start_pod(&client, READER, &read, second).await?;
    say(&format!(
        "pod demo-reader on {second} found the file and its checksum, and stays"
    ));

    for (show, args) in [
        (
            "pods,pvc -n default",
            ["get", "pods,pvc", "-n", USER_NAMESPACE],
        ),
        ("pods -n oxhorn-system", ["get", "pods", "-n", NAMESPACE]),
        (
            "volumes,engines,replicas -n oxhorn-system",
            ["get", "volumes,engines,replicas", "-n", NAMESPACE],
        ),
    ] {
        println!("\n$ kubectl get {show}");
        kubectl(&control_plane, &args)?;
    }
    println!("\n$ kubectl get pv");
    kubectl(&control_plane, &["get", "pv"])?;
    show_metrics()?;

    if args.hold {
        // Listening before saying so: a Ctrl-C right after the line must
        // not find SIGINT's default action still in place.
        let mut interrupt = signal(SignalKind::interrupt())?;
        println!(
            "\nexport KUBECONFIG={}\nPrometheus metrics: {} (deploy/monitoring/ has \
             the alert rules, a ServiceMonitor and a Grafana dashboard)\n\
             Dashboard: http://{}:{API_PORT}/ui/ from this host, or through the \
             API's Service, as on any cluster:\n  \
             kubectl -n oxhorn-system port-forward svc/oxhorn-api {FORWARDED}:{API_PORT}\n\
             then http://127.0.0.1:{FORWARDED}/ui/; sign in with the token of\n  \
             kubectl -n oxhorn-system create token oxhorn-operator\nCtrl-C stops the cluster.",
            control_plane.kubeconfig().display(),
            (1..=NODES)
                .map(|i| format!("http://{}:{METRICS_PORT}/metrics", address(i)))
                .collect::<Vec<_>>()
                .join(" "),
            address(1),
        );
        interrupt.recv().await;
    }
    delete_pod(&client, READER).await?;
    delete_claim(&client).await?;
    println!("\nclaim deleted: its PV, volume and replicas are gone; stopping the cluster");
    for mut manager in managers {
        manager.terminate(Duration::from_secs(10))?;
    }
    Ok(())
}

/// Waits until a manager pod is Ready on each kubelet node, each kubelet
/// lists the driver, and the users' namespace has its default
/// ServiceAccount.
/// Prints the demo volume's robustness as its owner's manager exports it
/// for Prometheus.
fn show_metrics() -> Result<(), Failure> {
    println!(
        "\n$ curl -s http://<each node>:{METRICS_PORT}/metrics | grep 'oxhorn_volume_robustness.* 1$'"
    );
    for i in 1..=NODES {
        let address = std::net::SocketAddr::new(address(i), METRICS_PORT);
        let scraped = testbed::prometheus::scrape(address)?;
        let current = scraped
            .lines()
            .filter(|l| l.starts_with("oxhorn_volume_robustness{") && l.ends_with(" 1"));
        current.for_each(|line| println!("{line}"));
    }
    Ok(())
}

async fn until_installed(client: &Client) -> Result<(), Failure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), USER_NAMESPACE);
    let installed = until(|| async {
        let selector = ListParams::default().labels("app.kubernetes.io/name=oxhorn-manager");
        let managers = pods.list(&selector).await.ok()?.items;
        for node in KUBELET_NODES {
            let on_node =
                |pod: &&Pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            managers.iter().filter(on_node).find(|p| is_ready(p))?;
            let csinode = csinodes.get_opt(node).await.ok()??;
            csinode
                .spec
                .drivers
                .iter()
                .find(|d| d.name == DRIVER_NAME)?;
        }
        accounts.get_opt("default").await.ok()?.map(drop)
    });
    installed.await.ok_or_else(|| {
        format!("oxhorn was not running on {KUBELET_NODES:?} within {PATIENCE:?}").into()
    })
}

fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The claim, on the default StorageClass (3 replicas).
fn claim() -> Result<PersistentVolumeClaim, Failure> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": CLAIM},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": SIZE}},
        },
    }))?)
}

/// A busybox pod on `node` with the claim at MOUNT, running `script`;
/// Ready once `script` made /tmp/checked.
fn demo_pod(name: &str, script: &str, node: &str) -> Result<Pod, Failure> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "main",
                "image": testbed::images::BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": MOUNT}],
                "readinessProbe": {
                    "exec": {"command": ["test", "-e", "/tmp/checked"]},
                    "periodSeconds": 1,
                },
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
        }
    }))?)
}

/// Runs `script` in a [`demo_pod`] until it succeeds (an error if it
/// fails), then deletes the pod.
async fn run_pod(client: &Client, name: &str, script: &str, node: &str) -> Result<(), Failure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), USER_NAMESPACE);
    pods.create(&PostParams::default(), &demo_pod(name, script, node)?)
        .await?;
    let finished = until(|| async {
        let phase = pods.get(name).await.ok()?.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    });
    let phase = finished
        .await
        .ok_or_else(|| format!("pod {name} did not finish within {PATIENCE:?}"))?;
    delete_pod(client, name).await?;
    if phase == "Succeeded" {
        Ok(())
    } else {
        Err(format!("pod {name} failed").into())
    }
}

/// Starts a [`demo_pod`] and waits until it is Ready; an error if it ends.
async fn start_pod(client: &Client, name: &str, script: &str, node: &str) -> Result<(), Failure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), USER_NAMESPACE);
    pods.create(&PostParams::default(), &demo_pod(name, script, node)?)
        .await?;
    let settled = until(|| async {
        let pod = pods.get(name).await.ok()?;
        let phase = pod.status.as_ref()?.phase.clone()?;
        (is_ready(&pod) || matches!(phase.as_str(), "Succeeded" | "Failed")).then_some(phase)
    });
    let phase = settled
        .await
        .ok_or_else(|| format!("pod {name} was not Ready within {PATIENCE:?}"))?;
    if phase == "Running" {
        Ok(())
    } else {
        Err(format!("pod {name} ended: {phase}").into())
    }
}

/// Deletes the pod and waits until it is gone.
async fn delete_pod(client: &Client, name: &str) -> Result<(), Failure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), USER_NAMESPACE);
    pods.delete(name, &DeleteParams::default()).await?;
    let gone = until(|| async { pods.get_opt(name).await.ok()?.is_none().then_some(()) });
    gone.await
        .ok_or_else(|| format!("pod {name} was not gone within {PATIENCE:?}"))?;
    Ok(())
}

/// Deletes the claim and waits until the provisioner deleted its PV and
/// oxhorn its Volume.
async fn delete_claim(client: &Client) -> Result<(), Failure> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), USER_NAMESPACE);
    claims.delete(CLAIM, &DeleteParams::default()).await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let volumes: Api<Volume> = Api::namespaced(client.clone(), NAMESPACE);
    let gone = until(|| async {
        let pvs_gone = pvs.list(&Default::default()).await.ok()?.items.is_empty();
        let volumes_gone = volumes
            .list(&Default::default())
            .await
            .ok()?
            .items
            .is_empty();
        (pvs_gone && volumes_gone).then_some(())
    });
    gone.await
        .ok_or_else(|| format!("the PV and its volume were not deleted within {PATIENCE:?}"))?;
    Ok(())
}

/// Polls `check` for up to PATIENCE.
async fn until<T, F, Fut>(mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if let Some(value) = check().await {
            return Some(value);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Runs kubectl against the cluster, echoing its output.
fn kubectl(control_plane: &ControlPlane, args: &[&str]) -> Result<(), Failure> {
    let output = control_plane.kubectl(args)?;
    print!("{}", String::from_utf8_lossy(&output.stdout));
    if !output.status.success() {
        return Err(format!(
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(())
}
