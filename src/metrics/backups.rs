//! What the backup controller counts as it uploads: bytes sent to each
//! backup target, and how long each backup took, completed or failed.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    backup_target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    backup_target: String,
    result: &'static str,
}

fn duration_histogram() -> Histogram {
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
            durations: Family::new_with_constructor(duration_histogram),
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

    pub(super) fn register(&self, registry: &mut Registry) {
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
