//! `/metrics`: what this manager owns, in Prometheus' text format
//! (OpenMetrics), names `oxhorn_*`.
//!
//! Every manager reports only what it owns, so that series never double up
//! across managers: the volumes whose status names it as owner (with their
//! engines' I/O and replicas), its own node and disks, the backup targets
//! and backups it owns, and its own process and controllers. The custom
//! resources are read from the shared caches at scrape time (`view`); the
//! controllers count as they go (`controller::counters`), and so does the
//! API client (`kube_api`).

mod engine_io;
mod families;
mod kube_api;
pub mod process;
mod view;

#[cfg(test)]
mod tests;

pub use kube_api::KubeApiLatency;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use crate::controller::{Context, Counted};
use crate::datastore::Datastore;
use families::Owned;
use view::View;

/// The content type of what [`Exporter::scrape`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders this manager's metrics on each scrape.
pub struct Exporter {
    registry: Registry,
    /// What the owned-objects collector encodes; refreshed by each scrape.
    view: Arc<Mutex<View>>,
    ds: Arc<Datastore>,
    node: String,
    counted: Counted,
    /// The controllers' context, once they run: engines are read through it.
    controllers: OnceLock<Arc<Context>>,
    /// Scrapes take turns: each refreshes the view and then encodes it.
    turn: tokio::sync::Mutex<()>,
}

impl Exporter {
    /// An exporter for the manager of `node`, reporting `api`'s answer times
    /// and its controllers' reconciles beside what it owns.
    pub fn new(ds: Arc<Datastore>, node: &str, api: &KubeApiLatency) -> Self {
        let mut registry = Registry::with_prefix("oxhorn");
        let view = Arc::new(Mutex::new(View::default()));
        registry.register_collector(Box::new(Owned::new(Arc::clone(&view))));
        let counted = Counted::default();
        counted.reconciles.register(&mut registry);
        counted.backups.register(&mut registry);
        api.register(&mut registry);
        Self {
            registry,
            view,
            ds,
            node: node.to_owned(),
            counted,
            controllers: OnceLock::new(),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Where the controllers count what they do.
    pub fn counted(&self) -> Counted {
        self.counted.clone()
    }

    /// From now on, scrapes read the I/O of the engines this node runs
    /// through the controllers' connections to them.
    pub fn controllers_run(&self, ctx: Arc<Context>) {
        let _ = self.controllers.set(ctx);
    }

    /// The metrics as they are now, in OpenMetrics text.
    pub async fn scrape(&self) -> String {
        let _turn = self.turn.lock().await;
        let mut view = View::of(&self.ds, &self.node);
        if let Some(ctx) = self.controllers.get() {
            engine_io::read(ctx, &mut view).await;
            view.instance_manager = ctx.instances.process_id().and_then(process::usage);
            view.retrying = ctx.retries.waiting();
        }
        *self.view.lock().unwrap_or_else(PoisonError::into_inner) = view;
        let mut text = String::new();
        // Writing into a String cannot fail, and every collector's encode
        // only writes.
        if let Err(error) = encode(&mut text, &self.registry) {
            tracing::error!(%error, "metrics not encoded");
        }
        text
    }
}
