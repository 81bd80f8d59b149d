//! The README's main job: a local Kubernetes control plane (etcd +
//! kube-apiserver on loopback) with `oxhorn manager` running on it as node-1.
//! It shows the CSI Identity service answering over the socket and the CRDs
//! served, then stops everything (or, with --hold, waits for Ctrl-C).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use oxhorn::csi::proto::identity_client::IdentityClient;
use oxhorn::csi::proto::{GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest};
use oxhorn::testbed::{ControlPlane, ManagerProcess};
use oxhorn::types::DEFAULT_NAMESPACE;

#[derive(Parser)]
struct Args {
    /// The oxhorn binary to run as the manager.
    #[arg(long)]
    oxhorn: PathBuf,
    /// Keep the cluster running until Ctrl-C.
    #[arg(long)]
    hold: bool,
}

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

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let control_plane = ControlPlane::start().await?;
    println!("control plane ready in {:.1?}", started.elapsed());
    kubectl(&control_plane, &["create", "namespace", DEFAULT_NAMESPACE])?;

    let mut manager =
        ManagerProcess::spawn(&args.oxhorn, &control_plane, "node-1", DEFAULT_NAMESPACE)?;
    let mut identity = IdentityClient::new(manager.connect(Duration::from_secs(30)).await?);
    let info = identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await?
        .into_inner();
    println!("\nCSI Identity on {}:", manager.socket().display());
    println!("  plugin:       {} {}", info.name, info.vendor_version);
    let capabilities = identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await?
        .into_inner();
    for capability in capabilities.capabilities {
        println!(
            "  capability:   {:?}",
            capability.r#type.ok_or("empty capability")?
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while identity.probe(ProbeRequest {}).await?.into_inner().ready != Some(true) {
        if Instant::now() > deadline {
            return Err("the manager never became ready".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("  probe:        ready");

    println!("\n$ kubectl api-resources --api-group=oxhorn.io");
    kubectl(&control_plane, &["api-resources", "--api-group=oxhorn.io"])?;
    println!("$ kubectl get crds");
    kubectl(&control_plane, &["get", "crds"])?;

    if args.hold {
        println!(
            "\nexport KUBECONFIG={}\nCSI socket: {}\nCtrl-C stops the cluster.",
            control_plane.kubeconfig().display(),
            manager.socket().display()
        );
        tokio::signal::ctrl_c().await?;
    }
    let status = manager.terminate(Duration::from_secs(10))?;
    println!("\nmanager stopped ({status}); stopping the control plane");
    Ok(())
}

/// Runs kubectl against the cluster, echoing its output.
fn kubectl(control_plane: &ControlPlane, args: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
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
