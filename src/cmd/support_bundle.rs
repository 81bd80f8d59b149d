//! `oxhorn support-bundle`: writes the support bundle (`support_bundle`,
//! docs/support-bundle.md) with the user's kubeconfig, as kubectl would
//! read it: one file to send with a problem. What could not be collected
//! is in the bundle's summary, and listed on stderr.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support_bundle::{self, LOG_LIMIT_DEFAULT, Options, Outcome, Scrape};
use crate::types::DEFAULT_NAMESPACE;
use crate::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct SupportBundleArgs {
    /// Where to write the tar.gz (`-`: standard output); by default
    /// `oxhorn-support-bundle-<time>.tar.gz` in the current directory. An
    /// existing file is not overwritten.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// How far back the containers' logs reach: 30m, 24h, 7d, ...
    #[arg(long, default_value = "24h", value_parser = support_bundle::parse_since)]
    pub since: Duration,
    /// The most of each container's log kept (its newest part), in MiB.
    #[arg(long, default_value_t = LOG_LIMIT_DEFAULT >> 20, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub log_limit_mib: u64,
    /// The namespace Oxhorn is installed in.
    #[arg(long, short, default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// A kubeconfig; by default $KUBECONFIG or ~/.kube/config, as kubectl.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Writes the bundle, or stops (removing what it wrote) when `shutdown`
/// completes first.
pub async fn run(args: SupportBundleArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    let client = crate::cmd::manager::kube_client(args.kubeconfig.as_deref()).await?;
    let created = jiff::Timestamp::now();
    let name = support_bundle::name(created);
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{name}.tar.gz")));
    let to_stdout = path == Path::new("-");
    let out: Box<dyn Write + Send> = if to_stdout {
        Box::new(std::io::stdout())
    } else {
        // Never over a file of the user's.
        let file = File::create_new(&path).map_err(|e| Error::io(&path, e))?;
        Box::new(file)
    };
    let options = Options {
        namespace: args.namespace,
        since: args.since,
        log_limit: args.log_limit_mib << 20,
        made_by: format!("oxhorn support-bundle {}", env!("CARGO_PKG_VERSION")),
        secret_names: true,
        scrape: Scrape::ApiServer,
        created,
    };
    let out = BufWriter::with_capacity(1 << 20, out);
    let written = tokio::select! {
        written = support_bundle::write(client, options, out) => written,
        () = shutdown => Err(std::io::Error::new(std::io::ErrorKind::Interrupted, "stopped by a signal")),
    };
    let report = match written {
        Ok(report) => report,
        Err(error) => {
            if !to_stdout {
                let _ = std::fs::remove_file(&path);
            }
            return Err(Error::io(&path, error));
        }
    };
    for step in &report.steps {
        if let Outcome::Failed(why) = &step.outcome {
            eprintln!("not collected: {}: {why}", step.what);
        }
    }
    let shown = if to_stdout {
        "standard output".into()
    } else {
        path.display().to_string()
    };
    eprintln!(
        "wrote {shown}: {} steps, {} failed (its summary.txt says what is in it and what was redacted)",
        report.steps.len(),
        report.failed()
    );
    Ok(())
}
