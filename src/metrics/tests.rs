//! What a manager exports, as Prometheus reads it: which objects it
//! reports, and the exposition of each family (names, labels, types).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use serde_json::json;
use tower::{Layer, Service, ServiceExt};

use super::KubeApiLatency;
use super::families::Owned;
use super::process::Usage;
use super::view::{Objects, View};
use crate::controller::{BackupMetrics, ControllerMetrics};
use crate::protocol::control::{EngineMetrics, IoOpStats, LatencyHistogram};
use crate::types::{
    Backup, BackupTarget, Engine, Node, RecurringJob, Replica, ScrubReport, Volume,
};

fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> Arc<K> {
    Arc::new(serde_json::from_value(value).unwrap())
}

fn volume(name: &str, owner: &str, robustness: &str) -> Arc<Volume> {
    object(json!({
        "apiVersion": "oxhorn.io/v1beta1", "kind": "Volume",
        "metadata": {"name": name, "annotations": {
            "oxhorn.io/pvc-name": "data", "oxhorn.io/pvc-namespace": "apps"}},
        "spec": {"size": 1 << 30, "numberOfReplicas": 3, "nodeID": owner},
        "status": {"ownerID": owner, "state": "attached", "robustness": robustness,
                   "actualSize": 4096}
    }))
}

fn engine(volume: &str) -> Arc<Engine> {
    object(json!({
        "apiVersion": "oxhorn.io/v1beta1", "kind": "Engine",
        "metadata": {"name": format!("{volume}-e")},
        "spec": {"volumeName": volume, "volumeSize": 1 << 30, "nodeID": "n1",
                 "replicaAddressMap": {"r1": "10.0.0.1:9000", "r2": "10.0.0.2:9000"}},
        "status": {
            "currentState": "running",
            "replicaModeMap": {"r1": "RW", "r2": "WO"},
            "rebuildStatus": {"10.0.0.2:9000": {"isRebuilding": true, "progress": 40,
                                                 "fromReplicaAddress": "10.0.0.1:9000"}},
            "rebuildBandwidthLimit": 100,
            "snapshots": {
                "s1": {"name": "s1", "size": 8192},
                "s2": {"name": "s2", "size": 4096, "removed": true}
            }
        }
    }))
}

fn replica(name: &str, node: &str) -> Arc<Replica> {
    object(json!({
        "apiVersion": "oxhorn.io/v1beta1", "kind": "Replica",
        "metadata": {"name": name},
        "spec": {"volumeName": "v1", "volumeSize": 1 << 30, "nodeID": node}
    }))
}

fn node(name: &str) -> Arc<Node> {
    object(json!({
        "apiVersion": "oxhorn.io/v1beta1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"disks": {"default": {"path": "/var/lib/oxhorn", "storageReserved": 1000}}},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "ManagerUp"},
                {"type": "Schedulable", "status": "False", "reason": "Cordoned"}
            ],
            "diskStatus": {"default": {
                "storageMaximum": 10000, "storageAvailable": 7000, "storageScheduled": 5000,
                "conditions": [{"type": "Ready", "status": "True"},
                               {"type": "Schedulable", "status": "True"}]
            }}
        }
    }))
}

fn target(name: &str, owner: &str, available: bool) -> Arc<BackupTarget> {
    object(json!({
        "apiVersion": "oxhorn.io/v1beta1", "kind": "BackupTarget",
        "metadata": {"name": name},
        "spec": {"backupTargetURL": "s3://bucket@us-east-1/"},
        "status": {"ownerID": owner, "available": available, "conditions": [
            {"type": "Available", "status": if available { "True" } else { "False" },
             "reason": if available { "Synced" } else { "Unreachable" }}]}
    }))
}

fn job(name: &str, owner: &str, on_schedule: bool) -> Arc<RecurringJob> {
    object(json!({
        "apiVersion": "oxhorn.io/v1beta1", "kind": "RecurringJob",
        "metadata": {"name": name},
        "spec": {"task": "backup", "cron": "@daily"},
        "status": {"ownerID": owner, "conditions": [
            {"type": "OnSchedule", "status": if on_schedule { "True" } else { "False" },
             "reason": if on_schedule { "OnTime" } else { "Overrun" }}]}
    }))
}

