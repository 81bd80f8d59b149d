//! The README's main job: a local Kubernetes control plane (etcd +
//! kube-apiserver on loopback) with three `oxhorn manager` processes playing
//! three nodes. It creates a 3-replica Volume, attaches it to node-1 (FUSE
//! file + loop device), writes and reads back data through the block device,
//! and shows the objects with kubectl; then it deletes the volume and stops
//! everything (or, with --hold, waits for Ctrl-C first).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use oxhorn::testbed::{self, ControlPlane, ManagerOptions, ManagerProcess};
use oxhorn::types::{DEFAULT_NAMESPACE, Setting, SettingSpec, Volume, VolumeState};
use serde_json::json;

const NODES: u8 = 3;
const SIZE: i64 = 256 << 20;

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
    println!("control plane ready in {:.1?}", started.elapsed());
    kubectl(&control_plane, &["create", "namespace", DEFAULT_NAMESPACE])?;
    let client = control_plane.client()?;
    // This machine's disk may be fuller than the default 25% free that
    // replicas need.
    let setting = Setting::new(
        "storage-minimal-available-percentage",
        SettingSpec { value: "1".into() },
    );
    Api::<Setting>::namespaced(client.clone(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &setting)
        .await?;

    let mut managers = Vec::new();
    for i in 1..=NODES {
        let name = format!("node-{i}");
        testbed::register_kube_node(&client, &name, &[]).await?;
        let mut options = ManagerOptions::new(control_plane.kubeconfig(), &name, DEFAULT_NAMESPACE);
        options.ip = IpAddr::from([127, 0, 10, i]);
        managers.push(ManagerProcess::start(&args.oxhorn, options)?);
    }
    for manager in &mut managers {
        manager.connect(Duration::from_secs(30)).await?;
    }
    println!("{NODES} managers up in {:.1?}", started.elapsed());

    let volumes: Api<Volume> = Api::namespaced(client.clone(), DEFAULT_NAMESPACE);
    let spec = serde_json::from_value(json!({"size": SIZE, "numberOfReplicas": 3}))?;
    volumes
        .create(&PostParams::default(), &Volume::new("demo", spec))
        .await?;
    let attach = json!({"spec": {"nodeID": "node-1"}});
    volumes
        .patch("demo", &PatchParams::default(), &Patch::Merge(&attach))
        .await?;
    let attached = until(|| async {
        let volume = volumes.get("demo").await.ok()?;
        (volume.status?.state == VolumeState::Attached).then_some(())
    })
    .await;
    attached.ok_or("the volume did not attach within 60 s")?;
    println!(
        "volume demo attached to node-1 in {:.1?}",
        started.elapsed()
    );

    let device = managers[0].dev_dir().join("demo");
    let data = tempfile::NamedTempFile::new()?;
    std::fs::write(
        data.path(),
        &b"hello from oxhorn\n".repeat(4096 / 18 + 1)[..4096],
    )?;
    run_tool(
        "dd",
        &[
            &format!("if={}", data.path().display()),
            &format!("of={}", device.display()),
            "bs=4096",
            "oflag=direct",
            "conv=fsync,notrunc",
            "status=none",
        ],
    )?;
    let read = Command::new("dd")
        .args([
            &format!("if={}", device.display()),
            "bs=4096",
            "count=1",
            "iflag=direct",
            "status=none",
        ])
        .output()?;
    println!(
        "\nwrote and read back 4 KiB through {}: {:?}...",
        device.display(),
        String::from_utf8_lossy(&read.stdout[..18])
    );

    println!("\n$ kubectl get volumes,engines,replicas,nodes.oxhorn.io -n {DEFAULT_NAMESPACE}");
    kubectl(
        &control_plane,
        &[
            "get",
            "volumes,engines,replicas,nodes.oxhorn.io",
            "-n",
            DEFAULT_NAMESPACE,
        ],
    )?;

    if args.hold {
        println!(
            "\nexport KUBECONFIG={}\nCtrl-C stops the cluster.",
            control_plane.kubeconfig().display()
        );
        tokio::signal::ctrl_c().await?;
    }
    let detach = json!({"spec": {"nodeID": ""}});
    volumes
        .patch("demo", &PatchParams::default(), &Patch::Merge(&detach))
        .await?;
    volumes.delete("demo", &DeleteParams::default()).await?;
    let gone =
        until(|| async { volumes.get_opt("demo").await.ok()?.is_none().then_some(()) }).await;
    gone.ok_or("the volume was not deleted within 60 s")?;
    println!("\nvolume detached and deleted; stopping the cluster");
    for mut manager in managers {
        manager.terminate(Duration::from_secs(10))?;
    }
    Ok(())
}

/// Polls `check` for up to a minute.
async fn until<F, Fut>(mut check: F) -> Option<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<()>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if check().await.is_some() {
            return Some(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

fn run_tool(program: &str, args: &[&str]) -> Result<(), Failure> {
    let output = Command::new(program).args(args).output()?;
    if !output.status.success() {
        return Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(())
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
