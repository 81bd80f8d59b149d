//! What the controllers count as they work, for `/metrics`
//! (the metrics module registers and serves them): reconciles, their
//! errors and durations per controller; bytes backups sent and how long
//! they took.

use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// What the controllers count.
#[derive(Clone, Default)]
pub struct Counted {
    pub reconciles: ControllerMetrics,
    pub backups: BackupMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

/// Durations from 1 ms to ~33 s.
pub fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Per controller (the kind it reconciles, lowercased): reconciles,
/// failed reconciles, and how long each took.
#[derive(Clone)]
pub struct ControllerMetrics {
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    durations: Family<ControllerLabels, Histogram, fn() -> Histogram>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            errors: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl ControllerMetrics {
    /// Counts one reconcile of `controller` that took `started.elapsed()`.
    pub fn reconciled(&self, controller: &str, started: Instant, failed: bool) {
        let labels = ControllerLabels {
            controller: controller.to_lowercase(),
        };
        self.reconciles.get_or_create(&labels).inc();
        if failed {
            self.errors.get_or_create(&labels).inc();
        }
        self.durations
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_reconciles",
            "Reconciles run, per controller",
            self.reconciles.clone(),
        );
        registry.register(
            "controller_reconcile_errors",
            "Reconciles that failed (and will be retried), per controller",
            self.errors.clone(),
        );
        registry.register_with_unit(
            "controller_reconcile_duration",
            "How long reconciles took, per controller",
            Unit::Seconds,
            self.durations.clone(),
        );
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    backup_target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    backup_target: String,
    result: &'static str,
}

fn backup_histogram() -> Histogram {
    // 1 s to about 4.5 hours.
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

#[derive(Clone)]
pub struct BackupMetrics {
    uploaded: Family<TargetLabels, Counter>,
    durations: Family<OutcomeLabels, Histogram, fn() -> Histogram>,
}

impl Default for BackupMetrics {
    fn default() -> Self {
        Self {
            uploaded: Family::default(),
            durations: Family::new_with_constructor(backup_histogram),
        }
    }
}

impl BackupMetrics {
    /// A backup to `target` ended after `took`: completed, having sent
    /// `uploaded` bytes, or failed (`None`).
    pub fn ended(&self, target: &str, took: Duration, uploaded: Option<u64>) {
        let backup_target = target.to_owned();
        if let Some(bytes) = uploaded {
            let labels = TargetLabels {
                backup_target: backup_target.clone(),
            };
            self.uploaded.get_or_create(&labels).inc_by(bytes);
        }
        let result = if uploaded.is_some() {
            "completed"
        } else {
            "failed"
        };
        let labels = OutcomeLabels {
            backup_target,
            result,
        };
        self.durations
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "backup_uploaded",
            "Bytes backups sent to each backup target's store",
            Unit::Bytes,
            self.uploaded.clone(),
        );
        registry.register_with_unit(
            "backup_duration",
            "How long backups took, completed or failed, per backup target",
            Unit::Seconds,
            self.durations.clone(),
        );
    }
}