fn backup(name: &str, volume: &str, state: &str, created: &str) -> Arc<Backup> {
    object(json!({
        "apiVersion": "oxhorn.io/v1beta1", "kind": "Backup",
        "metadata": {"name": name},
        "spec": {"volumeName": volume, "snapshotName": "s1"},
        "status": {"state": state, "backupCreatedAt": created}
    }))
}

/// The view of manager n1 in a cluster where it owns v1 (and v3, being
/// deleted) and n2 owns v2.
fn view_of_n1() -> View {
    let mut deleted = (*volume("v3", "n1", "healthy")).clone();
    deleted.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
    );
    let objects = Objects {
        volumes: &[
            volume("v1", "n1", "degraded"),
            volume("v2", "n2", "healthy"),
            Arc::new(deleted),
        ],
        engines: &[engine("v1"), engine("v2")],
        replicas: &[replica("r1", "n1"), replica("r2", "n2")],
        nodes: &[node("n1"), node("n2")],
        targets: &[target("default", "n1", false), target("other", "n2", true)],
        backups: &[
            backup("v1-b1", "v1", "Completed", "2026-11-28T04:00:00Z"),
            backup("v1-b2", "v1", "Completed", "2026-11-28T05:00:00Z"),
            backup("v1-b3", "v1", "Error", "2026-11-28T06:00:00Z"),
            backup("v2-b1", "v2", "Completed", "2026-11-28T07:00:00Z"),
        ],
        jobs: &[job("nightly", "n1", false), job("hourly", "n2", true)],
    };
    View {
        manager: Some(Usage {
            cpu: Duration::from_millis(1500),
            resident: 30 << 20,
        }),
        instance_manager: Some(Usage {
            cpu: Duration::from_millis(250),
            resident: 20 << 20,
        }),
        retrying: [("Engine".to_owned(), 2)].into(),
        ..View::from_objects("n1", &objects)
    }
}

fn exposition(view: View) -> String {
    let mut registry = Registry::with_prefix("oxhorn");
    registry.register_collector(Box::new(Owned::new(Arc::new(Mutex::new(view)))));
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    text
}

/// The sample lines of `text` whose name is `name` exactly (labels aside).
fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .collect()
}

#[test]
fn a_manager_reports_only_what_it_owns() {
    let view = view_of_n1();
    let volumes: Vec<_> = view
        .volumes
        .iter()
        .map(|v| v.labels.volume.as_str())
        .collect();
    assert_eq!(volumes, ["v1"], "v2 is n2's; v3 is being deleted");
    assert_eq!(view.replicas.len(), 2, "v1's replicas, wherever they are");
    assert_eq!(view.own_node.as_ref().unwrap().disks.len(), 1);
    let targets: Vec<_> = view.targets.iter().map(|t| t.target.as_str()).collect();
    assert_eq!(targets, ["default"]);
    let jobs: Vec<_> = view.jobs.iter().map(|j| j.job.as_str()).collect();
    assert_eq!(jobs, ["nightly"], "hourly's runs are n2's");
    assert_eq!(view.backups.values().sum::<u64>(), 3, "v1's backups only");
}

#[test]
fn a_stopped_engine_reports_no_replicas_and_no_rebuild_limit() {
    let mut stopped = (*engine("v1")).clone();
    let status = stopped.status.as_mut().unwrap();
    status.instance.current_state = crate::types::InstanceState::Stopped;
    let objects = Objects {
        volumes: &[volume("v1", "n1", "healthy")],
        engines: &[Arc::new(stopped)],
        replicas: &[replica("r1", "n1")],
        nodes: &[],
        targets: &[],
        backups: &[],
        jobs: &[],
    };
    let view = View::from_objects("n1", &objects);
    assert_eq!(view.volumes[0].rebuild_limit, None);
    assert!(
        view.replicas.is_empty() && view.rebuilds.is_empty(),
        "{view:?}"
    );
    let text = exposition(view);
    assert!(samples(&text, "oxhorn_volume_rebuild_limit_bytes_per_second").is_empty());
    assert!(text.contains("# TYPE oxhorn_volume_rebuild_limit_bytes_per_second gauge"));
}

