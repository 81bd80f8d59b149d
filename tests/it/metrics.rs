//! Metrics as an operator meets them: a real Prometheus scrapes the
//! managers' /metrics and evaluates the shipped alert rules
//! (deploy/monitoring/rules.yaml); promtool checks those rules; the Grafana
//! dashboard queries only metrics that exist.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::ResourceExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use oxhorn::types::*;
use oxhorn_testbed::prometheus::Prometheus;
use serde_json::Value;

use crate::common::*;

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/monitoring")
        .join(file)
}

fn yaml(file: &str) -> serde_yaml_ng::Value {
    let text = std::fs::read_to_string(monitoring(file)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn the_shipped_rules_pass_promtool_and_the_prometheusrule_holds_the_same() {
    let checked = std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(monitoring("rules.yaml"))
        .output()
        .expect("promtool (hack/install-test-deps.sh installs it)");
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(said.contains("SUCCESS: 13 rules found"), "{said}");
    assert_eq!(
        yaml("prometheusrule.yaml")["spec"]["groups"],
        yaml("rules.yaml")["groups"],
        "prometheusrule.yaml's groups differ from rules.yaml's"
    );
}

/// Every metric name the dashboard's queries use.
fn dashboard_metrics() -> BTreeSet<String> {
    let text = std::fs::read_to_string(monitoring("grafana-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() > 20, "{exprs:?}");
    exprs
        .iter()
        .flat_map(|e| e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|word| word.starts_with("oxhorn_"))
        .map(str::to_owned)
        .collect()
}

fn collect_exprs(value: &Value, exprs: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                match field {
                    Value::String(expr) if key == "expr" => exprs.push(expr.clone()),
                    _ => collect_exprs(field, exprs),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, exprs)),
        _ => {}
    }
}

/// `text` percent-encoded for a URL's query.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What Prometheus' HTTP API answers at `path` (its `data`).
fn api(prometheus: &Prometheus, path: &str) -> Value {
    let text = prometheus.api(path).unwrap();
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["status"], "success", "{path}: {text}");
    answer["data"].clone()
}

/// The value of the first series `query` yields now, if any.
async fn instant(prometheus: &Prometheus, query: &str) -> Option<f64> {
    let data = api(prometheus, &format!("query?query={}", encoded(query)));
    data["result"][0]["value"][1].as_str()?.parse().ok()
}

/// The states of the alerts named `name` about `volume`.
async fn alert_states(prometheus: &Prometheus, name: &str, volume: &str) -> Vec<String> {
    let data = api(prometheus, "alerts");
    let alerts = data["alerts"].as_array().cloned().unwrap_or_default();
    alerts
        .iter()
        .filter(|a| a["labels"]["alertname"] == name && a["labels"]["volume"] == volume)
        .filter_map(|a| a["state"].as_str().map(str::to_owned))
        .collect()
}

/// The `oxhorn replica` process serving data at `address`.
pub(crate) fn replica_process(address: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let serves = args.get(1) == Some(&&b"replica"[..])
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--listen" && w[1] == address.as_bytes());
            serves.then_some(pid)
        })
}

