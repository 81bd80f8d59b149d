//! The `oxhorn` binary: one executable for the per-node manager (CSI plugin and
//! controllers), the data-plane processes it starts (replica, engine), and
//! tooling.

use std::pin::Pin;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oxhorn::cmd::instance_manager::{self, InstanceManagerArgs};
use oxhorn::cmd::manager::{self, ManagerConfig};
use oxhorn::engine::{self, EngineConfig};
use oxhorn::logging::{self, LogFormat};
use oxhorn::replica::ReplicaConfig;
use oxhorn::types;
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
    Manager(ManagerConfig),
    /// Hold the node's engine and replica processes for its manager, in a
    /// pod of their own.
    InstanceManager(InstanceManagerArgs),
    /// Serve one replica of a volume from a directory (started by the manager).
    Replica(ReplicaConfig),
    /// Replicate a volume's I/O to its replicas and expose it (started by the manager).
    Engine(EngineConfig),
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Print the manifest that installs Oxhorn (deploy/oxhorn.yaml), or
    /// the one that uninstalls it (deploy/uninstall.yaml).
    Manifest(oxhorn::cmd::manifest::ManifestArgs),
    /// Delete every volume, and its data, so that deleting the manifest
    /// leaves nothing behind (the Job of deploy/uninstall.yaml). Refused
    /// while volumes exist unless the Setting deleting-confirmation-flag
    /// is "true".
    Uninstall(oxhorn::cmd::uninstall::UninstallArgs),
    /// Write a support bundle: one tar.gz with Oxhorn's objects, events,
    /// logs, versions, settings and metrics, every credential redacted,
    /// read with your kubeconfig (docs/support-bundle.md).
    SupportBundle(oxhorn::cmd::support_bundle::SupportBundleArgs),
    /// Print the version.
    Version,
    /// Print a page of docs/ that the code makes:
    /// `oxhorn docs settings > docs/settings.md`,
    /// `oxhorn docs openapi > docs/api/openapi.json`.
    #[command(hide = true)]
    Docs {
        #[arg(value_parser = ["settings", "openapi"])]
        page: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let result = match cli.command {
        Command::Manager(config) => {
            run_until_signal(Threads::Many, |shutdown| manager::run(config, shutdown))
        }
        Command::InstanceManager(args) => run_until_signal(Threads::Many, |shutdown| {
            instance_manager::run(args, shutdown)
        }),
        Command::Replica(config) => run_until_signal(Threads::One, |shutdown| {
            oxhorn::replica::run(config, shutdown)
        }),
        Command::Engine(config) => {
            run_until_signal(Threads::One, |shutdown| engine::run(config, shutdown))
        }
        Command::Crds => types::crds_yaml()
            .map(|yaml| print!("{yaml}"))
            .map_err(Into::into),
        Command::Manifest(args) => args.yaml().map(|yaml| print!("{yaml}")),
        Command::Uninstall(args) => run_until_signal(Threads::Many, |shutdown| {
            oxhorn::cmd::uninstall::run(args, shutdown)
        }),
        Command::SupportBundle(args) => run_until_signal(Threads::Many, |shutdown| {
            oxhorn::cmd::support_bundle::run(args, shutdown)
        }),
        Command::Version => {
            println!("oxhorn {} (CSI 1.12)", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Docs { page } => match page.as_str() {
            "openapi" => oxhorn::api::openapi()
                .to_pretty_json()
                .map(|json| println!("{json}"))
                .map_err(|e| oxhorn::Error::Config(e.to_string())),
            _ => {
                print!("{}", oxhorn::datastore::settings::markdown());
                Ok(())
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "exiting");
            ExitCode::FAILURE
        }
    }
}

/// The async threads a daemon runs on.
enum Threads {
    /// One per CPU.
    Many,
    /// One, for the data plane: an engine's and a replica's requests are
    /// short (page-cache reads and writes, socket sends; fsync and the
    /// frontend's set-up run on blocking threads), and with two async
    /// threads every hand-off between tasks woke the other thread and
    /// contended with it (bench/README.md, 2026-11-24). One volume's I/O
    /// then uses at most one CPU per process.
    One,
}

/// Runs a daemon until SIGTERM or SIGINT. Each daemon has its own error
/// type; the process reports them all alike.
fn run_until_signal<F, Fut, E>(threads: Threads, daemon: F) -> oxhorn::Result<()>
where
    F: FnOnce(Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Into<oxhorn::Error>,
{
    let runtime = match threads {
        Threads::Many => tokio::runtime::Builder::new_multi_thread(),
        Threads::One => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build()
    .map_err(|e| oxhorn::Error::io("tokio runtime", e))?;
    runtime.block_on(async {
        let shutdown = shutdown_signal()?;
        daemon(Box::pin(shutdown)).await.map_err(Into::into)
    })
}

/// Completes on the first SIGTERM or SIGINT.
fn shutdown_signal() -> oxhorn::Result<impl Future<Output = ()> + Send> {
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
