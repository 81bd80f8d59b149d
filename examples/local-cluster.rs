//! The README's main job: a local Kubernetes control plane (etcd +
//! kube-apiserver on loopback) with three `oxhorn manager` processes playing
//! three nodes, and the real CSI sidecars (csi-provisioner, csi-attacher, ...)
//! with kube-controller-manager's PersistentVolume controllers on node-1's
//! CSI socket. A StorageClass and a PVC get a 3-replica volume through the
//! provisioner; it is attached to node-1 through a VolumeAttachment, staged
//! and published there (FUSE file + loop device, ext4) as the kubelet would,
//! and a file is written and read back; kubectl shows the objects. Then it
//! is all deleted and stopped (or, with --hold, after Ctrl-C).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use oxhorn::csi::DRIVER_NAME;
use oxhorn::types::{DEFAULT_NAMESPACE, Setting, SettingSpec, Volume};
use oxhorn_testbed::kubelet::{self, Kubelet};
use oxhorn_testbed::sidecars::{self, Sidecars};
use oxhorn_testbed::{self as testbed, ControlPlane, ManagerOptions, ManagerProcess};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

const NODES: u8 = 3;
/// Where the volume attaches: the node whose socket the sidecars use.
const NODE: &str = "node-1";
const STORAGE_CLASS: &str = "oxhorn";
const CLAIM: &str = "demo";
/// Claims live in the users' namespace, oxhorn's objects in its own.
const USER_NAMESPACE: &str = "default";
const SIZE: &str = "256Mi";

#[derive(Parser)]
struct Args {
    /// The oxhorn binary to run as the managers.
    #[arg(long)]
    oxhorn: PathBuf,
    /// Keep the cluster running until Ctrl-C.
    #[arg(long)]
    hold: bool,
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

async fn run(args: Args) -> Result<(), Failure> {
    let started = Instant::now();
    let control_plane = ControlPlane::start().await?;
    sidecars::apply_snapshot_crds(&control_plane).await?;
    println!("control plane ready in {:.1?}", started.elapsed());
    kubectl(&control_plane, &["create", "namespace", DEFAULT_NAMESPACE])?;
    let client = control_plane.client()?;
    // The machine's disk may be all but full; the demo volume is a few
    // sparse files.
    let setting = Setting::new(
        "storage-minimal-available-percentage",
        SettingSpec { value: "0".into() },
    );
    Api::<Setting>::namespaced(client.clone(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &setting)
        .await?;

    let mut managers = Vec::new();
    for i in 1..=NODES {
        let name = format!("node-{i}");
        testbed::register_kube_node(&client, &name, &[]).await?;
        sidecars::register_csi_node(&client, &name, &[]).await?;
        let mut options = ManagerOptions::new(control_plane.kubeconfig(), &name, DEFAULT_NAMESPACE);
        // 127.1.0.x: the integration tests' nodes take 127.0.x.y, and the
        // tests run this example beside them.
        options.ip = IpAddr::from([127, 1, 0, i]);
        managers.push(ManagerProcess::start(&args.oxhorn, options)?);
    }
    let mut channels = Vec::new();
    for manager in &mut managers {
        channels.push(manager.connect(Duration::from_secs(30)).await?);
    }
    // Dropped before the managers: the sidecars, then the mounts.
    let _sidecars = Sidecars::start(control_plane.kubeconfig(), managers[0].socket())?;
    let mut kubelet = Kubelet::new(channels.swap_remove(0))?;
    println!(
        "{NODES} managers and the CSI sidecars up in {:.1?}",
        started.elapsed()
    );

    let pv = provision(&client).await?;
    println!(
        "PVC {CLAIM} bound to {} in {:.1?}",
        pv.name_any(),
        started.elapsed()
    );
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attachment = attach(&attachments, &pv.name_any()).await?;
    let published = kubelet.publish(&pv, &attachment).await?;
    println!(
        "attached, staged and published on node-1 in {:.1?}",
        started.elapsed()
    );

    let file = published.target.join("hello.txt");
    std::fs::write(&file, b"hello from oxhorn\n")?;
    std::fs::File::open(&file)?.sync_all()?;
    println!(
        "\nwrote and read back {}: {:?}",
        file.display(),
        std::fs::read_to_string(&file)?
    );
    println!("\n$ kubectl get pvc,pv,volumeattachments -n {USER_NAMESPACE}");
    kubectl(
        &control_plane,
        &["get", "pvc,pv,volumeattachments", "-n", USER_NAMESPACE],
    )?;
    println!("\n$ kubectl get volumes,engines,replicas -n {DEFAULT_NAMESPACE}");
    kubectl(
        &control_plane,
        &["get", "volumes,engines,replicas", "-n", DEFAULT_NAMESPACE],
    )?;

    if args.hold {
        // Listening before saying so: a Ctrl-C right after the line must
        // not find SIGINT's default action still in place.
        let mut interrupt = signal(SignalKind::interrupt())?;
        println!(
            "\nexport KUBECONFIG={}\nCtrl-C stops the cluster.",
            control_plane.kubeconfig().display()
        );
        interrupt.recv().await;
    }
    kubelet.unpublish(published).await?;
    let name = kubelet::attachment_name(&pv.name_any(), NODE);
    attachments.delete(&name, &DeleteParams::default()).await?;
    let detached = until(|| async {
        attachments
            .get_opt(&name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    });
    detached
        .await
        .ok_or("the volume did not detach within 60 s")?;
    delete(&client, &pv.name_any()).await?;
    println!("\nvolume unpublished, detached and deleted; stopping the cluster");
    for mut manager in managers {
        manager.terminate(Duration::from_secs(10))?;
    }
    Ok(())
}

/// Creates the StorageClass and the claim; the PV the claim is bound to.
async fn provision(client: &Client) -> Result<PersistentVolume, Failure> {
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": DRIVER_NAME,
        "parameters": {"numberOfReplicas": "3"},
        "allowVolumeExpansion": true,
    }))?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": CLAIM},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": SIZE}},
        },
    }))?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), USER_NAMESPACE);
    claims.create(&PostParams::default(), &claim).await?;
    let bound = until(|| async {
        let claim = claims.get(CLAIM).await.ok()?;
        let bound = claim.status.as_ref()?.phase.as_deref() == Some("Bound");
        bound.then_some(claim.spec?.volume_name?)
    });
    let volume_name = bound.await.ok_or("the PVC was not bound within 60 s")?;
    Ok(Api::<PersistentVolume>::all(client.clone())
        .get(&volume_name)
        .await?)
}