/// Writes to `device` over and over until dropped.
struct Writing {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writing {
    fn start(device: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seed = 0;
            while !stopped.load(Ordering::Relaxed) {
                write_pattern_at(&device, (seed % 8) as usize, 1 << 20, seed);
                seed += 1;
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_a_volumes_io_and_alerts_while_it_is_degraded() {
    require_root();
    let cluster = Cluster::start_with_instance_managers("metrics", 3).await;
    cluster
        .set("replica-replenishment-wait-interval", "2")
        .await;
    cluster.create_volume("vol", 64 * MIB, 3).await;
    cluster
        .until_volume("vol", "the volume detached and healthy", |s| {
            s.state == VolumeState::Detached && s.robustness == Robustness::Healthy
        })
        .await;
    let attached_to = cluster.nodes[0].node_id().to_owned();
    let device = cluster.attach("vol", &attached_to).await;

    let dir = tempfile::tempdir().unwrap();
    let targets: Vec<_> = cluster
        .nodes
        .iter()
        .filter_map(|n| n.metrics_address())
        .collect();
    let rules = monitoring("rules.yaml");
    let prometheus = Prometheus::start(dir.path(), &targets, &[&rules]).unwrap();
    let writing = Writing::start(device);

    let rate = r#"rate(oxhorn_volume_write_ops_total{volume="vol"}[5s])"#;
    cluster
        .until("Prometheus sees the volume written", || async {
            instant(&prometheus, rate).await.filter(|r| *r > 0.0)
        })
        .await;
    let p99 = r#"histogram_quantile(0.99, rate(oxhorn_volume_write_latency_seconds_bucket{volume="vol"}[5s]))"#;
    let latency = cluster
        .until("a p99 write latency", || async {
            instant(&prometheus, p99).await.filter(|s| s.is_finite())
        })
        .await;
    assert!(latency > 0.0 && latency <= 10.0, "p99 {latency} s");
    let steps = Steps::start();
    steps.report(&format!("write p99 {:.1} ms", latency * 1e3));

    // Every metric the dashboard and the alerts query is a family the
    // managers export (some have no series yet: no backup, no rebuild).
    let families: BTreeSet<String> = cluster
        .scrape()
        .lines()
        .filter_map(|l| Some(l.strip_prefix("# TYPE ")?.split(' ').next()?.to_owned()))
        .collect();
    let exported = |metric: &str| {
        ["", "_total", "_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| {
                metric
                    .strip_suffix(suffix)
                    .is_some_and(|family| families.contains(family))
            })
    };
    let rules = std::fs::read_to_string(&rules).unwrap();
    let alerted = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("oxhorn_"))
        .map(str::to_owned);
    for metric in dashboard_metrics().into_iter().chain(alerted) {
        assert!(exported(&metric), "{metric} is queried but not exported");
    }

    // Kill a replica away from the engine: the volume is degraded, the
    // shipped alert is pending (it fires after 5 minutes), and once the
    // replica is rebuilt the alert is gone.
    let engine = cluster.engine_of("vol").await.unwrap();
    let victim = cluster
        .replicas_of("vol")
        .await
        .into_iter()
        .find(|r| r.spec.instance.node_id != attached_to)
        .unwrap();
    let address = &engine.spec.replica_address_map[&victim.name_any()];
    let pid = replica_process(address).unwrap_or_else(|| panic!("no replica serves {address}"));
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let states = cluster
        .until("the degraded alert pending", || async {
            let states = alert_states(&prometheus, "OxhornVolumeDegraded", "vol").await;
            (!states.is_empty()).then_some(states)
        })
        .await;
    assert!(
        states.iter().all(|s| s == "pending" || s == "firing"),
        "{states:?}"
    );
    steps.report(&format!(
        "replica {} killed: alert {states:?}",
        victim.name_any()
    ));
    cluster
        .until_volume("vol", "the volume healthy again", |s| {
            s.robustness == Robustness::Healthy
        })
        .await;
    cluster
        .until("the degraded alert resolved", || async {
            let states = alert_states(&prometheus, "OxhornVolumeDegraded", "vol").await;
            states.is_empty().then_some(())
        })
        .await;
    steps.report("rebuilt: alert resolved");
    let copied = r#"oxhorn_volume_rebuild_copied_bytes_total{volume="vol"}"#;
    cluster
        .until("the rebuild's copied bytes counted", || async {
            instant(&prometheus, copied).await.filter(|b| *b > 0.0)
        })
        .await;
    let processes = "count(oxhorn_instance_manager_resident_memory_bytes > 0)";
    assert_eq!(
        instant(&prometheus, processes).await,
        Some(3.0),
        "each manager reports its instance manager"
    );
    drop(writing);
    tokio::time::timeout(Duration::from_secs(60), cluster.detach("vol"))
        .await
        .expect("detached");
    cluster.delete_volume("vol").await;
}
