//! The `oxhorn` binary: one executable for the per-node manager (CSI plugin and
//! controllers), the data-plane processes it starts, and tooling.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oxhorn::logging::{self, LogFormat};
use oxhorn::manager::{self, ManagerConfig};
use oxhorn::types::{self, DEFAULT_NAMESPACE};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(
    name = "oxhorn",
    version,
    about = "Replicated block storage for Kubernetes"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(
        long,
        value_enum,
        default_value_t,
        global = true,
        env = "OXHORN_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the per-node daemon: CSI services, controllers, instance manager.
    Manager {
        /// CSI endpoint to serve on.
        #[arg(long, env = "CSI_ENDPOINT", value_name = "unix:///PATH")]
        csi_endpoint: String,
        /// This node's name, as Kubernetes knows it.
        #[arg(long, env = "NODE_ID")]
        node_id: String,
        /// Kubeconfig file; without it, the in-cluster service account or $KUBECONFIG.
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// Namespace of oxhorn's objects.
        #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
        namespace: String,
    },
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let result = match cli.command {
        Command::Manager {
            csi_endpoint,
            node_id,
            kubeconfig,
            namespace,
        } => run_manager(ManagerConfig {
            csi_endpoint,
            node_id,
            kubeconfig,
            namespace,
        }),
        Command::Crds => types::crds_yaml()
            .map(|yaml| print!("{yaml}"))
            .map_err(Into::into),
        Command::Version => {
            println!("oxhorn {} (CSI 1.12)", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "exiting");
            ExitCode::FAILURE
        }
    }
}

fn run_manager(config: ManagerConfig) -> oxhorn::Result<()> {
    let runtime =
        tokio::runtime::Runtime::new().map_err(|e| oxhorn::Error::io("tokio runtime", e))?;
    runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        manager::run(config, shutdown).await
    })
}

/// Completes on the first SIGTERM or SIGINT.
fn shutdown_signal() -> oxhorn::Result<impl Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| oxhorn::Error::io("SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| oxhorn::Error::io("SIGINT", e))?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
    })
}