/// Creates the VolumeAttachment the attach-detach controller would, and
/// waits for csi-attacher to attach the volume.
async fn attach(
    attachments: &Api<VolumeAttachment>,
    pv: &str,
) -> Result<VolumeAttachment, Failure> {
    let attachment = kubelet::volume_attachment(pv, NODE);
    attachments
        .create(&PostParams::default(), &attachment)
        .await?;
    let name = kubelet::attachment_name(pv, NODE);
    let attached = until(|| async {
        let attachment = attachments.get(&name).await.ok()?;
        attachment.status.as_ref()?.attached.then_some(attachment)
    });
    Ok(attached
        .await
        .ok_or("the volume did not attach within 60 s")?)
}

/// Deletes the claim and waits until the provisioner deleted its PV and
/// oxhorn its Volume.
async fn delete(client: &Client, pv: &str) -> Result<(), Failure> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), USER_NAMESPACE);
    claims.delete(CLAIM, &DeleteParams::default()).await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let volumes: Api<Volume> = Api::namespaced(client.clone(), DEFAULT_NAMESPACE);
    let gone = until(|| async {
        let pv_gone = pvs.get_opt(pv).await.ok()?.is_none();
        let volumes_gone = volumes
            .list(&Default::default())
            .await
            .ok()?
            .items
            .is_empty();
        (pv_gone && volumes_gone).then_some(())
    });
    gone.await
        .ok_or("the PV and its volume were not deleted within 60 s")?;
    Ok(())
}

/// Polls `check` for up to a minute.
async fn until<T, F, Fut>(mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
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
