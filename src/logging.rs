//! Structured logs through tracing: human-readable by default, JSON on request.
//! The filter comes from RUST_LOG (default [`DEFAULT_FILTER`]).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// kube-client logs every non-2xx answer at ERROR, including the conflicts and
/// not-founds that controllers expect and handle; our code logs what matters.
pub const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

/// Installs the global subscriber, writing to stderr.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
}