#[test]
fn volume_families_carry_the_claim_and_one_series_per_state() {
    let text = exposition(view_of_n1());
    let labels = r#"volume="v1",pvc="data",pvc_namespace="apps",node="n1""#;
    for line in [
        "# TYPE oxhorn_volume_capacity_bytes gauge",
        "# UNIT oxhorn_volume_capacity_bytes bytes",
        &format!("oxhorn_volume_capacity_bytes{{{labels}}} 1073741824"),
        &format!("oxhorn_volume_actual_size_bytes{{{labels}}} 4096"),
        &format!(r#"oxhorn_volume_robustness{{{labels},robustness="degraded"}} 1"#),
        &format!(r#"oxhorn_volume_robustness{{{labels},robustness="healthy"}} 0"#),
        &format!(r#"oxhorn_volume_state{{{labels},state="attached"}} 1"#),
        &format!("oxhorn_volume_replicas_wanted{{{labels}}} 3"),
        &format!("oxhorn_volume_replicas_healthy{{{labels}}} 1"),
        &format!("oxhorn_volume_snapshots{{{labels}}} 1"),
        &format!("oxhorn_volume_snapshot_size_bytes{{{labels}}} 8192"),
        &format!("oxhorn_volume_rebuild_limit_bytes_per_second{{{labels}}} 104857600"),
        &format!("oxhorn_volume_last_backup_timestamp_seconds{{{labels}}} 1795842000.0"),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
    assert_eq!(samples(&text, "oxhorn_volume_state").len(), 6);
    assert_eq!(samples(&text, "oxhorn_volume_robustness").len(), 4);
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn a_standby_volume_says_how_far_behind_it_is_until_activated() {
    let standby = |activated: bool| -> Arc<Volume> {
        let activation = activated.then(|| json!({"activatedAt": "2026-11-28T05:00:00.000000Z"}));
        object(json!({
            "apiVersion": "oxhorn.io/v1beta1", "kind": "Volume",
            "metadata": {"name": "dr"},
            "spec": {"size": 1 << 30, "fromBackup": "b1", "standby": !activated},
            "status": {"ownerID": "n1", "standby": {
                "backupsBehind": 2, "lagSeconds": 120,
                "lastRestoredBackupAt": "2026-11-28T04:00:00.000000Z",
                "lastStep": {"backup": "b1", "bytesRestored": 4194304},
                "activation": activation,
            }}
        }))
    };
    let text = |volume: Arc<Volume>| {
        let objects = Objects {
            volumes: &[volume],
            engines: &[],
            replicas: &[],
            nodes: &[],
            targets: &[],
            backups: &[],
            jobs: &[],
        };
        exposition(View::from_objects("n1", &objects))
    };
    let following = text(standby(false));
    let labels = r#"volume="dr",pvc="",pvc_namespace="",node="n1""#;
    for line in [
        format!("oxhorn_volume_standby_backups_behind{{{labels}}} 2"),
        format!("oxhorn_volume_standby_lag_seconds{{{labels}}} 120"),
        format!(
            "oxhorn_volume_standby_last_restored_backup_timestamp_seconds{{{labels}}} 1795838400"
        ),
        format!("oxhorn_volume_standby_last_restore_bytes{{{labels}}} 4194304"),
    ] {
        assert!(
            following.lines().any(|l| l == line),
            "no line {line:?} in\n{following}"
        );
    }
    let activated = text(standby(true));
    assert!(samples(&activated, "oxhorn_volume_standby_lag_seconds").is_empty());
    assert!(activated.contains("# TYPE oxhorn_volume_standby_lag_seconds gauge"));
}

#[test]
fn replicas_rebuilds_node_disks_targets_and_backups_are_exported() {
    let text = exposition(view_of_n1());
    for line in [
        r#"oxhorn_replica_mode{volume="v1",replica="r1",node="n1",mode="RW"} 1"#,
        r#"oxhorn_replica_mode{volume="v1",replica="r2",node="n2",mode="WO"} 1"#,
        r#"oxhorn_replica_mode{volume="v1",replica="r2",node="n2",mode="RW"} 0"#,
        r#"oxhorn_rebuild_progress_ratio{volume="v1",replica="r2",source="r1"} 0.4"#,
        r#"oxhorn_node_ready{node="n1",reason="ManagerUp"} 1"#,
        r#"oxhorn_node_schedulable{node="n1",reason="Cordoned"} 0"#,
        r#"oxhorn_disk_capacity_bytes{node="n1",disk="default"} 10000"#,
        r#"oxhorn_disk_usage_bytes{node="n1",disk="default"} 3000"#,
        r#"oxhorn_disk_reserved_bytes{node="n1",disk="default"} 1000"#,
        r#"oxhorn_disk_scheduled_bytes{node="n1",disk="default"} 5000"#,
        r#"oxhorn_disk_schedulable{node="n1",disk="default",reason=""} 1"#,
        r#"oxhorn_backup_target_available{backup_target="default",reason="Unreachable"} 0"#,
        r#"oxhorn_recurring_job_on_schedule{job="nightly",reason="Overrun"} 0"#,
        r#"oxhorn_backups{volume="v1",state="completed"} 2"#,
        r#"oxhorn_backups{volume="v1",state="error"} 1"#,
        "# TYPE oxhorn_manager_cpu_seconds counter",
        r#"oxhorn_manager_cpu_seconds_total{node="n1"} 1.5"#,
        r#"oxhorn_manager_resident_memory_bytes{node="n1"} 31457280"#,
        r#"oxhorn_instance_manager_cpu_seconds_total{node="n1"} 0.25"#,
        r#"oxhorn_instance_manager_resident_memory_bytes{node="n1"} 20971520"#,
        r#"oxhorn_controller_retrying_objects{controller="engine"} 2"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
    assert_eq!(samples(&text, "oxhorn_replica_mode").len(), 6);
}

/// An engine's figures: 9 writes of 4 KiB, 3 of them failed; their
/// latencies fell at most 100 us (4), at most 1 ms (7), beyond 10 s (9).
fn engine_metrics() -> EngineMetrics {
    let bounds_ns = [25_000, 100_000, 1_000_000, 10_000_000_000].to_vec();
    let write = IoOpStats {
        ops: 9,
        bytes: 6 * 4096,
        errors: 3,
        latency: Some(LatencyHistogram {
            bounds_ns,
            cumulative_counts: vec![0, 4, 7, 7, 9],
            count: 9,
            sum_ns: 30_000_000_000,
        }),
    };
    EngineMetrics {
        write: Some(write),
        rebuild_bytes_copied: 2 << 20,
        checksum_failed_bytes: 3 * 4096,
        repaired_bytes: 2 * 4096,
        unrecoverable_bytes: 4096,
        ..EngineMetrics::default()
    }
}

#[test]
fn the_engines_io_is_exported_as_counters_and_cumulative_histograms() {
    let mut view = view_of_n1();
    view.volumes[0].io = Some(engine_metrics());
    let text = exposition(view);
    let labels = r#"volume="v1",pvc="data",pvc_namespace="apps",node="n1""#;
    for line in [
        "# TYPE oxhorn_volume_write_ops counter".to_owned(),
        format!("oxhorn_volume_write_ops_total{{{labels}}} 9"),
        format!("oxhorn_volume_read_ops_total{{{labels}}} 0"),
        format!("oxhorn_volume_write_bytes_total{{{labels}}} 24576"),
        format!(r#"oxhorn_volume_io_errors_total{{{labels},op="write"}} 3"#),
        format!("oxhorn_volume_rebuild_copied_bytes_total{{{labels}}} 2097152"),
        format!("oxhorn_volume_checksum_failed_bytes_total{{{labels}}} 12288"),
        format!("oxhorn_volume_repaired_bytes_total{{{labels}}} 8192"),
        format!("oxhorn_volume_unrecoverable_bytes_total{{{labels}}} 4096"),
        "# TYPE oxhorn_volume_write_latency_seconds histogram".to_owned(),
        format!("oxhorn_volume_write_latency_seconds_count{{{labels}}} 9"),
        format!("oxhorn_volume_write_latency_seconds_sum{{{labels}}} 30.0"),
        format!(r#"oxhorn_volume_write_latency_seconds_bucket{{le="0.0001",{labels}}} 4"#),
        format!(r#"oxhorn_volume_write_latency_seconds_bucket{{le="0.001",{labels}}} 7"#),
        format!(r#"oxhorn_volume_write_latency_seconds_bucket{{le="10.0",{labels}}} 7"#),
        format!(r#"oxhorn_volume_write_latency_seconds_bucket{{le="+Inf",{labels}}} 9"#),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
    let buckets = samples(&text, "oxhorn_volume_write_latency_seconds_bucket");
    assert_eq!(buckets.len(), 5, "{buckets:?}");
    assert!(
        samples(&text, "oxhorn_volume_read_latency_seconds_bucket").is_empty(),
        "an engine without read figures has no read histogram"
    );
}

/// A volume's scrub, once it had one: what it found, and when it ended.
#[test]
fn a_volumes_last_scrub_is_exported_once_it_had_one() {
    let mut view = view_of_n1();
    let before = exposition(view_of_n1());
    assert!(samples(&before, "oxhorn_volume_last_scrub_rotten_bytes").is_empty());
    assert!(before.contains("# TYPE oxhorn_volume_last_scrub_rotten_bytes gauge"));
    let finished = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    view.volumes[0].scrub = Some(ScrubReport {
        finished: Some(Time(finished)),
        checked_bytes: 3 << 20,
        rotten_bytes: 2 * 4096,
        repaired_bytes: 4096,
        unrepaired_bytes: 4096,
        mismatched_chunks: 3,
        resolved_chunks: 2,
        ..ScrubReport::default()
    });
    let text = exposition(view);
    let labels = r#"volume="v1",pvc="data",pvc_namespace="apps",node="n1""#;
    for line in [
        format!("oxhorn_volume_scrub_running{{{labels}}} 0"),
        format!("oxhorn_volume_last_scrub_checked_bytes{{{labels}}} 3145728"),
        format!("oxhorn_volume_last_scrub_rotten_bytes{{{labels}}} 8192"),
        format!("oxhorn_volume_last_scrub_repaired_bytes{{{labels}}} 4096"),
        format!("oxhorn_volume_last_scrub_unrepaired_bytes{{{labels}}} 4096"),
        format!("oxhorn_volume_last_scrub_unsettled_chunks{{{labels}}} 1"),
        format!("oxhorn_volume_last_scrub_timestamp_seconds{{{labels}}} 1800000000"),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
}

#[tokio::test]
async fn reconciles_api_calls_and_backups_are_counted_with_their_durations() {
    let controllers = ControllerMetrics::default();
    let api = KubeApiLatency::default();
    let backups = BackupMetrics::default();
    let mut registry = Registry::with_prefix("oxhorn");
    controllers.register(&mut registry);
    api.register(&mut registry);
    backups.register(&mut registry);
    backups.ended("default", Duration::from_secs(3), Some(4 << 20));
    backups.ended("default", Duration::from_millis(1500), None);
    let started = Instant::now() - Duration::from_millis(3);
    controllers.reconciled("Volume", started, false);
    controllers.reconciled("Volume", started, true);
    let mut client = api.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(())
    }));
    let watch = http::Request::get("/api/v1/nodes?watch=true")
        .body(())
        .unwrap();
    client.ready().await.unwrap().call(watch).await.unwrap();
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    for line in [
        r#"oxhorn_controller_reconciles_total{controller="volume"} 2"#,
        r#"oxhorn_controller_reconcile_errors_total{controller="volume"} 1"#,
        r#"oxhorn_controller_reconcile_duration_seconds_count{controller="volume"} 2"#,
        r#"oxhorn_controller_reconcile_duration_seconds_bucket{le="0.002",controller="volume"} 0"#,
        r#"oxhorn_controller_reconcile_duration_seconds_bucket{le="+Inf",controller="volume"} 2"#,
        "# TYPE oxhorn_kube_api_request_duration_seconds histogram",
        r#"oxhorn_kube_api_request_duration_seconds_count{verb="watch"} 1"#,
        r#"oxhorn_backup_uploaded_bytes_total{backup_target="default"} 4194304"#,
        r#"oxhorn_backup_duration_seconds_count{backup_target="default",result="completed"} 1"#,
        r#"oxhorn_backup_duration_seconds_bucket{le="2.0",backup_target="default",result="failed"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
}
